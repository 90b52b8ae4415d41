#!/usr/bin/env python3
"""Summarise meson's testlog.json as 'LABEL: N passed, N failed', or add up such lines with --total
(indented lines between them are figures, not counts)."""
import json
import sys


def main():
    if sys.argv[1] == "--total":
        passed = failed = 0
        with open(sys.argv[2]) as f:
            for line in f:
                if line.startswith(" "):  # a figure a stage printed beside its count
                    continue
                counts = line.split(":", 1)[1].strip().split(", ")
                passed += int(counts[0].split()[0])
                failed += int(counts[1].split()[0])
        print(f"{passed} passed, {failed} failed")
        return
    passed = failed = 0
    with open(sys.argv[1]) as f:
        for line in f:
            result = json.loads(line).get("result")
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result != "SKIP":
                failed += 1
    print(f"{sys.argv[2]}: {passed} passed, {failed} failed")


main()
