#!/usr/bin/env python3
"""Socket activation with the real unit's socket settings through systemd-socket-activate: READY=1, STATUS=,
WATCHDOG=1 and STOPPING=1 on a NOTIFY_SOCKET the test owns, clients served through the passed socket, the socket's
group and mode deciding who may connect, and a passed socket of the wrong type refused."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, Notify, check, ctl, hello_as, run_tests, stop, wait_path  # noqa: E402

ACTIVATE = shutil.which("systemd-socket-activate")
SOCKET_GID = 4242  # stands in for the gpumem group, which this machine need not have


def socket_settings():
    s = {}
    with open(os.environ["SOCKET_UNIT"]) as f:
        for line in f:
            k, sep, v = line.strip().partition("=")
            if sep and not k.startswith("#"):
                s[k] = v
    return s


def activate(tmp, notify, extra_env=(), stream=False):
    """Run gpumemd under systemd-socket-activate listening where and how the unit says (path moved into tmp)."""
    s = socket_settings()
    sock = os.path.join(tmp, os.path.basename(s["ListenSequentialPacket"]))
    args = [ACTIVATE, "-l", sock, "-E", f"NOTIFY_SOCKET={notify.path}"]
    if not stream:
        args.insert(1, "--seqpacket")
    for e in extra_env:
        args += ["-E", e]
    args += [GPUMEMD, "--config", "/dev/null", "--socket", os.path.join(tmp, "unused.sock"),
             "--backend", "model", "--model-preset", "gfx908"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    if wait_path(sock):
        # what systemd does with SocketMode= and SocketGroup= before it passes the socket on
        os.chmod(sock, int(s["SocketMode"], 8))
        if os.geteuid() == 0:
            os.chown(sock, 0, SOCKET_GID)
    return proc, sock


def connect_as(sock, uid, groups):
    """Connect and say hello from a child running as uid with the given groups; returns 'ok' or the error name."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        msg, _ = hello_as(sock, uid, groups)
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    out = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return out


def test_activated(tmp):
    os.chmod(tmp, 0o755)  # other uids reach the socket through this directory
    notify = Notify(os.path.join(tmp, "notify"))
    proc, sock = activate(tmp, notify, ["WATCHDOG_USEC=300000"])
    try:
        check(os.path.exists(sock), "systemd-socket-activate created the unit's socket")
        r = ctl(sock, "--json", "status")
        check(r.returncode == 0, f"a client is served through the passed socket: {r.stderr.strip()}")
        if r.returncode == 0:
            st = json.loads(r.stdout)
            check(st["gpus"] == 1 and st["pid"] == proc.pid, "the activated daemon (exec'd in place) answers")
        check(notify.wait("READY=1"), "READY=1")
        check(any(line.startswith("STATUS=") for m in notify.log for line in m.split("\n")), "STATUS= line")
        # the daemon pings at half of WATCHDOG_USEC: 150 ms
        t0 = time.monotonic()
        n0 = notify.count("WATCHDOG=1")
        check(notify.wait("WATCHDOG=1", timeout=3.0, n=n0 + 4), "WATCHDOG=1 keeps arriving")
        rate = (notify.count("WATCHDOG=1") - n0) / (time.monotonic() - t0)
        check(rate < 20, f"WATCHDOG=1 is paced by WATCHDOG_USEC ({rate:.1f}/s)")
        check(not os.path.exists(os.path.join(tmp, "unused.sock")), "an activated daemon binds no socket itself")
        if os.geteuid() == 0:
            check(connect_as(sock, 4243, [SOCKET_GID]) == "ok", "a member of the socket's group may connect")
            check(connect_as(sock, 4244, []) == "PermissionError", "anyone else is refused by the socket's mode")
    finally:
        code, err = stop(proc)
    check(code == 0, f"the activated daemon exits 0 on SIGTERM ({code}): {err[-300:]}")
    check(notify.wait("STOPPING=1", 2), "STOPPING=1")
    notify.close()


def test_no_watchdog(tmp):
    notify = Notify(os.path.join(tmp, "notify"))
    proc, sock = activate(tmp, notify)
    try:
        r = ctl(sock, "ping")  # the first connection starts the daemon
        check(r.returncode == 0, f"served: {r.stderr}")
        check(notify.wait("READY=1"), "READY=1")
        time.sleep(1.0)
        check(notify.count("WATCHDOG=1") == 0, "no WATCHDOG=1 when no watchdog is configured")
    finally:
        code, _ = stop(proc)
    check(code == 0, "exits 0")
    notify.close()


def test_wrong_socket_type(tmp):
    notify = Notify(os.path.join(tmp, "notify"))
    proc, sock = activate(tmp, notify, stream=True)
    try:
        # a stream socket: the daemon may start only once someone connects (the file exists a moment before
        # systemd-socket-activate listens on it, so try until a connection goes through)
        for _ in range(250):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sock)
                s.close()
                break
            except OSError:
                s.close()
                time.sleep(0.02)
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    check(proc.returncode == 1, f"a SOCK_STREAM socket is refused with exit 1 ({proc.returncode})")
    check("SOCK_SEQPACKET" in err, f"the error names the socket type it needs: {err[-300:]}")
    check(notify.count("READY=1") == 0, "no READY=1 without a usable socket")
    notify.close()


def main():
    if not ACTIVATE:
        print("not ok 1 - systemd-socket-activate is installed (Debian's systemd package)")
        sys.exit(1)
    run_tests([
        ("activated with the unit's socket: clients, READY, STATUS, WATCHDOG, STOPPING", test_activated),
        ("no watchdog pings without WATCHDOG_USEC", test_no_watchdog),
        ("a passed socket of the wrong type is refused", test_wrong_socket_type),
    ])


main()
