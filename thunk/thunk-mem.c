/* The thunk's memory layer: BOs, GPU map/unmap with rollback, dmabuf, SVM, XNACK, GEM_VA. */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "kfd-compat.h"
#include "thunk-private.h"

/* How often an ioctl that reports EINTR is re-issued with its own progress before giving up. */
#define THUNK_EINTR_RETRIES 64

static bool page_aligned(const ThunkDevice *d, uint64_t v)
{
        return (v & (d->page_size - 1)) == 0;
}

static int ioctl_restart(ThunkDevice *d, int fd, unsigned long request, void *arg)
{
        int r;

        for (unsigned i = 0;; i++) {
                r = thunk_ioctl(d, fd, request, arg);
                if (r != -EINTR || i + 1 >= THUNK_EINTR_RETRIES)
                        return r;
        }
}

/* ---- flags --------------------------------------------------------------------------------------- */

static const struct {
        uint32_t thunk;
        uint32_t kfd;
} flag_map[] = {
        {THUNK_MEM_WRITABLE, KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE},
        {THUNK_MEM_EXECUTABLE, KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE},
        {THUNK_MEM_PUBLIC, KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC},
        {THUNK_MEM_NO_SUBSTITUTE, KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE},
        {THUNK_MEM_COHERENT, KFD_IOC_ALLOC_MEM_FLAGS_COHERENT},
        {THUNK_MEM_UNCACHED, KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED},
        {THUNK_MEM_EXT_COHERENT, KFD_IOC_ALLOC_MEM_FLAGS_EXT_COHERENT},
        {THUNK_MEM_CONTIGUOUS, KFD_IOC_ALLOC_MEM_FLAGS_CONTIGUOUS},
        {THUNK_MEM_AQL_QUEUE, KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM},
};

static uint32_t flags_to_kfd(ThunkMemKind kind, uint32_t flags)
{
        uint32_t k = 0;

        switch (kind) {
        case THUNK_MEM_VRAM:
                k = KFD_IOC_ALLOC_MEM_FLAGS_VRAM;
                break;
        case THUNK_MEM_GTT:
                k = KFD_IOC_ALLOC_MEM_FLAGS_GTT;
                break;
        case THUNK_MEM_USERPTR:
                k = KFD_IOC_ALLOC_MEM_FLAGS_USERPTR;
                break;
        }
        for (size_t i = 0; i < sizeof(flag_map) / sizeof(flag_map[0]); i++)
                if (flags & flag_map[i].thunk)
                        k |= flag_map[i].kfd;
        return k;
}

static void flags_from_kfd(uint32_t k, ThunkMemKind *ret_kind, uint32_t *ret_flags)
{
        uint32_t f = 0;

        for (size_t i = 0; i < sizeof(flag_map) / sizeof(flag_map[0]); i++)
                if (k & flag_map[i].kfd)
                        f |= flag_map[i].thunk;
        /* The kernel tests VRAM before GTT; so do we. */
        if (k & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
                *ret_kind = THUNK_MEM_VRAM;
        else if (k & KFD_IOC_ALLOC_MEM_FLAGS_GTT)
                *ret_kind = THUNK_MEM_GTT;
        else
                *ret_kind = THUNK_MEM_USERPTR;
        *ret_flags = f;
}

/* ---- BO bookkeeping ------------------------------------------------------------------------------ */

static int bo_new(ThunkContext *c, ThunkBo **ret)
{
        ThunkBo *bo;

        bo = calloc(1, sizeof(*bo));
        if (!bo)
                return -ENOMEM;
        bo->mapped = calloc(c->dev->n_gpus ? c->dev->n_gpus : 1, sizeof(*bo->mapped));
        if (!bo->mapped) {
                free(bo);
                return -ENOMEM;
        }
        bo->ctx = c;
        *ret = bo;
        return 0;
}

/* Freed, out of any list (never linked, or unlinked already). */
static void bo_free(ThunkBo *bo)
{
        free(bo->mapped);
        free(bo);
}

static void bo_link(ThunkBo *bo)
{
        ThunkContext *c = bo->ctx;

        pthread_mutex_lock(&c->lock);
        THUNK_LIST_PUSH(c->bos, bo);
        pthread_mutex_unlock(&c->lock);
}

/* Out of its context's list (under the context's lock) and freed. */
static void bo_destroy_locked(ThunkBo *bo)
{
        ThunkContext *c = bo->ctx;

        THUNK_LIST_UNLINK(c->bos, bo);
        bo_free(bo);
}

static void bo_destroy(ThunkBo *bo)
{
        ThunkContext *c = bo->ctx;

        pthread_mutex_lock(&c->lock);
        bo_destroy_locked(bo);
        pthread_mutex_unlock(&c->lock);
}

/* Under the context's lock. */
static void gem_map_destroy(ThunkGemMapping *m)
{
        ThunkContext *c = m->ctx;

        THUNK_LIST_UNLINK(c->gem_maps, m);
        free(m);
}

void thunk_context_drop_objects(ThunkContext *c)
{
        pthread_mutex_lock(&c->lock);
        while (c->bos)
                bo_destroy_locked(c->bos);
        while (c->gem_maps)
                gem_map_destroy(c->gem_maps);
        for (size_t i = 0; c->gem_refs && i < c->dev->n_gpus; i++) {
                free(c->gem_refs[i].items);
                c->gem_refs[i] = (ThunkGemRefs){0};
        }
        pthread_mutex_unlock(&c->lock);
}

static int check_gpu(const ThunkContext *c, uint32_t gpu_id)
{
        return thunk_gpu_index(c->dev, gpu_id) < 0 ? -EINVAL : 0;
}

/* ---- alloc / free -------------------------------------------------------------------------------- */

int thunk_bo_alloc(ThunkContext *c, const ThunkAllocArgs *args, ThunkBo **ret)
{
        struct kfd_ioctl_alloc_memory_of_gpu_args a = {0};
        ThunkDevice *d;
        ThunkBo *bo;
        int r;

        if (!c || !args || !ret)
                return -EINVAL;
        d = c->dev;
        if (args->kind != THUNK_MEM_VRAM && args->kind != THUNK_MEM_GTT && args->kind != THUNK_MEM_USERPTR)
                return -EINVAL;
        if (args->flags & ~(uint32_t)_THUNK_MEM_ALL)
                return -EINVAL;
        if (args->size == 0 || !page_aligned(d, args->size) || !page_aligned(d, args->va))
                return -EINVAL;
        if (args->va != 0 && args->va + args->size < args->va)
                return -EINVAL;
        if (check_gpu(c, args->gpu_id) < 0)
                return -EINVAL;
        if (args->kind == THUNK_MEM_USERPTR) {
                if (args->userptr == 0 || !page_aligned(d, args->userptr) ||
                    args->userptr + args->size < args->userptr)
                        return -EINVAL;
        } else if (args->userptr != 0) {
                return -EINVAL;
        }
        if (args->flags & THUNK_MEM_CONTIGUOUS) {
                if (!thunk_device_has(d, THUNK_FEATURE_CONTIGUOUS))
                        return -EOPNOTSUPP;
                if (args->kind != THUNK_MEM_VRAM)
                        return -EINVAL;
        }

        r = bo_new(c, &bo);
        if (r < 0)
                return r;

        a.va_addr = args->va;
        a.size = args->size;
        a.gpu_id = args->gpu_id;
        a.flags = flags_to_kfd(args->kind, args->flags);
        a.mmap_offset = args->kind == THUNK_MEM_USERPTR ? args->userptr : 0;
        r = thunk_ioctl(d, c->kfd_fd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a);
        if (r < 0) {
                bo_free(bo);
                return r;
        }

        bo->info = (ThunkBoInfo){
                .handle = a.handle,
                .mmap_offset = args->kind == THUNK_MEM_USERPTR ? 0 : a.mmap_offset,
                .va = args->va,
                .size = args->size,
                .userptr = args->userptr,
                .gpu_id = args->gpu_id,
                .flags = args->flags,
                .kind = args->kind,
                .imported = false,
        };
        bo_link(bo);
        *ret = bo;
        return 0;
}

int thunk_bo_free(ThunkBo *bo)
{
        struct kfd_ioctl_free_memory_of_gpu_args a = {0};
        int r;

        if (!bo)
                return -EINVAL;
        if (bo->n_mapped > 0)
                return -EBUSY;
        a.handle = bo->info.handle;
        r = thunk_ioctl(bo->ctx->dev, bo->ctx->kfd_fd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &a);
        if (r < 0)
                return r;
        bo_destroy(bo);
        return 0;
}

const ThunkBoInfo *thunk_bo_info(const ThunkBo *bo)
{
        return bo ? &bo->info : NULL;
}

ThunkContext *thunk_bo_context(const ThunkBo *bo)
{
        return bo ? bo->ctx : NULL;
}

bool thunk_bo_is_mapped(const ThunkBo *bo, uint32_t gpu_id)
{
        int i;

        if (!bo)
                return false;
        i = thunk_gpu_index(bo->ctx->dev, gpu_id);
        return i >= 0 && bo->mapped[i];
}

uint64_t thunk_bo_mapped_mask(const ThunkBo *bo)
{
        uint64_t mask = 0;

        if (!bo || !bo->n_mapped)
                return 0;
        for (size_t i = 0; i < bo->ctx->dev->n_gpus && i < 64; i++)
                if (bo->mapped[i])
                        mask |= 1ull << i;
        return mask;
}

size_t thunk_bo_mapped_count(const ThunkBo *bo)
{
        return bo ? bo->n_mapped : 0;
}

/* ---- map / unmap --------------------------------------------------------------------------------- */

/* Every id known, none twice; the indexes go to @ret_idx. */
static int check_gpu_set(const ThunkDevice *d, const uint32_t *gpu_ids, size_t n, size_t *ret_idx)
{
        if (!gpu_ids || n == 0 || n > d->n_gpus)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                int k = thunk_gpu_index(d, gpu_ids[i]);

                if (k < 0)
                        return -EINVAL;
                for (size_t j = 0; j < i; j++)
                        if (gpu_ids[j] == gpu_ids[i])
                                return -EINVAL;
                ret_idx[i] = (size_t)k;
        }
        return 0;
}

/*
 * One MAP or UNMAP ioctl over @ids, re-issued after EINTR with the driver's own n_success so that it
 * resumes where it stopped. *ret_done is the number of leading ids the driver reports as done.
 */
static int bo_devices_ioctl(ThunkBo *bo, unsigned long request, const uint32_t *ids, size_t n,
                            size_t *ret_done)
{
        /* MAP and UNMAP share one layout (handle, array pointer, n_devices, n_success). */
        struct kfd_ioctl_map_memory_to_gpu_args a = {0};
        int r;

        a.handle = bo->info.handle;
        a.device_ids_array_ptr = (uint64_t)(uintptr_t)ids;
        a.n_devices = (uint32_t)n;
        a.n_success = 0;
        r = ioctl_restart(bo->ctx->dev, bo->ctx->kfd_fd, request, &a);
        if (r == 0)
                *ret_done = n;
        else
                *ret_done = a.n_success < n ? a.n_success : n;
        return r;
}

/* @bo's device, when @gpu_ids holds one to as many ids as it has GPUs; else NULL (-EINVAL). */
static ThunkDevice *gpu_list_device(const ThunkBo *bo, const uint32_t *gpu_ids, size_t n_gpus)
{
        ThunkDevice *d = bo ? bo->ctx->dev : NULL;

        return d && gpu_ids && n_gpus > 0 && n_gpus <= d->n_gpus ? d : NULL;
}

int thunk_bo_map(ThunkBo *bo, const uint32_t *gpu_ids, size_t n_gpus)
{
        ThunkDevice *d;
        uint32_t *todo = NULL;
        size_t *idx = NULL, *todo_idx = NULL, n_todo = 0, done = 0;
        int r;

        d = gpu_list_device(bo, gpu_ids, n_gpus);
        if (!d)
                return -EINVAL;
        /* A BO allocated without a VA can only be bound through GEM_VA. */
        if (bo->info.va == 0)
                return -EINVAL;

        idx = calloc(n_gpus, sizeof(*idx));
        todo_idx = calloc(n_gpus, sizeof(*todo_idx));
        todo = calloc(n_gpus, sizeof(*todo));
        if (!idx || !todo_idx || !todo) {
                r = -ENOMEM;
                goto out;
        }
        r = check_gpu_set(d, gpu_ids, n_gpus, idx);
        if (r < 0)
                goto out;
        for (size_t i = 0; i < n_gpus; i++) {
                if (bo->mapped[idx[i]])
                        continue;
                todo[n_todo] = gpu_ids[i];
                todo_idx[n_todo] = idx[i];
                n_todo++;
        }
        if (n_todo == 0)
                goto out;

        r = bo_devices_ioctl(bo, AMDKFD_IOC_MAP_MEMORY_TO_GPU, todo, n_todo, &done);
        for (size_t i = 0; i < done; i++) {
                bo->mapped[todo_idx[i]] = true;
                bo->n_mapped++;
        }
        if (r < 0 && done > 0) {
                size_t undone = 0;

                /* Undo this call's part; what the rollback itself fails to undo stays recorded as mapped. */
                (void)bo_devices_ioctl(bo, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, todo, done, &undone);
                for (size_t i = 0; i < undone; i++) {
                        bo->mapped[todo_idx[i]] = false;
                        bo->n_mapped--;
                }
        }
out:
        free(idx);
        free(todo_idx);
        free(todo);
        return r;
}

int thunk_bo_unmap(ThunkBo *bo, const uint32_t *gpu_ids, size_t n_gpus)
{
        ThunkDevice *d;
        size_t *idx, done = 0;
        int r;

        d = gpu_list_device(bo, gpu_ids, n_gpus);
        if (!d)
                return -EINVAL;
        idx = calloc(n_gpus, sizeof(*idx));
        if (!idx)
                return -ENOMEM;
        r = check_gpu_set(d, gpu_ids, n_gpus, idx);
        if (r < 0)
                goto out;
        for (size_t i = 0; i < n_gpus; i++)
                if (!bo->mapped[idx[i]]) {
                        r = -EINVAL;
                        goto out;
                }

        r = bo_devices_ioctl(bo, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, gpu_ids, n_gpus, &done);
        for (size_t i = 0; i < done; i++) {
                bo->mapped[idx[i]] = false;
                bo->n_mapped--;
        }
out:
        free(idx);
        return r;
}

int thunk_bo_unmap_all(ThunkBo *bo)
{
        ThunkDevice *d;
        uint32_t *ids;
        size_t n = 0;
        int r;

        if (!bo)
                return -EINVAL;
        if (bo->n_mapped == 0)
                return 0;
        d = bo->ctx->dev;
        ids = calloc(d->n_gpus, sizeof(*ids));
        if (!ids)
                return -ENOMEM;
        for (size_t i = 0; i < d->n_gpus; i++)
                if (bo->mapped[i])
                        ids[n++] = d->gpus[i].gpu_id;
        r = thunk_bo_unmap(bo, ids, n);
        free(ids);
        return r;
}

/* ---- CPU mappings ------------------------------------------------------------------------------- */

static int check_mmap_args(ThunkDevice *d, void *addr, size_t len, uint64_t offset, int flags)
{
        if (!(flags & MAP_SHARED) || (flags & MAP_PRIVATE))
                return -EINVAL;
        if (flags & ~(MAP_SHARED | MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_POPULATE))
                return -EINVAL;
        if (len == 0 || !page_aligned(d, len) || !page_aligned(d, (uint64_t)(uintptr_t)addr) ||
            !page_aligned(d, offset))
                return -EINVAL;
        return 0;
}

int thunk_bo_mmap(ThunkBo *bo, void *addr, int prot, int flags, void **ret)
{
        int i, r;

        if (!bo || !ret)
                return -EINVAL;
        /* USERPTR is CPU memory already; an import carries no render-node offset (use its dmabuf). */
        if (bo->info.kind == THUNK_MEM_USERPTR || bo->info.imported)
                return -EINVAL;
        i = thunk_gpu_index(bo->ctx->dev, bo->info.gpu_id);
        if (i < 0)
                return -EINVAL;
        r = check_mmap_args(bo->ctx->dev, addr, bo->info.size, bo->info.mmap_offset, flags);
        if (r < 0)
                return r;
        return bo->ctx->dev->seam.ops->mmap(bo->ctx->dev->seam.impl, addr, bo->info.size, prot, flags,
                                            bo->ctx->render_fds[i], bo->info.mmap_offset, ret);
}

int thunk_dmabuf_mmap(ThunkDevice *d, int dmabuf_fd, void *addr, size_t len, int prot, int flags, void **ret)
{
        void *p;
        int r;

        if (!d || dmabuf_fd < 0 || !ret)
                return -EINVAL;
        r = check_mmap_args(d, addr, len, 0, flags);
        if (r < 0)
                return r;
        /* A dmabuf fd is an ordinary file the caller holds, not a device fd of the seam: the kernel's
         * dmabufs and the model's alike are mapped with mmap(2) itself, as a client would. */
        p = mmap(addr, len, prot, flags, dmabuf_fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        *ret = p;
        return 0;
}

/* ---- dmabuf -------------------------------------------------------------------------------------- */

static int export_dmabuf(ThunkBo *bo, int *ret_fd)
{
        struct kfd_ioctl_export_dmabuf_args a = {0};
        int r;

        a.handle = bo->info.handle;
        a.flags = O_CLOEXEC;
        r = thunk_ioctl(bo->ctx->dev, bo->ctx->kfd_fd, AMDKFD_IOC_EXPORT_DMABUF, &a);
        if (r < 0)
                return r;
        *ret_fd = (int)a.dmabuf_fd;
        return 0;
}

int thunk_bo_export_dmabuf(ThunkBo *bo, int *ret_fd)
{
        if (!bo || !ret_fd)
                return -EINVAL;
        if (!thunk_device_has(bo->ctx->dev, THUNK_FEATURE_EXPORT_DMABUF))
                return -EOPNOTSUPP;
        if (bo->info.kind == THUNK_MEM_USERPTR)
                return -EINVAL;
        return export_dmabuf(bo, ret_fd);
}

int thunk_dmabuf_info(ThunkContext *c, int dmabuf_fd, void *metadata, uint32_t metadata_cap,
                      ThunkDmabufInfo *ret)
{
        struct kfd_ioctl_get_dmabuf_info_args a = {0};
        int r;

        if (!c || dmabuf_fd < 0 || !ret || (metadata_cap > 0 && !metadata))
                return -EINVAL;
        a.metadata_ptr = metadata_cap > 0 ? (uint64_t)(uintptr_t)metadata : 0;
        a.metadata_size = metadata_cap;
        a.dmabuf_fd = (uint32_t)dmabuf_fd;
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_GET_DMABUF_INFO, &a);
        if (r < 0)
                return r;
        *ret = (ThunkDmabufInfo){
                .size = a.size,
                .gpu_id = a.gpu_id,
                .metadata_size = a.metadata_size,
        };
        flags_from_kfd(a.flags, &ret->kind, &ret->flags);
        return 0;
}

int thunk_bo_import_dmabuf(ThunkContext *c, int dmabuf_fd, uint32_t gpu_id, uint64_t va, ThunkBo **ret)
{
        struct kfd_ioctl_import_dmabuf_args a = {0};
        ThunkDmabufInfo info;
        ThunkBo *bo;
        int r;

        if (!c || dmabuf_fd < 0 || !ret)
                return -EINVAL;
        if (check_gpu(c, gpu_id) < 0 || !page_aligned(c->dev, va))
                return -EINVAL;
        r = thunk_dmabuf_info(c, dmabuf_fd, NULL, 0, &info);
        if (r == -EINVAL) {
                struct stat st;

                /* Not an amdgpu VRAM/GTT dmabuf. Kernels that import through DRM PRIME still accept
                 * foreign dmabufs (udmabuf, memfd-backed) as GTT: let the driver judge, and take the size
                 * from the file, which a dmabuf reports as its inode size. */
                if (fstat(dmabuf_fd, &st) < 0)
                        return -errno;
                info = (ThunkDmabufInfo){
                        .size = (uint64_t)st.st_size, .gpu_id = gpu_id, .kind = THUNK_MEM_GTT};
        } else if (r < 0) {
                return r;
        }
        if (va != 0 && va + info.size < va)
                return -EINVAL;
        r = bo_new(c, &bo);
        if (r < 0)
                return r;
        a.va_addr = va;
        a.gpu_id = gpu_id;
        a.dmabuf_fd = (uint32_t)dmabuf_fd;
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_IMPORT_DMABUF, &a);
        if (r < 0) {
                bo_free(bo);
                return r;
        }
        /* The kernel gives every import its memory type plus writable and executable. */
        bo->info = (ThunkBoInfo){
                .handle = a.handle,
                .va = va,
                .size = info.size,
                .gpu_id = gpu_id,
                .flags = (info.flags & THUNK_MEM_PUBLIC) | THUNK_MEM_WRITABLE | THUNK_MEM_EXECUTABLE,
                .kind = info.kind,
                .imported = true,
        };
        bo_link(bo);
        *ret = bo;
        return 0;
}

/* ---- per-GPU queries ---------------------------------------------------------------------------- */

int thunk_context_available_memory(ThunkContext *c, uint32_t gpu_id, uint64_t *ret_bytes)
{
        struct kfd_ioctl_get_available_memory_args a = {0};
        int r;

        if (!c || !ret_bytes)
                return -EINVAL;
        if (!thunk_device_has(c->dev, THUNK_FEATURE_AVAILABLE_MEMORY))
                return -EOPNOTSUPP;
        if (check_gpu(c, gpu_id) < 0)
                return -EINVAL;
        a.gpu_id = gpu_id;
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_AVAILABLE_MEMORY, &a);
        if (r < 0)
                return r;
        *ret_bytes = a.available;
        return 0;
}

int thunk_context_tile_config(ThunkContext *c, uint32_t gpu_id, ThunkTileConfig *ret)
{
        struct kfd_ioctl_get_tile_config_args a = {0};
        ThunkTileConfig t = {0};
        int r;

        if (!c || !ret)
                return -EINVAL;
        if (check_gpu(c, gpu_id) < 0)
                return -EINVAL;
        a.gpu_id = gpu_id;
        a.tile_config_ptr = (uint64_t)(uintptr_t)t.tile;
        a.num_tile_configs = THUNK_TILE_CONFIGS;
        a.macro_tile_config_ptr = (uint64_t)(uintptr_t)t.macro;
        a.num_macro_tile_configs = THUNK_MACRO_TILE_CONFIGS;
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_GET_TILE_CONFIG, &a);
        if (r < 0)
                return r;
        t.gb_addr_config = a.gb_addr_config;
        t.num_banks = a.num_banks;
        t.num_ranks = a.num_ranks;
        t.n_tile = a.num_tile_configs < THUNK_TILE_CONFIGS ? a.num_tile_configs : THUNK_TILE_CONFIGS;
        t.n_macro = a.num_macro_tile_configs < THUNK_MACRO_TILE_CONFIGS ? a.num_macro_tile_configs
                                                                        : THUNK_MACRO_TILE_CONFIGS;
        *ret = t;
        return 0;
}

int thunk_context_get_xnack(ThunkContext *c, bool *ret_enabled)
{
        struct kfd_ioctl_set_xnack_mode_args a = {.xnack_enabled = -1};
        int r;

        if (!c || !ret_enabled)
                return -EINVAL;
        if (!thunk_device_has(c->dev, THUNK_FEATURE_SVM))
                return -EOPNOTSUPP;
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_SET_XNACK_MODE, &a);
        if (r < 0)
                return r;
        *ret_enabled = a.xnack_enabled > 0;
        return 0;
}

int thunk_context_set_xnack(ThunkContext *c, bool enabled)
{
        struct kfd_ioctl_set_xnack_mode_args a = {.xnack_enabled = enabled ? 1 : 0};

        if (!c)
                return -EINVAL;
        if (!thunk_device_has(c->dev, THUNK_FEATURE_SVM))
                return -EOPNOTSUPP;
        return thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_SET_XNACK_MODE, &a);
}

/* ---- SVM ----------------------------------------------------------------------------------------- */

_Static_assert(sizeof(ThunkSvmAttr) == sizeof(struct kfd_ioctl_svm_attribute), "svm attribute layout");
_Static_assert(sizeof(struct kfd_ioctl_svm_args) + THUNK_SVM_MAX_ATTRS * sizeof(ThunkSvmAttr) <=
                       _IOC_SIZEMASK,
               "svm request must fit the ioctl size field");

/* The attribute array travels inside the request: its bytes are added to the ioctl's size field. */
static int svm_call(ThunkContext *c, uint32_t op, uint64_t start, uint64_t size, ThunkSvmAttr *attrs,
                    size_t n)
{
        /* the ioctl's arguments on the stack: at most THUNK_SVM_MAX_ATTRS attributes, half a KiB */
        union {
                struct kfd_ioctl_svm_args args;
                uint8_t bytes[sizeof(struct kfd_ioctl_svm_args) +
                              THUNK_SVM_MAX_ATTRS * sizeof(struct kfd_ioctl_svm_attribute)];
        } buf;
        struct kfd_ioctl_svm_args *a = &buf.args;
        size_t bytes = n * sizeof(struct kfd_ioctl_svm_attribute);
        unsigned long request;
        int r;

        if (!c || n > THUNK_SVM_MAX_ATTRS || (n > 0 && !attrs))
                return -EINVAL;
        if (!thunk_device_has(c->dev, THUNK_FEATURE_SVM))
                return -EOPNOTSUPP;
        if (size == 0 || !page_aligned(c->dev, start) || !page_aligned(c->dev, size) || start + size < start)
                return -EINVAL;

        memset(a, 0, sizeof(*a));
        a->start_addr = start;
        a->size = size;
        a->op = op;
        a->nattr = (uint32_t)n;
        if (n > 0)
                memcpy(a->attrs, attrs, bytes);
        request = AMDKFD_IOC_SVM + ((unsigned long)bytes << _IOC_SIZESHIFT);
        r = thunk_ioctl(c->dev, c->kfd_fd, request, a);
        if (r == 0 && op == KFD_IOCTL_SVM_OP_GET_ATTR && n > 0)
                memcpy(attrs, a->attrs, bytes);
        return r;
}

int thunk_svm_set(ThunkContext *c, uint64_t start, uint64_t size, const ThunkSvmAttr *attrs, size_t n_attrs)
{
        /* The request is built in a private copy, so the caller's array is never written. */
        return svm_call(c, KFD_IOCTL_SVM_OP_SET_ATTR, start, size, (ThunkSvmAttr *)attrs, n_attrs);
}

int thunk_svm_get(ThunkContext *c, uint64_t start, uint64_t size, ThunkSvmAttr *attrs, size_t n_attrs)
{
        if (n_attrs == 0)
                return -EINVAL;
        return svm_call(c, KFD_IOCTL_SVM_OP_GET_ATTR, start, size, attrs, n_attrs);
}

int thunk_cpu_unmap(ThunkDevice *d, void *addr, size_t len)
{
        return d->seam.ops->munmap(d->seam.impl, addr, len);
}

/* ---- GEM_VA ------------------------------------------------------------------------------------- */

/*
 * The reference counts below are taken under the context's lock together with the PRIME import that finds
 * the handle and the GEM_CLOSE that ends it: otherwise a handle one thread is closing could be the one
 * another thread's import just got.
 */
static int gem_ref(ThunkContext *c, size_t gi, uint32_t handle)
{
        ThunkGemRefs *refs = &c->gem_refs[gi];

        for (size_t i = 0; i < refs->n; i++)
                if (refs->items[i].handle == handle) {
                        refs->items[i].refs++;
                        return 0;
                }
        if (refs->n == refs->cap) {
                size_t cap = refs->cap ? refs->cap * 2 : 8;
                ThunkGemRef *items = realloc(refs->items, cap * sizeof(*items));

                if (!items)
                        return -ENOMEM;
                refs->items = items;
                refs->cap = cap;
        }
        refs->items[refs->n++] = (ThunkGemRef){.handle = handle, .refs = 1};
        return 0;
}

/* Drop one reference; GEM_CLOSE when it was the last. */
static int gem_unref(ThunkContext *c, size_t gi, uint32_t handle)
{
        ThunkGemRefs *refs = &c->gem_refs[gi];

        for (size_t i = 0; i < refs->n; i++) {
                struct drm_gem_close cl = {0};
                int r;

                if (refs->items[i].handle != handle)
                        continue;
                if (refs->items[i].refs > 1) {
                        refs->items[i].refs--;
                        return 0;
                }
                cl.handle = handle;
                r = thunk_ioctl(c->dev, c->render_fds[gi], DRM_IOCTL_GEM_CLOSE, &cl);
                if (r < 0)
                        return r;
                refs->items[i] = refs->items[--refs->n];
                return 0;
        }
        return -ENOENT;
}

/* A handle PRIME gave us that we had no reference for yet must be closed if we cannot keep it. */
static void gem_close_untracked(ThunkContext *c, size_t gi, uint32_t handle)
{
        struct drm_gem_close cl = {.handle = handle};

        (void)thunk_ioctl(c->dev, c->render_fds[gi], DRM_IOCTL_GEM_CLOSE, &cl);
}

static bool gem_tracked(const ThunkContext *c, size_t gi, uint32_t handle)
{
        const ThunkGemRefs *refs = &c->gem_refs[gi];

        for (size_t i = 0; i < refs->n; i++)
                if (refs->items[i].handle == handle)
                        return true;
        return false;
}

static uint32_t gem_va_flags(uint32_t flags)
{
        uint32_t f = 0;

        if (flags & THUNK_GEM_VA_READABLE)
                f |= AMDGPU_VM_PAGE_READABLE;
        if (flags & THUNK_GEM_VA_WRITEABLE)
                f |= AMDGPU_VM_PAGE_WRITEABLE;
        if (flags & THUNK_GEM_VA_EXECUTABLE)
                f |= AMDGPU_VM_PAGE_EXECUTABLE;
        return f;
}

static int gem_check(ThunkContext *c, uint32_t gpu_id, uint64_t va, uint64_t offset, uint64_t size,
                     uint32_t flags, int *ret_gi)
{
        ThunkDevice *d = c->dev;
        int gi;

        if (!thunk_device_has(d, THUNK_FEATURE_GEM_VA) || !thunk_device_has(d, THUNK_FEATURE_EXPORT_DMABUF))
                return -EOPNOTSUPP;
        gi = thunk_gpu_index(d, gpu_id);
        if (gi < 0)
                return -EINVAL;
        if (flags == 0 || (flags & ~(uint32_t)_THUNK_GEM_VA_ALL))
                return -EINVAL;
        if (va == 0 || size == 0 || !page_aligned(d, va) || !page_aligned(d, offset) ||
            !page_aligned(d, size))
                return -EINVAL;
        if (va + size < va || offset + size < offset)
                return -EINVAL;
        *ret_gi = gi;
        return 0;
}

int thunk_gem_map_dmabuf(ThunkContext *c, int dmabuf_fd, uint32_t gpu_id, uint64_t va, uint64_t offset,
                         uint64_t size, uint32_t flags, ThunkGemMapping **ret)
{
        struct drm_prime_handle prime = {0};
        struct drm_amdgpu_gem_va gva = {0};
        ThunkGemMapping *m;
        bool had_ref;
        int gi, r;

        if (!c || dmabuf_fd < 0 || !ret)
                return -EINVAL;
        r = gem_check(c, gpu_id, va, offset, size, flags, &gi);
        if (r < 0)
                return r;
        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;

        prime.fd = dmabuf_fd;
        pthread_mutex_lock(&c->lock);
        r = thunk_ioctl(c->dev, c->render_fds[gi], DRM_IOCTL_PRIME_FD_TO_HANDLE, &prime);
        if (r < 0) {
                pthread_mutex_unlock(&c->lock);
                free(m);
                return r;
        }
        had_ref = gem_tracked(c, (size_t)gi, prime.handle);
        r = gem_ref(c, (size_t)gi, prime.handle);
        if (r < 0 && !had_ref)
                gem_close_untracked(c, (size_t)gi, prime.handle);
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
                free(m);
                return r;
        }

        gva.handle = prime.handle;
        gva.operation = AMDGPU_VA_OP_MAP;
        gva.flags = gem_va_flags(flags);
        gva.va_address = va;
        gva.offset_in_bo = offset;
        gva.map_size = size;
        r = thunk_ioctl(c->dev, c->render_fds[gi], DRM_IOCTL_AMDGPU_GEM_VA, &gva);
        if (r < 0) {
                pthread_mutex_lock(&c->lock);
                (void)gem_unref(c, (size_t)gi, prime.handle);
                pthread_mutex_unlock(&c->lock);
                free(m);
                return r;
        }

        *m = (ThunkGemMapping){
                .ctx = c,
                .gpu_index = (size_t)gi,
                .gem_handle = prime.handle,
                .va = va,
                .offset = offset,
                .size = size,
                .flags = flags,
        };
        pthread_mutex_lock(&c->lock);
        THUNK_LIST_PUSH(c->gem_maps, m);
        pthread_mutex_unlock(&c->lock);
        *ret = m;
        return 0;
}

int thunk_gem_map_bo(ThunkContext *c, ThunkBo *bo, uint32_t gpu_id, uint64_t va, uint64_t offset,
                     uint64_t size, uint32_t flags, ThunkGemMapping **ret)
{
        int gi, fd = -1, r;

        if (!c || !bo || !ret)
                return -EINVAL;
        /* The BO may belong to another context, but not to another device (another KFD). */
        if (bo->ctx->dev != c->dev || bo->info.kind == THUNK_MEM_USERPTR)
                return -EINVAL;
        r = gem_check(c, gpu_id, va, offset, size, flags, &gi);
        if (r < 0)
                return r;
        if (offset + size > bo->info.size)
                return -EINVAL;
        r = export_dmabuf(bo, &fd);
        if (r < 0)
                return r;
        r = thunk_gem_map_dmabuf(c, fd, gpu_id, va, offset, size, flags, ret);
        /* A dmabuf fd is the caller's own file in both worlds, not a seam fd. */
        (void)close(fd);
        return r;
}

int thunk_gem_unmap(ThunkGemMapping *m)
{
        struct drm_amdgpu_gem_va gva = {0};
        ThunkContext *c;
        int r;

        if (!m)
                return -EINVAL;
        c = m->ctx;
        gva.handle = m->gem_handle;
        gva.operation = AMDGPU_VA_OP_UNMAP;
        gva.flags = gem_va_flags(m->flags);
        gva.va_address = m->va;
        gva.offset_in_bo = m->offset;
        gva.map_size = m->size;
        r = thunk_ioctl(c->dev, c->render_fds[m->gpu_index], DRM_IOCTL_AMDGPU_GEM_VA, &gva);
        if (r < 0)
                return r;
        /* The VA is gone; a failing GEM_CLOSE only leaves the handle for the context's teardown. */
        pthread_mutex_lock(&c->lock);
        (void)gem_unref(c, m->gpu_index, m->gem_handle);
        gem_map_destroy(m);
        pthread_mutex_unlock(&c->lock);
        return 0;
}
