/* The KFD driver: the driver seam over the thunk, on the kernel's /dev/kfd or the built-in KFD model. */
#include "driver-kfd.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <amdgpu_drm.h>

#include "doorbell-relay.h"
#include "kfd-compat.h"
#include "kfd-ioctls.h"
#include "model.h"
#include "thunk.h"
#include "macro.h"

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

/*
 * Who hears a context's interrupts (driver_ctx_set_interrupt), and how: KFD sets only the context's own
 * events, and only for waits on that context, so each client context that has events has a thread of the
 * driver's that waits on the events mirrored there (driver_event_mirror_add) and reports each that fired.
 *
 * Besides the mirrored events the context holds two of the listener's, neither of which takes a signal
 * slot: a memory event, which a GPU VM fault fires, and a "kick" event (a node-change event, which nothing
 * fires) that is destroyed and made again to wake the thread: KFD ends every wait on an event that is
 * destroyed. The mirrored events are manual-reset: a wait for any of them does not say which, so after it
 * the thread looks at each (a wait of 0 ms) and resets those signalled.
 */
typedef struct KfdDriver KfdDriver;

typedef struct Listener {
        struct Listener *next;
        KfdDriver *k;
        ThunkContext *ctx;
        pthread_mutex_t lock; /* all below; held while @fn is called */
        DriverInterruptFn fn;
        void *arg;
        uint32_t *ids; /* the mirrored signal events */
        size_t n, cap;
        bool started; /* its memory event made and its thread running */
        bool has_kick;
        bool signal_page; /* a signal event was made: the context's signal page is set */
        bool stop;
        uint32_t memory, kick;
        pthread_t thread;
} Listener;

struct KfdDriver {
        Driver base;
        pthread_mutex_t listeners_lock; /* the list and the count */
        Listener *listeners;
        unsigned n_threads, max_threads; /* listeners whose thread runs, and the most at once */
        ThunkDevice *dev;
        ThunkContext *primary;
        ThunkModel *model;    /* NULL on the kernel */
        DoorbellRelay *relay; /* rings the queues' doorbells: on the kernel, and on a model with doorbells */
        /* the kernel path served at the libc level by the model's preload (libgpumem-model-preload.so): its
         * books, as the model backend reports its own; NULL on a real kernel */
        int (*preload_stats)(char *buf, size_t len);
};

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

/* DRIVER_MEM_* in the thunk's allocation flags (but READ_ONLY: not THUNK_MEM_WRITABLE). */
static const FlagMap thunk_mem_flags[] = {
        {DRIVER_MEM_EXECUTABLE, THUNK_MEM_EXECUTABLE},     {DRIVER_MEM_HOST_VISIBLE, THUNK_MEM_PUBLIC},
        {DRIVER_MEM_COHERENT, THUNK_MEM_COHERENT},         {DRIVER_MEM_UNCACHED, THUNK_MEM_UNCACHED},
        {DRIVER_MEM_EXT_COHERENT, THUNK_MEM_EXT_COHERENT}, {DRIVER_MEM_CONTIGUOUS, THUNK_MEM_CONTIGUOUS},
};

static uint32_t thunk_flags(uint32_t f)
{
        uint32_t t = THUNK_MEM_NO_SUBSTITUTE | flags_map(f, thunk_mem_flags, ARRAY_SIZE(thunk_mem_flags));

        return f & DRIVER_MEM_READ_ONLY ? t : t | THUNK_MEM_WRITABLE;
}

static void listener_end(KfdDriver *k, ThunkContext *ctx);

static Driver *k_close(Driver *d)
{
        KfdDriver *k = kfd(d);

        doorbell_relay_free(k->relay); /* before the contexts' doorbells are unmapped */
        /* every client context is freed before the driver closes, and their listeners with them; the
         * primary context's (queues shared in it) stops here, before its events go */
        listener_end(k, k->primary);
        thunk_device_close(k->dev);
        pthread_mutex_destroy(&k->listeners_lock);
        free(k);
        return NULL;
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
        if (k->preload_stats)
                c |= DRIVER_CAP_BACKEND_STATS;
        if (k->relay)
                c |= DRIVER_CAP_DOORBELL_RELAY;
        c |= DRIVER_CAP_EVENT_MIRROR;
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
        ret->alloc_granularity = 0; /* the page */
        if (ret->vram_bytes == 0)   /* an APU: its memory is what the driver lets it have */
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

/* @ctx's listener, made (without its events or thread) if @make; NULL if none or out of memory. */
static Listener *listener_of(KfdDriver *k, ThunkContext *ctx, bool make)
{
        Listener *l;

        pthread_mutex_lock(&k->listeners_lock);
        for (l = k->listeners; l && l->ctx != ctx; l = l->next)
                ;
        if (!l && make && (l = calloc(1, sizeof(*l)))) {
                l->ctx = ctx;
                l->k = k;
                pthread_mutex_init(&l->lock, NULL);
                l->next = k->listeners;
                k->listeners = l;
        }
        pthread_mutex_unlock(&k->listeners_lock);
        return l;
}

/* Which of the mirrored events in @w are signalled: each looked at alone (a wait of 0 ms), and reset. The
 * listener's own are not: the memory event is auto-reset (KFD resets no other event than a signal event
 * from the CPU), so the wait that it ended consumed it and handed over its fault. */
static size_t listener_fired(Listener *l, const ThunkEventWait *w, size_t n, uint32_t *fired)
{
        size_t nf = 0;

        for (size_t i = 0; i < n; i++) {
                ThunkEventWait one = {.id = w[i].id};
                bool done = false;

                if (one.id == l->memory || (l->has_kick && one.id == l->kick))
                        continue;
                if (thunk_event_wait(l->ctx, &one, 1, false, 0, &done) < 0 || !done)
                        continue;
                (void)thunk_event_reset(l->ctx, one.id);
                fired[nf++] = one.id;
        }
        return nf;
}

/* How long a wait lasts: where no kick event could be made (out of memory), a change of the set of events
 * or the end waits that long; otherwise it is only a bound. */
enum { LISTEN_SHORT_MS = 50, LISTEN_LONG_MS = 1000 };

static void *listener_main(void *arg)
{
        Listener *l = arg;
        ThunkEventWait *w = NULL;
        uint32_t *fired = NULL;
        size_t cap = 0;

        for (;;) {
                ThunkEventWait fault = {0};
                bool done = false, faulted = false;
                uint32_t timeout;
                size_t n, nf;
                int r;

                pthread_mutex_lock(&l->lock);
                if (l->stop) {
                        pthread_mutex_unlock(&l->lock);
                        break;
                }
                n = l->n + 2;
                if (n > cap) {
                        ThunkEventWait *mw = realloc(w, n * sizeof(*w));
                        uint32_t *mf = mw ? realloc(fired, n * sizeof(*fired)) : NULL;
                        if (mw)
                                w = mw;
                        if (mf)
                                fired = mf;
                        if (!mw || !mf) /* out of memory: the control and memory events alone */
                                n = 2;
                        else
                                cap = n;
                        if (!w || !fired) {
                                pthread_mutex_unlock(&l->lock);
                                usleep(10000);
                                continue;
                        }
                }
                /* the kick event where it exists, the memory event, then the mirrored ones */
                size_t k0 = 0;
                if (l->has_kick)
                        w[k0++] = (ThunkEventWait){.id = l->kick};
                w[k0++] = (ThunkEventWait){.id = l->memory};
                for (size_t i = 0; i < l->n && k0 + i < n; i++)
                        w[k0 + i] = (ThunkEventWait){.id = l->ids[i]};
                n = k0 + (l->n < n - k0 ? l->n : n - k0);
                timeout = l->has_kick ? LISTEN_LONG_MS : LISTEN_SHORT_MS;
                pthread_mutex_unlock(&l->lock);

                /* a kick, or an event destroyed since the snapshot: -EIO or -EINVAL (the wait failed), and
                 * the next snapshot is current */
                r = thunk_event_wait(l->ctx, w, n, false, timeout, &done);
                if (r < 0 && r != -EINVAL && r != -EIO && r != -EINTR)
                        usleep(10000);
                if (r < 0 || !done)
                        continue;
                for (size_t i = 0; i < n; i++)
                        if (w[i].id == l->memory && w[i].faulted) {
                                faulted = true;
                                fault = w[i];
                        }
                nf = listener_fired(l, w, n, fired);
                pthread_mutex_lock(&l->lock);
                for (size_t i = 0; l->fn && i < nf; i++)
                        l->fn(l->arg, &(DriverInterrupt){.type = DRIVER_IRQ_SIGNAL,
                                                         .partial_id = fired[i],
                                                         .valid_bits = 32});
                if (l->fn && faulted)
                        l->fn(l->arg, &(DriverInterrupt){.type = DRIVER_IRQ_VM_FAULT,
                                                         .gpu_id = fault.gpu_id,
                                                         .va = fault.va,
                                                         .not_present = fault.not_present,
                                                         .read_only = fault.read_only,
                                                         .no_execute = fault.no_execute});
                pthread_mutex_unlock(&l->lock);
        }
        free(w);
        free(fired);
        return NULL;
}

/* Under l->lock: wakes the thread (it looks at the set of events again), by destroying the event it waits
 * on. The new kick event is made first, so that it cannot take the old one's id. */
static void listener_kick(Listener *l)
{
        uint32_t old = l->kick;
        bool had = l->has_kick;

        l->has_kick = thunk_event_create(l->ctx, KFD_IOC_EVENT_NODECHANGE, false, NULL, &l->kick) == 0;
        if (had)
                (void)thunk_event_destroy(l->ctx, old);
}

/* A thread more for a listener, if the limit allows: 0 or -EUSERS. */
static int listener_thread_take(KfdDriver *k)
{
        int r = 0;

        pthread_mutex_lock(&k->listeners_lock);
        if (k->n_threads >= k->max_threads)
                r = -EUSERS;
        else
                k->n_threads++;
        pthread_mutex_unlock(&k->listeners_lock);
        return r;
}

static void listener_thread_give(KfdDriver *k)
{
        pthread_mutex_lock(&k->listeners_lock);
        k->n_threads--;
        pthread_mutex_unlock(&k->listeners_lock);
}

/* Under l->lock: the listener's memory and kick events, and its thread. */
static int listener_start(Listener *l)
{
        pthread_attr_t at;
        int r;

        if (l->started)
                return 0;
        r = listener_thread_take(l->k);
        if (r < 0)
                return r;
        r = thunk_event_create(l->ctx, KFD_IOC_EVENT_MEMORY, true, NULL, &l->memory);
        if (r < 0) {
                listener_thread_give(l->k);
                return r;
        }
        l->has_kick = thunk_event_create(l->ctx, KFD_IOC_EVENT_NODECHANGE, false, NULL, &l->kick) == 0;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 64 << 10); /* one per client context: it only waits */
        r = -pthread_create(&l->thread, &at, listener_main, l);
        pthread_attr_destroy(&at);
        if (r < 0) {
                if (l->has_kick)
                        (void)thunk_event_destroy(l->ctx, l->kick);
                l->has_kick = false;
                (void)thunk_event_destroy(l->ctx, l->memory);
                listener_thread_give(l->k);
                return r;
        }
        l->started = true;
        return 0;
}

/* Stops @ctx's listener, if any, and frees it: before the context goes. */
static void listener_end(KfdDriver *k, ThunkContext *ctx)
{
        Listener *l = NULL;

        pthread_mutex_lock(&k->listeners_lock);
        for (Listener **pp = &k->listeners; *pp; pp = &(*pp)->next)
                if ((*pp)->ctx == ctx) {
                        l = *pp;
                        *pp = l->next;
                        break;
                }
        pthread_mutex_unlock(&k->listeners_lock);
        if (!l)
                return;
        pthread_mutex_lock(&l->lock);
        l->stop = true;
        if (l->started)
                listener_kick(l);
        pthread_mutex_unlock(&l->lock);
        if (l->started) { /* without a kick event it sees the stop at its next look (LISTEN_SHORT_MS) */
                pthread_join(l->thread, NULL);
                listener_thread_give(k);
        }
        pthread_mutex_destroy(&l->lock);
        free(l->ids);
        free(l);
}

static void k_ctx_free(Driver *d, DriverCtx *ctx)
{
        /* the relay lets go of the context's doorbells before they are unmapped, and its listener stops
         * before its events go with it */
        doorbell_relay_remove_owner(kfd(d)->relay, ctx);
        listener_end(kfd(d), tctx(ctx));
        thunk_context_free(tctx(ctx));
}

static int k_event_mirror_add(Driver *d, DriverCtx *ctx, DriverMem *page, uint32_t id)
{
        Listener *l = listener_of(kfd(d), tctx(ctx), true);
        const ThunkBo *bo = page ? tbo(page) : NULL;
        uint32_t got = 0;
        int r = 0;

        if (!l)
                return -ENOMEM;
        pthread_mutex_lock(&l->lock);
        if (l->n == l->cap) {
                size_t cap = l->cap ? l->cap * 2 : 16;
                uint32_t *more = realloc(l->ids, cap * sizeof(*more));
                if (!more) {
                        r = -ENOMEM;
                        goto out;
                }
                l->ids = more;
                l->cap = cap;
        }
        if ((r = listener_start(l)) < 0)
                goto out;
        /* the page only counts if it is a BO of this context (the kernel maps it as the signal page), and
         * only with the first signal event, which the kernel takes it with */
        if (bo && thunk_bo_context(bo) != tctx(ctx))
                bo = NULL;
        r = thunk_event_create(l->ctx, KFD_IOC_EVENT_SIGNAL, false, l->signal_page ? NULL : bo, &got);
        if (r < 0)
                goto out;
        l->signal_page = true;
        if (got != id) {
                (void)thunk_event_destroy(l->ctx, got);
                r = -EBUSY;
                goto out;
        }
        l->ids[l->n++] = id;
        listener_kick(l); /* the thread waits on it too from now */
out:
        pthread_mutex_unlock(&l->lock);
        return r;
}

static int k_ctx_listen(Driver *d, DriverCtx *ctx)
{
        Listener *l = listener_of(kfd(d), tctx(ctx), true);
        int r;

        if (!l)
                return -ENOMEM;
        pthread_mutex_lock(&l->lock);
        r = listener_start(l);
        pthread_mutex_unlock(&l->lock);
        return r;
}

static void k_event_mirror_remove(Driver *d, DriverCtx *ctx, uint32_t id)
{
        Listener *l = listener_of(kfd(d), tctx(ctx), false);

        if (!l)
                return;
        pthread_mutex_lock(&l->lock);
        for (size_t i = 0; i < l->n; i++)
                if (l->ids[i] == id) {
                        l->ids[i] = l->ids[--l->n];
                        (void)thunk_event_destroy(l->ctx, id); /* which ends the thread's wait, too */
                        break;
                }
        pthread_mutex_unlock(&l->lock);
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

/* A buffer of @kind in the context's VM, with the thunk's @tflags. */
static int alloc_bo(DriverCtx *ctx, ThunkMemKind kind, uint32_t gpu_id, uint64_t va, uint64_t size,
                    uint32_t tflags, DriverMem **ret)
{
        ThunkAllocArgs ta = {.kind = kind, .gpu_id = gpu_id, .va = va, .size = size, .flags = tflags};

        return thunk_bo_alloc(tctx(ctx), &ta, (ThunkBo **)(void *)ret);
}

static int k_mem_alloc_vram(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                            uint32_t flags, DriverMem **ret)
{
        (void)d;
        return alloc_bo(ctx, THUNK_MEM_VRAM, gpu_id, va, size, thunk_flags(flags), ret);
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
        (void)d;
        return alloc_bo(ctx, THUNK_MEM_GTT, gpu_id, va, size,
                        thunk_flags(flags) & ~(uint32_t)(THUNK_MEM_PUBLIC | THUNK_MEM_CONTIGUOUS), ret);
}

static int k_mem_import(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, DriverMem **ret)
{
        (void)d;
        return thunk_bo_import_dmabuf(tctx(ctx), dmabuf_fd, gpu_id, 0, (ThunkBo **)(void *)ret);
}

/* DRIVER_MEM_* in the KFD's allocation flags, for the model's adopted buffers (but READ_ONLY). */
static const FlagMap kfd_adopt_flags[] = {
        {DRIVER_MEM_HOST_VISIBLE, KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC},
        {DRIVER_MEM_COHERENT, KFD_IOC_ALLOC_MEM_FLAGS_COHERENT},
        {DRIVER_MEM_UNCACHED, KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED},
};

static int adopt(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va, uint64_t size,
                 uint32_t flags, bool gtt, DriverMem **ret)
{
        ThunkModel *model = kfd(d)->model;
        ThunkBo *bo = NULL;
        int r;

        if (model) {
                /* the model of the daemon before this one is gone: this one takes the buffer's file back */
                uint32_t kf = (gtt ? KFD_IOC_ALLOC_MEM_FLAGS_GTT : KFD_IOC_ALLOC_MEM_FLAGS_VRAM) |
                              KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE |
                              flags_map(flags, kfd_adopt_flags, ARRAY_SIZE(kfd_adopt_flags));
                if (!(flags & DRIVER_MEM_READ_ONLY))
                        kf |= KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
                r = thunk_model_adopt(model, dmabuf_fd, gpu_id, kf);
                if (r < 0)
                        return r;
        }
        r = thunk_bo_import_dmabuf(tctx(ctx), dmabuf_fd, gpu_id, va, &bo);
        if (model)
                thunk_model_adopt_release(model, dmabuf_fd); /* the import holds it now, or nothing does */
        if (r < 0)
                return r;
        if (thunk_bo_info(bo)->size != size ||
            thunk_bo_info(bo)->kind != (gtt ? THUNK_MEM_GTT : THUNK_MEM_VRAM)) {
                (void)thunk_bo_free(bo);
                return -EINVAL;
        }
        *ret = (DriverMem *)(void *)bo;
        return 0;
}

static int k_mem_adopt_vram(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                            uint64_t size, uint32_t flags, DriverMem **ret)
{
        return adopt(d, ctx, dmabuf_fd, gpu_id, va, size, flags, false, ret);
}

static int k_mem_adopt_gtt(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                           uint64_t size, uint32_t flags, DriverMem **ret)
{
        return adopt(d, ctx, dmabuf_fd, gpu_id, va, size, flags, true, ret);
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

static uint64_t k_mem_mapped_mask(const Driver *d, const DriverMem *m)
{
        return thunk_bo_mapped_mask(ctbo(m));
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

static int k_file_seal(Driver *d, int fd)
{
        /* the kernel's GPU mappings hold the pages themselves; only the model maps files to reach them */
        return kfd(d)->model ? thunk_model_seal(kfd(d)->model, fd) : 0;
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

/* DRIVER_MEM_* in SVM's range flags. */
static const FlagMap svm_flags[] = {
        {DRIVER_MEM_COHERENT, KFD_IOCTL_SVM_FLAG_COHERENT},
        {DRIVER_MEM_EXT_COHERENT, KFD_IOCTL_SVM_FLAG_EXT_COHERENT},
        {DRIVER_MEM_READ_ONLY, KFD_IOCTL_SVM_FLAG_GPU_RO},
        {DRIVER_MEM_EXECUTABLE, KFD_IOCTL_SVM_FLAG_GPU_EXEC},
};

static int k_managed_register(Driver *d, uint64_t va, uint64_t size, uint32_t flags)
{
        ThunkSvmAttr a = {KFD_IOCTL_SVM_ATTR_SET_FLAGS,
                          KFD_IOCTL_SVM_FLAG_HOST_ACCESS |
                                  flags_map(flags, svm_flags, ARRAY_SIZE(svm_flags))};

        if (!thunk_device_has(kfd(d)->dev, THUNK_FEATURE_SVM))
                return -EOPNOTSUPP;
        /* SVM applies to the address space of the KFD process: the daemon's, where these pages are mapped */
        return thunk_svm_set(kfd(d)->primary, va, size, &a, 1);
}

/*
 * The driver removes its SVM ranges when the pages go (an MMU notifier in the kernel) and finishes that work
 * at its next SVM call; one GET_ATTR flushes it before the VA is reused, and its -EFAULT (nothing mapped
 * there now) is expected.
 */
static int k_cpu_unmap(Driver *d, uint64_t va, uint64_t size)
{
        return thunk_cpu_unmap(kfd(d)->dev, (void *)(uintptr_t)va, size);
}

static int k_svm_set(Driver *d, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n)
{
        return thunk_svm_set(kfd(d)->primary, va, size, (const ThunkSvmAttr *)(const void *)a, n);
}

static int k_svm_get(Driver *d, uint64_t va, uint64_t size, DriverSvmAttr *a, size_t n)
{
        return thunk_svm_get(kfd(d)->primary, va, size, (ThunkSvmAttr *)(void *)a, n);
}

/* The value of "@key=" in the preload's stats line, 0 when absent. */
static uint64_t stat_of(const char *line, const char *key)
{
        size_t n = strlen(key);

        for (const char *p = line; (p = strstr(p, key)) != NULL; p += n)
                if ((p == line || p[-1] == ' ') && p[n] == '=')
                        return strtoull(p + n + 1, NULL, 10);
        return 0;
}

static int preload_stats(const KfdDriver *k, DriverStats *ret)
{
        char line[1024];

        if (k->preload_stats(line, sizeof(line)) < 0)
                return -EIO;
        *ret = (DriverStats){.contexts = stat_of(line, "contexts"),
                             .buffers = stat_of(line, "bufs"),
                             .handles = stat_of(line, "mems"),
                             .imports = stat_of(line, "imports"),
                             .mappings = stat_of(line, "mappings"),
                             .gem_handles = stat_of(line, "gem_handles"),
                             .svm_ranges = stat_of(line, "svm_ranges"),
                             .system_bytes = stat_of(line, "system_used"),
                             .vram_bytes = stat_of(line, "vram_used"),
                             .queues = stat_of(line, "queues")};
        return 0;
}

static int k_stats(const Driver *d, DriverStats *ret)
{
        ThunkModelStats st;

        if (ckfd(d)->preload_stats)
                return preload_stats(ckfd(d), ret);
        if (!ckfd(d)->model)
                return -EOPNOTSUPP;
        /* lock-free: a status must not wait for the model's lock, which any tenant's ioctls and engines
         * take */
        thunk_model_peek_stats(ckfd(d)->model, &st);
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

/* The ioctl a fault names, by its name in the lists (kfd-ioctls.h) in any case, a DRM one's with or without
 * its DRM_ or AMDGPU_ ("gem_va" is AMDGPU_GEM_VA); 0 for none. */
static unsigned long fault_ioctl(const char *name)
{
        static const char *const prefixes[] = {"", "DRM_", "AMDGPU_"};
        unsigned long req = 0;
        char full[80];

        for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]) && !req; i++) {
                snprintf(full, sizeof(full), "%s%s", prefixes[i], name);
                req = thunk_ioctl_request(full);
        }
        return req;
}

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
                unsigned long req = fault_ioctl(name);

                if (!req)
                        req = strtoul(name, NULL, 0);
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
_Static_assert((int)DRIVER_QUEUE_COMPUTE == (int)THUNK_QUEUE_COMPUTE, "queue type");
_Static_assert((int)DRIVER_QUEUE_SDMA == (int)THUNK_QUEUE_SDMA, "queue type");
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
        /* the relay lets go first: once the queue is gone its doorbell slot may be another queue's */
        doorbell_relay_remove(kfd(d)->relay, ctx, id);
        return thunk_queue_destroy(tctx(ctx), id);
}

static int k_queue_update(Driver *d, DriverCtx *ctx, uint32_t id, uint64_t ring_va, uint64_t ring_size,
                          uint32_t percentage, uint32_t priority)
{
        (void)d;
        return thunk_queue_update(tctx(ctx), id, ring_va, ring_size, percentage, priority);
}

static int k_ctx_set_interrupt(Driver *d, DriverCtx *ctx, DriverInterruptFn fn, void *arg)
{
        Listener *l = listener_of(kfd(d), tctx(ctx), fn != NULL);

        if (!l)
                return fn ? -ENOMEM : 0;
        /* the thread calls the hook under this lock: none is in flight once it is taken */
        pthread_mutex_lock(&l->lock);
        l->fn = fn;
        l->arg = fn ? arg : NULL;
        pthread_mutex_unlock(&l->lock);
        return 0;
}

/* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
// clang-format off
static const DriverOps kfd_ops = {
        /* the driver and its GPUs */
        .close = k_close, .version = k_version, .caps = k_caps, .topology = k_topology,
        .gpu_count = k_gpu_count, .gpu = k_gpu, .svm_aperture = k_svm_aperture,
        /* GPU contexts */
        .ctx_primary = k_ctx_primary, .ctx_new = k_ctx_new, .ctx_free = k_ctx_free,
        .available_memory = k_available_memory, .tile_config = k_tile_config,
        /* memory */
        .mem_alloc_vram = k_mem_alloc_vram, .mem_register_host = k_mem_register_host,
        .mem_alloc_gtt = k_mem_alloc_gtt, .mem_import = k_mem_import, .mem_adopt_vram = k_mem_adopt_vram,
        .mem_adopt_gtt = k_mem_adopt_gtt, .mem_free = k_mem_free, .mem_size = k_mem_size,
        .mem_map = k_mem_map, .mem_unmap = k_mem_unmap, .mem_unmap_all = k_mem_unmap_all,
        .mem_is_mapped = k_mem_is_mapped, .mem_mapped_mask = k_mem_mapped_mask, .mem_export = k_mem_export,
        .dmabuf_is_own = k_dmabuf_is_own, .file_seal = k_file_seal,
        /* another context's access, managed memory */
        .grant = k_grant, .revoke = k_revoke, .managed_register = k_managed_register,
        .cpu_unmap = k_cpu_unmap, .svm_set = k_svm_set, .svm_get = k_svm_get,
        /* queues, interrupts and events */
        .queue_create = k_queue_create, .queue_destroy = k_queue_destroy, .queue_update = k_queue_update,
        .ctx_set_interrupt = k_ctx_set_interrupt, .ctx_listen = k_ctx_listen,
        .event_mirror_add = k_event_mirror_add, .event_mirror_remove = k_event_mirror_remove,
        /* the rest */
        .stats = k_stats, .test_faults = k_test_faults
};
// clang-format on

/* The relay rang a doorbell of the model's: its engines, asleep while no queue has work, look again. */
static void model_kick(void *model)
{
        thunk_model_doorbell_kick(model);
}

int driver_kfd_open(const DriverKfdOptions *o, Driver **ret, char *errbuf, size_t errlen)
{
        ThunkOptions to = {
                .backend = o->model ? THUNK_BACKEND_MODEL : THUNK_BACKEND_KFD,
                .topology_root = o->topology_root,
                .model_kfd_minor = o->model ? o->model_kfd_minor : 0,
                .model_doorbells = o->model && o->model_doorbells,
                /* the relay below is the only writer of the model's doorbells, and tells it of each */
                .model_doorbell_kicks = o->model && o->model_doorbells,
                /* the broker unmaps shared and managed memory only with driver_cpu_unmap() */
                .model_unmap_notices = o->model,
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
        k->base.name = thunk_device_backend_name(k->dev);
        pthread_mutex_init(&k->listeners_lock, NULL);
        k->max_threads = o->max_listeners ? o->max_listeners : DRIVER_MAX_LISTENERS;
        k->primary = thunk_device_primary_context(k->dev);
        k->model = thunk_device_model(k->dev);
        if (!k->model)
                k->preload_stats = (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "gpumem_preload_stats");
        if (!k->model || o->model_doorbells) {
                r = doorbell_relay_new(&k->relay);
                if (r < 0) {
                        snprintf(errbuf, errlen, "cannot start the doorbell relay: %s", strerror(-r));
                        k_close(&k->base);
                        return r;
                }
                if (k->model)
                        doorbell_relay_set_notify(k->relay, model_kick, k->model);
        }
        *ret = &k->base;
        return 0;
}

static int open_kernel(const DriverOpenArgs *a, Driver **ret, char *errbuf, size_t errlen)
{
        DriverKfdOptions o = {.topology_root = a->topology_root, .max_listeners = a->max_listeners};
        int probe;

        /* the default backend: on a machine without the amdgpu driver say so, and what else there is,
         * rather than which sysfs file is missing. An open, as the thunk makes next (a stat would miss a
         * /dev/kfd served at the libc level, as the model's preload serves it) */
        probe = open("/dev/kfd", O_RDWR | O_CLOEXEC);
        if (probe >= 0)
                close(probe);
        else if (errno == ENOENT) {
                snprintf(errbuf, errlen,
                         "there is no /dev/kfd: the amdgpu kernel driver is not loaded, or this machine has "
                         "no AMD GPU. To serve a simulated GPU instead (trials, tests), start gpumemd with "
                         "--backend model, or set backend = model in the [daemon] section of its "
                         "configuration file");
                return -ENODEV;
        }
        return driver_kfd_open(&o, ret, errbuf, errlen);
}

static int open_model(const DriverOpenArgs *a, Driver **ret, char *errbuf, size_t errlen)
{
        DriverKfdOptions o = {.model = true,
                              .topology_root = a->topology_root,
                              .model_kfd_minor = a->model_kfd_minor,
                              .model_doorbells = true,
                              .max_listeners = a->max_listeners};
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
