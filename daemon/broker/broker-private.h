/* What the broker's files share: its structs, and the helpers one part of it offers the others. */
#pragma once

/* Only the broker's .c files include this, after broker.h: broker.c is broker.h's own file, so including
 * broker.h here would make the two headers a circle of files. */
#ifndef BROKER_MAX_GPUS
#error "include broker.h before broker-private.h"
#endif

#include <sys/stat.h>
#include <sys/types.h>

#include "hashmap.h"

typedef struct Obj Obj;
typedef struct VmmMap VmmMap;

/*
 * The SVM attribute calls made on one managed allocation, in order: what a restart replays in the next
 * daemon's context, where the same calls give the same attributes, page for page. Bounded: an allocation
 * whose calls overflowed it cannot be carried (its attributes could not be told exactly).
 */
#define SVM_LOG_MAX        256
#define SVM_LOG_CLIENT_MAX 1024 /* all of a client's allocations together */
typedef BrokerSvmCall SvmLogEntry;
typedef struct SvmLog {
        size_t n, cap;
        bool overflowed;
        SvmLogEntry *e;
} SvmLog;
typedef struct Share Share;
typedef struct ShareRef ShareRef;

struct Obj {
        uint64_t handle;
        BrokerKind kind;
        uint64_t va, size; /* allocations and reservations; 0 for VA-less handles */
        uint32_t gpu_id;
        uint32_t flags;
        int numa_node;
        DriverMem *mem;       /* device, host (registered pages), VMM and import */
        int memfd;            /* host and managed: the shared pages */
        unsigned client_refs; /* VMM/import: create/import + retains − releases; 0 = no longer named */
        unsigned map_refs;    /* VMM/import: mappings that use it */
        unsigned exports;
        ThunkVaSpace *maps; /* reservation: its mappings (data: VmmMap *) */
        bool read_only;     /* import of a read-only export: every grant of it is read-only */
        bool sealed_ro;     /* import: read-only since a restart found its memory sealed (write grants
                               come back as read grants) */
        bool foreign;       /* import of memory gpumemd did not export: charged by its size */
        bool handed_out;    /* an fd of its memory went to a client: it may outlive the handle */
        bool backing_fd;    /* the driver holds an fd for its memory in the daemon (the model's VRAM) */
        bool pending;       /* being made in steps (broker_alloc_begin): has VA and a charge, no handle */
        bool outer;        /* BROKER_FLAG_SVM_RANGE: placed in the client's outer VA space, not mapped here */
        uint64_t file_ino; /* the inode of the files handed out (0: none), in Broker.files while it lives */
        dev_t file_dev;
        struct SvmLog *svm_log; /* managed: the SVM attribute calls made on it, in order (a restart replays
                                   them) */
        bool svm_unlogged;      /* one of them could not be kept (out of memory) */
        Share *share;           /* published under a name (broker_share_publish), until the share ends */
        bool share_kept;        /* its persistent share took its memory over when it went */
        ShareRef *ref;          /* BROKER_KIND_SHARE: this reader's open share */
        unsigned carry_pass;    /* the last broker_client_carry_each() that listed it */
        bool carry_hold; /* VMM: came back from a restart only for its mappings (broker_carry_finish) */
};

/*
 * Memory whose handle is gone but which files handed to clients (fds, mappings, imports) still keep alive:
 * its class goes on paying until the kernel drops the inode, which inotify reports as IN_IGNORED.
 */
typedef struct Linger Linger;
struct Linger {
        Linger *next;        /* others on the same watch */
        BrokerAccount *acct; /* pays (NULL: no class); its lingering count keeps it alive */
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t size;
        uint64_t ino;
        dev_t dev;
        int wd;
};

typedef struct GemGrant {
        uint32_t gpu_id;
        int access;
        DriverGrant *m;
} GemGrant;

struct VmmMap {
        Obj *res;
        Obj *phys;
        uint64_t va, size, offset;
        int cpu_access;
        size_t n_gem;
        GemGrant gem[BROKER_MAX_GPUS];
};

/* What the clients of one uid hold that is bounded per uid, under the broker's lock; alive while clients
 * name it. */
typedef struct BrokerUid BrokerUid;
struct BrokerUid {
        BrokerUid *next;
        uid_t uid;
        unsigned clients;
        uint64_t mappings;
        uint64_t host_bytes; /* host memory of live objects (memory that lingers is its class's alone) */
        unsigned listeners;  /* its clients whose GPU context a thread of the driver's waits on */
};

/*
 * A host or managed object mapped in the daemon (at its VA, inside the window's PROT_NONE reservation)
 * costs up to two entries of its memory map: the mapping itself and the piece of the reservation it cuts
 * off, when its neighbours are reservation too.
 */
#define BROKER_OBJ_MAPPINGS 2
/* A user-mode queue costs a handle, a queue and up to two entries of the daemon's memory map: the doorbell
 * relay's view of its write pointer's page, and the driver's own view of the queue (the model's). */
#define BROKER_QUEUE_CHARGE ((Charge){.objects = 1, .queues = 1, .mappings = 2})

/*
 * Locks, in the order they are taken: the caller serialises each client (its BrokerClient and objects);
 * the share lock guards the named shares and every reader's part of them; the broker's lock guards what
 * clients share (the totals, the uids' counts, the handed-out and lingering files, the inotify queue); an
 * account's lock guards its usage and limits, and is taken alone or inside the broker's. Driver calls are
 * made under none of the broker's locks but the share lock (a share's readers are mapped and unmapped under
 * it; no driver callback takes it).
 */
struct Broker {
        Driver *drv;
        DriverCtx *primary;
        size_t n_gpus;
        uint32_t gpu_ids[BROKER_MAX_GPUS];
        uint64_t gpu_vram[BROKER_MAX_GPUS];
        uint64_t
                dev_gran; /* device memory comes in multiples of this: the largest GPU's, the page at least */
        int gpu_numa[BROKER_MAX_GPUS];
        pthread_mutex_t lock;
        BrokerUsage totals;
        uint64_t max_mappings, max_mappings_uid; /* broker_set_mapping_limits(), under the lock */
        uint64_t max_host_uid;                   /* broker_set_host_per_uid(), under the lock */
        unsigned max_listeners_uid;              /* broker_set_listeners_per_uid(), under the lock */
        BrokerUid *uids;                         /* under the lock */
        unsigned clients;
        int notify_fd;      /* inotify: the death of lingering memory */
        HashMap lingering;  /* watch descriptor -> Linger * */
        HashMap files;      /* inode of a live object's handed-out files -> Obj * */
        HashMap dead_files; /* inode of lingering memory -> Linger * (its first) */
        uint64_t watch_failures;
        /* named shares: their list and the shared region their VAs come from, under share_lock */
        pthread_mutex_t share_lock;
        struct Share *shares;
        size_t n_shares;
        ThunkVaSpace *share_space;
        /* queues in the primary context (no context per client, a class that accepts sharing it): the clients
         * that run them, and the GPU VM fault that stopped them all for good, under sharers_lock (taken on
         * the driver's thread under its own locks; only a client's fault lock and its irq_fn inside) */
        pthread_mutex_t sharers_lock;
        pthread_mutex_t primary_listen_lock; /* one first join listens, the others wait for it */
        BrokerClient *sharers;
        bool primary_heard; /* its interrupts come to the broker */
        bool primary_faulted;
        DriverInterrupt primary_fault;
        void (*dropper)(void *arg, BrokerDrop *d, uint64_t flow); /* broker_set_dropper() */
        void *dropper_arg;
};

typedef struct BrokerQueue {
        uint32_t id;
        uint32_t gpu_id;
        uint32_t type;
} BrokerQueue;

struct BrokerClient {
        Broker *b;
        ThunkVaSpace *window;
        ThunkVaSpace *outer; /* its GPU VM outside the window (SVM ranges), from the first such object */
        DriverCtx *ctx;      /* NULL until first needed */
        bool own_ctx;
        bool listener_charged; /* counted in its uid's listeners (events-client.c) */
        HashMap objs;
        BrokerUsage usage;
        BrokerAccount *acct; /* the class's shared limits and usage; NULL = unlimited */
        BrokerUid *uid;      /* its uid's mapping count; NULL = none */
        int teardown_phase;  /* TEARDOWN_*: how far a teardown in slices went */
        size_t teardown_iter;
        ClientEvents *events;      /* its KFD events, from its first (each costs a handle) */
        void (*irq_fn)(void *arg); /* where its GPU interrupts go (broker_client_set_interrupt) */
        void *irq_arg;
        /* a GPU VM fault of its context, from the driver's thread until its own takes it (a leaf lock) */
        pthread_mutex_t fault_lock;
        DriverInterrupt fault;
        bool fault_pending;
        bool ctx_faulted;    /* a fault (the last in @fault) stopped its context's queues for good */
        uint64_t *fired;     /* DRIVER_CAP_EVENT_MIRROR: a bit per signal event the driver saw fire */
        BrokerQueue *queues; /* its user-mode queues (each costs a handle and a queue) */
        size_t n_queues, cap_queues;
        uint64_t tag;              /* the daemon's name for it (broker_client_set_tag) */
        size_t svm_log_entries;    /* SVM calls its managed allocations keep for a restart (SvmLog) */
        unsigned carry_pass;       /* counts broker_client_carry_each() calls */
        BrokerClient *next_sharer; /* in Broker.sharers while it runs queues in the primary context */
        bool sharer;
        uint64_t flow;   /* its tenant, for its drops (broker_client_set_flow) */
        bool hold_drops; /* its drops wait in @drops for broker_client_take_drops() */
        BrokerDrop *drops;
};

/*
 * What an object (or a bookkeeping entry, or one file) costs: the same record is charged to its client, its
 * class's account and the broker's totals, and refunded from all three, so they cannot drift apart.
 */
typedef struct Charge {
        uint64_t objects;
        uint32_t held_fds;
        uint32_t queues;
        uint32_t mappings; /* entries of the daemon's memory map */
        uint32_t shares;   /* named shares */
        BrokerKind kind;   /* what @bytes are of (0: no bytes) */
        uint32_t gpu_id;
        uint64_t bytes;
        bool foreign;   /* an import's bytes count only when it is of memory gpumemd did not export */
        bool lingering; /* memory whose handle is gone: its bytes count as lingering too */
} Charge;

/* One reader's open share. Its fields are under the share lock; the reader's Obj (BROKER_KIND_SHARE) names
 * it until the reader frees its handle, revoked or not. */
struct ShareRef {
        ShareRef *next;
        Share *share;
        BrokerClient *reader;
        DriverMem *mem; /* the import in the reader's GPU VM; NULL once revoked */
        size_t n_grants;
        DriverGrant *grants[BROKER_MAX_GPUS];
        uint32_t grant_gpus[BROKER_MAX_GPUS];
        bool read_only;
};

struct Share {
        Share *next; /* in Broker.shares while it lives */
        char name[BROKER_SHARE_NAME_MAX + 1];
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t va, size;
        int fd; /* the memory, read-write, held by the broker while the share lives */
        bool read_only, persistent, revoked;
        Obj *src;            /* the publisher's object while it lives (NULL after) */
        BrokerClient *owner; /* the publisher's books, as long as the object lives */
        uint64_t owner_tag;
        BrokerAccount *acct; /* pays for it */
        char class_name[64];
        /* a persistent share whose object went pays itself (its own charge and the memory) to the account
         * and the totals; the account's lingering count keeps the account alive meanwhile */
        bool holds;
        Charge held_mem;
        ShareRef *refs;   /* every reader's, revoked ones included, until they free their handles */
        uint32_t readers; /* of them, not revoked */
        uint64_t published_usec, opens;
        /* brought back from a restart, its publisher (by tag) and object (by handle) not back yet */
        bool carry_pending;
        uint64_t carry_owner_tag, carry_src;
        bool carry_ending;    /* its publisher did not come back: it ends once its readers are back */
        DriverMem *carry_mem; /* a persistent one's memory, taken back by the driver for it alone */
};

/* What a share costs its publisher besides the memory: a handle and the fd the broker holds. */
extern const Charge broker_share_charge;

/* broker.c: the GPUs, and sizes in words */
void broker_mapped_gpus_into(const Broker *b, const Obj *o, uint32_t *ids, size_t *n);
const char *broker_human(uint64_t v, char *buf, size_t len);

/* account.c: charges and refunds, the class's limits and GPUs */
bool broker_driver_holds_fd(const Broker *b);
bool broker_driver_file_at_alloc(const Broker *b, uint32_t flags);
Charge broker_obj_charge(const Obj *o);
/* @ch into the totals and the client's uid's count, unchecked (what a restart carries exists already). */
void broker_totals_charge(BrokerClient *c, const Charge *ch);
/* The client leaves its uid's count: the last client of a uid frees it. */
void broker_client_drop_uid(BrokerClient *c);
void broker_usage_apply(BrokerUsage *u, const Broker *b, const Charge *ch, int sign);
void broker_totals_apply(Broker *b, const Charge *ch, int sign);
int broker_charge_take(BrokerClient *c, const Charge *ch, Reason *w);
void broker_charge_give(BrokerClient *c, const Charge *ch);
void broker_charge_obj_give(BrokerClient *c, const Obj *o);
int broker_quota_check(const BrokerClient *c, BrokerKind kind, uint32_t gpu_id, uint64_t bytes, bool holds_fd,
                       Reason *w);
int broker_export_fd_take(BrokerClient *c, const Obj *o, Reason *w);
void broker_export_fd_end(BrokerClient *c, Obj *o, int taken, bool made);
int broker_gpu_allowed(const BrokerClient *c, uint32_t gpu_id, Reason *w);
int broker_gpus_allowed(const BrokerClient *c, const uint32_t *ids, size_t n, Reason *w);
size_t broker_allowed_gpu_ids(const BrokerClient *c, uint32_t *ids);

/* files.c: memory that outlives its handle */
void broker_note_file(Broker *b, Obj *o, int fd);
void broker_linger_watch(Broker *b, BrokerAccount *acct, BrokerKind kind, uint32_t gpu_id, uint64_t size,
                         int fd);
void broker_linger_start(BrokerClient *c, const Obj *o, int fd);
void broker_obj_forget_file(Broker *b, Obj *o);
int broker_make_read_only(int *fd, Reason *w);
bool broker_file_sealed(int fd);
int broker_seal_read_only(Broker *b, int fd, Reason *w);
int broker_hand_out_read_only(Broker *b, int *fd, Reason *w);
int broker_check_writable(int fd, Reason *w);
bool broker_obj_read_only(const Obj *o);
bool broker_is_own_file(Broker *b, const struct stat *st, bool *ret_read_only);

/* client.c */
int broker_client_ctx(BrokerClient *c, DriverCtx **ret, Reason *w);
int broker_client_outer(BrokerClient *c, Reason *w);

/* events-client.c */
void broker_client_interrupt(void *arg, const DriverInterrupt *irq);
/* queues.c: the client no longer hears the primary context's interrupts (before it goes). */
void broker_primary_leave(BrokerClient *c);

/* objects.c: handles, VA, what an object holds, lookups */
Obj *broker_obj_new(BrokerKind kind);
int broker_obj_publish(BrokerClient *c, Obj *o);
Obj *broker_obj_lookup(BrokerClient *c, uint64_t handle);
int broker_obj_add(BrokerClient *c, Obj *o, Reason *w);
int broker_obj_dup_memfd(const Obj *o, int *ret_fd, Reason *w);
void broker_obj_mem_free(Broker *b, Obj *o);
void broker_reserve_again(uint64_t va, uint64_t size);
void broker_unmap_shared(Broker *b, uint64_t va, uint64_t size);
/* Give up the daemon's mapping of @o (host, managed or GTT memory) and its memory file: here, or later as a
 * drop when it is large. */
void broker_drop_pages(BrokerClient *c, Obj *o);
/* Close @fd (taken), perhaps the last file of @size bytes of memory: later, as a drop, when that is large:
 * put on *@hold when given, else handed to the dropper. */
void broker_drop_file(Broker *b, int fd, uint64_t size, uint64_t flow, BrokerDrop **hold);
int broker_check_gpus(const Broker *b, const uint32_t *ids, size_t n, Reason *w);
int broker_check_flags(uint32_t f, Reason *w);
ThunkVaSpace *broker_obj_space(const BrokerClient *c, const Obj *o);
int broker_take_va(BrokerClient *c, uint64_t size, uint64_t align, uint64_t fixed, Obj *o, uint64_t *ret,
                   Reason *w);
int broker_check_alignment(uint64_t align, Reason *w);
int broker_destroy_alloc(BrokerClient *c, Obj *o, bool teardown, Reason *w);
int broker_phys_maybe_destroy(BrokerClient *c, Obj *o, bool teardown, Reason *w);
bool broker_in_window(const BrokerClient *c, uint64_t va, uint64_t size);
Obj *broker_obj_at(const BrokerClient *c, uint64_t va);
VmmMap *broker_map_at(const Obj *res, uint64_t va);

/* vmm.c: reservations' mappings and their grants */
Obj *broker_reservation_at(const BrokerClient *c, uint64_t va);
int broker_map_revoke_all(Broker *b, VmmMap *m);
int broker_map_destroy(BrokerClient *c, VmmMap *m, bool teardown, Reason *w);
int broker_set_gpu_access(BrokerClient *c, DriverCtx *ctx, VmmMap *m, uint32_t gpu_id, int access, Reason *w);

/* dmabuf.c */
int broker_obj_file(BrokerClient *c, Obj *o, int *ret_fd, Reason *w);

/* share.c: the share list (under the share lock) and a reader's part */
bool broker_share_name_ok(const char *name);
Share *broker_share_by_name(Broker *b, const char *name);
bool broker_share_holds_file(Broker *b, const struct stat *st);
void broker_share_held_apply(Broker *b, Share *s, int sign);
void broker_shares_done(Broker *b);
void broker_share_end(Broker *b, Share *s, BrokerDrop **drops);
void broker_share_obj_gone(BrokerClient *c, Obj *o);
int broker_share_reader_vm(BrokerClient *c, DriverCtx **ret_ctx, Reason *w);
void broker_share_obj_fill(Obj *o, const Share *s, ShareRef *ref);
void broker_share_ref_link(Share *s, ShareRef *ref, BrokerClient *c);
int broker_share_ref_map(Broker *b, DriverCtx *ctx, const Share *s, ShareRef *ref, const uint32_t *gpus,
                         size_t n_gpus, int *ret_fd, Reason *w);
void broker_share_ref_undo(BrokerClient *c, const Share *s, ShareRef *ref, bool placed, int fd);
void broker_share_ref_drop(BrokerClient *c, Obj *o);
Obj *broker_share_at(const BrokerClient *c, uint64_t va);
int broker_share_pointer_info(BrokerClient *c, const Obj *o, BrokerPtrInfo *ret, Reason *w);
int broker_share_set_access(BrokerClient *c, const Obj *o, const BrokerAccess *d, size_t n, Reason *w);
int broker_share_get_access(BrokerClient *c, const Obj *o, uint32_t gpu_id, int *ret_access, Reason *w);

/* svm.c: managed memory's SVM log and attribute checks */
void broker_svm_log_free(BrokerClient *c, Obj *o);
void broker_svm_log_add(BrokerClient *c, Obj *o, uint64_t va, uint64_t size, const BrokerSvmAttr *a,
                        size_t n);
int broker_check_svm_attrs(const Broker *b, const BrokerSvmAttr *a, size_t n, bool get, Reason *w);
int broker_svm_driver_set(Driver *drv, uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n);
