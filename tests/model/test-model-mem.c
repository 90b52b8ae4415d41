/* Tests of the KFD model's memory: allocation, handles, GPU mappings, limits, CPU maps, dmabufs, carving. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model-fixture.h"

int test_alloc_errors(void)
{
        Fx f;
        uint64_t h = 0, off = 0;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup_topo(&f, topo_make(3, std_gpus, 64 * GiB), 19, false), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], G0), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[2], G2), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 0, VRAM_RW, &h, NULL), -EINVAL);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, &h, NULL),
                   -EINVAL);
        REQUIRE_RC(alloc_bo(&f, f.kfd, 0x4444, 0x100000, PAGE, VRAM_RW, &h, NULL), -EINVAL);
        REQUIRE_RC(
                alloc_bo(&f, f.kfd, G2, 0x100000, PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, &h, NULL),
                -EINVAL);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G1, 0x100000, PAGE, VRAM_RW, &h, NULL), -ENODEV);
        /* checks come in the kernel's order: unknown GPU before missing VM, small BAR before missing VM */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G1, 0x100000, 0, VRAM_RW, &h, NULL), -EINVAL);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL, &h, NULL), -EINVAL);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, 2 * PAGE, KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP, &h, NULL),
                   -EINVAL);
        off = 0;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h, &off),
                   -EINVAL);
        off = 0x10001;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h, &off),
                   -EINVAL);
        /* each type's rule applies whenever its bit is set, whatever the domain */
        REQUIRE_RC(
                alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL, &h, NULL),
                -EINVAL);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 2 * PAGE, GTT_RW | KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP,
                            &h, NULL),
                   -EINVAL);
        off = 0x10001;
        REQUIRE_RC(
                alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h, &off),
                -EINVAL);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.mems == 0 && s.bufs == 0 && s.vram_used[0] == 0 && s.system_used == 0);
        /* and then the domain decides: VRAM | DOORBELL of the doorbell size and VRAM | USERPTR without an
         * address are VRAM BOs */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 2 * PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL, &h,
                            NULL),
                   0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.vram_used[0] == 2 * PAGE);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        off = 0;
        REQUIRE_RC(
                alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h, &off),
                0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.vram_used[0] == PAGE && s.system_used == 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        /* small-BAR VRAM without PUBLIC is fine; unaligned sizes are page-aligned */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G2, 0x100000, PAGE + 1, VRAM_RW, &h, NULL), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.vram_used[2] == 2 * PAGE && s.mems == 1);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        /* doorbell and MMIO with the right sizes; MMIO's offset encodes the GPU */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, 2 * PAGE, KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL, &h, NULL),
                   0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        off = 0;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP, &h, &off), 0);
        REQUIRE(off == (THUNK_KFD_MMAP_TYPE_MMIO | THUNK_KFD_MMAP_GPU_ID(G0)));
        {
                void *p = NULL;

                REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                                            f.kfd, off, &p),
                           0);
                REQUIRE(munmap(p, PAGE) == 0);
                REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, PAGE, PROT_READ, MAP_SHARED, f.kfd,
                                            THUNK_KFD_MMAP_TYPE_DOORBELL | THUNK_KFD_MMAP_GPU_ID(G0), &p),
                           -EINVAL);
        }
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_handles(void)
{
        Fx f;
        uint64_t h[4] = {0}, x = 0;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        for (int i = 0; i < 3; i++)
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000 * (i + 1), PAGE, VRAM_RW, &h[i], NULL), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G1, 0x100000, PAGE, GTT_RW, &h[3], NULL), 0);
        REQUIRE(h[0] == ((uint64_t)G0 << 32 | 0) && h[1] == ((uint64_t)G0 << 32 | 1));
        REQUIRE(h[2] == ((uint64_t)G0 << 32 | 2));
        REQUIRE(h[3] == ((uint64_t)G1 << 32 | 0)); /* per-GPU ids */
        REQUIRE_RC(free_bo(&f, f.kfd, h[1]), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x900000, PAGE, VRAM_RW, &x, NULL), 0);
        REQUIRE(x == h[1]); /* lowest free id again */
        REQUIRE_RC(free_bo(&f, f.kfd, x), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h[0]), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h[2]), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h[3]), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_free_errors(void)
{
        Fx f;
        uint64_t h = 0;
        uint32_t ids[] = {G0};

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, (uint64_t)0x7777 << 32), -EINVAL);
        REQUIRE_RC(free_bo(&f, f.kfd, h + 5), -EINVAL);
        REQUIRE_RC(free_bo(&f, f.kfd, ((uint64_t)G1 << 32) | (h & 0xffffffff)), -EINVAL);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 1, NULL), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), -EBUSY);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids, 1, NULL), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), -EINVAL);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_map_errors(void)
{
        Fx f;
        uint64_t h = 0, h2 = 0, h0va = 0, hs = 0;
        uint32_t ids[] = {G0, G1};
        uint32_t n;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 2 * PAGE, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 0, NULL), -EINVAL);
        n = 3;
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, &n), -EINVAL);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, NULL, 1, NULL), -EFAULT);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h + 9, ids, 1, NULL), -ENOMEM); /* unknown idr: -ENOMEM */
        REQUIRE_RC(map_bo(&f, f.kfd, false, h + 9, ids, 1, NULL), -ENOMEM);
        REQUIRE_RC(map_bo(&f, f.kfd, true, (uint64_t)0x7777 << 32, ids, 1, NULL), -EINVAL);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids, 1, NULL), -EINVAL); /* not mapped */
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, NULL), 0); /* again: no-op */
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.mappings == 2);
        /* VA 0 can never be mapped */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, PAGE, VRAM_RW, &h0va, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h0va, ids, 1, NULL), -EINVAL);
        /* overlapping VA is accepted by ALLOC and refused by MAP, per VM */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x101000, PAGE, VRAM_RW, &h2, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h2, ids, 1, NULL), -EINVAL);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids, 1, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h2, ids, 1, NULL), 0); /* G0's VM is free there now */
        n = 0;
        REQUIRE_RC(map_bo(&f, f.kfd, true, h2, ids, 2, &n), -EINVAL); /* G1 still has h there */
        REQUIRE(n == 1);
        /* peer access: small-BAR VRAM of G2 cannot be mapped on G0; large-BAR/hive peers can */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G2, 0x800000, PAGE, VRAM_RW, &hs, NULL), 0);
        {
                uint32_t peer[] = {G2, G0};

                n = 0;
                REQUIRE_RC(map_bo(&f, f.kfd, true, hs, peer, 2, &n), -EINVAL);
                REQUIRE(n == 1);
                REQUIRE_RC(map_bo(&f, f.kfd, false, hs, peer, 1, NULL), 0);
        }
        REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids + 1, 1, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h2, ids, 1, NULL), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.mappings == 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h2), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h0va), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, hs), 0);
        REQUIRE_RC(fx_teardown(&f), 0);

        /* a target GPU without a VM: MAP cannot bind it (-ENODEV), UNMAP binds nothing and finds nothing
         * mapped there (-EINVAL) */
        REQUIRE_RC(fx_setup_topo(&f, topo_make(3, std_gpus, 64 * GiB), 19, false), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], G0), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids + 1, 1, NULL), -ENODEV);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids + 1, 1, NULL), -EINVAL);
        REQUIRE_RC(map_bo(&f, f.kfd, false, (uint64_t)G1 << 32, ids, 1, NULL), -ENOMEM);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* A failed MAP reports how far it got; re-issuing the same struct resumes there. */
int test_map_resume(void)
{
        Fx f;
        uint64_t h = 0;
        uint32_t ids[] = {G0, 0x7777, G2};
        struct kfd_ioctl_map_memory_to_gpu_args a;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, GTT_RW, &h, NULL), 0);
        a = (struct kfd_ioctl_map_memory_to_gpu_args){
                .handle = h, .device_ids_array_ptr = (uintptr_t)ids, .n_devices = 3};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_MAP_MEMORY_TO_GPU, &a), -EINVAL);
        REQUIRE(a.n_success == 1);
        ids[1] = G1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_MAP_MEMORY_TO_GPU, &a), 0);
        REQUIRE(a.n_success == 3);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.mappings == 3);
        a.n_success = 0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, &a), 0);
        REQUIRE(a.n_success == 3);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static uint64_t avail(Fx *f, uint32_t gpu)
{
        struct kfd_ioctl_get_available_memory_args a = {.gpu_id = gpu};

        if (io(f, f->kfd, AMDKFD_IOC_AVAILABLE_MEMORY, &a) < 0)
                return ~0ULL;
        return a.available;
}

int test_available_and_limits(void)
{
        Fx f;
        uint64_t a0 = 0, a1 = 0, h = 0, h2 = 0, off = 0;
        ThunkModelStats s;
        const uint64_t ram = 64 * GiB, pt = (ram >> 14) > 8 * MiB ? ram >> 14 : 8 * MiB;
        const uint64_t sys_limit = ram - (ram >> 6) - 3 * (GiB / 2);

        REQUIRE_RC(fx_setup(&f, 19), 0);
        a0 = avail(&f, G0);
        REQUIRE(a0 == ((16 * GiB - pt) & ~(2 * MiB - 1)));
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h, NULL), 0);
        a1 = avail(&f, G0);
        REQUIRE(a1 == a0 - 2 * MiB); /* charged 2 MiB-aligned for availability */
        REQUIRE(avail(&f, G1) == a0);
        {
                struct kfd_ioctl_get_available_memory_args am = {.gpu_id = 0x7777};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_AVAILABLE_MEMORY, &am), -EINVAL);
        }
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE(avail(&f, G0) == a0);
        /* the VRAM limit is size minus the page-table reserve */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 16 * GiB - pt + PAGE, VRAM_RW, &h, NULL), -ENOMEM);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 16 * GiB - pt, VRAM_RW, &h, NULL), 0);
        REQUIRE(avail(&f, G0) == 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h2, NULL), -ENOMEM);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        /* GTT is charged to system and TTM (TTM = RAM/2 is the tighter one) */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, ram / 2 + PAGE, GTT_RW, &h, NULL), -ENOMEM);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, ram / 2, GTT_RW, &h, NULL), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == ram / 2 && s.ttm_used == ram / 2);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G1, 0x100000, PAGE, GTT_RW, &h2, NULL), -ENOMEM);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        /* USERPTR is charged to system only; the pages must exist */
        {
                void *p = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

                REQUIRE(p != MAP_FAILED);
                off = (uintptr_t)p;
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 4 * PAGE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h,
                                    &off),
                           0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.system_used == 4 * PAGE && s.ttm_used == 0);
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
                off = (uintptr_t)p;
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, sys_limit + PAGE,
                                    KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h, &off),
                           -ENOMEM);
                REQUIRE(munmap(p, 4 * PAGE) == 0);
                off = (uintptr_t)p;
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 4 * PAGE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h,
                                    &off),
                           -EFAULT);
        }
        REQUIRE_RC(fx_teardown(&f), 0);

        /* an APU: VRAM requests become GTT, availability is the system/TTM headroom */
        {
                GpuSpec apu = {0x5555, 0, 0, 0, 90012, true};

                REQUIRE_RC(fx_setup_topo(&f, topo_make(1, &apu, 8 * GiB), 19, false), 0);
                REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], 0x5555), 0);
                REQUIRE(avail(&f, 0x5555) == 4 * GiB); /* TTM = RAM/2 < system limit */
                REQUIRE_RC(alloc_bo(&f, f.kfd, 0x5555, 0x100000, MiB,
                                    VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, &h, NULL),
                           0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.vram_used[0] == 0 && s.ttm_used == MiB);
                REQUIRE(avail(&f, 0x5555) == 4 * GiB - MiB);
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        return 0;
}

/* CPU access through the render fd at mmap_offset yields the BO's own pages. */
int test_mmap_data(void)
{
        Fx f;
        uint64_t h = 0, off = 0, h2 = 0, off2 = 0;
        unsigned char *p = NULL, *q = NULL;
        int other = -1;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 2 * PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, &h,
                            &off),
                   0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, PAGE, GTT_RW, &h2, &off2), 0);
        REQUIRE(off != off2 && off % PAGE == 0 && off2 % PAGE == 0);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                                    f.render[0], off, (void **)&p),
                   0);
        REQUIRE(p[0] == 0 && p[2 * PAGE - 1] == 0); /* VRAM starts wiped */
        memset(p, 0x5a, 2 * PAGE);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 2 * PAGE, PROT_READ, MAP_SHARED, f.render[0], off,
                                    (void **)&q),
                   0);
        REQUIRE(q[PAGE + 7] == 0x5a);
        REQUIRE(munmap(q, 2 * PAGE) == 0);
        /* exact offsets only, never past the object, only on files that may see it */
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, PAGE, PROT_READ, MAP_SHARED, f.render[0], off + PAGE,
                                    (void **)&q),
                   -EINVAL);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 3 * PAGE, PROT_READ, MAP_SHARED, f.render[0], off,
                                    (void **)&q),
                   -EINVAL);
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 128, &other), 0);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, PAGE, PROT_READ, MAP_SHARED, other, off, (void **)&q),
                   -EACCES);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, PAGE, PROT_READ, MAP_SHARED, 999, off, (void **)&q),
                   -EBADF);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, other), 0);
        /* the mapping stays valid after FREE (the pages belong to the mapping too), the model forgets it */
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE(p[5] == 0x5a);
        REQUIRE(munmap(p, 2 * PAGE) == 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h2), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* Child side: receive a dmabuf fd, map it, check the pattern, write an answer into the second page. */
static int child_check(int sock, size_t len)
{
        int fd = recv_one_fd(sock, 0);
        unsigned char *p;

        if (fd < 0)
                return 10;
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return 11;
        for (size_t i = 0; i < PAGE; i++)
                if (p[i] != (unsigned char)(i * 7))
                        return 12;
        p[PAGE] = 0xc3;
        munmap(p, len);
        close(fd);
        return 0;
}

int test_dmabuf(void)
{
        Fx f;
        uint64_t h = 0, off = 0, himp = 0, hro = 0;
        unsigned char *p = NULL;
        struct kfd_ioctl_export_dmabuf_args ex;
        struct kfd_ioctl_get_dmabuf_info_args info;
        struct kfd_ioctl_import_dmabuf_args im;
        int sv[2], status;
        pid_t pid;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 2 * PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, &h,
                            &off),
                   0);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                                    f.render[0], off, (void **)&p),
                   0);
        for (size_t i = 0; i < PAGE; i++)
                p[i] = (unsigned char)(i * 7);
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = h, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        REQUIRE(fcntl((int)ex.dmabuf_fd, F_GETFD) & FD_CLOEXEC);

        /* another process receives the fd over a socket and sees the same bytes, and we see its write */
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
                close(sv[0]);
                _exit(child_check(sv[1], 2 * PAGE));
        }
        close(sv[1]);
        REQUIRE_RC(send_one_fd(sv[0], (int)ex.dmabuf_fd), 0);
        REQUIRE(waitpid(pid, &status, 0) == pid);
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        REQUIRE(p[PAGE] == 0xc3);
        close(sv[0]);

        /* GET_DMABUF_INFO describes the owner */
        memset(&info, 0, sizeof(info));
        info.dmabuf_fd = ex.dmabuf_fd;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_DMABUF_INFO, &info), 0);
        REQUIRE(info.size == 2 * PAGE && info.gpu_id == G0);
        REQUIRE(info.flags == (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC));
        /* import on a hive peer: a new handle on the importing GPU, same pages */
        im = (struct kfd_ioctl_import_dmabuf_args){
                .va_addr = 0x400000, .gpu_id = G1, .dmabuf_fd = ex.dmabuf_fd};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), 0);
        himp = im.handle;
        REQUIRE(himp == ((uint64_t)G1 << 32 | 0));
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.imports == 1 && s.mems == 2 && s.bufs == 1);
        {
                uint32_t ids[] = {G1};

                REQUIRE_RC(map_bo(&f, f.kfd, true, himp, ids, 1, NULL), 0);
                REQUIRE_RC(map_bo(&f, f.kfd, false, himp, ids, 1, NULL), 0);
        }
        /* errors */
        im.gpu_id = 0x7777;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), -EINVAL);
        im.gpu_id = G1;
        im.dmabuf_fd = 9999;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), -EBADF);
        info.dmabuf_fd = 9999;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_DMABUF_INFO, &info), -EBADF);
        info.dmabuf_fd = 1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_DMABUF_INFO, &info), -EINVAL);
        ex.handle = h + 40;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), -EINVAL);
        ex.handle = (uint64_t)0x7777 << 32;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), -EINVAL);
        /* a BO without WRITABLE exports read-only */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x800000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_GTT, &hro, NULL), 0);
        {
                struct kfd_ioctl_export_dmabuf_args ro = {.handle = hro, .flags = O_CLOEXEC};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ro), 0);
                REQUIRE(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, (int)ro.dmabuf_fd, 0) ==
                        MAP_FAILED);
                close((int)ro.dmabuf_fd);
        }
        REQUIRE_RC(free_bo(&f, f.kfd, hro), 0);
        /* freeing the exporter keeps the import's pages */
        REQUIRE(munmap(p, 2 * PAGE) == 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.bufs == 1 && s.vram_used[0] == 2 * PAGE);
        REQUIRE_RC(free_bo(&f, f.kfd, himp), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.bufs == 0 && s.vram_used[0] == 0);
        close((int)ex.dmabuf_fd);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* A memfd from elsewhere: refused on old kernels, a GTT import on ABI >= 15. */
int test_dmabuf_foreign(void)
{
        static const uint32_t minors[] = {11, 19};

        for (size_t i = 0; i < 2; i++) {
                Fx f;
                int mfd = memfd_create("foreign", MFD_CLOEXEC | MFD_ALLOW_SEALING);
                struct kfd_ioctl_import_dmabuf_args im = {.va_addr = 0x400000, .gpu_id = G0};
                struct kfd_ioctl_get_dmabuf_info_args info = {0};

                REQUIRE(mfd >= 0 && ftruncate(mfd, 3 * PAGE) == 0);
                im.dmabuf_fd = (uint32_t)mfd;
                REQUIRE_RC(fx_setup(&f, minors[i]), 0);
                info.dmabuf_fd = (uint32_t)mfd;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_DMABUF_INFO, &info), -EINVAL);
                if (minors[i] < 15) {
                        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), -EINVAL);
                } else {
                        uint32_t ids[] = {G0, G2};
                        ThunkModelStats s;

                        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), 0);
                        REQUIRE_RC(map_bo(&f, f.kfd, true, im.handle, ids, 2, NULL), 0);
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.imports == 1 && s.system_used == 0 && s.mappings == 2);
                        REQUIRE_RC(map_bo(&f, f.kfd, false, im.handle, ids, 2, NULL), 0);
                        REQUIRE_RC(free_bo(&f, f.kfd, im.handle), 0);
                }
                close(mfd);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        return 0;
}

#define VRAM_PRIV VRAM_RW /* not host visible: carved out of its GPU's backing file */

static int map_cpu(Fx *f, int render, uint64_t off, size_t len, unsigned char **ret)
{
        return f->seam.ops->mmap(f->seam.impl, NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, render, off,
                                 (void **)ret);
}

static bool all_bytes(const unsigned char *p, size_t len, unsigned char v)
{
        for (size_t i = 0; i < len; i++)
                if (p[i] != v)
                        return false;
        return true;
}

/* Buffers carved out of one backing file are neighbours in it, and still never see each other's bytes. */
int test_carve(void)
{
        Fx f;
        uint64_t h[3] = {0}, off[3] = {0};
        unsigned char *p[3] = {NULL};
        const uint64_t size[3] = {2 * PAGE, PAGE, 3 * PAGE};
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE(f.empty.backing_files == 3 && f.empty.buffer_files == 0 && f.empty.carved_bytes == 0);
        for (int i = 0; i < 3; i++)
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000 * (uint64_t)(i + 1), size[i], VRAM_PRIV, &h[i],
                                    &off[i]),
                           0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.bufs == 3 && s.buffer_files == 0);
        REQUIRE(s.carved_bytes == 2 * PAGE + PAGE + 4 * PAGE); /* blocks of 2^k pages */
        for (int i = 0; i < 3; i++) {
                REQUIRE_RC(map_cpu(&f, f.render[0], off[i], size[i], &p[i]), 0);
                REQUIRE(all_bytes(p[i], size[i], 0)); /* VRAM starts wiped */
        }
        for (int i = 0; i < 3; i++)
                memset(p[i], 0x11 * (i + 1), size[i]);
        for (int i = 0; i < 3; i++)
                REQUIRE(all_bytes(p[i], size[i], (unsigned char)(0x11 * (i + 1))));
        /* a second mapping of one buffer is the same pages, and stops at its end */
        {
                unsigned char *q = NULL;

                REQUIRE_RC(map_cpu(&f, f.render[0], off[1], PAGE, &q), 0);
                q[7] = 0x77;
                REQUIRE(p[1][7] == 0x77);
                REQUIRE(munmap(q, PAGE) == 0);
                REQUIRE_RC(map_cpu(&f, f.render[0], off[1], 2 * PAGE, &q), -EINVAL);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.backing_resident_bytes >= 6 * PAGE);
        for (int i = 0; i < 3; i++) {
                REQUIRE(munmap(p[i], size[i]) == 0);
                REQUIRE_RC(free_bo(&f, f.kfd, h[i]), 0);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.carved_bytes == 0 && s.backing_resident_bytes == 0 && s.backing_extent_bytes == 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* A freed carve-out is punched out (its memory goes back) and given to the next buffer, wiped. */
int test_carve_free(void)
{
        Fx f;
        uint64_t keep = 0, h = 0, off = 0, extent;
        unsigned char *p = NULL;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        /* a buffer that stays, so the backing file is never empty and keeps its offsets */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_PRIV, &keep, NULL), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, 4 * PAGE, VRAM_PRIV, &h, &off), 0);
        REQUIRE_RC(map_cpu(&f, f.render[0], off, 4 * PAGE, &p), 0);
        memset(p, 0xa5, 4 * PAGE);
        REQUIRE(munmap(p, 4 * PAGE) == 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.carved_bytes == 5 * PAGE && s.backing_resident_bytes >= 4 * PAGE);
        extent = s.backing_extent_bytes;
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.carved_bytes == PAGE && s.backing_resident_bytes == 0);
        REQUIRE(s.backing_extent_bytes == extent);
        /* the same offsets again, with nothing of the old bytes */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, 4 * PAGE, VRAM_PRIV, &h, &off), 0);
        REQUIRE_RC(map_cpu(&f, f.render[0], off, 4 * PAGE, &p), 0);
        REQUIRE(all_bytes(p, 4 * PAGE, 0));
        REQUIRE(munmap(p, 4 * PAGE) == 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        /* many allocations and frees reuse what was freed: once each size had a block, the file does not
         * grow */
        for (int i = 0; i < 4; i++) {
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, (uint64_t)(1 + i) * PAGE, VRAM_PRIV, &h, NULL),
                           0);
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.backing_extent_bytes > extent);
        extent = s.backing_extent_bytes;
        for (int i = 0; i < 1000; i++) {
                REQUIRE_RC(
                        alloc_bo(&f, f.kfd, G0, 0x200000, (uint64_t)(1 + i % 4) * PAGE, VRAM_PRIV, &h, NULL),
                        0);
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.backing_extent_bytes == extent && s.carved_bytes == PAGE);
        /* the last buffer out empties the file */
        REQUIRE_RC(free_bo(&f, f.kfd, keep), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.backing_extent_bytes == 0 && s.carved_bytes == 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int export_bo(Fx *f, uint64_t handle, int *ret_fd)
{
        struct kfd_ioctl_export_dmabuf_args ex = {.handle = handle, .flags = O_CLOEXEC};
        int r = io(f, f->kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex);

        if (r == 0)
                *ret_fd = (int)ex.dmabuf_fd;
        return r;
}

/* Exporting a carved buffer moves it to a file of its own with its bytes: the fd shows that buffer only. */
int test_carve_export(void)
{
        Fx f;
        uint64_t ha = 0, hb = 0, hp = 0, offa = 0, offb = 0;
        unsigned char *pa = NULL, *pb = NULL, *q = NULL;
        struct stat st;
        ThunkModelStats s;
        int fd = -1;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, 2 * PAGE, VRAM_PRIV, &ha, &offa), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, 2 * PAGE, VRAM_PRIV, &hb, &offb), 0);
        REQUIRE_RC(map_cpu(&f, f.render[0], offa, 2 * PAGE, &pa), 0);
        REQUIRE_RC(map_cpu(&f, f.render[0], offb, 2 * PAGE, &pb), 0);
        memset(pa, 0x3c, PAGE); /* the second page of a stays a hole */
        memset(pb, 0xc3, 2 * PAGE);
        /* a mapping of its carve-out would not follow the move: refused while one is left */
        REQUIRE_RC(export_bo(&f, ha, &fd), -EBUSY);
        REQUIRE(munmap(pa, 2 * PAGE) == 0);
        REQUIRE_RC(export_bo(&f, ha, &fd), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.buffer_files == 1 && s.carved_bytes == 2 * PAGE);
        /* the dmabuf is a's bytes and nothing else: its own file, of its size */
        REQUIRE(fstat(fd, &st) == 0 && (uint64_t)st.st_size == 2 * PAGE);
        q = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        REQUIRE(q != MAP_FAILED);
        REQUIRE(all_bytes(q, PAGE, 0x3c) && all_bytes(q + PAGE, PAGE, 0));
        /* the render fd now maps the same file: a write through the dmabuf shows there */
        q[PAGE + 1] = 0x99;
        REQUIRE(munmap(q, 2 * PAGE) == 0);
        REQUIRE_RC(map_cpu(&f, f.render[0], offa, 2 * PAGE, &pa), 0);
        REQUIRE(pa[PAGE + 1] == 0x99 && pa[0] == 0x3c);
        /* b kept its bytes in the backing file; a second export of a is the same file again */
        REQUIRE(all_bytes(pb, 2 * PAGE, 0xc3));
        {
                int fd2 = -1;
                struct stat st2;

                REQUIRE_RC(export_bo(&f, ha, &fd2), 0);
                REQUIRE(fstat(fd2, &st2) == 0 && st2.st_ino == st.st_ino);
                close(fd2);
        }
        /* an import of the export is the same buffer */
        {
                struct kfd_ioctl_import_dmabuf_args im = {
                        .va_addr = 0x400000, .gpu_id = G1, .dmabuf_fd = (uint32_t)fd};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), 0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.bufs == 2 && s.imports == 1);
                REQUIRE_RC(free_bo(&f, f.kfd, im.handle), 0);
        }
        /* host-visible VRAM has its own file from the start */
        REQUIRE_RC(
                alloc_bo(&f, f.kfd, G0, 0x800000, PAGE, VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, &hp, NULL),
                0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.buffer_files == 2 && s.carved_bytes == 2 * PAGE);
        REQUIRE_RC(free_bo(&f, f.kfd, hp), 0);
        REQUIRE(munmap(pa, 2 * PAGE) == 0);
        REQUIRE(munmap(pb, 2 * PAGE) == 0);
        close(fd);
        REQUIRE_RC(free_bo(&f, f.kfd, ha), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, hb), 0);
        REQUIRE_RC(fx_teardown(&f), 0);

        /* file_per_buffer: every buffer gets its file at allocation, and exports while it is mapped */
        {
                ThunkModelOptions o = {.kfd_minor = 19, .file_per_buffer = true};
                ThunkModel *m = NULL;
                ThunkTopology *t = topo_make(3, std_gpus, 64 * GiB);
                Fx g;

                memset(&g, 0, sizeof(g));
                REQUIRE_RC(thunk_model_new(t, &o, &m), 0);
                topo_free(t);
                g.m = m;
                thunk_model_seam(m, &g.seam);
                REQUIRE_RC(g.seam.ops->open_kfd(g.seam.impl, &g.kfd), 0);
                REQUIRE_RC(g.seam.ops->open_render(g.seam.impl, 128, &g.render[0]), 0);
                REQUIRE_RC(fx_acquire(&g, g.kfd, g.render[0], G0), 0);
                REQUIRE_RC(alloc_bo(&g, g.kfd, G0, 0x100000, PAGE, VRAM_PRIV, &ha, &offa), 0);
                REQUIRE_RC(map_cpu(&g, g.render[0], offa, PAGE, &pa), 0);
                pa[0] = 5;
                REQUIRE_RC(export_bo(&g, ha, &fd), 0);
                q = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
                REQUIRE(q != MAP_FAILED && q[0] == 5);
                thunk_model_get_stats(m, &s);
                REQUIRE(s.buffer_files == 1 && s.carved_bytes == 0);
                REQUIRE(munmap(q, PAGE) == 0 && munmap(pa, PAGE) == 0);
                close(fd);
                REQUIRE_RC(free_bo(&g, g.kfd, ha), 0);
                thunk_model_free(m);
        }
        return 0;
}

/* Carved buffers cost the process no fd: its count stays flat over many live allocations. */
int test_carve_fds(void)
{
        enum { N = 5000 };
        static uint64_t h[N];
        const uint32_t ids[] = {G0};
        ThunkModelStats s;
        Fx f;
        int before;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        before = count_fds(0);
        REQUIRE(before > 0);
        for (int i = 0; i < N; i++) {
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x10000000 + (uint64_t)i * 2 * PAGE, PAGE, VRAM_PRIV,
                                    &h[i], NULL),
                           0);
                REQUIRE_RC(map_bo(&f, f.kfd, true, h[i], ids, 1, NULL), 0);
        }
        REQUIRE(count_fds(0) == before);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.bufs == N && s.buffer_files == 0 && s.carved_bytes == N * PAGE && s.mappings == N);
        /* unmapped and freed out of order (7919 is prime to N): the VM stays exact throughout */
        for (int k = 0; k < N; k++) {
                int i = (int)(((uint64_t)k * 7919) % N);

                REQUIRE_RC(map_bo(&f, f.kfd, false, h[i], ids, 1, NULL), 0);
                REQUIRE_RC(free_bo(&f, f.kfd, h[i]), 0);
                h[i] = 0;
                if (k == N / 2) {
                        uint64_t x = 0;
                        int live = i + 1 < N && h[i + 1] ? i + 1 : -1;

                        /* where a freed one was is free; where a live one is, is not */
                        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x10000000 + (uint64_t)i * 2 * PAGE, PAGE,
                                            VRAM_PRIV, &x, NULL),
                                   0);
                        REQUIRE_RC(map_bo(&f, f.kfd, true, x, ids, 1, NULL), 0);
                        REQUIRE_RC(map_bo(&f, f.kfd, false, x, ids, 1, NULL), 0);
                        REQUIRE_RC(free_bo(&f, f.kfd, x), 0);
                        if (live >= 0) {
                                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x10000000 + (uint64_t)live * 2 * PAGE,
                                                    PAGE, VRAM_PRIV, &x, NULL),
                                           0);
                                REQUIRE_RC(map_bo(&f, f.kfd, true, x, ids, 1, NULL), -EINVAL);
                                REQUIRE_RC(free_bo(&f, f.kfd, x), 0);
                        }
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == N - (uint64_t)k - 1);
                }
        }
        REQUIRE(count_fds(0) == before);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}
