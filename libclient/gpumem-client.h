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
 *         -EUSERS (connection limit), -ENOSPC (no VA window could be reserved), or another -errno
 */
int gm_client_connect(const char *socket_path, const char *name, gm_client **ret);

/** Close the connection and release the VA window. NULL-safe. Everything the client held in the daemon
 *  is freed by the daemon. */
void gm_client_close(gm_client *c);

/**
 * Describe @err (a negative errno returned by this library) into @buf: "strerror: reason", where the
 * reason is the daemon's (or the library's) explanation of the calling thread's last failure on @c.
 * @c may be NULL (then only strerror). Returns @buf.
 */
const char *gm_strerror(gm_client *c, int err, char *buf, size_t len);

/** Session facts from the handshake. */
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
} gm_client_info;

int gm_admin_clients(gm_client *c, gm_client_info **ret, size_t *ret_n);
void gm_client_info_free(gm_client_info *infos, size_t n);

/** Disconnect client @client_id; the daemon frees everything it held. -ESRCH if there is none. */
int gm_admin_disconnect(gm_client *c, uint64_t client_id);

/** The daemon's metrics in Prometheus text format; free with gm_free(). */
int gm_admin_metrics(gm_client *c, char **ret_text);

/** Change the daemon's log level: "err", "warning", "notice", "info" or "debug". */
int gm_admin_set_log_level(gm_client *c, const char *level);

/** Free memory this library returned as a plain buffer. */
void gm_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
