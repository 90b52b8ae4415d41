/* The broker: GPU memory objects owned by clients, executed through the thunk, torn down in order. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/worker.h"
#include "drivers/driver.h"
#include "events.h"
#include "reason.h"
#include "base/util.h"
#include "base/vaman.h"

/* Values as in the protocol (gpumem.proto) so handlers pass them through unchanged. */
typedef enum BrokerKind {
        BROKER_KIND_DEVICE = 1,
        BROKER_KIND_HOST = 2,
        BROKER_KIND_MANAGED = 3,
        BROKER_KIND_VMM = 4,
        BROKER_KIND_IMPORT = 5,
        BROKER_KIND_SHARE = 6,         /* a reader's open named share */
        BROKER_KIND_RESERVATION = 100, /* internal: a VMM VA reservation */
} BrokerKind;

/* The driver takes the same values (driver.h), so they pass through. */
enum {
        BROKER_FLAG_HOST_VISIBLE = DRIVER_MEM_HOST_VISIBLE,
        BROKER_FLAG_COHERENT = DRIVER_MEM_COHERENT,
        BROKER_FLAG_UNCACHED = DRIVER_MEM_UNCACHED,
        BROKER_FLAG_EXECUTABLE = DRIVER_MEM_EXECUTABLE,
        BROKER_FLAG_CONTIGUOUS = DRIVER_MEM_CONTIGUOUS,
        BROKER_FLAG_READ_ONLY = DRIVER_MEM_READ_ONLY,
        BROKER_FLAG_EXT_COHERENT = DRIVER_MEM_EXT_COHERENT,
        /* host memory as a GTT buffer of the client's own GPU VM, CPU-mapped through its dmabuf: the
         * broker's own, never passed to the driver */
        BROKER_FLAG_GTT = 128,
        /* with GTT: the memory behind a client-side KFD's SVM range, at a fixed VA anywhere in the client's
         * own GPU VM but its window (where the process has the range); the daemon does not map it */
        BROKER_FLAG_SVM_RANGE = 256,
        _BROKER_FLAG_ALL = 511,
};

enum {
        BROKER_ACCESS_NONE = 0,
        BROKER_ACCESS_READ = DRIVER_ACCESS_READ,
        BROKER_ACCESS_READ_WRITE = DRIVER_ACCESS_READ_WRITE,
};

typedef struct BrokerAccess {
        uint32_t gpu_id; /* 0 = the CPU */
        int access;      /* BROKER_ACCESS_* */
} BrokerAccess;

#define BROKER_PAGE_SIZE          4096ull
#define BROKER_SVM_LIMIT          (1ull << 47) /* one past the last user address (x86-64, 4-level tables) */
#define BROKER_GRANULARITY_MIN    BROKER_PAGE_SIZE
#define BROKER_GRANULARITY_RECOMM (2ull << 20)
#define BROKER_MAX_GPUS           64
/* CPU mappings one set-access call can hand out (each needs an fd in the reply). */
#define BROKER_MAX_CPU_MAPS 16

typedef struct Broker Broker;
typedef struct BrokerClient BrokerClient;

typedef struct BrokerUsage {
        uint64_t device_bytes;
        uint64_t host_bytes;
        uint64_t managed_bytes;
        uint64_t vmm_bytes;       /* physical VMM handles (VRAM) */
        uint64_t foreign_bytes;   /* imports of dmabufs gpumemd did not export */
        uint64_t lingering_bytes; /* of the above: freed, but kept alive by files handed to clients */
        uint64_t objects;         /* allocations, handles, imports and reservations */
        uint32_t held_fds; /* fds the daemon holds for it: host and managed memory, the driver's files */
        uint32_t queues;   /* user-mode queues */
        uint64_t mappings; /* entries of the daemon's own memory map (vm.max_map_count) its objects cost */
        uint32_t shares;   /* named shares published and held by the daemon */
        uint32_t n_gpus;
        uint32_t gpu_ids[BROKER_MAX_GPUS];
        uint64_t vram_bytes[BROKER_MAX_GPUS]; /* device + VMM bytes per GPU */
} BrokerUsage;

/*
 * What a class of clients may use, and what it uses: all clients bound to one account share its limits.
 * The broker checks these before it asks the driver and checks and charges them in one step when the
 * driver succeeded; objects refund them when they die. Limits are UINT64_MAX when unlimited. Clients of
 * one account run on several threads: everything below the name is read and written under the account's
 * lock (broker_account_lock()).
 */
typedef struct BrokerAccount {
        const char *name; /* for messages (borrowed) */
        pthread_mutex_t lock;
        BrokerUsage used;
        uint64_t max_vram;                      /* device + VMM bytes, all GPUs */
        uint64_t max_vram_gpu[BROKER_MAX_GPUS]; /* in broker GPU order (broker_gpu_index) */
        uint64_t max_host;
        uint64_t max_managed;
        uint64_t max_handles;
        uint64_t max_fds;
        uint64_t max_queues;
        uint64_t max_mappings;    /* entries of the daemon's memory map (BrokerUsage.mappings) */
        uint64_t max_shares;      /* named shares held at once */
        uint64_t max_foreign;     /* bytes of foreign imports held at once */
        uint64_t max_foreign_one; /* bytes of one foreign import */
        uint64_t max_host_one;    /* bytes of one host allocation: the daemon populates it itself */
        uint64_t allowed_gpus;    /* bit per broker GPU index; atomic, read without the lock */
        bool import_foreign;
        /* its clients may run queues in a GPU context shared with other clients' (a driver without a GPU VM
         * per client); atomic, read without the lock */
        bool shared_ctx;
        unsigned lingering; /* freed memory still charged here: the account must outlive it */
        unsigned clients;   /* broker clients bound to it, torn-down ones included: the same */
} BrokerAccount;

/* An account with no limits: every GPU, every import. broker_account_done() when it goes. */
void broker_account_init(BrokerAccount *a, const char *name);
void broker_account_done(BrokerAccount *a);
/* Around reading or changing an account's usage and limits from outside the broker. */
void broker_account_lock(BrokerAccount *a);
void broker_account_unlock(BrokerAccount *a);
/* What the account's clients use now. */
void broker_account_usage(BrokerAccount *a, BrokerUsage *ret);

/* The broker over @drv (borrowed; it must outlive the broker). */
int broker_new(Driver *drv, Broker **ret);
/* Index of @gpu_id in the broker's GPU order, or -1. */
int broker_gpu_index(const Broker *b, uint32_t gpu_id);
size_t broker_gpu_count(const Broker *b);
uint32_t broker_gpu_id(const Broker *b, size_t index);
/* Every client must have been freed first. Lingering memory is forgotten, not refunded. */
Broker *broker_free(Broker *b);
/*
 * Memory a client freed while files of it handed out (fds, CPU mappings, imports) still live stays charged
 * to its class until the last of them goes. The fd becomes readable when some did: call
 * broker_process_events() then. Every broker call that frees memory processes them too.
 */
int broker_event_fd(const Broker *b);
void broker_process_events(Broker *b);
void broker_totals(Broker *b, BrokerUsage *ret);
/*
 * What all clients' objects together (@total) and those of one uid (@per_uid) may cost in entries of the
 * daemon's memory map, UINT64_MAX for no limit. The rest of vm.max_map_count is the daemon's own, so that
 * no tenant can make another's allocation or a new connection fail for want of a mapping.
 */
void broker_set_mapping_limits(Broker *b, uint64_t total, uint64_t per_uid);
void broker_mapping_limits(Broker *b, uint64_t *ret_total, uint64_t *ret_per_uid);
/* Host memory all clients of one uid may hold, over all their classes (UINT64_MAX: no limit). */
void broker_set_host_per_uid(Broker *b, uint64_t bytes);
/* How many clients of one uid may have their GPU contexts waited on by a thread of the driver's (of its
 * max_listeners): past it, the next one's first fault or signal event is -EUSERS. */
void broker_set_listeners_per_uid(Broker *b, unsigned n);

/*
 * A client's books, over its VA window (borrowed; it must outlive the client). Calls for different clients
 * may run at once on different threads; the calls for one client, and reads of its usage and objects,
 * are serialised by the caller.
 */
int broker_client_new(Broker *b, ThunkVaSpace *window, BrokerClient **ret);
/* The uid whose per-uid limits the client's objects count against (none until set). Before its first
 * object. */
int broker_client_set_uid(BrokerClient *c, uid_t uid);
/* Bind the client to @a (may be NULL): its usage moves from the old account to the new one. */
void broker_client_set_account(BrokerClient *c, BrokerAccount *a);
/* Tear down everything the client owns, in dependency order: GPU access, mappings, objects, VA. */
BrokerClient *broker_client_free(BrokerClient *c);
/*
 * The same in slices, for a client with many objects: tears down at most @budget mappings or objects and
 * returns true once nothing is left (then broker_client_free() finishes at once). The client must make no
 * other call meanwhile.
 */
bool broker_client_teardown_step(BrokerClient *c, size_t budget);
void broker_client_usage(const BrokerClient *c, BrokerUsage *ret);
/* True when the client uses a KFD context (GPU VM) of its own. */
bool broker_client_private_vm(const BrokerClient *c);
size_t broker_client_objects(const BrokerClient *c);
/* Everything the client's teardown has to free: objects and VMM mappings. */
uint64_t broker_client_records(const BrokerClient *c);

/* ---- memory released off the loops ----------------------------------------------------------------- */

/*
 * Releasing much memory is slow (unmapping the daemon's mapping of its pages, closing the last file of it:
 * about 0.5 s a GiB of pages), too slow for an event loop. The broker takes such memory off its books at once
 * and moves the daemon's mapping of it out of the client's window (the window's range is free for new memory
 * at once); the release itself is a drop, which runs later on any thread. Memory charged while files of it
 * live stays charged until the last of them, the drop's included, is gone (broker_process_events()).
 */
#define BROKER_SLOW_FREE_BYTES (16ull << 20)
typedef struct BrokerDrop {
        WorkerJob job; /* first: for the one who runs it on a worker */
        struct BrokerDrop *next;
        void *addr; /* the pages, moved out of the window; NULL: none mapped (any left were dropped here) */
        uint64_t size;
        int fd; /* the memory's file: the daemon's last one */
} BrokerDrop;
/*
 * Where drops go: @fn(@arg, drop, the client's flow) runs or queues it, then free()s it. Without one, memory
 * is released where it is freed. Set before any client exists.
 */
void broker_set_dropper(Broker *b, void (*fn)(void *arg, BrokerDrop *d, uint64_t flow), void *arg);
/* The flow of drops of memory no client holds any more (a persistent share's): no uid's. */
#define BROKER_FLOW_SHARED UINT64_MAX
/* Unmap and close what @d holds (not @d itself): it touches nothing else, so any thread may run it. */
void broker_drop_run(BrokerDrop *d);
/* The client's tenant, handed to the dropper with its drops. */
void broker_client_set_flow(BrokerClient *c, uint64_t flow);
/*
 * Keep the client's drops from now on, until broker_client_take_drops() returns them (a list; NULL: none)
 * and sends later ones to the dropper again: a free answered once its memory is gone.
 */
void broker_client_hold_drops(BrokerClient *c);
BrokerDrop *broker_client_take_drops(BrokerClient *c);

/* ---- carried across a restart (carry.c) -------------------------------------------------------------- */

/*
 * One object as a daemon that stops hands it to the next: where it lies, what it is, where it is mapped,
 * and its memory's file. What else a client may hold makes broker_client_carry_check() say why it cannot be
 * carried. Carried: host memory (its memfd), device memory and VMM handles (their dmabufs, which the next
 * daemon's driver takes back, at the same VA where they have one), imports (the dmabuf exported again, and
 * imported again there), managed memory (its memfd, and the SVM attribute calls made on it, which the next
 * daemon replays in order), and VMM reservations with their mappings and access grants (BrokerCarryMap).
 */
/* An SVM attribute (managed memory, below). */
typedef struct BrokerSvmAttr {
        uint32_t type;
        uint32_t value;
} BrokerSvmAttr;

#define BROKER_SVM_MAX_ATTRS 32

/* One SVM attribute call on managed memory, as a carried allocation's record keeps them. */
typedef struct BrokerSvmCall {
        uint64_t va, size;
        uint32_t n;
        BrokerSvmAttr a[BROKER_SVM_MAX_ATTRS];
} BrokerSvmCall;

typedef struct BrokerCarry {
        uint64_t handle;
        BrokerKind kind; /* also BROKER_KIND_RESERVATION */
        uint64_t va, size;
        uint32_t gpu_id; /* as the client named it (0: the first GPU) */
        uint32_t flags;
        int numa_node;
        uint32_t exports;
        bool handed_out; /* a file of it went to the client: it may outlive its handle */
        bool has_file;   /* its memory has a file to hand over; reservations have none */
        /* VMM and imports: how often its handle is named (create or import, and retains, less releases); 0:
         * released, still mapped */
        uint32_t client_refs;
        bool foreign;   /* import: of memory gpumemd did not export, charged by its size */
        bool read_only; /* import: of a read-only export; a reader's share: opened read-only */
        /* a reader's open share (BROKER_KIND_SHARE): its name (the broker's while listing, the caller's to
         * restore); mapped[] are the GPUs it was granted */
        const char *share_name;
        size_t n_mapped;
        uint32_t mapped[BROKER_MAX_GPUS];
        int fd; /* its memory's file, taken by the callee of broker_client_carry_each() and by
                 * broker_carry_restore() */
        /* managed: the SVM calls made on it, in order (the broker's from the list, the caller's to restore)
         */
        const BrokerSvmCall *svm;
        size_t n_svm;
} BrokerCarry;

/* One VMM mapping: [va, va+size) of a reservation maps @handle from @offset; its grants, and the CPU's. */
typedef struct BrokerCarryMap {
        uint64_t va, size, offset;
        uint64_t handle;
        int cpu_access; /* BROKER_ACCESS_*: the client was handed a file to map it with */
        size_t n_grants;
        BrokerAccess grants[BROKER_MAX_GPUS]; /* GPUs only */
} BrokerCarryMap;

/* 0 when everything the client holds can be carried; -EOPNOTSUPP with @w saying what cannot. */
int broker_client_carry_check(const BrokerClient *c, Reason *w);
/*
 * Everything the client holds, for the next daemon: @obj with each object — the named ones, then VMM
 * handles that only mappings keep — and a file of its memory in @k->fd, which @obj takes (-1 with
 * reservations): a copy of the memfd of host and managed memory, an export of device and VMM memory. Then
 * @map with each VMM mapping. Stops at the first failure, and returns it.
 */
typedef int (*BrokerCarryObjFn)(void *arg, const BrokerCarry *k);
typedef int (*BrokerCarryMapFn)(void *arg, const BrokerCarryMap *m);
int broker_client_carry_each(BrokerClient *c, BrokerCarryObjFn obj, BrokerCarryMapFn map, void *arg);
/*
 * Set one carried object up again in the client (whose window is restored): the same handle and VA, its
 * memory mapped here from @o->fd (taken, also on failure) and given to the driver again, mapped on the
 * same GPUs, charged to the account as before (the class's limits are not asked again: the memory
 * exists). On failure nothing of it is left and @w says why. Objects first, imports after every client's
 * other objects (an import of another client's export finds its memory on the model only once that client's
 * is back), then the mappings (broker_carry_restore_map), then broker_carry_finish().
 */
int broker_carry_restore(BrokerClient *c, BrokerCarry *o, Reason *w);
/* One VMM mapping again, in its reservation, with its grants; charged as before. */
int broker_carry_restore_map(BrokerClient *c, const BrokerCarryMap *m, Reason *w);
/* The VMM handles that came back only for their mappings are named no more (one that no mapping came back
 * for is freed, and is an error). */
int broker_carry_finish(BrokerClient *c, Reason *w);

/* A named share as a daemon that stops hands it to the next: its memory's file in @fd. */
typedef struct BrokerCarryShare {
        const char *name; /* the broker's while listing, the caller's to restore */
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t va, size;
        bool read_only, persistent;
        uint64_t owner_tag;  /* the publisher's tag while its object lives; 0: the share holds the memory */
        uint64_t src_handle; /* that object's handle */
        const char *class_name; /* the class that pays */
        uint64_t published_usec, opens;
        int fd;
} BrokerCarryShare;

/* Every live share to @fn, with a copy of its memory's fd that @fn takes; stops at the first failure. */
int broker_carry_shares_each(Broker *b, int (*fn)(void *arg, const BrokerCarryShare *s), void *arg);
/*
 * A share under its name at its VA in the shared region again (@s->fd taken, also on failure), before the
 * clients: its publisher takes it back (broker_carry_claim_shares), readers open it again as they come back
 * (with the imports, after every client's other objects).
 */
int broker_carry_share_restore(Broker *b, BrokerCarryShare *s, Reason *w);
/* The shares @c published, back before it: its own again, charged to it as before. After its objects, before
 * any client's readers come back. */
void broker_carry_claim_shares(BrokerClient *c);
/*
 * Once every publisher is back: a persistent share whose publisher did not come back holds its memory
 * itself, charged to the account @acct_of gives for its class (NULL: none); any other share whose publisher
 * did not come back ends once its readers are back too (broker_carry_shares_settle(), which returns how many
 * ended), as when a publisher goes.
 */
void broker_carry_shares_unclaimed(Broker *b, BrokerAccount *(*acct_of)(void *arg, const char *class_name),
                                   void *arg);
size_t broker_carry_shares_settle(Broker *b);

/* ---- device, host and managed memory ---------------------------------------------------------------- */

typedef struct BrokerAllocArgs {
        BrokerKind kind; /* DEVICE, HOST or MANAGED */
        uint64_t size;
        uint32_t gpu_id;
        uint32_t flags; /* BROKER_FLAG_* */
        int numa_node;  /* HOST: -1 = nearest the GPU */
        uint64_t alignment;
        uint64_t fixed_va;
        const uint32_t *map_gpus;
        size_t n_map_gpus;
} BrokerAllocArgs;

typedef struct BrokerAllocResult {
        uint64_t handle;
        uint64_t va;
        uint64_t size;
        int fd; /* owned by the caller: to mmap at va (offset fd_offset), -1 when not CPU-visible */
        uint64_t fd_offset;
        /* owned by the caller: with DRIVER_CAP_CLIENT_MAPS the device memory's export, which the client
         * imports into its own GPU context, else -1 */
        int import_fd;
} BrokerAllocResult;

int broker_alloc(BrokerClient *c, const BrokerAllocArgs *a, BrokerAllocResult *ret, Reason *w);
/*
 * Host memory the daemon must populate itself is made in steps, so that the slow middle one can run off the
 * event loop: broker_alloc_begin() checks the request, places it and holds its charge (the object is found
 * by nothing yet); broker_pending_populate() faults its pages in and touches nothing else (any thread),
 * broker_pending_populate_step() the next @max bytes of them, true once all are in or one step failed;
 * broker_alloc_end() registers it with the driver and publishes it, or undoes all of it, and frees @p.
 * The client must not be freed between begin and end. broker_alloc_is_slow() says which allocations are
 * worth it.
 */
#define BROKER_SLOW_HOST_BYTES (4ull << 20)
typedef struct BrokerPending BrokerPending;
bool broker_alloc_is_slow(const BrokerAllocArgs *a);
int broker_alloc_begin(BrokerClient *c, const BrokerAllocArgs *a, BrokerPending **ret, Reason *w);
void broker_pending_populate(BrokerPending *p);
bool broker_pending_populate_step(BrokerPending *p, uint64_t max);
int broker_alloc_end(BrokerPending *p, BrokerAllocResult *ret, Reason *w);
/* Free an allocation (unmapping it first), or release a VMM handle or import (as broker_vmm_release). */
int broker_mem_free(BrokerClient *c, uint64_t handle, Reason *w);
int broker_map(BrokerClient *c, uint64_t handle, const uint32_t *gpu_ids, size_t n, Reason *w);
/* n == 0: every GPU it is mapped on. */
int broker_unmap(BrokerClient *c, uint64_t handle, const uint32_t *gpu_ids, size_t n, Reason *w);

/* ---- queries ----------------------------------------------------------------------------------------- */

typedef struct BrokerPtrInfo {
        uint64_t handle;
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t base;
        uint64_t size;
        uint32_t flags;
        bool cpu_accessible;
        size_t n_mapped;
        uint32_t mapped[BROKER_MAX_GPUS];
} BrokerPtrInfo;

int broker_pointer_info(BrokerClient *c, uint64_t va, BrokerPtrInfo *ret, Reason *w);

/* One object, as administrators list them. */
typedef struct BrokerObjInfo {
        uint64_t handle;
        BrokerKind kind;
        uint64_t size;
        uint32_t gpu_id;
        uint64_t va;
        size_t n_mapped;
        uint32_t mapped[BROKER_MAX_GPUS];
        uint32_t exports;
} BrokerObjInfo;

/*
 * Walk the client's objects from *cursor (0 to start); fills up to @cap entries and sets *cursor to where
 * to go on (0 at the end). A walk while the client changes may skip or repeat entries.
 */
size_t broker_client_list(const BrokerClient *c, size_t *cursor, BrokerObjInfo *out, size_t cap);

typedef struct BrokerGpuMem {
        uint32_t gpu_id;
        uint64_t total;
        uint64_t free;
        uint64_t used;
} BrokerGpuMem;

/* Per GPU (@gpu_id 0: all) as this client sees it. @out has room for BROKER_MAX_GPUS entries. */
int broker_mem_info(BrokerClient *c, uint32_t gpu_id, BrokerGpuMem *out, size_t *ret_n, Reason *w);
/*
 * The VRAM account @a may hold on broker GPU @gpu_index: the smallest of the GPU's VRAM, @a's limit on that
 * GPU and its limit over all GPUs (the GPU's VRAM when @a is NULL; 0 for an index past the GPUs). What a
 * client of the class is told its GPU has, and broker_mem_info()'s total on a GPU the class may use.
 */
uint64_t broker_vram_allowance(const Broker *b, BrokerAccount *a, size_t gpu_index);

/* ---- VMM --------------------------------------------------------------------------------------------- */

int broker_vmm_reserve(BrokerClient *c, uint64_t size, uint64_t alignment, uint64_t fixed_va,
                       uint64_t *ret_va, Reason *w);
int broker_vmm_free(BrokerClient *c, uint64_t va, uint64_t size, Reason *w);
/* *@ret_import_fd: with DRIVER_CAP_CLIENT_MAPS the handle's export, for the client to map (owned by the
 * caller), else -1. */
int broker_vmm_create(BrokerClient *c, uint64_t size, uint32_t gpu_id, uint32_t flags, uint64_t *ret_handle,
                      int *ret_import_fd, Reason *w);
/* What the granularity query answers: at least the driver's granularity for device memory. */
uint64_t broker_granularity(const Broker *b, bool recommended);
int broker_vmm_release(BrokerClient *c, uint64_t handle, Reason *w);
int broker_vmm_map(BrokerClient *c, uint64_t va, uint64_t size, uint64_t offset, uint64_t handle, Reason *w);
int broker_vmm_unmap(BrokerClient *c, uint64_t va, uint64_t size, Reason *w);

typedef struct BrokerCpuMap {
        uint64_t va;
        uint64_t size;
        uint64_t offset;
        int prot_write; /* 1: read-write, 0: read-only */
        int fd;         /* owned by the caller */
} BrokerCpuMap;

/*
 * Grant access on every mapping in [va, va+size), which must cover whole mappings. CPU grants come back
 * as fds to mmap (at most BROKER_MAX_CPU_MAPS per call); CPU revocations need nothing from the daemon.
 */
int broker_vmm_set_access(BrokerClient *c, uint64_t va, uint64_t size, const BrokerAccess *d, size_t n,
                          BrokerCpuMap *cpu, size_t *ret_n_cpu, Reason *w);
int broker_vmm_get_access(BrokerClient *c, uint64_t va, uint32_t gpu_id, int *ret_access, Reason *w);
int broker_vmm_retain(BrokerClient *c, uint64_t va, uint64_t *ret_handle, Reason *w);

typedef struct BrokerProps {
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t size;
        uint32_t flags;
} BrokerProps;

int broker_vmm_properties(BrokerClient *c, uint64_t handle, BrokerProps *ret, Reason *w);

/* ---- sharing ----------------------------------------------------------------------------------------- */

int broker_export(BrokerClient *c, uint64_t handle, bool read_only, int *ret_fd, uint64_t *ret_size,
                  Reason *w);
/* @fd is borrowed; it has been checked to be a regular file or an anonymous-inode file. */
int broker_import(BrokerClient *c, int fd, uint32_t gpu_id, uint64_t *ret_handle, uint64_t *ret_size,
                  Reason *w);

/* ---- named shares ----------------------------------------------------------------------------------- */

/*
 * Memory published under a name, opened by name by other clients: each reader gets it imported into its own
 * GPU VM and mapped at the share's VA (the same for every reader) in a shared region of the aperture no
 * window holds. The publisher's class pays for the memory once, and the share costs it one handle and the
 * fd the broker holds; a reader pays one handle. A share ends when it is revoked, or with its object unless
 * it is persistent: a persistent share then keeps the memory, still charged to the publisher's class, until
 * it is revoked. Revoking takes every reader's GPU access and import away at once; a reader's handle stays
 * in its books, answering -ESTALE, until it frees it. Policy (who may publish, open and with which role) is
 * decided above the broker. Needs a GPU VM per client and VA grants (-EOPNOTSUPP otherwise).
 */
#define BROKER_SHARE_NAME_MAX 128
#define BROKER_MAX_SHARES     4096

/* The region shares are placed in: [base, base+size), reserved in the daemon by the caller. */
int broker_share_region(Broker *b, uint64_t base, uint64_t size);
void broker_share_region_get(const Broker *b, uint64_t *ret_base, uint64_t *ret_size);

typedef struct BrokerShareInfo {
        char name[BROKER_SHARE_NAME_MAX + 1];
        uint64_t owner_tag;  /* the publisher's broker_client_set_tag(); 0 once it has gone */
        char class_name[64]; /* the class that pays ("" for none) */
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t size, va;
        bool read_only, persistent;
        uint32_t readers;
        uint64_t published_usec; /* CLOCK_REALTIME */
        uint64_t opens;          /* opens since it was published */
} BrokerShareInfo;

/* A tag for the client, reported as the owner of what it publishes (the daemon's client id). */
void broker_client_set_tag(BrokerClient *c, uint64_t tag);

/* Publish the memory of @handle (device, host or VMM) as @name. */
int broker_share_publish(BrokerClient *c, uint64_t handle, const char *name, bool read_only, bool persistent,
                         BrokerShareInfo *ret, Reason *w);
/*
 * Open @name, read-write when @write, on @gpu_ids (n == 0: every GPU the client may use). The reader's
 * handle, the share's VA and size, and *@ret_fd (owned by the caller; opened read-only for a read-only
 * reader) to map at that VA.
 */
int broker_share_open(BrokerClient *c, const char *name, bool write, const uint32_t *gpu_ids, size_t n,
                      uint64_t *ret_handle, BrokerShareInfo *ret_info, int *ret_fd, Reason *w);
/* What is known of @name (-ENOENT: nothing). */
int broker_share_find(Broker *b, const char *name, BrokerShareInfo *ret);
/*
 * End the share @name: its readers lose their GPU access and imports now. The publisher's books change
 * when it still has them: the caller serialises them as for the publisher's own calls. The release of a
 * large persistent share's memory goes to *@ret_drops (a list, for the caller to run; NULL: none), or to the
 * dropper when @ret_drops is NULL.
 */
int broker_share_revoke(Broker *b, const char *name, BrokerDrop **ret_drops, Reason *w);
/* Up to @cap shares from *@cursor (0 to start; 0 again at the end). */
size_t broker_share_list(Broker *b, size_t *cursor, BrokerShareInfo *out, size_t cap);

/* ---- managed memory (SVM attributes) ------------------------------------------------------------------ */

int broker_svm_set(BrokerClient *c, uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n, Reason *w);
int broker_svm_get(BrokerClient *c, uint64_t va, uint64_t size, BrokerSvmAttr *a, size_t n, Reason *w);
int broker_svm_prefetch(BrokerClient *c, uint64_t va, uint64_t size, uint32_t location, Reason *w);

/*
 * A prefetch in steps, so that the driver's migration can run off the event loop: begin checks it on the
 * loop, run asks the driver (any thread: only where DRIVER_CAP_THREADED_SVM, which broker_prefetch_is_slow()
 * checks), end words its outcome on the loop. The caller keeps the client's range alive meanwhile (the
 * client's later requests wait for this one).
 */
#define BROKER_SLOW_PREFETCH_BYTES (2ull << 20)
typedef struct BrokerPrefetch {
        Driver *drv;
        uint64_t va, size;
        uint32_t location;
        int result;
} BrokerPrefetch;
bool broker_prefetch_is_slow(const BrokerClient *c, uint64_t size);
int broker_prefetch_begin(BrokerClient *c, uint64_t va, uint64_t size, uint32_t location, BrokerPrefetch *p,
                          Reason *w);
void broker_prefetch_run(BrokerPrefetch *p);
int broker_prefetch_end(const BrokerPrefetch *p, Reason *w);

/* ---- KFD events (events.h keeps them; each costs its class a handle) ---------------------------------- */

/* @page_va: the event page, memory of the client's the CPU reaches (host memory), named once. */
int broker_event_create(BrokerClient *c, uint32_t type, bool auto_reset, uint64_t page_va, uint32_t *ret_id,
                        uint32_t *ret_slot, Reason *w);
int broker_event_destroy(BrokerClient *c, uint32_t id, Reason *w);
int broker_event_set(BrokerClient *c, uint32_t id, Reason *w);
int broker_event_reset(BrokerClient *c, uint32_t id, Reason *w);
/* As client_event_wait(). Pending waits must be cancelled before the client is freed. */
int broker_event_wait(BrokerClient *c, const uint32_t *ids, size_t n, bool all, bool pend, EventWaitDone done,
                      void *ctx, EventWait **ret, Reason *w);
void broker_event_wait_cancel(BrokerClient *c, EventWait *wt);
/* The GPU VM fault memory event @id holds (client_event_memory_fault()). */
bool broker_event_memory_fault(const BrokerClient *c, uint32_t id, EventsMemoryFault *ret);

/*
 * GPU interrupts for the client's events (queues it runs that signal an event) reach @fn(@arg), on the
 * driver's thread with its locks held: @fn only hands the news to the client's own thread, which then calls
 * broker_event_interrupt() under the client's lock. Set before the client's first memory or queue op; NULL
 * once @arg goes (the client's books may outlive it, torn down in slices): no call is made after that.
 */
void broker_client_set_interrupt(BrokerClient *c, void (*fn)(void *arg), void *arg);
/* Signal events whose slot in the event page the GPU wrote: acknowledged as KFD does (the slot back to
 * unsignalled) and set. Returns how many were set. */
int broker_event_interrupt(BrokerClient *c);

/* ---- user-mode queues (each costs its class a handle and one of its queues) --------------------------- */

/* A queue in the client's own GPU VM: the ring, the read and write pointers, the EOP buffer and the CWSR
 * area must be memory of this client's. Its id and the doorbell's offset on a kfd fd. */
int broker_queue_create(BrokerClient *c, const DriverQueueArgs *q, uint32_t *ret_id, uint64_t *ret_doorbell,
                        Reason *w);
int broker_queue_destroy(BrokerClient *c, uint32_t id, Reason *w);
int broker_queue_update(BrokerClient *c, uint32_t id, uint64_t ring_va, uint64_t ring_size,
                        uint32_t percentage, uint32_t priority, Reason *w);
size_t broker_client_queues(const BrokerClient *c);
