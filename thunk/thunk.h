/* gpumemd's thunk: the KFD memory API the broker calls, driven through the device seam (kernel or model). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topology.h"

/*
 * Conventions: every function returns 0 or a negative errno; output parameters are named ret_ and come
 * last, and are left untouched on failure. Arguments are validated before anything reaches the driver;
 * past that point the driver's errno is returned unchanged. Nothing here keeps global state: several
 * ThunkDevices (each with its own KFD, real or modelled) can live in one process. Objects are not
 * thread-safe; a caller that shares a device between threads serialises access itself.
 */

typedef enum ThunkBackend {
        THUNK_BACKEND_KFD,
        THUNK_BACKEND_MODEL,
} ThunkBackend;

typedef struct ThunkOptions {
        ThunkBackend backend;
        const char
                *topology_root;   /* KFD: sysfs topology dir (NULL = default); MODEL: the preset's tree dir */
        uint32_t model_kfd_minor; /* MODEL: reported KFD minor, 0 = model default */
        bool model_doorbells;     /* MODEL: queues run up to their doorbells (ThunkModelOptions.doorbells) */
        /* MODEL: every doorbell write is followed by thunk_model_doorbell_kick() (ThunkModelOptions) */
        bool model_doorbell_kicks;
        /* MODEL: this process unmaps memory under its SVM ranges only with thunk_cpu_unmap()
         * (ThunkModelOptions.unmap_notices) */
        bool model_unmap_notices;
} ThunkOptions;

typedef struct ThunkDevice ThunkDevice;
typedef struct ThunkContext ThunkContext;
typedef struct ThunkBo ThunkBo;
typedef struct ThunkGemMapping ThunkGemMapping;

/* ---- device ---------------------------------------------------------------------------------------- */

/*
 * Load the topology, create the model (MODEL backend; the device owns it), open the KFD, read its
 * version, query the apertures and acquire a GPU VM on every GPU's render node. Any GPU whose render node
 * cannot be opened or acquired fails the whole open: a broker must not silently lose GPUs. On failure
 * @errbuf (if given) holds a one-line reason.
 */
int thunk_device_open(const ThunkOptions *opts, ThunkDevice **ret, char *errbuf, size_t errlen);
ThunkDevice *thunk_device_close(ThunkDevice *d); /* NULL-safe, returns NULL */
const ThunkTopology *thunk_device_topology(const ThunkDevice *d);
void thunk_device_version(const ThunkDevice *d, uint32_t *ret_major, uint32_t *ret_minor);
const char *thunk_device_backend_name(const ThunkDevice *d); /* "kfd" / "model" */

/* Features gated on the KFD ABI minor version, as libhsakmt gates them. */
typedef enum ThunkFeature {
        THUNK_FEATURE_SVM,              /* 1.5: AMDKFD_IOC_SVM, SET_XNACK_MODE */
        THUNK_FEATURE_AVAILABLE_MEMORY, /* 1.9 */
        THUNK_FEATURE_EXPORT_DMABUF,    /* 1.12 */
        THUNK_FEATURE_GEM_VA,           /* 1.15: DRM GEM_VA works on the KFD-acquired compute VM */
        THUNK_FEATURE_CONTIGUOUS,       /* 1.16: contiguous VRAM allocation flag */
        THUNK_FEATURE_CREATE_PROCESS,   /* 1.19: secondary KFD contexts */
        _THUNK_FEATURE_MAX,
} ThunkFeature;

bool thunk_device_has(const ThunkDevice *d, ThunkFeature f);
/* The minor version that introduced @f, or 0 for an unknown feature. */
uint32_t thunk_feature_min_minor(ThunkFeature f);
const char *thunk_feature_name(ThunkFeature f);

/* The model behind a MODEL device (an opaque ThunkModel *), NULL for the KFD backend. Borrowed. */
void *thunk_device_model(const ThunkDevice *d);

typedef struct ThunkApertures {
        uint64_t lds_base, lds_limit;
        uint64_t scratch_base, scratch_limit;
        uint64_t gpuvm_base, gpuvm_limit;
} ThunkApertures;

typedef struct ThunkGpu {
        uint32_t gpu_id;
        uint32_t node_id;          /* topology node index */
        uint32_t drm_render_minor; /* /dev/dri/renderD<minor> */
        uint32_t pci_domain, pci_bus, pci_dev, pci_func;
        ThunkApertures apertures; /* as reported by GET_PROCESS_APERTURES_NEW */
} ThunkGpu;

size_t thunk_device_gpu_count(const ThunkDevice *d);
/* NULL when out of range / unknown. Borrowed, valid for the device's lifetime. */
const ThunkGpu *thunk_device_gpu(const ThunkDevice *d, size_t index);
const ThunkGpu *thunk_device_gpu_by_id(const ThunkDevice *d, uint32_t gpu_id);

/* The SVM aperture: the intersection of every GPU's GPUVM aperture, [base, limit] inclusive. */
void thunk_device_svm_aperture(const ThunkDevice *d, uint64_t *ret_base, uint64_t *ret_limit);

/* ---- contexts ------------------------------------------------------------------------------------- */

/*
 * A context is one KFD process: one KFD fd, one GPU VM per GPU (each on its own render fd). The primary
 * context is the device's own and lives as long as the device. Secondary contexts (ABI 1.19,
 * CREATE_PROCESS) have GPU VMs of their own; SVM and USERPTR stay with the primary context, as the kernel
 * keeps them there. thunk_context_free() closes the context's fds, which makes the driver release every
 * BO and mapping it still held; the context's ThunkBo and ThunkGemMapping objects are freed with it.
 */
ThunkContext *thunk_device_primary_context(ThunkDevice *d);
int thunk_context_new(ThunkDevice *d, ThunkContext **ret);
ThunkContext *thunk_context_free(ThunkContext *c); /* NULL-safe; the primary context is left alone */
bool thunk_context_is_primary(const ThunkContext *c);
ThunkDevice *thunk_context_device(const ThunkContext *c);
/* Borrowed fds, for diagnostics and for callers that must hand a render fd to libdrm. */
int thunk_context_kfd_fd(const ThunkContext *c);
int thunk_context_render_fd(const ThunkContext *c, uint32_t gpu_id); /* -ENODEV when unknown */

/* AVAILABLE_MEMORY (1.9): bytes still allocatable on @gpu_id in this context's view. */
int thunk_context_available_memory(ThunkContext *c, uint32_t gpu_id, uint64_t *ret_bytes);

/* The GPU's tiling configuration (GET_TILE_CONFIG): the address config register, banks, ranks and the
 * tile and macro-tile mode tables (all zero from GFX9 on, which keeps no such tables). */
#define THUNK_TILE_CONFIGS       32
#define THUNK_MACRO_TILE_CONFIGS 16
typedef struct ThunkTileConfig {
        uint32_t gb_addr_config;
        uint32_t num_banks;
        uint32_t num_ranks;
        uint32_t n_tile, n_macro; /* entries the driver filled */
        uint32_t tile[THUNK_TILE_CONFIGS];
        uint32_t macro[THUNK_MACRO_TILE_CONFIGS];
} ThunkTileConfig;
int thunk_context_tile_config(ThunkContext *c, uint32_t gpu_id, ThunkTileConfig *ret);

/* XNACK mode of the context's process (SET_XNACK_MODE, 1.5). */
int thunk_context_get_xnack(ThunkContext *c, bool *ret_enabled);
int thunk_context_set_xnack(ThunkContext *c, bool enabled);

/* ---- buffer objects ------------------------------------------------------------------------------- */

typedef enum ThunkMemKind {
        THUNK_MEM_VRAM,
        THUNK_MEM_GTT,
        THUNK_MEM_USERPTR,
} ThunkMemKind;

/* Allocation flags (translated to KFD_IOC_ALLOC_MEM_FLAGS_*). */
enum {
        THUNK_MEM_WRITABLE = 1u << 0,
        THUNK_MEM_EXECUTABLE = 1u << 1,
        THUNK_MEM_PUBLIC = 1u << 2, /* host-visible VRAM (must fit in the BAR) */
        THUNK_MEM_NO_SUBSTITUTE = 1u << 3,
        THUNK_MEM_COHERENT = 1u << 4,
        THUNK_MEM_UNCACHED = 1u << 5,
        THUNK_MEM_EXT_COHERENT = 1u << 6,
        THUNK_MEM_CONTIGUOUS = 1u << 7, /* VRAM only, needs THUNK_FEATURE_CONTIGUOUS */
        THUNK_MEM_AQL_QUEUE = 1u << 8,
        _THUNK_MEM_ALL = (1u << 9) - 1,
};

typedef struct ThunkAllocArgs {
        ThunkMemKind kind;
        uint32_t gpu_id;  /* the owning GPU */
        uint32_t flags;   /* THUNK_MEM_* */
        uint64_t va;      /* GPU VA; 0 = a VA-less handle, which can be exported but never KFD-mapped */
        uint64_t size;    /* bytes, a non-zero multiple of the page size */
        uint64_t userptr; /* USERPTR only: the page-aligned CPU address of the pages to register */
} ThunkAllocArgs;

typedef struct ThunkBoInfo {
        uint64_t handle;      /* KFD handle: gpu_id << 32 | per-GPU id */
        uint64_t mmap_offset; /* offset to mmap on the owning GPU's render fd (not for USERPTR) */
        uint64_t va;
        uint64_t size;
        uint64_t userptr;
        uint32_t gpu_id;
        uint32_t flags; /* THUNK_MEM_* as allocated (imports: as reported by the driver) */
        ThunkMemKind kind;
        bool imported;
} ThunkBoInfo;

/* Allocate a BO in @c (ALLOC_MEMORY_OF_GPU). The BO belongs to the context. */
int thunk_bo_alloc(ThunkContext *c, const ThunkAllocArgs *args, ThunkBo **ret);
/*
 * FREE_MEMORY_OF_GPU. On success the ThunkBo is gone. On failure (e.g. -EBUSY while still mapped) it stays
 * valid and owned by the caller. Refused up front with -EBUSY while the BO is KFD-mapped on any GPU, as
 * the kernel would. GEM_VA mappings made from the BO hold their own reference to its memory and may
 * outlive it.
 */
int thunk_bo_free(ThunkBo *bo);
const ThunkBoInfo *thunk_bo_info(const ThunkBo *bo);
ThunkContext *thunk_bo_context(const ThunkBo *bo);
/* Is the BO KFD-mapped on @gpu_id? */
bool thunk_bo_is_mapped(const ThunkBo *bo, uint32_t gpu_id);
/* Bit i set: mapped on the device's GPU i (thunk_device_gpu()), for the first 64 GPUs. */
uint64_t thunk_bo_mapped_mask(const ThunkBo *bo);
size_t thunk_bo_mapped_count(const ThunkBo *bo);

/*
 * MAP_MEMORY_TO_GPU on each GPU of @gpu_ids (no duplicates). GPUs the BO is already mapped on are skipped.
 * The ioctl is re-issued with its n_success progress after EINTR. If mapping fails part-way, the GPUs
 * this call had mapped are unmapped again, so the BO is mapped exactly where it was before, and the
 * driver's error is returned.
 */
int thunk_bo_map(ThunkBo *bo, const uint32_t *gpu_ids, size_t n_gpus);
/*
 * UNMAP_MEMORY_FROM_GPU on each GPU of @gpu_ids. Every GPU must be mapped (-EINVAL otherwise, as the
 * kernel says). On a driver failure part-way the GPUs already unmapped stay unmapped (the BO's state
 * follows the driver's n_success) and the error is returned.
 */
int thunk_bo_unmap(ThunkBo *bo, const uint32_t *gpu_ids, size_t n_gpus);
/* Unmap from every GPU it is mapped on. */
int thunk_bo_unmap_all(ThunkBo *bo);

/*
 * CPU mapping of a VRAM/GTT BO through its owning GPU's render fd at the BO's mmap offset: @addr as for
 * mmap(2), @flags MAP_SHARED plus optional MAP_FIXED / MAP_FIXED_NOREPLACE / MAP_POPULATE; the length is
 * the BO's size. The caller munmap()s the result. USERPTR BOs are CPU memory already and imports carry
 * no render-node offset (map their dmabuf instead): -EINVAL.
 */
int thunk_bo_mmap(ThunkBo *bo, void *addr, int prot, int flags, void **ret);

/* EXPORT_DMABUF (1.12): a new dmabuf fd (O_CLOEXEC; read-write iff the BO is writable) the caller owns. */
int thunk_bo_export_dmabuf(ThunkBo *bo, int *ret_fd);

typedef struct ThunkDmabufInfo {
        uint64_t size;
        uint32_t gpu_id; /* the GPU owning the memory */
        uint32_t flags;  /* THUNK_MEM_* derived from the driver's KFD flags */
        ThunkMemKind kind;
        uint32_t metadata_size; /* bytes of driver metadata available */
} ThunkDmabufInfo;

/*
 * GET_DMABUF_INFO on a dmabuf fd (borrowed). @metadata/@metadata_cap may be NULL/0, which still reports
 * metadata_size; a buffer that is too small gets the driver's -EINVAL.
 */
int thunk_dmabuf_info(ThunkContext *c, int dmabuf_fd, void *metadata, uint32_t metadata_cap,
                      ThunkDmabufInfo *ret);
/*
 * CPU mapping of a dmabuf fd (borrowed) from offset 0: @len page aligned, @flags MAP_SHARED plus optional
 * MAP_FIXED / MAP_FIXED_NOREPLACE / MAP_POPULATE. A dmabuf fd is an ordinary file the caller holds (the
 * kernel's dmabufs and the model's alike), so this is mmap(2) itself. The caller munmap()s the result.
 */
int thunk_dmabuf_mmap(ThunkDevice *d, int dmabuf_fd, void *addr, size_t len, int prot, int flags, void **ret);
/*
 * IMPORT_DMABUF of @dmabuf_fd (borrowed) onto @gpu_id at @va (0 = VA-less). The caller maps it. A dmabuf
 * GET_DMABUF_INFO does not describe (not amdgpu VRAM/GTT) is still offered to the driver, which accepts
 * foreign dmabufs as GTT on kernels that import through DRM PRIME; its size is then the file's size.
 */
int thunk_bo_import_dmabuf(ThunkContext *c, int dmabuf_fd, uint32_t gpu_id, uint64_t va, ThunkBo **ret);

/* ---- user-mode queues ----------------------------------------------------------------------------- */

/* Queue types: the KFD's numbers (KFD_IOC_QUEUE_TYPE_*). */
enum {
        THUNK_QUEUE_COMPUTE = 0, /* PM4 */
        THUNK_QUEUE_SDMA = 1,
        THUNK_QUEUE_COMPUTE_AQL = 2,
        THUNK_QUEUE_SDMA_XGMI = 3,
};

/* What CREATE_QUEUE takes: every address is a GPU VA of the context, which the GPU reads and writes. */
typedef struct ThunkQueueArgs {
        uint32_t gpu_id;
        uint32_t type;       /* THUNK_QUEUE_* */
        uint32_t percentage; /* 0-100 */
        uint32_t priority;   /* 0-15 */
        uint64_t ring_va, ring_size;
        uint64_t rptr_va, wptr_va;
        uint64_t eop_va, eop_size;                           /* compute queues' end-of-pipe buffer */
        uint64_t ctx_save_va, ctx_save_size, ctl_stack_size; /* CWSR area */
} ThunkQueueArgs;

/* CREATE_QUEUE in @c: the queue's id and the mmap offset of its doorbell on the kfd fd. The driver's
 * errno unchanged (-EINVAL, -EFAULT, -ENOMEM, ...). The queue goes with the context. */
int thunk_queue_create(ThunkContext *c, const ThunkQueueArgs *q, uint32_t *ret_id,
                       uint64_t *ret_doorbell_offset);
int thunk_queue_destroy(ThunkContext *c, uint32_t queue_id);
/*
 * The doorbell of the queue CREATE_QUEUE answered with @doorbell_offset on GPU @gpu_id of @c, mapped in
 * this process: the context's doorbell slice for that GPU is mapped from its kfd fd on the first call and
 * stays until the context goes. Writing a queue's write pointer there (64 bits, for an AQL queue the id
 * of the last packet written) is ringing it. Only the process that owns the context may map it; only
 * 64-bit doorbells (gfx9 and later, -EOPNOTSUPP before).
 */
int thunk_queue_doorbell(ThunkContext *c, uint32_t gpu_id, uint64_t doorbell_offset, volatile uint64_t **ret);
int thunk_queue_update(ThunkContext *c, uint32_t queue_id, uint64_t ring_va, uint64_t ring_size,
                       uint32_t percentage, uint32_t priority);

/* ---- events (1.0) ------------------------------------------------------------------------------- */

/*
 * CREATE_EVENT in @c: a KFD event of @type (KFD_IOC_EVENT_*), @auto_reset or not. @page, for the first
 * signal event of the context only, is a BO of @c whose pages become the context's signal page (the GPU
 * writes an event's slot there before it interrupts); NULL: the driver's own page. The driver's errno
 * unchanged. The kernel numbers signal events by the lowest free slot.
 */
int thunk_event_create(ThunkContext *c, uint32_t type, bool auto_reset, const ThunkBo *page,
                       uint32_t *ret_id);
int thunk_event_destroy(ThunkContext *c, uint32_t id);
int thunk_event_set(ThunkContext *c, uint32_t id);
int thunk_event_reset(ThunkContext *c, uint32_t id);

/* An event to wait on, and what a memory event that fired hands over (a GPU VM fault). */
typedef struct ThunkEventWait {
        uint32_t id;
        bool faulted; /* out: a memory event that fired, with the fault below */
        uint32_t gpu_id;
        uint64_t va;
        bool not_present, read_only, no_execute;
} ThunkEventWait;

/*
 * WAIT_EVENTS in @c: blocks until any (or @all) of @n events is signalled or @timeout_ms passes
 * (UINT32_MAX: forever; 0: a look). *@ret_done: whether it was signalled. Auto-reset events that end the
 * wait are reset by it. -EINVAL for an unknown id; -EINTR for a signal.
 */
int thunk_event_wait(ThunkContext *c, ThunkEventWait *ev, size_t n, bool all, uint32_t timeout_ms,
                     bool *ret_done);

/* ---- SVM (1.5) ----------------------------------------------------------------------------------- */

/* Same layout as struct kfd_ioctl_svm_attribute. Types/values: KFD_IOCTL_SVM_ATTR_*, _FLAG_*, _LOCATION_*. */
typedef struct ThunkSvmAttr {
        uint32_t type;
        uint32_t value;
} ThunkSvmAttr;

#define THUNK_SVM_MAX_ATTRS 64

/* SET_ATTR over [start, start+size) (page aligned, size non-zero). */
int thunk_svm_set(ThunkContext *c, uint64_t start, uint64_t size, const ThunkSvmAttr *attrs, size_t n_attrs);
/* GET_ATTR: @attrs holds the queried types (ACCESS: value = gpu_id) and receives the results in place. */
int thunk_svm_get(ThunkContext *c, uint64_t start, uint64_t size, ThunkSvmAttr *attrs, size_t n_attrs);
/*
 * munmap(addr, len) through the device's seam. The kernel drops unmapped pages from the process's SVM ranges
 * by its MMU notifiers; the model has none and is told here. A process that unmaps memory under its SVM
 * ranges only this way may say so (ThunkOptions.model_unmap_notices), which spares the model a probe of
 * every range's mapping at each SVM call.
 */
int thunk_cpu_unmap(ThunkDevice *d, void *addr, size_t len);

/* ---- VMM-style mapping through DRM GEM_VA (1.15) ------------------------------------------------- */

enum {
        THUNK_GEM_VA_READABLE = 1u << 0,
        THUNK_GEM_VA_WRITEABLE = 1u << 1,
        THUNK_GEM_VA_EXECUTABLE = 1u << 2,
        _THUNK_GEM_VA_ALL = (1u << 3) - 1,
};

/*
 * Map [offset, offset+size) of a dmabuf's memory at GPU VA @va in @gpu_id's compute VM of @c: the dmabuf is
 * imported into that GPU's render fd (PRIME_FD_TO_HANDLE) and bound with GEM_VA. va, offset and size are
 * page aligned, size non-zero. @dmabuf_fd is borrowed. The mapping keeps a GEM handle open until
 * thunk_gem_unmap().
 */
int thunk_gem_map_dmabuf(ThunkContext *c, int dmabuf_fd, uint32_t gpu_id, uint64_t va, uint64_t offset,
                         uint64_t size, uint32_t flags, ThunkGemMapping **ret);
/* The same for a BO of any context of the device (exported internally; the temporary fd is closed). */
int thunk_gem_map_bo(ThunkContext *c, ThunkBo *bo, uint32_t gpu_id, uint64_t va, uint64_t offset,
                     uint64_t size, uint32_t flags, ThunkGemMapping **ret);
/* GEM_VA unmap and GEM_CLOSE (when the last mapping of that GEM handle goes). On failure @m stays valid. */
int thunk_gem_unmap(ThunkGemMapping *m);
