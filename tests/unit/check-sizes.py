#!/usr/bin/env python3
"""No source file of the daemon or the client library over 1,500 lines, and no function of theirs over 150:
a file or a function that long holds several jobs, which the folders and files are there to separate.

A function is counted from the line that names it to its closing brace at the start of a line, as the
tree's style writes every function (the brace of a definition alone on its line)."""
import glob
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
FOLDERS = ("daemon", "libclient", "preload", "proto")
MAX_FILE, MAX_FUNCTION = 1500, 150
NAME = re.compile(r"(\w+)\s*\(")


def functions(lines):
    """(name, first line, length) of each function definition."""
    start = None
    for i, line in enumerate(lines):
        if line == "{" and i > 0:
            j = i - 1
            while j > 0 and not re.match(r"^[A-Za-z_].*\(", lines[j]):
                j -= 1
            m = NAME.search(lines[j])
            start = (m.group(1) if m else "?", j)
        elif line == "}" and start:
            yield start[0], start[1] + 1, i - start[1] + 1
            start = None


failed = False
files = 0
for folder in FOLDERS:
    for path in sorted(glob.glob(os.path.join(root, folder, "**", "*.[ch]"), recursive=True)):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        files += 1
        if len(lines) - 1 > MAX_FILE:
            failed = True
            print(f"{rel}: {len(lines) - 1} lines, over {MAX_FILE}")
        for name, first, length in functions(lines):
            if length > MAX_FUNCTION:
                failed = True
                print(f"{rel}:{first}: {name}() is {length} lines, over {MAX_FUNCTION}")

if failed:
    sys.exit(1)
print(f"{files} files of {', '.join(FOLDERS)}: none over {MAX_FILE} lines, no function over {MAX_FUNCTION}")
