/* The software KFD: the KFD ioctl ABI (and the few amdgpu DRM ioctls the thunk needs) served in-process. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seam.h"
#include "thunk.h"
#include "topology.h"

/*
 * A ThunkModel behaves like /dev/kfd plus the render nodes of one topology, for the process it lives in.
 * Requests arrive as the kernel's ioctl requests on the kernel's structs; answers and errnos follow the
 * kernel's rules (docs/thunk-model.md lists what is and is not emulated). The model copies what it needs
 * from the topology: the caller may free the topology after thunk_model_new().
 *
 * All functions are thread-safe (one mutex per model). Several models may live in one process.
 */

typedef struct ThunkModel ThunkModel;

#define THUNK_MODEL_MAX_GPUS 64
/* The KFD ABI minor versions the model can report (ThunkModelOptions.kfd_minor; 0 = the newest). */
#define THUNK_MODEL_KFD_MINOR_MIN 11
#define THUNK_MODEL_KFD_MINOR_MAX 19

typedef struct ThunkModelOptions {
        /* KFD ABI minor reported by GET_VERSION, and the behaviour that goes with it. 0 = 19. Supported:
         * 11 ... 19. Gates: EXPORT_DMABUF >= 12, RUNTIME_ENABLE >= 13, GEM_VA on a compute VM >= 15,
         * CONTIGUOUS >= 16, CREATE_PROCESS >= 19. */
        uint32_t kfd_minor;
        /* System RAM the limits are computed from. 0 = the sum of the CPU nodes' memory banks, or
         * 16 GiB if the topology has none. */
        uint64_t system_memory_bytes;
        /* TTM limit. 0 = half of system RAM. */
        uint64_t ttm_limit_bytes;
        /* XNACK mode of new contexts (the kernel's amdgpu.noretry=0 on capable GPUs). */
        bool xnack_enabled;
        /* Give every buffer with memory a file of its own at allocation (one fd each in this process),
         * instead of carving those that are not host visible out of their GPU's backing file. For callers
         * that export buffers they keep mapped and that are not host visible (docs/thunk-model.md). */
        bool file_per_buffer;
        /* The engines take a queue's write pointer from its doorbell, as the hardware does: what a
         * process writes to the doorbell page is what they run up to (for an AQL queue, the id of the
         * last packet written; for SDMA and PM4, the write pointer itself), and a write pointer that
         * moved in memory without a doorbell is not seen. Off: they look at the write pointers in memory
         * (a doorbell write is then not needed). */
        bool doorbells;
        /* With doorbells: the owner calls thunk_model_doorbell_kick() after every doorbell write it makes
         * (and nobody else writes them), so that the engines sleep while no queue has work left instead of
         * looking at every doorbell up to every millisecond. */
        bool doorbell_kicks;
        /* The process unmaps memory that lies under its SVM ranges only through thunk_model_munmap() (the
         * seam's munmap), as the kernel sees every munmap: the model then drops the pages from the ranges
         * there, as the kernel's MMU notifier does, and its SVM calls trust the ranges instead of probing
         * the process's mappings of each (one system call per range per call). Off, every SVM call and
         * allocation probes every range, so that a process may unmap with plain munmap(). */
        bool unmap_notices;
} ThunkModelOptions;

/* Counters that tests compare before and after an operation: equal means nothing leaked. */
typedef struct ThunkModelStats {
        uint32_t contexts;     /* live KFD contexts (primary + secondary) */
        uint32_t kfd_fds;      /* open /dev/kfd fds the model handed out */
        uint32_t render_fds;   /* open render-node fds */
        uint32_t render_files; /* render-node DRM files still alive (fds, or held by an acquired VM) */
        uint64_t mems;         /* KFD handles (allocations and imports) over all contexts */
        uint64_t bufs;     /* backing objects of handles (BOs): carved, with a file of their own, userptr */
        uint64_t imports;  /* KFD handles created by IMPORT_DMABUF */
        uint64_t mappings; /* VA mappings in all GPU VMs (KFD MAP and GEM_VA) */
        uint64_t gem_handles; /* DRM GEM handles on all render files */
        uint64_t svm_ranges;  /* SVM ranges of the primary context */
        uint64_t system_used; /* bytes charged to the system limit */
        uint64_t ttm_used;    /* bytes charged to the TTM limit */
        uint32_t n_gpus;
        uint64_t vram_used[THUNK_MODEL_MAX_GPUS]; /* bytes charged to each GPU's VRAM, topology GPU order */
        uint32_t queues;                          /* user-mode queues (CREATE_QUEUE) over all contexts */
        uint32_t events;                          /* events (CREATE_EVENT) over all contexts */
        uint32_t backing_files;                   /* files buffers are carved out of: one per GPU */
        uint64_t buffer_files; /* buffers with a file of their own (shareable ones, foreign imports) */
        uint64_t carved_bytes; /* bytes of the backing files that live buffers hold */
        uint64_t backing_extent_bytes;   /* offsets of the backing files handed out (freed ones are reused) */
        uint64_t backing_resident_bytes; /* memory the backing files hold (a freed buffer's is punched out) */
} ThunkModelStats;

/* Build a model of @topo. -EINVAL for an unsupported kfd_minor or a topology without GPUs, or more than
 * THUNK_MODEL_MAX_GPUS; -ENOMEM. @opts may be NULL (all defaults). */
int thunk_model_new(const ThunkTopology *topo, const ThunkModelOptions *opts, ThunkModel **ret);
/* Frees everything, closes every fd the model still tracks. Returns NULL. */
ThunkModel *thunk_model_free(ThunkModel *m);

/* The seam over this model (borrowed: valid while @m lives). */
void thunk_model_seam(ThunkModel *m, ThunkSeam *ret);

/* Seam operations, callable directly (the seam's ops call these). */
int thunk_model_open_kfd(ThunkModel *m, int *ret_fd);
int thunk_model_open_render(ThunkModel *m, uint32_t minor, int *ret_fd);
int thunk_model_ioctl(ThunkModel *m, int fd, unsigned long request, void *arg);
int thunk_model_mmap(ThunkModel *m, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                     void **ret);
int thunk_model_close(ThunkModel *m, int fd);
/* munmap(addr, len) in this process, and what the kernel's MMU notifier does on it: the pages leave every
 * context's SVM ranges, refunding what they were charged. */
int thunk_model_munmap(ThunkModel *m, void *addr, size_t len);

/*
 * A restart of the process that owns the model: @fd is the file of a buffer an earlier model exported (a
 * sealed memfd of its own), which becomes a buffer of GPU @gpu_id of this model again, GTT when @kfd_flags
 * has KFD_IOC_ALLOC_MEM_FLAGS_GTT, else of the GPU's memory type (VRAM, or GTT on an APU), with the KFD
 * allocation @kfd_flags, and is charged to that GPU as an allocation
 * is. A KFD import of the file then finds it as the kernel finds a BO behind its dmabuf. The model holds
 * it until thunk_model_adopt_release(), which an import outlives. -EINVAL: not such a file or no such GPU;
 * -EEXIST: the model has that file already; -ENOMEM: the GPU has no room.
 */
int thunk_model_adopt(ThunkModel *m, int fd, uint32_t gpu_id, uint32_t kfd_flags);
void thunk_model_adopt_release(ThunkModel *m, int fd);

/*
 * Seal @fd's file against new writable mappings (F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) where the model has a
 * buffer of it: every such buffer first gets the engines' view of it, writable where the model's own fd of
 * it is, so that GPU access the model granted before the seal keeps working after it; then the seal is
 * taken through the model's fd. 0 (the caller checks the file's seals: none is taken when the model has no
 * buffer of that file or no writable fd of it), or -ENOMEM when a view cannot be made (nothing sealed).
 */
int thunk_model_seal(ThunkModel *m, int fd);

/* True if @fd is a kfd or render fd of this model. */
bool thunk_model_owns_fd(ThunkModel *m, int fd);

void thunk_model_get_stats(ThunkModel *m, ThunkModelStats *ret);
/*
 * The counters of thunk_model_get_stats() that a status report shows, read without the model's lock: it
 * never waits for an ioctl or the engines, whatever a caller makes them do. Filled: contexts, mems, imports,
 * mappings, gem_handles, svm_ranges (as of the last call: no probe of unnoticed unmaps), bufs, system_used,
 * ttm_used, n_gpus, vram_used, queues; the rest stay 0. Each counter is exact; together
 * they need not be one instant's.
 */
void thunk_model_peek_stats(ThunkModel *m, ThunkModelStats *ret);
/* Rounds the engines' thread has run over the queues (looks at them) since the model began. */
uint64_t thunk_model_engine_rounds(ThunkModel *m);
/* A doorbell was written (ThunkModelOptions.doorbell_kicks): wakes the engines. */
void thunk_model_doorbell_kick(ThunkModel *m);

/* Runs every queue's engine once, as the model's packet processor thread does each round, and returns
 * how many packets they retired: tests and fuzzers use it to drive queues without waiting. */
unsigned int thunk_model_run_engines(ThunkModel *m);

/*
 * Fault injection: the @nth_call-th (1 = the next) call of the ioctl @request (matched on type and
 * number, so any size variant counts) fails with -@err before it changes any state. At most 16 pending
 * faults; -ENOSPC beyond, -EINVAL for nth_call 0 or err <= 0.
 */
int thunk_model_inject_fault(ThunkModel *m, unsigned long request, unsigned int nth_call, int err);
void thunk_model_clear_faults(ThunkModel *m);
