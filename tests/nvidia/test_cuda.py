#!/usr/bin/env python3
"""gpumemd on an NVIDIA GPU (backend cuda): a real gpumemd, real CUDA clients, gpumemctl. Skips (77) where
libcuda.so.1 or a GPU is missing. GPUMEMD, GPUMEMCTL and GPUMEM_EXAMPLES name the programs."""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, check, ctl, run_tests, stop  # noqa: E402

EXAMPLE = os.path.join(os.environ.get("GPUMEM_EXAMPLES", ""), "cuda-kernel")
MIB = 1 << 20


def have_gpu():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    n = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0


class Daemon:
    def __init__(self, tmp, config):
        self.sock = os.path.join(tmp, "gpumemd.sock")
        conf = os.path.join(tmp, "gpumemd.conf")
        with open(conf, "w") as f:
            f.write(config)
        self.proc = subprocess.Popen([GPUMEMD, "--socket", self.sock, "--config", conf, "--backend", "cuda",
                                      "--log-level", "info"], stderr=subprocess.PIPE, text=True)
        self.env = dict(os.environ, GPUMEM_SOCKET=self.sock)
        for _ in range(800):
            if ctl(self.sock, "ping").returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.025)
        raise RuntimeError("gpumemd --backend cuda did not start: " + (self.proc.stderr.read() or ""))

    def json(self, *args):
        r = ctl(self.sock, "--json", *args)
        check(r.returncode == 0, f"gpumemctl {' '.join(args)}: {r.stderr.strip()}")
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def vram_used(self):
        q = self.json("quota", "show", "team")
        return sum(e["used"] for e in q.get("quotas", []) if e["resource"] == "vram" and e["gpu_id"] == 0)


CONFIG = "[class team]\nmatch-uid = 0\nvram = 1G\nshare-publish = cuda-*\n"


def test_topology(tmp):
    d = Daemon(tmp, CONFIG)
    try:
        t = d.json("topology")
        gpus = [n for n in t.get("nodes", []) if n.get("kind") == "gpu"]
        check(len(gpus) >= 1, f"the topology has the GPU: {t}")
        r = ctl(d.sock, "status")
        check(r.returncode == 0 and "cuda" in r.stdout, f"status names the backend: {r.stdout}")
        print(r.stdout)
    finally:
        stop(d.proc)


def test_kernel_share(tmp):
    """A kernel on gpumemd's memory, shared with a second process that answers; nothing left after."""
    d = Daemon(tmp, CONFIG)
    try:
        r = subprocess.run([EXAMPLE], capture_output=True, text=True, timeout=120, env=d.env)
        print(r.stdout + r.stderr)
        check(r.returncode == 0, "cuda-kernel exits 0")
        for line in ["first: a kernel wrote it", "reader: imported 67108864 bytes",
                     "reader: 0 of 1048576 words differ", "first: 0 words differ", "first: freed; done"]:
            check(line in r.stdout, f"cuda-kernel printed '{line}'")
        check(d.vram_used() == 0, "the class holds no VRAM afterwards")
        check(d.json("allocations").get("allocations") == [], "no allocation is left")
    finally:
        stop(d.proc)


def test_quota_and_kill(tmp):
    """The quota holds on the GPU; a killed client's memory shows while it lives and is freed after."""
    d = Daemon(tmp, CONFIG)
    try:
        r = subprocess.run([EXAMPLE, "--hold", "2048"], capture_output=True, text=True, timeout=60, env=d.env)
        check(r.returncode != 0 and "vram" in r.stderr.lower(),
              f"2 GiB against a 1 GiB quota is refused, saying why: {r.stderr.strip()}")
        holder = subprocess.Popen([EXAMPLE, "--hold", "256"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=d.env)
        line = holder.stdout.readline()
        check("written by a kernel" in line, f"the holder allocated and ran a kernel: {line}")
        allocs = d.json("allocations").get("allocations", [])
        check(len(allocs) == 1 and allocs[0]["size"] == 256 * MIB and allocs[0]["kind"] == "device",
              f"gpumemctl allocations shows the holder's 256 MiB: {allocs}")
        check(d.vram_used() == 256 * MIB, "the class is charged 256 MiB")
        m = ctl(d.sock, "metrics")
        check(m.returncode == 0 and f'gpumemd_class_vram_bytes{{class="team"}} {256 * MIB}' in m.stdout,
              "the metrics show the class's VRAM")
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        for _ in range(200):
            if d.vram_used() == 0:
                break
            time.sleep(0.025)
        check(d.vram_used() == 0, "the killed client's VRAM is refunded")
        check(d.json("allocations").get("allocations") == [], "and its allocation is gone")
        m = ctl(d.sock, "metrics")
        check(f'gpumemd_class_vram_bytes{{class="team"}} 0' in m.stdout, "the metrics show it freed")
    finally:
        code, err = stop(d.proc)
        check(code == 0, f"gpumemd stops cleanly: {err[-2000:]}")


def test_host_and_refusals(tmp):
    """Pinned host memory a kernel writes; what CUDA cannot do refused with a reason, leaving nothing."""
    d = Daemon(tmp, CONFIG)
    try:
        r = subprocess.run([EXAMPLE, "--host"], capture_output=True, text=True, timeout=60, env=d.env)
        print(r.stdout + r.stderr)
        check(r.returncode == 0 and ", 0 differ" in r.stdout, "a kernel writes gpumemd's pinned host memory")
        r = subprocess.run([EXAMPLE, "--refusals"], capture_output=True, text=True, timeout=60, env=d.env)
        print(r.stdout + r.stderr)
        check(r.returncode == 0 and "refusals: 0 not as expected" in r.stdout, "each refusal has its errno")
        check(d.vram_used() == 0, "the class holds no VRAM afterwards")
        check(d.json("allocations").get("allocations") == [], "no allocation is left")
    finally:
        stop(d.proc)


if __name__ == "__main__":
    if not have_gpu() or not os.access(EXAMPLE, os.X_OK):
        print("1..0 # SKIP no NVIDIA GPU or CUDA driver here")
        sys.exit(77)
    run_tests([("topology", test_topology), ("kernel and share", test_kernel_share),
               ("quota and kill", test_quota_and_kill), ("host memory and refusals", test_host_and_refusals)])
