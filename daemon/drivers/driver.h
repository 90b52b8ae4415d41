/* The driver seam: what the broker asks of a GPU driver, one vtable per backend (driver-kfd.c today). */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topology.h"

/*
 * The broker keeps the books (handles, accounts, VA placement, teardown order); a driver executes memory
 * operations on a device. A driver knows nothing of clients, classes or quotas: it is asked to allocate at a
 * VA the broker chose, to map on GPUs the broker checked, and it answers with a negative errno (no message;
 * the broker words the reason). Every pointer a driver returns is owned by the driver until the matching
 * free. A driver is used from one thread at a time, but for driver_svm_set/get where it
 * declares DRIVER_CAP_THREADED_SVM.
 *
 * Only driver implementations include KFD, thunk or model headers. The topology is described with the
 * thunk's plain structs (topology.h), which hold no driver state.
 */

typedef struct Driver Driver;
typedef struct DriverCtx DriverCtx;     /* a GPU VM: the daemon's own, or one per client */
typedef struct DriverMem DriverMem;     /* memory the driver allocated, registered or imported */
typedef struct DriverGrant DriverGrant; /* one GPU's mapping of part of a DriverMem at a VA (VMM access) */

/* What a driver can do beyond allocation, mapping and import. */
enum {
        DRIVER_CAP_PRIVATE_VM = 1u << 0, /* a GPU VM per client (driver_ctx_new) */
        DRIVER_CAP_MANAGED = 1u << 1,    /* managed memory and SVM attributes */
        DRIVER_CAP_VA_GRANTS = 1u << 2,  /* per-GPU grants of parts of memory at any VA (VMM access) */
        DRIVER_CAP_EXPORT = 1u << 3,     /* dmabuf export of device memory */
        DRIVER_CAP_FD_PER_SHARED_BUFFER = 1u << 4, /* an fd per buffer that can be shared (below) */
        DRIVER_CAP_TEST_FAULTS = 1u << 5,          /* driver_test_faults() */
        DRIVER_CAP_BACKEND_STATS = 1u << 6,        /* driver_stats() */
        DRIVER_CAP_THREADED_SVM = 1u << 7, /* driver_svm_set/get may run on any thread, beside other calls */
        /* it rings queues' doorbells itself, from their write pointers */
        DRIVER_CAP_DOORBELL_RELAY = 1u << 8,
        /* a context's interrupts reach only the events mirrored in it */
        DRIVER_CAP_EVENT_MIRROR = 1u << 9,
        /* the client maps memory into its own GPU context from the memory's export (below) */
        DRIVER_CAP_CLIENT_MAPS = 1u << 10,
};

/*
 * DRIVER_CAP_CLIENT_MAPS (CUDA): a GPU context belongs to the process that made it, and the daemon cannot
 * map memory into a client's. The driver allocates and exports; the broker hands the client the export of
 * each device allocation and VMM handle, and the client's library imports it, maps it and sets its
 * access in its own context. driver_mem_map and driver_grant then record the access the broker allowed
 * (driver_mem_is_mapped answers from that record): the client's own driver is what enforces it.
 */

/*
 * DRIVER_CAP_EVENT_MIRROR: KFD delivers a context's interrupts only to waits on that context's own events,
 * and sets an event only if the context has one with the id and slot the GPU named. The broker keeps the
 * client's events in its books; for each signal event it also has the driver make one in the client's
 * context (driver_event_mirror_add), which a thread of the driver's waits on, reporting each that fired
 * to the context's interrupt callback.
 */

/*
 * DRIVER_CAP_DOORBELL_RELAY: a queue's doorbell can be rung only from the daemon (only the process that owns
 * a KFD context maps its doorbells), so the driver watches each queue's write pointer and rings the doorbell
 * when it moves (doorbell-relay.h). The broker then passes the write pointer's memory as a file of the
 * daemon's (DriverQueueArgs.wptr_fd), which must exist: host memory.
 */

/*
 * DRIVER_CAP_FD_PER_SHARED_BUFFER: the driver holds an fd in the daemon for each buffer that can be shared:
 * device memory allocated host visible from its allocation, other device and VMM memory from its first
 * export or grant (a grant goes through a dmabuf), and each foreign import. The model carves the rest out of
 * one file per GPU (docs/thunk-model.md, the sharing rule); the kernel's BOs cost no fd.
 */

/* Allocation flags: the protocol's values (gpumem.proto), which the broker passes through. */
enum {
        DRIVER_MEM_HOST_VISIBLE = 1,
        DRIVER_MEM_COHERENT = 2,
        DRIVER_MEM_UNCACHED = 4,
        DRIVER_MEM_EXECUTABLE = 8,
        DRIVER_MEM_CONTIGUOUS = 16,
        DRIVER_MEM_READ_ONLY = 32,
        DRIVER_MEM_EXT_COHERENT = 64,
};

/* GPU access of a grant. */
enum {
        DRIVER_ACCESS_READ = 1,
        DRIVER_ACCESS_READ_WRITE = 3,
};

/*
 * SVM attribute types and locations: the numbers the protocol carries, which are the KFD's
 * (kfd_ioctl.h, KFD_IOCTL_SVM_ATTR_*; kfd-abi.md §4). A driver without managed memory refuses them all.
 */
enum {
        DRIVER_SVM_ATTR_PREFERRED_LOC = 0,
        DRIVER_SVM_ATTR_PREFETCH_LOC = 1,
        DRIVER_SVM_ATTR_ACCESS = 2,
        DRIVER_SVM_ATTR_ACCESS_IN_PLACE = 3,
        DRIVER_SVM_ATTR_NO_ACCESS = 4,
        DRIVER_SVM_ATTR_SET_FLAGS = 5,
        DRIVER_SVM_ATTR_CLR_FLAGS = 6,
        DRIVER_SVM_ATTR_GRANULARITY = 7,
};
#define DRIVER_SVM_LOCATION_SYSMEM    0u
#define DRIVER_SVM_LOCATION_UNDEFINED 0xffffffffu

typedef struct DriverSvmAttr {
        uint32_t type;
        uint32_t value;
} DriverSvmAttr;

/* A GPU's tiling configuration (KFD's GET_TILE_CONFIG): the tables are all zero from GFX9 on. */
#define DRIVER_TILE_CONFIGS       32
#define DRIVER_MACRO_TILE_CONFIGS 16
typedef struct DriverTileConfig {
        uint32_t gb_addr_config;
        uint32_t num_banks;
        uint32_t num_ranks;
        uint32_t n_tile, n_macro;
        uint32_t tile[DRIVER_TILE_CONFIGS];
        uint32_t macro[DRIVER_MACRO_TILE_CONFIGS];
} DriverTileConfig;

typedef struct DriverGpu {
        uint32_t gpu_id;
        uint64_t vram_bytes;        /* the GPU's own memory, or what the driver lets an APU have */
        int numa_node;              /* nearest host node, -1 when unknown */
        uint64_t alloc_granularity; /* device memory comes in multiples of this (0: the page) */
} DriverGpu;

/* What a driver that keeps its own books reports (the model: contexts, buffers, ...). */
typedef struct DriverStats {
        uint64_t contexts;
        uint64_t buffers;
        uint64_t handles;
        uint64_t imports;
        uint64_t mappings;
        uint64_t gem_handles;
        uint64_t svm_ranges;
        uint64_t system_bytes;
        uint64_t vram_bytes;
        uint64_t queues; /* user-mode queues, every context */
} DriverStats;

/* A user-mode queue (the KFD's CREATE_QUEUE): every address a GPU VA of the context it is made in. */
/* Its types, numbered as KFD's (checked where the kfd driver passes them on); COMPUTE is PM4. */
enum { DRIVER_QUEUE_COMPUTE, DRIVER_QUEUE_SDMA, DRIVER_QUEUE_COMPUTE_AQL, DRIVER_QUEUE_SDMA_XGMI };
typedef struct DriverQueueArgs {
        uint32_t gpu_id;
        uint32_t type; /* DRIVER_QUEUE_* */
        uint32_t percentage;
        uint32_t priority;
        uint64_t ring_va, ring_size;
        uint64_t rptr_va, wptr_va;
        uint64_t eop_va, eop_size;
        uint64_t ctx_save_va, ctx_save_size, ctl_stack_size;
        /* DRIVER_CAP_DOORBELL_RELAY: the write pointer as a file of the daemon's and its offset there
         * (borrowed for the call; -1 otherwise) */
        int wptr_fd;
        uint64_t wptr_fd_offset;
} DriverQueueArgs;

/* A context's GPU interrupt (driver_ctx_set_interrupt). */
typedef enum DriverInterruptType {
        DRIVER_IRQ_SIGNAL,   /* an event id (partial_id, of which valid_bits hold) */
        DRIVER_IRQ_VM_FAULT, /* a GPU VM fault on gpu_id at va: the context's queues stopped for good */
} DriverInterruptType;
typedef struct DriverInterrupt {
        DriverInterruptType type;
        uint32_t partial_id;
        unsigned valid_bits;
        uint32_t gpu_id;
        uint64_t va;
        bool not_present, read_only, no_execute;
} DriverInterrupt;
typedef void (*DriverInterruptFn)(void *arg, const DriverInterrupt *irq);

typedef struct DriverOps {
        Driver *(*close)(Driver *d);
        void (*version)(const Driver *d, uint32_t *ret_major, uint32_t *ret_minor);
        unsigned (*caps)(const Driver *d);
        const ThunkTopology *(*topology)(const Driver *d);
        size_t (*gpu_count)(const Driver *d);
        int (*gpu)(const Driver *d, size_t index, DriverGpu *ret);
        void (*svm_aperture)(const Driver *d, uint64_t *ret_base, uint64_t *ret_limit);

        DriverCtx *(*ctx_primary)(Driver *d);
        int (*ctx_new)(Driver *d, DriverCtx **ret);
        void (*ctx_free)(Driver *d, DriverCtx *ctx);
        int (*available_memory)(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t *ret_bytes);
        /* The GPU's tiling configuration, as KFD's GET_TILE_CONFIG reports it; NULL: -EOPNOTSUPP. */
        int (*tile_config)(Driver *d, uint32_t gpu_id, DriverTileConfig *ret);

        int (*mem_alloc_vram)(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                              uint32_t flags, DriverMem **ret);
        int (*mem_register_host)(Driver *d, uint32_t gpu_id, uint64_t va, uint64_t size, uint32_t flags,
                                 DriverMem **ret);
        int (*mem_alloc_gtt)(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                             uint32_t flags, DriverMem **ret);
        int (*mem_import)(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, DriverMem **ret);
        int (*mem_adopt_vram)(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                              uint64_t size, uint32_t flags, DriverMem **ret);
        int (*mem_adopt_gtt)(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                             uint64_t size, uint32_t flags, DriverMem **ret);
        int (*mem_free)(Driver *d, DriverMem *m);
        uint64_t (*mem_size)(const Driver *d, const DriverMem *m);
        int (*mem_map)(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n);
        int (*mem_unmap)(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n);
        int (*mem_unmap_all)(Driver *d, DriverMem *m);
        bool (*mem_is_mapped)(const Driver *d, const DriverMem *m, uint32_t gpu_id);
        /* bit i: mapped on the driver's GPU i (driver_gpu()), for the first 64 */
        uint64_t (*mem_mapped_mask)(const Driver *d, const DriverMem *m);
        int (*mem_export)(Driver *d, DriverMem *m, int *ret_fd);
        bool (*dmabuf_is_own)(Driver *d, DriverCtx *ctx, int dmabuf_fd);
        /* NULL: the driver keeps no mapping of memory files of its own (see driver_file_seal) */
        int (*file_seal)(Driver *d, int fd);

        int (*grant)(Driver *d, DriverCtx *ctx, DriverMem *m, uint32_t gpu_id, uint64_t va, uint64_t offset,
                     uint64_t size, int access, bool executable, DriverGrant **ret);
        int (*revoke)(Driver *d, DriverGrant *g);

        int (*managed_register)(Driver *d, uint64_t va, uint64_t size, uint32_t flags);
        int (*cpu_unmap)(Driver *d, uint64_t va, uint64_t size);
        int (*svm_set)(Driver *d, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n);
        int (*svm_get)(Driver *d, uint64_t va, uint64_t size, DriverSvmAttr *a, size_t n);

        int (*queue_create)(Driver *d, DriverCtx *ctx, const DriverQueueArgs *q, uint32_t *ret_id,
                            uint64_t *ret_doorbell_offset);
        int (*queue_destroy)(Driver *d, DriverCtx *ctx, uint32_t id);
        int (*queue_update)(Driver *d, DriverCtx *ctx, uint32_t id, uint64_t ring_va, uint64_t ring_size,
                            uint32_t percentage, uint32_t priority);
        int (*ctx_set_interrupt)(Driver *d, DriverCtx *ctx, DriverInterruptFn fn, void *arg);
        int (*ctx_listen)(Driver *d, DriverCtx *ctx);
        int (*event_mirror_add)(Driver *d, DriverCtx *ctx, DriverMem *page, uint32_t id);
        void (*event_mirror_remove)(Driver *d, DriverCtx *ctx, uint32_t id);

        int (*stats)(const Driver *d, DriverStats *ret);
        int (*test_faults)(Driver *d, const char *path, char *errbuf, size_t errlen);
} DriverOps;

/* Every driver starts with this; the rest of its struct is its own. */
struct Driver {
        const DriverOps *ops;
        const char *name; /* set at open: the KFD driver's depends on the device it found */
};

/* ---- the calls the broker and the daemon make (thin wrappers over the table) ------------------------ */

/* NULL-safe; returns NULL. */
static inline Driver *driver_close(Driver *d)
{
        return d ? d->ops->close(d) : NULL;
}
/* "kfd", "model", ... */
static inline const char *driver_name(const Driver *d)
{
        return d->name;
}
/* The version of the driver's interface (KFD: the ioctl ABI). */
static inline void driver_version(const Driver *d, uint32_t *ret_major, uint32_t *ret_minor)
{
        d->ops->version(d, ret_major, ret_minor);
}
static inline bool driver_has(const Driver *d, unsigned cap)
{
        return (d->ops->caps(d) & cap) == cap;
}
static inline const ThunkTopology *driver_topology(const Driver *d)
{
        return d->ops->topology(d);
}
static inline size_t driver_gpu_count(const Driver *d)
{
        return d->ops->gpu_count(d);
}
/* -ENODEV past the last GPU. */
static inline int driver_gpu(const Driver *d, size_t index, DriverGpu *ret)
{
        return d->ops->gpu(d, index, ret);
}
/* Where client memory may be placed: the driver's shared virtual address range, [base, limit]. */
static inline void driver_svm_aperture(const Driver *d, uint64_t *ret_base, uint64_t *ret_limit)
{
        d->ops->svm_aperture(d, ret_base, ret_limit);
}

/* The daemon's own GPU VM: host memory lives there, and device memory when the driver has no other. */
static inline DriverCtx *driver_ctx_primary(Driver *d)
{
        return d->ops->ctx_primary(d);
}
/* A GPU VM of its own for one client; -EOPNOTSUPP without DRIVER_CAP_PRIVATE_VM. */
static inline int driver_ctx_new(Driver *d, DriverCtx **ret)
{
        return d->ops->ctx_new(d, ret);
}
/* NULL-safe; the primary context is left alone. Its memory must have been freed first. */
static inline void driver_ctx_free(Driver *d, DriverCtx *ctx)
{
        d->ops->ctx_free(d, ctx);
}
static inline int driver_available_memory(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t *ret_bytes)
{
        return d->ops->available_memory(d, ctx, gpu_id, ret_bytes);
}
static inline int driver_tile_config(Driver *d, uint32_t gpu_id, DriverTileConfig *ret)
{
        return d->ops->tile_config ? d->ops->tile_config(d, gpu_id, ret) : -EOPNOTSUPP;
}

/*
 * Device memory of @size bytes on @gpu_id at @va (0: not placed, for VMM handles), not mapped on any GPU.
 * -ENOMEM: no room; -EOPNOTSUPP: a flag the driver cannot give (contiguous); -EINVAL with HOST_VISIBLE:
 * the GPU cannot give host-visible memory.
 */
static inline int driver_mem_alloc_vram(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va,
                                        uint64_t size, uint32_t flags, DriverMem **ret)
{
        return d->ops->mem_alloc_vram(d, ctx, gpu_id, va, size, flags, ret);
}
/* Register the daemon's own pages at [va, va+size) (mapped there, populated) as GPU-accessible host memory.
 */
static inline int driver_mem_register_host(Driver *d, uint32_t gpu_id, uint64_t va, uint64_t size,
                                           uint32_t flags, DriverMem **ret)
{
        return d->ops->mem_register_host(d, gpu_id, va, size, flags, ret);
}
/*
 * Host memory that belongs to @ctx's GPU VM (a GTT buffer: what the context's queues can reach, since a
 * client context takes no registered pages), at @va, not mapped on any GPU. The CPU reaches it through its
 * export (driver_mem_export). NULL in the table: -EOPNOTSUPP.
 */
static inline int driver_mem_alloc_gtt(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                                       uint32_t flags, DriverMem **ret)
{
        return d->ops->mem_alloc_gtt ? d->ops->mem_alloc_gtt(d, ctx, gpu_id, va, size, flags, ret)
                                     : -EOPNOTSUPP;
}
/* Import a dmabuf (borrowed) as memory of @gpu_id, not placed. -EINVAL/-EBADF: not importable. */
static inline int driver_mem_import(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id,
                                    DriverMem **ret)
{
        return d->ops->mem_import(d, ctx, dmabuf_fd, gpu_id, ret);
}
/*
 * After a restart: device memory an earlier daemon allocated on @gpu_id with @flags and exported
 * (@dmabuf_fd, borrowed), placed at @va in @ctx again, not mapped. The kernel finds its BO behind the
 * dmabuf; a driver that keeps its own books (the model) takes the memory into them again. -EINVAL: not
 * that memory (another size, not a buffer of this driver's kind). NULL in the table: -EOPNOTSUPP.
 */
static inline int driver_mem_adopt_vram(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id,
                                        uint64_t va, uint64_t size, uint32_t flags, DriverMem **ret)
{
        return d->ops->mem_adopt_vram
                       ? d->ops->mem_adopt_vram(d, ctx, dmabuf_fd, gpu_id, va, size, flags, ret)
                       : -EOPNOTSUPP;
}
/* The same for GTT memory of a client's own context (driver_mem_alloc_gtt). */
static inline int driver_mem_adopt_gtt(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                                       uint64_t size, uint32_t flags, DriverMem **ret)
{
        return d->ops->mem_adopt_gtt ? d->ops->mem_adopt_gtt(d, ctx, dmabuf_fd, gpu_id, va, size, flags, ret)
                                     : -EOPNOTSUPP;
}
/* Free memory no GPU maps any more; on failure it stays allocated. */
static inline int driver_mem_free(Driver *d, DriverMem *m)
{
        return d->ops->mem_free(d, m);
}
static inline uint64_t driver_mem_size(const Driver *d, const DriverMem *m)
{
        return d->ops->mem_size(d, m);
}
/* Map at its VA on every GPU listed, all or none; GPUs it is mapped on already stay. */
static inline int driver_mem_map(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        return d->ops->mem_map(d, m, gpu_ids, n);
}
static inline int driver_mem_unmap(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        return d->ops->mem_unmap(d, m, gpu_ids, n);
}
static inline int driver_mem_unmap_all(Driver *d, DriverMem *m)
{
        return d->ops->mem_unmap_all(d, m);
}
static inline bool driver_mem_is_mapped(const Driver *d, const DriverMem *m, uint32_t gpu_id)
{
        return d->ops->mem_is_mapped(d, m, gpu_id);
}
/* Every GPU the memory is mapped on at once: a lookup per GPU costs a scan of the GPUs each. */
static inline uint64_t driver_mem_mapped_mask(const Driver *d, const DriverMem *m)
{
        return d->ops->mem_mapped_mask(d, m);
}
/* A new dmabuf fd (owned by the caller) of the whole memory, read-write. */
static inline int driver_mem_export(Driver *d, DriverMem *m, int *ret_fd)
{
        return d->ops->mem_export(d, m, ret_fd);
}
/* True when @dmabuf_fd is memory this driver exported (of any process), false for anything else. */
static inline bool driver_dmabuf_is_own(Driver *d, DriverCtx *ctx, int dmabuf_fd)
{
        return d->ops->dmabuf_is_own(d, ctx, dmabuf_fd);
}
/*
 * The memory file @fd (borrowed) is to be sealed against new writable mappings (F_SEAL_FUTURE_WRITE): the
 * driver makes now every mapping of it that it would otherwise make later for access it granted already
 * (the KFD model's engines map a buffer the first time a queue touches it), and takes the seal through a
 * writable fd of its own if it has one. 0 (the caller checks the seals, and takes them itself where the
 * driver did not), or a negative errno: then no seal may be taken.
 */
static inline int driver_file_seal(Driver *d, int fd)
{
        return d->ops->file_seal ? d->ops->file_seal(d, fd) : 0;
}

/* Give @gpu_id @access to [offset, offset+size) of @m at @va in @ctx; -EOPNOTSUPP without VA_GRANTS. */
static inline int driver_grant(Driver *d, DriverCtx *ctx, DriverMem *m, uint32_t gpu_id, uint64_t va,
                               uint64_t offset, uint64_t size, int access, bool executable, DriverGrant **ret)
{
        return d->ops->grant(d, ctx, m, gpu_id, va, offset, size, access, executable, ret);
}
/* Take a grant back; on failure it stays in force. */
static inline int driver_revoke(Driver *d, DriverGrant *g)
{
        return d->ops->revoke(d, g);
}

/*
 * Managed memory: the daemon's shared pages at [va, va+size) become an SVM range of the daemon's GPU VM with
 * @flags (DRIVER_MEM_COHERENT, EXT_COHERENT, READ_ONLY, EXECUTABLE). The daemon unmaps its mappings of
 * shared and managed memory only with driver_cpu_unmap(), which drops the pages from the SVM ranges as the
 * kernel's MMU notifier does on a munmap (the model is told; the kernel sees the munmap itself).
 */
static inline int driver_managed_register(Driver *d, uint64_t va, uint64_t size, uint32_t flags)
{
        return d->ops->managed_register(d, va, size, flags);
}
static inline int driver_cpu_unmap(Driver *d, uint64_t va, uint64_t size)
{
        return d->ops->cpu_unmap(d, va, size);
}
/*
 * SVM attributes of a range of managed memory, as the KFD's SVM ioctl takes them. With
 * DRIVER_CAP_THREADED_SVM these two may be called from any thread while the loop makes other calls.
 */
static inline int driver_svm_set(Driver *d, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n)
{
        return d->ops->svm_set(d, va, size, a, n);
}
static inline int driver_svm_get(Driver *d, uint64_t va, uint64_t size, DriverSvmAttr *a, size_t n)
{
        return d->ops->svm_get(d, va, size, a, n);
}

/* ---- for administrators and tests -------------------------------------------------------------------- */

/*
 * A user-mode queue in @ctx: its id and the offset its doorbell is mapped at on a kfd fd. The driver
 * checks the addresses as the kernel does; the queue runs until destroyed or its context goes. NULL in the
 * table: -EOPNOTSUPP.
 */
/* Whether the driver runs user-mode queues at all. */
static inline bool driver_runs_queues(const Driver *d)
{
        return d->ops->queue_create != NULL;
}
static inline int driver_queue_create(Driver *d, DriverCtx *ctx, const DriverQueueArgs *q, uint32_t *ret_id,
                                      uint64_t *ret_doorbell_offset)
{
        return d->ops->queue_create ? d->ops->queue_create(d, ctx, q, ret_id, ret_doorbell_offset)
                                    : -EOPNOTSUPP;
}
static inline int driver_queue_destroy(Driver *d, DriverCtx *ctx, uint32_t id)
{
        return d->ops->queue_destroy ? d->ops->queue_destroy(d, ctx, id) : -EOPNOTSUPP;
}
static inline int driver_queue_update(Driver *d, DriverCtx *ctx, uint32_t id, uint64_t ring_va,
                                      uint64_t ring_size, uint32_t percentage, uint32_t priority)
{
        return d->ops->queue_update
                       ? d->ops->queue_update(d, ctx, id, ring_va, ring_size, percentage, priority)
                       : -EOPNOTSUPP;
}
/*
 * @fn hears @ctx's GPU interrupts (end of pipe, SDMA traps, AQL completion signals with an event mailbox):
 * called on the driver's own thread with its locks held, so it may only hand the news on (it must not call
 * the driver). Until the context is freed or @fn is NULL; once a call with NULL returns, none is in flight.
 * With DRIVER_CAP_EVENT_MIRROR a signal is reported for the events mirrored in the context alone, each by
 * its full id (valid_bits 32), its slot already acknowledged.
 */
static inline int driver_ctx_set_interrupt(Driver *d, DriverCtx *ctx, DriverInterruptFn fn, void *arg)
{
        return d->ops->ctx_set_interrupt ? d->ops->ctx_set_interrupt(d, ctx, fn, arg) : -EOPNOTSUPP;
}
/*
 * DRIVER_CAP_EVENT_MIRROR: signal event @id of the broker's books for @ctx gets an event of the driver's in
 * @ctx with the same id (the kernel numbers signal events by the lowest free slot, as the broker does).
 * @page: the memory of the books' event page when it is memory of @ctx (the first mirrored event makes it
 * the context's signal page, as the client's first signal event would have), else NULL. -EBUSY if the
 * driver's numbering went another way (nothing made).
 */
/* DRIVER_CAP_EVENT_MIRROR: the driver listens to @ctx's interrupts from now (a memory event needs no
 * mirror: the driver's own hears the context's GPU VM faults). */
static inline int driver_ctx_listen(Driver *d, DriverCtx *ctx)
{
        return d->ops->ctx_listen ? d->ops->ctx_listen(d, ctx) : -EOPNOTSUPP;
}
static inline int driver_event_mirror_add(Driver *d, DriverCtx *ctx, DriverMem *page, uint32_t id)
{
        return d->ops->event_mirror_add ? d->ops->event_mirror_add(d, ctx, page, id) : -EOPNOTSUPP;
}
static inline void driver_event_mirror_remove(Driver *d, DriverCtx *ctx, uint32_t id)
{
        if (d->ops->event_mirror_remove)
                d->ops->event_mirror_remove(d, ctx, id);
}
/* -EOPNOTSUPP without DRIVER_CAP_BACKEND_STATS. */
static inline int driver_stats(const Driver *d, DriverStats *ret)
{
        return d->ops->stats(d, ret);
}
/*
 * Arm the driver's fault injection from @path (one "OPERATION NTH ERRNO" per line): returns how many
 * entries were armed, or a negative errno (-EOPNOTSUPP without DRIVER_CAP_TEST_FAULTS) with the reason in
 * @errbuf. Entries before a bad one stay armed.
 */
static inline int driver_test_faults(Driver *d, const char *path, char *errbuf, size_t errlen)
{
        return d->ops->test_faults(d, path, errbuf, errlen);
}

/* ---- the backends ------------------------------------------------------------------------------------ */

/* What a backend is opened with: the daemon's settings that concern drivers. */
typedef struct DriverOpenArgs {
        const char *topology_root; /* the device's topology (NULL: the system's); with DRIVER_BACKEND_PRESET
                                      the preset's directory */
        uint32_t model_kfd_minor;  /* the KFD model: the ABI minor version it reports (0: its newest) */
        uint32_t max_listeners; /* threads that wait on clients' contexts' events (0: DRIVER_MAX_LISTENERS) */
} DriverOpenArgs;

/*
 * A driver whose event waits block (the KFD's) waits on each client context in a thread of its own. These
 * threads are bounded: past the limit a client's first fault or signal event in its own context is refused
 * with -EUSERS, so clients can never make the daemon run a thread each.
 */
#define DRIVER_MAX_LISTENERS 32

enum {
        DRIVER_BACKEND_PRESET = 1u << 0, /* simulated: its topology comes from a model preset */
};

/*
 * A backend the daemon can run on, as `--backend` and `backend =` name it. Each driver file declares its
 * own; drivers.c lists them, so a new one is its file and one row there.
 */
typedef struct DriverBackend {
        const char *name;
        const char *summary; /* one line for --help */
        unsigned flags;      /* DRIVER_BACKEND_* */
        /* Open the device: topology, versions, apertures, whatever the broker needs before it serves.
         * @errbuf gets the reason of a failure. */
        int (*open)(const DriverOpenArgs *a, Driver **ret, char *errbuf, size_t errlen);
} DriverBackend;

/* The backend called @name, or NULL. */
const DriverBackend *driver_backend_find(const char *name);
/* Every backend, in the order --help lists them (NULL past the last). */
const DriverBackend *driver_backend_at(size_t index);
