#!/usr/bin/env python3
"""The installed units and system files: systemd-analyze verify and security, the socket's settings, sysusers.d,
tmpfiles.d, the journal catalog and the default configuration, all checked in a DESTDIR with systemd's own tools."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import check, in_dest, install, install_or_exit, run_tests  # noqa: E402

E = os.environ
DEST = tempfile.mkdtemp(prefix="gpumemd-units-")
UNITS = [in_dest(DEST, os.path.join(E["UNITDIR"], u)) for u in ("gpumemd.service", "gpumemd.socket")]
IS_ROOT = os.geteuid() == 0


def unit_sections(path):
    """The unit file as {section: {key: [values]}} (a key may repeat)."""
    out, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = out.setdefault(line.strip("[]"), {})
                continue
            k, _, v = line.partition("=")
            section.setdefault(k, []).append(v)
    return out


def prepare_root():
    """Give the DESTDIR what systemd-analyze --root needs besides our units: systemd's own units and /bin/kill."""
    for d in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        if os.path.isdir(d) and os.listdir(d):
            shutil.copytree(d, in_dest(DEST, "/usr/lib/systemd/system"), symlinks=True, dirs_exist_ok=True)
            break
    kill = shutil.which("kill") or "/bin/kill"
    os.makedirs(in_dest(DEST, "/usr/bin"), exist_ok=True)
    shutil.copy2(kill, in_dest(DEST, "/usr/bin/kill"))
    if not os.path.lexists(in_dest(DEST, "/bin")):
        os.symlink("usr/bin", in_dest(DEST, "/bin"))


def test_installed_units(tmp):
    for u in UNITS:
        check(os.path.isfile(u), f"{u} installed")
    svc = unit_sections(UNITS[0])
    exec_start = svc["Service"]["ExecStart"][0].split()
    check(exec_start[0] == os.path.join(E["SBINDIR"], "gpumemd"), f"ExecStart runs the installed daemon: {exec_start}")
    check(exec_start[1:] == ["--config", os.path.join(E["SYSCONFDIR"], "gpumemd", "gpumemd.conf")],
          f"ExecStart names the installed config file: {exec_start}")
    check(os.access(in_dest(DEST, exec_start[0]), os.X_OK), "the ExecStart binary is installed and executable")
    sock = unit_sections(UNITS[1])["Socket"]
    check(sock.get("ListenSequentialPacket") == ["/run/gpumemd/gpumemd.sock"], "socket: SOCK_SEQPACKET on the default path")
    check(sock.get("SocketGroup") == ["gpumem"] and sock.get("SocketMode") == ["0660"], "socket: group gpumem, 0660")
    s = svc["Service"]
    check(s.get("Type") == ["notify"] and "WatchdogSec" in s and s.get("Restart") == ["on-failure"],
          "service: Type=notify, a watchdog, restart on failure")
    check(s.get("RestartPreventExitStatus") == ["69"], "service: no restart when the backend finds no GPU (69)")
    check(s.get("CapabilityBoundingSet") == [""] and s.get("NoNewPrivileges") == ["yes"], "service: no capabilities")
    check(s.get("ExecReload") == ["/bin/kill -HUP $MAINPID"], "service: reload is SIGHUP")
    check(s.get("DevicePolicy") == ["closed"] and set(s.get("DeviceAllow", [])) == {"/dev/kfd rw", "char-drm rw"},
          "service: devices limited to /dev/kfd and DRM")
    oom = s.get("OOMScoreAdjust", [""])[0]
    check(oom.lstrip("-").isdigit() and int(oom) <= -900,
          f"service: OOMScoreAdjust= has the OOM killer take a tenant before the broker: {oom!r}")


def test_verify(tmp):
    cmd = ["systemd-analyze", "verify", f"--root={DEST}"]
    env = dict(os.environ)
    if E.get("DOCS_BUILT") == "1" and shutil.which("man"):
        # Documentation=man:... must resolve: point man at the installed pages
        env["MANPATH"] = in_dest(DEST, E["MANDIR"])
        cmd.append("--man=yes")
    else:
        cmd.append("--man=no")
    units = ["/" + os.path.relpath(u, DEST) for u in UNITS]
    r = subprocess.run(cmd + units, capture_output=True, text=True, env=env, timeout=60)
    print(f"  {' '.join(cmd)}: exit {r.returncode}", file=sys.stderr)
    # verify exits 0 on unknown keys and unparsable values and only warns: any output is a finding
    check(r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "",
          f"systemd-analyze verify is clean: {r.stdout}{r.stderr}")

    # and it does catch a broken unit in this setup
    bad = UNITS[0] + ".bad.service"
    with open(UNITS[0]) as f, open(bad, "w") as g:
        g.write(f.read().replace("ProtectHome=yes", "ProtectHome=sometimes"))
    r = subprocess.run(["systemd-analyze", "verify", f"--root={DEST}", "--man=no", "/" + os.path.relpath(bad, DEST)],
                       capture_output=True, text=True, timeout=60)
    check("sometimes" in r.stderr, f"verify reports a bad value in this setup: {r.stderr}")
    os.unlink(bad)


def test_cuda_dropin(tmp):
    """The shipped drop-in for NVIDIA nodes, in place: the unit verifies clean with it, its ExecStart runs the cuda
    backend, its DeviceAllow= adds the NVIDIA nodes to the unit's own (verify reads it: a bad value is reported)."""
    src = os.path.join(d_data(), "gpumemd-cuda.conf")
    check(os.path.exists(src), f"{src} installed")
    if not os.path.exists(src):
        return
    dropdir = in_dest(DEST, "/etc/systemd/system/gpumemd.service.d")
    os.makedirs(dropdir, exist_ok=True)
    dropin = os.path.join(dropdir, "cuda.conf")
    shutil.copy(src, dropin)
    unit = "/" + os.path.relpath(UNITS[0], DEST)
    try:
        r = subprocess.run(["systemd-analyze", "verify", f"--root={DEST}", "--man=no", unit], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "",
              f"systemd-analyze verify is clean with the cuda drop-in: {r.stdout}{r.stderr}")
        d = unit_sections(dropin)["Service"]
        check(d["ExecStart"][0] == "" and d["ExecStart"][1].endswith("--backend cuda"),
              f"the drop-in replaces ExecStart= with the cuda backend: {d['ExecStart']}")
        check({"char-nvidia-frontend rw", "char-nvidia-uvm rw"} <= set(d.get("DeviceAllow", [])),
              f"the drop-in allows the NVIDIA nodes: {d.get('DeviceAllow')}")
        with open(dropin, "a") as f:
            f.write("DevicePolicy=sometimes\n")
        r = subprocess.run(["systemd-analyze", "verify", f"--root={DEST}", "--man=no", unit], capture_output=True,
                           text=True, timeout=60)
        check("sometimes" in r.stderr, f"verify reads the drop-in: {r.stderr}")
    finally:
        shutil.rmtree(dropdir, ignore_errors=True)


def d_data():
    return in_dest(DEST, os.path.join(E["DATADIR"], "gpumemd"))


def test_security(tmp):
    unit = "/" + os.path.relpath(UNITS[0], DEST)
    # --threshold is on the 0..100 scale: 49 means an exposure of at most 4.9, "OK" or better
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"--root={DEST}", "--threshold=49",
                        "--no-pager", unit], capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for gpumemd\.service: (\d+\.\d) (\w+)", r.stdout + r.stderr)
    check(m is not None, f"security prints the exposure: {r.stdout[-300:]}{r.stderr[-300:]}")
    if m:
        print(f"  exposure {m.group(1)} {m.group(2)}", file=sys.stderr)
        check(float(m.group(1)) <= 4.9 and m.group(2) in ("OK", "SAFE", "PERFECT"),
              f"exposure {m.group(1)} {m.group(2)} is OK or better")
        with open(os.path.join(E["SOURCE_ROOT"], "docs", "operations.md")) as f:
            check(f"**{m.group(1)} {m.group(2)}**" in f.read(), "docs/operations.md records this score")
    check(r.returncode == 0, f"security --threshold=49 passes (exit {r.returncode})")


def installed_conf(what, dirkey):
    """The gpumemd.conf installed in the directory E[dirkey] (sysusers.d, tmpfiles.d): its path, checked."""
    conf = in_dest(DEST, os.path.join(E[dirkey], "gpumemd.conf"))
    check(os.path.isfile(conf), f"{what} file installed as gpumemd.conf")
    return conf


def test_sysusers(tmp):
    if not IS_ROOT:
        print("  skipped: systemd-sysusers --root needs root", file=sys.stderr)
        return
    installed_conf("sysusers.d", "SYSUSERSDIR")
    os.makedirs(in_dest(DEST, "/etc"), exist_ok=True)
    r = subprocess.run(["systemd-sysusers", f"--root={DEST}"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"systemd-sysusers applies the file: {r.stderr}")
    with open(in_dest(DEST, "/etc/passwd")) as f:
        users = {line.split(":")[0]: line.strip().split(":") for line in f}
    with open(in_dest(DEST, "/etc/group")) as f:
        groups = {line.split(":")[0]: line.strip().split(":") for line in f}
    u = users.get("gpumemd")
    check(u is not None and int(u[2]) < 1000 and u[6].endswith("nologin"), f"system user gpumemd: {u}")
    check("gpumem" in groups, "group gpumem (the socket's group)")
    for g in ("render", "video"):
        check(g in groups and "gpumemd" in groups[g][3].split(","), f"gpumemd is a member of {g}")
    svc = unit_sections(UNITS[0])["Service"]
    check(svc["User"][0] in users and svc["Group"][0] in groups, "the unit's User= and Group= exist")
    check(all(g in groups for g in svc["SupplementaryGroups"][0].split()), "the unit's SupplementaryGroups= exist")
    check(unit_sections(UNITS[1])["Socket"]["SocketGroup"][0] in groups, "the socket's group exists")


def test_tmpfiles(tmp):
    if not IS_ROOT:
        print("  skipped: systemd-tmpfiles --root with owners needs root", file=sys.stderr)
        return
    conf = installed_conf("tmpfiles.d", "TMPFILESDIR")
    r = subprocess.run(["systemd-tmpfiles", f"--root={DEST}", "--create", conf],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"systemd-tmpfiles applies the file: {r.stderr}")
    st = os.stat(in_dest(DEST, "/run/gpumemd"))
    check(st.st_mode & 0o7777 == 0o755 and st.st_uid == 0, "/run/gpumemd created 0755 root")


def test_catalog(tmp):
    cat = in_dest(DEST, os.path.join(E["CATALOGDIR"], "gpumemd.catalog"))
    check(os.path.isfile(cat), "catalog installed")
    with open(E["LOG_H"]) as f:
        ids = dict(re.findall(r'#define (GM_MESSAGE_\w+)\s+"([0-9a-f]{32})"', f.read()))
    check(len(ids) >= 8, f"MESSAGE_IDs found in log.h: {len(ids)}")
    r = subprocess.run(["journalctl", f"--root={DEST}", "--update-catalog"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "gpumemd.catalog" not in r.stderr, f"journalctl --update-catalog: {r.stderr}")
    r = subprocess.run(["journalctl", f"--root={DEST}", "--list-catalog", "--no-pager"], capture_output=True,
                       text=True, timeout=60)
    listed = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    for name, mid in ids.items():
        check(mid in listed and "gpumemd" in listed[mid].lower(), f"{name} ({mid}) is in the catalog with a subject")
    r = subprocess.run(["journalctl", f"--root={DEST}", "--dump-catalog", "--no-pager"], capture_output=True,
                       text=True, timeout=60)
    check("@GPUMEM_CLIENT_ID@" in r.stdout, "catalog bodies reference the client fields")


def test_default_config(tmp):
    conf = in_dest(DEST, os.path.join(E["SYSCONFDIR"], "gpumemd", "gpumemd.conf"))
    check(os.path.isfile(conf), "default configuration installed")
    daemon = in_dest(DEST, os.path.join(E["SBINDIR"], "gpumemd"))
    r = subprocess.run([daemon, "--check-config", "--config", conf], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and "OK" in r.stdout, f"the installed daemon accepts the default file: {r.stderr}")
    # every commented-out setting, switched on, is valid too: the file documents real settings and defaults
    lines = []
    with open(conf) as f:
        for line in f:
            m = re.match(r"#([a-z-]+) = (.*)$", line)
            if m and m.group(1) != "admin-groups":  # needs an existing group
                lines.append(f"{m.group(1)} = {m.group(2)}\n")
            elif not line.startswith("#"):
                lines.append(line)
    on = os.path.join(tmp, "all-on.conf")
    with open(on, "w") as f:
        f.writelines(lines)
    keys = {line.split("=")[0].strip() for line in lines if "=" in line} | {"admin-groups"}
    check(keys >= {"backend", "socket", "socket-mode", "topology", "model-preset", "model-kfd-minor", "log-level",
                   "max-connections", "max-connections-per-uid", "window-size", "admin-groups"},
          f"the default file lists the [daemon] settings: {sorted(keys)}")
    r = subprocess.run([daemon, "--check-config", "--config", on], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, f"the documented defaults are valid settings: {r.stderr}")

    # a reinstall keeps an administrator's edits
    with open(conf, "a") as f:
        f.write("log-level = debug\n")
    r = install(DEST)
    check(r.returncode == 0, f"second meson install: {r.stderr[-500:]}")
    with open(conf) as f:
        check(f.read().endswith("log-level = debug\n"), "meson install does not overwrite an edited gpumemd.conf")


def main():
    install_or_exit(DEST)
    prepare_root()
    try:
        run_tests([
            ("installed units and their settings", test_installed_units),
            ("systemd-analyze verify", test_verify),
            ("the cuda drop-in", test_cuda_dropin),
            ("systemd-analyze security", test_security),
            ("sysusers.d", test_sysusers),
            ("tmpfiles.d", test_tmpfiles),
            ("journal catalog", test_catalog),
            ("default configuration", test_default_config),
        ])
    finally:
        shutil.rmtree(DEST, ignore_errors=True)


main()
