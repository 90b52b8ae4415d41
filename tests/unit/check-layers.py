#!/usr/bin/env python3
"""The project's folders are its layers: a file includes headers of its own folder and of the folders below
it, never above, and no circle of files forms anywhere in daemon/, libclient/, preload/ or proto/.

A module is a .c file with the .h of the same path; it depends on the modules whose headers it includes.
An include is resolved as the compiler does for this tree: beside the including file first, then from the
roots the builds put on the include path (daemon/ and each lower folder)."""
import glob
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# Each folder ("room") and the rooms it may include besides its own; what a room may include, the rooms
# above it may too. The order is the data path's, from the bottom: docs/architecture.md draws it.
BELOW = {
    "util": [],
    "proto": ["util"],
    "thunk": ["util"],
    "thunk/drm": [],
    "libclient": ["proto"],
    "preload": ["thunk", "thunk/drm", "libclient"],
    "daemon/base": ["proto"],
    "daemon/drivers": ["daemon/base", "thunk", "thunk/drm"],
    "daemon/broker": ["daemon/drivers"],
    "daemon/config": ["daemon/drivers"],
    "daemon/server": ["daemon/broker", "daemon/config"],
    "daemon/ops": ["daemon/server"],
    "daemon": ["daemon/ops"],
}
# The folders the builds put on the include path, searched in this order for a name not found beside
# the including file.
SEARCH = ["daemon", "util", "proto", "thunk", "libclient", "preload"]
CIRCLE_FREE = ("daemon", "libclient", "preload", "proto")


def allowed(room):
    out, todo = set(), [room]
    while todo:
        r = todo.pop()
        if r not in out:
            out.add(r)
            todo.extend(BELOW.get(r, []))
    return out


def room_of(rel):
    folder = os.path.dirname(rel)
    while folder and folder not in BELOW:
        folder = os.path.dirname(folder)
    return folder or None


def resolve(path, inc):
    """The project file an include names (relative to root), or None (system or generated header)."""
    here = os.path.join(os.path.dirname(path), inc)
    if os.path.exists(here):
        return os.path.relpath(os.path.normpath(here), root)
    for base in SEARCH:
        cand = os.path.join(root, base, inc)
        if os.path.exists(cand):
            return os.path.relpath(os.path.normpath(cand), root)
    return None


sources = []
for room in BELOW:
    sources += glob.glob(os.path.join(root, room, "*.[ch]"))
sources = sorted(set(sources))

failed = False
deps = {}
for path in sources:
    rel = os.path.relpath(path, root)
    room = room_of(rel)
    may = allowed(room)
    module = rel.rsplit(".", 1)[0]
    with open(path, encoding="utf-8") as f:
        incs = INCLUDE.findall(f.read())
    for inc in incs:
        target = resolve(path, inc)
        if target is None:
            continue
        troom = room_of(target)
        if troom is None:
            continue
        if troom not in may:
            failed = True
            print(f"{rel} includes {inc} of {troom}/, which is not below {room}/")
        tmod = target.rsplit(".", 1)[0]
        if tmod != module:
            deps.setdefault(module, set()).add(tmod)
    deps.setdefault(module, set())


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


checked = {m: d for m, d in deps.items() if m.startswith(CIRCLE_FREE)}
for comp in cycles(checked):
    failed = True
    edges = ", ".join(f"{a} -> {b}" for a in comp for b in sorted(checked[a] & set(comp)))
    print(f"a circle of files: {' '.join(comp)} ({edges})")

if failed:
    sys.exit(1)
print(f"{len(sources)} files in {len(BELOW)} folders: each includes only its own folder and those below, "
      f"no circle among {len(checked)} modules of {', '.join(CIRCLE_FREE)}")
