/* The KFD model's private data structures and internal calls, shared by its source files (thunk/model*.c). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "array.h"
#include "hashmap.h"
#include "kfd-compat.h"
#include "model.h"
#include "svm-attrs.h"

#define MODEL_PAGE                    4096ULL
#define MODEL_PAGE_ALIGN(x)           (((x) + MODEL_PAGE - 1) & ~(MODEL_PAGE - 1))
#define MODEL_2M                      (2ULL << 20)
#define MODEL_GPUVM_BASE              (1ULL << 16)          /* AMDGPU_VA_RESERVED_BOTTOM */
#define MODEL_GPUVM_LIMIT             0x00007FFFFFFFFFFFULL /* hole start - 1 */
#define MODEL_VM_END                  (1ULL << 47)
#define MODEL_DOORBELL_SLICE          8192ULL      /* 1024 queues x 8-byte doorbells, page aligned */
#define MODEL_PT_RESERVE_MIN          (8ULL << 20) /* AMDGPU_VM_RESERVED_VRAM */
#define MODEL_MMAP_BASE               (1ULL << 32) /* DRM's fake offsets start at 4 GiB */
#define MODEL_MAX_FAULTS              16
#define MODEL_SVM_DEFAULT_GRANULARITY 9

#define KFD_TYPE_MASK                                                                                        \
        (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_USERPTR |      \
         KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL | KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)

typedef struct ModelGpu {
        uint32_t gpu_id;
        uint32_t minor;
        uint64_t hive_id;
        uint64_t vram_size; /* 0 on APUs */
        bool apu;
        bool large_bar;
        bool svm;
        bool xnack_capable;
        uint32_t gfx_target_version;
        int64_t vram_used;
        uint64_t vram_used_aligned;
} ModelGpu;

struct ModelFile;

#define MODEL_HEAP_ORDERS 41 /* blocks of 2^0 ... 2^40 pages */

/* The free blocks of one size, 2^k pages, in a backing file. */
typedef struct ModelHeapOrder {
        uint64_t *free; /* page offsets */
        size_t n_free;
        size_t cap;  /* at least n_free + held: a free never needs memory */
        size_t held; /* blocks of this size that buffers hold */
} ModelHeapOrder;

/* A GPU's backing file (model-mem.c): a memfd the model never hands out, buffers carved out of it. */
typedef struct ModelHeap {
        int fd;
        dev_t dev; /* to find its mappings in /proc/self/maps */
        ino_t ino;
        uint64_t end;  /* pages handed out at least once, from 0 */
        uint64_t size; /* pages the file is sized to */
        uint64_t used; /* bytes of the blocks buffers hold */
        ModelHeapOrder orders[MODEL_HEAP_ORDERS];
} ModelHeap;

/*
 * The backing object of an allocation (what amdgpu calls a BO), shared by imports and handles. Its memory is
 * a range of its GPU's backing file, or a file of its own once it can be shared (docs/thunk-model.md:
 * the sharing rule); a userptr BO has none. model_buf_file() is the one way to its bytes.
 */
typedef struct ModelBuf {
        struct ModelBuf *next;
        struct ModelBuf **pprev; /* the pointer to this one: unlinking at a context's teardown is O(1) */
        unsigned int refs;
        int memfd; /* a file of its own (shareable buffers, foreign imports), else -1 */
        dev_t dev; /* of that file */
        ino_t ino;
        struct ModelBuf *ino_next; /* others under the same key of the model's file index */
        ModelHeap *heap;           /* carved out of this backing file, else NULL */
        uint64_t heap_off;         /* bytes */
        bool cpu_mapped;           /* its carve-out was mapped in this process at least once */
        uint64_t size;
        uint64_t mmap_offset;
        uint32_t type;  /* one KFD type bit: where it lives */
        uint32_t flags; /* allocation flags */
        int owner;      /* GPU index */
        uint64_t charge;
        uint32_t charge_type; /* KFD type bit the charge was made for, 0 if none */
        bool foreign;
        bool adopted;               /* held by thunk_model_adopt() until its release */
        uint64_t userptr;           /* CPU address of a userptr BO's pages */
        struct ModelFile **allowed; /* render files that may mmap it */
        size_t n_allowed;
} ModelBuf;

struct ModelMem;

/* One VA range of a GPU VM: a node of the VM's tree, which owns it. */
typedef struct ModelMapping {
        uint64_t start;
        uint64_t end;
        ModelBuf *buf;
        struct ModelMem *mem; /* KFD mapping; NULL for GEM_VA */
        uint64_t offset;
        uint32_t gem_flags; /* GEM_VA: the AMDGPU_VM_PAGE_* rights it was made with (KFD: the mem's flags) */
        struct ModelMapping *left, *right;
        int height;
} ModelMapping;

/*
 * A GPU VM's mappings, which never overlap: an AVL tree by start (so also by end), so that mapping and
 * unmapping cost O(log n) however many a VM holds, in any order.
 */
typedef struct ModelVm {
        ModelMapping *root;
        size_t n;
        uint64_t *total; /* the model's count of mappings over all VMs (ModelCounters.mappings) */
} ModelVm;

typedef struct ModelGem {
        uint32_t handle;
        ModelBuf *buf;
        bool read_only; /* opened only from read-only dmabuf fds: GEM_VA may not map it writable */
} ModelGem;

struct ModelCtx;

/* One open of a render node (a DRM file): its own GEM handles and its own GPU VM. */
typedef struct ModelFile {
        struct ModelFile *next;
        unsigned int refs; /* fds + the context that acquired it */
        int gpu;
        struct ModelCtx *compute_ctx;
        ModelVm vm;
        ModelGem *gems;
        size_t n_gems;
        size_t cap_gems;
} ModelFile;

typedef struct ModelMem {
        ModelBuf *buf;
        uint64_t va;
        uint32_t flags;
        int gpu; /* owning pdd */
        uint32_t idr;
        uint64_t mapped; /* bitmap of GPU indices */
        bool import;
} ModelMem;

typedef struct ModelPdd {
        ModelFile *file; /* acquired VM */
        ModelMem **idr;
        size_t cap_idr;
        size_t idr_hint; /* every slot below it is taken */
        uint64_t scratch_va;
        uint64_t tba; /* trap handler base and buffer (SET_TRAP_HANDLER) */
        uint64_t tma;
        uint64_t doorbell_off; /* device-memfd offset of this context's doorbell slice + 1; 0 = none yet */
        volatile uint64_t *doorbells; /* the model's view of that slice (doorbell mode only), or NULL */
} ModelPdd;

typedef struct ModelEvent {
        uint32_t id;
        uint32_t type; /* KFD_IOC_EVENT_* */
        bool auto_reset;
        bool signaled;
        struct kfd_hsa_memory_exception_data mem_exc; /* MEMORY events: the last GPU VM fault */
} ModelEvent;

/* A user-mode queue: the ring and pointers live in the process's memory, as on the GPU. */
typedef struct ModelQueue {
        uint32_t id;
        uint32_t type; /* KFD_IOC_QUEUE_TYPE_* */
        int gpu;
        uint64_t ring_base;
        uint64_t ring_size; /* bytes */
        uint64_t rptr;      /* addresses of the read and write pointers */
        uint64_t wptr;
        uint32_t percentage;
        uint32_t priority;
        /* the engine's own state (model-sdma.c, model-pm4.c): what the hardware keeps in its registers */
        uint64_t hw_rptr; /* SDMA: bytes, monotonic; PM4: dwords into the ring */
        uint64_t ib_base; /* the indirect buffer being run, if in_ib: GPU VA, size and position in dwords */
        uint32_t ib_dwords;
        uint32_t ib_pos;
        bool in_ib;
        uint32_t poll_tries; /* unsuccessful looks of a poll packet with a finite retry count */
        uint64_t part_at; /* a sub-window copy spanning runs: the packet's GPU VA and the rows it has done */
        uint32_t part_rows;
        bool stopped;     /* a GPU VM fault or an illegal packet stopped it for good */
        bool busy;        /* its last run left work: packets written past it, a poll or barrier unmet */
        uint32_t db_slot; /* its doorbell: 8-byte slot in its GPU's slice of the context's doorbells */
} ModelQueue;

/* The signal page of a context: the slots the GPU writes an event id into before it interrupts. */
typedef struct ModelEventPage {
        uint64_t *slots;  /* the model's own view; NULL until the first signal event */
        size_t size;      /* bytes */
        bool unmap;       /* the view is a mapping of the model's own */
        uint64_t handle;  /* the user BO backing it (KFD handle), 0 for device memory */
        uint64_t dev_off; /* device-memfd offset when the model allocated it */
} ModelEventPage;

typedef struct SvmRange {
        uint64_t start; /* pages */
        uint64_t last;  /* pages, inclusive */
        SvmAttrs at;    /* access bits: GPU indices */
        bool charged;
} SvmRange;

typedef struct ModelCtx {
        struct ModelCtx *next;
        unsigned int refs; /* kfd fds, and calls and engine runs under way (model_ctx_enter) */
        /* Held by the engines while they run its queues, without the model's lock, and by every call that
         * changes what they read of it (its queues, events, VMs, SVM ranges): taken before the model's lock.
         */
        pthread_mutex_t eng;
        uint64_t eng_asked;      /* model_ctx_eng_lock() calls begun (atomic) */
        uint64_t eng_served;     /* those that got the eng lock (under it) */
        pthread_cond_t eng_cond; /* broadcast under eng by each of them: the engines wait for them on it */
        unsigned int pins; /* the engines' thread's hold on it while it runs its queues (under the lock) */
        bool dead;         /* released, out of the list: freed at the last unpin */
        bool primary;
        bool xnack;
        bool runtime_enabled;
        ModelPdd pdd[THUNK_MODEL_MAX_GPUS];
        SvmRange *svm;
        size_t n_svm;
        size_t cap_svm;
        SvmRange *svm_spare; /* where svm_set() builds the next list: the last one's, kept for reuse */
        size_t cap_svm_spare;
        ModelEvent *events;
        size_t n_events;
        size_t cap_events;
        ModelQueue *queues;
        size_t n_queues;
        size_t cap_queues;
        ModelEventPage evpage;
        bool vm_fault; /* a GPU VM fault evicted its queues for good, as kfd_dqm_evict_pasid() does */
} ModelCtx;

enum { FD_KFD = 1, FD_RENDER = 2 };

typedef struct ModelFd {
        int fd;
        int kind;
        ModelCtx *ctx;
        ModelFile *file;
} ModelFd;

typedef struct ModelFault {
        unsigned int type;
        unsigned int nr;
        unsigned int remaining;
        int err;
} ModelFault;

/*
 * What admin status and the like read without the model's lock: kept by whoever changes the objects they
 * count (under the lock) with atomic adds, read with atomic loads, so that no caller (a tenant's engines,
 * a long ioctl) can make a reader wait.
 */
typedef struct ModelCounters {
        uint64_t contexts;
        uint64_t mems;
        uint64_t imports;
        uint64_t mappings;
        uint64_t gem_handles;
        uint64_t svm_ranges;    /* of the primary context */
        uint64_t engine_rounds; /* by the engines' thread */
} ModelCounters;

/* A relaxed atomic add to a counter of ModelCounters (or any counter read without the lock). */
#define MODEL_COUNT(field, delta) __atomic_add_fetch(&(field), (__typeof__(field))(delta), __ATOMIC_RELAXED)

struct ThunkModel {
        /* The model's lock. The engines do not hold it while they run a context's queues: they hold that
         * context's eng lock (ModelCtx.eng), which comes first. */
        pthread_mutex_t lock;
        pthread_mutex_t views_mu; /* leaf lock: the engines' buffer views (model-gpuvm.c) */
        pthread_mutex_t event_mu; /* leaf lock: event waiters sleep on event_cond under it, not the model's */
        uint64_t event_gen;       /* bumped (under lock and event_mu) whenever events change */
        ModelCounters cnt;
        uint32_t minor;
        int anchor; /* memfd the kfd/render fds are duplicates of */
        ModelGpu gpus[THUNK_MODEL_MAX_GPUS];
        size_t n_gpus;
        uint64_t svm_supported; /* bitmap of GPU indices */
        uint64_t system_ram;
        uint64_t system_limit;
        uint64_t ttm_limit;
        uint64_t pt_reserve;
        int64_t system_used;
        int64_t ttm_used;
        bool xnack_default;
        bool file_per_buffer; /* every buffer with memory gets a file of its own at allocation */
        bool doorbells;       /* the engines run up to the doorbells, not the write pointers */
        bool unmap_notices;   /* every unmap under an SVM range comes through thunk_model_munmap() */
        bool svm_unnoticed;   /* a notice could not be applied: probe the mappings at the next call */
        uint64_t next_mmap_offset;
        ModelBuf *bufs;
        uint64_t n_bufs;
        uint64_t n_buffer_files; /* buffers with a file of their own */
        HashMap by_offset;       /* mmap_offset -> ModelBuf */
        HashMap by_ino;          /* inode of a buffer's own file -> ModelBuf (chained by ino_next) */
        ModelHeap *heaps;        /* one backing file per GPU, in GPU order */
        ModelFile *files;
        ModelCtx *ctxs;
        ModelFd *fds;
        size_t n_fds;
        size_t cap_fds;
        ModelFault faults[MODEL_MAX_FAULTS];
        size_t n_faults;
        uint64_t dev_size;         /* bytes of the device memfd (anchor) handed out to doorbells/events */
        pthread_cond_t event_cond; /* with event_mu: broadcast whenever events change (CLOCK_MONOTONIC) */
        pthread_cond_t cp_cond;    /* wakes the packet processor: queues appear, a doorbell kick, the end */
        pthread_t cp_thread;
        bool cp_running;
        bool cp_stop;
        bool doorbell_kicks;      /* the owner tells of every doorbell write: idle engines sleep until one */
        bool cp_kicked;           /* a kick since the processor's last round began */
        uint32_t n_queues;        /* over all contexts */
        struct ModelViews *views; /* model-gpuvm.c: CPU views of the buffers the engines touched */
};

typedef struct Call {
        ThunkModel *m;
        ModelCtx *ctx;   /* KFD fds */
        ModelFile *file; /* render fds */
        ModelFd *ent;    /* the fd the request came in on */
        void *arg;       /* kernel-side copy, max(usize, struct size) bytes */
        size_t usize;
} Call;

/* model.c: objects, fds and dispatch */
void model_lock(ThunkModel *m);
void model_unlock(ThunkModel *m);
/* Under the model's lock: pins @c (a reference), lets go of the model's lock, takes @c's eng lock, then the
 * model's lock again; model_ctx_leave() undoes it, under the model's lock (and may free @c). */
void model_ctx_enter(ThunkModel *m, ModelCtx *c);
/* Takes @c's eng lock as every caller but the engines' thread does: counted, so that the engines, which
 * take it again between two queues, let the caller in first. */
void model_ctx_eng_lock(ModelCtx *c);
void model_ctx_leave(ThunkModel *m, ModelCtx *c);
int model_gpu_index(const ThunkModel *m, uint32_t gpu_id);
ModelFd *model_fd_lookup(ThunkModel *m, int fd);
/* The lowest free handle id of @pdd for @mem (sets mem->idr); -ENOMEM. */
int model_idr_alloc(ModelPdd *pdd, ModelMem *mem);
ModelMem *model_idr_find(ModelPdd *pdd, uint32_t id);
int model_bind_pdd(Call *c, uint32_t gpu_id, int *ret_idx);
/* Drops a reference; the last one releases the context (ctx_release), and frees it unless pinned. */
void model_ctx_unref(ThunkModel *m, ModelCtx *c);
/* Frees a released context's memory (its last reference and pin gone). */
void model_ctx_free(ModelCtx *c);

/* model-mem.c: accounting, backing files, buffers, GPU VMs and the memory ioctls */
/* One backing file per GPU, made with the model and closed with it (after its last buffer). */
int model_heaps_init(ThunkModel *m);
void model_heaps_done(ThunkModel *m);
/* Fills the backing-file and buffer-file counters of @s. */
void model_heaps_stats(const ThunkModel *m, ThunkModelStats *s);
/* Where @b's bytes are: a file and the offset of its first byte; -EPERM for a userptr BO (no memory of
 * the model's). Borrowed: valid while @b keeps its memory where it is (an export may move a carved one). */
int model_buf_file(const ModelBuf *b, int *ret_fd, uint64_t *ret_off);
/* mmap(2) of the first @len bytes of @b (at most its size); -EPERM for a userptr BO. */
int model_buf_mmap(ModelBuf *b, void *addr, size_t len, int prot, int flags, void **ret);
/* The buffer whose DRM-style fake offset is @mmap_offset, or NULL. */
ModelBuf *model_buf_at_offset(ThunkModel *m, uint64_t mmap_offset);
/* Charge @size bytes of KFD memory type @type (VRAM on GPU index @gpu); -ENOMEM over a limit. */
int model_charge(ThunkModel *m, int gpu, uint32_t type, uint64_t size);
void model_uncharge(ThunkModel *m, int gpu, uint32_t type, uint64_t size);
/* Let render file @f mmap @b (the allocating or importing VM's file, a file holding a GEM handle). */
int model_buf_allow(ModelBuf *b, ModelFile *f);
/* Forget @f in every buffer's list of files that may mmap it (the file is going away). */
void model_buf_disallow(ThunkModel *m, ModelFile *f);
/* Drop a reference; the last one refunds the charge and frees the memory. NULL-safe. */
void model_buf_unref(ThunkModel *m, ModelBuf *b);
/* The model's buffer behind dmabuf fd @fd (borrowed), or NULL with *err -EBADF (no open file) or -EINVAL. */
ModelBuf *model_buf_by_fd(ThunkModel *m, int fd, int *err);
bool model_fd_read_only(int fd);
/* A new dmabuf fd of @b (O_CLOEXEC per @flags), read-only unless @writable; -EPERM for a userptr. A carved
 * buffer first moves to a file of its own: -EBUSY while a CPU mapping of its carve-out is left. */
int model_buf_export_fd(ThunkModel *m, ModelBuf *b, bool writable, uint32_t flags, int *ret_fd);
/* The first mapping of @vm that ends after @addr, or NULL. */
ModelMapping *model_vm_first_after(const ModelVm *vm, uint64_t addr);
/* The mapping after @mp in address order, or NULL. */
ModelMapping *model_vm_next(const ModelVm *vm, const ModelMapping *mp);
bool model_vm_overlaps(const ModelVm *vm, uint64_t start, uint64_t end);
/* Insert a copy of @mp (its range, buffer, handle, offset); -EINVAL if it overlaps, -ENOMEM. A mapping's
 * range may later shrink in place: that keeps the order. */
int model_vm_insert(ModelVm *vm, const ModelMapping *mp);
/* Remove and free @mp; pointers to other mappings stay valid. */
void model_vm_remove(ModelVm *vm, ModelMapping *mp);
/* Free every mapping (the VM's file is going away). */
void model_vm_clear(ModelVm *vm);
/* Unmaps @mem everywhere in @c's VMs, drops its buffer and frees it (its context is going away). */
void model_mem_destroy(ThunkModel *m, ModelCtx *c, ModelMem *mem);
int model_kfd_alloc_memory_of_gpu(Call *c);
int model_kfd_free_memory_of_gpu(Call *c);
int model_kfd_map_memory_to_gpu(Call *c);
int model_kfd_unmap_memory_from_gpu(Call *c);
int model_kfd_get_dmabuf_info(Call *c);
int model_kfd_import_dmabuf(Call *c);
int model_kfd_export_dmabuf(Call *c);
int model_kfd_available_memory(Call *c);

/* model-svm.c: the process's CPU mappings, SVM ranges and attributes, XNACK */
/* Is [start, end) mapped throughout in this process (any protection)? */
bool model_cpu_range_mapped(uint64_t start, uint64_t end);
/* The kernel's deferred munmap work: pages of @c's SVM ranges no longer mapped leave them (NULL-safe). */
int model_svm_flush(ThunkModel *m, ModelCtx *c);
bool model_svm_overlaps(const ModelCtx *c, uint64_t start, uint64_t end);
/* Refunds and forgets every SVM range of @c (its context is going away). */
void model_svm_release(ThunkModel *m, ModelCtx *c);
int model_kfd_svm(Call *c);
int model_kfd_set_xnack_mode(Call *c);

/* model-drm.c: render files, GEM handles, PRIME, GEM_MMAP, GEM_VA */
/* Drop a reference to a render file; the last one closes its GEM handles and frees its VM. NULL-safe. */
void model_file_unref(ThunkModel *m, ModelFile *f);
int model_drm_gem_close(Call *c);
int model_drm_prime_fd_to_handle(Call *c);
int model_drm_prime_handle_to_fd(Call *c);
int model_drm_amdgpu_gem_mmap(Call *c);
int model_drm_amdgpu_gem_va(Call *c);

/* model-queue.c: events, queues, the packet processor and the remaining per-process ioctls */
int model_kfd_create_queue(Call *c);
int model_kfd_destroy_queue(Call *c);
int model_kfd_update_queue(Call *c);
int model_kfd_get_clock_counters(Call *c);
int model_kfd_create_event(Call *c);
int model_kfd_destroy_event(Call *c);
int model_kfd_set_event(Call *c);
int model_kfd_reset_event(Call *c);
int model_kfd_wait_events(Call *c);
int model_kfd_get_tile_config(Call *c);
int model_kfd_set_trap_handler(Call *c);
/* mmap of a doorbell or events offset on a kfd fd; -ENOENT if @offset is of another type */
int model_kfd_mmap_dev(ThunkModel *m, ModelCtx *ctx, void *addr, size_t len, int prot, int flags,
                       uint64_t offset, void **ret);
/* Releases the queues, events and signal page of a context that is going away. */
void model_ctx_release_queues(ThunkModel *m, ModelCtx *c);
/* Is @handle the context's signal page BO (which the kernel refuses to free)? */
bool model_is_event_page(const ModelCtx *c, uint64_t handle);
/* Events changed (signalled, destroyed, their context gone): wakes every waiter to look again. Under the
 * model lock. */
void model_events_changed(ThunkModel *m);
/* Stops and joins the packet processor; called without the model lock. */
void model_cp_stop(ThunkModel *m);

/* model-gpuvm.c: a buffer is going or moving to a file of its own, so is the engines' view of it (made again
 * on their next access); and all of them, when the model goes */
int model_gpuvm_hold(ThunkModel *m, ModelBuf *b);
void model_gpuvm_forget(ThunkModel *m, ModelBuf *b);
void model_gpuvm_release(ThunkModel *m);
/* The engines' CPU views kept between rounds of the command processor: past this many, all are dropped. */
#define MODEL_VIEWS_KEEP 64
void model_gpuvm_trim(ThunkModel *m);
