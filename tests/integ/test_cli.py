#!/usr/bin/env python3
"""Integration tests of gpumemd and gpumemctl as programs: options, config checks, reload, connection caps,
socket activation through systemd-socket-activate, and gpumemctl's tables, JSON and errors."""
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMCTL, GPUMEMD, Notify, check, ctl, hello_frame, run_tests, stop  # noqa: E402


class Daemon:
    def __init__(self, tmp, config="", args=(), preset="mi300x"):
        self.tmp = tmp
        self.sock = os.path.join(tmp, "gpumemd.sock")
        self.conf = os.path.join(tmp, "gpumemd.conf")
        self.write_config(config)
        self.notify = Notify(os.path.join(tmp, "notify"))
        env = dict(os.environ, NOTIFY_SOCKET=self.notify.path)
        self.proc = subprocess.Popen(
            [GPUMEMD, "--socket", self.sock, "--config", self.conf, "--backend", "model", "--model-preset", preset, *args],
            env=env, stderr=subprocess.PIPE, text=True)
        self.ready = self.notify.wait("READY=1")

    def write_config(self, text):
        with open(self.conf + ".new", "w") as f:
            f.write(text)
        os.rename(self.conf + ".new", self.conf)

    def stop(self):
        code, err = stop(self.proc)
        self.stopping = self.notify.wait("STOPPING=1", 1)
        self.notify.close()
        return code, err



def raw_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s



def reply_code(packet):
    """Status.code of a Reply packet (field 1 of Status, zigzag), or None."""
    body = packet[16:]
    if len(body) < 2 or body[0] != 0x0A:
        return None
    status = body[2:2 + body[1]]
    i, code = 0, 0
    while i < len(status):
        tag = status[i]
        i += 1
        if tag == 0x08:
            v, shift = 0, 0
            while True:
                b = status[i]
                i += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            code = (v >> 1) ^ -(v & 1)
        elif tag == 0x12:
            i += 1 + status[i]
        else:
            break
    return code


def try_connect_hello(path):
    """Connect and say hello; returns (socket, status code)."""
    s = raw_connect(path)
    s.settimeout(5)
    try:
        s.send(hello_frame())
        return s, reply_code(s.recv(65536))
    except (BrokenPipeError, ConnectionResetError):
        s.settimeout(1)
        try:
            return s, reply_code(s.recv(65536))
        except OSError:
            return s, None


def test_options(tmp):
    r = subprocess.run([GPUMEMD, "--version"], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.startswith("gpumemd "), "--version prints the version")
    r = subprocess.run([GPUMEMD, "--help"], capture_output=True, text=True)
    check(r.returncode == 0 and "--model-preset" in r.stdout and "(default kfd)" in r.stdout,
          "--help lists the options, kfd the default backend")
    r = subprocess.run([GPUMEMD, "--frobnicate"], capture_output=True, text=True)
    check(r.returncode == 1 and "unknown option" in r.stderr, "unknown option fails with a reason")
    r = subprocess.run([GPUMEMD, "--socket", os.path.join(tmp, "x.sock"), "--config", "/dev/null",
                        "--backend", "model", "--model-preset", "no-such-preset"], capture_output=True, text=True, timeout=20)
    check(r.returncode == 1 and "no-such-preset" in r.stderr, "a missing preset is named in the error")
    # with no configuration the backend is the kernel's: without /dev/kfd the daemon refuses to start and
    # says what to do, rather than serving a simulated GPU
    if not os.path.exists("/dev/kfd"):
        r = subprocess.run([GPUMEMD, "--socket", os.path.join(tmp, "y.sock"), "--config", "/dev/null"],
                           capture_output=True, text=True, timeout=20)
        check(r.returncode == 69 and "/dev/kfd" in r.stderr and "--backend model" in r.stderr
              and not os.path.exists(os.path.join(tmp, "y.sock")),
              "no /dev/kfd: the default backend refuses to start (exit 69, no GPU), naming /dev/kfd and "
              "--backend model")


def test_check_config(tmp):
    good = os.path.join(tmp, "good.conf")
    bad = os.path.join(tmp, "bad.conf")
    with open(good, "w") as f:
        f.write("[daemon]\nbackend = model\nmodel-preset = mi100\nmax-connections = 8\n")
    with open(bad, "w") as f:
        f.write("# a comment\n[daemon]\nbackend = gpu\nmax-connections = lots\n[nosuch]\n")
    r = subprocess.run([GPUMEMD, "--check-config", "--config", good], capture_output=True, text=True)
    check(r.returncode == 0 and "OK" in r.stdout, "--check-config accepts a good file")
    r = subprocess.run([GPUMEMD, "--check-config", "--config", bad], capture_output=True, text=True)
    check(r.returncode == 1, "--check-config refuses a bad file")
    check(f"{bad}:3:" in r.stderr and f"{bad}:4:" in r.stderr and f"{bad}:5:" in r.stderr,
          "--check-config names the line of each error")


def test_gpumemctl(tmp):
    # handover = no: a plain stop, which removes the socket file (a hand-over leaves it to the next daemon)
    d = Daemon(tmp, "[daemon]\nhandover = no\n")
    check(d.ready, "daemon ready")
    r = ctl(d.sock, "status")
    check(r.returncode == 0 and "backend:" in r.stdout and "mi300x" in r.stdout
          and "SIMULATED GPUs" in r.stdout, "status table, the model said to be one")
    r = ctl(d.sock, "--json", "status")
    try:
        st = json.loads(r.stdout)
        check(st["schema"] == 1 and st["backend"] == "model" and st["simulated"] is True and st["gpus"] == 8
              and st["clients"] == 1,
              "status --json fields")
        check(st["pid"] == d.proc.pid, "status --json pid is the daemon's")
    except (ValueError, KeyError) as e:
        check(False, f"status --json is valid JSON with the documented fields ({e})")
    r = ctl(d.sock, "--json", "topology", "--properties")
    try:
        topo = json.loads(r.stdout)
        gpus = [n for n in topo["nodes"] if n["kind"] == "gpu"]
        check(len(gpus) == 8 and all(n["vram_bytes"] == 192 << 30 for n in gpus), "topology --json GPUs")
        check(all("simd_count" in n["properties"] for n in gpus), "topology --json properties")
    except (ValueError, KeyError) as e:
        check(False, f"topology --json is valid JSON ({e})")
    r = ctl(d.sock, "topology")
    check(r.returncode == 0 and "gfx942" in r.stdout and "XGMI" in r.stdout, "topology table")
    r = ctl(d.sock, "--json", "clients")
    try:
        cl = json.loads(r.stdout)
        check(len(cl["clients"]) == 1 and cl["clients"][0]["name"] == "gpumemctl", "clients --json")
    except (ValueError, KeyError) as e:
        check(False, f"clients --json is valid JSON ({e})")
    r = ctl(d.sock, "metrics")
    check(r.returncode == 0 and "gpumemd_requests_total" in r.stdout, "metrics")
    r = ctl(d.sock, "disconnect", "424242")
    check(r.returncode == 5 and r.stderr.count("\n") == 1 and "424242" in r.stderr, "disconnect of nobody: 5")
    r = ctl(d.sock, "frobnicate")
    check(r.returncode == 2 and "unknown command" in r.stderr, "unknown command: 2")
    code, err = d.stop()
    check(code == 0, "daemon exits 0 on SIGTERM")
    check(d.stopping, "STOPPING=1 sent")
    check(not os.path.exists(d.sock), "socket removed at exit")
    # no daemon: one clear line and a non-zero exit
    r = ctl(d.sock, "--json", "status")
    check(r.returncode == 3 and r.stderr.count("\n") == 1 and "cannot connect" in r.stderr,
          "gpumemctl against a missing socket: 3")
    try:
        e = json.loads(r.stdout)["error"]
        check(e["errno"] == -errno.ENOENT and e["name"] == "ENOENT" and "cannot connect" in e["what"]
              and r.stdout.count("\n") == 1, "with --json the error is one JSON object on stdout")
    except (ValueError, KeyError) as ex:
        check(False, f"the error is JSON ({ex}): {r.stdout!r}")
    r = ctl(d.sock, "status")
    check(r.returncode == 3 and r.stdout == "", "without --json nothing on stdout")
    # gpumemctl's own options stand anywhere on the line; --version; usage errors are 2
    r = subprocess.run([GPUMEMCTL, "--version"], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.startswith("gpumemctl "), "--version")
    r = subprocess.run([GPUMEMCTL, "status", "--json", "--socket", d.sock], capture_output=True, text=True)
    check(r.returncode == 3 and json.loads(r.stdout)["exit_status"] == 3, "options after the command")
    r = subprocess.run([GPUMEMCTL, "--frobnicate", "status"], capture_output=True, text=True)
    check(r.returncode == 2 and "unknown option" in r.stderr, "an unknown option: 2")


def test_caps_and_reload(tmp):
    d = Daemon(tmp, "[daemon]\nmax-connections-per-uid = 3\n")
    check(d.ready, "daemon ready")
    held = []
    for _ in range(3):
        s, code = try_connect_hello(d.sock)
        check(code == 0, "connections under the per-uid cap are served")
        held.append(s)
    s, code = try_connect_hello(d.sock)
    check(code == -87, f"the connection over the cap is refused with -EUSERS (got {code})")  # EUSERS = 87
    s.close()
    held.pop().close()
    time.sleep(0.2)
    s, code = try_connect_hello(d.sock)
    check(code == 0, "a freed slot can be used again")
    held.append(s)

    # a good reload lowers the cap
    d.write_config("[daemon]\nmax-connections-per-uid = 2\n")
    d.proc.send_signal(signal.SIGHUP)
    refused = False
    for _ in range(100):
        s, code = try_connect_hello(d.sock)
        s.close()
        if code == -87:
            refused = True
            break
        time.sleep(0.05)
    check(refused, "SIGHUP applies a good file")
    for s in held:
        s.close()
    held = []
    time.sleep(0.2)

    # a bad reload changes nothing, not even the good lines of the bad file
    d.write_config("[daemon]\nmax-connections-per-uid = 50\nbackend = gpu\n")
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    for _ in range(2):
        s, code = try_connect_hello(d.sock)
        check(code == 0, "served under the old cap")
        held.append(s)
    s, code = try_connect_hello(d.sock)
    check(code == -87, "a refused reload leaves the old cap in force")
    s.close()
    for s in held:
        s.close()
    check(d.proc.poll() is None, "the daemon survives a bad reload")

    # a second daemon on the same socket refuses to start
    r = subprocess.run([GPUMEMD, "--socket", d.sock, "--config", "/dev/null", "--backend", "model"],
                       capture_output=True, text=True, timeout=20)
    check(r.returncode == 1 and "already listening" in r.stderr, "a second daemon on a live socket")
    code, err = d.stop()
    check(code == 0, "daemon exits 0")
    check("reload refused" in err and "gpu" in err, "the refused reload is logged with its reason")


def test_socket_activation(tmp):
    activate = shutil.which("systemd-socket-activate")
    if not activate:
        check(False, "systemd-socket-activate is installed (Debian's systemd package)")
        return
    sock = os.path.join(tmp, "activated.sock")
    notify = Notify(os.path.join(tmp, "notify-act"))
    proc = subprocess.Popen([activate, "--seqpacket", "-l", sock, "-E", f"NOTIFY_SOCKET={notify.path}",
                             GPUMEMD, "--config", "/dev/null", "--socket", os.path.join(tmp, "unused.sock"),
                             "--backend", "model", "--model-preset", "gfx908"], stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.02)
    # the first connection starts gpumemd with the listening socket passed in (the file exists a moment
    # before systemd-socket-activate listens on it)
    for _ in range(100):
        r = ctl(sock, "--json", "status")
        if r.returncode == 0 or "refused" not in r.stderr:
            break
        time.sleep(0.05)
    check(r.returncode == 0, f"a client is served through the activated socket ({r.stderr.strip()})")
    if r.returncode == 0:
        check(json.loads(r.stdout)["gpus"] == 1, "the activated daemon runs the gfx908 preset")
    check(notify.wait("READY=1"), "READY=1 from the activated daemon")
    check(not os.path.exists(os.path.join(tmp, "unused.sock")), "an activated daemon binds no socket itself")
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    check(proc.returncode == 0, f"activated daemon exits 0 ({proc.returncode})")
    check(notify.wait("STOPPING=1", 1), "STOPPING=1 from the activated daemon")
    notify.close()


def test_admin_commands(tmp):
    d = Daemon(tmp, "[class team]\nmatch-uid = 0\nvram = 8G\nhandles = 100\n")
    check(d.ready, "daemon ready")
    # something to list: a client that holds memory while gpumemctl looks
    holder = subprocess.Popen([os.environ["GPUMEM_EXAMPLES"] + "/vmm-grow"], env=dict(os.environ, GPUMEM_SOCKET=d.sock),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if os.environ.get("GPUMEM_EXAMPLES") else None
    if holder:
        holder.wait(timeout=60)
    r = ctl(d.sock, "--json", "quota", "show")
    try:
        q = json.loads(r.stdout)
        vram = [e for e in q["quotas"] if e["class"] == "team" and e["resource"] == "vram" and e["gpu_id"] == 0]
        check(len(vram) == 1 and vram[0]["limit"] == 8 << 30, "quota show --json has the class's VRAM limit")
        conns = [e for e in q["quotas"] if e["resource"] == "connections" and e["gpu_id"] == 0]
        check(conns and conns[0]["used"] == 1 and conns[0]["limit"] is None, "connections used, no limit (null)")
        names = {e["resource"] for e in q["quotas"] if e["class"] == "team"}
        check({"queues", "mappings", "shares"} <= names and "unknown" not in names,
              f"quota show names every resource the daemon bounds: {sorted(names)}")
        shares = [e for e in q["quotas"] if e["class"] == "team" and e["resource"] == "shares"]
        check(shares and shares[0]["limit"] == 1024, "a class's named shares: 1024 unless it says")
    except (ValueError, KeyError) as e:
        check(False, f"quota show --json is valid JSON ({e})")
    r = ctl(d.sock, "quota", "set", "team", "vram", "4G")
    check(r.returncode == 0, "quota set")
    r = ctl(d.sock, "quota", "show", "team")
    check(r.returncode == 0 and "4.0 GiB" in r.stdout, "quota show reflects the new limit")
    r = ctl(d.sock, "quota", "set", "team", "teleports", "4")
    check(r.returncode == 2 and "unknown resource" in r.stderr, "quota set: unknown resource")
    r = ctl(d.sock, "quota", "set", "team", "vram", "lots")
    check(r.returncode == 2 and "not a limit" in r.stderr, "quota set: bad limit")
    r = ctl(d.sock, "quota", "set", "nobody", "vram", "1G")
    check(r.returncode == 5 and r.stderr.count("\n") == 1 and "nobody" in r.stderr, "quota set: no such class")
    # another connection of the class, then a limit below the two connections in use
    other = raw_connect(d.sock)
    time.sleep(0.1)
    r = ctl(d.sock, "quota", "set", "team", "connections", "1")
    check(r.returncode == 1 and "more than the new limit" in r.stderr, "quota set below usage needs --force")
    r = ctl(d.sock, "quota", "set", "team", "connections", "1", "--force")
    check(r.returncode == 0, "quota set --force")
    r = ctl(d.sock, "status")
    check(r.returncode == 1 and "limit of 1 connections" in r.stderr, "the forced limit holds for new connections")
    other.close()
    time.sleep(0.2)
    r = ctl(d.sock, "quota", "set", "team", "connections", "unlimited")
    check(r.returncode == 0, "quota set unlimited once there is room")
    r = ctl(d.sock, "--json", "allocations")
    try:
        a = json.loads(r.stdout)
        check(a["schema"] == 1 and a["allocations"] == [], "allocations --json (none held)")
    except (ValueError, KeyError) as e:
        check(False, f"allocations --json is valid JSON ({e})")
    if shutil.which("setpriv") and os.geteuid() == 0:
        # someone who may not: refused at the socket or by the daemon, exit status 4 either way
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", GPUMEMCTL,
                            "--socket", d.sock, "--json", "clients"], capture_output=True, text=True, timeout=20)
        check(r.returncode == 4 and json.loads(r.stdout or "{}").get("exit_status") == 4,
              f"not allowed: exit status 4 ({r.returncode}, {r.stderr.strip()})")
    r = ctl(d.sock, "allocations", "--client", "99999")
    check(r.returncode == 5 and "99999" in r.stderr, "allocations of a client that does not exist: 5")
    r = ctl(d.sock, "--json", "clients")
    try:
        c = json.loads(r.stdout)["clients"][0]
        check(c["class"] == "team" and "pod" in c and "container" in c, "clients --json shows class and container")
    except (ValueError, KeyError, IndexError) as e:
        check(False, f"clients --json ({e})")
    code, err = d.stop()
    check(code == 0, "daemon exits 0")
    check("limit to unlimited (was 1), forced" not in err and "limit to unlimited (was 1)" in err
          and "18446744073709551615" not in err, "the log says unlimited, not the number behind it")
    check("connected as 'gpumemctl'" not in err
          and err.count("disconnected after") == err.count("connected as"),
          "gpumemctl's sessions put no connect/disconnect lines in the log at info; other clients do")


def preset_gpus(preset="mi300x"):
    """{kfd gpu id: (pci address, unique id)} read from the model preset's sysfs files, not from gpumemd."""
    nodes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "thunk", "presets", preset, "nodes")
    gpus = {}
    for n in os.listdir(nodes):
        with open(os.path.join(nodes, n, "gpu_id")) as f:
            gpu_id = int(f.read().strip() or 0)
        if not gpu_id:
            continue
        with open(os.path.join(nodes, n, "properties")) as f:
            props = dict(line.split() for line in f if len(line.split()) == 2)
        loc, dom = int(props["location_id"]), int(props.get("domain", 0))
        gpus[gpu_id] = (f"{dom:04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1f:02x}.{loc & 7:x}",
                        f"0x{int(props['unique_id']):016x}")
    return gpus


def scrape_value(body, metric, **labels):
    """The value of the one series of @metric whose labels include @labels (exactly one must match)."""
    found = []
    for line in body.splitlines():
        if not line.startswith(metric + "{") and line.split(" ")[0] != metric:
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            found.append(float(value))
    check(len(found) == 1, f"{metric} {labels}: one series ({len(found)})")
    return found[0] if found else None


def test_metrics_listener(tmp):
    import urllib.request
    # a free port on the loopback: bind, read it back, let it go
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    d = Daemon(tmp, f"[daemon]\nmetrics-listen = 127.0.0.1:{port}\n[class team]\nmatch-uid = 0\nvram = 8G\n"
                    "handles = 100\n")
    check(d.ready, "daemon ready")
    gpus = preset_gpus()
    gpu = sorted(gpus)[0]
    # a client with a name that needs escaping, holding device, host and managed memory while we scrape
    name = 'odd "name" \\ here'
    hold = subprocess.Popen([os.environ["GM_HOLD"], d.sock, name, str(gpu), "device:2097152", "host:4194304",
                             "managed:1048576"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = hold.stdout.readline().split()
        check(len(held) == 2 and held[0] == "held", f"the holder holds its memory ({held})")
        client_id = held[1] if len(held) == 2 else "?"
        ctl(d.sock, "ping")
        body = ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                body = r.read().decode()
                check(r.status == 200, "GET /metrics answers 200")
                check(r.headers.get("Content-Type", "").startswith("text/plain"), "Prometheus text content type")
        except OSError as e:
            check(False, f"GET /metrics: {e}")
        check("gpumemd_up{backend=\"model\"} 1" in body, "the metrics are gpumemd's")
        check('gpumemd_operations_total{op="ping",result="ok"}' in body, "operations are counted")
        check(re.search(r'^gpumemd_build_info\{version="[0-9.]+",protocol="\d+",backend="model"\} 1$', body, re.M)
              is not None, "gpumemd_build_info")
        # per GPU: total, used, free, labelled as the preset's sysfs says
        for g, (pci, uid) in gpus.items():
            labels = {"kfd_gpu_id": g, "pci_address": pci, "unique_id": uid}
            total = scrape_value(body, "gpumemd_gpu_vram_total_bytes", **labels)
            used = scrape_value(body, "gpumemd_gpu_vram_used_bytes", **labels)
            free = scrape_value(body, "gpumemd_gpu_vram_free_bytes", **labels)
            check(total == 192 << 30, f"GPU {g}: 192 GiB of VRAM ({total})")
            check(used == (2 << 20 if g == gpu else 0), f"GPU {g}: what the holder holds is used ({used})")
            check(free is not None and total is not None and free <= total - used, f"GPU {g}: free ({free})")
        # per class: one family per resource, bytes and counts apart, limits beside use
        check(scrape_value(body, "gpumemd_class_vram_bytes", **{"class": "team"}) == 2 << 20, "class VRAM")
        check(scrape_value(body, "gpumemd_class_vram_limit_bytes", **{"class": "team"}) == 8 << 30, "class VRAM limit")
        check(scrape_value(body, "gpumemd_class_host_bytes", **{"class": "team"}) == 4 << 20, "class host memory")
        check(scrape_value(body, "gpumemd_class_handles", **{"class": "team"}) == 3, "class handles")
        check(scrape_value(body, "gpumemd_class_handles_limit", **{"class": "team"}) == 100, "class handle limit")
        check('gpumemd_class_host_limit_bytes{class="team"} +Inf' in body, "no host limit: +Inf")
        check(scrape_value(body, "gpumemd_class_gpu_vram_bytes", **{"class": "team", "kfd_gpu_id": gpu}) == 2 << 20,
              "class VRAM per GPU")
        # per client, its name escaped
        esc = name.replace("\\", "\\\\").replace('"', '\\"')
        who = {"client": client_id, "name": esc, "class": "team", "uid": os.getuid(), "container": "", "pod_uid": ""}
        check(scrape_value(body, "gpumemd_client_memory_bytes", kind="device", **who) == 2 << 20, "client device bytes")
        check(scrape_value(body, "gpumemd_client_memory_bytes", kind="host", **who) == 4 << 20, "client host bytes")
        check(scrape_value(body, "gpumemd_client_memory_bytes", kind="managed", **who) == 1 << 20, "client managed")
        check(scrape_value(body, "gpumemd_client_gpu_vram_bytes", kfd_gpu_id=gpu, **who) == 2 << 20, "client per GPU")
        check(scrape_value(body, "gpumemd_client_handles", **who) == 3, "client handles")
        check(scrape_value(body, "gpumemd_client_fds", **who) >= 2, "client fds (host and managed memory's files)")
        # the daemon's process
        fds = scrape_value(body, "process_open_fds")
        now = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
        # the scrape's own connection was open then and may be closed now
        check(fds is not None and now <= fds <= now + 1, f"process_open_fds ({fds}, now {now})")
        check((scrape_value(body, "process_threads") or 0) >= 2, "process_threads")
        check((scrape_value(body, "process_resident_memory_bytes") or 0) > 1 << 20, "process_resident_memory_bytes")
        start = scrape_value(body, "process_start_time_seconds") or 0
        check(abs(start - time.time()) < 120, f"process_start_time_seconds ({start})")
        # Prometheus's own linter over the live scrape
        promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
        if not promtool:
            check(False, "promtool is installed (scripts/deps.sh puts it in /usr/local/bin)")
        else:
            lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
            check(lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(),
                  f"promtool check metrics is clean ({lint.returncode}: {(lint.stdout + lint.stderr).strip()[:500]})")
    finally:
        hold.stdin.close()
        try:
            hold_status = hold.wait(timeout=20)
        except subprocess.TimeoutExpired:
            hold.kill()
            hold_status = hold.wait()
    check(hold_status == 0, "the holder frees everything and exits 0")
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
        urllib.request.urlopen(req, timeout=10)
        check(False, "POST is refused")
    except urllib.error.HTTPError as e:
        check(e.code in (405, 501), f"POST is refused ({e.code})")
    code, _ = d.stop()
    check(code == 0, "daemon exits 0")


def test_tables(tmp):
    """gpumemctl's tables for scripts: -o picks columns, -n drops the heading, -r and -b make rows parseable."""
    d = Daemon(tmp, "[class team]\nmatch-uid = 0\nvram = 8G\n")
    check(d.ready, "daemon ready")
    gpus = preset_gpus()
    gpu = sorted(gpus)[0]
    hold = subprocess.Popen([os.environ["GM_HOLD"], d.sock, "a holder", str(gpu), "device:2097152",
                             "host:4194304"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = hold.stdout.readline().split()
        check(len(held) == 2 and held[0] == "held", f"the holder holds its memory ({held})")
        cid = held[1] if len(held) == 2 else "?"
        r = ctl(d.sock, "clients")
        lines = r.stdout.splitlines()
        check(r.returncode == 0 and lines and lines[0].split() == [
            "ID", "PID", "UID", "CLASS", "NAME", "CONTAINER", "CONNECTED", "HANDLES", "VRAM", "HOST", "MANAGED"],
            f"clients: the default columns ({lines[:1]})")
        r = ctl(d.sock, "-nrb", "-o", "ID,VRAM,host,Name", "clients")
        rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()}
        check(r.returncode == 0 and rows.get(cid) == ["2097152", "4194304", "a\\x20holder"],
              f"clients -nrb -o ID,VRAM,host,Name: the holder's row ({r.stdout!r})")
        check(all(len(v) == 3 for v in rows.values()) and "ID" not in rows, "every row has every field, no heading")
        r = ctl(d.sock, "clients", "-o", "+pod,fds")
        head = r.stdout.splitlines()[0].split() if r.stdout else []
        check(head[-3:] == ["MANAGED", "POD", "FDS"], f"-o +LIST adds to the defaults ({head})")
        r = ctl(d.sock, "clients", "-o", "ID,frobs")
        check(r.returncode == 2 and "no column 'frobs'" in r.stderr and "CGROUP" in r.stderr and not r.stdout,
              f"an unknown column: usage error listing the columns ({r.returncode}, {r.stderr.strip()})")
        r = ctl(d.sock, "--json", "-o", "ID", "clients")
        check(r.returncode == 0 and "pid" in json.loads(r.stdout or "{}")["clients"][0], "--json ignores -o")
        r = ctl(d.sock, "allocations", "-n", "-r", "-b", "-o", "KIND,SIZE,GPU")
        want = [f"device 2097152 {gpu}", f"host 4194304 {gpu}"]
        check(r.returncode == 0 and sorted(r.stdout.splitlines()) == want,
              f"allocations -nrb: one row per object, no count ({r.stdout!r})")
        r = ctl(d.sock, "allocations")
        check(r.returncode == 0 and r.stdout.splitlines()[-1] == "2 objects", "allocations for people: the count")
        r = ctl(d.sock, "topology", "-n", "-o", "GPU_ID,PCI")
        topo = dict(line.split() for line in r.stdout.splitlines())
        check(all(topo.get(str(g)) == pci for g, (pci, _) in gpus.items()) and topo.get("-") == "-",
              f"topology -o GPU_ID,PCI: the preset's PCI addresses ({r.stdout!r})")
        r = ctl(d.sock, "-rnb", "quota", "show", "team")
        q = [line.split() for line in r.stdout.splitlines()]
        check(["team", "vram", "all", "2097152", str(8 << 30)] in q and ["team", "handles", "all", "2", "unlimited"]
              in q and all(len(row) == 5 for row in q), f"quota show -rnb ({r.stdout!r})")
        r = ctl(d.sock, "-b", "status")
        check(r.returncode == 0 and "device 2097152" in r.stdout, "status -b: sizes in bytes")
        r = ctl(d.sock, "-o")
        check(r.returncode == 2 and "needs a list of columns" in r.stderr, "-o without its list: usage error")
    finally:
        hold.stdin.close()
        try:
            hold.wait(timeout=20)
        except subprocess.TimeoutExpired:
            hold.kill()
    code, _ = d.stop()
    check(code == 0, "daemon exits 0")


def test_completion(tmp):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "libclient", "gpumemctl.bash")
    prog = f"""
_init_completion() {{ words=("${{COMP_WORDS[@]}}"); cword=$COMP_CWORD; cur="${{COMP_WORDS[COMP_CWORD]}}"; prev="${{COMP_WORDS[COMP_CWORD-1]}}"; }}
_filedir() {{ :; }}
complete() {{ :; }}
source {script}
COMP_WORDS=(gpumemctl qu); COMP_CWORD=1; _gpumemctl; echo "1:${{COMPREPLY[*]}}"
COMP_WORDS=(gpumemctl quota s); COMP_CWORD=2; _gpumemctl; echo "2:${{COMPREPLY[*]}}"
COMP_WORDS=(gpumemctl --json quota set team v); COMP_CWORD=5; _gpumemctl; echo "3:${{COMPREPLY[*]}}"
COMP_WORDS=(gpumemctl log-level d); COMP_CWORD=2; _gpumemctl; echo "4:${{COMPREPLY[*]}}"
"""
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True)
    out = r.stdout.splitlines()
    check(r.returncode == 0 and out == ["1:quota", "2:show set", "3:vram", "4:debug"], f"bash completion ({out})")


def test_json_schema(tmp):
    """Every command's --json output, and the error object, against docs/gpumemctl.schema.json."""
    import ctypes
    import jsonschema
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                           "gpumemctl.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)

    def valid(what, out, kind):
        try:
            doc = json.loads(out)
            jsonschema.validate(doc, {"$ref": "#/$defs/" + kind, "$defs": schema["$defs"]})
            jsonschema.validate(doc, schema)  # and exactly one kind of the whole schema
            check(out.count("\n") == 1, f"{what}: one line")
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, f"{what}: {str(e)[:300]}")

    d = Daemon(tmp, "[class team]\nmatch-uid = 0\nvram = 8G\n")
    check(d.ready, "daemon ready")
    # a client of this process's holding device memory, and one to disconnect; a sanitizer build's library
    # cannot be loaded into python (its runtime must come first), so there a second gpumemctl is the victim
    libpath = os.path.join(os.path.dirname(GPUMEMCTL), "libgpumem_client.so.1")
    ldd = subprocess.run(["ldd", libpath], capture_output=True, text=True).stdout
    with open(libpath, "rb") as f:
        blob = f.read()
    # clang links the sanitizer runtime into executables: its library only names the runtime's symbols
    runtime_refs = any(sym in blob for sym in (b"__asan_init", b"__tsan_init", b"__ubsan_handle"))
    if "libasan" in ldd or "libtsan" in ldd or "libubsan" in ldd or runtime_refs:
        r = ctl(d.sock, "--json", "allocations")
        valid("allocations (none held)", r.stdout, "allocations")
        for args, kind in [(["status"], "status"), (["topology", "--properties"], "topology"),
                           (["clients"], "clients"), (["quota", "show"], "quota_show"), (["ping"], "ping"),
                           (["disconnect", "424242"], "error")]:
            valid(" ".join(args), ctl(d.sock, "--json", *args).stdout, kind)
        d.stop()
        return
    lib = ctypes.CDLL(libpath)
    holder, victim, ptr, err = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.create_string_buffer(256)
    check(lib.gm_client_open(d.sock.encode(), b"holder", ctypes.byref(holder), err, 256) == 0, "holder connects")
    gpu = [n["gpu_id"] for n in json.loads(ctl(d.sock, "--json", "topology").stdout)["nodes"] if n["gpu_id"]][0]
    check(lib.gm_malloc(holder, ctypes.c_size_t(2 << 20), ctypes.c_uint32(gpu), 0, ctypes.byref(ptr)) == 0,
          "holder allocates")
    check(lib.gm_client_open(d.sock.encode(), b"victim", ctypes.byref(victim), err, 256) == 0, "victim connects")
    r = ctl(d.sock, "--json", "clients")
    victim_id = [c["id"] for c in json.loads(r.stdout)["clients"] if c["name"] == "victim"][0]
    runs = [(["status"], "status"), (["topology"], "topology"), (["topology", "--properties"], "topology"),
            (["clients"], "clients"), (["allocations"], "allocations"), (["quota", "show"], "quota_show"),
            (["quota", "set", "team", "vram", "16G"], "quota_set"),
            (["quota", "set", "team", "handles", "unlimited"], "quota_set"), (["ping"], "ping"),
            (["metrics"], "metrics"), (["log-level", "info"], "log_level"),
            (["disconnect", str(victim_id)], "disconnect"),
            (["disconnect", "424242"], "error"), (["quota", "set", "team", "vram", "lots"], "error"),
            (["frobnicate"], "error")]
    for args, kind in runs:
        r = ctl(d.sock, "--json", *args)
        check((r.returncode == 0) == (kind != "error"), f"{' '.join(args)}: exit status {r.returncode}")
        valid(" ".join(args), r.stdout, kind)
    a = json.loads(ctl(d.sock, "--json", "allocations").stdout)["allocations"]
    check(len(a) == 1 and a[0]["kind"] == "device" and a[0]["size"] == 2 << 20, "the holder's allocation is listed")
    r = ctl(os.path.join(tmp, "nothing.sock"), "--json", "status")
    valid("no daemon", r.stdout, "error")
    lib.gm_client_close(holder)
    lib.gm_client_close(victim)
    code, _ = d.stop()
    check(code == 0, "daemon exits 0")


def main():
    tests = [
        ("options, version and help", test_options),
        ("--check-config names each error's line", test_check_config),
        ("gpumemctl tables, JSON and errors", test_gpumemctl),
        ("connection caps and SIGHUP reload", test_caps_and_reload),
        ("socket activation with systemd-socket-activate", test_socket_activation),
        ("gpumemctl quota, allocations and clients", test_admin_commands),
        ("metrics over HTTP (metrics-listen)", test_metrics_listener),
        ("gpumemctl tables: columns, no heading, raw, bytes", test_tables),
        ("bash completion", test_completion),
        ("every command's --json output against docs/gpumemctl.schema.json", test_json_schema),
    ]
    run_tests(tests)

main()
