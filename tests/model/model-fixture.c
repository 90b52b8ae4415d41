/* The KFD model tests' fixture: hand-made topologies, a model with a kfd fd and render fds, ioctl helpers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "model-fixture.h"

void topo_free(ThunkTopology *t)
{
        for (size_t i = 0; i < t->n_nodes; i++)
                free(t->nodes[i].mem_banks);
        free(t->nodes);
        free(t);
}

ThunkTopology *topo_make(size_t n, const GpuSpec *g, uint64_t ram)
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

const GpuSpec std_gpus[] = {
        {0x1111, 16 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0xabc, 90010, true},
        {0x2222, 16 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0xabc, 90010, true},
        {0x3333, 8 * GiB, HSA_MEM_HEAP_TYPE_FB_PRIVATE, 0, 90010, true},
};

int io(Fx *f, int fd, unsigned long req, void *arg)
{
        return f->seam.ops->ioctl(f->seam.impl, fd, req, arg);
}

int fx_acquire(Fx *f, int kfd, int render, uint32_t gpu_id)
{
        struct kfd_ioctl_acquire_vm_args a = {.drm_fd = (uint32_t)render, .gpu_id = gpu_id};

        return io(f, kfd, AMDKFD_IOC_ACQUIRE_VM, &a);
}

int fx_setup_topo(Fx *f, ThunkTopology *t, uint32_t minor, bool acquire)
{
        ThunkModelOptions o = {.kfd_minor = minor};

        return fx_setup_opts(f, t, &o, acquire);
}

int fx_setup_opts(Fx *f, ThunkTopology *t, const ThunkModelOptions *o, bool acquire)
{
        int r;

        memset(f, 0, sizeof(*f));
        r = thunk_model_new(t, o, &f->m);
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

int fx_setup(Fx *f, uint32_t minor)
{
        return fx_setup_topo(f, topo_make(3, std_gpus, 64 * GiB), minor, true);
}

int fx_teardown(Fx *f)
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

int alloc_bo(Fx *f, int kfd, uint32_t gpu, uint64_t va, uint64_t size, uint32_t flags, uint64_t *handle,
             uint64_t *offset)
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

int free_bo(Fx *f, int kfd, uint64_t handle)
{
        struct kfd_ioctl_free_memory_of_gpu_args a = {.handle = handle};

        return io(f, kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &a);
}

int map_bo(Fx *f, int kfd, bool map, uint64_t handle, const uint32_t *ids, uint32_t n, uint32_t *n_success)
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

int svm_call(Fx *f, int kfd, uint32_t op, uint64_t start, uint64_t size, struct kfd_ioctl_svm_attribute *at,
             uint32_t n)
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

int gem_va(Fx *f, int fd, uint32_t op, uint32_t handle, uint64_t va, uint64_t off, uint64_t size)
{
        struct drm_amdgpu_gem_va a = {.handle = handle,
                                      .operation = op,
                                      .flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
                                      .va_address = va,
                                      .offset_in_bo = off,
                                      .map_size = size};

        return io(f, fd, DRM_IOCTL_AMDGPU_GEM_VA, &a);
}
