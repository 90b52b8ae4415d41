/* The KFD model's private data structures, shared by its source files (thunk/model*.c). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kfd-compat.h"
#include "model.h"

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

/* The backing object of an allocation (what amdgpu calls a BO): one memfd, shared by imports and handles. */
typedef struct ModelBuf {
        struct ModelBuf *next;
        struct ModelBuf **pprev; /* the pointer to this one: unlinking at a context's teardown is O(1) */
        unsigned int refs;
        int memfd; /* -1 for userptr */
        dev_t dev;
        ino_t ino;
        uint64_t size;
        uint64_t mmap_offset;
        uint32_t type;  /* one KFD type bit: where it lives */
        uint32_t flags; /* allocation flags */
        int owner;      /* GPU index */
        uint64_t charge;
        uint32_t charge_type; /* KFD type bit the charge was made for, 0 if none */
        bool foreign;
        uint64_t userptr;           /* CPU address of a userptr BO's pages */
        struct ModelFile **allowed; /* render files that may mmap it */
        size_t n_allowed;
} ModelBuf;

struct ModelMem;

typedef struct ModelMapping {
        uint64_t start;
        uint64_t end;
        ModelBuf *buf;
        struct ModelMem *mem; /* KFD mapping; NULL for GEM_VA */
        uint64_t offset;
        uint32_t gem_flags; /* GEM_VA: the AMDGPU_VM_PAGE_* rights it was made with (KFD: the mem's flags) */
} ModelMapping;

typedef struct ModelVm {
        ModelMapping *v;
        size_t n;
        size_t cap;
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
        bool stopped;        /* a GPU VM fault or an illegal packet stopped it for good */
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
        uint32_t preferred;
        uint32_t prefetch;
        uint32_t flags;
        uint8_t granularity;
        bool charged;
        uint64_t access;
        uint64_t in_place;
} SvmRange;

typedef struct ModelCtx {
        struct ModelCtx *next;
        unsigned int refs; /* kfd fds */
        bool primary;
        bool xnack;
        bool runtime_enabled;
        ModelPdd pdd[THUNK_MODEL_MAX_GPUS];
        SvmRange *svm;
        size_t n_svm;
        size_t cap_svm;
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

struct ThunkModel {
        pthread_mutex_t lock;
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
        uint64_t next_mmap_offset;
        ModelBuf *bufs;
        ModelFile *files;
        ModelCtx *ctxs;
        ModelFd *fds;
        size_t n_fds;
        size_t cap_fds;
        ModelFault faults[MODEL_MAX_FAULTS];
        size_t n_faults;
        uint64_t dev_size;         /* bytes of the device memfd (anchor) handed out to doorbells/events */
        pthread_cond_t event_cond; /* broadcast whenever an event is signalled (CLOCK_MONOTONIC) */
        pthread_cond_t cp_cond;    /* wakes the packet processor when queues appear or the model ends */
        pthread_t cp_thread;
        bool cp_running;
        bool cp_stop;
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

int model_gpu_index(const ThunkModel *m, uint32_t gpu_id);
int model_grow(void **p, size_t *cap, size_t need, size_t elem);
ModelFd *model_fd_lookup(ThunkModel *m, int fd);
ModelMem *model_idr_find(ModelPdd *pdd, uint32_t id);
int model_bind_pdd(Call *c, uint32_t gpu_id, int *ret_idx);
void model_ctx_unref(ThunkModel *m, ModelCtx *c);

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
/* Stops and joins the packet processor; called without the model lock. */
void model_cp_stop(ThunkModel *m);

/* model-gpuvm.c: a buffer is going, so is the engines' view of it; and all of them, when the model goes */
void model_gpuvm_forget(ThunkModel *m, ModelBuf *b);
void model_gpuvm_release(ThunkModel *m);
