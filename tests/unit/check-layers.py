#!/usr/bin/env python3
"""The project's include graph goes one way: no circle of files in daemon/, and the lower folders include
nothing above them (util/ nothing of the project; thunk/ and proto/ nothing of each other or the daemon).
A module is a .c file with its .h; it depends on the modules whose headers it includes."""
import glob
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules(folder):
    deps = {}
    for path in glob.glob(os.path.join(root, folder, "*.[ch]")):
        name = os.path.basename(path).rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            incs = INCLUDE.findall(f.read())
        local = set()
        for inc in incs:
            base = os.path.basename(inc).rsplit(".", 1)[0]
            if base != name and os.path.exists(os.path.join(root, folder, base + ".h")):
                local.add(base)
        deps.setdefault(name, set()).update(local)
    return deps


def cycles(deps):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def headers_of(folder):
    return {os.path.basename(p) for p in glob.glob(os.path.join(root, folder, "*.h"))}


failed = False
for comp in cycles(modules("daemon")):
    failed = True
    deps = modules("daemon")
    edges = ", ".join(f"{a} -> {b}" for a in comp for b in sorted(deps[a] & set(comp)))
    print(f"daemon/: a circle of files: {' '.join(comp)} ({edges})")

# Lower folders: which project headers each may include, beside its own.
allowed = {"util": set(), "proto": {"util"}, "thunk": {"util"}}
owners = {folder: headers_of(folder) for folder in ("util", "proto", "thunk", "daemon", "libclient")}
for folder, may in allowed.items():
    for path in sorted(glob.glob(os.path.join(root, folder, "**", "*.[ch]"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            for inc in INCLUDE.findall(f.read()):
                base = os.path.basename(inc)
                if base in owners[folder] or os.path.exists(os.path.join(os.path.dirname(path), inc)):
                    continue
                for other, hdrs in owners.items():
                    if other != folder and other not in may and base in hdrs:
                        failed = True
                        print(f"{os.path.relpath(path, root)} includes {inc} of {other}/, above it")

if failed:
    sys.exit(1)
print(f"daemon/: {len(modules('daemon'))} modules, no circle; util/, proto/, thunk/ include nothing above them")
