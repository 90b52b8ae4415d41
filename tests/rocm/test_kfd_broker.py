#!/usr/bin/env python3
"""Unmodified libhsakmt (ROCm 5.2.3) through a real gpumemd under libgpumem-kfd.so: memory the daemon holds and
charges while the process runs, nothing once it ends or is killed, and a clear error with no daemon."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, Notify, check, ctl, run_tests, stop  # noqa: E402

KFD_LIB = os.environ.get("GPUMEM_KFD_LIB", "")
PROGRAM = os.environ.get("HSAKMT_BROKER", "")
HIP_PROGRAM = os.environ.get("HIP_BROKER", "")
QUEUES_PROGRAM = os.environ.get("HSAKMT_QUEUES", "")
HIP_COPY = os.environ.get("HIP_COPY", "")
HIP_COPY2D = os.environ.get("HIP_COPY2D", "")
HIP_MANAGED = os.environ.get("HIP_MANAGED", "")
HIP_HEAP = os.environ.get("HIP_HEAP", "")
FORK_PROGRAM = os.environ.get("HSAKMT_FORK", "")
VRAM = 32 << 30  # the gfx908 preset
RUNTIME_VRAM = 2 << 20  # what gpumemd keeps back of a limited VRAM bank for ROCm's runtime (docs/policy.md)
SIZE = 2 << 20


@contextlib.contextmanager
def daemon(tmp, classes=""):
    """A gpumemd on the gfx908 preset with the classes given, for a with block: its socket; stopped after."""
    sock = os.path.join(tmp, "gpumemd.sock")
    conf = os.path.join(tmp, "gpumemd.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nlog-level = notice\n" + classes)
    notify = Notify(os.path.join(tmp, "notify"))
    proc = subprocess.Popen([GPUMEMD, "--socket", sock, "--config", conf, "--backend", "model",
                             "--model-preset", "gfx908"], env=dict(os.environ, NOTIFY_SOCKET=notify.path),
                            stderr=subprocess.PIPE, text=True)
    check(notify.wait("READY=1"), "gpumemd is ready")
    try:
        yield sock
    finally:
        stop(proc)
        notify.close()


def kfd_env(sock):
    """The environment of a program whose KFD is gpumemd at sock (libgpumem-kfd.so preloaded)."""
    return dict(os.environ, LD_PRELOAD=KFD_LIB, GPUMEM_SOCKET=sock)


def run_program(sock, *args, vram=VRAM, **kw):
    env = kfd_env(sock)
    return subprocess.Popen([PROGRAM, str(vram), *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def client_of(sock, pid):
    r = ctl(sock, "--json", "clients")
    check(r.returncode == 0, f"gpumemctl clients: {r.stderr}")
    for c in json.loads(r.stdout)["clients"]:
        if c["pid"] == pid:
            return c
    return None


def allocations_of(sock, client_id):
    r = ctl(sock, "--json", "allocations")
    check(r.returncode == 0, f"gpumemctl allocations: {r.stderr}")
    return [a for a in json.loads(r.stdout)["allocations"] if a["client_id"] == client_id]


def wait_gone(sock, pid, client_id, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client_of(sock, pid) is None and not allocations_of(sock, client_id):
            return True
        time.sleep(0.05)
    return False


def holding(proc):
    """Read the program's output up to its "holding" line (HIP prints its device first)."""
    line = ""
    while not line.startswith("holding"):
        line = proc.stdout.readline()
        if not line:
            break
    return line.startswith("holding"), line


def test_memory(tmp):
    with daemon(tmp) as sock:
        p = run_program(sock)
        ok, line = holding(p)
        if not check(ok, f"the program holds its memory (said {line!r})"):
            p.kill()
            print(p.communicate()[1], file=sys.stderr)
            return
        c = client_of(sock, p.pid)
        if check(c is not None, "gpumemctl clients shows the process"):
            check(c["name"] == "hsakmt-broker", f"its name is the program's: {c['name']}")
            check(c["handles"] == 3, f"it holds 3 handles: {c['handles']}")
            check(sum(v["bytes"] for v in c["vram"]) == SIZE, f"its VRAM is charged: {c['vram']}")
            check(c["host_bytes"] == 2 * SIZE, f"its GTT and registered pages are charged: {c['host_bytes']}")
            allocs = allocations_of(sock, c["id"])
            kinds = sorted(a["kind"] for a in allocs)
            check(kinds == ["device", "host", "host"], f"gpumemctl allocations lists them: {kinds}")
            check(all(a["size"] == SIZE and a["mapped_gpus"] for a in allocs), f"each mapped, 2 MiB: {allocs}")
        out, err = p.communicate("go\n", timeout=30)
        check(p.returncode == 0, f"the program passed (rc {p.returncode}): {err}")
        check("events passed" in out, "its events, kept by the daemon, passed")
        check("closed" in out, "it closed the KFD")
        if c is not None:
            check(wait_gone(sock, p.pid, c["id"]), "nothing of it is left in the daemon")


def test_killed(tmp):
    with daemon(tmp) as sock:
        p = run_program(sock)
        ok, _ = holding(p)
        c = client_of(sock, p.pid) if ok else None
        check(c is not None and len(allocations_of(sock, c["id"])) == 3, "it holds its memory")
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=10)
        if c is not None:
            check(wait_gone(sock, p.pid, c["id"]), "SIGKILL: everything it held is freed")
        r = ctl(sock, "--json", "status")
        check(r.returncode == 0, "the daemon still serves")


def test_quota(tmp):
    # 5 MiB of VRAM for the class: two 2 MiB BOs fit, the third is refused by the daemon
    with daemon(tmp, "[class small]\nmatch-all = yes\nvram = 5M\n") as sock:
        # its node's VRAM is what the class allows, less the runtime's block (docs/policy.md)
        p = run_program(sock, "fill", vram=(5 << 20) - RUNTIME_VRAM)
        out, err = p.communicate("", timeout=60)
        check(p.returncode == 0, f"the program passed (rc {p.returncode}): {err}")
        check("got 2\n" in out, f"exactly what the class allows is allocated: {out!r}")
        r = ctl(sock, "--json", "quota", "show", "small")
        if check(r.returncode == 0, f"gpumemctl quota: {r.stderr}"):
            used = [q["used"] for q in json.loads(r.stdout)["quotas"] if q["resource"] == "vram"]
            check(used == [0, 0], f"the class is whole again after the frees: {used}")


def read_until(proc, prefix):
    """The program's next output line that starts with prefix, or "" at its end."""
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    return ""


def test_fork(tmp):
    with daemon(tmp) as sock:
        p = subprocess.Popen([FORK_PROGRAM], env=kfd_env(sock), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            line = read_until(p, "child holding")
            if not check(line, "the child opened a KFD of its own and holds memory there"):
                return
            child_pid = int(line.split()[2])
            parent, child = client_of(sock, p.pid), client_of(sock, child_pid)
            if check(parent is not None and child is not None, "parent and child are clients of their own"):
                check(parent["id"] != child["id"], f"two clients: {parent['id']}, {child['id']}")
                check(sum(v["bytes"] for v in child["vram"]) == SIZE,
                      f"the child's VRAM is charged to it: {child['vram']}")
                check(child["host_bytes"] == 0, f"nothing of its parent's is charged to it: {child['host_bytes']}")
                check(sum(v["bytes"] for v in parent["vram"]) == SIZE,
                      f"the parent's VRAM stays its own: {parent['vram']}")
            p.stdin.write("go\n")
            p.stdin.flush()
            line = read_until(p, "killed child")
            if check(line, "a second child, with memory of its own, was killed"):
                killed = int(line.split()[2])
                deadline = time.monotonic() + 10
                while client_of(sock, killed) is not None and time.monotonic() < deadline:
                    time.sleep(0.05)
                check(client_of(sock, killed) is None, "the killed child's client is gone")
            check(read_until(p, "forked on registered stack pages"),
                  "a fork whose frames lie in registered stack pages: parent and child each on their own")
            check(read_until(p, "parent holding"), "the parent went on after the children")
            if child is not None:
                check(wait_gone(sock, child_pid, child["id"]), "nothing of the child that exited is left")
            parent = client_of(sock, p.pid)
            if check(parent is not None, "the parent is still a client"):
                check(parent["handles"] >= 5, f"with its BOs and registrations: {parent['handles']}")
            out, err = p.communicate("go\n", timeout=30)
            check(p.returncode == 0 and "passed" in out, f"the program passed (rc {p.returncode}): {err[-2000:]}")
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_rocminfo(tmp):
    with daemon(tmp) as sock:
        env = kfd_env(sock)
        r = subprocess.run(["rocminfo"], env=env, capture_output=True, text=True, timeout=120)
        out = r.stdout
        check(r.returncode == 0, f"rocminfo exits 0 through gpumemd: {r.returncode} {r.stderr[-500:]!r}")
        check("ROCk module is loaded" in out, "it finds the KFD")
        check("not served through gpumemd" not in r.stderr, f"everything it asks of the KFD is served: {r.stderr!r}")
        check(len([ln for ln in out.splitlines() if ln.startswith("Agent ")]) == 2, "two agents (CPU and GPU)")
        check(any(ln.split() == ["Name:", "gfx908"] for ln in out.splitlines()), "the preset's gfx908 agent")
        check(any(ln.split() == ["Compute", "Unit:", "120"] for ln in out.splitlines()), "with 120 CUs")
        check("33554432(0x2000000) KB" in out, "and its 32 GiB VRAM pool")
        r = ctl(sock, "--json", "clients")
        names = [c["name"] for c in json.loads(r.stdout)["clients"]] if r.returncode == 0 else None
        check(names is not None and "rocminfo" not in names, f"nothing of it is left after it ends: {names}")


def run_queues(sock, *args):
    env = kfd_env(sock)
    return subprocess.run([QUEUES_PROGRAM, *args], env=env, capture_output=True, text=True, timeout=120)


def quota_used(sock, cls, resource):
    r = ctl(sock, "--json", "quota", "show", cls)
    if r.returncode != 0:
        return None
    return [q["used"] for q in json.loads(r.stdout)["quotas"] if q["resource"] == resource and q["gpu_id"] == 0]


def wait_class_whole(sock, cls, timeout=10.0):
    """The class holds no memory, handle or queue (its last client's teardown may still be running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(quota_used(sock, cls, res) == [0] for res in ("vram", "host", "handles", "queues")):
            return True
        time.sleep(0.05)
    return False


def test_queues(tmp):
    with daemon(tmp, "[class all]\nmatch-all = yes\n") as sock:
        r = run_queues(sock, "broker")
        check(r.returncode == 0 and "ok" in r.stdout.splitlines(),
              f"PM4 and SDMA queues run by gpumemd, interrupts relayed: {r.stdout!r} {r.stderr[-1500:]!r}")
        check("pm4: nop, write_data, release_mem interrupt: ok" in r.stdout, "PM4 packets and the EOP interrupt")
        check("sdma: nop, fence, copy host -> vram, trap interrupt: ok" in r.stdout,
              "SDMA copy into VRAM and the trap interrupt")
        check("rules: clock, xnack with a queue, svm attributes of unmapped memory: ok" in r.stdout,
              "timestamps on the GPU clock counter's scale, XNACK mode and SVM attributes refused as KFD does")
        check(wait_class_whole(sock, "all"), "no queue or memory is left charged after it ends")


def test_queue_fault(tmp):
    with daemon(tmp, "[class all]\nmatch-all = yes\n") as sock:
        r = run_queues(sock, "broker-fault")
        check(r.returncode == 0 and "ok" in r.stdout.splitlines(),
              f"a GPU VM fault stops the queue and reaches the memory event: {r.stdout!r} {r.stderr[-1500:]!r}")
        check("sdma fault: va " in r.stdout and "not-present 1 read-only 0" in r.stdout,
              "with the faulting page and why, as KFD reports them")
        check(wait_class_whole(sock, "all"), "nothing of it is left after it ends")


def test_queue_limit(tmp):
    with daemon(tmp, "[class few]\nmatch-all = yes\nqueues = 3\n") as sock:
        r = run_queues(sock, "broker-limit", "3")
        check(r.returncode == 0 and "queue 4 refused" in r.stdout,
              f"3 queues fit the class, the fourth is refused: {r.stdout!r} {r.stderr[-1500:]!r}")
        check(wait_class_whole(sock, "few"), "the class is whole again after it ends")


def run_hip(sock, *args, vram=VRAM):
    env = kfd_env(sock)
    return subprocess.Popen([HIP_PROGRAM, "gfx908", str(vram), "120", *args], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_hip(tmp):
    if not HIP_PROGRAM:
        print("  (no HIP: libamdhip64-dev is not installed)")
        return
    with daemon(tmp) as sock:
        p = run_hip(sock)
        ok, _ = holding(p)
        if not check(ok, "the HIP program holds its memory"):
            p.kill()
            print(p.communicate()[1][-2000:], file=sys.stderr)
            return
        c = client_of(sock, p.pid)
        if check(c is not None, "gpumemctl clients shows the HIP process"):
            check(c["name"] == "hip-broker", f"by its name: {c['name']}")
            vram = sum(v["bytes"] for v in c["vram"])
            check(vram >= 64 << 20, f"its 64 MiB hipMalloc is charged: {vram}")
            check(c["host_bytes"] >= 8 << 20, f"its 8 MiB hipHostMalloc is charged: {c['host_bytes']}")
            sizes = [a["size"] for a in allocations_of(sock, c["id"])]
            check(64 << 20 in sizes and 8 << 20 in sizes, f"gpumemctl allocations lists both: {sizes}")
        out, err = p.communicate("go\n", timeout=60)
        check(p.returncode == 0 and "ok" in out.splitlines(), f"the HIP program passed: {out!r} {err[-1500:]!r}")
        if c is not None:
            check(wait_gone(sock, p.pid, c["id"]), "nothing of it is left after it ends")


def test_hip_copy(tmp):
    if not HIP_COPY:
        return
    with daemon(tmp, "[class all]\nmatch-all = yes\n") as sock:
        p = subprocess.Popen([HIP_COPY, "broker"], env=kfd_env(sock), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=150)
        lines = out.splitlines()
        check(p.returncode == 0 and "ok" in lines, f"HIP copies through gpumemd: {out!r} {err[-1500:]!r}")
        check("not served through gpumemd" not in err, f"everything HIP asks of the KFD is served: {err!r}")
        check("hipMemcpy host -> device -> host: ok" in lines, "hipMemcpy from pageable memory (1 B to 64 MiB)")
        check("hipMemcpyAsync to and from pinned memory: ok" in lines, "hipMemcpyAsync with pinned memory")
        check("hipHostRegister'd pages to and from the device: ok" in lines,
              "the program's own pages registered, copied, and its own again after")
        check(wait_class_whole(sock, "all"), "nothing of it is left after it ends: its class is whole again")


def test_hip_copy2d(tmp):
    if not HIP_COPY2D:
        return
    with daemon(tmp, "[class all]\nmatch-all = yes\n") as sock:
        p = subprocess.Popen([HIP_COPY2D], env=kfd_env(sock), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        out, err = p.communicate(timeout=30)
        lines = out.splitlines()
        check(p.returncode == 0 and "ok" in lines, f"hipMemcpy2D through gpumemd: {out!r} {err[-1500:]!r}")
        check("hipMemcpy2D 37 x 6000 bytes: ok" in lines, "a window of more rows than one run of the engine")
        check(wait_class_whole(sock, "all"), "nothing of it is left after it ends: its class is whole again")


def test_hip_managed(tmp):
    if not HIP_MANAGED:
        return
    with daemon(tmp, "[class all]\nmatch-all = yes\n") as sock:
        p = subprocess.Popen([HIP_MANAGED, "hold"], env=kfd_env(sock), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []

        def until_holding():
            while True:
                line = p.stdout.readline()
                if not line:
                    return False
                seen.append(line.rstrip("\n"))
                if line.startswith("holding"):
                    return True

        ok = until_holding()
        if not check(ok, "the HIP program holds its managed memory"):
            p.kill()
            print(p.communicate()[1][-2000:], file=sys.stderr)
            return
        c = client_of(sock, p.pid)
        sizes = [a["size"] for a in allocations_of(sock, c["id"])] if c else []
        check(sizes.count(8 << 20) >= 2, f"both 8 MiB managed ranges are the daemon's memory, listed: {sizes}")
        host = c["host_bytes"] if c else 0
        check(host >= 16 << 20, f"and charged to its class as host memory: {host}")
        p.stdin.write("go\n")
        p.stdin.flush()
        ok = until_holding()
        sizes = [a["size"] for a in allocations_of(sock, c["id"])] if c else []
        check(ok and sizes.count(8 << 20) == 0, f"hipFree (an munmap) gives them back at once: {sizes}")
        out, err = p.communicate("go\n", timeout=60)
        lines = seen + out.splitlines()
        check(p.returncode == 0 and "ok" in lines, f"hipMallocManaged through gpumemd: {lines!r} {err[-1500:]!r}")
        for what in ("advice: preferred location and accessed-by: ok", "prefetch to the device and back: ok",
                     "copies to and from managed memory: ok", "pointer attributes: managed"):
            check(what in lines, what)
        check("not served through gpumemd" not in err, f"everything HIP asks of the KFD is served: {err!r}")
        check(wait_class_whole(sock, "all"), "its class is whole again")


def test_hip_killed(tmp):
    if not HIP_PROGRAM:
        return
    with daemon(tmp) as sock:
        p = run_hip(sock)
        ok, _ = holding(p)
        c = client_of(sock, p.pid) if ok else None
        check(c is not None and len(allocations_of(sock, c["id"])) >= 2, "the HIP program holds its memory")
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=10)
        if c is not None:
            check(wait_gone(sock, p.pid, c["id"]), "SIGKILL: everything HIP held is freed")
        r = ctl(sock, "--json", "quota", "show", "default")
        used = [q["used"] for q in json.loads(r.stdout)["quotas"] if q["resource"] in ("vram", "host")] \
            if r.returncode == 0 else None
        check(used is not None and not any(used), f"and its class is whole again: {used}")


def test_hip_over_quota(tmp):
    if not HIP_PROGRAM:
        return
    with daemon(tmp, "[class small]\nmatch-all = yes\nvram = 96M\n") as sock:
        p = run_hip(sock, "over", str(128 << 20), vram=(96 << 20) - RUNTIME_VRAM)
        out, err = p.communicate("", timeout=60)
        check(p.returncode == 0 and "over quota refused" in out,
              f"a hipMalloc over the class's limit is hipErrorOutOfMemory: {out!r} {err[-1500:]!r}")
        r = ctl(sock, "--json", "quota", "show", "small")
        used = [q["used"] for q in json.loads(r.stdout)["quotas"] if q["resource"] == "vram"] if r.returncode == 0 else None
        check(used == [0, 0], f"the class is whole again after it ends: {used}")


def test_hip_heap(tmp):
    """hipMemcpy to and from malloc'ed buffers (1 B to 64 MiB, every offset in a page) and hipHostRegister of
    heap, .bss and stack, while other threads allocate and write in the same pages: no byte wrong, no write
    lost (the program's counters beside each buffer), malloc's heap intact."""
    if not HIP_HEAP:
        return
    with daemon(tmp, "[class all]\nmatch-all = yes\n") as sock:
        p = subprocess.Popen([HIP_HEAP, "1000"], env=kfd_env(sock), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        out, err = p.communicate(timeout=500)
        check(p.returncode == 0 and "1000 rounds, no byte wrong" in out,
              f"1000 rounds through gpumemd: exit {p.returncode} {out!r} {err[-1500:]!r}")
        check(wait_class_whole(sock, "all"), "nothing of it is left after it ends: its class is whole again")


def test_hip_fill(tmp):
    if not HIP_PROGRAM:
        return
    # HIP sizes its device from the VRAM bank the topology gives: under vram = 1G what it calls free is
    # allocatable, and more is refused
    with daemon(tmp, "[class small]\nmatch-all = yes\nvram = 1G\n") as sock:
        p = run_hip(sock, "fill", str(1 << 30), vram=(1 << 30) - RUNTIME_VRAM)
        ok, line = holding(p)
        used = quota_used(sock, "small", "vram") if ok else None
        # HIP's hipMalloc of all it calls free and the runtime's own block fill the class exactly
        check(used == [1 << 30], f"holding what HIP calls free ({line.strip()!r}), the class is full: {used}")
        out, err = p.communicate("go\n", timeout=60)
        check(p.returncode == 0 and "filled" in out.splitlines(),
              f"hipMemGetInfo's total is at most 1 GiB and its free is allocatable: {out!r} {err[-1500:]!r}")
        r = ctl(sock, "--json", "quota", "show", "small")
        used = [q["used"] for q in json.loads(r.stdout)["quotas"] if q["resource"] == "vram"] if r.returncode == 0 else None
        check(used == [0, 0], f"the class is whole again after it ends: {used}")
    # a class with no VRAM limit: the GPU's own size
    os.mkdir(os.path.join(tmp, "unlimited"))
    with daemon(os.path.join(tmp, "unlimited"), "[class all]\nmatch-all = yes\n") as sock:
        p = run_hip(sock, "over", str(64 << 30))
        out, err = p.communicate("", timeout=60)
        check(p.returncode == 0, f"without a limit HIP sees the preset's 32 GiB: {out!r} {err[-1500:]!r}")


def test_no_daemon(tmp):
    sock = os.path.join(tmp, "nobody.sock")
    p = run_program(sock)
    out, err = p.communicate("", timeout=30)
    check(p.returncode != 0, "without a daemon the program fails")
    check(f"cannot reach gpumemd at {sock}" in err, f"and says which socket it tried: {err!r}")
    if HIP_PROGRAM:
        p = run_hip(sock)
        out, err = p.communicate("", timeout=60)
        check(p.returncode != 0, "without a daemon the HIP program fails")
        check(f"cannot reach gpumemd at {sock}" in err, f"and says which socket it tried: {err!r}")


if __name__ == "__main__":
    if not KFD_LIB or not PROGRAM:
        print("SKIP: " + (sys.argv[1] if len(sys.argv) > 1 else "libgpumem-kfd.so or the program not built"))
        sys.exit(77)
    if os.environ.get("KFD_BROKER_ONLY") == "heap":
        run_tests([("HIP: copies and registrations of heap, .bss and stack beside busy threads", test_hip_heap)])
    run_tests([
        ("libhsakmt's memory through gpumemd, charged and listed while it runs", test_memory),
        ("a process killed while holding memory leaves nothing", test_killed),
        ("a BO over the class's VRAM limit is refused, and the class is whole after", test_quota),
        ("fork(): the child's KFD is its own, registered pages its own copies; the parent goes on", test_fork),
        ("rocminfo through gpumemd", test_rocminfo),
        ("PM4 and SDMA queues run by gpumemd, with their interrupts", test_queues),
        ("a GPU VM fault of a queue reaches the process's memory event", test_queue_fault),
        ("a class's queue limit", test_queue_limit),
        ("HIP: devices, memory info, hipMalloc and hipHostMalloc through gpumemd", test_hip),
        ("HIP: hipMemcpy, hipMemcpyAsync and hipHostRegister through gpumemd's queues", test_hip_copy),
        ("HIP: hipMemcpy2D through gpumemd's SDMA sub-window copies", test_hip_copy2d),
        ("HIP: hipMallocManaged, advice, prefetch and range attributes through gpumemd", test_hip_managed),
        ("HIP: killed with SIGKILL while it holds memory", test_hip_killed),
        ("HIP: a hipMalloc over the class's limit", test_hip_over_quota),
        ("HIP: under vram = 1G, hipMemGetInfo's free is what can be allocated", test_hip_fill),
        ("with no daemon, a clear error naming the socket (libhsakmt and HIP)", test_no_daemon),
    ])
