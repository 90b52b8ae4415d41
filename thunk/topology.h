/* KFD topology: the sysfs tree (real or a model preset) parsed into plain structs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The parser reads a directory (or a ThunkTopologySource, below) laid out like
 * /sys/devices/virtual/kfd/kfd/topology:
 *   generation_id, system_properties, nodes/N/{gpu_id,name,properties},
 *   nodes/N/mem_banks/M/properties, nodes/N/caches/K/properties, nodes/N/io_links/L/properties
 * (and p2p_links/L/properties where present). Property files are "key value" lines.
 *
 * Every "key value" pair of a properties file is kept (ThunkProps) so that nothing the kernel reports
 * is lost; the fields the project uses are also decoded into typed members.
 */

#define THUNK_TOPOLOGY_DEFAULT_PATH "/sys/devices/virtual/kfd/kfd/topology"
#define THUNK_NAME_MAX              64
#define THUNK_PROP_KEY_MAX          48

/* Bounds the parser enforces (see docs/topology-presets.md); exceeding one is -E2BIG. */
#define THUNK_TOPOLOGY_MAX_NODES     256
#define THUNK_TOPOLOGY_MAX_MEM_BANKS 256   /* per node */
#define THUNK_TOPOLOGY_MAX_CACHES    4096  /* per node */
#define THUNK_TOPOLOGY_MAX_IO_LINKS  1024  /* per node, and as many p2p links */
#define THUNK_TOPOLOGY_MAX_PROPS     512   /* key/value lines per properties file */
#define THUNK_TOPOLOGY_MAX_LINE      4096  /* characters per line, newline excluded */
#define THUNK_TOPOLOGY_MAX_FILE      65536 /* bytes per file */

typedef struct ThunkProp {
        char key[THUNK_PROP_KEY_MAX];
        uint64_t value;
} ThunkProp;

/* All key/value pairs of one properties file, in file order. */
typedef struct ThunkProps {
        ThunkProp *items;
        size_t n;
} ThunkProps;

typedef struct ThunkMemBank {
        uint32_t heap_type; /* HSA_MEM_HEAP_TYPE_* (kfd_sysfs.h) */
        uint64_t size_in_bytes;
        uint32_t flags;
        uint32_t width;
        uint32_t mem_clk_max;
        ThunkProps props;
} ThunkMemBank;

typedef struct ThunkCache {
        uint32_t processor_id_low;
        uint32_t level;
        uint32_t size_kib; /* "size" in the file, KiB */
        uint32_t cache_line_size;
        uint32_t cache_lines_per_tag;
        uint32_t association;
        uint32_t latency;
        uint32_t type; /* HSA_CACHE_TYPE_* bits */
        ThunkProps props;
} ThunkCache;

typedef struct ThunkIoLink {
        uint32_t type; /* HSA_IOLINK_TYPE_* (PCIe 2, XGMI 11, ...) */
        uint32_t node_from;
        uint32_t node_to;
        uint32_t weight;
        uint32_t min_latency;
        uint32_t max_latency;
        uint32_t min_bandwidth;
        uint32_t max_bandwidth;
        uint32_t flags;
        ThunkProps props;
} ThunkIoLink;

typedef struct ThunkNode {
        uint32_t node_id; /* index N of nodes/N */
        uint32_t gpu_id;  /* 0 for CPU nodes; a non-zero 16-bit value for GPUs */
        char name[THUNK_NAME_MAX];
        bool is_gpu; /* simd_count > 0 */
        uint32_t cpu_cores_count;
        uint32_t simd_count;
        uint32_t capability; /* HSA_CAP_* bits */
        uint32_t vendor_id;
        uint32_t device_id;
        uint32_t location_id; /* PCI bus/device/function as the kernel encodes it */
        uint32_t domain;      /* PCI domain */
        uint32_t drm_render_minor;
        uint64_t hive_id;            /* XGMI hive, 0 if none */
        uint64_t local_mem_size;     /* bytes of VRAM (0 on APUs and CPUs) */
        uint32_t gfx_target_version; /* e.g. 90008 for gfx908 */
        uint64_t unique_id;
        uint32_t num_xcc;
        uint32_t max_engine_clk_fcompute;
        uint32_t wave_front_size;
        uint32_t lds_size_in_kb;
        int numa_node;    /* nearest CPU NUMA node (see thunk_topology_numa_of), -1 if unknown */
        ThunkProps props; /* the whole properties file */
        ThunkMemBank *mem_banks;
        size_t n_mem_banks;
        ThunkCache *caches;
        size_t n_caches;
        ThunkIoLink *io_links;
        size_t n_io_links;
        ThunkIoLink *p2p_links; /* nodes/N/p2p_links, empty when the kernel has none */
        size_t n_p2p_links;
} ThunkNode;

typedef struct ThunkTopology {
        char *root; /* the directory it was read from, or the name given to thunk_topology_load_source */
        uint64_t generation_id;
        uint64_t platform_oem;
        uint64_t platform_id;
        uint64_t platform_rev;
        ThunkProps system_props; /* system_properties as read */
        ThunkNode *nodes;        /* indexed by node id */
        size_t n_nodes;
        size_t n_gpus;
} ThunkTopology;

/*
 * Parse the tree at @root (NULL: THUNK_TOPOLOGY_DEFAULT_PATH). On failure returns a negative errno and,
 * if @errbuf is given, a message naming the file and line ("nodes/2/properties:7: value 'x' is not a
 * number"). @ret is untouched on failure.
 */
int thunk_topology_load(const char *root, ThunkTopology **ret, char *errbuf, size_t errlen);

/*
 * Where the parser's files come from. The topology need not be a sysfs directory: it can be a tree held
 * in memory (one a broker sends to a client, say), and the parser can be tested without a filesystem.
 * thunk_topology_load() is the directory implementation (openat/read/readdir under a directory fd);
 * thunk_topology_load_source() parses whatever a source serves, with the same rules and messages.
 *
 * Paths (@rel) are relative to the tree's root, '/'-separated, with no leading '/', no "." or ".."
 * components and no empty ones: "generation_id", "nodes", "nodes/0/properties". Both callbacks return 0
 * or a negative errno, and are called only from within thunk_topology_load_source(), on its thread:
 *
 * read_file: copy the whole of file @rel into @buf (at most @cap bytes) and its length into *ret_len.
 *   -ENOENT: no such file (or a missing directory on the way); the parser decides whether the file is
 *            optional or "missing", and writes no message of the source's.
 *   -E2BIG:  the file holds more than @cap bytes (the parser says "file larger than ... bytes").
 *   -EISDIR: @rel is a directory; -ENOTDIR: a component on the way is a file (as read(2) and openat(2)).
 *   any other negative errno: the read failed.
 * list_dir: call @each(@each_ctx, name) once for every entry of directory @rel, in any order. Names that
 *   start with '.' (including "." and "..") may be passed and are ignored. -ENOENT: no such directory (it
 *   has no entries); -ENOTDIR: @rel, or a component on the way, is a file; if @each returns a negative
 *   errno, stop and return that value.
 * ret_what: never NULL, and *ret_what is NULL on entry. On a failure other than -ENOENT and -E2BIG a
 *   source may point it at a short static phrase naming the step that failed ("cannot open", "read
 *   failed"); the parser's message is then "<rel>: <phrase>: <strerror>". Left NULL, the phrase is
 *   "cannot read" for a file and "cannot read directory" for a directory.
 */
typedef struct ThunkTopologySource {
        void *ctx;
        int (*read_file)(void *ctx, const char *rel, char *buf, size_t cap, size_t *ret_len,
                         const char **ret_what);
        int (*list_dir)(void *ctx, const char *rel, int (*each)(void *each_ctx, const char *name),
                        void *each_ctx, const char **ret_what);
} ThunkTopologySource;

/*
 * Parse the tree @src serves, as thunk_topology_load() parses a directory; @root_name becomes the
 * topology's root member (a directory, a broker's name for the tree, ...). -EINVAL without a message when
 * @src, one of its callbacks, @root_name or @ret is NULL. On failure returns a negative errno with a
 * message as thunk_topology_load() writes it; @ret is untouched.
 */
int thunk_topology_load_source(const ThunkTopologySource *src, const char *root_name, ThunkTopology **ret,
                               char *errbuf, size_t errlen);

ThunkTopology *thunk_topology_free(ThunkTopology *t);

/*
 * The tree again, file by file as the parser reads it (every property kept, in file order, values in
 * decimal as the kernel prints them): @emit gets each file's path (relative, as for a source) and content.
 * Parsing what it emits gives back the same topology. Returns 0, -EINVAL, -ENOMEM or what @emit returned.
 */
typedef int (*ThunkTopologyEmit)(void *ctx, const char *rel, const char *content, size_t len);
int thunk_topology_write(const ThunkTopology *t, ThunkTopologyEmit emit, void *ctx);
/*
 * One properties file @p as thunk_topology_write() emits it, as file @rel, with the value of @key (when @key
 * is not NULL and the file has it) written as @value instead: a topology served with some sizes changed.
 * Returns 0, -EINVAL, -ENOMEM or what @emit returned.
 */
int thunk_props_write(const ThunkProps *p, const char *rel, const char *key, uint64_t value,
                      ThunkTopologyEmit emit, void *ctx);

/* Look-ups; NULL when absent. */
const ThunkNode *thunk_topology_gpu_by_id(const ThunkTopology *t, uint32_t gpu_id);
const ThunkNode *thunk_topology_gpu_by_index(const ThunkTopology *t, size_t gpu_index);

/*
 * Nearest CPU NUMA node of @n (the numa_node member): CPU-bearing nodes (cpu_cores_count > 0) are numbered
 * 0, 1, ... in node order; a node that has CPU cores itself (CPU or APU) is its own NUMA node; a GPU takes
 * the CPU-bearing node at the end of its lowest-weight io_link (ties: the first such link); -1 if none.
 */
int thunk_topology_numa_of(const ThunkTopology *t, const ThunkNode *n);

/* Bytes of system memory in @n's memory banks (heap type SYSTEM), 0 when it has none. */
uint64_t thunk_node_system_bytes(const ThunkNode *n);
/* Whether @n has a memory bank of host-visible VRAM (heap type FB_PUBLIC: a large BAR). */
bool thunk_node_has_public_vram(const ThunkNode *n);

/* A property by key; returns false (and leaves *ret alone) when the key is absent. */
bool thunk_props_get(const ThunkProps *p, const char *key, uint64_t *ret);
