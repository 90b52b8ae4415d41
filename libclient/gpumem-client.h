/* libgpumem_client: the C API through which programs use gpumemd, the AMD GPU memory broker. */
#ifndef GPUMEM_CLIENT_H
#define GPUMEM_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Conventions of this API:
 * - Every function that can fail returns 0 on success or a negative errno (-EINVAL, -ENOMEM, -EDQUOT,
 *   -EACCES, ...). gm_strerror() turns the code into a message that includes the daemon's reason for
 *   the calling thread's last failed call on that client.
 * - Output parameters come last and are written only on success.
 * - A gm_client may be used by several threads at once; calls run concurrently on one connection.
 * - The library never logs, never aborts and never raises SIGPIPE.
 * - Structs returned through a pointer are allocated by the library and released with the matching
 *   *_free function; later versions may append fields to them.
 */

typedef struct gm_client gm_client;

/** Default socket; $GPUMEM_SOCKET overrides it when no path is given. */
#define GM_DEFAULT_SOCKET "/run/gpumemd/gpumemd.sock"

/**
 * Connect to gpumemd and complete the handshake: protocol version, and the VA window every address of
 * this client will lie in, which is reserved (PROT_NONE) in this process at the same address as in the
 * daemon, so pointers mean the same on both sides.
 * \param socket_path [in] the daemon's socket; NULL: $GPUMEM_SOCKET, else GM_DEFAULT_SOCKET
 * \param name        [in] a label shown to administrators (not an identity); may be NULL
 * \param ret         [out] the connected client
 * \return 0, -ENOENT/-ECONNREFUSED (no daemon), -EACCES (socket permissions), -EPROTONOSUPPORT,
 *         -EUSERS (connection limit), -ENOMEM (the daemon has no VA window left), -ENOSPC (no window
 *         it offered could be reserved in this process), or another -errno
 */
int gm_client_connect(const char *socket_path, const char *name, gm_client **ret);

/**
 * gm_client_connect that also says why it failed: on failure @errbuf receives the errno's text and the
 * daemon's reason (for example "Too many users: class 'batch' is at its limit of 32 connections").
 * Since 1.1.
 */
int gm_client_open(const char *socket_path, const char *name, gm_client **ret, char *errbuf, size_t errlen);

/** What a connection asks of the daemon at hello (since 1.3). Zero-initialise, set struct_size. */
typedef struct gm_client_options {
        size_t struct_size;      /* sizeof(gm_client_options) */
        const char *socket_path; /* NULL: $GPUMEM_SOCKET, else the default socket */
        const char *name;        /* a label for administrators */
        uint64_t window_size;    /* VA window in bytes (a multiple of 2 MiB); 0 = the daemon's default */
        /* The window must lie below 1 TiB, where libhsakmt 5.2 accepts an SVM aperture (for a client-side KFD
         * under ROCm); -ENOSPC when the daemon has no room there, -EOPNOTSUPP from a daemon older than
         * protocol 2. */
        bool low_window;
} gm_client_options;

/** gm_client_open with options. */
int gm_client_open_with(const gm_client_options *o, gm_client **ret, char *errbuf, size_t errlen);

/* ---- KFD events of the client's context (since 1.3, protocol 2): what a client-side KFD serves ------ */

/**
 * A KFD event of @type (0 a signal event, 8 a memory-exception event, ...). The first event may name the
 * event page, host memory of this client's (@page; NULL: none). A signal event's slot in the page is its
 * id. Each event costs the class a handle. -EINVAL: bad type, or a page when one is set; -ENOSPC.
 */
int gm_event_create(gm_client *c, uint32_t type, bool auto_reset, const void *page, uint32_t *ret_id,
                    uint32_t *ret_slot);
int gm_event_destroy(gm_client *c, uint32_t id);
/** Set a signal event (every pending wait on it is woken; an auto-reset one is taken by them). */
int gm_event_set(gm_client *c, uint32_t id);
int gm_event_reset(gm_client *c, uint32_t id);
/**
 * Wait for any (@all: all) of @ids, at most @timeout_ms (0: look only; UINT32_MAX: no limit) without
 * holding up the connection's other calls. Returns KFD's result: 0 complete, 1 timeout, 2 an event it
 * named was destroyed; -EINVAL for an unknown event, -EAGAIN with 256 waits pending.
 */
int gm_event_wait(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms);

/** A GPU VM fault as a memory event holds it (KFD's memory exception data). */
typedef struct gm_memory_exception {
        uint32_t event_id;
        uint32_t gpu_id;
        uint64_t va; /**< the faulting page */
        bool not_present, read_only, no_execute;
} gm_memory_exception;

/**
 * gm_event_wait, and (since 1.4) the faults the memory events among @ids hold, at most @cap into @ret
 * (*@ret_n: how many; the daemon sends at most 8 in one reply). A memory event takes each GPU VM fault of the
 * client's context and is set by it.
 */
int gm_event_wait_faults(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms,
                         gm_memory_exception *ret, size_t cap, size_t *ret_n);

/* ---- user-mode queues in the client's context (since 1.4, protocol 2) ----------------------------- */

/** A queue as KFD's CREATE_QUEUE takes it: every address is memory of this client's in gpumemd. */
typedef struct gm_queue_desc {
        uint32_t gpu_id;
        uint32_t type;       /**< KFD's: 0 PM4 compute, 1 SDMA, 2 AQL compute, 3 SDMA over XGMI */
        uint32_t percentage; /**< 0-100 */
        uint32_t priority;   /**< 0-15 */
        uint64_t ring_va, ring_size;
        uint64_t rptr_va, wptr_va;
        uint64_t eop_va, eop_size;                           /**< 0: none */
        uint64_t ctx_save_va, ctx_save_size, ctl_stack_size; /**< the CWSR area; 0: none */
} gm_queue_desc;

/**
 * A queue the daemon runs in this client's own GPU context: its id and its doorbell's mmap offset (KFD's
 * encoding). Each queue costs the class a handle and one of its `queues`. -EFAULT: an address that is no
 * memory of this client's; -EDQUOT: the class's limit; -ENOMEM: no queue left on the GPU.
 */
int gm_queue_create(gm_client *c, const gm_queue_desc *d, uint32_t *ret_id, uint64_t *ret_doorbell_offset);
int gm_queue_destroy(gm_client *c, uint32_t id);
/** A new ring (0: none, the queue stops), percentage and priority. */
int gm_queue_update(gm_client *c, uint32_t id, uint64_t ring_va, uint64_t ring_size, uint32_t percentage,
                    uint32_t priority);

/** Close the connection and release the VA window. NULL-safe. Everything the client held in the daemon
 *  is freed by the daemon. */
void gm_client_close(gm_client *c);

/**
 * Describe @err (a negative errno returned by this library) into @buf: "strerror: reason", where the
 * reason is the daemon's (or the library's) explanation of the calling thread's last failure on @c.
 * @c may be NULL (then only strerror). Returns @buf.
 */
const char *gm_strerror(gm_client *c, int err, char *buf, size_t len);

/** Session facts from the handshake; @c must be a client that gm_client_open() (or connect) returned. */
uint64_t gm_client_id(const gm_client *c);
void gm_client_window(const gm_client *c, uint64_t *ret_base, uint64_t *ret_size);
/** The daemon's version string, e.g. "0.1.0". Valid while @c is open. */
const char *gm_client_server_version(const gm_client *c);
/** "kfd" or "model". Valid while @c is open. */
const char *gm_client_backend(const gm_client *c);
void gm_client_kfd_version(const gm_client *c, uint32_t *ret_major, uint32_t *ret_minor);
uint32_t gm_client_protocol_version(const gm_client *c);

/** A round trip that does nothing (latency probes, liveness). */
int gm_ping(gm_client *c);

/* ---- topology ------------------------------------------------------------------------------------ */

typedef struct gm_property {
        char *key;
        uint64_t value;
} gm_property;

typedef struct gm_io_link {
        uint32_t type; /* 2 PCIe, 11 XGMI (HSA_IOLINK_TYPE_*) */
        uint32_t node_from;
        uint32_t node_to;
        uint32_t weight;
        uint32_t min_bandwidth;
        uint32_t max_bandwidth;
} gm_io_link;

typedef struct gm_topology_node {
        uint32_t node_id;
        uint32_t gpu_id; /* 0 for CPU nodes */
        char *name;
        bool is_gpu;
        uint32_t cpu_cores;
        uint32_t simd_count;
        uint64_t local_mem_size; /* VRAM bytes */
        uint32_t gfx_target_version;
        uint32_t vendor_id;
        uint32_t device_id;
        uint32_t pci_domain;
        uint32_t pci_location;
        uint32_t drm_render_minor;
        uint64_t hive_id;
        int32_t numa_node; /* nearest CPU NUMA node, -1 unknown */
        bool large_bar;
        uint32_t capability;
        uint64_t system_mem_size; /* CPU nodes */
        size_t n_io_links;
        gm_io_link *io_links;
        size_t n_properties; /* raw sysfs properties, when asked for */
        gm_property *properties;
} gm_topology_node;

typedef struct gm_topology {
        uint64_t generation_id;
        size_t n_nodes;
        gm_topology_node *nodes;
} gm_topology;

/** The node topology as the daemon sees it; @with_properties adds every raw property. */
int gm_topology_get(gm_client *c, bool with_properties, gm_topology **ret);
void gm_topology_free(gm_topology *t);

/* One file of the KFD sysfs topology (since libgpumem_client 1.3, protocol 2). */
typedef struct gm_topology_file {
        char *path; /* relative to the topology's root: "generation_id", "nodes/1/properties" */
        char *content;
        size_t len;
} gm_topology_file;

/**
 * The daemon's KFD topology as the kernel lays it out under /sys/devices/virtual/kfd/kfd/topology, file by
 * file (what a client-side KFD serves to ROCm). -EOPNOTSUPP from a daemon older than protocol 2.
 */
int gm_topology_files(gm_client *c, gm_topology_file **ret, size_t *ret_n);
void gm_topology_files_free(gm_topology_file *files, size_t n);

/** A GPU's tiling configuration as KFD's GET_TILE_CONFIG reports it (since 1.3, protocol 2). */
typedef struct gm_tile_config {
        uint32_t gb_addr_config;
        uint32_t num_banks;
        uint32_t num_ranks;
        uint32_t n_tile, n_macro; /* entries below that the driver filled */
        uint32_t tile[32];
        uint32_t macro[16];
} gm_tile_config;

/** -ENODEV: no such GPU. */
int gm_tile_config_get(gm_client *c, uint32_t gpu_id, gm_tile_config *ret);

/* ---- memory (since libgpumem_client 1.1) ------------------------------------------------------------ */

/**
 * Every address this library returns lies in the client's VA window and means the same to this process,
 * the daemon and the GPUs. Memory that is CPU-visible is mapped into this process at that address; the
 * library closes the fds it received for that, so no fd is held per allocation.
 */

/** Allocation flags (gm_malloc, gm_host_malloc, gm_malloc_managed, gm_mem_create). */
enum {
        GM_MEM_HOST_VISIBLE = 1, /**< device memory the CPU can access (needs a large BAR) */
        GM_MEM_COHERENT = 2,     /**< fine-grained: coherent between CPU and GPUs */
        GM_MEM_UNCACHED = 4,
        GM_MEM_EXECUTABLE = 8,
        GM_MEM_CONTIGUOUS = 16,   /**< physically contiguous VRAM (KFD ABI 1.16) */
        GM_MEM_READ_ONLY = 32,    /**< GPUs may only read, and this process maps it read-only */
        GM_MEM_EXT_COHERENT = 64, /**< extended-scope coherence; needs GM_MEM_COHERENT */
        /** host memory only (protocol 2): a GTT buffer of this client's own GPU context, which the queues
         *  the daemon runs for it can reach, mapped here through the buffer's dmabuf; not with
         *  GM_MEM_READ_ONLY or a NUMA node */
        GM_MEM_GTT = 128,
        /** with GM_MEM_GTT (protocol 2): the memory behind an SVM range of a client-side KFD, at
         *  @fixed_addr anywhere in this client's own GPU VM but the window (where the process has the
         *  range); mapped there in this process, not in the daemon */
        GM_MEM_SVM_RANGE = 256,
};

/** Kinds of memory, as gm_pointer_get_attributes reports them. */
enum {
        GM_KIND_DEVICE = 1,
        GM_KIND_HOST = 2,
        GM_KIND_MANAGED = 3,
        GM_KIND_VMM = 4,
        GM_KIND_IMPORT = 5,
        GM_KIND_SHARE = 6, /* a named share this client opened (protocol 3) */
};

/** Device memory on @gpu_id, mapped on that GPU (hipMalloc / hipExtMallocWithFlags).
 *  \return 0, -EINVAL (size 0, bad flags), -ENODEV (no such GPU), -ENOMEM (no VRAM or VA left), ... */
int gm_malloc(gm_client *c, size_t size, uint32_t gpu_id, unsigned flags, void **ret_ptr);

/** Pinned host memory mapped on every GPU the client's class may use, placed on @numa_node or, when -1, on
 * the NUMA node nearest
 *  @gpu_id (0: the first GPU); CPU-visible at the returned address (hipHostMalloc). */
int gm_host_malloc(gm_client *c, size_t size, uint32_t gpu_id, int numa_node, unsigned flags, void **ret_ptr);

/** Managed memory: shared pages at the same address in this process and the daemon, with SVM attributes
 *  (hipMallocManaged). Flags: GM_MEM_COHERENT, GM_MEM_EXT_COHERENT, GM_MEM_READ_ONLY, GM_MEM_EXECUTABLE. */
int gm_malloc_managed(gm_client *c, size_t size, unsigned flags, void **ret_ptr);

/** Everything gm_malloc and friends can say, for callers that need it. */
typedef struct gm_alloc_desc {
        int kind; /**< GM_KIND_DEVICE, GM_KIND_HOST or GM_KIND_MANAGED */
        size_t size;
        uint32_t gpu_id;
        unsigned flags;
        int numa_node;            /**< host: -1 = nearest the GPU */
        size_t alignment;         /**< 0 = chosen by size; else a power of two >= 4 KiB */
        void *fixed_addr;         /**< NULL = anywhere in the window; else exactly here */
        const uint32_t *map_gpus; /**< GPUs to map on at once (device: default @gpu_id; host: all) */
        size_t n_map_gpus;
} gm_alloc_desc;

int gm_malloc_desc(gm_client *c, const gm_alloc_desc *desc, void **ret_ptr);

/** Free memory from gm_malloc, gm_host_malloc or gm_malloc_managed (hipFree / hipHostFree); it is unmapped
 *  from every GPU first. -EINVAL when @ptr was not returned by them, or another thread is freeing it. */
int gm_mem_free(gm_client *c, void *ptr);

/** Map an allocation on more GPUs, or unmap it (@n 0: from every GPU). */
int gm_mem_map_gpus(gm_client *c, void *ptr, const uint32_t *gpu_ids, size_t n);
int gm_mem_unmap_gpus(gm_client *c, void *ptr, const uint32_t *gpu_ids, size_t n);

/** Free and total memory of @gpu_id as this client sees it: its allowance, not the whole device's
 *  (hipMemGetInfo). */
int gm_mem_get_info(gm_client *c, uint32_t gpu_id, size_t *ret_free, size_t *ret_total);

typedef uint64_t gm_handle;

typedef struct gm_pointer_attributes {
        size_t struct_size; /**< [in] sizeof(gm_pointer_attributes): fields beyond it are not written */
        gm_handle handle;   /**< 0 for a VMM mapping whose handle was released */
        int kind;           /**< GM_KIND_* */
        uint32_t gpu_id;    /**< owning GPU; for host memory the GPU it was placed near; 0 for managed */
        void *base;
        size_t size;
        unsigned flags;
        bool cpu_accessible;
        size_t n_mapped_gpus;
        uint32_t mapped_gpus[64];
} gm_pointer_attributes;

/** What lies at @ptr, which may point inside an allocation (hipPointerGetAttributes). */
int gm_pointer_get_attributes(gm_client *c, const void *ptr, gm_pointer_attributes *ret);

/* ---- managed memory attributes ---- */

/** HIP's advice values. @location: a gpu_id, or GM_LOCATION_CPU (system memory / the CPU). */
enum {
        GM_ADVISE_SET_READ_MOSTLY = 1, /**< the next ones 2 to 6, as in hipMemoryAdvise */
        GM_ADVISE_UNSET_READ_MOSTLY,
        GM_ADVISE_SET_PREFERRED_LOCATION,
        GM_ADVISE_UNSET_PREFERRED_LOCATION,
        GM_ADVISE_SET_ACCESSED_BY,
        GM_ADVISE_UNSET_ACCESSED_BY,
        GM_ADVISE_SET_COARSE_GRAIN = 100,
        GM_ADVISE_UNSET_COARSE_GRAIN,
};
#define GM_LOCATION_CPU 0u

/** hipMemAdvise on managed memory, translated to SVM attributes as ROCm's HIP runtime does. */
int gm_mem_advise(gm_client *c, const void *ptr, size_t size, int advice, uint32_t location);
/** hipMemPrefetchAsync: set the prefetch location (a gpu_id, or GM_LOCATION_CPU). */
int gm_mem_prefetch(gm_client *c, const void *ptr, size_t size, uint32_t location);

/** Raw SVM attributes, as the KFD defines them. */
enum {
        GM_SVM_ATTR_PREFERRED_LOC = 0, /**< value: gpu_id, GM_LOCATION_CPU or GM_SVM_LOCATION_UNDEFINED */
        GM_SVM_ATTR_PREFETCH_LOC = 1,
        GM_SVM_ATTR_ACCESS = 2,          /**< value: gpu_id */
        GM_SVM_ATTR_ACCESS_IN_PLACE = 3, /**< value: gpu_id */
        GM_SVM_ATTR_NO_ACCESS = 4,       /**< value: gpu_id */
        GM_SVM_ATTR_SET_FLAGS = 5,       /**< value: GM_SVM_FLAG_* */
        GM_SVM_ATTR_CLR_FLAGS = 6,
        GM_SVM_ATTR_GRANULARITY = 7, /**< value: log2 of the migration granularity in pages */
};
enum {
        GM_SVM_FLAG_HOST_ACCESS = 0x1,        /**< the CPU may access the range */
        GM_SVM_FLAG_COHERENT = 0x2,           /**< fine-grained: coherent between the CPU and the GPUs */
        GM_SVM_FLAG_HIVE_LOCAL = 0x4,         /**< any GPU of the preferred one's XGMI hive will do */
        GM_SVM_FLAG_GPU_RO = 0x8,             /**< the GPUs only read it (copies allowed) */
        GM_SVM_FLAG_GPU_EXEC = 0x10,          /**< the GPUs may execute code from it */
        GM_SVM_FLAG_GPU_READ_MOSTLY = 0x20,   /**< the GPUs mostly read it; a write faults */
        GM_SVM_FLAG_GPU_ALWAYS_MAPPED = 0x40, /**< the GPU mappings stay valid, as without XNACK */
        GM_SVM_FLAG_EXT_COHERENT = 0x80,      /**< coherent between all devices, for device-scope atomics */
};
#define GM_SVM_LOCATION_UNDEFINED 0xffffffffu

typedef struct gm_svm_attr {
        uint32_t type;
        uint32_t value;
} gm_svm_attr;

/** Set attributes on [ptr, ptr+size) of one managed allocation (page aligned). */
int gm_svm_set_attributes(gm_client *c, const void *ptr, size_t size, const gm_svm_attr *attrs, size_t n);
/** Query: @attrs holds the types (ACCESS: value = the gpu_id asked about); results replace them. Over
 *  sub-ranges that differ, locations read GM_SVM_LOCATION_UNDEFINED, SET_FLAGS the flags all share,
 *  CLR_FLAGS the flags none has, GRANULARITY the smallest. */
int gm_svm_get_attributes(gm_client *c, const void *ptr, size_t size, gm_svm_attr *attrs, size_t n);

/* ---- virtual memory management (hipMemAddressReserve / hipMemCreate / hipMemMap ...) ---- */

enum {
        GM_ACCESS_NONE = 0,
        GM_ACCESS_READ = 1,
        GM_ACCESS_READ_WRITE = 3,
};

enum {
        GM_GRANULARITY_MINIMUM = 0,
        GM_GRANULARITY_RECOMMENDED = 1,
};

/** Reserve VA only, in the window; @addr non-NULL asks for exactly that address (-EADDRINUSE if taken).
 *  @size a multiple of the minimum granularity; @alignment 0 or a power of two; @flags 0. */
int gm_mem_address_reserve(gm_client *c, size_t size, size_t alignment, void *addr, unsigned long long flags,
                           void **ret_ptr);
/** Give back a whole reservation; -EBUSY while anything is mapped in it. */
int gm_mem_address_free(gm_client *c, void *ptr, size_t size);
/** Physical memory on @gpu_id with no address (hipMemCreate). */
int gm_mem_create(gm_client *c, size_t size, uint32_t gpu_id, unsigned flags, gm_handle *ret_handle);
/** Drop a reference; the memory lives on while mapped (hipMemRelease). */
int gm_mem_release(gm_client *c, gm_handle handle);
/** Bind [offset, offset+size) of @handle at @ptr inside a reservation (hipMemMap). Nobody can access it
 *  until gm_mem_set_access grants it. */
int gm_mem_map(gm_client *c, void *ptr, size_t size, size_t offset, gm_handle handle);
/** Remove whole mappings in [ptr, ptr+size) (hipMemUnmap). */
int gm_mem_unmap(gm_client *c, void *ptr, size_t size);

typedef struct gm_access_desc {
        uint32_t gpu_id; /**< a GPU, or GM_LOCATION_CPU for this process */
        int access;      /**< GM_ACCESS_* */
} gm_access_desc;

/** Grant or revoke access to whole mappings in [ptr, ptr+size) (hipMemSetAccess). CPU access maps the
 *  memory into this process at ptr (at most 16 mappings per call). */
int gm_mem_set_access(gm_client *c, void *ptr, size_t size, const gm_access_desc *desc, size_t n);
int gm_mem_get_access(gm_client *c, const void *ptr, uint32_t location, int *ret_access);
int gm_mem_get_allocation_granularity(gm_client *c, uint32_t gpu_id, int option, size_t *ret_granularity);
/** The handle mapped at @ptr, with a new reference (hipMemRetainAllocationHandle). */
int gm_mem_retain_allocation_handle(gm_client *c, void *ptr, gm_handle *ret_handle);

typedef struct gm_allocation_prop {
        size_t struct_size; /**< [in] sizeof(gm_allocation_prop) */
        int kind;
        uint32_t gpu_id;
        size_t size;
        unsigned flags;
} gm_allocation_prop;

int gm_mem_get_allocation_properties(gm_client *c, gm_handle handle, gm_allocation_prop *ret);

/* ---- sharing ---- */

/** A dmabuf fd (owned by the caller) for an allocation or VMM handle (hipMemExportToShareableHandle);
 *  the handle of an allocation comes from gm_pointer_get_attributes. */
int gm_mem_export(gm_client *c, gm_handle handle, int *ret_fd, size_t *ret_size);

enum {
        GM_EXPORT_READ_ONLY = 1u << 0, /* the fd, and every import of it, may only read the memory */
};

/** gm_mem_export with GM_EXPORT_* @flags. A read-only export is an fd opened O_RDONLY: it cannot be mapped
 *  writable, and an importer gets read access only (-EACCES for read-write). Memory that is read-only to
 *  this client is always exported read-only. */
int gm_mem_export_flags(gm_client *c, gm_handle handle, unsigned flags, int *ret_fd, size_t *ret_size);
/** Import a dmabuf fd (borrowed) on @gpu_id (0: the first GPU) as a handle to map with gm_mem_map
 *  (hipMemImportFromShareableHandle). */
int gm_mem_import(gm_client *c, int fd, uint32_t gpu_id, gm_handle *ret_handle, size_t *ret_size);

/* ---- named shares (protocol 3) ---- */

#define GM_SHARE_NAME_MAX 128

enum {
        GM_SHARE_READ_ONLY =
                1u << 0,          /* gm_share_publish: every reader only reads, whatever its class allows */
        GM_SHARE_WRITE = 1u << 0, /* gm_share_open: read-write (the class needs share-write) */
};

typedef struct gm_share_info {
        char name[GM_SHARE_NAME_MAX + 1];
        uint64_t owner_client_id; /* 0 once a persistent share's publisher has gone */
        char owner_class[64];     /* the class that pays for it */
        int kind;                 /* GM_KIND_DEVICE, GM_KIND_HOST or GM_KIND_VMM */
        uint32_t gpu_id;
        uint64_t size;
        void *ptr; /* where every reader maps it */
        int read_only, persistent;
        uint32_t readers;
        uint64_t published_usec; /* CLOCK_REALTIME */
        uint64_t opens;
} gm_share_info;

/**
 * Publish the memory of @handle (device, host or VMM memory of this client; an allocation's handle comes
 * from gm_pointer_get_attributes) as @name, with GM_SHARE_* @flags. Its class needs share-publish for the
 * name; with share-persistent the share outlives the handle and the client until it is revoked. @ret_info
 * (may be NULL) says where readers find it. -EEXIST: the name is taken; -EBUSY: the handle is published
 * already; -EACCES: the class may not publish under the name; -EOPNOTSUPP: the daemon has no shares.
 */
int gm_share_publish(gm_client *c, gm_handle handle, const char *name, unsigned flags,
                     gm_share_info *ret_info);
/**
 * Open the share @name, read-only, or read-write with GM_SHARE_WRITE, mapped on @gpu_ids (@n_gpus 0: every
 * GPU the class may use) and for the CPU at *@ret_ptr, the same address in every reader. A read-only
 * reader's mapping is PROT_READ and cannot be made writable. *@ret_handle (may be NULL) names it in
 * gm_pointer_get_attributes and friends. Close it with gm_share_close. -ENOENT: no such share; -EACCES:
 * the class may not open it so, or it is read-only; -EBUSY: open already; -EEXIST: this process maps
 * something at its address.
 */
int gm_share_open(gm_client *c, const char *name, unsigned flags, const uint32_t *gpu_ids, size_t n_gpus,
                  void **ret_ptr, size_t *ret_size, gm_handle *ret_handle);
/** Unmap a share gm_share_open mapped at @ptr and free its handle (also after it was revoked). */
int gm_share_close(gm_client *c, void *ptr);
/**
 * End the share @name now (its publisher, a class that may publish under the name, or an administrator):
 * every reader loses its GPU mappings at once and its handle answers -ESTALE; the CPU mappings readers
 * made stay until they close them, and the memory with them.
 */
int gm_share_revoke(gm_client *c, const char *name);
/** Every share (administrators only): *@ret (free with free()) holds *@ret_n entries. */
int gm_admin_shares(gm_client *c, gm_share_info **ret, size_t *ret_n);

/* ---- administration (administrator identities only; others get -EACCES) ------------------------- */

typedef struct gm_status {
        char *server_version;
        char *backend;
        char *preset;
        uint32_t protocol_version;
        uint32_t kfd_major;
        uint32_t kfd_minor;
        uint64_t uptime_usec;
        uint64_t started_usec; /* CLOCK_REALTIME */
        uint32_t pid;
        uint32_t clients;
        uint32_t gpus;
        uint64_t allocations;
        uint64_t bytes_device;
        uint64_t bytes_host;
        uint64_t bytes_managed;
        uint64_t requests;
        uint64_t protocol_errors;
        uint32_t va_windows; /* client VA windows the daemon holds */
        /* the KFD model's own accounting (has_model only with the model backend) */
        bool has_model;
        uint32_t model_contexts;
        uint64_t model_buffers;
        uint64_t model_handles;
        uint64_t model_imports;
        uint64_t model_mappings;
        uint64_t model_gem_handles;
        uint64_t model_svm_ranges;
        uint64_t model_system_bytes;
        uint64_t model_vram_bytes;
        /* the isolation path: each client has a GPU VM of its own (KFD secondary contexts), or all share
         * the daemon's (has_private_gpu_vm: the daemon said which) */
        bool has_private_gpu_vm;
        bool private_gpu_vm;
} gm_status;

int gm_admin_status(gm_client *c, gm_status **ret);
void gm_status_free(gm_status *s);

typedef struct gm_gpu_usage {
        uint32_t gpu_id;
        uint64_t vram_bytes;
} gm_gpu_usage;

typedef struct gm_client_info {
        uint64_t client_id;
        uint32_t pid;
        uint32_t uid;
        uint32_t gid;
        char *cgroup;
        char *container;
        char *name;
        char *class_name;
        uint64_t connected_usec; /* CLOCK_REALTIME */
        uint64_t host_bytes;
        uint64_t managed_bytes;
        uint32_t handles;
        uint32_t fds;
        uint64_t requests;
        bool admin;
        size_t n_usage;
        gm_gpu_usage *usage;
        char *pod; /* Kubernetes pod UID, or "" (since 1.1) */
} gm_client_info;

int gm_admin_clients(gm_client *c, gm_client_info **ret, size_t *ret_n);
void gm_client_info_free(gm_client_info *infos, size_t n);

/** Disconnect client @client_id; the daemon frees everything it held. -ESRCH if there is none. */
int gm_admin_disconnect(gm_client *c, uint64_t client_id);

/** The daemon's metrics in Prometheus text format, of any length (read a frame at a time); free with
 * gm_free(). */
int gm_admin_metrics(gm_client *c, char **ret_text);

/** Change the daemon's log level: "err", "warning", "notice", "info" or "debug". */
int gm_admin_set_log_level(gm_client *c, const char *level);

/* ---- allocations and quotas (since 1.1) ---- */

typedef struct gm_alloc_info {
        uint64_t client_id;
        gm_handle id; /* the object's handle in its client */
        int kind;     /* GM_KIND_*, or 0 for a VMM VA reservation */
        uint64_t size;
        uint32_t gpu_id;
        uint64_t va;
        size_t n_mapped_gpus;
        uint32_t mapped_gpus[64];
        uint32_t exports;
} gm_alloc_info;

/**
 * Objects held by client @client_id (0: every client), at most @limit (0: as many as fit in one reply),
 * from *cursor (0 to start). *cursor is set to where the next call goes on, 0 at the end. A listing taken
 * while clients change may skip or repeat entries. Free with gm_alloc_info_free. -ESRCH: no such client.
 */
int gm_admin_allocations(gm_client *c, uint64_t client_id, unsigned limit, uint64_t *cursor,
                         gm_alloc_info **ret, size_t *ret_n);
void gm_alloc_info_free(gm_alloc_info *a, size_t n);

/** Resources a class's limits apply to. */
enum {
        GM_RESOURCE_VRAM = 1,    /**< device and VMM memory, bytes (per GPU when gpu_id is set) */
        GM_RESOURCE_HOST = 2,    /**< pinned host memory, bytes */
        GM_RESOURCE_MANAGED = 3, /**< managed memory, bytes */
        GM_RESOURCE_HANDLES = 4, /**< objects */
        GM_RESOURCE_FDS = 5,     /**< fds the daemon holds */
        GM_RESOURCE_CONNECTIONS = 6,
        GM_RESOURCE_INFLIGHT = 7,  /**< requests in flight */
        GM_RESOURCE_WINDOWS = 8,   /**< VA windows, current and refused ones */
        GM_RESOURCE_QUEUES = 9,    /**< user-mode queues the daemon runs (protocol 2) */
        GM_RESOURCE_MAPPINGS = 10, /**< entries of the daemon's memory map the class's objects cost */
        GM_RESOURCE_SHARES = 11,   /**< named shares the class has published */
};
#define GM_UNLIMITED UINT64_MAX

typedef struct gm_quota {
        char *class_name;
        int resource;    /**< GM_RESOURCE_* */
        uint32_t gpu_id; /**< 0: all GPUs */
        uint64_t limit;  /**< GM_UNLIMITED when none */
        uint64_t used;
} gm_quota;

/** Every limit of class @class_name (NULL or "": of every class) with its usage. -ENOENT: no such class. */
int gm_admin_quota_get(gm_client *c, const char *class_name, gm_quota **ret, size_t *ret_n);
void gm_quota_free(gm_quota *q, size_t n);
/**
 * Every limit of the caller's own class with its usage, as gm_admin_quota_get() gives an administrator for
 * that class; any client may ask (protocol 4: -EOPNOTSUPP from an older daemon). Free with gm_quota_free().
 */
int gm_quota_get(gm_client *c, gm_quota **ret, size_t *ret_n);
/**
 * Change a class's limit at run time (until the next reload of the config file). -EBUSY when the class uses
 * more than @limit, unless @force; -ENOENT no such class; -EINVAL per-GPU limits other than VRAM.
 */
int gm_admin_quota_set(gm_client *c, const char *class_name, int resource, uint32_t gpu_id, uint64_t limit,
                       bool force);

/** Free memory this library returned as a plain buffer. */
void gm_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
