/* Policy: identity classes from the config file (match rules, limits, GPUs, operations, administrators). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define POLICY_UNLIMITED UINT64_MAX
#define POLICY_MAX_GPUS  64
/* In-flight requests per connection when a class does not say: what the hello reply has always advertised. */
#define POLICY_DEFAULT_INFLIGHT 16
/*
 * Named shares of one class when its section does not say, and the most it may say: a quarter and a half of
 * the daemon's table of shares (BROKER_MAX_SHARES, 4096), so that no one class can fill it for the others.
 */
#define POLICY_DEFAULT_SHARES 1024
#define POLICY_MAX_SHARES     2048

typedef enum PolicyResource {
        POLICY_RES_VRAM,        /* device memory and VMM handles, bytes, all GPUs */
        POLICY_RES_HOST,        /* pinned host memory, bytes */
        POLICY_RES_MANAGED,     /* managed memory, bytes */
        POLICY_RES_HANDLES,     /* objects: allocations, VMM handles, imports, reservations */
        POLICY_RES_FDS,         /* fds the daemon holds for the class */
        POLICY_RES_CONNECTIONS, /* connections at once */
        POLICY_RES_INFLIGHT,    /* requests one connection may have in flight (replies not yet taken) */
        POLICY_RES_WINDOWS,     /* VA windows held at once (current and refused ones), all connections */
        POLICY_RES_QUEUES,      /* user-mode queues the daemon runs for the class's clients */
        POLICY_RES_MAPPINGS,    /* entries of the daemon's memory map its objects cost (vm.max_map_count) */
        POLICY_RES_SHARES,      /* named shares it has published and the daemon holds */
        _POLICY_RES_MAX,
} PolicyResource;

/* Operation families a class can be denied (deny-ops). */
enum {
        POLICY_OP_DEVICE = 1u << 0,
        POLICY_OP_HOST = 1u << 1,
        POLICY_OP_MANAGED = 1u << 2,
        POLICY_OP_VMM = 1u << 3,
        POLICY_OP_SVM = 1u << 4, /* SVM attributes and prefetch */
        POLICY_OP_EXPORT = 1u << 5,
        POLICY_OP_IMPORT = 1u << 6,
};

/* What a class may do with named shares, each a list of name patterns (fnmatch with FNM_PATHNAME: '*'
 * does not cross '/'). */
typedef enum PolicyShareRight {
        POLICY_SHARE_PUBLISH,    /* publish memory under a matching name */
        POLICY_SHARE_READ,       /* open a matching share read-only */
        POLICY_SHARE_WRITE,      /* open a matching share read-write (and read-only) */
        POLICY_SHARE_PERSISTENT, /* what it publishes under a matching name outlives it, until revoked */
        _POLICY_SHARE_MAX,
} PolicyShareRight;

#define POLICY_SHARE_NAME_MAX 128

typedef struct PolicyClass {
        char *name;
        unsigned line; /* where its section starts */
        bool match_all;
        char **cgroups; /* fnmatch patterns on the cgroup path */
        size_t n_cgroups;
        uid_t *uids;
        size_t n_uids;
        gid_t *gids; /* primary or supplementary */
        size_t n_gids;
        uint64_t limit[_POLICY_RES_MAX];
        uint32_t vram_gpu_ids[POLICY_MAX_GPUS]; /* per-GPU VRAM limits */
        uint64_t vram_gpu_limit[POLICY_MAX_GPUS];
        size_t n_vram_gpu;
        uint32_t gpus[POLICY_MAX_GPUS]; /* GPUs the class may use; none listed = all */
        size_t n_gpus;
        unsigned deny_ops;
        bool import_foreign;             /* may import dmabufs the GPU driver did not export */
        uint64_t foreign_imports;        /* bytes of dmabufs gpumemd did not export, imported at once */
        uint64_t foreign_import_max;     /* bytes of one such import */
        uint64_t host_alloc_max;         /* bytes of one host allocation (populated by the daemon) */
        char **share[_POLICY_SHARE_MAX]; /* name patterns per right (share-publish, share-read, ...) */
        size_t n_share[_POLICY_SHARE_MAX];
        bool admin;
        /* its clients may run queues in a GPU context shared with other clients' where the driver has no
         * context per client: they give up their isolation from each other (and from every such class) */
        bool shared_gpu_context;
} PolicyClass;

typedef struct Policy {
        PolicyClass *classes; /* in file order: the first that matches a client is its class */
        size_t n_classes;
} Policy;

typedef struct PolicyIdentity {
        uid_t uid;
        gid_t gid;
        const gid_t *groups;
        size_t n_groups;
        const char *cgroup; /* may be NULL */
} PolicyIdentity;

/* The built-in policy when the file defines no class: one class "default" for everyone, no limits. */
int policy_new_default(Policy **ret);

/*
 * Read the [class NAME] sections of @path. Errors are appended to @errbuf as "FILE:LINE: message\n" and
 * give -EINVAL. A file without classes yields the built-in default. A missing file is an error only if
 * @must_exist.
 */
int policy_load(const char *path, bool must_exist, Policy **ret, char *errbuf, size_t errlen);
Policy *policy_free(Policy *p);

/* The class of a client, or NULL when none admits it. */
const PolicyClass *policy_match(const Policy *p, const PolicyIdentity *id);
const PolicyClass *policy_find(const Policy *p, const char *name);

const char *policy_resource_name(PolicyResource r);
int policy_resource_from_name(const char *s);

/* A share name: 1 to POLICY_SHARE_NAME_MAX letters, digits and "._-/", in '/'-separated parts none of
 * which is empty, "." or "..". */
bool policy_share_name_valid(const char *name);
/* Whether class @c has @right on the share named @name. */
bool policy_share_allows(const PolicyClass *c, PolicyShareRight right, const char *name);

/* Recognise a container runtime's scope in a cgroup path: "docker/<id>", "podman/<id>", "containerd/<id>",
 * "cri-o/<id>"; and a Kubernetes pod UID. Empty strings when not found. */
void policy_container_of(const char *cgroup, char *container, size_t clen, char *pod, size_t plen);
