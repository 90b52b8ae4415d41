#!/usr/bin/env python3
"""The metrics HTTP listener (metrics-listen) against hostile peers: many idle connections, a huge header, a
request trickled byte by byte. The daemon's fds stay bounded, the Unix socket keeps answering, the metrics come
back once slots free, and every fd is given back."""
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, Notify, check, ctl, run_tests  # noqa: E402

# The limits in daemon/base/metrics.c (METRICS_HTTP_MAX_CONNS, METRICS_HTTP_TIMEOUT_S).
CAP = 64
TIMEOUT = 10
SLACK_FDS = 8  # fds the daemon may open meanwhile for other reasons
SLACK_S = 5


def free_port(family=socket.AF_INET, host="127.0.0.1"):
    probe = socket.socket(family, socket.SOCK_STREAM)
    probe.bind((host, 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


class Daemon:
    def __init__(self, tmp, listen, max_fds=None):
        self.sock = os.path.join(tmp, "gpumemd.sock")
        conf = os.path.join(tmp, "gpumemd.conf")
        with open(conf, "w") as f:
            f.write(f"[daemon]\nmetrics-listen = {listen}\n")
        self.err_path = os.path.join(tmp, "stderr")
        self.err = open(self.err_path, "w")
        self.notify = Notify(os.path.join(tmp, "notify"))
        env = dict(os.environ, NOTIFY_SOCKET=self.notify.path)
        self.proc = subprocess.Popen(
            [GPUMEMD, "--socket", self.sock, "--config", conf, "--backend", "model", "--model-preset", "mi300x"],
            env=env, stderr=self.err,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (max_fds, max_fds))) if max_fds else None)
        deadline = time.monotonic() + 10
        while not self.notify.count("READY=1") and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.ready = self.notify.count("READY=1") > 0

    def cpu_s(self):
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()
        self.notify.close()
        with open(self.err_path) as f:
            return self.proc.returncode, f.read()


def http(host, port, request, timeout=5.0, family=socket.AF_INET):
    """Send a request; return (status or None, whether the server closed, the bytes read)."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    data, closed = b"", False
    try:
        s.connect((host, port))
        try:
            s.sendall(request)
        except OSError:
            pass  # closed while we were still sending: read what it said
        while True:
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            data += chunk
    except socket.timeout:
        pass
    except OSError:
        closed = True
    finally:
        s.close()
    status = None
    if data.startswith(b"HTTP/1."):
        try:
            status = int(data.split(b" ", 2)[1])
        except (IndexError, ValueError):
            pass
    return status, closed, data


def get_metrics(port):
    return http("127.0.0.1", port, b"GET /metrics HTTP/1.0\r\n\r\n", timeout=3)


def is_closed(s):
    """Whether the server has closed this connection (EOF or reset pending); never blocks."""
    try:
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False
        return s.recv(4096) == b""
    except OSError:
        return True


def wait_fds(d, target, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and d.fds() > target:
        time.sleep(0.05)
    return d.fds()


def start(tmp):
    port = free_port()
    d = Daemon(tmp, f"127.0.0.1:{port}")
    check(d.ready, "daemon ready")
    status, _, body = get_metrics(port)
    check(status == 200 and b"gpumemd_up" in body, f"GET /metrics answers 200 ({status})")
    check(ctl(d.sock, "ping").returncode == 0, "ping over the Unix socket")
    time.sleep(0.2)
    return d, port, d.fds()


def finish(d, base):
    """The end of a case: the daemon's fds back at their baseline, then it stops and exits 0."""
    after = wait_fds(d, base)
    check(after <= base, f"the fd count returns to its baseline ({base}, now {after})")
    code, err = d.stop()
    check(code == 0, f"daemon exits 0 ({code}) {err[-500:]}")


def test_idle_connections(tmp):
    d, port, base = start(tmp)
    held, t0 = [], time.monotonic()
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            held.append(s)
        except OSError:
            s.close()
    check(len(held) >= CAP, f"200 connections opened ({len(held)})")
    peak = 0
    for _ in range(10):
        peak = max(peak, d.fds())
        time.sleep(0.1)
    print(f"# fds: baseline {base}, peak {peak} with {len(held)} connections held")
    check(peak <= base + CAP + SLACK_FDS,
          f"the daemon's fds stay bounded with 200 idle connections (baseline {base}, peak {peak}, cap {CAP})")
    t = time.monotonic()
    r = ctl(d.sock, "ping")
    dt = time.monotonic() - t
    check(r.returncode == 0 and dt < 2, f"ping over the Unix socket answers while they are held ({dt:.2f} s)")
    r = ctl(d.sock, "status")
    check(r.returncode == 0, "status over the Unix socket answers while they are held")
    # At the cap a new connection is closed at once; the metrics come back once the idle ones time out.
    got, deadline = None, t0 + TIMEOUT + SLACK_S
    while time.monotonic() < deadline:
        status, _, body = get_metrics(port)
        if status == 200:
            got = time.monotonic() - t0
            break
        time.sleep(0.2)
    print(f"# GET /metrics answered {got:.1f} s after the connections were opened" if got is not None
          else "# GET /metrics not answered")
    check(got is not None, "GET /metrics is answered at once or once slots free")
    while time.monotonic() < deadline and not all(is_closed(s) for s in held):
        time.sleep(0.2)
    open_left = sum(1 for s in held if not is_closed(s))
    check(open_left == 0, f"the server closed every idle connection within {TIMEOUT + SLACK_S} s ({open_left} open)")
    for s in held:
        s.close()
    finish(d, base)


def test_huge_header(tmp):
    d, port, base = start(tmp)
    t = time.monotonic()
    status, closed, _ = http("127.0.0.1", port,
                             b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
    dt = time.monotonic() - t
    print(f"# 64 KiB header: status {status}, closed {closed}, {dt:.2f} s")
    check(status in (400, 413, 431) or (status is None and closed),
          f"a 64 KiB header gets an error or a close ({status}, closed {closed}, {dt:.2f} s)")
    check(dt < 4, f"... and no hang ({dt:.2f} s)")
    status, closed, _ = http("127.0.0.1", port,
                             b"GET /metrics HTTP/1.0\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
    check(status == 400 and closed, f"a 9000-byte header gets 400 and a close ({status}, closed {closed})")
    status, closed, _ = http("127.0.0.1", port,
                             b"POST /metrics HTTP/1.0\r\nContent-Length: 2048\r\n\r\n" + b"x" * 2048)
    check(status == 413 and closed, f"a 2 KiB body gets 413 and a close ({status}, closed {closed})")
    status, _, _ = http("127.0.0.1", port, b"POST /metrics HTTP/1.0\r\nContent-Length: 1\r\n\r\nx")
    check(status == 501, f"a small POST gets 501 ({status})")
    status, _, _ = get_metrics(port)
    check(status == 200, "GET /metrics still answers")
    status, _, _ = http("127.0.0.1", port, b"GET /other HTTP/1.0\r\n\r\n")
    check(status == 404, f"other paths get 404 ({status})")
    finish(d, base)


def test_trickle(tmp):
    d, port, base = start(tmp)
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    t0, closed_after = time.monotonic(), None
    while time.monotonic() - t0 < TIMEOUT + SLACK_S:
        try:
            s.send(b"a")
            r, _, _ = select.select([s], [], [], 1.0)
            if r and s.recv(4096) == b"":
                closed_after = time.monotonic() - t0
                break
        except OSError:
            closed_after = time.monotonic() - t0
            break
    s.close()
    print(f"# trickled request closed after {closed_after:.1f} s" if closed_after is not None
          else "# trickled request still open")
    check(closed_after is not None,
          f"a request trickled one byte a second is closed within {TIMEOUT + SLACK_S} s"
          + (f" ({closed_after:.1f} s)" if closed_after is not None else " (still open)"))
    finish(d, base)


def test_out_of_fds(tmp):
    port = free_port()
    # 48: the 40 this test was written for, and the 8 the daemon keeps for a hand-over
    d = Daemon(tmp, f"127.0.0.1:{port}", max_fds=48)
    check(d.ready, "daemon ready with 48 fds")
    held = []
    for _ in range(40):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=0.3))
        except OSError:
            pass  # the backlog is full while accepting is paused
    time.sleep(0.5)
    c0 = d.cpu_s()
    time.sleep(2)
    spent = d.cpu_s() - c0
    print(f"# out of fds: {spent:.2f} s of CPU in 2 s")
    check(spent < 0.5, f"out of fds, the daemon does not spin ({spent:.2f} s of CPU in 2 s)")
    for s in held:
        s.close()
    got, deadline = None, time.monotonic() + TIMEOUT + SLACK_S
    while time.monotonic() < deadline:
        if get_metrics(port)[0] == 200:
            got = True
            break
        time.sleep(0.2)
    check(got, "GET /metrics answers again once fds are back")
    code, err = d.stop()
    check(code == 0, f"daemon exits 0 ({code})")
    check("pausing for a second" in err, "the pause is logged")


def test_stop_at_cap(tmp):
    d, port, _ = start(tmp)
    held = []
    for _ in range(CAP + 16):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
    time.sleep(0.3)
    code, err = d.stop()
    check(code == 0, f"SIGTERM with the HTTP connections at the cap: exits 0 ({code}) {err[-500:]}")
    for s in held:
        s.close()


def test_bind(tmp):
    try:
        port6 = free_port(socket.AF_INET6, "::1")
    except OSError:
        port6 = None
    if port6 is not None:
        d = Daemon(tmp, f"[::1]:{port6}")
        check(d.ready, "daemon ready on [::1]")
        status, _, _ = http("::1", port6, b"GET /metrics HTTP/1.0\r\n\r\n", family=socket.AF_INET6)
        check(status == 200, f"GET /metrics over [::1] answers 200 ({status})")
        code, _ = d.stop()
        check(code == 0, "daemon exits 0")
    else:
        print("  (no IPv6 loopback: [::1] not tried)", file=sys.stderr)
    for i, addr in enumerate(["192.0.2.1:9464", f"localhost:{free_port()}"]):
        os.makedirs(os.path.join(tmp, str(i)))
        d = Daemon(os.path.join(tmp, str(i)), addr)
        code, err = d.stop()
        check(not d.ready and code != 0 and f"cannot serve metrics on {addr}" in err,
              f"a daemon that cannot bind {addr} does not start ({code}: {err.strip()[-200:]})")


def main():
    if not GPUMEMD:
        print("GPUMEMD is not set", file=sys.stderr)
        sys.exit(1)
    tests = [
        ("200 idle connections: bounded fds, the Unix socket answers, slots free", test_idle_connections),
        ("a 64 KiB header, a 9000-byte header and a 2 KiB body are refused", test_huge_header),
        ("a request trickled byte by byte is closed", test_trickle),
        ("out of fds: the HTTP accept pauses, then serves again", test_out_of_fds),
        ("stopping with the HTTP connections at the cap", test_stop_at_cap),
        ("bind on 127.0.0.1 and [::1]; a bind failure or a host name stops the start", test_bind),
    ]
    run_tests(tests)


if __name__ == "__main__":
    main()
