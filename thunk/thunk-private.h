/* The thunk's internal object layouts, shared by thunk.c (device, contexts) and thunk-mem.c (memory). */
#pragma once

#include <pthread.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seam.h"
#include "thunk.h"

struct ThunkModel;

/* A GEM handle imported into one render fd, refcounted because PRIME import of one dmabuf into one DRM
 * file always yields the same handle: closing it for one mapping would pull it from under another. */
typedef struct ThunkGemRef {
        uint32_t handle;
        uint32_t refs;
} ThunkGemRef;

typedef struct ThunkGemRefs {
        ThunkGemRef *items;
        size_t n, cap;
} ThunkGemRefs;

struct ThunkDevice {
        ThunkBackend backend;
        ThunkTopology *topo;
        struct ThunkModel *model;
        ThunkSeam seam;
        uint32_t major, minor;
        size_t page_size;
        ThunkGpu *gpus;
        size_t n_gpus;
        uint64_t svm_base, svm_limit;
        ThunkContext *primary;
        ThunkContext *contexts;   /* secondary contexts, a list */
        pthread_mutex_t ctx_lock; /* around the list: contexts come and go on any thread */
};

struct ThunkContext {
        ThunkDevice *dev;
        bool primary;
        int kfd_fd;
        int *render_fds;        /* indexed like dev->gpus */
        ThunkGemRefs *gem_refs; /* indexed like dev->gpus */
        void **doorbells;       /* indexed like dev->gpus: the mapped doorbell slice, or NULL */
        ThunkBo *bos;
        ThunkGemMapping *gem_maps;
        /* Around bos, gem_maps and gem_refs: the context's callers may be on several threads (a shared
         * context in the daemon, ROCr's threads in a process). A BO itself is its caller's to serialise. */
        pthread_mutex_t lock;
        ThunkContext *prev, *next;
};

struct ThunkBo {
        ThunkContext *ctx;
        ThunkBoInfo info;
        bool *mapped; /* indexed like dev->gpus */
        size_t n_mapped;
        ThunkBo *prev, *next;
};

struct ThunkGemMapping {
        ThunkContext *ctx;
        size_t gpu_index;
        uint32_t gem_handle;
        uint64_t va, offset, size;
        uint32_t flags;
        ThunkGemMapping *prev, *next;
};

/* The thunk's lists (a device's contexts, a context's BOs and GEM mappings) are linked through each
 * element's prev and next, @head naming the first; both under the lock that guards the list. */
#define THUNK_LIST_PUSH(head, e)                                                                             \
        do {                                                                                                 \
                (e)->next = (head);                                                                          \
                if (head)                                                                                    \
                        (head)->prev = (e);                                                                  \
                (head) = (e);                                                                                \
        } while (0)
#define THUNK_LIST_UNLINK(head, e)                                                                           \
        do {                                                                                                 \
                if ((e)->prev)                                                                               \
                        (e)->prev->next = (e)->next;                                                         \
                else if ((head) == (e))                                                                      \
                        (head) = (e)->next;                                                                  \
                if ((e)->next)                                                                               \
                        (e)->next->prev = (e)->prev;                                                         \
        } while (0)

/* Index of @gpu_id in dev->gpus, or -ENODEV. */
int thunk_gpu_index(const ThunkDevice *d, uint32_t gpu_id);
/* thunk-queue.c: unmaps the context's doorbell slices (before its kfd fd closes) */
void thunk_context_unmap_doorbells(ThunkContext *c);

static inline int thunk_ioctl(ThunkDevice *d, int fd, unsigned long request, void *arg)
{
        return d->seam.ops->ioctl(d->seam.impl, fd, request, arg);
}

static inline int thunk_close_fd(ThunkDevice *d, int fd)
{
        return d->seam.ops->close(d->seam.impl, fd);
}

/* Release a context's memory-side bookkeeping (after its fds are closed; no ioctls). */
void thunk_context_drop_objects(ThunkContext *c);
