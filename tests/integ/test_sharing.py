#!/usr/bin/env python3
"""Named shares as operators and workload authors meet them: the policy block of docs/sharing.md as it stands,
the weights-share example publishing as root and reading as another uid, gpumemctl shared (table, --json
against the schema, revoke) and the per-share metrics. Needs root (the reader is another uid)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, check, ctl, run_tests  # noqa: E402

SOURCE_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(os.environ["GPUMEM_EXAMPLES"], "weights-share")
NOBODY = 65534


def policy_block():
    with open(os.path.join(SOURCE_ROOT, "docs", "sharing.md")) as f:
        blocks = re.findall(r"```ini sharing-example\n(.*?)```", f.read(), re.S)
    check(len(blocks) == 1, f"docs/sharing.md has one ini sharing-example block ({len(blocks)})")
    return blocks[0] if blocks else ""


def as_uid(uid):
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return drop


def shares(sock):
    r = ctl(sock, "--json", "shared")
    check(r.returncode == 0, f"gpumemctl --json shared exits 0 ({r.stderr.strip()})")
    return {s["name"]: s for s in json.loads(r.stdout)["shares"]} if r.returncode == 0 else {}


def valid(doc_text, kind):
    try:
        import jsonschema
    except ImportError:
        check(False, "python3-jsonschema is installed (scripts/deps.sh)")
        return
    with open(os.path.join(SOURCE_ROOT, "docs", "gpumemctl.schema.json")) as f:
        schema = json.load(f)
    try:
        doc = json.loads(doc_text)
        jsonschema.validate(doc, {"$ref": "#/$defs/" + kind, "$defs": schema["$defs"]})
        jsonschema.validate(doc, schema)
    except (ValueError, jsonschema.ValidationError) as e:
        check(False, f"{kind}: {str(e)[:300]}")


def test_weights(tmp):
    conf = os.path.join(tmp, "gpumemd.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nlog-level = warning\n" + policy_block())
    os.chmod(tmp, 0o755)
    sock = os.path.join(tmp, "gpumemd.sock")
    daemon = subprocess.Popen([GPUMEMD, "--socket", sock, "--config", conf, "--backend", "model",
                               "--model-preset", "mi300x"], stderr=subprocess.PIPE, text=True)
    for _ in range(400):
        if ctl(sock, "ping").returncode == 0:
            break
        time.sleep(0.025)
    os.chmod(sock, 0o666)
    env = dict(os.environ, GPUMEM_SOCKET=sock)
    pub = subprocess.Popen([EXAMPLE, "publish", "weights/demo", "8M"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    line = pub.stdout.readline()
    check("published" in line and "read-only" in line and "persistent" in line,
          f"the publisher says it published ({line.strip()!r})")

    # read by name, as root and as nobody: pattern verified, every write refused
    for who, pre in (("root", None), ("uid 65534", as_uid(NOBODY))):
        r = subprocess.run([EXAMPLE, "read", "weights/demo"], env=env, capture_output=True, text=True,
                           timeout=60, preexec_fn=pre)
        check(r.returncode == 0, f"weights-share read as {who} exits 0 ({r.stderr.strip()!r})")
        check("verified the pattern over all 8388608 bytes" in r.stdout and "a write is refused" in r.stdout,
              f"the reader as {who} says what held ({r.stdout!r})")
    r = subprocess.run([EXAMPLE, "read", "other/demo"], env=env, capture_output=True, text=True, timeout=60,
                       preexec_fn=as_uid(NOBODY))
    check(r.returncode == 1 and "Permission denied" in r.stderr, f"a name outside share-read is refused ({r.stderr!r})")
    r = subprocess.run([EXAMPLE, "publish", "weights/mine", "4M"], env=env, capture_output=True, text=True,
                       timeout=60, preexec_fn=as_uid(NOBODY))
    check(r.returncode == 1 and "share-publish" in r.stderr, f"uid 65534 may not publish ({r.stderr!r})")

    # gpumemctl's view: table, JSON, metrics
    s = shares(sock).get("weights/demo")
    check(s is not None and s["size"] == 8 << 20 and s["role"] == "read-only" and s["persistent"]
          and s["readers"] == 0 and s["opens"] == 2 and s["class"] == "loaders" and s["kind"] == "device"
          and s["owner_client_id"] > 0, f"gpumemctl --json shared lists it ({s})")
    valid(ctl(sock, "--json", "shared").stdout, "shared")
    r = ctl(sock, "shared")
    check(r.returncode == 0 and re.search(r"weights/demo\s+\d+\s+loaders\s+device\s+8\.0 MiB\s+read-only\s+0\s", r.stdout),
          f"gpumemctl shared prints it ({r.stdout!r})")
    r = ctl(sock, "shared", "-o", "NAME,PERSISTENT,OPENS", "-n")
    check(r.stdout.split() == ["weights/demo", "yes", "2"], f"chosen columns ({r.stdout!r})")
    m = ctl(sock, "metrics").stdout
    lab = 'share="weights/demo",class="loaders",role="read-only",persistent="yes"'
    check(f"gpumemd_share_bytes{{{lab}}} 8388608" in m and f"gpumemd_share_readers{{{lab}}} 0" in m
          and f"gpumemd_share_opens_total{{{lab}}} 2" in m, "per-share metrics")
    promtool = shutil.which("promtool")
    if promtool:
        p = subprocess.run([promtool, "check", "metrics"], input=m, capture_output=True, text=True)
        check(p.returncode == 0, f"promtool check metrics ({p.stdout}{p.stderr})")

    # a reload moves the publisher to another class: the share, and what it costs, move with it
    with open(conf, "w") as f:
        f.write("[daemon]\nlog-level = warning\n" + policy_block().replace("[class loaders]", "[class loaders2]"))
    daemon.send_signal(signal.SIGHUP)
    s = None
    for _ in range(200):
        s = shares(sock).get("weights/demo")
        if s and s["class"] == "loaders2":
            break
        time.sleep(0.02)
    check(s is not None and s["class"] == "loaders2", f"the share's class follows its publisher ({s})")

    # the publisher goes: a persistent share stays, with no owner, still charged to its class
    pub.send_signal(signal.SIGTERM)
    check(pub.wait(timeout=20) == 0, "the publisher exits 0 when told to stop")
    s = shares(sock).get("weights/demo")
    check(s is not None and s["owner_client_id"] == 0 and s["class"] == "loaders2",
          f"the share outlives its publisher ({s})")
    q = json.loads(ctl(sock, "--json", "quota", "show").stdout)
    vram = {x["class"]: x["used"] for x in q["quotas"] if x["resource"] == "vram" and x["gpu_id"] == 0}
    check(vram.get("loaders2") == 8 << 20 and vram.get("loaders", 0) == 0,
          f"the publisher's class now still pays for it, the one it left nothing ({vram})")
    r = subprocess.run([EXAMPLE, "read", "weights/demo"], env=env, capture_output=True, text=True, timeout=60,
                       preexec_fn=as_uid(NOBODY))
    check(r.returncode == 0, f"read after its publisher went ({r.stderr!r})")

    r = ctl(sock, "--json", "shared", "revoke", "weights/demo")
    check(r.returncode == 0, f"gpumemctl shared revoke ({r.stderr.strip()})")
    valid(r.stdout, "shared_revoke")
    check(shares(sock) == {}, "no share after the revocation")
    r = ctl(sock, "shared", "revoke", "weights/demo")
    check(r.returncode != 0 and "no share named" in r.stderr, f"revoking it again says why ({r.stderr!r})")
    r = subprocess.run([EXAMPLE, "read", "weights/demo"], env=env, capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "no share named 'weights/demo'" in r.stderr, f"a reader after it ({r.stderr!r})")
    st = None
    for _ in range(200):
        st = json.loads(ctl(sock, "--json", "status").stdout)
        if st["allocations"] == 0 and st["bytes"]["device"] == 0:
            break
        time.sleep(0.02)
    check(st["allocations"] == 0 and st["bytes"] == {"device": 0, "host": 0, "managed": 0},
          f"nothing is left in gpumemd ({st})")
    daemon.send_signal(signal.SIGTERM)
    _, err = daemon.communicate(timeout=20)
    check(daemon.returncode == 0, f"gpumemd exits 0 ({err.strip()!r})")


def main():
    if os.geteuid() != 0:
        print("not root: the reader of another uid cannot be made")
        sys.exit(77)
    run_tests([("weights published once by root, read by name by other uids", test_weights)])


main()
