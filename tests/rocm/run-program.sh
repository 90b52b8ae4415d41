#!/bin/sh
# Runs a test program under the model's preload library, or skips with the reason given.
# Usage: run-program.sh PRELOAD_LIBRARY SKIP_REASON PROGRAM [ARGS...]
set -u
preload=$1
skip=$2
shift 2
if [ -n "$skip" ]; then
    echo "SKIP: $skip"
    exit 77
fi
LD_PRELOAD="$preload" exec "$@"
