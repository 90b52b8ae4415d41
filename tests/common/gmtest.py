"""Helpers shared by the Python tests: checks and a runner, a NOTIFY_SOCKET we own, gpumemctl, installing into a DESTDIR."""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

GPUMEMD = os.environ.get("GPUMEMD", "")
GPUMEMCTL = os.environ.get("GPUMEMCTL", "")
BUILD_ROOT = os.environ.get("BUILD_ROOT", "")
SOURCE_ROOT = os.environ.get("SOURCE_ROOT", "")
PREFIX = os.environ.get("PREFIX", "/usr/local")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"  check failed: {what}", file=sys.stderr)
    return cond


def run_tests(tests):
    """Run (name, fn(tmp)) pairs in fresh temporary directories, print TAP-like lines, exit 0 only if all pass."""
    passed = failed = 0
    for i, (name, fn) in enumerate(tests, 1):
        before = len(failures)
        tmp = tempfile.mkdtemp(prefix="gpumemd-sd-")
        try:
            fn(tmp)
        except Exception as e:  # a crash of the test is a failure, not a skip
            check(False, f"{name} raised {e!r}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if len(failures) == before:
            print(f"ok {i} - {name}")
            passed += 1
        else:
            print(f"not ok {i} - {name}")
            failed += 1
        sys.stdout.flush()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


class Notify:
    """A NOTIFY_SOCKET we own, collecting every datagram the daemon sends."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)  # an unprivileged daemon must be able to send to it
        self.sock.setblocking(False)
        self.log = []

    def drain(self):
        while True:
            try:
                self.log.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return

    def count(self, what):
        self.drain()
        return sum(1 for m in self.log for line in m.split("\n") if line == what)

    def wait(self, what, timeout=10.0, n=1):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(what) >= n:
                return True
            time.sleep(0.01)
        return self.count(what) >= n

    def close(self):
        self.sock.close()


def stop(proc, timeout=20):
    """SIGTERM and reap; returns (exit code, stderr text)."""
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err or ""


def ctl(sock, *args, gpumemctl=None, env=None):
    return subprocess.run([gpumemctl or GPUMEMCTL, "--socket", sock, *args], capture_output=True, text=True,
                          timeout=30, env=env)


def wait_path(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return os.path.exists(path)


def hello_frame(request_id=1):
    body = bytes([0x0A, 0x02, 0x08, 0x01])  # Request.hello { protocol_version: 1 }
    return struct.pack("<IHHII", 0x4D454D47, 1, 0, len(body), request_id) + body


def hello_as(sock, uid, groups=()):
    """In a child process: become uid (with groups), connect to sock and say hello. Returns (b"ok", the
    connection), (b"short", the connection) when the reply was too short, or (the error's name, None)."""
    try:
        os.setgroups(list(groups))
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(5)
        s.connect(sock)
        s.send(hello_frame())
        return (b"ok" if len(s.recv(65536)) > 16 else b"short"), s
    except OSError as e:
        return type(e).__name__.encode(), None


def install(destdir):
    """meson install of this build into destdir (nothing is rebuilt); returns the CompletedProcess."""
    meson = os.environ.get("MESON", "meson")
    return subprocess.run([meson, "install", "-C", BUILD_ROOT, "--destdir", destdir, "--no-rebuild"],
                          capture_output=True, text=True, timeout=300)


def install_or_exit(destdir):
    """install() before a program's tests: when it fails, its output, a failed first test and exit 1."""
    r = install(destdir)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
        print("not ok 1 - meson install into a DESTDIR")
        sys.exit(1)


def in_dest(destdir, path):
    return os.path.join(destdir, path.lstrip("/"))
