#!/bin/sh
# The whole test suite on a fresh machine: the -Werror build, then the same suite under ASan+UBSan.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
status=0

run_suite() { # builddir label
    if meson test -C "$1" --print-errorlogs --num-processes 2; then :; else status=1; fi
    python3 scripts/test-summary.py "$1/meson-logs/testlog.json" "$2" >> "$summary"
}

summary=$(mktemp)
sh scripts/build.sh build
run_suite build "gcc -Werror"

sh scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_suite build-asan "ASan+UBSan"

echo
cat "$summary"
python3 scripts/test-summary.py --total "$summary"
rm -f "$summary"
exit $status
