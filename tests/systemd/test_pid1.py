#!/usr/bin/env python3
"""gpumemd under the real service manager: Debian's systemd booted as PID 1 of a container (systemd-nspawn, this
machine's own root, /usr read-only), gpumemd installed from this build with meson install and run from the shipped
units as they are (the configuration file says backend = model: the container has no GPU). Each test drives
systemd as an operator does (systemctl, journalctl) and looks at what systemd did.

Needs root and systemd-nspawn (Debian's systemd-container); without them it is skipped (77). PID1_CLIENTS sets
the clients of the restart test (100)."""
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import check, in_dest, install_or_exit, run_tests  # noqa: E402

E = os.environ
BUILD = E["BUILD_ROOT"]
DEST = tempfile.mkdtemp(prefix="gpumemd-pid1-")
WORK = tempfile.mkdtemp(prefix="gpumemd-pid1-work-")
SOCK = "/run/gpumemd/gpumemd.sock"
GM_CARRY = os.path.join(BUILD, "tests", "systemd", "gm-carry")
N_CLIENTS = int(E.get("PID1_CLIENTS", "100"))
# the journal's MESSAGE_IDs (daemon/base/log.h) and systemd's own
MSG = {}
with open(E["LOG_H"]) as f:
    for m in re.finditer(r'#define GM_MESSAGE_(\w+)\s+"([0-9a-f]{32})"', f.read()):
        MSG[m.group(1)] = m.group(2)
SD_UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"

CONFIG = """[daemon]
backend = model
model-preset = mi300x
log-level = info

[class node]
match-uid = 0
admin = yes
handles = {handles}
share-publish = carry/*
share-read = carry/*
share-write = carry/*
"""


class Machine:
    """The container: systemd as its PID 1, commands run in it through nsenter."""

    def __init__(self):
        os.makedirs("/run/systemd/nspawn", exist_ok=True)
        if subprocess.run(["mountpoint", "-q", "/run/systemd/nspawn"]).returncode != 0:
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/systemd/nspawn"], check=True)
        self.log = open(os.path.join(WORK, "nspawn.log"), "w")
        local = in_dest(DEST, E["PREFIX"])
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--register=no", "--keep-unit", "-D", "/", "--volatile=yes",
             f"--bind={local}:{E['PREFIX']}", f"--bind={BUILD}", f"--bind={WORK}", "-b", "--console=pipe"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = None
        deadline = time.time() + 60
        while time.time() < deadline and self.pid is None and self.proc.poll() is None:
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open(f"/proc/{d}/stat") as f:
                        st = f.read()
                except OSError:
                    continue
                comm, ppid = st[st.index("(") + 1:st.rindex(")")], int(st[st.rindex(")") + 2:].split()[1])
                if comm == "systemd" and ppid == self.proc.pid:
                    self.pid = int(d)
            time.sleep(0.1)
        if self.pid is None:
            raise RuntimeError("the container's systemd did not come up")
        # up (degraded counts: the first-boot wizard has no console here); before its bus is up, systemctl
        # fails at once, --wait or not
        deadline = time.time() + 120
        state = ""
        while time.time() < deadline and state not in ("running", "degraded"):
            state = self.sh("systemctl is-system-running --wait", timeout=120).stdout.strip()
            if state not in ("running", "degraded"):
                time.sleep(0.2)
        if state not in ("running", "degraded"):
            raise RuntimeError(f"the container's systemd did not finish booting: {state}")

    def sh(self, cmd, timeout=60, input=None):
        return subprocess.run(["nsenter", "-t", str(self.pid), "-a", "sh", "-c", cmd], capture_output=True,
                              text=True, timeout=timeout, input=input)

    def popen(self, cmd):
        return subprocess.Popen(["nsenter", "-t", str(self.pid), "-a", "sh", "-c", cmd], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)

    def show(self, unit, *props):
        r = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def journal(self, *args):
        """The journal's entries (JSON) of gpumemd.service and of systemd about it."""
        r = self.sh("journalctl -o json --no-pager " + " ".join(args), timeout=60)
        out = []
        for line in r.stdout.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def wait_active(self, timeout=30, not_pid=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.show("gpumemd.service", "ActiveState", "SubState", "MainPID")
            if s.get("ActiveState") == "active" and s.get("MainPID", "0") not in ("0", str(not_pid)):
                return s
            time.sleep(0.05)
        return self.show("gpumemd.service", "ActiveState", "SubState", "MainPID", "Result")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()  # nspawn takes it for a shutdown of the container
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()


M = None


def ctl(*args):
    return M.sh("gpumemctl -s " + SOCK + " " + " ".join(args))


def write_config(text):
    with open(in_dest(DEST, os.path.join(E["SYSCONFDIR"], "gpumemd", "gpumemd.conf")), "w") as f:
        f.write(text)


def msg_entries(entries, name):
    return [e for e in entries if e.get("MESSAGE_ID") == MSG[name]]


def cursor():
    r = M.sh("journalctl -n 0 --show-cursor --no-pager")
    m = re.search(r"-- cursor: (\S+)", r.stdout)
    return m.group(1) if m else None


def since(c):
    return f"--after-cursor='{c}'" if c else ""


def first_gpu():
    r = ctl("-j", "topology")
    try:
        return next(n["gpu_id"] for n in json.loads(r.stdout)["nodes"] if n.get("gpu_id"))
    except (ValueError, KeyError, StopIteration):
        return None


class Carry:
    """gm-carry in the container: N connections holding every kind of memory a restart carries."""

    def __init__(self, n):
        self.p = M.popen(f"exec {GM_CARRY} {SOCK} {n} {first_gpu()}")
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.line() == "ready"

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.strip())
        self.lines.put("")

    def line(self, timeout=120):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""

    def cmd(self, c):
        self.p.stdin.write(c + "\n")
        self.p.stdin.flush()

    def check(self):
        self.cmd("check")
        lines = []
        while True:
            line = self.line()
            lines.append(line)
            if not line or line.startswith("ok ") or line.startswith("failed"):
                return lines

    def quota(self):
        self.cmd("quota")
        q = {}
        while True:
            line = self.line()
            if not line.startswith("quota "):
                return q
            _, res, used = line.split()
            q[int(res)] = int(used)

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
        err = self.p.stderr.read()
        if err:
            print(f"  gm-carry: {err.strip()[-2000:]}", file=sys.stderr)


def test_activation(tmp):
    """The socket unit listens from boot; the first connection starts the service, which is active only once it
    said READY=1 (Type=notify), with its STATUS= shown by systemctl."""
    s = M.show("gpumemd.socket", "ActiveState", "SubState")
    check(s.get("SubState") == "listening", f"gpumemd.socket is listening: {s}")
    s = M.show("gpumemd.service", "ActiveState")
    check(s.get("ActiveState") == "inactive", f"gpumemd.service waits for its first client: {s}")
    c = cursor()
    r = ctl("status")
    check(r.returncode == 0 and "backend:" in r.stdout, f"a first connection is served: {r.stdout}{r.stderr}")
    s = M.wait_active()
    check(s.get("ActiveState") == "active", f"the service is active: {s}")
    s = M.show("gpumemd.service", "StatusText", "Type", "NotifyAccess", "NRestarts")
    check(s.get("StatusText", "").startswith("Serving"), f"systemctl shows the daemon's STATUS=: {s}")
    check(s.get("Type") == "notify", f"Type=notify: {s}")
    entries = M.journal(since(c))
    started = msg_entries(entries, "STARTED")
    unit_started = [e for e in entries if e.get("MESSAGE_ID") == SD_UNIT_STARTED and
                    e.get("UNIT") == "gpumemd.service"]
    check(started and unit_started, f"the daemon's start and systemd's 'Started' are in the journal "
          f"({len(started)}, {len(unit_started)})")
    if started and unit_started:
        # systemd says Started only once READY=1 came, after the daemon logged that it serves
        check(int(started[0]["__MONOTONIC_TIMESTAMP"]) <= int(unit_started[0]["__MONOTONIC_TIMESTAMP"]),
              "READY=1 came after the daemon was serving")


def test_sandbox(tmp):
    """The shipped unit's confinement as systemd applied it, read off the running daemon."""
    pid = M.show("gpumemd.service", "MainPID").get("MainPID", "0")
    check(pid != "0", "the daemon runs")
    st = {}
    for line in M.sh(f"cat /proc/{pid}/status").stdout.splitlines():
        k, _, v = line.partition(":")
        st[k] = v.strip()
    uid = M.sh("id -u gpumemd").stdout.strip()
    check(st.get("Uid", "").split() == [uid] * 4, f"User=gpumemd: Uid {st.get('Uid')} (gpumemd is {uid})")
    groups = set(st.get("Groups", "").split())
    want = {M.sh(f"getent group {g} | cut -d: -f3").stdout.strip() for g in ("render", "video")}
    check(want <= groups, f"SupplementaryGroups=render video: {groups} has {want}")
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        check(int(st.get(cap, "1"), 16) == 0, f"CapabilityBoundingSet= and no capabilities: {cap} {st.get(cap)}")
    check(st.get("NoNewPrivs") == "1", f"NoNewPrivileges=yes: {st.get('NoNewPrivs')}")
    check(st.get("Seccomp") == "2", f"SystemCallFilter= applied (seccomp filter mode): {st.get('Seccomp')}")
    check(st.get("Umask") == "0077", f"UMask=0077: {st.get('Umask')}")
    mounts = {}
    for line in M.sh(f"cat /proc/{pid}/mountinfo").stdout.splitlines():
        f = line.split()
        mounts[f[4]] = f[5].split(",")
    check("ro" in mounts.get("/", []) and "ro" in mounts.get("/usr", []),
          f"ProtectSystem=strict: / and /usr read-only ({mounts.get('/')}, {mounts.get('/usr')})")
    check("ro" in mounts.get("/sys", []), "ProtectKernelTunables=yes: /sys read-only")
    tmp_line = M.sh(f"grep ' /tmp ' /proc/{pid}/mountinfo").stdout
    check("systemd-private-" in tmp_line and "gpumemd.service" in tmp_line, f"PrivateTmp=yes: {tmp_line.strip()}")
    ns = {n: M.sh(f"readlink /proc/{pid}/ns/{n} /proc/1/ns/{n}").stdout.split() for n in ("net", "mnt")}
    check(len(set(ns["net"])) == 2, f"PrivateNetwork=yes: the daemon's network namespace is its own {ns['net']}")
    check(len(set(ns["mnt"])) == 2, f"a mount namespace of its own {ns['mnt']}")
    s = M.show("gpumemd.service", "DevicePolicy", "DeviceAllow", "RestrictAddressFamilies", "MemoryDenyWriteExecute")
    check(s.get("DevicePolicy") == "closed" and "/dev/kfd rw" in s.get("DeviceAllow", ""),
          f"DevicePolicy=closed with /dev/kfd and DRM: {s}")
    check(s.get("MemoryDenyWriteExecute") == "yes", f"MemoryDenyWriteExecute=yes: {s}")
    # the device policy needs the devices controller, which a container's systemd may not be given
    cg = M.sh(f"cat /proc/{pid}/cgroup").stdout
    if re.search(r"devices:/system.slice/gpumemd.service", cg):
        dl = M.sh("cat /sys/fs/cgroup/devices/system.slice/gpumemd.service/devices.list").stdout
        check("a *:* rwm" not in dl, f"the device cgroup is closed: {dl}")
    else:
        print("  the devices controller is not delegated to this container's systemd: DevicePolicy= is "
              "checked on the unit only", file=sys.stderr)


def test_reload(tmp):
    """systemctl reload re-reads the file; a bad file is refused whole and the running settings stay."""
    ctl("ping")
    M.wait_active()
    pid = M.show("gpumemd.service", "MainPID")["MainPID"]

    def handles_limit():
        r = ctl("-j", "quota", "show", "node")
        try:
            return next(q["limit"] for q in json.loads(r.stdout)["quotas"] if q["resource"] == "handles")
        except (ValueError, KeyError, StopIteration):
            return None

    write_config(CONFIG.format(handles=200000))
    c = cursor()
    r = M.sh("systemctl reload gpumemd")
    check(r.returncode == 0, f"systemctl reload: {r.stderr}")
    time.sleep(0.5)
    check(handles_limit() == 200000, f"the new limit is in force: {handles_limit()}")
    write_config(CONFIG.format(handles="lots"))
    r = M.sh("systemctl reload gpumemd")
    time.sleep(0.5)
    check(handles_limit() == 200000, f"a bad file changes nothing: {handles_limit()}")
    refused = [e for e in msg_entries(M.journal(since(c)), "CONFIG_RELOAD") if "refused" in e.get("MESSAGE", "")]
    check(len(refused) == 1 and refused[0].get("PRIORITY") == "3",
          f"the refusal is in the journal, an error, with its MESSAGE_ID: {refused}")
    s = M.show("gpumemd.service", "ActiveState", "MainPID")
    check(s.get("ActiveState") == "active" and s.get("MainPID") == pid, f"the same daemon goes on: {s}")
    write_config(CONFIG.format(handles=100000))
    M.sh("systemctl reload gpumemd")


def journal_ms(entries, pred):
    for e in entries:
        if pred(e):
            return int(e["__MONOTONIC_TIMESTAMP"]) / 1000.0
    return None


def test_restart(tmp):
    """systemctl restart with N clients holding every kind of memory a restart carries: each keeps its
    connection, id, handles, addresses and bytes; the class's charges are the same; the fd store is emptied
    after. The time from SIGTERM to READY=1 and the clients' longest stall are printed."""
    ctl("ping")
    M.wait_active()
    old = M.show("gpumemd.service", "MainPID")["MainPID"]
    carry = Carry(N_CLIENTS)
    check(carry.ready, f"{N_CLIENTS} clients hold their memory")
    if not carry.ready:
        carry.close()
        return
    q0 = carry.quota()
    check(q0.get(1, 0) > 0 and q0.get(2, 0) > 0 and q0.get(3, 0) > 0, f"the class is charged: {q0}")
    c = cursor()
    carry.cmd("watch")
    carry.line()
    r = M.sh("systemctl restart gpumemd", timeout=120)
    check(r.returncode == 0, f"systemctl restart: {r.stderr}")
    s = M.wait_active(not_pid=old)
    check(s.get("MainPID") not in (None, "0", old), f"a new daemon runs: {s}")
    res = carry.check()
    check(res[-1].startswith("ok "), f"every client, handle, address and byte carried: {res[-10:]}")
    q1 = carry.quota()
    check(q1 == q0, f"the class's charges are the same: {q0} then {q1}")
    s = M.show("gpumemd.service", "NFileDescriptorStore")
    check(s.get("NFileDescriptorStore") == "0", f"the new daemon emptied the fd store: {s}")
    entries = M.journal(since(c))
    took = [e for e in msg_entries(entries, "HANDOVER") if "took" in e.get("MESSAGE", "")]
    check(took and f"took {N_CLIENTS} of {N_CLIENTS} " in took[0]["MESSAGE"],
          f"the journal says all were taken back: {[e.get('MESSAGE') for e in took]}")
    t_term = journal_ms(entries, lambda e: "received SIGTERM" in e.get("MESSAGE", ""))
    t_ready = journal_ms(entries, lambda e: e.get("MESSAGE_ID") == MSG["STARTED"])
    if res[-1].startswith("ok ") and t_term is not None and t_ready is not None:
        stall = int(res[-1].split()[1]) / 1000.0
        print(f"restart under systemd: {N_CLIENTS} clients, SIGTERM to READY=1 {t_ready - t_term:.1f} ms, "
              f"longest client stall {stall:.1f} ms over {res[-1].split()[2]} pings", file=sys.stderr)
        print(f"# restart: clients={N_CLIENTS} term_to_ready_ms={t_ready - t_term:.1f} stall_ms={stall:.1f}")
    carry.close()


def test_reexec(tmp):
    """SIGUSR1 through systemd (systemctl kill): the same main process re-executes itself, reloading and
    ready again as systemd sees it, and its clients are carried."""
    ctl("ping")
    M.wait_active()
    pid = M.show("gpumemd.service", "MainPID")["MainPID"]
    carry = Carry(4)
    check(carry.ready, "4 clients hold their memory")
    c = cursor()
    r = M.sh("systemctl kill -s SIGUSR1 --kill-who=main gpumemd")
    check(r.returncode == 0, f"systemctl kill -s SIGUSR1: {r.stderr}")
    deadline = time.time() + 20
    while time.time() < deadline:
        if msg_entries(M.journal(since(c)), "STARTED"):
            break
        time.sleep(0.1)
    s = M.show("gpumemd.service", "ActiveState", "MainPID")
    check(s.get("MainPID") == pid and s.get("ActiveState") == "active", f"the same process serves again: {s}")
    if carry.ready:
        res = carry.check()
        check(res[-1].startswith("ok "), f"the clients are carried: {res[-5:]}")
    carry.close()


def test_stop(tmp):
    """systemctl stop: the daemon asks systemd what the SIGTERM is for, closes its clients with the reason,
    leaves nothing in the fd store, and the socket unit goes on listening."""
    ctl("ping")
    M.wait_active()
    carry = Carry(2)
    check(carry.ready, "2 clients hold their memory")
    c = cursor()
    r = M.sh("systemctl stop gpumemd.service")
    check(r.returncode == 0, f"systemctl stop: {r.stderr}")
    s = M.show("gpumemd.service", "ActiveState", "NFileDescriptorStore")
    check(s.get("ActiveState") == "inactive" and s.get("NFileDescriptorStore") == "0",
          f"stopped, the store empty: {s}")
    if carry.ready:
        res = carry.check()
        check(any("bad 0 ping" in x and f"({-108})" in x for x in res),
              f"the clients were told the daemon shut down (-ESHUTDOWN): {res[-4:]}")
    entries = M.journal(since(c))
    check(any("SIGTERM for a stop" in e.get("MESSAGE", "") for e in entries),
          "the daemon knew it was a stop (the unit's job)")
    check(msg_entries(entries, "STOPPED"), "the journal says it stopped")
    carry.close()
    check(M.show("gpumemd.socket", "SubState").get("SubState") == "listening", "the socket still listens")


def test_watchdog(tmp):
    """A stalled daemon (SIGSTOP) misses its watchdog: systemd aborts it and starts it again. (A drop-in makes
    WatchdogSec= short for the test.)"""
    M.sh("mkdir -p /run/systemd/system/gpumemd.service.d && printf '[Service]\\nWatchdogSec=2s\\n' > "
         "/run/systemd/system/gpumemd.service.d/watchdog.conf && systemctl daemon-reload")
    try:
        ctl("ping")
        s = M.wait_active()
        pid = s.get("MainPID")
        n0 = int(M.show("gpumemd.service", "NRestarts").get("NRestarts", "0"))
        c = cursor()
        M.sh(f"kill -STOP {pid}")
        deadline = time.time() + 40
        s = {}
        while time.time() < deadline:
            s = M.show("gpumemd.service", "ActiveState", "MainPID", "NRestarts")
            if int(s.get("NRestarts", "0")) > n0 and s.get("ActiveState") == "active" and s.get("MainPID") != pid:
                break
            time.sleep(0.2)
        check(int(s.get("NRestarts", "0")) > n0 and s.get("MainPID") not in ("0", pid),
              f"systemd restarted the stalled daemon: {s}")
        check(any("atchdog timeout" in e.get("MESSAGE", "") for e in M.journal(since(c))),
              "the journal says the watchdog fired")
    finally:
        M.sh("rm -rf /run/systemd/system/gpumemd.service.d && systemctl daemon-reload")


def test_journal(tmp):
    """The journal's fields as journalctl -o verbose shows them, and the catalog's text for the daemon's
    MESSAGE_IDs (journalctl -x)."""
    ctl("ping")
    # a client's connect is logged (gpumemctl's only at debug)
    hold = os.path.join(BUILD, "tests", "integ", "gm-hold")
    r = M.sh(f"{hold} {SOCK} journal-probe {first_gpu()} host:65536 </dev/null")
    check(r.returncode == 0, f"a client connects: {r.stdout}{r.stderr}")
    # (journalctl 252 finds nothing after a cursor that the match excludes: the probe's name picks it out)
    r = M.sh(f"journalctl -o verbose --no-pager MESSAGE_ID={MSG['CLIENT_CONNECT']} | grep -B30 -A10 journal-probe")
    check("GPUMEM_CLIENT_ID=" in r.stdout and "GPUMEM_CLIENT_UID=0" in r.stdout and
          "_SYSTEMD_UNIT=gpumemd.service" in r.stdout and "journal-probe" in r.stdout,
          f"a client's connect with its fields: {r.stdout[-1500:]}")
    r = M.sh(f"journalctl -x --no-pager -u gpumemd MESSAGE_ID={MSG['STARTED']}")
    check("gpumemd is serving clients" in r.stdout, f"the catalog explains the start: {r.stdout[-800:]}")


def test_no_gpu(tmp):
    """On a node without the GPU the backend serves (here: the kfd backend, no /dev/kfd) the daemon exits 69,
    which the unit does not restart on: no loop of restarts."""
    M.sh("systemctl stop gpumemd.service")
    write_config(CONFIG.format(handles=100000).replace("backend = model", "backend = kfd"))
    try:
        M.sh("systemctl start gpumemd.service", timeout=60)
        time.sleep(3)  # RestartSec=1s: a restart would have come
        s = M.show("gpumemd.service", "ActiveState", "Result", "ExecMainStatus", "NRestarts")
        check(s.get("ExecMainStatus") == "69" and s.get("ActiveState") == "failed",
              f"exit 69, the unit failed: {s}")
        # a start by hand counts the restarts afresh
        check(s.get("NRestarts") == "0", f"and was not restarted: {s}")
    finally:
        write_config(CONFIG.format(handles=100000))
        M.sh("systemctl reset-failed gpumemd.service")


def test_kfd_confined(tmp):
    """The kfd backend inside the shipped unit's sandbox: gpumemd --backend kfd under the model's preload (a
    drop-in sets LD_PRELOAD), under the unit's ProtectSystem=, SystemCallFilter=, MemoryDenyWriteExecute=,
    RestrictAddressFamilies= and user; clients holding every kind of memory are served, and gpumemctl status
    names the KFD ABI and the isolation path. The device calls themselves (open of /dev/kfd, its ioctls) the
    preload serves in the process: seccomp and DeviceAllow= never see them, what the kernel path does around
    them (memfds, mappings, files) they do (with memfd_create filtered out the daemon fails here)."""
    preload = os.path.join(E["LIBDIR"], "gpumemd", "libgpumem-model-preload.so")
    M.sh("systemctl stop gpumemd.service")
    write_config(CONFIG.format(handles=100000).replace("backend = model", "backend = kfd"))
    M.sh("mkdir -p /run/systemd/system/gpumemd.service.d && printf '[Service]\\nEnvironment=LD_PRELOAD="
         f"{preload} GPUMEM_MODEL_PRESET=mi300x\\n' > /run/systemd/system/gpumemd.service.d/kfd.conf && "
         "systemctl daemon-reload")
    try:
        r = ctl("status")
        check(r.returncode == 0 and "backend:   kfd, KFD ABI 1.19" in r.stdout and
              "isolation: a GPU VM per client" in r.stdout, f"the kfd backend serves: {r.stdout}{r.stderr}")
        carry = Carry(4)
        check(carry.ready, "4 clients hold every kind of memory through the kernel path")
        if carry.ready:
            res = carry.check()
            check(res[-1].startswith("ok "), f"and read it back: {res[-4:]}")
        carry.close()
        s = M.show("gpumemd.service", "ActiveState", "NRestarts")
        check(s.get("ActiveState") == "active" and s.get("NRestarts") == "0", f"the daemon ran on: {s}")
    finally:
        M.sh("systemctl stop gpumemd.service; rm -rf /run/systemd/system/gpumemd.service.d && "
             "systemctl daemon-reload")
        write_config(CONFIG.format(handles=100000))


def main():
    global M
    if os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("nsenter"):
        print("skipped: needs root, systemd-nspawn (systemd-container) and nsenter")
        sys.exit(77)
    install_or_exit(DEST)
    write_config(CONFIG.format(handles=100000))
    try:
        M = Machine()
        libdir = E["LIBDIR"]
        r = M.sh(f"echo {libdir} > /etc/ld.so.conf && ldconfig && systemd-sysusers && "
                 "systemd-tmpfiles --create gpumemd.conf && journalctl --update-catalog && "
                 "systemctl daemon-reload && systemctl restart gpumemd.socket")
        if r.returncode != 0:
            print(f"not ok 1 - setting up the container (exit {r.returncode}): {r.stdout}{r.stderr}")
            sys.exit(1)
        run_tests([
            ("socket activation and Type=notify readiness", test_activation),
            ("the shipped unit's sandbox as applied", test_sandbox),
            ("systemctl reload: a bad file refused, the settings kept", test_reload),
            (f"systemctl restart carries {N_CLIENTS} clients and all their memory", test_restart),
            ("SIGUSR1 through systemd: re-executed in place", test_reexec),
            ("systemctl stop: clients told, store empty", test_stop),
            ("the watchdog restarts a stalled daemon", test_watchdog),
            ("journal fields and catalog", test_journal),
            ("no GPU: exit 69, no restart loop", test_no_gpu),
            ("the kfd backend in the unit's sandbox", test_kfd_confined),
        ])
    finally:
        if M:
            M.close()
        shutil.rmtree(DEST, ignore_errors=True)
        shutil.rmtree(WORK, ignore_errors=True)


main()
