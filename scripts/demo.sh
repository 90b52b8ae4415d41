#!/bin/sh
# The main job on a fresh machine: build, start gpumemd on the built-in KFD model, run real clients, show
# gpumemctl's view, stop the daemon cleanly.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh build

run=$(mktemp -d /tmp/gpumemd-demo-XXXXXX)
sock="$run/gpumemd.sock"
export GPUMEM_SOCKET="$sock"
trap 'kill "$daemon" 2>/dev/null || true; rm -rf "$run"' EXIT

# One policy class for everyone here, with limits the clients below stay within.
cat >"$run/gpumemd.conf" <<'EOF_CONF'
[class demo]
match-all = yes
vram = 64G
host = 8G
managed = 8G
handles = 4096
share-publish = weights/*
share-read = weights/*
EOF_CONF

echo "== starting gpumemd on the KFD model (preset mi300x)"
build/daemon/gpumemd --socket "$sock" --backend model --model-preset mi300x --config "$run/gpumemd.conf" \
    --log-level notice &
daemon=$!
for _ in $(seq 1 200); do build/libclient/gpumemctl ping >/dev/null 2>&1 && break; sleep 0.05; done

echo "== a client session"
build/libclient/examples/gpumem-info
echo "== two processes share a buffer through a dmabuf fd (libclient/examples/share-buffer.c)"
build/libclient/examples/share-buffer
echo "== a VMM buffer grows in place (libclient/examples/vmm-grow.c)"
build/libclient/examples/vmm-grow
echo "== managed memory with advice and prefetch (libclient/examples/managed.c)"
build/libclient/examples/managed
echo "== weights published once by name, read by another process (libclient/examples/weights-share.c)"
build/libclient/examples/weights-share publish weights/demo 64M >"$run/publisher.log" 2>&1 &
publisher=$!
for _ in $(seq 1 200); do
    grep -q published "$run/publisher.log" && break
    sleep 0.05
done
cat "$run/publisher.log"
build/libclient/examples/weights-share read weights/demo
build/libclient/gpumemctl shared
kill "$publisher" 2>/dev/null || true
wait "$publisher" 2>/dev/null || true
echo "== gpumemctl topology"
build/libclient/gpumemctl topology
echo "== gpumemctl quota show (while a client holds a grown VMM buffer)"
build/libclient/examples/vmm-grow --hold >"$run/holder.log" 2>&1 &
holder=$!
for _ in $(seq 1 200); do
    grep -q holding "$run/holder.log" && break
    sleep 0.05
done
build/libclient/gpumemctl quota show demo
echo "== gpumemctl allocations"
build/libclient/gpumemctl allocations
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
echo "== gpumemctl status"
build/libclient/gpumemctl status

# Unmodified ROCm user space through gpumemd: Debian's ROCm 5.2.3 knows gfx908, so a second daemon models
# one; rocminfo runs under libgpumem-kfd.so with no /dev/kfd of its own (docs/rocm-in-containers.md).
if command -v rocminfo >/dev/null 2>&1 && [ -e build/preload/libgpumem-kfd.so ]; then
    echo "== rocminfo through gpumemd (a second daemon on the gfx908 preset, libgpumem-kfd.so)"
    build/daemon/gpumemd --socket "$run/rocm.sock" --backend model --model-preset gfx908 \
        --config "$run/gpumemd.conf" --log-level notice &
    rocm_daemon=$!
    for _ in $(seq 1 200); do build/libclient/gpumemctl --socket "$run/rocm.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    GPUMEM_SOCKET="$run/rocm.sock" LD_PRELOAD="$PWD/build/preload/libgpumem-kfd.so" rocminfo 2>/dev/null |
        grep -E '^Agent|^  (Name|Marketing Name|Device Type|Compute Unit):' || true
    kill -TERM "$rocm_daemon"
    wait "$rocm_daemon"
fi

echo "== stopping gpumemd"
kill -TERM "$daemon"
wait "$daemon"
echo "gpumemd exited cleanly"
