#!/bin/sh
# rocminfo (unmodified ROCm 5.2.3) under the model's preload library: the preset's GPU agent, pools and ISA.
# Usage: run-rocminfo.sh PRELOAD_LIBRARY [SKIP_REASON]
set -u
preload=$1
if [ -n "${2:-}" ]; then
    echo "SKIP: $2"
    exit 77
fi
out=$(mktemp)
stats=$(mktemp)
trap 'rm -f "$out" "$stats"' EXIT
GPUMEM_MODEL_STATS="$stats" LD_PRELOAD="$preload" rocminfo >"$out" 2>&1
rc=$?
cat "$out"
fail() {
    echo "FAIL: $1" >&2
    exit 1
}
[ "$rc" -eq 0 ] || fail "rocminfo exited with $rc"
grep -q 'ROCk module is loaded' "$out" || fail "rocminfo did not find the KFD"
[ "$(grep -c '^Agent [0-9]' "$out")" -eq 2 ] || fail "expected two agents (CPU and GPU)"
grep -Eq '^  Name: +gfx908 *$' "$out" || fail "no gfx908 agent"
grep -Eq '^  Device Type: +GPU' "$out" || fail "no GPU device type"
grep -Eq '^  Compute Unit: +120 *$' "$out" || fail "GPU agent does not have the preset's 120 CUs"
grep -Eq 'Segment: +GLOBAL; FLAGS: COARSE GRAINED' "$out" || fail "no coarse-grained VRAM pool"
grep -Eq '^      Size: +33554432\(0x2000000\) KB' "$out" || fail "VRAM pool is not the preset's 32 GiB"
grep -Eq 'Name: +amdgcn-amd-amdhsa--gfx908' "$out" || fail "no gfx908 ISA"
# hsa_shut_down closed the KFD: the model must hold nothing any more
line=$(grep '^gpumem-model-stats' "$stats") || fail "no model statistics"
echo "$line"
for f in contexts=0 kfd_fds=0 mems=0 bufs=0 mappings=0 system_used=0 ttm_used=0 vram_used=0 queues=0 events=0; do
    case " $line " in
    *" $f "*) ;;
    *) fail "model accounting did not return to zero ($f expected)" ;;
    esac
done
echo ok
