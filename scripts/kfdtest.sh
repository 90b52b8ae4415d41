#!/bin/bash
# AMD's kfdtest (from Debian's roct-thunk-interface source) built outside the tree and run, one test per
# process, against the in-process KFD model and against gpumemd through libgpumem-kfd.so. Run by hand.
#
#   scripts/kfdtest.sh BUILD_DIR [WORK_DIR]      BUILD_DIR: a meson build dir of this tree (built)
#
# WORK_DIR (default /tmp/kfdtest) holds the source, the binary and results/. Environment:
#   KFDTEST_STEPS    what to do, in order, of: fetch build run          (default: all three)
#   KFDTEST_MODES    model gpumemd                                      (default: both)
#   KFDTEST_TIMEOUT  seconds each test may run                          (default: 60)
#   KFDTEST_FILTER   an extended regex the test names must match        (default: all)
#
# Debian's archive no longer serves the 5.2.3 source of roct-thunk-interface, so the kfdtest of the next
# one it serves (6.2.4, trixie) is built against the installed libhsakmt 5.2.3: the few tests that need a
# newer libhsakmt (debugger, PC sampling, RDMA, event ages, SMI events, DMA-buf export, address-only
# allocations, available memory) are left out of the build, and nothing else of the test source changes
# but one property that 5.2.3's node properties lack (Integrated: derived from the node having CPU cores).
set -euo pipefail

BUILD=$(realpath "${1:?usage: scripts/kfdtest.sh BUILD_DIR [WORK_DIR]}")
WORK=${2:-/tmp/kfdtest}
STEPS=${KFDTEST_STEPS:-fetch build run}
MODES=${KFDTEST_MODES:-model gpumemd}
TIMEOUT=${KFDTEST_TIMEOUT:-60}
FILTER=${KFDTEST_FILTER:-.}
TREE=$(cd "$(dirname "$0")/.." && pwd)
VERSION=6.2.4+ds-1
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
SRC=$WORK/src

need() { # the packages the build needs, or the line that installs them
    local missing=()
    for p in "$@"; do dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "kfdtest.sh: missing packages: apt-get install ${missing[*]}" >&2
        exit 1
    fi
}

fetch() {
    [ -d "$SRC/tests/kfdtest" ] && return 0
    need xz-utils
    # A private apt state with trixie's source index: the system's apt configuration stays as it is.
    local apt=$WORK/apt
    mkdir -p "$apt/lists/partial" "$apt/dl"
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n%s\n' \
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > "$apt/trixie-src.sources"
    local opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt"
        -o Dir::State::Lists="$apt/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
        -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" update -q > "$apt/update.log"
    # Only the upstream tarball: the archive's mirror does not serve this version's .dsc. apt checks the
    # tarball against the source index.
    (cd "$apt/dl" && apt-get "${opts[@]}" source -q --download-only --tar-only \
        "roct-thunk-interface=$VERSION" > "$apt/source.log")
    rm -rf "$SRC" "$WORK/src.new"
    mkdir -p "$WORK/src.new"
    tar -xJf "$apt/dl/roct-thunk-interface_${VERSION%-*}.orig.tar.xz" -C "$WORK/src.new" --strip-components=1
    mv "$WORK/src.new" "$SRC"
}

# Tests that call libhsakmt entry points or use fields that 5.2.3 does not have: cut from the source.
CUT_TESTS=(
    "KFDMemoryTest, MemoryAllocAll" "KFDMemoryTest, ExportDMABufTest" "KFDMemoryTest, VA_VRAM_Only_AllocTest"
    "KFDEventTest, SignalEventExt" "KFDSVMRangeTest, HMMProfilingEvent"
)
CUT_FILES="BaseDebug KFDDBGTest KFDPCSamplingTest RDMATest"

build() {
    need g++ libgtest-dev libhsakmt-dev libdrm-dev libnuma-dev llvm-14-dev
    local kt=$SRC/tests/kfdtest out=$WORK/build
    mkdir -p "$out/src" "$out/obj" "$out/inc/hsakmt/linux"
    # 5.2.3's headers under the names the test source includes; the ioctl header is the test's own.
    ln -sf /usr/include/hsakmt.h "$out/inc/hsakmt/hsakmt.h"
    ln -sf /usr/include/hsakmttypes.h "$out/inc/hsakmt/hsakmttypes.h"
    cp "$SRC/include/hsakmt/linux/kfd_ioctl.h" "$out/inc/hsakmt/linux/"
    local f base cut
    for f in "$kt"/src/*.cpp "$kt"/src/*.hpp; do
        base=$(basename "$f")
        cut=""
        for t in "${CUT_TESTS[@]}"; do
            grep -q "^TEST_[FP]($t)" "$f" && cut="$cut|^TEST_[FP][(]${t}[)]"
        done
        case $base in KFDSVMRangeTest.cpp) cut="$cut|^struct ReadEventThreadParams" ;; esac
        # Delete from each cut start to the next closing brace in column 0 (the end of that test).
        awk -v re="${cut#|}" 're != "" && $0 ~ re { skip = 1 } !skip { print } skip && /^}$/ { skip = 0 }' \
            "$f" | sed 's/pNodeProperties->Integrated/(pNodeProperties->NumCPUCores \&\& pNodeProperties->NumFComputeCores)/' \
            > "$out/src/$base.new"
        # (unchanged files keep their time, so that only what changed is compiled again)
        if cmp -s "$out/src/$base.new" "$out/src/$base" 2> /dev/null; then
            rm "$out/src/$base.new"
        else
            mv "$out/src/$base.new" "$out/src/$base"
        fi
    done
    local objs=() srcs=() s o
    for s in "$out"/src/*.cpp; do
        base=$(basename "$s" .cpp)
        case " $CUT_FILES " in *" $base "*) continue ;; esac
        o=$out/obj/$base.o
        objs+=("$o")
        [ "$o" -nt "$s" ] || srcs+=("$s")
    done
    local flags
    flags="-std=gnu++17 -O2 -g -w -I$out/inc -I$kt/include -I$out/src -I/usr/include/libdrm"
    flags="$flags $(llvm-config-14 --cppflags)"
    [ ${#srcs[@]} -eq 0 ] ||
        printf '%s\n' "${srcs[@]}" | xargs -P "$(nproc)" -I{} sh -c \
            "g++ $flags -c {} -o $out/obj/\$(basename {} .cpp).o" || return 1
    g++ -o "$WORK/kfdtest" "${objs[@]}" -lgtest -lhsakmt -ldrm -ldrm_amdgpu \
        "$(llvm-config-14 --ldflags)" -lLLVM-14 -lpthread -lnuma -lrt
    echo "kfdtest.sh: built $WORK/kfdtest"
}

DAEMON_PID=""
stop_daemon() {
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2> /dev/null || true
        wait "$DAEMON_PID" 2> /dev/null || true
        DAEMON_PID=""
    fi
}
trap stop_daemon EXIT

start_daemon() { # a gpumemd on the gfx908 model, restarted when a test took it down
    [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2> /dev/null && return 0
    local dir=$WORK/daemon
    mkdir -p "$dir"
    rm -f "$dir/gpumemd.sock"
    printf '[daemon]\nlog-level = notice\n' > "$dir/gpumemd.conf"
    "$BUILD/daemon/gpumemd" --socket "$dir/gpumemd.sock" --config "$dir/gpumemd.conf" --backend model \
        --model-preset gfx908 >> "$dir/gpumemd.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 100); do
        [ -S "$dir/gpumemd.sock" ] && return 0
        sleep 0.1
    done
    echo "kfdtest.sh: gpumemd did not start ($dir/gpumemd.log)" >&2
    return 1
}

run_one() { # MODE TEST: PASS, SKIP, FAIL, TIMEOUT or a signal's name
    local mode=$1 t=$2 log=$WORK/results/$1/${2//\//_}.log rc=0 pid
    local env=(LD_PRELOAD="$BUILD/preload/libgpumem-model-preload.so" GPUMEM_MODEL_PRESET="$TREE/thunk/presets/gfx908")
    [ "$mode" = model ] || env=(LD_PRELOAD="$BUILD/preload/libgpumem-kfd.so"
        GPUMEM_SOCKET="$WORK/daemon/gpumemd.sock" GPUMEM_KFD_LOG=1 GPUMEM_KFD_LOG_FILE="$log.kfd")
    # A process group of its own (setsid), so that what a test forked and left behind goes with it.
    setsid env "${env[@]}" timeout -k 5 "$TIMEOUT" "$WORK/kfdtest" --gtest_filter="$t" > "$log" 2>&1 &
    pid=$!
    wait "$pid" || rc=$?
    kill -KILL -- -"$pid" 2> /dev/null || true
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo TIMEOUT
    elif [ $rc -gt 128 ]; then
        echo "SIG$(kill -l $((rc - 128)))"
    elif [ $rc -ne 0 ] || ! grep -q '^\[  PASSED  \] 1 test' "$log"; then
        echo FAIL
    elif grep -q '^\[  SKIPPED \]' "$log"; then
        echo SKIP
    else
        echo PASS
    fi
}

run() {
    [ -x "$WORK/kfdtest" ] || { echo "kfdtest.sh: no $WORK/kfdtest (build first)" >&2; exit 1; }
    # Listing opens no KFD.
    "$WORK/kfdtest" --gtest_list_tests 2> /dev/null | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }' |
        grep -E -- "$FILTER" > "$WORK/tests.txt" || true
    local mode t r
    for mode in $MODES; do
        rm -rf "$WORK/results/$mode" "$WORK/results/$mode.tsv.new"
        mkdir -p "$WORK/results/$mode"
        while read -r t; do
            # (here, not in run_one's subshell: the daemon's pid stays known)
            [ "$mode" = model ] || start_daemon
            r=$(run_one "$mode" "$t")
            printf '%s\t%s\n' "$t" "$r" >> "$WORK/results/$mode.tsv.new"
            printf '%-8s %-8s %s\n' "$mode" "$r" "$t"
        done < "$WORK/tests.txt"
        mv "$WORK/results/$mode.tsv.new" "$WORK/results/$mode.tsv"
        stop_daemon
    done
    table
}

table() {
    local out=$WORK/results/table.txt
    {
        printf '%-64s' test
        for mode in $MODES; do printf ' %-8s' "$mode"; done
        printf '\n'
        while read -r t; do
            printf '%-64s' "$t"
            for mode in $MODES; do
                printf ' %-8s' "$(awk -F'\t' -v t="$t" '$1 == t { print $2 }' "$WORK/results/$mode.tsv")"
            done
            printf '\n'
        done < "$WORK/tests.txt"
        for mode in $MODES; do
            awk -F'\t' -v m="$mode" '{ n[$2 == "PASS" || $2 == "SKIP" ? "ok" : "bad"]++ }
                END { printf "%s: %d passed, %d failed (of %d)\n", m, n["ok"], n["bad"], NR }' \
                "$WORK/results/$mode.tsv"
        done
    } > "$out"
    cat "$out"
}

for step in $STEPS; do
    "$step"
done
