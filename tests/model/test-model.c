/* Tests of the KFD model, driven through the seam with the kernel's ioctl structs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>
#include <linux/kfd_sysfs.h>

#include "../common/check.h"
#include "config.h"
#include "kfd-compat.h"
#include "model.h"

#define PAGE   4096ULL
#define MiB    (1ULL << 20)
#define GiB    (1ULL << 30)
#define SVM_VA 0x7f0000000000ULL

/* ------------------------------------------------------------------ hand-made topologies */

typedef struct GpuSpec {
        uint32_t gpu_id;
        uint64_t vram;
        uint32_t heap; /* FB_PUBLIC (large BAR) or FB_PRIVATE (small BAR); 0 with vram 0 = APU */
        uint64_t hive;
        uint32_t gfx;
        bool svm;
} GpuSpec;

static void topo_free(ThunkTopology *t)
{
        for (size_t i = 0; i < t->n_nodes; i++)
                free(t->nodes[i].mem_banks);
        free(t->nodes);
        free(t);
}

static ThunkTopology *topo_make(size_t n, const GpuSpec *g, uint64_t ram)
{
        ThunkTopology *t = calloc(1, sizeof(*t));

        t->n_nodes = n + 1;
        t->n_gpus = n;
        t->nodes = calloc(n + 1, sizeof(*t->nodes));
        t->nodes[0].cpu_cores_count = 16;
        t->nodes[0].mem_banks = calloc(1, sizeof(ThunkMemBank));
        t->nodes[0].n_mem_banks = 1;
        t->nodes[0].mem_banks[0].heap_type = HSA_MEM_HEAP_TYPE_SYSTEM;
        t->nodes[0].mem_banks[0].size_in_bytes = ram;
        for (size_t i = 0; i < n; i++) {
                ThunkNode *nd = &t->nodes[i + 1];

                nd->node_id = (uint32_t)i + 1;
                nd->gpu_id = g[i].gpu_id;
                nd->is_gpu = true;
                nd->simd_count = 104;
                nd->drm_render_minor = 128 + (uint32_t)i;
                nd->hive_id = g[i].hive;
                nd->gfx_target_version = g[i].gfx;
                nd->capability = g[i].svm ? HSA_CAP_SVMAPI_SUPPORTED : 0;
                if (g[i].vram) {
                        nd->mem_banks = calloc(1, sizeof(ThunkMemBank));
                        nd->n_mem_banks = 1;
                        nd->mem_banks[0].heap_type = g[i].heap;
                        nd->mem_banks[0].size_in_bytes = g[i].vram;
                }
        }
        return t;
}

/* Two large-BAR GPUs (one hive), one small-BAR GPU, all SVM capable; 64 GiB RAM. */
static const GpuSpec std_gpus[] = {
        {0x1111, 16 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0xabc, 90010, true},
        {0x2222, 16 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0xabc, 90010, true},
        {0x3333, 8 * GiB, HSA_MEM_HEAP_TYPE_FB_PRIVATE, 0, 90010, true},
};
#define G0 0x1111u
#define G1 0x2222u
#define G2 0x3333u

/* ------------------------------------------------------------------ fixture */

typedef struct Fx {
        ThunkModel *m;
        ThunkSeam seam;
        int kfd;
        int render[3];
        size_t n_gpus;
        ThunkModelStats empty;
} Fx;

static int io(Fx *f, int fd, unsigned long req, void *arg)
{
        return f->seam.ops->ioctl(f->seam.impl, fd, req, arg);
}

static int fx_acquire(Fx *f, int kfd, int render, uint32_t gpu_id)
{
        struct kfd_ioctl_acquire_vm_args a = {.drm_fd = (uint32_t)render, .gpu_id = gpu_id};

        return io(f, kfd, AMDKFD_IOC_ACQUIRE_VM, &a);
}

/* A model over @t (freed here), a kfd fd, one render fd per GPU, every VM acquired if @acquire. */
static int fx_setup_topo(Fx *f, ThunkTopology *t, uint32_t minor, bool acquire)
{
        ThunkModelOptions o = {.kfd_minor = minor};
        int r;

        memset(f, 0, sizeof(*f));
        r = thunk_model_new(t, &o, &f->m);
        f->n_gpus = t->n_gpus;
        topo_free(t);
        if (r < 0)
                return r;
        thunk_model_seam(f->m, &f->seam);
        thunk_model_get_stats(f->m, &f->empty);
        r = f->seam.ops->open_kfd(f->seam.impl, &f->kfd);
        if (r < 0)
                return r;
        for (size_t i = 0; i < f->n_gpus && i < 3; i++) {
                r = f->seam.ops->open_render(f->seam.impl, 128 + (uint32_t)i, &f->render[i]);
                if (r < 0)
                        return r;
                if (acquire) {
                        r = fx_acquire(f, f->kfd, f->render[i], std_gpus[i].gpu_id);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int fx_setup(Fx *f, uint32_t minor)
{
        return fx_setup_topo(f, topo_make(3, std_gpus, 64 * GiB), minor, true);
}

/* Closes everything and checks the model is back to its empty state. */
static int fx_teardown(Fx *f)
{
        ThunkModelStats s;

        REQUIRE_RC(f->seam.ops->close(f->seam.impl, f->kfd), 0);
        for (size_t i = 0; i < f->n_gpus && i < 3; i++)
                REQUIRE_RC(f->seam.ops->close(f->seam.impl, f->render[i]), 0);
        thunk_model_get_stats(f->m, &s);
        REQUIRE(memcmp(&s, &f->empty, sizeof(s)) == 0);
        f->m = thunk_model_free(f->m);
        return 0;
}

static int alloc_bo(Fx *f, int kfd, uint32_t gpu, uint64_t va, uint64_t size, uint32_t flags,
                    uint64_t *handle, uint64_t *offset)
{
        struct kfd_ioctl_alloc_memory_of_gpu_args a = {.va_addr = va,
                                                       .size = size,
                                                       .gpu_id = gpu,
                                                       .flags = flags,
                                                       .mmap_offset = offset ? *offset : 0};
        int r = io(f, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a);

        if (r == 0) {
                *handle = a.handle;
                if (offset)
                        *offset = a.mmap_offset;
        }
        return r;
}

static int free_bo(Fx *f, int kfd, uint64_t handle)
{
        struct kfd_ioctl_free_memory_of_gpu_args a = {.handle = handle};

        return io(f, kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &a);
}

static int map_bo(Fx *f, int kfd, bool map, uint64_t handle, const uint32_t *ids, uint32_t n,
                  uint32_t *n_success)
{
        struct kfd_ioctl_map_memory_to_gpu_args a = {.handle = handle,
                                                     .device_ids_array_ptr = (uintptr_t)ids,
                                                     .n_devices = n,
                                                     .n_success = n_success ? *n_success : 0};
        int r = io(f, kfd, map ? AMDKFD_IOC_MAP_MEMORY_TO_GPU : AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, &a);

        if (n_success)
                *n_success = a.n_success;
        return r;
}

static uint64_t avail(Fx *f, uint32_t gpu)
{
        struct kfd_ioctl_get_available_memory_args a = {.gpu_id = gpu};

        if (io(f, f->kfd, AMDKFD_IOC_AVAILABLE_MEMORY, &a) < 0)
                return ~0ULL;
        return a.available;
}

#define VRAM_RW (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)
#define GTT_RW  (KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)

/* ------------------------------------------------------------------ tests */

static int test_version(void)
{
        static const uint32_t minors[] = {11, 15, 19, 0};

        for (size_t i = 0; i < 4; i++) {
                Fx f;
                struct kfd_ioctl_get_version_args v;

                REQUIRE_RC(fx_setup(&f, minors[i]), 0);
                memset(&v, 0xff, sizeof(v));
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_VERSION, &v), 0);
                REQUIRE(v.major_version == 1);
                REQUIRE(v.minor_version == (minors[i] ? minors[i] : 19));
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        {
                ThunkModel *m = NULL;
                ThunkTopology *t = topo_make(1, std_gpus, 8 * GiB);
                ThunkModelOptions o = {.kfd_minor = 10};

                REQUIRE_RC(thunk_model_new(t, &o, &m), -EINVAL);
                o.kfd_minor = 20;
                REQUIRE_RC(thunk_model_new(t, &o, &m), -EINVAL);
                REQUIRE(m == NULL);
                t->n_gpus = 0;
                REQUIRE_RC(thunk_model_new(t, NULL, &m), -EINVAL);
                topo_free(t);
        }
        return 0;
}

static int test_dispatch(void)
{
        Fx f;
        struct kfd_ioctl_export_dmabuf_args ex = {0};
        uint64_t buf[4] = {0};

        REQUIRE_RC(fx_setup(&f, 11), 0);
        /* outside the table: -ENOTTY, as kfd_ioctl answers since it says which ioctls a kernel lacks */
        REQUIRE_RC(io(&f, f.kfd, _IOWR('K', 0x60, uint64_t), buf), -ENOTTY);
        REQUIRE_RC(io(&f, f.kfd, _IOWR('K', 0x00, uint64_t), buf), -ENOTTY);
        REQUIRE_RC(io(&f, f.kfd, _IOWR('K', 0x82, uint64_t[5]), buf), -ENOTTY);
        /* in the table but not modelled (the old debugger interface) */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DBG_REGISTER_DEPRECATED, buf), -EOPNOTSUPP);
        /* 1.11 has no EXPORT_DMABUF, RUNTIME_ENABLE, CREATE_PROCESS */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), -ENOTTY);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_PROCESS, NULL), -ENOTTY);
        /* another driver's request on the kfd fd, a KFD request on a render fd */
        REQUIRE_RC(io(&f, f.kfd, DRM_IOCTL_GEM_CLOSE, buf), -ENOTTY);
        REQUIRE_RC(io(&f, f.render[0], AMDKFD_IOC_GET_VERSION, buf), -ENOTTY);
        /* unknown DRM request: -EINVAL like the DRM core */
        REQUIRE_RC(io(&f, f.render[0], DRM_IOWR(0x7e, uint64_t), buf), -EINVAL);
        /* fds the model does not know */
        REQUIRE_RC(io(&f, 0, AMDKFD_IOC_GET_VERSION, buf), -EBADF);
        REQUIRE_RC(io(&f, 12345, AMDKFD_IOC_GET_VERSION, buf), -EBADF);
        REQUIRE(thunk_model_owns_fd(f.m, f.kfd));
        REQUIRE(!thunk_model_owns_fd(f.m, 1));
        REQUIRE(f.kfd > 2 && (fcntl(f.kfd, F_GETFD) & FD_CLOEXEC));
        REQUIRE(f.render[0] > 2 && (fcntl(f.render[0], F_GETFD) & FD_CLOEXEC));
        /* an unknown render minor does not exist */
        {
                int fd = -1;

                REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 200, &fd), -ENOENT);
                REQUIRE(fd == -1);
        }
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, 12345), -EBADF);
        REQUIRE_RC(fx_teardown(&f), 0);

        REQUIRE_RC(fx_setup(&f, 15), 0);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_PROCESS, NULL), -ENOTTY);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* _IOC_SIZE decides how much is copied: smaller structs are zero-extended, larger ones partly ignored. */
static int test_struct_sizes(void)
{
        Fx f;
        unsigned char b[64];
        struct kfd_ioctl_get_available_memory_args *am = (void *)b;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        /* a 24-byte GET_VERSION: only 8 bytes are answered, the rest stays as the caller left it */
        memset(b, 0xab, sizeof(b));
        REQUIRE_RC(io(&f, f.kfd, _IOC(_IOC_READ, 'K', 0x01, 24), b), 0);
        REQUIRE(((uint32_t *)b)[0] == 1 && ((uint32_t *)b)[1] == 19);
        REQUIRE(b[8] == 0 && b[23] == 0 && b[24] == 0xab);
        /* a 12-byte AVAILABLE_MEMORY (no pad): copy-out stops at 12 bytes */
        memset(b, 0xcd, sizeof(b));
        am->gpu_id = G0;
        REQUIRE_RC(io(&f, f.kfd, _IOC(_IOC_READ | _IOC_WRITE, 'K', 0x23, 12), b), 0);
        REQUIRE(am->available > 0 && am->gpu_id == G0);
        REQUIRE(b[12] == 0xcd);
        /* a 4-byte ALLOC: everything past the va is zero, so size 0 -> -EINVAL */
        REQUIRE_RC(io(&f, f.kfd, _IOC(_IOC_READ | _IOC_WRITE, 'K', 0x16, 4), b), -EINVAL);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_VERSION, NULL), -EFAULT);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_apertures(void)
{
        Fx f;
        struct kfd_process_device_apertures ap[4];
        struct kfd_ioctl_get_process_apertures_new_args a = {0};
        struct kfd_ioctl_get_process_apertures_args old;

        REQUIRE_RC(fx_setup_topo(&f, topo_make(3, std_gpus, 64 * GiB), 19, false), 0);
        /* works before ACQUIRE_VM; 0 nodes = count only */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), 0);
        REQUIRE(a.num_of_nodes == 3);
        memset(ap, 0xee, sizeof(ap));
        a.kfd_process_device_apertures_ptr = (uintptr_t)ap;
        a.num_of_nodes = 2;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), 0);
        REQUIRE(a.num_of_nodes == 2);
        REQUIRE(ap[0].gpu_id == G0 && ap[1].gpu_id == G1);
        REQUIRE(ap[2].gpu_id == 0xeeeeeeee);
        REQUIRE(ap[0].lds_base == 1ULL << 48 && ap[0].lds_limit == ((1ULL << 48) | 0xffffffffULL));
        REQUIRE(ap[0].scratch_base == 2ULL << 48 && ap[0].scratch_limit == ((2ULL << 48) | 0xffffffffULL));
        REQUIRE(ap[0].gpuvm_base == 64 * 1024 && ap[0].gpuvm_limit == 0x7FFFFFFFFFFFULL);
        a.num_of_nodes = 8;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), 0);
        REQUIRE(a.num_of_nodes == 3 && ap[2].gpu_id == G2);
        a.kfd_process_device_apertures_ptr = 0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), -EFAULT);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES, &old), 0);
        REQUIRE(old.num_of_nodes == 3 && old.process_apertures[1].gpu_id == G1);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_acquire_vm(void)
{
        Fx f;
        int other = -1, kfd2 = -1;

        REQUIRE_RC(fx_setup_topo(&f, topo_make(3, std_gpus, 64 * GiB), 19, false), 0);
        /* before the VM: SET_MEMORY_POLICY cannot bind the process to the GPU (-ESRCH, not -ENODEV) */
        {
                struct kfd_ioctl_set_memory_policy_args mp = {.gpu_id = G0};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_MEMORY_POLICY, &mp), -ESRCH);
                mp.gpu_id = 0x9999;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_MEMORY_POLICY, &mp), -EINVAL);
        }
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], 0x9999), -EINVAL);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.kfd, G0), -EINVAL);       /* not a render fd */
        REQUIRE_RC(fx_acquire(&f, f.kfd, 1, G0), -EINVAL);           /* not ours at all */
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[1], G0), -EINVAL); /* another GPU's node */
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], G0), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], G0), 0); /* same file: idempotent */
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 128, &other), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, other, G0), -EBUSY);
        /* a second kfd fd of the process is the same context */
        REQUIRE_RC(f.seam.ops->open_kfd(f.seam.impl, &kfd2), 0);
        REQUIRE_RC(fx_acquire(&f, kfd2, f.render[0], G0), 0);
        /* a secondary context cannot take a VM that is already a compute VM */
        REQUIRE_RC(io(&f, kfd2, AMDKFD_IOC_CREATE_PROCESS, NULL), 0);
        REQUIRE_RC(fx_acquire(&f, kfd2, f.render[0], G0), -EINVAL);
        REQUIRE_RC(fx_acquire(&f, kfd2, other, G0), 0);
        /* the acquired file outlives its fd */
        {
                ThunkModelStats s;

                REQUIRE_RC(f.seam.ops->close(f.seam.impl, other), 0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.render_fds == 3 && s.render_files == 4 && s.contexts == 2 && s.kfd_fds == 2);
        }
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, kfd2), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_alloc_errors(void)
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

static int test_handles(void)
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

static int test_free_errors(void)
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

static int test_map_errors(void)
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
static int test_map_resume(void)
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

static int test_available_and_limits(void)
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
static int test_mmap_data(void)
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

static int send_fd(int sock, int fd)
{
        char c = 'x';
        struct iovec iov = {.iov_base = &c, .iov_len = 1};
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        struct msghdr msg = {
                .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        return sendmsg(sock, &msg, 0) == 1 ? 0 : -errno;
}

static int recv_fd(int sock)
{
        char c;
        struct iovec iov = {.iov_base = &c, .iov_len = 1};
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        struct msghdr msg = {
                .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
        struct cmsghdr *cm;
        int fd;

        if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1)
                return -1;
        cm = CMSG_FIRSTHDR(&msg);
        if (!cm || cm->cmsg_type != SCM_RIGHTS)
                return -1;
        memcpy(&fd, CMSG_DATA(cm), sizeof(int));
        return fd;
}

/* Child side: receive a dmabuf fd, map it, check the pattern, write an answer into the second page. */
static int child_check(int sock, size_t len)
{
        int fd = recv_fd(sock);
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

static int test_dmabuf(void)
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
        REQUIRE_RC(send_fd(sv[0], (int)ex.dmabuf_fd), 0);
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
static int test_dmabuf_foreign(void)
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

static int svm_call(Fx *f, int kfd, uint32_t op, uint64_t start, uint64_t size,
                    struct kfd_ioctl_svm_attribute *at, uint32_t n)
{
        uint64_t buf[1 + 3 + 32];
        struct kfd_ioctl_svm_args *a = (void *)buf;
        int r;

        memset(buf, 0, sizeof(buf));
        a->start_addr = start;
        a->size = size;
        a->op = op;
        a->nattr = n;
        memcpy(a->attrs, at, n * sizeof(*at));
        r = io(f, kfd, thunk_kfd_svm_request(n), a);
        memcpy(at, a->attrs, n * sizeof(*at));
        return r;
}

static int svm_get1(Fx *f, uint64_t start, uint64_t size, uint32_t type, uint32_t value, uint32_t *ret_type,
                    uint32_t *ret_value)
{
        struct kfd_ioctl_svm_attribute at = {type, value};
        int r = svm_call(f, f->kfd, KFD_IOCTL_SVM_OP_GET_ATTR, start, size, &at, 1);

        if (ret_type)
                *ret_type = at.type;
        if (ret_value)
                *ret_value = at.value;
        return r;
}

static int test_svm(void)
{
        Fx f;
        const size_t len = 64 * PAGE;
        unsigned char *p;
        uint64_t base;
        uint32_t t, v;
        ThunkModelStats s;
        struct kfd_ioctl_svm_attribute at[4];

        REQUIRE_RC(fx_setup(&f, 19), 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        base = (uintptr_t)p;

        /* defaults before any range exists (XNACK off: no access) */
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, &v), 0);
        REQUIRE(v == KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0, NULL, &v), 0);
        REQUIRE(v == (KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT));
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, &v), 0);
        REQUIRE(v == 9);
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_ACCESS, G0, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_NO_ACCESS);

        /* one range over 16 pages; XNACK off charges the system limit */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, G0};
        at[1] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_ACCESS, G1};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base + 8 * PAGE, 16 * PAGE, at, 2), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 1 && s.system_used == 16 * PAGE);
        /* a second set from page 12 to 30: [8,12) keeps the old attributes, [12,24) changes, [24,30) is new
         */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, G1};
        at[1] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_SET_FLAGS, KFD_IOCTL_SVM_FLAG_GPU_RO};
        at[2] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_GRANULARITY, 2};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base + 12 * PAGE, 18 * PAGE, at, 3), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 3 && s.system_used == 22 * PAGE);
        REQUIRE_RC(svm_get1(&f, base + 12 * PAGE, 8 * PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE);
        REQUIRE_RC(svm_get1(&f, base + 8 * PAGE, 4 * PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS);
        REQUIRE_RC(svm_get1(&f, base + 20 * PAGE, 4 * PAGE, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, &v),
                   0);
        REQUIRE(v == G0);
        /* GET over mixed ranges: locations differ -> UNDEFINED, flags AND / NOT-OR, granularity min */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0};
        at[1] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
        at[2] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_CLR_FLAGS, 0};
        at[3] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_GRANULARITY, 0};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_GET_ATTR, base + 8 * PAGE, 22 * PAGE, at, 4), 0);
        REQUIRE(at[0].value == KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        REQUIRE(at[1].value == (KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT));
        REQUIRE(at[2].value == ~(uint32_t)(KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT |
                                           KFD_IOCTL_SVM_FLAG_GPU_RO));
        REQUIRE(at[3].value == 2);
        REQUIRE_RC(svm_get1(&f, base + 8 * PAGE, 22 * PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_NO_ACCESS); /* neither bit set on every range */

        /* attribute validation */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_ACCESS, 0x7777};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base, PAGE, at, 1), -EINVAL);
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFETCH_LOC,
                                                 KFD_IOCTL_SVM_LOCATION_UNDEFINED};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base, PAGE, at, 1), -EINVAL);
        at[0] = (struct kfd_ioctl_svm_attribute){99, 0};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base, PAGE, at, 1), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, G0, NULL, NULL), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, PAGE, KFD_IOCTL_SVM_ATTR_NO_ACCESS, G0, NULL, NULL), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, 0x7777, NULL, NULL), -EINVAL);
        /* range validation */
        REQUIRE_RC(svm_get1(&f, base + 1, PAGE, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, NULL), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, 0, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, NULL), -EINVAL);
        REQUIRE_RC(
                svm_get1(&f, base, len + 1024 * PAGE * 1024, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, NULL),
                -EFAULT);
        /* GET checks the range before its attributes (SET the other way round) */
        REQUIRE_RC(svm_get1(&f, base, len + 1024 * PAGE * 1024, KFD_IOCTL_SVM_ATTR_NO_ACCESS, G0, NULL, NULL),
                   -EFAULT);
        {
                struct kfd_ioctl_svm_args a = {.start_addr = base, .size = PAGE, .op = 7};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SVM, &a), -EINVAL);
                a.op = KFD_IOCTL_SVM_OP_GET_ATTR;
                a.nattr = 1; /* claims an attribute the size field does not carry */
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SVM, &a), -EINVAL);
        }
        /* SVM and KFD BOs exclude each other */
        {
                uint64_t h = 0;
                uint32_t ids[] = {G0};

                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, base + 10 * PAGE, PAGE, VRAM_RW, &h, NULL), -EADDRINUSE);
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, base + 40 * PAGE, PAGE, VRAM_RW, &h, NULL), 0);
                REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 1, NULL), 0);
                at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base + 36 * PAGE, 8 * PAGE, at, 1),
                           -EADDRINUSE);
                /* and GET refuses the range as SET does */
                REQUIRE_RC(svm_get1(&f, base + 36 * PAGE, 8 * PAGE, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL,
                                    NULL),
                           -EADDRINUSE);
                REQUIRE_RC(svm_get1(&f, base + 36 * PAGE, 8 * PAGE, KFD_IOCTL_SVM_ATTR_NO_ACCESS, G0, NULL,
                                    NULL),
                           -EADDRINUSE);
                REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids, 1, NULL), 0);
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        }
        /* munmap of part of a range splits it and refunds the charge */
        REQUIRE(munmap(p + 14 * PAGE, 2 * PAGE) == 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 4 && s.system_used == 20 * PAGE);
        REQUIRE(munmap(p, len) == 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 0 && s.system_used == 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_svm_limits(void)
{
        Fx f;
        const size_t len = 8 * PAGE;
        unsigned char *p;
        struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};

        /* the system-memory option: 2 GiB of RAM leave (2 GiB - 32 MiB) / 2 for KFD */
        {
                ThunkTopology *t = topo_make(1, std_gpus, 64 * GiB);
                ThunkModelOptions o = {.system_memory_bytes = 2 * GiB};
                ThunkModel *m = NULL;
                ThunkSeam seam;
                int kfd, render;
                struct kfd_ioctl_acquire_vm_args acq = {.gpu_id = G0};
                struct kfd_ioctl_alloc_memory_of_gpu_args al = {
                        .va_addr = 0x100000, .gpu_id = G0, .flags = GTT_RW};

                REQUIRE_RC(thunk_model_new(t, &o, &m), 0);
                topo_free(t);
                thunk_model_seam(m, &seam);
                REQUIRE_RC(seam.ops->open_kfd(seam.impl, &kfd), 0);
                REQUIRE_RC(seam.ops->open_render(seam.impl, 128, &render), 0);
                acq.drm_fd = (uint32_t)render;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ACQUIRE_VM, &acq), 0);
                al.size = (2 * GiB - (2 * GiB >> 6)) / 2 + PAGE;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), -ENOMEM);
                al.size -= PAGE;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), 0);
                thunk_model_free(m);
        }
        REQUIRE_RC(fx_setup(&f, 19), 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        REQUIRE(p != MAP_FAILED);
        {
                uint64_t big = 63 * GiB;
                void *q = mmap(NULL, big, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                ThunkModelStats s;

                REQUIRE(q != MAP_FAILED);
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)q, big, &at, 1),
                           -ENOMEM);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.svm_ranges == 0 && s.system_used == 0);
                REQUIRE(munmap(q, big) == 0);
        }
        REQUIRE(munmap(p, len) == 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_xnack(void)
{
        Fx f;
        struct kfd_ioctl_set_xnack_mode_args x = {-1};
        const size_t len = 4 * PAGE;
        unsigned char *p;
        ThunkModelStats s;
        struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
        uint32_t t;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        REQUIRE(x.xnack_enabled == 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)p, len, &at, 1), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == len);
        /* XNACK on: charges go away, new defaults grant access */
        x.xnack_enabled = 1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == 0);
        REQUIRE_RC(svm_get1(&f, PAGE, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G0, &t, NULL), -EFAULT);
        REQUIRE_RC(svm_get1(&f, (uintptr_t)p, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G0, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_NO_ACCESS); /* an existing range keeps what it had */
        {
                void *q = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

                REQUIRE(q != MAP_FAILED);
                REQUIRE_RC(svm_get1(&f, (uintptr_t)q, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G2, &t, NULL), 0);
                REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS); /* defaults under XNACK: every SVM GPU */
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)q, PAGE, &at, 1), 0);
                REQUIRE_RC(svm_get1(&f, (uintptr_t)q, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
                REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.system_used == 0 && s.svm_ranges == 2);
                REQUIRE(munmap(q, PAGE) == 0);
        }
        x.xnack_enabled = -1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        REQUIRE(x.xnack_enabled == 1);
        x.xnack_enabled = 0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == len);
        REQUIRE(munmap(p, len) == 0);
        REQUIRE_RC(fx_teardown(&f), 0);

        /* an RDNA GPU cannot do XNACK: -EPERM */
        {
                GpuSpec navi[] = {{G0, 8 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0, 110000, true}};

                REQUIRE_RC(fx_setup_topo(&f, topo_make(1, navi, 16 * GiB), 19, true), 0);
                x.xnack_enabled = 1;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), -EPERM);
                x.xnack_enabled = 0;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        /* without any SVM GPU a change is -EPERM, but asking for the mode it has is answered first */
        {
                GpuSpec nosvm[] = {{G0, 8 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0, 90010, false}};

                REQUIRE_RC(fx_setup_topo(&f, topo_make(1, nosvm, 16 * GiB), 19, true), 0);
                x.xnack_enabled = 0;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
                x.xnack_enabled = 1;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), -EPERM);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        return 0;
}

static int test_secondary(void)
{
        Fx f;
        int kfd2 = -1, r0 = -1, r1 = -1;
        uint64_t h1 = 0, h2 = 0, off = 0;
        uint32_t ids[] = {G0};
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(f.seam.ops->open_kfd(f.seam.impl, &kfd2), 0);
        REQUIRE_RC(io(&f, kfd2, AMDKFD_IOC_CREATE_PROCESS, NULL), 0);
        REQUIRE_RC(io(&f, kfd2, AMDKFD_IOC_CREATE_PROCESS, NULL), -EINVAL); /* already secondary */
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.contexts == 2);
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 128, &r0), 0);
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 129, &r1), 0);
        REQUIRE_RC(alloc_bo(&f, kfd2, G0, 0x100000, PAGE, VRAM_RW, &h2, NULL), -ENODEV);
        REQUIRE_RC(fx_acquire(&f, kfd2, r0, G0), 0);
        /* own handles from 0, own VM: the same VA maps in both contexts */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h1, NULL), 0);
        REQUIRE_RC(alloc_bo(&f, kfd2, G0, 0x100000, PAGE, VRAM_RW, &h2, NULL), 0);
        REQUIRE(h1 == h2 && h2 == ((uint64_t)G0 << 32));
        REQUIRE_RC(map_bo(&f, f.kfd, true, h1, ids, 1, NULL), 0);
        REQUIRE_RC(map_bo(&f, kfd2, true, h2, ids, 1, NULL), 0);
        /* SVM and USERPTR stay with the primary context */
        {
                struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
                void *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

                REQUIRE(p != MAP_FAILED);
                REQUIRE_RC(svm_call(&f, kfd2, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)p, PAGE, &at, 1),
                           -EOPNOTSUPP);
                off = (uintptr_t)p;
                REQUIRE_RC(alloc_bo(&f, kfd2, G0, 0x300000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h2, &off),
                           -EOPNOTSUPP);
                munmap(p, PAGE);
        }
        /* closing the secondary fd releases its context and everything in it */
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, kfd2), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.contexts == 1 && s.mems == 1 && s.mappings == 1 && s.render_files == 5);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, r0), 0);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, r1), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h1, ids, 1, NULL), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h1), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int gem_va(Fx *f, int fd, uint32_t op, uint32_t handle, uint64_t va, uint64_t off, uint64_t size)
{
        struct drm_amdgpu_gem_va a = {.handle = handle,
                                      .operation = op,
                                      .flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
                                      .va_address = va,
                                      .offset_in_bo = off,
                                      .map_size = size};

        return io(f, fd, DRM_IOCTL_AMDGPU_GEM_VA, &a);
}

/* The ROCr VMM path: VA-less VRAM handle, export, import into the render fd, GEM_VA map, CPU map. */
static int test_gem_va(void)
{
        static const uint32_t minors[] = {11, 15};

        for (size_t i = 0; i < 2; i++) {
                Fx f;
                uint64_t h = 0, hk = 0;
                struct kfd_ioctl_export_dmabuf_args ex;
                struct drm_prime_handle ph = {0};
                union drm_amdgpu_gem_mmap mm = {0};
                ThunkModelStats s;
                unsigned char *p = NULL;
                uint32_t ids[] = {G0};

                REQUIRE_RC(fx_setup(&f, minors[i] < 12 ? 12 : minors[i]), 0);
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, 4 * PAGE, VRAM_RW, &h, NULL), 0);
                ex = (struct kfd_ioctl_export_dmabuf_args){.handle = h, .flags = O_CLOEXEC};
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
                ph.fd = (int)ex.dmabuf_fd;
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph), 0);
                REQUIRE(ph.handle == 1);
                {
                        struct drm_prime_handle again = {.fd = (int)ex.dmabuf_fd};

                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_FD_TO_HANDLE, &again), 0);
                        REQUIRE(again.handle == ph.handle); /* one handle per object per file */
                }
                close((int)ex.dmabuf_fd);
                if (minors[i] < 15) {
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x200000, 0, 4 * PAGE),
                                -EINVAL);
                } else {
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x200000, PAGE,
                                          2 * PAGE),
                                   0);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x201000, 0, PAGE),
                                   -EINVAL);
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x300000, 0, 5 * PAGE),
                                -EINVAL);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x300001, 0, PAGE),
                                   -EINVAL);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x1000, 0, PAGE),
                                   -EINVAL);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, 77, 0x300000, 0, PAGE), -ENOENT);
                        REQUIRE_RC(gem_va(&f, f.render[0], 9, ph.handle, 0x300000, 0, PAGE), -EINVAL);
                        /* a KFD mapping and a GEM_VA mapping share the VM */
                        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x201000, PAGE, VRAM_RW, &hk, NULL), 0);
                        REQUIRE_RC(map_bo(&f, f.kfd, true, hk, ids, 1, NULL), -EINVAL);
                        REQUIRE_RC(free_bo(&f, f.kfd, hk), 0);
                        /* SVM over a GEM_VA mapping is refused too: checked via the VM */
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == 1 && s.gem_handles == 1);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_UNMAP, ph.handle, 0x300000, 0, PAGE),
                                   -ENOENT);
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_UNMAP, ph.handle, 0x200000, 0, 2 * PAGE),
                                0);
                        /* CLEAR trims, REPLACE maps over */
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x400000, 0, 4 * PAGE),
                                0);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_CLEAR, 0, 0x401000, 0, PAGE), 0);
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == 2);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_REPLACE, ph.handle, 0x400000, 0,
                                          4 * PAGE),
                                   0);
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == 1);
                }
                /* CPU view through GEM_MMAP on the same render fd */
                mm.in.handle = ph.handle;
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_MMAP, &mm), 0);
                REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                                            f.render[0], mm.out.addr_ptr, (void **)&p),
                           0);
                p[3] = 9;
                REQUIRE(munmap(p, 4 * PAGE) == 0);
                mm.in.handle = 55;
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_MMAP, &mm), -ENOENT);
                /* HANDLE_TO_FD exports the same pages */
                {
                        struct drm_prime_handle out = {.handle = ph.handle, .flags = DRM_CLOEXEC | DRM_RDWR};

                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_HANDLE_TO_FD, &out), 0);
                        p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, out.fd, 0);
                        REQUIRE(p != MAP_FAILED && p[3] == 9);
                        munmap(p, PAGE);
                        close(out.fd);
                        out.handle = 55;
                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_HANDLE_TO_FD, &out), -ENOENT);
                        out.flags = 0x4;
                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_HANDLE_TO_FD, &out), -EINVAL);
                }
                /* the GEM handle keeps the pages after FREE; GEM_CLOSE takes its mappings along */
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.bufs == 1);
                {
                        struct drm_gem_close gc = {.handle = ph.handle};

                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_GEM_CLOSE, &gc), 0);
                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_GEM_CLOSE, &gc), -EINVAL);
                }
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.bufs == 0 && s.mappings == 0 && s.gem_handles == 0 && s.vram_used[0] == 0);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        return 0;
}

/* A read-only dmabuf file stays read-only in whatever imports it: the KFD import is not writable (its export
 * is read-only again) and GEM_VA refuses a writable mapping of it, as amdgpu does for a read-only BO. */
static int test_read_only_import(void)
{
        Fx f;
        uint64_t h = 0;
        struct kfd_ioctl_export_dmabuf_args ex;
        struct kfd_ioctl_import_dmabuf_args im;
        struct drm_prime_handle ph = {0};
        struct drm_amdgpu_gem_va va = {0};
        char path[64];
        int ro;

        REQUIRE_RC(fx_setup(&f, 15), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, 4 * PAGE, VRAM_RW, &h, NULL), 0);
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = h, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", (int)ex.dmabuf_fd);
        ro = open(path, O_RDONLY | O_CLOEXEC);
        REQUIRE(ro >= 0);
        close((int)ex.dmabuf_fd);
        /* the KFD import of the read-only file exports read-only */
        im = (struct kfd_ioctl_import_dmabuf_args){
                .va_addr = 0x400000, .gpu_id = G0, .dmabuf_fd = (uint32_t)ro};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), 0);
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = im.handle, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        REQUIRE((fcntl((int)ex.dmabuf_fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
        close((int)ex.dmabuf_fd);
        REQUIRE_RC(free_bo(&f, f.kfd, im.handle), 0);
        /* GEM_VA: read-only yes, writable no */
        ph.fd = ro;
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph), 0);
        va = (struct drm_amdgpu_gem_va){.handle = ph.handle,
                                        .operation = AMDGPU_VA_OP_MAP,
                                        .flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
                                        .va_address = 0x200000,
                                        .map_size = 4 * PAGE};
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_VA, &va), -EPERM);
        va.flags = AMDGPU_VM_PAGE_READABLE;
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_VA, &va), 0);
        va.operation = AMDGPU_VA_OP_UNMAP;
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_VA, &va), 0);
        {
                struct drm_gem_close gc = {.handle = ph.handle};
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_GEM_CLOSE, &gc), 0);
        }
        close(ro);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_faults(void)
{
        Fx f;
        uint64_t h[3] = {0};
        ThunkModelStats s0, s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 0, ENOMEM), -EINVAL);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 1, 0), -EINVAL);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 2, ENOSPC), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h[0], NULL), 0);
        thunk_model_get_stats(f.m, &s0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, PAGE, VRAM_RW, &h[1], NULL), -ENOSPC);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(memcmp(&s, &s0, sizeof(s)) == 0); /* nothing changed */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, PAGE, VRAM_RW, &h[1], NULL), 0);
        REQUIRE(h[1] == h[0] + 1);
        /* any size variant of the request counts; FREE -EBUSY injected keeps the handle */
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_FREE_MEMORY_OF_GPU, 1, EBUSY), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h[1]), -EBUSY);
        REQUIRE_RC(free_bo(&f, f.kfd, h[1]), 0);
        /* DRM requests too, and clearing forgets pending faults */
        REQUIRE_RC(thunk_model_inject_fault(f.m, DRM_IOCTL_AMDGPU_GEM_VA, 1, EIO), 0);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_MAP_MEMORY_TO_GPU, 1, EINTR), 0);
        {
                uint32_t ids[] = {G0};

                REQUIRE_RC(map_bo(&f, f.kfd, true, h[0], ids, 1, NULL), -EINTR);
                REQUIRE_RC(map_bo(&f, f.kfd, true, h[0], ids, 1, NULL), 0);
                REQUIRE_RC(map_bo(&f, f.kfd, false, h[0], ids, 1, NULL), 0);
        }
        thunk_model_clear_faults(f.m);
        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, 5, 0x200000, 0, PAGE), -ENOENT);
        for (int i = 0; i < 16; i++)
                REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_SVM, 100, EIO), 0);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_SVM, 100, EIO), -ENOSPC);
        thunk_model_clear_faults(f.m);
        REQUIRE_RC(free_bo(&f, f.kfd, h[0]), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

static int test_two_models(void)
{
        Fx a, b;
        uint64_t ha = 0, hb = 0;
        struct kfd_ioctl_export_dmabuf_args ex;
        struct kfd_ioctl_import_dmabuf_args im;

        REQUIRE_RC(fx_setup(&a, 19), 0);
        REQUIRE_RC(fx_setup(&b, 11), 0);
        REQUIRE(a.kfd != b.kfd);
        REQUIRE_RC(alloc_bo(&a, a.kfd, G0, 0x100000, PAGE, VRAM_RW, &ha, NULL), 0);
        REQUIRE_RC(alloc_bo(&b, b.kfd, G0, 0x100000, PAGE, VRAM_RW, &hb, NULL), 0);
        REQUIRE(ha == hb);
        /* each model knows only its own fds */
        REQUIRE_RC(io(&a, b.kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &hb), -EBADF);
        REQUIRE_RC(fx_acquire(&a, a.kfd, b.render[1], G1), -EBUSY);
        /* the other model's dmabuf is foreign (1.11: refused) */
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = ha, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&a, a.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        im = (struct kfd_ioctl_import_dmabuf_args){
                .va_addr = 0x200000, .gpu_id = G0, .dmabuf_fd = ex.dmabuf_fd};
        REQUIRE_RC(io(&b, b.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), -EINVAL);
        close((int)ex.dmabuf_fd);
        REQUIRE_RC(free_bo(&a, a.kfd, ha), 0);
        REQUIRE_RC(free_bo(&b, b.kfd, hb), 0);
        REQUIRE_RC(fx_teardown(&b), 0);
        REQUIRE_RC(fx_teardown(&a), 0);
        return 0;
}

/* Closing the last kfd fd tears the context down like a process exit; freeing the model closes the rest. */
static int test_teardown(void)
{
        Fx f;
        uint64_t h = 0, h2 = 0, off = 0;
        uint32_t ids[] = {G0, G1};
        ThunkModelStats s;
        int fd;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, MiB, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G1, 0x300000, MiB, GTT_RW, &h2, &off), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h2, ids, 2, NULL), 0);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, f.kfd), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.contexts == 0 && s.mems == 0 && s.bufs == 0 && s.mappings == 0 && s.system_used == 0);
        REQUIRE(s.vram_used[0] == 0 && s.render_files == 3);
        REQUIRE_RC(f.seam.ops->open_kfd(f.seam.impl, &f.kfd), 0);
        REQUIRE_RC(fx_teardown(&f), 0);

        /* thunk_model_free with everything still open */
        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, MiB, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, NULL), 0);
        fd = f.kfd;
        f.m = thunk_model_free(f.m);
        REQUIRE(f.m == NULL);
        REQUIRE(fcntl(fd, F_GETFD) < 0 && errno == EBADF);
        return 0;
}

/* The presets load and behave: the workstation's small BAR refuses PUBLIC VRAM. */
static int test_presets(void)
{
        static const char *names[] = {"mi300x", "mi100", "workstation", "apu", "gfx908"};

        for (size_t i = 0; i < 5; i++) {
                char path[512], err[256] = "";
                ThunkTopology *t = NULL;
                ThunkModel *m = NULL;
                ThunkSeam seam;
                ThunkModelStats s0, s;
                struct kfd_ioctl_get_process_apertures_new_args ap = {0};
                struct kfd_process_device_apertures aps[16];
                int kfd, render;
                const ThunkNode *g;

                snprintf(path, sizeof(path), "%s/%s", GPUMEMD_SOURCE_PRESETDIR, names[i]);
                if (thunk_topology_load(path, &t, err, sizeof(err)) < 0) {
                        fprintf(stderr, "preset %s: %s\n", names[i], err);
                        return 1;
                }
                REQUIRE_RC(thunk_model_new(t, NULL, &m), 0);
                g = thunk_topology_gpu_by_index(t, 0);
                REQUIRE(g != NULL);
                thunk_model_seam(m, &seam);
                thunk_model_get_stats(m, &s0);
                REQUIRE(s0.n_gpus == t->n_gpus);
                REQUIRE_RC(seam.ops->open_kfd(seam.impl, &kfd), 0);
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &ap), 0);
                REQUIRE(ap.num_of_nodes == t->n_gpus && ap.num_of_nodes <= 16);
                ap.kfd_process_device_apertures_ptr = (uintptr_t)aps;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &ap), 0);
                REQUIRE(aps[0].gpu_id == g->gpu_id);
                REQUIRE_RC(seam.ops->open_render(seam.impl, g->drm_render_minor, &render), 0);
                {
                        struct kfd_ioctl_acquire_vm_args acq = {.drm_fd = (uint32_t)render,
                                                                .gpu_id = g->gpu_id};
                        struct kfd_ioctl_alloc_memory_of_gpu_args al = {
                                .va_addr = 0x100000,
                                .size = 2 * MiB,
                                .gpu_id = g->gpu_id,
                                .flags = VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC};
                        struct kfd_ioctl_get_available_memory_args am = {.gpu_id = g->gpu_id};
                        int want = strcmp(names[i], "workstation") == 0 ? -EINVAL : 0;

                        REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ACQUIRE_VM, &acq), 0);
                        REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_AVAILABLE_MEMORY, &am), 0);
                        REQUIRE(am.available > 0);
                        /* The APU's memory is its node's SYSTEM heap (32 GiB): half of it is the TTM limit,
                         * the smallest of the APU's three limits. */
                        if (strcmp(names[i], "apu") == 0)
                                REQUIRE(am.available == 16 * GiB);
                        REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al),
                                   want);
                        if (want == 0) {
                                struct kfd_ioctl_free_memory_of_gpu_args fr = {.handle = al.handle};

                                REQUIRE_RC(
                                        seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &fr),
                                        0);
                        }
                }
                REQUIRE_RC(seam.ops->close(seam.impl, render), 0);
                REQUIRE_RC(seam.ops->close(seam.impl, kfd), 0);
                thunk_model_get_stats(m, &s);
                REQUIRE(memcmp(&s, &s0, sizeof(s)) == 0);
                thunk_model_free(m);
                thunk_topology_free(t);
        }
        return 0;
}

/* Concurrent callers on one model: the lock keeps the books straight. */
#include <pthread.h>

static void *thread_body(void *p)
{
        Fx *f = p;
        uintptr_t bad = 0;

        for (int i = 0; i < 200; i++) {
                uint64_t h = 0;
                uint32_t ids[] = {G1};

                if (alloc_bo(f, f->kfd, G1, 0, PAGE, GTT_RW, &h, NULL) < 0)
                        bad++;
                else if (free_bo(f, f->kfd, h) < 0)
                        bad++;
                (void)ids;
        }
        return (void *)bad;
}

/* ------------------------------------------------------------------ events, queues, packet processor */

static double ms_now(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int create_event(Fx *f, uint32_t type, bool auto_reset, struct kfd_ioctl_create_event_args *ret)
{
        struct kfd_ioctl_create_event_args a = {.event_type = type, .auto_reset = auto_reset};
        int r = io(f, f->kfd, AMDKFD_IOC_CREATE_EVENT, &a);

        if (r == 0)
                *ret = a;
        return r;
}

static int wait_events(Fx *f, const uint32_t *ids, uint32_t n, bool all, uint32_t timeout, uint32_t *result)
{
        struct kfd_event_data d[4];
        struct kfd_ioctl_wait_events_args a = {
                .events_ptr = (uintptr_t)d, .num_events = n, .wait_for_all = all, .timeout = timeout};
        int r;

        memset(d, 0, sizeof(d));
        for (uint32_t i = 0; i < n; i++)
                d[i].event_id = ids[i];
        r = io(f, f->kfd, AMDKFD_IOC_WAIT_EVENTS, &a);
        *result = a.wait_result;
        return r;
}

typedef struct Setter {
        Fx *f;
        uint32_t id;
} Setter;

static void *set_later(void *arg)
{
        Setter *st = arg;
        struct kfd_ioctl_set_event_args a = {.event_id = st->id};

        usleep(30000);
        io(st->f, st->f->kfd, AMDKFD_IOC_SET_EVENT, &a);
        return NULL;
}

static int test_events(void)
{
        Fx f;
        struct kfd_ioctl_create_event_args sig, man, hw;
        struct kfd_ioctl_set_event_args set = {0};
        struct kfd_ioctl_reset_event_args reset = {0};
        struct kfd_ioctl_destroy_event_args destroy = {0};
        struct kfd_ioctl_get_clock_counters_args clk = {0};
        struct kfd_ioctl_get_tile_config_args tile = {0};
        struct kfd_ioctl_set_trap_handler_args trap = {.tba_addr = 0x1000, .tma_addr = 0x2000, .gpu_id = G0};
        uint32_t tiles[64], result, ids[2];
        uint64_t *page = NULL;
        ThunkModelStats s;
        pthread_t th;
        Setter st;
        double t;

        REQUIRE_RC(fx_setup(&f, 11), 0);
        /* a signal event: slot = id, the driver's signal page is mapped through the kfd fd */
        REQUIRE_RC(create_event(&f, KFD_IOC_EVENT_SIGNAL, true, &sig), 0);
        REQUIRE(sig.event_id == 0 && sig.event_slot_index == 0 && sig.event_trigger_data == 0);
        REQUIRE(sig.event_page_offset == THUNK_KFD_MMAP_TYPE_EVENTS);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, KFD_SIGNAL_EVENT_LIMIT * 8, PROT_READ | PROT_WRITE,
                                    MAP_SHARED, f.kfd, sig.event_page_offset, (void **)&page),
                   0);
        REQUIRE(page[0] == ~0ULL);
        REQUIRE_RC(create_event(&f, KFD_IOC_EVENT_SIGNAL, false, &man), 0);
        REQUIRE(man.event_id == 1);
        /* other events take ids from the upper half; only signal events may be set from the CPU */
        REQUIRE_RC(create_event(&f, KFD_IOC_EVENT_HW_EXCEPTION, false, &hw), 0);
        REQUIRE(hw.event_id >= 0x40000000u);
        set.event_id = hw.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), -EINVAL);
        set.event_id = 77;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), -EINVAL);
        /* the page is set once: naming another is -EINVAL */
        {
                struct kfd_ioctl_create_event_args again = {.event_page_offset = THUNK_KFD_HANDLE(G0, 0)};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_EVENT, &again), -EINVAL);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.events == 3);

        /* an unsignalled wait blocks until its timeout */
        ids[0] = sig.event_id;
        t = ms_now();
        REQUIRE_RC(wait_events(&f, ids, 1, false, 60, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_TIMEOUT && ms_now() - t >= 55);
        /* set: the wait completes and consumes an auto-reset event */
        set.event_id = sig.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), 0);
        REQUIRE_RC(wait_events(&f, ids, 1, false, 1000, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_TIMEOUT);
        /* a manual-reset event stays set until reset */
        set.event_id = man.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), 0);
        ids[0] = man.event_id;
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        /* wait for all: one of two set is not enough; wait for any: it is */
        ids[1] = sig.event_id;
        REQUIRE_RC(wait_events(&f, ids, 2, true, 0, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_TIMEOUT);
        REQUIRE_RC(wait_events(&f, ids, 2, false, 0, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        reset.event_id = man.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_RESET_EVENT, &reset), 0);
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_TIMEOUT);
        /* an infinite wait is released by a SET_EVENT from another thread */
        st = (Setter){.f = &f, .id = sig.event_id};
        REQUIRE(pthread_create(&th, NULL, set_later, &st) == 0);
        ids[0] = sig.event_id;
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0xffffffffu, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        pthread_join(th, NULL);
        /* unknown events */
        ids[0] = 4000;
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0, &result), -EINVAL);
        destroy.event_id = 4000;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_EVENT, &destroy), -EINVAL);
        destroy.event_id = hw.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_EVENT, &destroy), 0);

        /* clock counters: gpu_id 0 is no error, it just has no GPU counter */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_CLOCK_COUNTERS, &clk), 0);
        REQUIRE(clk.gpu_clock_counter == 0 && clk.cpu_clock_counter &&
                clk.system_clock_freq == 1000000000ULL);
        clk.gpu_id = G0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_CLOCK_COUNTERS, &clk), 0);
        REQUIRE(clk.gpu_clock_counter != 0);
        /* tile config: counts clamp to the driver's tables */
        tile.tile_config_ptr = (uintptr_t)tiles;
        tile.macro_tile_config_ptr = (uintptr_t)tiles;
        tile.num_tile_configs = 64;
        tile.num_macro_tile_configs = 64;
        tile.gpu_id = G0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_TILE_CONFIG, &tile), 0);
        REQUIRE(tile.num_tile_configs == 32 && tile.num_macro_tile_configs == 16 && tile.gb_addr_config != 0);
        tile.gpu_id = 0x9999;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_TILE_CONFIG, &tile), -EINVAL);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_TRAP_HANDLER, &trap), 0);
        trap.gpu_id = 0x9999;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_TRAP_HANDLER, &trap), -EINVAL);
        munmap(page, KFD_SIGNAL_EVENT_LIMIT * 8);
        return fx_teardown(&f);
}

/* amd_signal_t as ROCr lays it out (64 bytes): kind, value, event mailbox, event id. */
typedef struct TestSignal {
        int64_t kind;
        volatile int64_t value;
        uint64_t mailbox;
        uint32_t event_id;
        uint32_t pad[9];
} TestSignal;

_Static_assert(sizeof(TestSignal) == 64, "amd_signal_t size");

static void put_packet(uint8_t *ring, uint64_t slot, uint16_t type, const uint64_t *deps, uint64_t completion)
{
        uint8_t *p = ring + slot * 64;

        memset(p + 2, 0, 62);
        for (int i = 0; deps && i < 5; i++)
                memcpy(p + 8 + 8 * i, &deps[i], 8);
        memcpy(p + 56, &completion, 8);
        __atomic_store_n((uint16_t *)p, type, __ATOMIC_RELEASE);
}

/* A kernel dispatch of the (zeroed, so 0-argument) kernel descriptor at @kd: the packet processor does not
 * run kernels, but what the CP would read of one must be in the GPU VM. */
static void put_dispatch(uint8_t *ring, uint64_t slot, const void *kd, uint64_t completion)
{
        uint8_t *p = ring + slot * 64;
        uint64_t kobj = (uintptr_t)kd;

        memset(p + 2, 0, 62);
        memcpy(p + 32, &kobj, 8);
        memcpy(p + 56, &completion, 8);
        __atomic_store_n((uint16_t *)p, 2 /* KERNEL_DISPATCH */, __ATOMIC_RELEASE);
}

static bool wait_value(volatile uint64_t *p, uint64_t want)
{
        for (int i = 0; i < 2000 && __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; i++)
                usleep(1000);
        return __atomic_load_n(p, __ATOMIC_ACQUIRE) == want;
}

static int test_queues(void)
{
        Fx f;
        struct kfd_ioctl_create_queue_args q = {0};
        struct kfd_ioctl_destroy_queue_args dq = {0};
        struct kfd_ioctl_set_xnack_mode_args xn = {.xnack_enabled = 1};
        struct kfd_ioctl_create_event_args ev;
        uint64_t *mem, *rptr, *wptr, *events;
        uint8_t *ring;
        TestSignal *sig;
        uint64_t deps[5] = {0}, h_mem, h_events, off;
        void *db = NULL;
        uint32_t q0, q1, result, id, n = 0;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 11), 0);
        /* everything the packet processor reads or writes is in the queue's GPU VM, as on a GPU: host
         * pages registered as userptr BOs at their own address, the way libhsakmt maps host memory */
        mem = aligned_alloc(4096, 4 * 4096);
        events = aligned_alloc(4096, KFD_SIGNAL_EVENT_LIMIT * 8);
        REQUIRE(mem != NULL && events != NULL);
        memset(mem, 0, 4 * 4096);
        off = (uintptr_t)mem;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, (uintptr_t)mem, 4 * 4096,
                            KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, &h_mem, &off),
                   0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h_mem, (const uint32_t[]){G0}, 1, &n), 0);
        off = (uintptr_t)events;
        n = 0;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, (uintptr_t)events, KFD_SIGNAL_EVENT_LIMIT * 8,
                            KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, &h_events,
                            &off),
                   0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h_events, (const uint32_t[]){G0}, 1, &n), 0);
        ring = (uint8_t *)mem; /* 64 packets */
        rptr = mem + 4096 / 8; /* read and write indices */
        wptr = rptr + 8;
        sig = (TestSignal *)(mem + 2 * 4096 / 8); /* signals */
        for (int i = 0; i < 64; i++)
                *(uint16_t *)(ring + i * 64) = 1; /* INVALID */

        q.ring_base_address = (uintptr_t)ring;
        q.ring_size = 4096;
        q.read_pointer_address = (uintptr_t)rptr;
        q.write_pointer_address = (uintptr_t)wptr;
        q.gpu_id = G0;
        q.queue_type = KFD_IOC_QUEUE_TYPE_COMPUTE_AQL;
        q.queue_percentage = 100;
        q.queue_priority = 7;
        /* the kernel's argument checks */
        {
                struct kfd_ioctl_create_queue_args b = q;

                b.queue_percentage = 101;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EINVAL);
                b = q;
                b.ring_size = 3000;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EINVAL);
                b = q;
                b.queue_type = 9;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -524);
                b = q;
                b.gpu_id = 0x9999;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EINVAL);
                b = q;
                b.write_pointer_address = 1ULL << 60;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EFAULT);
        }
        /* a dummy second queue first: ids and SOC15 doorbell offsets (8 bytes per queue in the slice) */
        {
                struct kfd_ioctl_create_queue_args b = q;

                /* its own (empty) ring and pointers: the SDMA engine runs it too */
                b.queue_type = KFD_IOC_QUEUE_TYPE_SDMA;
                b.ring_base_address = (uintptr_t)(mem + 3 * 4096 / 8);
                b.ring_size = 2048;
                b.read_pointer_address = (uintptr_t)(mem + 3 * 4096 / 8 + 256);
                b.write_pointer_address = (uintptr_t)(mem + 3 * 4096 / 8 + 264);
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), 0);
                q1 = b.queue_id;
                REQUIRE(q1 == 0);
        }
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &q), 0);
        q0 = q.queue_id;
        REQUIRE(q0 == 1);
        REQUIRE(q.doorbell_offset == (THUNK_KFD_MMAP_TYPE_DOORBELL | THUNK_KFD_MMAP_GPU_ID(G0) | 8));
        /* the doorbell slice is real shared memory behind the kfd fd, and only maps whole */
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, f.kfd,
                                    q.doorbell_offset & ~8191ULL, &db),
                   -EINVAL);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, f.kfd,
                                    q.doorbell_offset & ~8191ULL, &db),
                   0);
        ((volatile uint64_t *)db)[1] = 0;
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.queues == 2);
        /* XNACK cannot change while queues exist */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &xn), -EBUSY);

        /* a barrier-AND waits for its dependency; the dispatch behind it waits in order */
        sig[0].value = 1; /* dependency */
        sig[1].value = 1; /* barrier completion */
        sig[2].value = 1; /* dispatch completion */
        deps[0] = (uintptr_t)&sig[0];
        put_packet(ring, 0, 3 /* BARRIER_AND */, deps, (uintptr_t)&sig[1]);
        put_dispatch(ring, 1, &sig[32], (uintptr_t)&sig[2]);
        __atomic_store_n(wptr, 2, __ATOMIC_RELEASE);
        usleep(50000);
        REQUIRE(__atomic_load_n(rptr, __ATOMIC_ACQUIRE) == 0 &&
                __atomic_load_n(&sig[1].value, __ATOMIC_ACQUIRE) == 1 &&
                __atomic_load_n(&sig[2].value, __ATOMIC_ACQUIRE) == 1);
        __atomic_store_n(&sig[0].value, 0, __ATOMIC_RELEASE);
        REQUIRE(wait_value(rptr, 2));
        REQUIRE(__atomic_load_n(&sig[1].value, __ATOMIC_ACQUIRE) == 0 &&
                __atomic_load_n(&sig[2].value, __ATOMIC_ACQUIRE) == 0);
        REQUIRE((*(uint16_t *)ring & 0xff) == 1 && (*(uint16_t *)(ring + 64) & 0xff) == 1);

        /* a barrier-OR retires as soon as one dependency is satisfied */
        __atomic_store_n(&sig[3].value, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&sig[4].value, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&sig[1].value, 1, __ATOMIC_RELEASE);
        deps[0] = (uintptr_t)&sig[3];
        deps[1] = (uintptr_t)&sig[4];
        put_packet(ring, 2, 5 /* BARRIER_OR */, deps, (uintptr_t)&sig[1]);
        __atomic_store_n(wptr, 3, __ATOMIC_RELEASE);
        usleep(30000);
        REQUIRE(__atomic_load_n(rptr, __ATOMIC_ACQUIRE) == 2);
        __atomic_store_n(&sig[4].value, 0, __ATOMIC_RELEASE);
        REQUIRE(wait_value(rptr, 3));
        REQUIRE(__atomic_load_n(&sig[1].value, __ATOMIC_ACQUIRE) == 0);

        /* a completion signal with an event mailbox: the id lands in the slot and the event fires (the signal
         * page is a BO in the GPU VM, as libhsakmt gives it on dGPUs) */
        {
                struct kfd_ioctl_create_event_args a = {
                        .event_type = KFD_IOC_EVENT_SIGNAL, .auto_reset = 1, .event_page_offset = h_events};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_EVENT, &a), 0);
                ev = a;
        }
        id = ev.event_id;
        __atomic_store_n(&sig[5].value, 1, __ATOMIC_RELEASE);
        sig[5].mailbox = (uintptr_t)&events[id];
        sig[5].event_id = id;
        put_dispatch(ring, 3, &sig[32], (uintptr_t)&sig[5]);
        __atomic_store_n(wptr, 4, __ATOMIC_RELEASE);
        REQUIRE_RC(wait_events(&f, &id, 1, false, 2000, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE(__atomic_load_n(&sig[5].value, __ATOMIC_ACQUIRE) == 0 &&
                __atomic_load_n(rptr, __ATOMIC_ACQUIRE) == 4);
        /* the interrupt re-armed the slot */
        REQUIRE(events[id] == ~0ULL);

        dq.queue_id = 77;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_QUEUE, &dq), -EINVAL);
        dq.queue_id = q1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_QUEUE, &dq), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.queues == 1 && s.events == 1);
        /* the rest goes with the context */
        munmap(db, 8192);
        REQUIRE_RC(fx_teardown(&f), 0);
        free(mem);
        free(events);
        return 0;
}

static int test_threads(void)
{
        Fx f;
        pthread_t th[4];

        REQUIRE_RC(fx_setup(&f, 19), 0);
        for (int i = 0; i < 4; i++)
                REQUIRE(pthread_create(&th[i], NULL, thread_body, &f) == 0);
        for (int i = 0; i < 4; i++) {
                void *r;

                REQUIRE(pthread_join(th[i], &r) == 0);
                REQUIRE(r == NULL);
        }
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* ------------------------------------------------------------------ carved buffers */

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
static int test_carve(void)
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
static int test_carve_free(void)
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
static int test_carve_export(void)
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
static int test_carve_fds(void)
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

/* ------------------------------------------------------------------ runner */

static const RcTestCase tests[] = {
        {"version", test_version},
        {"dispatch", test_dispatch},
        {"struct-sizes", test_struct_sizes},
        {"apertures", test_apertures},
        {"acquire-vm", test_acquire_vm},
        {"alloc-errors", test_alloc_errors},
        {"handles", test_handles},
        {"free-errors", test_free_errors},
        {"map-errors", test_map_errors},
        {"map-resume", test_map_resume},
        {"available-limits", test_available_and_limits},
        {"mmap-data", test_mmap_data},
        {"dmabuf", test_dmabuf},
        {"dmabuf-foreign", test_dmabuf_foreign},
        {"svm", test_svm},
        {"svm-limits", test_svm_limits},
        {"xnack", test_xnack},
        {"secondary", test_secondary},
        {"gem-va", test_gem_va},
        {"read-only-import", test_read_only_import},
        {"faults", test_faults},
        {"two-models", test_two_models},
        {"teardown", test_teardown},
        {"presets", test_presets},
        {"threads", test_threads},
        {"events", test_events},
        {"queues", test_queues},
        {"carve", test_carve},
        {"carve-free", test_carve_free},
        {"carve-export", test_carve_export},
        {"carve-fds", test_carve_fds},
};

int main(int argc, char **argv)
{
        return run_rc_tests(tests, ARRAY_SIZE(tests), argc > 1 ? argv[1] : NULL);
}
