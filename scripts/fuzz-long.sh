#!/bin/sh
# A long run of one libFuzzer target, spread over every CPU: scripts/fuzz-long.sh NAME [TOTAL_EXECS]
#
#   NAME         frame, request, topology or model-ioctl (the binary is fuzz-NAME)
#   TOTAL_EXECS  executions over all jobs together (default 100000000)
#
# FUZZ_JOBS jobs (default: nproc) run at once with libFuzzer's -jobs/-workers, each for TOTAL_EXECS/FUZZ_JOBS
# executions (rounded up), all sharing one scratch corpus that starts from the seed corpus. At the end one
# line: "fuzz-NAME: TOTAL execs, no finding", the total summed from every job's
# stat::number_of_executed_units, or "fuzz-NAME: FINDING ..." with the artifact, and exit 1.
#
# Works with the binaries of a fuzz build copied to another machine:
#   FUZZ_BIN_DIR       where fuzz-NAME is (default: build-fuzz/tests/fuzz of this checkout)
#   GPUMEMD_PRESETDIR  the model presets fuzz-request and fuzz-model-ioctl need (default: thunk/presets of
#                      this checkout)
#   FUZZ_SEED_DIR      the seed corpus (default: tests/fuzz/corpus/NAME of this checkout; may be absent)
#   OUT                where artifacts (crash-*, oom-*, timeout-*, leak-*) and the logs of failed jobs go
#                      (default: ./fuzz-artifacts)
#   FUZZ_WORK          scratch directory for the corpus and job logs (default: a new temporary one, removed
#                      at the end unless there was a finding or FUZZ_KEEP=1)
#   FUZZ_RSS_MB        -rss_limit_mb per job (default 4096); FUZZ_TIMEOUT: -timeout in s per input (60)
#   FUZZ_FLAGS         more libFuzzer flags, e.g. "-max_len=8192" or "-entropic=0"
#   FUZZ_PROGRESS      seconds between progress lines on stderr (default 600, 0: none)
set -eu

usage() {
    echo "usage: $0 frame|request|topology|model-ioctl [TOTAL_EXECS]" >&2
    exit 2
}
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
name=$1
total=${2:-100000000}
case $name in
frame | request | topology | model-ioctl) ;;
*) usage ;;
esac
case $total in
'' | *[!0-9]*) usage ;;
esac
[ "$total" -gt 0 ] || usage

root=$(cd "$(dirname "$0")/.." && pwd)
abspath() { # a path, made absolute against the directory the script was started in
    case $1 in
    /*) echo "$1" ;;
    *) echo "$PWD/$1" ;;
    esac
}
bin_dir=$(abspath "${FUZZ_BIN_DIR:-$root/build-fuzz/tests/fuzz}")
bin=$bin_dir/fuzz-$name
GPUMEMD_PRESETDIR=$(abspath "${GPUMEMD_PRESETDIR:-$root/thunk/presets}")
export GPUMEMD_PRESETDIR
seed=$(abspath "${FUZZ_SEED_DIR:-$root/tests/fuzz/corpus/$name}")
art=$(abspath "${OUT:-fuzz-artifacts}")
jobs=${FUZZ_JOBS:-$(nproc)}
rss=${FUZZ_RSS_MB:-4096}
timeout=${FUZZ_TIMEOUT:-60}
progress=${FUZZ_PROGRESS:-600}

if [ ! -x "$bin" ]; then
    echo "$0: no $bin: build it (CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined" \
        "-Db_lundef=false -Db_lto=false -Doptimization=2 -Ddocs=disabled && ninja -C build-fuzz tests/fuzz/fuzz-$name) or set FUZZ_BIN_DIR" >&2
    exit 2
fi
if { [ "$name" = request ] || [ "$name" = model-ioctl ]; } && [ ! -d "$GPUMEMD_PRESETDIR/mi300x" ]; then
    echo "$0: no model presets in $GPUMEMD_PRESETDIR (set GPUMEMD_PRESETDIR to a copy of thunk/presets)" >&2
    exit 2
fi
per_job=$(((total + jobs - 1) / jobs))

if [ -n "${FUZZ_WORK:-}" ]; then
    work=$(abspath "$FUZZ_WORK")
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-long-$name.XXXXXX")
fi
mkdir -p "$work/corpus" "$work/logs" "$art"
rm -f "$work/logs"/fuzz-*.log
seeds=""
if [ -d "$seed" ]; then
    seeds=$seed
else
    echo "$0: no seed corpus at $seed: starting from nothing" >&2
fi

echo "fuzz-$name: $jobs jobs x $per_job execs, corpus $work/corpus, artifacts $art" >&2

# Progress now and then: the newest "#N" of every job's log, summed.
monitor_pid=""
if [ "$progress" -gt 0 ]; then
    (
        start=$(date +%s)
        while sleep "$progress"; do
            n=$(for l in "$work/logs"/fuzz-*.log; do
                [ -f "$l" ] && grep -ao '^#[0-9]*' "$l" | tail -n 1 | tr -d '#'
            done | awk '{s += $1} END {print s + 0}')
            echo "fuzz-$name: about $n execs after $(($(date +%s) - start)) s" >&2
        done
    ) &
    monitor_pid=$!
fi

rc=0
# -jobs: every job writes fuzz-JOB.log in the current directory
# shellcheck disable=SC2086
(cd "$work/logs" && "$bin" -jobs="$jobs" -workers="$jobs" -runs="$per_job" -rss_limit_mb="$rss" \
    -timeout="$timeout" -print_final_stats=1 -artifact_prefix="$art/" ${FUZZ_FLAGS:-} \
    "$work/corpus" $seeds >"$work/logs/driver.log" 2>&1) || rc=$?
if [ -n "$monitor_pid" ]; then
    kill "$monitor_pid" 2>/dev/null || true
    wait "$monitor_pid" 2>/dev/null || true
fi

execs=0 done_jobs=0 finding=""
for l in "$work/logs"/fuzz-*.log; do
    [ -f "$l" ] || continue
    n=$(grep -a '^stat::number_of_executed_units' "$l" | tail -n 1 | awk '{print $2}')
    if [ -n "$n" ]; then
        execs=$((execs + n))
        done_jobs=$((done_jobs + 1))
    fi
    if [ -z "$finding" ] && grep -aqE '^==[0-9]+==.*ERROR|^SUMMARY: |ERROR: libFuzzer|Test unit written to' "$l"; then
        what=$(grep -aE '^SUMMARY: |ERROR: libFuzzer' "$l" | head -n 1)
        unit=$(grep -ao 'Test unit written to .*' "$l" | head -n 1 | sed 's/Test unit written to //')
        cp "$l" "$art/fuzz-$name-$(basename "$l")"
        finding="${what:-an error in $(basename "$l")}${unit:+; input: $unit}; log: $art/fuzz-$name-$(basename "$l")"
    fi
done
if [ -z "$finding" ] && [ "$done_jobs" -ne "$jobs" ]; then
    cp "$work/logs"/*.log "$art/" 2>/dev/null || true
    finding="only $done_jobs of $jobs jobs reported their final stats (driver exit status $rc); logs in $art"
fi
if [ -z "$finding" ] && [ "$rc" -ne 0 ]; then
    cp "$work/logs"/*.log "$art/" 2>/dev/null || true
    finding="libFuzzer exited with status $rc; logs in $art"
fi

if [ -n "$finding" ]; then
    echo "fuzz-$name: FINDING after $execs execs: $finding (corpus kept in $work/corpus)"
    exit 1
fi
echo "fuzz-$name: $execs execs, no finding"
if [ "${FUZZ_KEEP:-0}" = 1 ] || [ -n "${FUZZ_WORK:-}" ]; then
    echo "fuzz-$name: corpus in $work/corpus" >&2
else
    rm -rf "$work"
fi
