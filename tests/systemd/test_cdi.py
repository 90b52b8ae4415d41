#!/usr/bin/env python3
"""gpumemctl cdi: a valid Container Device Interface spec that gives a container the socket and GPUMEM_SOCKET and
nothing of /dev/kfd; its options, its refusals, and (where mount namespaces are allowed) a client in a private
mount namespace set up the way the spec says reaching the daemon."""
import json
import os
import re
import socket
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMCTL, GPUMEMD, Notify, check, ctl, run_tests, stop  # noqa: E402

LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
KIND_RE = re.compile(rf"^{LABEL}(\.{LABEL})*/[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?$")
NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def cdi(*args, socket=None):
    pre = ["--socket", socket] if socket else []
    return subprocess.run([GPUMEMCTL, *pre, "cdi", *args], capture_output=True, text=True, timeout=30)


def validate(spec, gids=None):
    """The checks a CDI consumer makes on what we emit, and no field it would not know: 0.5.0, or 0.7.0 with
    the socket's group in additionalGids."""
    check(set(spec) == {"cdiVersion", "kind", "devices"}, f"top-level fields: {sorted(spec)}")
    check(spec["cdiVersion"] == ("0.7.0" if gids else "0.5.0"), f"cdiVersion {spec['cdiVersion']}")
    check(KIND_RE.match(spec["kind"]) is not None, f"kind {spec['kind']!r} is vendor/class")
    check(len(spec["devices"]) == 1, "one device")
    dev = spec["devices"][0]
    check(set(dev) == {"name", "containerEdits"} and NAME_RE.match(dev["name"]) is not None,
          f"device name {dev.get('name')!r}")
    edits = dev["containerEdits"]
    want = {"env", "mounts"} | ({"additionalGids"} if gids else set())
    check(set(edits) == want, f"only {sorted(want)} are edited: {sorted(edits)}")
    if gids:
        check(edits["additionalGids"] == gids, f"additionalGids {edits['additionalGids']}")
    check(all("=" in e for e in edits["env"]), "env entries are NAME=value")
    for m in edits["mounts"]:
        check(set(m) == {"hostPath", "containerPath", "type", "options"}, f"mount fields {sorted(m)}")
        check(m["hostPath"].startswith("/") and m["containerPath"].startswith("/"), "absolute mount paths")
        check(m["type"] == "bind" and "bind" in m["options"], "a bind mount")
    return dev


def test_default(tmp):
    r = cdi(socket=os.path.join(tmp, "no-daemon-here.sock"))
    check(r.returncode == 0 and r.stderr == "", f"cdi needs no running daemon: {r.stderr}")
    r = cdi()
    check(r.returncode == 0, f"gpumemctl cdi: {r.stderr}")
    spec = json.loads(r.stdout)
    dev = validate(spec)
    check(spec["kind"] == "gpumem.io/socket" and dev["name"] == "default", "default kind and name")
    edits = dev["containerEdits"]
    check(edits["env"] == ["GPUMEM_SOCKET=/run/gpumemd/gpumemd.sock"], f"env: {edits['env']}")
    check(edits["mounts"][0]["hostPath"] == "/run/gpumemd/gpumemd.sock"
          and edits["mounts"][0]["containerPath"] == "/run/gpumemd/gpumemd.sock", "the socket is bind-mounted")
    check("kfd" not in r.stdout and "/dev/" not in r.stdout and "deviceNodes" not in r.stdout,
          "nothing of /dev/kfd or any device node")


def test_socket_group(tmp):
    """A socket whose group is not root's: the container's process gets that group, so it may connect."""
    path = os.path.join(tmp, "grp.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    os.chown(path, -1, 4321)
    r = cdi("--socket-path", path)
    check(r.returncode == 0, f"gpumemctl cdi: {r.stderr}")
    validate(json.loads(r.stdout), gids=[4321])
    r = cdi("--socket-path", path, "--no-additional-gids")
    check(r.returncode == 0 and "additionalGids" not in r.stdout, "--no-additional-gids: a 0.5.0 spec")
    validate(json.loads(r.stdout))
    s.close()


def test_options(tmp):
    r = cdi("--kind", "example.com/gpu-mem", "--name=node0", "--socket-path", "/var/run/x/gm.sock",
            "--container-path=/gpumem.sock")
    check(r.returncode == 0, f"options accepted: {r.stderr}")
    dev = validate(json.loads(r.stdout))
    m = dev["containerEdits"]["mounts"][0]
    check(json.loads(r.stdout)["kind"] == "example.com/gpu-mem" and dev["name"] == "node0", "kind and name set")
    check(m["hostPath"] == "/var/run/x/gm.sock" and m["containerPath"] == "/gpumem.sock", "paths set")
    check(dev["containerEdits"]["env"] == ["GPUMEM_SOCKET=/gpumem.sock"], "GPUMEM_SOCKET is the path inside")
    r = cdi(socket="/srv/gm/alt.sock")
    m = validate(json.loads(r.stdout))["containerEdits"]["mounts"][0]
    check(m["hostPath"] == "/srv/gm/alt.sock" and m["containerPath"] == "/srv/gm/alt.sock",
          "--socket is the default host path")
    weird = '/tmp/we"ird\\dir/s p.sock'
    r = cdi("--socket-path", weird)
    try:
        m = validate(json.loads(r.stdout))["containerEdits"]["mounts"][0]
        check(m["hostPath"] == weird, "quotes and backslashes survive JSON escaping")
    except ValueError as e:
        check(False, f"escaped output is valid JSON ({e})")


def test_refusals(tmp):
    for args, what in [
        (["--kind", "nokind"], "a kind without a class"),
        (["--kind", "a.com/b/c"], "a kind with two slashes"),
        (["--kind", "-a.com/c"], "a vendor starting with '-'"),
        (["--kind", "a..com/c"], "an empty DNS label"),
        (["--kind", "a.com/"], "an empty class"),
        (["--kind", "a.com/c.d"], "a dot in the class (needs CDI 0.6.0)"),
        (["--name", "-x"], "a device name starting with '-'"),
        (["--name", ""], "an empty device name"),
        (["--socket-path", "relative.sock"], "a relative socket path"),
        (["--container-path", "/" + "x" * 120], "a socket path too long for sun_path"),
        (["--frobnicate"], "an unknown argument"),
        (["--kind"], "an option without its value"),
    ]:
        r = cdi(*args)
        check(r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, f"refused: {what}")


def test_spec_in_mount_namespace(tmp):
    """Do what a runtime does with the spec: bind-mount hostPath at containerPath, set env, run a client."""
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "--mount", "true"], capture_output=True) if unshare else None
    if not probe or probe.returncode != 0:
        print("  skipped: no mount namespaces here", file=sys.stderr)
        return
    host_sock = os.path.join(tmp, "host", "gpumemd.sock")
    inside = os.path.join(tmp, "container", "run", "gpumemd.sock")
    os.makedirs(os.path.dirname(host_sock))
    os.makedirs(os.path.dirname(inside))
    spec = json.loads(cdi("--socket-path", host_sock, "--container-path", inside).stdout)
    edits = spec["devices"][0]["containerEdits"]
    notify = Notify(os.path.join(tmp, "notify"))
    daemon = subprocess.Popen([GPUMEMD, "--socket", host_sock, "--config", "/dev/null", "--backend", "model", "--model-preset", "gfx908"],
                              env=dict(os.environ, NOTIFY_SOCKET=notify.path), stderr=subprocess.PIPE, text=True)
    try:
        check(notify.wait("READY=1"), "daemon ready")
        m = edits["mounts"][0]
        script = f'touch "$2" && mount --bind -o {",".join(o for o in m["options"] if o != "bind")} "$1" "$2" ' \
                 f'&& exec env -u GPUMEM_SOCKET {" ".join(edits["env"])} "$3" --json status'
        r = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                            m["hostPath"], m["containerPath"], GPUMEMCTL], capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, f"a client set up by the spec reaches the daemon: {r.stderr}")
        if r.returncode == 0:
            check(json.loads(r.stdout)["pid"] == daemon.pid, "through the bind-mounted socket")
    finally:
        stop(daemon)
        notify.close()


def test_rocm_spec(tmp):
    kfd = os.environ.get("GPUMEM_KFD_LIB", "")
    if not kfd:
        print("  skipped: libgpumem-kfd.so is not built here", file=sys.stderr)
        return
    r = cdi("--rocm", "--kfd-library", kfd)
    check(r.returncode == 0, f"cdi --rocm: {r.stderr}")
    dev = validate(json.loads(r.stdout))
    edits = dev["containerEdits"]
    check("LD_PRELOAD=/opt/gpumemd/lib/libgpumem-kfd.so" in edits["env"], f"LD_PRELOAD names the library: {edits}")
    libs = {m["containerPath"]: m for m in edits["mounts"][1:]}
    check(set(libs) == {"/opt/gpumemd/lib/libgpumem-kfd.so", "/opt/gpumemd/lib/libprotobuf-c.so.1"},
          f"the library and the one it needs, beside it: {sorted(libs)}")
    check(all("ro" in m["options"] for m in libs.values()), "mounted read-only")
    check("/dev/" not in r.stdout and "deviceNodes" not in r.stdout, "still no device node")
    r = cdi("--rocm", "--kfd-library", os.path.join(tmp, "none.so"))
    check(r.returncode != 0 and "none.so" in r.stderr and r.stdout == "", "a missing library is refused")


def ctl_json(sock, *args):
    r = ctl(sock, "--json", *args)
    return json.loads(r.stdout) if r.returncode == 0 else None


def test_rocm_in_mount_namespace(tmp):
    """The --rocm spec as a runtime applies it, with no /dev/kfd or /dev/dri: rocminfo, and the project's own
    libhsakmt and HIP programs with queues and copies, through the daemon."""
    kfd = os.environ.get("GPUMEM_KFD_LIB", "")
    unshare, rocminfo = shutil.which("unshare"), shutil.which("rocminfo")
    probe = subprocess.run([unshare, "--mount", "true"], capture_output=True) if unshare else None
    if not kfd or not rocminfo or not probe or probe.returncode != 0:
        print("  skipped: needs libgpumem-kfd.so, rocminfo and mount namespaces", file=sys.stderr)
        return
    host_sock = os.path.join(tmp, "host", "gpumemd.sock")
    os.makedirs(os.path.dirname(host_sock))
    spec = json.loads(cdi("--rocm", "--kfd-library", kfd, "--socket-path", host_sock,
                          "--container-path", "/run/gpumemd-cdi/gpumemd.sock").stdout)
    edits = spec["devices"][0]["containerEdits"]
    notify = Notify(os.path.join(tmp, "notify"))
    # one class for everyone, with room for the HIP programs but not for a 256 MiB hipMalloc
    conf = os.path.join(tmp, "gpumemd.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nlog-level = notice\n[class all]\nmatch-all = yes\nvram = 200M\n")
    daemon = subprocess.Popen([GPUMEMD, "--socket", host_sock, "--config", conf, "--backend", "model", "--model-preset", "gfx908"],
                              env=dict(os.environ, NOTIFY_SOCKET=notify.path), stderr=subprocess.PIPE, text=True)
    try:
        check(notify.wait("READY=1"), "daemon ready")
        # tmpfs over /opt and /run in the namespace hold the container paths; /dev/kfd and /dev/dri are hidden
        lines = ["set -e", "mount -t tmpfs tmpfs /opt", "mount -t tmpfs tmpfs /run"]
        for d in ("/dev/kfd", "/dev/dri"):
            lines.append(f"if [ -e {d} ]; then mount -t tmpfs tmpfs {d} 2>/dev/null || mount --bind /dev/null {d}; fi")
        for m in edits["mounts"]:
            opts = ",".join(o for o in m["options"] if o != "bind")
            lines += [f'mkdir -p "$(dirname {m["containerPath"]})"', f'touch {m["containerPath"]}',
                      f'mount --bind {m["hostPath"]} {m["containerPath"]}',
                      f'mount -o remount,bind,{opts} {m["containerPath"]}']
        def ns_argv(*argv):
            script = lines + [f'exec env -u GPUMEM_SOCKET -u LD_PRELOAD {" ".join(edits["env"])} {" ".join(argv)}']
            return [unshare, "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]

        def in_namespace(*argv, stdin=""):
            return subprocess.run(ns_argv(*argv), input=stdin, capture_output=True, text=True, timeout=150)

        r = in_namespace(rocminfo)
        check(r.returncode == 0, f"rocminfo in the namespace runs through gpumemd: {r.returncode} {r.stderr[-800:]}")
        check(any(ln.split() == ["Name:", "gfx908"] for ln in r.stdout.splitlines()), "and sees the daemon's GPU")
        # HIP's device is what the class allows, less the 2 MiB kept for HIP's own buffer (docs/policy.md)
        vram = str((200 << 20) - (2 << 20))
        for env_name, argv, what in (
                ("HSAKMT_QUEUES", ["broker"], "libhsakmt's PM4 and SDMA queues"),
                ("HIP_COPY", ["broker"], "HIP's copies, streams and registered memory"),
                ("HIP_MANAGED", [], "HIP's managed memory, advice, prefetch, range and pointer attributes"),
                ("HIP_BROKER", ["gfx908", vram, "120"], "HIP's device and pinned memory and memory info"),
                ("HIP_BROKER", ["gfx908", vram, "120", "over", str(256 << 20)], "an over-quota hipMalloc")):
            prog = os.environ.get(env_name, "")
            if not prog:
                print(f"  ({what}: not built)", file=sys.stderr)
                continue
            r = in_namespace(prog, *argv, stdin="go\n")
            out = r.stdout.splitlines()
            check(r.returncode == 0 and ("ok" in out or "over quota refused" in out),
                  f"{what} in the namespace through gpumemd: {r.returncode} {r.stdout[-400:]!r} {r.stderr[-800:]!r}")
        prog = os.environ.get("HIP_BROKER", "")
        if prog:
            # killed with SIGKILL while it holds memory: listed while it runs, nothing of it after
            p = subprocess.Popen(ns_argv(prog, "gfx908", vram, "120"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            line = ""
            while not line.startswith("holding"):
                line = p.stdout.readline()
                if not line:
                    break
            listed = ctl_json(host_sock, "clients")
            mine = [c for c in listed["clients"] if c["pid"] == p.pid] if listed else []
            check(line.startswith("holding") and len(mine) == 1 and mine[0]["name"] == "hip-broker",
                  f"the HIP process in the namespace is a client of gpumemd: {mine}")
            allocs = ctl_json(host_sock, "allocations")
            held = [a["size"] for a in allocs["allocations"] if mine and a["client_id"] == mine[0]["id"]] if allocs else []
            check(64 << 20 in held and 8 << 20 in held, f"gpumemctl allocations lists its memory: {held}")
            p.kill()
            p.communicate(timeout=30)
            deadline = time.monotonic() + 10
            gone = False
            while time.monotonic() < deadline and not gone:
                listed = ctl_json(host_sock, "clients")
                allocs = ctl_json(host_sock, "allocations")
                gone = (listed is not None and allocs is not None and
                        not [c for c in listed["clients"] if c["pid"] == p.pid] and
                        not [a for a in allocs["allocations"] if mine and a["client_id"] == mine[0]["id"]])
                time.sleep(0.05)
            check(gone, "killed with SIGKILL, it leaves nothing in the daemon")
    finally:
        stop(daemon)
        notify.close()


run_tests([
    ("default spec", test_default),
    ("kind, name and paths", test_options),
    ("the socket's group as additionalGids", test_socket_group),
    ("invalid names and paths are refused", test_refusals),
    ("the spec applied in a mount namespace", test_spec_in_mount_namespace),
    ("--rocm: the client-side KFD and LD_PRELOAD", test_rocm_spec),
    ("--rocm applied in a mount namespace without /dev/kfd: rocminfo, queues, HIP copies",
     test_rocm_in_mount_namespace),
])
