#!/bin/sh
# Configure (once) and build gpumemd into BUILDDIR (default: build), warnings as errors.
set -eu
cd "$(dirname "$0")/.."
builddir="${1:-build}"
shift 2>/dev/null || true
# meson and ninja print their errors (the compiler's among them) on stdout: quiet on success, shown on
# failure without ninja's progress lines
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ ! -f "$builddir/build.ninja" ]; then
    if ! meson setup "$builddir" --werror "$@" >"$log" 2>&1; then
        cat "$log" >&2
        exit 1
    fi
fi
if ! ninja -C "$builddir" >"$log" 2>&1; then
    grep -v '^\[[0-9]*/[0-9]*\] ' "$log" >&2 || true
    exit 1
fi
