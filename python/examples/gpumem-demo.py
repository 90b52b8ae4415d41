#!/usr/bin/env python3
"""gpumem-demo: the Python binding end to end: list the GPUs, fill host memory through a memoryview, share it
read-only through an fd, import it on another GPU, check what the import sees, and free everything.

Exits 0 only if every step held; $GPUMEM_SOCKET names the daemon's socket (default /run/gpumemd/gpumemd.sock).
"""
import sys

import gpumem

SIZE = 4 << 20


def pattern(size, seed):
    """The bytes the demo writes: different for each seed, so a stale or foreign page cannot pass."""
    return bytes((i * 131 + seed) & 0xFF for i in range(256)) * (size // 256)


def main():
    try:
        client = gpumem.Client(name="gpumem-demo")
    except gpumem.Error as e:
        print(f"gpumem-demo: cannot connect: {e}", file=sys.stderr)
        return 1
    with client:
        print(f"connected to gpumemd {client.server_version} as client {client.id} "
              f"({client.backend} backend, KFD ABI {client.kfd_version[0]}.{client.kfd_version[1]})")
        gpus = client.gpus()
        if not gpus:
            print("gpumem-demo: the daemon has no GPU", file=sys.stderr)
            return 1
        for g in gpus:
            print(f"GPU {g.gpu_id}: {g.name}, gfx {g.gfx_target_version}, {g.simd_count} SIMDs, "
                  f"{g.local_mem_size >> 30} GiB VRAM, NUMA node {g.numa_node}")
        first, other = gpus[0].gpu_id, gpus[-1].gpu_id

        want = pattern(SIZE, 0x5A)
        with client.host_malloc(SIZE, first) as buf:
            view = buf.view()
            view[:] = want
            print(f"allocated {SIZE >> 20} MiB of host memory at {buf.va:#x} and filled it through a memoryview")

            # a read-only fd: an importer may read the memory, never write it
            with buf.export(read_only=True) as fd:
                print(f"exported it read-only as fd {fd.fileno()} ({fd.size} bytes)")
                with client.import_fd(fd, other) as handle:
                    with handle.map({gpumem.LOCATION_CPU: gpumem.Access.READ, other: gpumem.Access.READ}) as m:
                        print(f"imported it on GPU {other} and mapped it at {m.va:#x}")
                        seen = m.view()
                        if bytes(seen[:SIZE]) != want:
                            print("gpumem-demo: the import does not hold what was written", file=sys.stderr)
                            return 1
                        if not seen.readonly:
                            print("gpumem-demo: the read-only import is writable", file=sys.stderr)
                            return 1
                        print("the import holds the pattern and is read-only")
                        # the same pages: what the owner writes next, the import sees
                        view[:4] = b"demo"
                        if bytes(seen[:4]) != b"demo":
                            print("gpumem-demo: the import does not see the owner's writes", file=sys.stderr)
                            return 1
                        print("a write through the allocation shows in the import")
                        seen.release()
            view.release()
        print("freed everything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
