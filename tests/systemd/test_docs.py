#!/usr/bin/env python3
"""The operator's documents hold what they claim: the YAML in docs/containers.md parses into the Kubernetes
objects it describes, its CDI spec is exactly what gpumemctl cdi prints, and the security score in
docs/operations.md is the one systemd-analyze gives the installed unit (checked by the units test)."""
import json
import os
import re
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMCTL, check, run_tests  # noqa: E402

DOCS = os.path.join(os.environ["SOURCE_ROOT"], "docs")


def blocks(name, lang):
    with open(os.path.join(DOCS, name)) as f:
        return re.findall(rf"```{lang}\n(.*?)```", f.read(), re.S)


def test_yaml(tmp):
    try:
        import yaml
    except ImportError:
        check(False, "python3-yaml is installed (scripts/deps.sh)")
        return
    docs = [d for b in blocks("containers.md", "yaml") for d in yaml.safe_load_all(b)]
    kinds = [d["kind"] for d in docs]
    check(kinds == ["ConfigMap", "DaemonSet", "Pod", "Pod"], f"the Kubernetes objects: {kinds}")
    ds = docs[1]["spec"]
    tpl = ds["template"]
    check(ds["selector"]["matchLabels"] == tpl["metadata"]["labels"], "the DaemonSet selects its own pods")
    check(tpl["spec"]["hostPID"] is True, "gpumemd runs in the host's pid namespace")
    vols = {v["name"]: v for v in tpl["spec"]["volumes"]}
    for m in tpl["spec"]["containers"][0]["volumeMounts"]:
        check(m["name"] in vols, f"volume {m['name']} is defined")
    check(vols["run"]["hostPath"]["path"] == "/run/gpumemd", "the socket directory is the host's")
    conf = docs[0]["data"]["gpumemd.conf"]
    path = os.path.join(tmp, "gpumemd.conf")
    with open(path, "w") as f:
        f.write(conf)
    r = subprocess.run([os.environ["GPUMEMD"], "--check-config", "--config", path], capture_output=True, text=True)
    check(r.returncode == 0, f"the ConfigMap's gpumemd.conf is valid: {r.stderr}")
    pod = docs[2]["spec"]
    vol = pod["volumes"][0]["hostPath"]
    check(vol == {"path": "/run/gpumemd/gpumemd.sock", "type": "Socket"}, "pods mount the socket itself")
    check(pod["securityContext"]["supplementalGroups"] == [tpl["spec"]["containers"][0]["securityContext"]
                                                           ["runAsGroup"]], "pods carry the socket's group")
    check("privileged" not in json.dumps(pod) and "/dev/" not in json.dumps(pod), "pods get no device")
    # the ROCm pod: the socket, the client-side KFD and its one library, read-only, and LD_PRELOAD
    rocm = docs[3]["spec"]
    c = rocm["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    check(env.get("LD_PRELOAD") == "/opt/gpumemd/lib/libgpumem-kfd.so", f"LD_PRELOAD names the library: {env}")
    rvols = {v["name"]: v["hostPath"] for v in rocm["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    check(set(mounts) == set(rvols), "every mount has its volume")
    check(rvols["kfd-lib"]["path"].endswith("/gpumemd/libgpumem-kfd.so") and rvols["kfd-lib"]["type"] == "File",
          "the library from where it is installed")
    check(all(mounts[n].get("readOnly") for n in ("kfd-lib", "protobuf-c")), "the libraries are read-only")
    check({m["mountPath"] for n, m in mounts.items() if n != "gpumemd"} ==
          {"/opt/gpumemd/lib/libgpumem-kfd.so", "/opt/gpumemd/lib/libprotobuf-c.so.1"},
          "where gpumemctl cdi --rocm puts them (the library finds libprotobuf-c beside itself)")
    check("privileged" not in json.dumps(rocm) and "/dev/" not in json.dumps(rocm), "no device for it either")


def test_cdi_example(tmp):
    shown = blocks("containers.md", "json")
    check(len(shown) == 1, "one CDI example")
    # the example's socket belongs to group 998: one made so here, whose path is then put back
    sock = os.path.join(tmp, "gpumemd.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(sock)
    os.chown(sock, -1, 998)
    r = subprocess.run([GPUMEMCTL, "cdi", "--socket-path", sock, "--container-path", "/run/gpumemd/gpumemd.sock"],
                       capture_output=True, text=True)
    s.close()
    got = json.loads(r.stdout)
    for m in got["devices"][0]["containerEdits"]["mounts"]:
        if m["hostPath"] == sock:
            m["hostPath"] = "/run/gpumemd/gpumemd.sock"
    check(shown and json.loads(shown[0]) == got, "the documented spec is what gpumemctl cdi prints")


def test_first_day_model(tmp):
    """The laptop's first day in docs/operations.md, run as it stands but for its first two lines (the packages
    and the build, which the suite has done): in a directory whose build/ and python/ are this build's."""
    if os.environ.get("B_SANITIZE", "none") != "none":
        # the block runs Debian's rocminfo and python3, which cannot load a sanitizer build's libraries
        print("  not run: a sanitizer build", file=sys.stderr)
        return
    (block,) = blocks("operations.md", "sh first-day-model")
    with open(os.path.join(os.environ["SOURCE_ROOT"], "README.md")) as f:
        readme = re.findall(r"```sh first-day-model\n(.*?)```", f.read(), re.S)
    check(readme == [block], "README.md's first-day block is the one docs/operations.md has")
    lines = [line for line in block.splitlines() if not line.startswith(("sh scripts/deps.sh", "meson setup"))]
    check(len(lines) == len(block.splitlines()) - 2, "the block starts with the packages and the build")
    sock = os.path.join(tmp, "gpumemd.sock")
    script = "\n".join(lines).replace("/tmp/gpumemd.sock", sock)
    # "& sleep 1" gives a person's daemon time to start; here wait until it answers
    wait = (f"& for i in $(seq 200); do build/libclient/gpumemctl -s {sock} ping >/dev/null 2>&1 && break; "
            "sleep 0.1; done")
    check("& sleep 1" in script, "the daemon is started in the background")
    script = script.replace("& sleep 1", wait)
    os.symlink(os.environ["BUILD_ROOT"], os.path.join(tmp, "build"))
    os.symlink(os.path.join(os.environ["SOURCE_ROOT"], "python"), os.path.join(tmp, "python"))
    # a step that fails ends the script (-e), and the daemon with it; output to a file, which a daemon left
    # behind could not hold open as it would a pipe
    script = "trap 'st=$?; kill $(jobs -p) 2>/dev/null || :; exit $st' EXIT\n" + script + "\nwait\n"
    log = os.path.join(tmp, "out")
    with open(log, "w") as f:
        try:
            rc = subprocess.run(["bash", "-e", "-c", script], cwd=tmp, stdout=f, stderr=subprocess.STDOUT,
                                timeout=150, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1")).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(log) as f:
        out = f.read()
    check(rc == 0, f"the block runs to its end (exit {rc}): {out[-1500:]}")
    check("model (SIMULATED GPUs, no hardware)" in out, "status says the GPUs are simulated")
    check("parent: reply verified" in out, "share-buffer's two processes share the buffer")
    check(re.search(r"Name:\s+gfx908", out) is not None, "rocminfo, unmodified, reports the preset's GPU")
    check("freed everything" in out, "the Python example runs to its end")
    check('"name":"gpumemctl"' in out and "gpumemd stopped" in out, "clients --json, then gpumemd stops")


run_tests([("Kubernetes YAML", test_yaml), ("CDI example", test_cdi_example),
           ("the first day on a laptop (docs/operations.md)", test_first_day_model)])
