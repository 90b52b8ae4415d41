#!/bin/sh
# Configure (once) and build gpumemd into BUILDDIR (default: build), warnings as errors.
set -eu
cd "$(dirname "$0")/.."
builddir="${1:-build}"
shift 2>/dev/null || true
if [ ! -f "$builddir/build.ninja" ]; then
    meson setup "$builddir" --werror "$@" >/dev/null
fi
# ninja prints compiler errors on stdout: kept quiet on success, shown when the build fails
log=$(mktemp)
if ninja -C "$builddir" >"$log" 2>&1; then
    rm -f "$log"
else
    grep -v '^\[' "$log" >&2 || true
    rm -f "$log"
    exit 1
fi
