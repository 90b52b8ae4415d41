#!/bin/sh
# The whole test suite on a fresh machine: the -Werror build, the same suite under ASan+UBSan and all but the
# stress tests under ThreadSanitizer, the daemon integration tests with gpumemd under valgrind, and each
# fuzzer for a bounded time (clang, libFuzzer).
# FUZZ_SECONDS (default 30) sets the time per fuzzer; 0 skips the stage.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
status=0

run_suite() { # builddir label [meson test arguments...]
    dir=$1 label=$2
    shift 2
    if meson test -C "$dir" --print-errorlogs --num-processes 2 --logbase testlog "$@"; then :; else status=1; fi
    python3 scripts/test-summary.py "$dir/meson-logs/testlog.json" "$label" >> "$summary"
    # the daemon's mappings and threads with 1,000 clients (bounds-crowd), as the run measured them
    grep -h -m1 "^1000 clients connected" "$dir/meson-logs/testlog.txt" 2>/dev/null |
        sed "s/^/  $label, bounds-crowd: /" >> "$summary" || true
}

summary=$(mktemp)
sh scripts/build.sh build
run_suite build "gcc -Werror"

# The daemon suites again with gpumemd on its kfd backend, the code every AMD node runs, under the model's
# preload, which serves /dev/kfd, the render nodes and the KFD sysfs at the libc level: every open, ioctl
# and mmap of the kernel path reaches the model as it would reach the kernel.
# tests/integ/kfd-differences.txt lists the suites that do not run there yet, and why.
grep -v '^#' tests/integ/kfd-differences.txt | awk 'NF { print $1 }' > build/kfd-skip
kfd_tests=$(meson test -C build --list --suite integ --no-rebuild 2>/dev/null | grep ' / ' | sed 's|.* / ||' |
    grep -vxF -f build/kfd-skip)
export GPUMEM_TEST_BACKEND=kfd GPUMEM_TEST_KFD_PRELOAD="$PWD/build/preload/libgpumem-model-preload.so"
# shellcheck disable=SC2086
run_suite build "gcc -Werror, kfd backend under the preload" --no-rebuild $kfd_tests
unset GPUMEM_TEST_BACKEND GPUMEM_TEST_KFD_PRELOAD

# the sanitizer and fuzzing builds at -O2 without link-time optimisation: LTO would double their build for
# nothing they check, and GCC at -O3 with AddressSanitizer warns of null destination pointers that cannot be
# null (-Werror makes that a failed build)
sh scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Db_lto=false -Doptimization=2
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_suite build-asan "ASan+UBSan"
unset ASAN_OPTIONS UBSAN_OPTIONS

# ThreadSanitizer (clang): the daemon's event loops and worker threads, the client library's threads and
# the model's packet processor, over every suite but stress, whose runs outlast their timeouts under it, and
# crowds, whose thousands of clients' VA windows do not fit beside its shadow memory.
# die_after_fork=0: tests fork clients that run as other uids from a process that has threads.
CC=clang sh scripts/build.sh build-tsan -Db_sanitize=thread -Db_lundef=false -Db_lto=false -Doptimization=2 -Ddocs=disabled
export TSAN_OPTIONS="halt_on_error=1:die_after_fork=0:suppressions=$PWD/tests/tsan.supp"
run_suite build-tsan "ThreadSanitizer" --timeout-multiplier 3 \
    --suite model --suite unit --suite topo --suite thunk --suite integ --suite systemd --no-suite crowds
unset TSAN_OPTIONS

# gpumemd under valgrind (memcheck; an error or a definite leak makes the daemon exit 99, and the test
# fails on its exit status): the policy suite (clients of several uids, every memory path, reloads, random
# sequences and kills), daemon restarts, backend faults, and the hostile tests of memory lifetime, read-only
# shares and imports (the inotify path of memory that outlives its handle). Left out: the suites that count the daemon's
# fds or time it tightly (test-daemon, test-broker, test-malicious), which valgrind's own fds and its
# slowness upset; they run in the two stages above.
if ! command -v valgrind >/dev/null && [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind >/dev/null || true
fi
if command -v valgrind >/dev/null; then
    # the model probes SVM ranges with msync, which valgrind reports on an unmapped range: suppressed
    export GPUMEMD_WRAPPER="valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --quiet --suppressions=$PWD/tests/valgrind.supp"
    run_suite build "valgrind (gpumemd)" --no-rebuild --timeout-multiplier 4 \
        policy restart faults hostile-lifetime hostile-read-only hostile-imports
    unset GPUMEMD_WRAPPER
else
    echo "valgrind (gpumemd): 0 passed, 1 failed" >> "$summary"
    status=1
fi

# Each fuzzer for a bounded time from its seed corpus (copied: new inputs stay out of the tree).
fuzz_seconds=${FUZZ_SECONDS:-30}
if [ "$fuzz_seconds" -gt 0 ]; then
    fuzz_pass=0 fuzz_fail=0
    if [ ! -f build-fuzz/build.ninja ]; then
        CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
            -Db_lto=false -Doptimization=2 -Ddocs=disabled >/dev/null
    fi
    fuzzers="frame request topology model-ioctl engines handover"
    targets=""
    for f in $fuzzers; do targets="$targets tests/fuzz/fuzz-$f"; done
    # shellcheck disable=SC2086
    if ninja -C build-fuzz $targets >/dev/null; then
        work=$(mktemp -d)
        for f in $fuzzers; do
            mkdir -p "$work/$f"
            if GPUMEMD_PRESETDIR="$PWD/thunk/presets" "build-fuzz/tests/fuzz/fuzz-$f" \
                -max_total_time="$fuzz_seconds" -rss_limit_mb=4096 -print_final_stats=1 \
                -artifact_prefix="$work/$f-" "$work/$f" "tests/fuzz/corpus/$f" >"$work/$f.log" 2>&1; then
                fuzz_pass=$((fuzz_pass + 1))
                echo "fuzz-$f: $(grep -m1 'number_of_executed_units' "$work/$f.log" | awk '{print $2}') runs, no finding"
            else
                fuzz_fail=$((fuzz_fail + 1))
                status=1
                echo "fuzz-$f: FAILED" && tail -n 60 "$work/$f.log"
                mkdir -p fuzz-artifacts && cp "$work/$f"-* fuzz-artifacts/ 2>/dev/null || true
            fi
        done
        rm -rf "$work"
    else
        fuzz_fail=$(echo $fuzzers | wc -w)
        status=1
    fi
    echo "libFuzzer (${fuzz_seconds} s each): $fuzz_pass passed, $fuzz_fail failed" >> "$summary"
fi

echo
cat "$summary"
python3 scripts/test-summary.py --total "$summary"
rm -f "$summary"
exit $status
