#!/usr/bin/env python3
"""The man pages scdoc generated: troff with the right title and section, every section a reader expects, and (when
man is installed) rendering without warnings."""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import check, run_tests  # noqa: E402

PAGES = os.environ["MAN_PAGES"].split(":")
# the library's families, one page each beside the gpumem-client(3) overview
FAMILIES = ["connection", "topology", "memory", "svm", "vmm", "sharing", "events", "queues", "admin"]


def test_troff(tmp):
    names = sorted(os.path.basename(p) for p in PAGES)
    check(names == sorted(["gpumem-client.3", "gpumemctl.1", "gpumemd.8", "gpumemd.conf.5"]
                          + [f"gpumem-{f}.3" for f in FAMILIES]), f"the pages: {names}")
    for p in PAGES:
        with open(p) as f:
            text = f.read()
        name, section = os.path.basename(p).rsplit(".", 1)
        check(len(text) > 1500, f"{p} has content")
        check(re.search(rf'^\.TH "{re.escape(name)}" "{section}"', text, re.M) is not None, f"{p}: .TH {name} {section}")
        for sh in ("NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"):
            check(re.search(rf"^\.SH {sh}$", text, re.M) is not None, f"{p}: section {sh}")


def test_render(tmp):
    if not shutil.which("man"):
        print("  skipped rendering: man is not installed", file=sys.stderr)
        return
    for p in PAGES:
        r = subprocess.run(["man", "--warnings", "-l", p], capture_output=True, text=True,
                           env=dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0"), timeout=60)
        check(r.returncode == 0 and r.stderr.strip() == "", f"{p} renders without warnings: {r.stderr[:300]}")
        text = re.sub(".\b", "", r.stdout)  # overstrike bold and underline
        # NAME: the page's own name, or for a family page the functions it documents, then " - " and a line
        name = os.path.basename(p).rsplit(".", 1)[0]
        head = text.split("SYNOPSIS")[0]
        named = f"{name} - " in head or (name.startswith("gpumem-") and re.search(r"\bgm_\w+.*? - ", head, re.S))
        check(bool(named) and "SEE ALSO" in text, f"{p}: rendered text")


run_tests([("generated troff", test_troff), ("man -l renders them", test_render)])
