#!/bin/sh
# Configure (once) and build gpumemd into BUILDDIR (default: build), warnings as errors.
set -eu
cd "$(dirname "$0")/.."
builddir="${1:-build}"
shift 2>/dev/null || true
if [ ! -f "$builddir/build.ninja" ]; then
    meson setup "$builddir" --werror "$@" >/dev/null
fi
ninja -C "$builddir" >/dev/null
