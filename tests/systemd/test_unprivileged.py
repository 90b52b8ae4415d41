#!/usr/bin/env python3
"""gpumemd needs no privilege: started the way gpumemd.service starts it (an activated socket, then a system user
with no capabilities, an empty bounding set and no_new_privs), it serves clients of other uids and reports each
client's pid, uid and control group. Needs root to set up the users; exits 77 (skip) otherwise.

With --other-uid-cgroup it checks only that the control group of a client of another uid is reported."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, Notify, check, ctl, hello_as, run_tests, stop, wait_path  # noqa: E402

DAEMON_UID = 64101  # stands in for the gpumemd system user
CLIENT_UID = 4245


class HeldClient:
    """A child process of the given uid that connects, completes the handshake and stays connected."""

    def __init__(self, sock, uid):
        r, w = os.pipe()
        self.hold_r, self.hold_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(r)
            os.close(self.hold_w)
            msg, conn = hello_as(sock, uid)
            os.write(w, msg)
            os.read(self.hold_r, 1)  # until the parent lets go, connected
            os._exit(0)
        os.close(w)
        os.close(self.hold_r)
        self.status = os.read(r, 64).decode()
        os.close(r)
        with open(f"/proc/{self.pid}/cgroup") as f:
            self.cgroup = next(line[3:].strip() for line in f if line.startswith("0::"))

    def release(self):
        os.write(self.hold_w, b"x")  # later children inherited this pipe too: closing it would not wake this one
        os.close(self.hold_w)
        os.waitpid(self.pid, 0)


def start(tmp):
    os.chmod(tmp, 0o1777)
    notify = Notify(os.path.join(tmp, "notify"))
    sock = os.path.join(tmp, "gpumemd.sock")
    proc = subprocess.Popen(
        [shutil.which("systemd-socket-activate"), "--seqpacket", "-l", sock, "-E", f"NOTIFY_SOCKET={notify.path}",
         "setpriv", f"--reuid={DAEMON_UID}", f"--regid={DAEMON_UID}", "--clear-groups", "--bounding-set=-all",
         "--inh-caps=-all", "--no-new-privs",
         GPUMEMD, "--config", "/dev/null", "--socket", os.path.join(tmp, "unused.sock"), "--backend", "model", "--model-preset", "mi300x"],
        stderr=subprocess.PIPE, text=True)
    if wait_path(sock):
        os.chmod(sock, 0o666)
    return proc, sock, notify


def client_entry(sock, pid):
    r = ctl(sock, "--json", "clients")
    if r.returncode != 0:
        return None
    return next((c for c in json.loads(r.stdout)["clients"] if c["pid"] == pid), None)


def test_unprivileged(tmp):
    proc, sock, notify = start(tmp)
    held = []
    try:
        # the socket-activated daemon starts at the first connection
        other = HeldClient(sock, CLIENT_UID)
        held.append(other)
        check(other.status == "ok", f"a client of another uid completes the handshake ({other.status})")
        check(notify.wait("READY=1"), "READY=1 from the unprivileged daemon")
        with open(f"/proc/{proc.pid}/status") as f:
            st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        check(st["Uid"].split()[0] == str(DAEMON_UID), f"the daemon runs as uid {DAEMON_UID}: {st['Uid']}")
        check(int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0 and int(st["CapBnd"], 16) == 0,
              f"the daemon holds no capability: {st['CapEff']} {st['CapBnd']}")
        check(st.get("NoNewPrivs") == "1", "no_new_privs is set")

        same = HeldClient(sock, DAEMON_UID)
        held.append(same)
        check(same.status == "ok", "a client of the daemon's own uid is served")

        e = client_entry(sock, other.pid)
        check(e is not None and e["uid"] == CLIENT_UID, f"gpumemctl clients shows the other uid's client: {e}")
        e = client_entry(sock, same.pid)
        check(e is not None and e["cgroup"] == same.cgroup and e["admin"],
              f"the own uid's client: cgroup {same.cgroup!r}, administrator: {e}")
        r = ctl(sock, "--json", "topology")
        check(r.returncode == 0 and len([n for n in json.loads(r.stdout)["nodes"] if n["kind"] == "gpu"]) == 8,
              "the model backend runs without privilege (8 GPUs)")
    finally:
        for c in held:
            c.release()
        code, err = stop(proc)
        notify.close()
    check(code == 0, f"the unprivileged daemon exits 0: {err[-600:]}")


def test_other_uid_cgroup(tmp):
    proc, sock, notify = start(tmp)
    other = None
    try:
        other = HeldClient(sock, CLIENT_UID)
        check(other.status == "ok", "a client of another uid is served")
        e = client_entry(sock, other.pid)
        check(e is not None and e["cgroup"] == other.cgroup,
              f"the control group of another uid's client is reported ({other.cgroup!r}): {e}")
    finally:
        if other:
            other.release()
        stop(proc)
        notify.close()


def main():
    if os.geteuid() != 0:
        print("1..0 # skipped: needs root to run the daemon and clients under other uids")
        sys.exit(77)
    if "--other-uid-cgroup" in sys.argv:
        run_tests([("an unprivileged daemon reports another uid's control group", test_other_uid_cgroup)])
    run_tests([("the daemon as a system user without capabilities serves other uids", test_unprivileged)])


main()
