/* The KFD driver: the driver seam over the thunk, on the kernel's /dev/kfd or the built-in KFD model. */
#include "driver-kfd.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amdgpu_drm.h>

#include "doorbell-relay.h"
#include "kfd-compat.h"
#include "model.h"
#include "thunk.h"

/* The protocol's SVM numbers are the KFD's (driver.h): the broker passes them through unchanged. */
_Static_assert((int)DRIVER_SVM_ATTR_PREFERRED_LOC == (int)KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_PREFETCH_LOC == (int)KFD_IOCTL_SVM_ATTR_PREFETCH_LOC, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_ACCESS == (int)KFD_IOCTL_SVM_ATTR_ACCESS, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_ACCESS_IN_PLACE == (int)KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_NO_ACCESS == (int)KFD_IOCTL_SVM_ATTR_NO_ACCESS, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_SET_FLAGS == (int)KFD_IOCTL_SVM_ATTR_SET_FLAGS, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_CLR_FLAGS == (int)KFD_IOCTL_SVM_ATTR_CLR_FLAGS, "svm attr");
_Static_assert((int)DRIVER_SVM_ATTR_GRANULARITY == (int)KFD_IOCTL_SVM_ATTR_GRANULARITY, "svm attr");
_Static_assert(DRIVER_SVM_LOCATION_SYSMEM == KFD_IOCTL_SVM_LOCATION_SYSMEM, "svm location");
_Static_assert(DRIVER_SVM_LOCATION_UNDEFINED == KFD_IOCTL_SVM_LOCATION_UNDEFINED, "svm location");
_Static_assert(sizeof(DriverSvmAttr) == sizeof(ThunkSvmAttr), "svm attr layout");

/* Who hears a context's interrupts (driver_ctx_set_interrupt): the thunk calls irq_relay() with it. */
typedef struct IrqHook {
        struct IrqHook *next;
        ThunkContext *ctx;
        DriverInterruptFn fn;
        void *arg;
} IrqHook;

typedef struct KfdDriver {
        Driver base;
        pthread_mutex_t hooks_lock; /* the list (the hooks themselves are read on the driver's thread) */
        IrqHook *hooks;
        ThunkDevice *dev;
        ThunkContext *primary;
        ThunkModel *model;    /* NULL on the kernel */
        DoorbellRelay *relay; /* rings the queues' doorbells: on the kernel, and on a model with doorbells */
} KfdDriver;

/* The driver's handles are the thunk's own objects, passed through as opaque pointers. */
static KfdDriver *kfd(Driver *d)
{
        return (KfdDriver *)d;
}

static const KfdDriver *ckfd(const Driver *d)
{
        return (const KfdDriver *)d;
}

static ThunkContext *tctx(DriverCtx *c)
{
        return (ThunkContext *)(void *)c;
}

static ThunkBo *tbo(DriverMem *m)
{
        return (ThunkBo *)(void *)m;
}

static const ThunkBo *ctbo(const DriverMem *m)
{
        return (const ThunkBo *)(const void *)m;
}

/* DRIVER_MEM_* to the thunk's allocation flags. */
static uint32_t thunk_flags(uint32_t f)
{
        uint32_t t = THUNK_MEM_NO_SUBSTITUTE;

        if (!(f & DRIVER_MEM_READ_ONLY))
                t |= THUNK_MEM_WRITABLE;
        if (f & DRIVER_MEM_EXECUTABLE)
                t |= THUNK_MEM_EXECUTABLE;
        if (f & DRIVER_MEM_HOST_VISIBLE)
                t |= THUNK_MEM_PUBLIC;
        if (f & DRIVER_MEM_COHERENT)
                t |= THUNK_MEM_COHERENT;
        if (f & DRIVER_MEM_UNCACHED)
                t |= THUNK_MEM_UNCACHED;
        if (f & DRIVER_MEM_EXT_COHERENT)
                t |= THUNK_MEM_EXT_COHERENT;
        if (f & DRIVER_MEM_CONTIGUOUS)
                t |= THUNK_MEM_CONTIGUOUS;
        return t;
}

static Driver *k_close(Driver *d)
{
        KfdDriver *k = kfd(d);

        doorbell_relay_free(k->relay); /* before the contexts' doorbells are unmapped */
        thunk_device_close(k->dev);
        while (k->hooks) {
                IrqHook *h = k->hooks;
                k->hooks = h->next;
                free(h);
        }
        pthread_mutex_destroy(&k->hooks_lock);
        free(k);
        return NULL;
}

static const char *k_name(const Driver *d)
{
        return thunk_device_backend_name(ckfd(d)->dev);
}

static void k_version(const Driver *d, uint32_t *ret_major, uint32_t *ret_minor)
{
        thunk_device_version(ckfd(d)->dev, ret_major, ret_minor);
}

static unsigned k_caps(const Driver *d)
{
        const KfdDriver *k = ckfd(d);
        unsigned c = 0;

        if (thunk_device_has(k->dev, THUNK_FEATURE_CREATE_PROCESS))
                c |= DRIVER_CAP_PRIVATE_VM;
        /* an SVM call is one ioctl on the daemon's own context: the kernel takes them from any thread, and
         * the model serialises its ioctls */
        if (thunk_device_has(k->dev, THUNK_FEATURE_SVM))
                c |= DRIVER_CAP_MANAGED | DRIVER_CAP_THREADED_SVM;
        if (thunk_device_has(k->dev, THUNK_FEATURE_GEM_VA))
                c |= DRIVER_CAP_VA_GRANTS;
        if (thunk_device_has(k->dev, THUNK_FEATURE_EXPORT_DMABUF))
                c |= DRIVER_CAP_EXPORT;
        /* the model gives a buffer a memory file of the daemon's once it can be shared, and carves the rest
         * out of one file per GPU; the kernel's BOs cost no fd */
        if (k->model)
                c |= DRIVER_CAP_FD_PER_SHARED_BUFFER | DRIVER_CAP_TEST_FAULTS | DRIVER_CAP_BACKEND_STATS;
        if (k->relay)
                c |= DRIVER_CAP_DOORBELL_RELAY;
        return c;
}

static const ThunkTopology *k_topology(const Driver *d)
{
        return thunk_device_topology(ckfd(d)->dev);
}

static size_t k_gpu_count(const Driver *d)
{
        return thunk_device_gpu_count(ckfd(d)->dev);
}

static int k_gpu(const Driver *d, size_t index, DriverGpu *ret)
{
        const KfdDriver *k = ckfd(d);
        const ThunkGpu *g = thunk_device_gpu(k->dev, index);
        const ThunkNode *n;

        if (!g)
                return -ENODEV;
        n = thunk_topology_gpu_by_id(thunk_device_topology(k->dev), g->gpu_id);
        ret->gpu_id = g->gpu_id;
        ret->vram_bytes = n ? n->local_mem_size : 0;
        ret->numa_node = n ? n->numa_node : -1;
        if (ret->vram_bytes == 0) /* an APU: its memory is what the driver lets it have */
                (void)thunk_context_available_memory(k->primary, g->gpu_id, &ret->vram_bytes);
        return 0;
}

static void k_svm_aperture(const Driver *d, uint64_t *ret_base, uint64_t *ret_limit)
{
        thunk_device_svm_aperture(ckfd(d)->dev, ret_base, ret_limit);
}

static DriverCtx *k_ctx_primary(Driver *d)
{
        return (DriverCtx *)(void *)kfd(d)->primary;
}

static int k_ctx_new(Driver *d, DriverCtx **ret)
{
        ThunkContext *c;
        int r;

        if (!thunk_device_has(kfd(d)->dev, THUNK_FEATURE_CREATE_PROCESS))
                return -EOPNOTSUPP;
        r = thunk_context_new(kfd(d)->dev, &c);
        if (r < 0)
                return r;
        *ret = (DriverCtx *)(void *)c;
        return 0;
}

/* Take @ctx's hook out of the list; the caller frees it once the thunk no longer calls it. */
static IrqHook *hook_take(KfdDriver *k, ThunkContext *ctx)
{
        IrqHook *h = NULL;

        pthread_mutex_lock(&k->hooks_lock);
        for (IrqHook **pp = &k->hooks; *pp; pp = &(*pp)->next)
                if ((*pp)->ctx == ctx) {
                        h = *pp;
                        *pp = h->next;
                        break;
                }
        pthread_mutex_unlock(&k->hooks_lock);
        return h;
}

static void k_ctx_free(Driver *d, DriverCtx *ctx)
{
        /* the relay lets go of the context's doorbells before they are unmapped; the context's end stops
         * its interrupts: its hook goes after it */
        doorbell_relay_remove_owner(kfd(d)->relay, ctx);
        thunk_context_free(tctx(ctx));
        free(hook_take(kfd(d), tctx(ctx)));
}

_Static_assert(sizeof(DriverTileConfig) == sizeof(ThunkTileConfig), "tile config layout");

static int k_tile_config(Driver *d, uint32_t gpu_id, DriverTileConfig *ret)
{
        ThunkTileConfig t;
        int r = thunk_context_tile_config(kfd(d)->primary, gpu_id, &t);

        if (r == 0)
                memcpy(ret, &t, sizeof(*ret));
        return r;
}

static int k_available_memory(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t *ret_bytes)
{
        return thunk_context_available_memory(ctx ? tctx(ctx) : kfd(d)->primary, gpu_id, ret_bytes);
}

static int k_mem_alloc_vram(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                            uint32_t flags, DriverMem **ret)
{
        ThunkAllocArgs ta = {.kind = THUNK_MEM_VRAM,
                             .gpu_id = gpu_id,
                             .va = va,
                             .size = size,
                             .flags = thunk_flags(flags)};
        (void)d;
        return thunk_bo_alloc(tctx(ctx), &ta, (ThunkBo **)(void *)ret);
}

static int k_mem_register_host(Driver *d, uint32_t gpu_id, uint64_t va, uint64_t size, uint32_t flags,
                               DriverMem **ret)
{
        /* the kernel keeps USERPTR with the process that registered the pages: the primary context */
        ThunkAllocArgs ta = {
                .kind = THUNK_MEM_USERPTR,
                .gpu_id = gpu_id,
                .va = va,
                .size = size,
                .userptr = va,
                .flags = thunk_flags(flags) & ~(uint32_t)(THUNK_MEM_PUBLIC | THUNK_MEM_CONTIGUOUS),
        };
        return thunk_bo_alloc(kfd(d)->primary, &ta, (ThunkBo **)(void *)ret);
}

static int k_mem_alloc_gtt(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                           uint32_t flags, DriverMem **ret)
{
        ThunkAllocArgs ta = {.kind = THUNK_MEM_GTT,
                             .gpu_id = gpu_id,
                             .va = va,
                             .size = size,
                             .flags = thunk_flags(flags) &
                                      ~(uint32_t)(THUNK_MEM_PUBLIC | THUNK_MEM_CONTIGUOUS)};
        (void)d;
        return thunk_bo_alloc(tctx(ctx), &ta, (ThunkBo **)(void *)ret);
}

static int k_mem_import(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, DriverMem **ret)
{
        (void)d;
        return thunk_bo_import_dmabuf(tctx(ctx), dmabuf_fd, gpu_id, 0, (ThunkBo **)(void *)ret);
}

static int k_mem_free(Driver *d, DriverMem *m)
{
        (void)d;
        return thunk_bo_free(tbo(m));
}

static uint64_t k_mem_size(const Driver *d, const DriverMem *m)
{
        (void)d;
        return thunk_bo_info(ctbo(m))->size;
}

static int k_mem_map(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        (void)d;
        return thunk_bo_map(tbo(m), gpu_ids, n);
}

static int k_mem_unmap(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        (void)d;
        return thunk_bo_unmap(tbo(m), gpu_ids, n);
}

static int k_mem_unmap_all(Driver *d, DriverMem *m)
{
        (void)d;
        return thunk_bo_unmap_all(tbo(m));
}

static bool k_mem_is_mapped(const Driver *d, const DriverMem *m, uint32_t gpu_id)
{
        (void)d;
        return thunk_bo_is_mapped(ctbo(m), gpu_id);
}

static int k_mem_export(Driver *d, DriverMem *m, int *ret_fd)
{
        (void)d;
        return thunk_bo_export_dmabuf(tbo(m), ret_fd);
}

static bool k_dmabuf_is_own(Driver *d, DriverCtx *ctx, int dmabuf_fd)
{
        /* the driver describes only its own dmabufs */
        ThunkDmabufInfo info;
        (void)d;
        return thunk_dmabuf_info(tctx(ctx), dmabuf_fd, NULL, 0, &info) == 0;
}

static int k_grant(Driver *d, DriverCtx *ctx, DriverMem *m, uint32_t gpu_id, uint64_t va, uint64_t offset,
                   uint64_t size, int access, bool executable, DriverGrant **ret)
{
        uint32_t f = 0;

        if (!thunk_device_has(kfd(d)->dev, THUNK_FEATURE_GEM_VA))
                return -EOPNOTSUPP;
        if (access & DRIVER_ACCESS_READ)
                f |= THUNK_GEM_VA_READABLE;
        if (access == DRIVER_ACCESS_READ_WRITE)
                f |= THUNK_GEM_VA_WRITEABLE;
        if (executable)
                f |= THUNK_GEM_VA_EXECUTABLE;
        return thunk_gem_map_bo(tctx(ctx), tbo(m), gpu_id, va, offset, size, f,
                                (ThunkGemMapping **)(void *)ret);
}

static int k_revoke(Driver *d, DriverGrant *g)
{
        (void)d;
        return thunk_gem_unmap((ThunkGemMapping *)(void *)g);
}

static int k_managed_register(Driver *d, uint64_t va, uint64_t size, uint32_t flags)
{
        uint32_t set = KFD_IOCTL_SVM_FLAG_HOST_ACCESS;
        ThunkSvmAttr a;

        if (!thunk_device_has(kfd(d)->dev, THUNK_FEATURE_SVM))
                return -EOPNOTSUPP;
        if (flags & DRIVER_MEM_COHERENT)
                set |= KFD_IOCTL_SVM_FLAG_COHERENT;
        if (flags & DRIVER_MEM_EXT_COHERENT)
                set |= KFD_IOCTL_SVM_FLAG_EXT_COHERENT;
        if (flags & DRIVER_MEM_READ_ONLY)
                set |= KFD_IOCTL_SVM_FLAG_GPU_RO;
        if (flags & DRIVER_MEM_EXECUTABLE)
                set |= KFD_IOCTL_SVM_FLAG_GPU_EXEC;
        a = (ThunkSvmAttr){KFD_IOCTL_SVM_ATTR_SET_FLAGS, set};
        /* SVM applies to the address space of the KFD process: the daemon's, where these pages are mapped */
        return thunk_svm_set(kfd(d)->primary, va, size, &a, 1);
}

/*
 * The driver removes its SVM ranges when the pages go (an MMU notifier in the kernel) and finishes that work
 * at its next SVM call; one GET_ATTR flushes it before the VA is reused, and its -EFAULT (nothing mapped
 * there now) is expected.
 */
static void k_managed_forget(Driver *d, uint64_t va, uint64_t size)
{
        ThunkSvmAttr a = {KFD_IOCTL_SVM_ATTR_GRANULARITY, 0};

        if (thunk_device_has(kfd(d)->dev, THUNK_FEATURE_SVM))
                (void)thunk_svm_get(kfd(d)->primary, va, size, &a, 1);
}

static int k_svm_set(Driver *d, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n)
{
        return thunk_svm_set(kfd(d)->primary, va, size, (const ThunkSvmAttr *)(const void *)a, n);
}

static int k_svm_get(Driver *d, uint64_t va, uint64_t size, DriverSvmAttr *a, size_t n)
{
        return thunk_svm_get(kfd(d)->primary, va, size, (ThunkSvmAttr *)(void *)a, n);
}

static int k_stats(const Driver *d, DriverStats *ret)
{
        ThunkModelStats st;

        if (!ckfd(d)->model)
                return -EOPNOTSUPP;
        thunk_model_get_stats(ckfd(d)->model, &st);
        memset(ret, 0, sizeof(*ret));
        ret->contexts = st.contexts;
        ret->buffers = st.bufs;
        ret->handles = st.mems;
        ret->imports = st.imports;
        ret->mappings = st.mappings;
        ret->gem_handles = st.gem_handles;
        ret->svm_ranges = st.svm_ranges;
        ret->system_bytes = st.system_used;
        ret->queues = st.queues;
        for (uint32_t i = 0; i < st.n_gpus && i < THUNK_MODEL_MAX_GPUS; i++)
                ret->vram_bytes += st.vram_used[i];
        return 0;
}

/* The operations fault injection can name, by the ioctl they issue. */
static const struct {
        const char *name;
        unsigned long req;
} fault_ioctls[] = {
        {"acquire_vm", AMDKFD_IOC_ACQUIRE_VM},
        {"alloc_memory_of_gpu", AMDKFD_IOC_ALLOC_MEMORY_OF_GPU},
        {"free_memory_of_gpu", AMDKFD_IOC_FREE_MEMORY_OF_GPU},
        {"map_memory_to_gpu", AMDKFD_IOC_MAP_MEMORY_TO_GPU},
        {"unmap_memory_from_gpu", AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU},
        {"export_dmabuf", AMDKFD_IOC_EXPORT_DMABUF},
        {"import_dmabuf", AMDKFD_IOC_IMPORT_DMABUF},
        {"svm", AMDKFD_IOC_SVM},
        {"create_process", AMDKFD_IOC_CREATE_PROCESS},
        {"available_memory", AMDKFD_IOC_AVAILABLE_MEMORY},
        {"gem_va", DRM_IOCTL_AMDGPU_GEM_VA},
        {"gem_close", DRM_IOCTL_GEM_CLOSE},
        {"prime_handle_to_fd", DRM_IOCTL_PRIME_HANDLE_TO_FD},
        {"prime_fd_to_handle", DRM_IOCTL_PRIME_FD_TO_HANDLE},
};

static int k_test_faults(Driver *d, const char *path, char *errbuf, size_t errlen)
{
        ThunkModel *model = kfd(d)->model;
        char name[64];
        unsigned nth;
        int err, n = 0, r = 0;
        FILE *f;

        if (!model)
                return -EOPNOTSUPP;
        f = fopen(path, "re");
        if (!f) {
                r = -errno;
                snprintf(errbuf, errlen, "cannot read %s: %s", path, strerror(-r));
                return r;
        }
        thunk_model_clear_faults(model);
        while (r >= 0 && fscanf(f, "%63s %u %d", name, &nth, &err) == 3) {
                unsigned long req = strtoul(name, NULL, 0);
                for (size_t i = 0; i < sizeof(fault_ioctls) / sizeof(fault_ioctls[0]); i++)
                        if (strcmp(name, fault_ioctls[i].name) == 0)
                                req = fault_ioctls[i].req;
                r = req ? thunk_model_inject_fault(model, req, nth, err) : -EINVAL;
                if (r >= 0)
                        n++;
                else
                        snprintf(errbuf, errlen, "bad entry '%s': %s", name, strerror(-r));
        }
        fclose(f);
        return r < 0 ? r : n;
}

/* the thunk's queue arguments are the seam's, up to the write pointer's file */
_Static_assert(offsetof(DriverQueueArgs, wptr_fd) == sizeof(ThunkQueueArgs), "queue args layout");
_Static_assert((int)DRIVER_QUEUE_COMPUTE_AQL == (int)THUNK_QUEUE_COMPUTE_AQL, "queue type");
_Static_assert((int)DRIVER_QUEUE_SDMA_XGMI == (int)THUNK_QUEUE_SDMA_XGMI, "queue type");

static int k_queue_create(Driver *d, DriverCtx *ctx, const DriverQueueArgs *q, uint32_t *ret_id,
                          uint64_t *ret_doorbell_offset)
{
        KfdDriver *k = kfd(d);
        ThunkQueueArgs t;
        volatile uint64_t *db;
        int r;

        if (k->relay && q->wptr_fd < 0)
                return -EFAULT; /* the broker passes the write pointer's file (DRIVER_CAP_DOORBELL_RELAY) */
        memcpy(&t, q, sizeof(t));
        r = thunk_queue_create(tctx(ctx), &t, ret_id, ret_doorbell_offset);
        if (r < 0 || !k->relay)
                return r;
        r = thunk_queue_doorbell(tctx(ctx), q->gpu_id, *ret_doorbell_offset, &db);
        if (r == 0)
                r = doorbell_relay_add(k->relay, ctx, *ret_id, q->wptr_fd, q->wptr_fd_offset, db,
                                       q->type == DRIVER_QUEUE_COMPUTE_AQL);
        if (r < 0)
                (void)thunk_queue_destroy(tctx(ctx), *ret_id);
        return r;
}

static int k_queue_destroy(Driver *d, DriverCtx *ctx, uint32_t id)
{
        int r = thunk_queue_destroy(tctx(ctx), id);

        /* a queue the kernel no longer knows is not rung either way */
        doorbell_relay_remove(kfd(d)->relay, ctx, id);
        return r;
}

static int k_queue_update(Driver *d, DriverCtx *ctx, uint32_t id, uint64_t ring_va, uint64_t ring_size,
                          uint32_t percentage, uint32_t priority)
{
        (void)d;
        return thunk_queue_update(tctx(ctx), id, ring_va, ring_size, percentage, priority);
}

/* On the thunk's thread, under its lock: the thunk's interrupt as the driver seam's. */
static void irq_relay(void *arg, const ThunkInterrupt *t)
{
        const IrqHook *h = arg;
        DriverInterrupt irq = {.type = t->type == THUNK_IRQ_VM_FAULT ? DRIVER_IRQ_VM_FAULT
                                                                     : DRIVER_IRQ_SIGNAL,
                               .partial_id = t->partial_id,
                               .valid_bits = t->valid_bits,
                               .gpu_id = t->gpu_id,
                               .va = t->va,
                               .not_present = t->not_present,
                               .read_only = t->read_only,
                               .no_execute = t->no_execute};
        h->fn(h->arg, &irq);
}

static int k_ctx_set_interrupt(Driver *d, DriverCtx *ctx, DriverInterruptFn fn, void *arg)
{
        KfdDriver *k = kfd(d);
        IrqHook *old, *h = NULL;
        int r;

        if (fn) {
                h = calloc(1, sizeof(*h));
                if (!h)
                        return -ENOMEM;
                *h = (IrqHook){.ctx = tctx(ctx), .fn = fn, .arg = arg};
        }
        /* once the thunk holds the new hook (or none), the old one is no longer called */
        r = thunk_context_set_interrupt(tctx(ctx), fn ? irq_relay : NULL, h);
        if (r < 0) {
                free(h);
                return r;
        }
        old = hook_take(k, tctx(ctx));
        free(old);
        if (h) {
                pthread_mutex_lock(&k->hooks_lock);
                h->next = k->hooks;
                k->hooks = h;
                pthread_mutex_unlock(&k->hooks_lock);
        }
        return 0;
}

static const DriverOps kfd_ops = {
        .close = k_close,
        .name = k_name,
        .version = k_version,
        .caps = k_caps,
        .topology = k_topology,
        .gpu_count = k_gpu_count,
        .gpu = k_gpu,
        .svm_aperture = k_svm_aperture,
        .ctx_primary = k_ctx_primary,
        .ctx_new = k_ctx_new,
        .ctx_free = k_ctx_free,
        .available_memory = k_available_memory,
        .tile_config = k_tile_config,
        .mem_alloc_vram = k_mem_alloc_vram,
        .mem_register_host = k_mem_register_host,
        .mem_alloc_gtt = k_mem_alloc_gtt,
        .mem_import = k_mem_import,
        .mem_free = k_mem_free,
        .mem_size = k_mem_size,
        .mem_map = k_mem_map,
        .mem_unmap = k_mem_unmap,
        .mem_unmap_all = k_mem_unmap_all,
        .mem_is_mapped = k_mem_is_mapped,
        .mem_export = k_mem_export,
        .dmabuf_is_own = k_dmabuf_is_own,
        .grant = k_grant,
        .revoke = k_revoke,
        .managed_register = k_managed_register,
        .managed_forget = k_managed_forget,
        .svm_set = k_svm_set,
        .svm_get = k_svm_get,
        .queue_create = k_queue_create,
        .queue_destroy = k_queue_destroy,
        .queue_update = k_queue_update,
        .ctx_set_interrupt = k_ctx_set_interrupt,
        .stats = k_stats,
        .test_faults = k_test_faults,
};

int driver_kfd_open(const DriverKfdOptions *o, Driver **ret, char *errbuf, size_t errlen)
{
        ThunkOptions to = {
                .backend = o->model ? THUNK_BACKEND_MODEL : THUNK_BACKEND_KFD,
                .topology_root = o->topology_root,
                .model_kfd_minor = o->model ? o->model_kfd_minor : 0,
                .model_doorbells = o->model && o->model_doorbells,
        };
        KfdDriver *k = calloc(1, sizeof(*k));
        int r;

        if (!k)
                return -ENOMEM;
        r = thunk_device_open(&to, &k->dev, errbuf, errlen);
        if (r < 0) {
                free(k);
                return r;
        }
        k->base.ops = &kfd_ops;
        pthread_mutex_init(&k->hooks_lock, NULL);
        k->primary = thunk_device_primary_context(k->dev);
        k->model = thunk_device_model(k->dev);
        if (!k->model || o->model_doorbells) {
                r = doorbell_relay_new(&k->relay);
                if (r < 0) {
                        snprintf(errbuf, errlen, "cannot start the doorbell relay: %s", strerror(-r));
                        k_close(&k->base);
                        return r;
                }
        }
        *ret = &k->base;
        return 0;
}

static int open_kernel(const DriverOpenArgs *a, Driver **ret, char *errbuf, size_t errlen)
{
        DriverKfdOptions o = {.topology_root = a->topology_root};
        return driver_kfd_open(&o, ret, errbuf, errlen);
}

static int open_model(const DriverOpenArgs *a, Driver **ret, char *errbuf, size_t errlen)
{
        DriverKfdOptions o = {.model = true,
                              .topology_root = a->topology_root,
                              .model_kfd_minor = a->model_kfd_minor,
                              .model_doorbells = true};
        return driver_kfd_open(&o, ret, errbuf, errlen);
}

const DriverBackend driver_kfd_backend = {
        .name = "kfd",
        .summary = "the kernel's /dev/kfd",
        .open = open_kernel,
};

const DriverBackend driver_model_backend = {
        .name = "model",
        .summary = "the built-in KFD model (a simulated node from a preset)",
        .flags = DRIVER_BACKEND_PRESET,
        .open = open_model,
};

void driver_kfd_model_minor_range(uint32_t *ret_min, uint32_t *ret_max)
{
        *ret_min = THUNK_MODEL_KFD_MINOR_MIN;
        *ret_max = THUNK_MODEL_KFD_MINOR_MAX;
}

ThunkDevice *driver_kfd_device(Driver *d)
{
        return d && d->ops == &kfd_ops ? kfd(d)->dev : NULL;
}

ThunkModel *driver_kfd_model(Driver *d)
{
        return d && d->ops == &kfd_ops ? kfd(d)->model : NULL;
}
