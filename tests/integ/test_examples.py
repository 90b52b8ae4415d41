#!/usr/bin/env python3
"""Integration tests of the example clients: each runs against a real gpumemd on the KFD model, must exit 0,
print what it promises, and leave nothing behind in the daemon; without a daemon each must fail."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, check, ctl, run_tests, stop  # noqa: E402

EXAMPLES = os.environ["GPUMEM_EXAMPLES"]

# What each example must print (substrings, in this order for each process).
EXPECT = {
    "gpumem-info": ["connected to gpumemd", "reserved in this process", "GPUs,", "round trips"],
    "share-buffer": [
        "parent: allocated 4 MiB of host-visible VRAM",
        "parent: exported it as fd",
        "child: imported 4194304 bytes on GPU",
        "child: pattern verified",
        "child: wrote the reply pattern",
        "parent: reply verified",
        "child: done",
        "parent: done",
    ],
    "vmm-grow": [
        "reserved 64 MiB of address space",
        "grew to  2 MiB",
        "grew to 16 MiB",
        "the last chunk is a VMM mapping of 2 MiB",
        "unmapped 8 chunks, released their memory and the reservation",
    ],
    "managed": [
        "allocated 8 MiB of managed memory",
        "first half   preferred GPU",
        "read-mostly",
        "second half  preferred undefined, prefetch GPU",
        "whole range  preferred undefined, prefetch undefined",
        "data unchanged after advice and prefetch",
    ],
}



class Daemon:
    def __init__(self, tmp, preset, kfd_minor):
        self.sock = os.path.join(tmp, "gpumemd.sock")
        self.proc = subprocess.Popen(
            [GPUMEMD, "--socket", self.sock, "--config", "/dev/null", "--backend", "model",
             "--model-preset", preset, "--model-kfd-minor", str(kfd_minor), "--log-level", "warning"],
            stderr=subprocess.PIPE, text=True)
        self.ready = False
        for _ in range(400):
            if ctl(self.sock, "ping").returncode == 0:
                self.ready = True
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.025)

    def stop(self):
        return stop(self.proc)



def status(sock):
    r = ctl(sock, "--json", "status")
    return json.loads(r.stdout) if r.returncode == 0 else None


def run_example(name, sock):
    env = dict(os.environ, GPUMEM_SOCKET=sock)
    return subprocess.run([os.path.join(EXAMPLES, name)], env=env, capture_output=True, text=True, timeout=60)


def in_order(text, wanted):
    """The first wanted substring that is missing or out of order in text, or None."""
    pos = 0
    for w in wanted:
        i = text.find(w, pos)
        if i < 0:
            return w
        pos = i + len(w)
    return None


def per_process_order(out, wanted):
    """share-buffer interleaves two processes: check the order within each one's lines separately."""
    for prefix in ("parent:", "child:"):
        lines = "\n".join(l for l in out.splitlines() if l.startswith(prefix))
        missing = in_order(lines, [w for w in wanted if w.startswith(prefix)])
        if missing:
            return missing
    return None


def examples_against(preset, kfd_minor):
    def test(tmp):
        d = Daemon(tmp, preset, kfd_minor)
        check(d.ready, f"gpumemd ({preset}, KFD 1.{kfd_minor}) answers ping")
        if not d.ready:
            d.stop()
            return
        for name, wanted in EXPECT.items():
            r = run_example(name, d.sock)
            check(r.returncode == 0, f"{name} exits 0 (got {r.returncode}; stderr: {r.stderr.strip()!r})")
            check(r.stderr == "", f"{name} prints nothing on stderr ({r.stderr.strip()!r})")
            if name == "share-buffer":
                missing = per_process_order(r.stdout, wanted)
            else:
                missing = in_order(r.stdout, wanted)
            check(missing is None, f"{name} prints {missing!r} in order (stdout: {r.stdout!r})")
            # every client has gone and freed everything it held (teardown runs just after they leave)
            s = None
            for _ in range(200):
                s = status(d.sock)
                if s and s["clients"] == 1 and s["allocations"] == 0:
                    break
                time.sleep(0.02)
            empty = {"device": 0, "host": 0, "managed": 0}
            check(s is not None and s["allocations"] == 0 and s["bytes"] == empty,
                  f"{name} leaves nothing behind in gpumemd ({s})")
        rc, err = d.stop()
        check(rc == 0, f"gpumemd exits 0 after the examples (stderr: {err.strip()!r})")
    return test


def test_no_daemon(tmp):
    for name in EXPECT:
        r = run_example(name, os.path.join(tmp, "nobody-listens.sock"))
        check(r.returncode != 0, f"{name} fails without a daemon")
        check("connect" in r.stderr and "No such file or directory" in r.stderr,
              f"{name} says why it failed ({r.stderr.strip()!r})")


def main():
    tests = [
        ("examples on an 8-GPU MI300X node, a KFD context per client (ABI 1.19)", examples_against("mi300x", 19)),
        ("examples on a 4-GPU MI100 box, one shared KFD context (ABI 1.15)", examples_against("mi100", 15)),
        ("examples fail with a reason when there is no daemon", test_no_daemon),
    ]
    run_tests(tests)

main()
