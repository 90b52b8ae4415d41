/* The broker alone over a fake driver: seeded random sequences of calls, its books checked against a model
 * after each one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/broker.h"
#include "driver-fake.h"
#include "drivers/driver.h"

/*
 * Each sequence builds a fake driver, a broker over it, three accounts with random limits and three clients,
 * then makes 20 to 50 random calls: allocations of every kind, frees, maps, VMM, exports and imports between
 * clients, named shares, SVM attributes, teardowns in small slices, a restart (the clients carried to a new
 * broker over a new driver), and driver failures injected on purpose. The model is what docs/policy.md says
 * a class pays for; after every call the broker's books (each client's and account's usage, the totals, the
 * objects each client names) and the fake driver's (what lives there, where memory is mapped) must be what
 * the model says, and a call that fails must fail with the errno the model expects and change nothing.
 *
 * test-broker-model [--count N] [--from SEED] [--seed SEED] [--jobs N] [--verbose] [--coverage]: 10000
 * sequences from seed 1 by default (BROKER_MODEL_SEQUENCES sets the count); --seed runs one, --verbose prints
 * each call and its outcome, --coverage how often each kind of call succeeded. A failure names its seed, the
 * call and what differs.
 */

#define N_GPUS     3
#define N_ACCTS    3
#define N_CLIENTS  3
#define MAX_MEMS   512
#define MAX_OBJS   512
#define MAX_MAPS   256
#define MAX_SHARES 16
#define MAX_FDS    512
#define N_NAMES    4

#define PAGE         4096ull
#define WINDOW_SIZE  (64ull << 20)
#define WINDOW_ALIGN (2ull << 20)
#define REGION_SIZE  (256ull << 20)
#define CLOSER_MAX   16
#define CLOSERS      4

static const uint32_t gpu_ids[N_GPUS] = {101, 202, 303};
static const char *const acct_names[N_ACCTS] = {"A0", "A1", "A2"};
static const char *const share_names[N_NAMES] = {"s0", "s1", "s2", "s3"};

typedef enum MemState {
        MEM_LIVE,      /* its object lives: the object pays */
        MEM_HELD,      /* a persistent share took it over when its object went: the share pays */
        MEM_LINGER,    /* freed, files of it handed out still live: its class pays until the last goes */
        MEM_GONE,      /* nothing pays */
        MEM_FORGOTTEN, /* lingered in a broker before a restart: the new one never heard of it */
} MemState;

/* One memory: what one memory file is (or would be) of. */
typedef struct Mem {
        BrokerKind kind; /* DEVICE, HOST, MANAGED, VMM; IMPORT for a file the test made itself */
        uint32_t gpu_id;
        uint64_t size;
        MemState state;
        int payer;   /* its account while it lingers or a share holds it */
        int obj;     /* the object it is of while it lives */
        bool sealed; /* handed out read-only: its file takes no new writable mapping */
} Mem;

typedef struct Obj {
        bool live; /* the broker holds it (a VMM handle released but still mapped too) */
        int client;
        uint64_t handle;
        BrokerKind kind;
        uint64_t va, size;
        uint32_t gpu_id, flags;
        int mem; /* its memory; an import's: the memory imported; a reader's: the share's */
        bool backing, memfd, handed_out;
        uint64_t mapped; /* device and host memory: bit i, GPU i */
        unsigned client_refs, map_refs;
        bool foreign, read_only;
        int share; /* published as this share, or -1 */
        bool share_kept;
        int reader_of; /* BROKER_KIND_SHARE: the share open */
        bool revoked;
        uint64_t reader_gpus;
} Obj;

typedef struct Map {
        bool live;
        int client, res, phys;
        uint64_t va, size, offset;
        int access[N_GPUS];
        int cpu_access;
} Map;

typedef struct Share {
        bool named; /* found by its name (not revoked, not ended) */
        char name[8];
        int mem;
        int src, owner; /* the publisher's object and client while the object lives */
        bool persistent, read_only, held;
        int payer;      /* the account that pays while it holds the memory */
        bool carry_mem; /* the driver took the memory back for it alone after a restart */
        uint64_t va, size;
        uint32_t gpu_id;
        BrokerKind kind;
} Share;

typedef struct TestFd {
        bool open;
        int fd;
        int mem;
        bool ro;
} TestFd;

typedef struct Client {
        BrokerClient *bc;
        int acct;
        ThunkVaSpace *win;
        uint64_t base;
        unsigned ctx; /* its context in the fake driver (0: none yet) */
        uint64_t tag;
} Client;

typedef struct Fault {
        bool armed;
        FakeOp op;
        unsigned nth; /* the call of @op that fails: the first, mostly */
        int err;
        uint64_t fired_before;
} Fault;

/* What a run saw. */
#define N_OP_KINDS 32
typedef struct Stats {
        uint64_t sequences, operations, injected, errors, restarts, restarts_refused, teardowns;
        uint64_t runs[N_OP_KINDS], ok[N_OP_KINDS]; /* per kind of operation, for --coverage */
} Stats;

typedef struct World {
        uint64_t seed, rng;
        bool verbose;
        Driver *drv;
        Broker *b;
        unsigned caps;
        bool fdps;
        uint64_t gran;
        BrokerAccount accts[N_ACCTS];
        Client clients[N_CLIENTS];
        Mem mems[MAX_MEMS];
        size_t n_mems;
        Obj objs[MAX_OBJS];
        size_t n_objs;
        Map maps[MAX_MAPS];
        size_t n_maps;
        Share shares[MAX_SHARES];
        size_t n_shares;
        TestFd fds[MAX_FDS];
        size_t n_fds;
        Fault fault;
        int op_index;
        int focus; /* the client most calls are made for now */
        bool keep_focus;
        BrokerKind alloc_kind; /* the next allocation's kind, when a call needs one (0: any) */
        int last_rc;           /* of the last broker call checked (1: none) */
        char fault_note[96];   /* the failure injected in the last call, for messages */
        char op[320];
        uint64_t next_tag;
        unsigned restarts;
        struct Worker *wk;
} World;

/*
 * What a worker keeps from one sequence to the next: the windows and the shared region, reserved once, and
 * a broker over a fake driver for each granularity, which a sequence leaves as it found them (nothing held,
 * every account settled) and a restart replaces.
 */
typedef struct Worker {
        uint64_t window_bases[N_CLIENTS];
        uint64_t region_base;
        Driver *drv[2];
        Broker *b[2];
        Stats stats;
} Worker;

/* ---- helpers ----------------------------------------------------------------------------------------- */

static _Noreturn void fail(World *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void fail(World *w, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "broker-model: seed %" PRIu64 ", operation %d (%s%s): %s\n", w->seed, w->op_index,
                w->op, w->fault_note, msg);
        fprintf(stderr, "broker-model: reproduce with: test-broker-model --seed %" PRIu64 " --verbose\n",
                w->seed);
        exit(EXIT_FAILURE);
}

static void describe(World *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void describe(World *w, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(w->op, sizeof(w->op), fmt, ap);
        va_end(ap);
}

static uint64_t rnd(World *w)
{
        /* splitmix64: a sequence is its seed, on every machine */
        uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static uint64_t below(World *w, uint64_t n)
{
        return n ? rnd(w) % n : 0;
}

static bool chance(World *w, unsigned pct)
{
        return below(w, 100) < pct;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
        return (v + to - 1) / to * to;
}

static int gpu_index(uint32_t gpu_id)
{
        for (int i = 0; i < N_GPUS; i++)
                if (gpu_ids[i] == gpu_id)
                        return i;
        return -1;
}

static const char *kind_name(BrokerKind k)
{
        switch (k) {
        case BROKER_KIND_DEVICE:
                return "device";
        case BROKER_KIND_HOST:
                return "host";
        case BROKER_KIND_MANAGED:
                return "managed";
        case BROKER_KIND_VMM:
                return "vmm";
        case BROKER_KIND_IMPORT:
                return "import";
        case BROKER_KIND_SHARE:
                return "share";
        case BROKER_KIND_RESERVATION:
                return "reservation";
        }
        return "?";
}

static BrokerAccount *acct_of(World *w, int ci)
{
        return &w->accts[w->clients[ci].acct];
}

static uint64_t allowed(World *w, int ci)
{
        return acct_of(w, ci)->allowed_gpus;
}

/* May client @ci's class use @gpu_id, as gpu_allowed() says: 0, -ENODEV or -EACCES. */
static int gpu_ok(World *w, int ci, uint32_t gpu_id)
{
        int gi = gpu_index(gpu_id);

        if (gi < 0)
                return -ENODEV;
        return allowed(w, ci) & (1ull << gi) ? 0 : -EACCES;
}

/* A GPU list as check_gpus() then gpus_allowed() see it. */
static int gpus_ok(World *w, int ci, const uint32_t *ids, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                if (gpu_index(ids[i]) < 0)
                        return -ENODEV;
                for (size_t k = 0; k < i; k++)
                        if (ids[k] == ids[i])
                                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++)
                if (gpu_ok(w, ci, ids[i]) < 0)
                        return -EACCES;
        return 0;
}

static uint64_t mask_of(const uint32_t *ids, size_t n)
{
        uint64_t m = 0;

        for (size_t i = 0; i < n; i++)
                if (gpu_index(ids[i]) >= 0)
                        m |= 1ull << gpu_index(ids[i]);
        return m;
}

/* Some GPUs, each once, in a random order; sometimes one the class may not use. */
static size_t pick_gpus(World *w, uint32_t *ids, size_t max)
{
        size_t n = 1 + below(w, max < N_GPUS ? max : N_GPUS);
        uint32_t pool[N_GPUS];

        memcpy(pool, gpu_ids, sizeof(pool));
        for (size_t i = 0; i < n; i++) {
                size_t k = i + below(w, N_GPUS - i);
                uint32_t t = pool[i];
                pool[i] = pool[k];
                pool[k] = t;
                ids[i] = pool[i];
        }
        return n;
}

static uint32_t pick_gpu(World *w)
{
        if (chance(w, 3))
                return 999; /* no such GPU */
        return gpu_ids[below(w, N_GPUS)];
}

static int mem_new(World *w, BrokerKind kind, uint32_t gpu_id, uint64_t size)
{
        Mem *m;

        if (w->n_mems == MAX_MEMS)
                fail(w, "the model is out of memory records");
        m = &w->mems[w->n_mems];
        *m = (Mem){.kind = kind, .gpu_id = gpu_id, .size = size, .state = MEM_LIVE, .payer = -1, .obj = -1};
        return (int)w->n_mems++;
}

/*
 * Memory handed out read-only is sealed (broker_seal_read_only): 0, or -EPERM for a file the test made
 * itself (memfd_create without MFD_ALLOW_SEALING: sealed against seals), which cannot be.
 */
static int mem_seal(World *w, int mi)
{
        if (w->mems[mi].kind == BROKER_KIND_IMPORT)
                return -EPERM;
        w->mems[mi].sealed = true;
        return 0;
}

/* A new object of client @ci, as the broker told it; the rest is the caller's to fill in. */
static int obj_new(World *w, int ci, BrokerKind kind, uint64_t handle, uint64_t size, uint32_t gpu_id)
{
        Obj *o;

        if (w->n_objs == MAX_OBJS)
                fail(w, "the model is out of object records");
        o = &w->objs[w->n_objs];
        *o = (Obj){.live = true,
                   .client = ci,
                   .kind = kind,
                   .handle = handle,
                   .size = size,
                   .gpu_id = gpu_id,
                   .mem = -1,
                   .share = -1,
                   .reader_of = -1};
        return (int)w->n_objs++;
}

static bool nameable(const Obj *o)
{
        return o->live &&
               ((o->kind != BROKER_KIND_VMM && o->kind != BROKER_KIND_IMPORT) || o->client_refs > 0);
}

static bool obj_read_only(const Obj *o)
{
        return o->read_only || (o->flags & BROKER_FLAG_READ_ONLY);
}

static int fd_add(World *w, int fd, int mem, bool ro)
{
        if (w->n_fds == MAX_FDS)
                fail(w, "the model is out of fd records");
        w->fds[w->n_fds] = (TestFd){.open = true, .fd = fd, .mem = mem, .ro = ro};
        return (int)w->n_fds++;
}

/* A random record matching @pred among @n, or -1. */
#define PICK(w, arr, n, pred)                                                                                \
        ({                                                                                                   \
                int pick_found_ = -1, pick_seen_ = 0;                                                        \
                for (size_t pick_i_ = 0; pick_i_ < (n); pick_i_++) {                                         \
                        __typeof__(&(arr)[0]) it = &(arr)[pick_i_];                                          \
                        if ((pred) && below(w, (uint64_t)++pick_seen_) == 0)                                 \
                                pick_found_ = (int)pick_i_;                                                  \
                }                                                                                            \
                pick_found_;                                                                                 \
        })

/* ---- the model's sums -------------------------------------------------------------------------------- */

static void usage_add(BrokerUsage *u, BrokerKind kind, uint32_t gpu_id, uint64_t bytes, bool foreign)
{
        int gi = gpu_index(gpu_id);

        switch (kind) {
        case BROKER_KIND_DEVICE:
                u->device_bytes += bytes;
                if (gi >= 0)
                        u->vram_bytes[gi] += bytes;
                break;
        case BROKER_KIND_VMM:
                u->vmm_bytes += bytes;
                if (gi >= 0)
                        u->vram_bytes[gi] += bytes;
                break;
        case BROKER_KIND_HOST:
                u->host_bytes += bytes;
                break;
        case BROKER_KIND_MANAGED:
                u->managed_bytes += bytes;
                break;
        case BROKER_KIND_IMPORT:
                if (foreign)
                        u->foreign_bytes += bytes;
                break;
        default:
                break;
        }
}

/* What client @ci pays for itself. */
static void expect_client(const World *w, int ci, BrokerUsage *u)
{
        memset(u, 0, sizeof(*u));
        for (size_t i = 0; i < w->n_objs; i++) {
                const Obj *o = &w->objs[i];
                if (!o->live || o->client != ci)
                        continue;
                u->objects++;
                u->held_fds += o->memfd + o->backing;
                usage_add(u, o->kind, o->gpu_id, o->size, o->foreign);
        }
        for (size_t i = 0; i < w->n_maps; i++)
                u->objects += w->maps[i].live && w->maps[i].client == ci;
        /* a share costs its publisher a handle and the fd the broker holds while the object lives */
        for (size_t i = 0; i < w->n_shares; i++)
                if (w->shares[i].named && w->shares[i].src >= 0 && w->shares[i].owner == ci) {
                        u->objects++;
                        u->held_fds++;
                }
}

/* What no client pays but account @ai (-1: any, for the totals) does: lingering memory, held shares. */
static void expect_unowned(const World *w, int ai, BrokerUsage *u)
{
        for (size_t i = 0; i < w->n_mems; i++) {
                const Mem *m = &w->mems[i];
                if (m->state != MEM_LINGER || (ai >= 0 && m->payer != ai))
                        continue;
                usage_add(u, m->kind, m->gpu_id, m->size, false);
                u->lingering_bytes += m->size;
        }
        for (size_t i = 0; i < w->n_shares; i++) {
                const Share *s = &w->shares[i];
                if (!s->named || !s->held || (ai >= 0 && s->payer != ai))
                        continue;
                u->objects++;
                u->held_fds++;
                usage_add(u, s->kind, s->gpu_id, s->size, false);
        }
}

static void usage_sum(BrokerUsage *dst, const BrokerUsage *src)
{
        dst->device_bytes += src->device_bytes;
        dst->host_bytes += src->host_bytes;
        dst->managed_bytes += src->managed_bytes;
        dst->vmm_bytes += src->vmm_bytes;
        dst->foreign_bytes += src->foreign_bytes;
        dst->lingering_bytes += src->lingering_bytes;
        dst->objects += src->objects;
        dst->held_fds += src->held_fds;
        dst->queues += src->queues;
        for (int i = 0; i < N_GPUS; i++)
                dst->vram_bytes[i] += src->vram_bytes[i];
}

static void expect_account(const World *w, int ai, BrokerUsage *u)
{
        memset(u, 0, sizeof(*u));
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                BrokerUsage c;
                if (w->clients[ci].acct != ai)
                        continue;
                expect_client(w, ci, &c);
                usage_sum(u, &c);
        }
        expect_unowned(w, ai, u);
}

static void expect_totals(const World *w, BrokerUsage *u)
{
        memset(u, 0, sizeof(*u));
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                BrokerUsage c;
                expect_client(w, ci, &c);
                usage_sum(u, &c);
        }
        expect_unowned(w, -1, u);
}

static void compare_usage(World *w, const char *who, const BrokerUsage *got, const BrokerUsage *want)
{
        const struct {
                const char *name;
                uint64_t got, want;
        } f[] = {
                {"device bytes", got->device_bytes, want->device_bytes},
                {"host bytes", got->host_bytes, want->host_bytes},
                {"managed bytes", got->managed_bytes, want->managed_bytes},
                {"VMM bytes", got->vmm_bytes, want->vmm_bytes},
                {"foreign bytes", got->foreign_bytes, want->foreign_bytes},
                {"lingering bytes", got->lingering_bytes, want->lingering_bytes},
                {"handles", got->objects, want->objects},
                {"held fds", got->held_fds, want->held_fds},
                {"queues", got->queues, want->queues},
                {"VRAM on GPU 101", got->vram_bytes[0], want->vram_bytes[0]},
                {"VRAM on GPU 202", got->vram_bytes[1], want->vram_bytes[1]},
                {"VRAM on GPU 303", got->vram_bytes[2], want->vram_bytes[2]},
        };

        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
                if (f[i].got != f[i].want)
                        fail(w, "%s: %s is %" PRIu64 " in the broker's books, %" PRIu64 " in the model", who,
                             f[i].name, f[i].got, f[i].want);
}

/* Does the memory have a reference that keeps its file alive (besides its own object)? */
static unsigned mem_refs(const World *w, int mi)
{
        unsigned n = 0;

        for (size_t i = 0; i < w->n_fds; i++)
                n += w->fds[i].open && w->fds[i].mem == mi;
        for (size_t i = 0; i < w->n_objs; i++) {
                const Obj *o = &w->objs[i];
                if (!o->live)
                        continue;
                /* an import holds the file it was made from, and so does a reader's import of a share */
                n += o->kind == BROKER_KIND_IMPORT && o->mem == mi;
                n += o->kind == BROKER_KIND_SHARE && !o->revoked && w->shares[o->reader_of].mem == mi;
        }
        for (size_t i = 0; i < w->n_shares; i++)
                n += w->shares[i].named && w->shares[i].mem == mi;
        /* and its own object while that lives */
        n += w->mems[mi].obj >= 0 && w->objs[w->mems[mi].obj].live;
        return n;
}

/* The kernel dropped the inodes nothing holds, and the broker read that (broker_process_events). */
static void settle(World *w)
{
        for (size_t i = 0; i < w->n_mems; i++)
                if (w->mems[i].state == MEM_LINGER && mem_refs(w, (int)i) == 0)
                        w->mems[i].state = MEM_GONE;
}

/* Would account @ai take @ch, as fits() decides: 0 or -EDQUOT. */
typedef struct Ask {
        uint64_t objects, fds;
        BrokerKind kind;
        uint32_t gpu_id;
        uint64_t bytes;
        bool foreign;
} Ask;

static int fits(const World *w, int ai, const Ask *ch)
{
        const BrokerAccount *a = &w->accts[ai];
        BrokerUsage u;
        uint64_t bytes = ch->bytes;

        expect_account(w, ai, &u);
        if (ch->objects && u.objects + ch->objects > a->max_handles)
                return -EDQUOT;
        if (ch->fds && (uint64_t)u.held_fds + ch->fds > a->max_fds)
                return -EDQUOT;
        switch (ch->kind) {
        case BROKER_KIND_DEVICE:
        case BROKER_KIND_VMM: {
                int gi = gpu_index(ch->gpu_id);
                uint64_t vram = u.device_bytes + u.vmm_bytes;
                if (gi >= 0 &&
                    (bytes > a->max_vram_gpu[gi] || u.vram_bytes[gi] > a->max_vram_gpu[gi] - bytes))
                        return -EDQUOT;
                if (bytes > a->max_vram || vram > a->max_vram - bytes)
                        return -EDQUOT;
                break;
        }
        case BROKER_KIND_HOST:
                if (bytes > a->max_host_one || bytes > a->max_host || u.host_bytes > a->max_host - bytes)
                        return -EDQUOT;
                break;
        case BROKER_KIND_MANAGED:
                if (bytes > a->max_managed || u.managed_bytes > a->max_managed - bytes)
                        return -EDQUOT;
                break;
        case BROKER_KIND_IMPORT:
                if (ch->foreign && (bytes > a->max_foreign_one || bytes > a->max_foreign ||
                                    u.foreign_bytes > a->max_foreign - bytes))
                        return -EDQUOT;
                break;
        default:
                break;
        }
        return 0;
}

static int client_fits(const World *w, int ci, const Ask *ch)
{
        return fits(w, w->clients[ci].acct, ch);
}

/* ---- the broker's books against the model ----------------------------------------------------------- */

static const Obj *find_handle(const World *w, int ci, uint64_t handle)
{
        for (size_t i = 0; i < w->n_objs; i++)
                if (w->objs[i].client == ci && nameable(&w->objs[i]) && w->objs[i].handle == handle)
                        return &w->objs[i];
        return NULL;
}

static void check_client(World *w, int ci)
{
        const Client *c = &w->clients[ci];
        BrokerObjInfo info[16];
        BrokerUsage got, want;
        size_t cursor = 0, named = 0, listed = 0;
        char who[32];

        snprintf(who, sizeof(who), "client %d", ci);
        broker_client_usage(c->bc, &got);
        expect_client(w, ci, &want);
        compare_usage(w, who, &got, &want);
        for (size_t i = 0; i < w->n_objs; i++)
                named += w->objs[i].client == ci && nameable(&w->objs[i]);
        if (broker_client_objects(c->bc) != named)
                fail(w, "%s names %zu objects in the broker's books, %zu in the model", who,
                     broker_client_objects(c->bc), named);
        if (broker_client_records(c->bc) != want.objects)
                fail(w, "%s has %" PRIu64 " records to tear down, %" PRIu64 " in the model", who,
                     broker_client_records(c->bc), want.objects);
        do {
                size_t n = broker_client_list(c->bc, &cursor, info, 16);
                for (size_t i = 0; i < n; i++) {
                        const Obj *o = find_handle(w, ci, info[i].handle);
                        if (!o)
                                fail(w, "%s lists handle 0x%" PRIx64 " (%s), which the model does not know",
                                     who, info[i].handle, kind_name(info[i].kind));
                        if (o->kind != info[i].kind || o->size != info[i].size || o->va != info[i].va)
                                fail(w,
                                     "%s lists handle 0x%" PRIx64 " as %s of %" PRIu64 " bytes at 0x%" PRIx64
                                     ", the model as %s of %" PRIu64 " at 0x%" PRIx64,
                                     who, info[i].handle, kind_name(info[i].kind), info[i].size, info[i].va,
                                     kind_name(o->kind), o->size, o->va);
                }
                listed += n;
        } while (cursor);
        if (listed != named)
                fail(w, "%s lists %zu objects, the model names %zu", who, listed, named);
}

/* What the fake driver holds against what the model says the broker asked of it. */
static void check_driver(World *w)
{
        uint64_t vram = 0, host = 0, imports = 0, grants = 0, managed = 0, contexts = 0;
        FakeCounts k;

        if (fake_violation(w->drv))
                fail(w, "the broker broke the driver's contract: %s", fake_violation(w->drv));
        fake_counts(w->drv, &k);
        for (size_t i = 0; i < w->n_objs; i++) {
                const Obj *o = &w->objs[i];
                if (!o->live)
                        continue;
                vram += o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_VMM;
                host += o->kind == BROKER_KIND_HOST;
                managed += o->kind == BROKER_KIND_MANAGED;
                imports += o->kind == BROKER_KIND_IMPORT;
                if (o->kind == BROKER_KIND_SHARE && !o->revoked) {
                        imports++;
                        grants += (uint64_t)__builtin_popcountll(o->reader_gpus);
                }
                if (o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_HOST) {
                        FakeMemInfo mi;
                        if (fake_mem_at(w->drv, o->va, &mi) < 0)
                                fail(w, "the driver has no memory at 0x%" PRIx64 " of %s handle 0x%" PRIx64,
                                     o->va, kind_name(o->kind), o->handle);
                        if (mi.mapped != o->mapped)
                                fail(w,
                                     "the %s memory at 0x%" PRIx64 " is mapped on GPUs 0x%" PRIx64
                                     " in the driver, 0x%" PRIx64 " in the model",
                                     kind_name(o->kind), o->va, mi.mapped, o->mapped);
                        if (mi.size != o->size)
                                fail(w,
                                     "the memory at 0x%" PRIx64 " is %" PRIu64
                                     " bytes in the driver, %" PRIu64,
                                     o->va, mi.size, o->size);
                }
        }
        for (size_t i = 0; i < w->n_maps; i++)
                for (int g = 0; w->maps[i].live && g < N_GPUS; g++)
                        grants += w->maps[i].access[g] != BROKER_ACCESS_NONE;
        for (size_t i = 0; i < w->n_shares; i++)
                vram += w->shares[i].named && w->shares[i].carry_mem;
        for (int ci = 0; ci < N_CLIENTS; ci++)
                contexts += w->clients[ci].ctx != 0;
        if (k.mems[FAKE_MEM_VRAM] != vram || k.mems[FAKE_MEM_HOST] != host ||
            k.mems[FAKE_MEM_IMPORT] != imports || k.grants != grants || k.managed != managed ||
            k.contexts != contexts || k.mems[FAKE_MEM_GTT])
                fail(w,
                     "the driver holds %" PRIu64 " VRAM, %" PRIu64 " host, %" PRIu64 " imports, %" PRIu64
                     " grants, %" PRIu64 " managed ranges, %" PRIu64 " contexts; the model says %" PRIu64
                     ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64,
                     k.mems[FAKE_MEM_VRAM], k.mems[FAKE_MEM_HOST], k.mems[FAKE_MEM_IMPORT], k.grants,
                     k.managed, k.contexts, vram, host, imports, grants, managed, contexts);
}

static void check_world(World *w)
{
        BrokerUsage got, want, sum = {0};

        for (int ci = 0; ci < N_CLIENTS; ci++)
                check_client(w, ci);
        for (int ai = 0; ai < N_ACCTS; ai++) {
                char who[32];
                snprintf(who, sizeof(who), "account %s", acct_names[ai]);
                broker_account_usage(&w->accts[ai], &got);
                expect_account(w, ai, &want);
                compare_usage(w, who, &got, &want);
        }
        broker_totals(w->b, &got);
        expect_totals(w, &want);
        compare_usage(w, "the totals", &got, &want);
        /* every charge is an account's: the accounts add up to the totals */
        for (int ai = 0; ai < N_ACCTS; ai++) {
                broker_account_usage(&w->accts[ai], &got);
                usage_sum(&sum, &got);
        }
        broker_totals(w->b, &got);
        compare_usage(w, "the accounts' sum", &sum, &got);
        check_driver(w);
}

/* ---- failures on purpose ----------------------------------------------------------------------------- */

static const int fault_errs[] = {-EIO, -ENOMEM, -ENOSPC, -EFAULT, -EPERM, -EBUSY, -EINVAL};

/*
 * Maybe make a call of one of @ops fail in the next broker call: the first, or a later one, which fails
 * after others of its kind went through (a broker call that makes several undoes them).
 */
static void fault_maybe(World *w, const FakeOp *ops, size_t n)
{
        w->fault.armed = false;
        if (n == 0 || !chance(w, 12))
                return;
        w->fault = (Fault){.armed = true,
                           .op = ops[below(w, n)],
                           .nth = chance(w, 70) ? 1 : 2 + (unsigned)below(w, 2),
                           .err = fault_errs[below(w, sizeof(fault_errs) / sizeof(fault_errs[0]))],
                           .fired_before = fake_faults_fired(w->drv)};
        fake_fail(w->drv, w->fault.op, w->fault.nth, w->fault.err);
}

/* Did the failure armed fire? It is disarmed either way. */
static bool fault_fired(World *w)
{
        bool fired;

        if (!w->fault.armed)
                return false;
        fake_fail_clear(w->drv);
        w->fault.armed = false;
        fired = fake_faults_fired(w->drv) != w->fault.fired_before;
        if (fired) {
                w->wk->stats.injected++;
                snprintf(w->fault_note, sizeof(w->fault_note), " [%s call %u failed with %d on purpose]",
                         fake_op_name(w->fault.op), w->fault.nth, w->fault.err);
        }
        return fired;
}

/* The call returned @r and said why in @why: is it @want? */
static void expect_rc(World *w, int r, int want, const Reason *why)
{
        w->last_rc = r;
        if (r != want)
                fail(w, "returned %d (%s), the model expects %d (%s)%s%s", r, strerror(-r), want,
                     strerror(-want), r < 0 ? ": " : "", r < 0 ? why->msg : "");
        if (r < 0) {
                w->wk->stats.errors++;
                if (!why->msg[0])
                        fail(w, "failed with %d (%s) without a reason", r, strerror(-r));
        }
}

/* The context a call of client @ci made in the fake driver, if it made one. */
static void note_ctx(World *w, int ci, unsigned before);

/*
 * After a broker call of client @ci that returned @r: its context noted, the failure injected expected where
 * it came, and @r checked against @want. True when the call went through.
 */
static bool outcome(World *w, int ci, unsigned ctx_before, int r, int want, const Reason *why)
{
        note_ctx(w, ci, ctx_before);
        if (fault_fired(w))
                want = w->fault.err;
        expect_rc(w, r, want, why);
        return r >= 0;
}

static void note_ctx(World *w, int ci, unsigned before)
{
        unsigned now = fake_ctx_last(w->drv);

        if (now == before)
                return;
        if (now != before + 1 || w->clients[ci].ctx)
                fail(w, "client %d has a new context (%u after %u) though it had %u", ci, now, before,
                     w->clients[ci].ctx);
        w->clients[ci].ctx = now;
}

/* ---- VA placement ----------------------------------------------------------------------------------- */

static bool window_free(const World *w, int ci, uint64_t va, uint64_t size)
{
        const Client *c = &w->clients[ci];

        if (va < c->base || size > WINDOW_SIZE || va - c->base > WINDOW_SIZE - size)
                return false;
        for (size_t i = 0; i < w->n_objs; i++) {
                const Obj *o = &w->objs[i];
                if (o->live && o->client == ci && o->va && o->kind != BROKER_KIND_VMM &&
                    o->kind != BROKER_KIND_IMPORT && o->kind != BROKER_KIND_SHARE && va < o->va + o->size &&
                    o->va < va + size)
                        return false;
        }
        return true;
}

/* What placing at a fixed [va, va+size) says: the window's bounds first, then what is there. */
static int fixed_want(const World *w, int ci, uint64_t va, uint64_t size)
{
        const Client *c = &w->clients[ci];

        if (va < c->base || size > WINDOW_SIZE || va - c->base > WINDOW_SIZE - size)
                return -EINVAL;
        return window_free(w, ci, va, size) ? 0 : -EADDRINUSE;
}

/* A fixed address to ask for: free, taken, outside the window or not aligned, and what placing it says. */
static uint64_t pick_fixed(World *w, int ci, uint64_t size, uint64_t align, int *ret_want)
{
        const Client *c = &w->clients[ci];
        unsigned how = (unsigned)below(w, 10);
        uint64_t va;

        if (how == 0) {
                *ret_want = -EINVAL;
                return c->base + WINDOW_SIZE + align * below(w, 4); /* outside */
        }
        if (how == 1 && align > PAGE) {
                *ret_want = -EINVAL;
                return c->base + align * below(w, 8) + PAGE; /* not aligned */
        }
        if (how <= 3) { /* over an object of its own, where it has one */
                int oi = PICK(w, w->objs, w->n_objs,
                              it->live && it->client == ci && it->va && it->va >= c->base &&
                                      it->va < c->base + WINDOW_SIZE && it->va % align == 0);
                if (oi >= 0) {
                        va = w->objs[oi].va;
                        *ret_want = fixed_want(w, ci, va, size);
                        return va;
                }
        }
        va = c->base + align * below(w, (WINDOW_SIZE - size) / align + 1);
        *ret_want = fixed_want(w, ci, va, size);
        return va;
}

static uint64_t default_align(uint64_t size)
{
        uint64_t a = PAGE;

        while (a < (2ull << 20) && size >= 2 * a)
                a <<= 1;
        return a;
}

/* The broker placed an object of @ci at [va, va+size): in the window, aligned, over nothing else. */
static void check_placed(World *w, int ci, uint64_t va, uint64_t size, uint64_t align, uint64_t fixed)
{
        if ((fixed && va != fixed) || va % align || !window_free(w, ci, va, size))
                fail(w,
                     "placed at 0x%" PRIx64 "+0x%" PRIx64 " (align 0x%" PRIx64 ", asked 0x%" PRIx64
                     "), not a free place of the window",
                     va, size, align, fixed);
}

/* ---- what happens to the model when the broker lets go of things ------------------------------------ */

/* A share ends (revoked, or its object went): its readers lose their imports, its publisher its charge; the
 * memory it held lingers while files of it live. */
static void share_end(World *w, int si)
{
        Share *s = &w->shares[si];

        s->named = false;
        for (size_t i = 0; i < w->n_objs; i++)
                if (w->objs[i].live && w->objs[i].kind == BROKER_KIND_SHARE && w->objs[i].reader_of == si)
                        w->objs[i].revoked = true;
        if (s->src >= 0) {
                w->objs[s->src].share = -1;
        } else if (s->held) {
                w->mems[s->mem].state = MEM_LINGER;
                w->mems[s->mem].payer = s->payer;
        }
        s->src = s->owner = -1;
        s->held = false;
        s->carry_mem = false;
}

/* The publisher's object goes: its share ends, or a persistent one takes the memory over. */
static void share_obj_gone(World *w, Obj *o)
{
        Share *s;

        if (o->share < 0)
                return;
        s = &w->shares[o->share];
        if (!s->persistent) {
                share_end(w, o->share);
                return;
        }
        s->held = true;
        s->payer = w->clients[o->client].acct;
        s->src = s->owner = -1;
        w->mems[o->mem].state = MEM_HELD;
        o->share = -1;
        o->share_kept = true;
}

/* The broker lets go of object @oi: its memory lingers where files of it went out. */
static void obj_gone(World *w, int oi)
{
        Obj *o = &w->objs[oi];

        share_obj_gone(w, o);
        if (o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_HOST || o->kind == BROKER_KIND_MANAGED ||
            o->kind == BROKER_KIND_VMM) {
                Mem *m = &w->mems[o->mem];
                if (!o->share_kept) {
                        m->state = o->handed_out ? MEM_LINGER : MEM_GONE;
                        m->payer = w->clients[o->client].acct;
                }
        }
        o->live = false;
}

/* A VMM handle or import nothing names or maps any more goes. */
static void phys_maybe_gone(World *w, int oi)
{
        if (w->objs[oi].client_refs == 0 && w->objs[oi].map_refs == 0)
                obj_gone(w, oi);
}

/* Is the file of memory @mi one the broker knows as its own (an import of it costs a handle only)? */
static bool mem_own(World *w, int mi)
{
        const Mem *m = &w->mems[mi];

        if (m->kind == BROKER_KIND_IMPORT)
                return false; /* the test's own file */
        /* a live object knows its files, lingering memory's are watched, and a persistent share that took
         * the memory over holds its file */
        return (m->obj >= 0 && w->objs[m->obj].live) || m->state == MEM_LINGER || m->state == MEM_HELD;
}

/* Does the GPU driver describe @mi's file as one of its dmabufs? Device and VMM memory's. */
static bool mem_driver_own(const World *w, int mi)
{
        return w->mems[mi].kind == BROKER_KIND_DEVICE || w->mems[mi].kind == BROKER_KIND_VMM;
}

/* ---- operations ------------------------------------------------------------------------------------- */

/* Mostly the client of the call before, so that a client builds up what its later calls work on. */
static int pick_client(World *w)
{
        if (!w->keep_focus && chance(w, 35))
                w->focus = (int)below(w, N_CLIENTS);
        w->keep_focus = false;
        return w->focus;
}

/* Instead of the call asked for, the one that makes what it works on, for the same client. */
static void instead(World *w, void (*op)(World *w))
{
        w->keep_focus = true;
        op(w);
}

/* Does client @ci have what a call works on? (Where it has not, the call that makes it comes first.) */
static bool has_obj(const World *w, int ci, BrokerKind kind)
{
        for (size_t i = 0; i < w->n_objs; i++)
                if (w->objs[i].client == ci && nameable(&w->objs[i]) && w->objs[i].kind == kind)
                        return true;
        return false;
}

static bool has_map(const World *w, int ci)
{
        for (size_t i = 0; i < w->n_maps; i++)
                if (w->maps[i].live && w->maps[i].client == ci)
                        return true;
        return false;
}

/* A handle of client @ci: mostly one it names that @pred takes, sometimes one it does not have. */
static uint64_t pick_handle(World *w, int ci, bool (*pred)(const Obj *o), int *ret_oi)
{
        int oi = PICK(w, w->objs, w->n_objs, it->client == ci && nameable(it) && (!pred || pred(it)));

        *ret_oi = oi;
        if (oi < 0 || chance(w, 4)) {
                *ret_oi = -1;
                return 0x5eed0000ull + below(w, 16); /* no such handle */
        }
        return w->objs[oi].handle;
}

static void op_alloc(World *w)
{
        static const uint32_t device_flags[] = {BROKER_FLAG_HOST_VISIBLE, BROKER_FLAG_COHERENT,
                                                BROKER_FLAG_UNCACHED, BROKER_FLAG_EXECUTABLE,
                                                BROKER_FLAG_READ_ONLY};
        int ci = pick_client(w), want = 0, r;
        Client *c = &w->clients[ci];
        BrokerAllocArgs a = {.numa_node = -1};
        BrokerAllocResult res = {.fd = -1, .import_fd = -1};
        uint32_t map[N_GPUS];
        uint64_t size, align = 0;
        Reason why = {""};
        unsigned before;
        int want_va = 0;

        a.kind = w->alloc_kind ? w->alloc_kind : (BrokerKind)(1 + below(w, 3));
        w->alloc_kind = 0;
        a.size = PAGE * (1 + below(w, 12));
        if (chance(w, 20))
                a.size -= below(w, PAGE - 1) + 1; /* not whole pages */
        if (chance(w, 2))
                a.size = chance(w, 50) ? 0 : WINDOW_SIZE + PAGE;
        a.gpu_id = a.kind == BROKER_KIND_DEVICE || chance(w, 50) ? pick_gpu(w) : 0;
        for (size_t i = 0; i < sizeof(device_flags) / sizeof(device_flags[0]); i++)
                if (chance(w, 20))
                        a.flags |= device_flags[i];
        if (a.kind == BROKER_KIND_HOST)
                a.flags &= ~(uint32_t)BROKER_FLAG_HOST_VISIBLE;
        if (a.kind == BROKER_KIND_MANAGED)
                a.flags &= BROKER_FLAG_COHERENT | BROKER_FLAG_READ_ONLY | BROKER_FLAG_EXECUTABLE;
        if (chance(w, 3))
                a.flags |= chance(w, 50) ? BROKER_FLAG_EXT_COHERENT : 1u << 12; /* refused */
        if (chance(w, 2))
                a.flags |= chance(w, 50) ? BROKER_FLAG_UNCACHED : BROKER_FLAG_HOST_VISIBLE;
        if (a.kind != BROKER_KIND_MANAGED ? chance(w, 25) : chance(w, 3)) {
                a.n_map_gpus = pick_gpus(w, map, N_GPUS);
                if (chance(w, 5) && a.n_map_gpus < N_GPUS)
                        map[a.n_map_gpus++] = map[0]; /* twice */
                a.map_gpus = map;
        }
        if (chance(w, 10))
                a.alignment = chance(w, 10) ? 3000 : PAGE << below(w, 6);

        /* what the broker checks, in its order */
        size = round_up(a.size, PAGE);
        if (a.size == 0)
                want = -EINVAL;
        else if (size > WINDOW_SIZE)
                want = -ENOMEM;
        else if (a.alignment && (a.alignment < PAGE || (a.alignment & (a.alignment - 1))))
                want = -EINVAL;
        else if ((a.flags & ~(uint32_t)_BROKER_FLAG_ALL) ||
                 ((a.flags & BROKER_FLAG_EXT_COHERENT) && !(a.flags & BROKER_FLAG_COHERENT)) ||
                 ((a.flags & BROKER_FLAG_EXT_COHERENT) && (a.flags & BROKER_FLAG_UNCACHED)))
                want = -EINVAL;
        else if (a.kind == BROKER_KIND_DEVICE && gpu_index(a.gpu_id) < 0)
                want = -ENODEV;
        else if (a.kind == BROKER_KIND_HOST && a.gpu_id && gpu_index(a.gpu_id) < 0)
                want = -ENODEV;
        else if (a.kind == BROKER_KIND_HOST &&
                 (a.flags & (BROKER_FLAG_CONTIGUOUS | BROKER_FLAG_HOST_VISIBLE)))
                want = -EINVAL;
        else if (a.kind == BROKER_KIND_MANAGED && a.n_map_gpus)
                want = -EINVAL;
        if (!want && a.kind == BROKER_KIND_DEVICE)
                size = round_up(size, w->gran);
        if (!want) {
                for (size_t i = 0; i < a.n_map_gpus && !want; i++) {
                        if (gpu_index(map[i]) < 0)
                                want = -ENODEV;
                        for (size_t k = 0; k < i && !want; k++)
                                if (map[k] == map[i])
                                        want = -EINVAL;
                }
        }
        if (!want && a.gpu_id)
                want = gpu_ok(w, ci, a.gpu_id);
        if (!want)
                want = gpus_ok(w, ci, map, a.n_map_gpus);
        if (!want) {
                bool fd = a.kind != BROKER_KIND_DEVICE || (w->fdps && (a.flags & BROKER_FLAG_HOST_VISIBLE));
                want = client_fits(
                        w, ci,
                        &(Ask){.objects = 1, .fds = fd, .kind = a.kind, .gpu_id = a.gpu_id, .bytes = size});
        }
        align = a.alignment ? a.alignment : default_align(size);
        if (a.kind == BROKER_KIND_DEVICE && align < w->gran)
                align = w->gran;
        if (!want && chance(w, 10)) {
                a.fixed_va = pick_fixed(w, ci, size, align, &want_va);
                want = want_va;
        }
        if (!want && a.kind == BROKER_KIND_MANAGED && !(w->caps & DRIVER_CAP_MANAGED))
                want = -EOPNOTSUPP;
        if (!want && a.kind == BROKER_KIND_MANAGED &&
            (a.flags & ~(uint32_t)(BROKER_FLAG_COHERENT | BROKER_FLAG_READ_ONLY | BROKER_FLAG_EXECUTABLE |
                                   BROKER_FLAG_EXT_COHERENT)))
                want = -EINVAL;

        describe(w,
                 "client %d alloc %s %" PRIu64 " bytes GPU %u flags 0x%x map %zu align %" PRIu64
                 " at 0x%" PRIx64,
                 ci, kind_name(a.kind), a.size, a.gpu_id, a.flags, a.n_map_gpus, a.alignment, a.fixed_va);
        if (!want) {
                static const FakeOp dev[] = {FAKE_OP_CTX_NEW, FAKE_OP_ALLOC_VRAM, FAKE_OP_MAP,
                                             FAKE_OP_EXPORT};
                static const FakeOp host[] = {FAKE_OP_REGISTER_HOST, FAKE_OP_MAP};
                static const FakeOp managed[] = {FAKE_OP_MANAGED_REGISTER};
                if (a.kind == BROKER_KIND_DEVICE)
                        fault_maybe(w, dev, 4);
                else if (a.kind == BROKER_KIND_HOST)
                        fault_maybe(w, host, 2);
                else
                        fault_maybe(w, managed, 1);
        }
        before = fake_ctx_last(w->drv);
        r = broker_alloc(c->bc, &a, &res, &why);
        if (!outcome(w, ci, before, r, want, &why))
                return;
        if (res.size != size)
                fail(w, "allocated %" PRIu64 " bytes, the model expects %" PRIu64, res.size, size);
        check_placed(w, ci, res.va, size, align, a.fixed_va);
        if ((res.fd >= 0) != (a.kind != BROKER_KIND_DEVICE || (a.flags & BROKER_FLAG_HOST_VISIBLE)) ||
            res.import_fd >= 0)
                fail(w, "handed out fd %d and import fd %d", res.fd, res.import_fd);

        int oi = obj_new(w, ci, a.kind, res.handle, size, a.kind == BROKER_KIND_MANAGED ? 0 : a.gpu_id);
        Obj *o = &w->objs[oi];
        o->va = res.va;
        o->flags = a.flags;
        o->mem = mem_new(w, a.kind, o->gpu_id, size);
        w->mems[o->mem].obj = oi;
        o->memfd = a.kind != BROKER_KIND_DEVICE;
        o->backing = a.kind == BROKER_KIND_DEVICE && w->fdps && (a.flags & BROKER_FLAG_HOST_VISIBLE);
        o->handed_out = res.fd >= 0;
        if (a.kind == BROKER_KIND_DEVICE)
                o->mapped = a.n_map_gpus ? mask_of(map, a.n_map_gpus) : mask_of(&a.gpu_id, 1);
        else if (a.kind == BROKER_KIND_HOST)
                o->mapped = a.n_map_gpus ? mask_of(map, a.n_map_gpus) : allowed(w, ci) & ((1u << N_GPUS) - 1);
        if (res.fd >= 0)
                fd_add(w, res.fd, o->mem, false);
}

static bool any_obj(const Obj *o)
{
        (void)o;
        return true;
}

/* What most frees, exports and publishes name: memory (a reservation, say, now and then). */
static bool is_memory(const Obj *o)
{
        return o->kind != BROKER_KIND_RESERVATION && o->kind != BROKER_KIND_SHARE;
}

static bool is_publishable(const Obj *o)
{
        return o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_HOST || o->kind == BROKER_KIND_VMM;
}

static bool is_mappable(const Obj *o);

/* Is @o published as a share that readers have open (not revoked)? Its end frees their imports, after @o's
 * memory: a refusal of those is left to the readers' GPU VMs, so the driver's frees are not failed there. */
static bool has_readers(const World *w, const Obj *o)
{
        for (size_t i = 0; o->share >= 0 && i < w->n_objs; i++)
                if (w->objs[i].live && w->objs[i].kind == BROKER_KIND_SHARE &&
                    w->objs[i].reader_of == o->share && !w->objs[i].revoked)
                        return true;
        return false;
}

static void op_free(World *w)
{
        int ci = pick_client(w), oi, want = 0, r;
        uint64_t h = pick_handle(w, ci, chance(w, 85) ? is_memory : any_obj, &oi);
        Obj *o = oi >= 0 ? &w->objs[oi] : NULL;
        Reason why = {""};
        bool readers = o && has_readers(w, o);

        describe(w, "client %d free 0x%" PRIx64 " (%s)", ci, h, o ? kind_name(o->kind) : "none");
        if (!o)
                want = -ENOENT;
        else if (o->kind == BROKER_KIND_RESERVATION)
                want = -EINVAL;
        /* a refused free leaves the object and its share as they were (where its share ends, its readers'
         * imports are freed after it, and what the driver refuses of those goes with the readers' GPU VMs:
         * not failed here) */
        if (!want && (o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_HOST) && !readers) {
                static const FakeOp ops[] = {FAKE_OP_UNMAP_ALL, FAKE_OP_FREE};
                fault_maybe(w, ops, 2);
        }
        /* a VMM handle or import that goes with this release: a refused free leaves it as it was */
        if (!want && (o->kind == BROKER_KIND_VMM || o->kind == BROKER_KIND_IMPORT) && o->client_refs == 1 &&
            o->map_refs == 0 && !readers) {
                static const FakeOp ops[] = {FAKE_OP_FREE};
                fault_maybe(w, ops, 1);
        }
        r = broker_mem_free(w->clients[ci].bc, h, &why);
        if (fault_fired(w)) {
                expect_rc(w, r, w->fault.err, &why);
                /* the driver refused: the memory stays, unmapped from its GPUs where the unmap went through
                 */
                if (w->fault.op == FAKE_OP_FREE && is_mappable(o))
                        o->mapped = 0;
                settle(w);
                return;
        }
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        if (o->kind == BROKER_KIND_VMM || o->kind == BROKER_KIND_IMPORT) {
                o->client_refs--;
                phys_maybe_gone(w, oi);
        } else {
                obj_gone(w, oi);
        }
        settle(w);
}

static bool is_mappable(const Obj *o)
{
        return o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_HOST;
}

static bool any_but_mappable(const Obj *o)
{
        return !is_mappable(o);
}

static void op_map(World *w, bool unmap)
{
        int ci = pick_client(w), oi, want = 0, r;
        uint64_t h = pick_handle(w, ci, chance(w, 90) ? is_mappable : any_but_mappable, &oi);
        Obj *o = oi >= 0 ? &w->objs[oi] : NULL;
        uint32_t ids[N_GPUS + 1];
        size_t n = pick_gpus(w, ids, N_GPUS);
        Reason why = {""};

        if (chance(w, 5) && n < N_GPUS)
                ids[n++] = chance(w, 50) ? ids[0] : 999;
        if (unmap && chance(w, 30))
                n = 0;
        if (!unmap && chance(w, 2))
                n = 0;
        describe(w, "client %d %s 0x%" PRIx64 " (%s) on %zu GPUs (%u...)", ci, unmap ? "unmap" : "map", h,
                 o ? kind_name(o->kind) : "none", n, n ? ids[0] : 0);
        if (!o)
                want = -ENOENT;
        else if (!unmap &&
                 (o->kind == BROKER_KIND_MANAGED || o->kind == BROKER_KIND_SHARE || !is_mappable(o)))
                want = -EINVAL;
        else if (unmap && !is_mappable(o))
                want = -EINVAL;
        else if (!unmap && n == 0)
                want = -EINVAL;
        else if (!unmap)
                want = gpus_ok(w, ci, ids, n);
        else if (n > 0) {
                for (size_t i = 0; i < n && !want; i++) {
                        if (gpu_index(ids[i]) < 0)
                                want = -ENODEV;
                        for (size_t k = 0; k < i && !want; k++)
                                if (ids[k] == ids[i])
                                        want = -EINVAL;
                }
                for (size_t i = 0; i < n && !want; i++)
                        if (!(o->mapped & (1ull << gpu_index(ids[i]))))
                                want = -EINVAL;
        }
        if (!want) {
                FakeOp op = !unmap ? FAKE_OP_MAP : n ? FAKE_OP_UNMAP : FAKE_OP_UNMAP_ALL;
                fault_maybe(w, &op, 1);
        }
        r = unmap ? broker_unmap(w->clients[ci].bc, h, ids, n, &why)
                  : broker_map(w->clients[ci].bc, h, ids, n, &why);
        if (fault_fired(w))
                want = w->fault.err;
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        if (!unmap)
                o->mapped |= mask_of(ids, n);
        else if (n == 0)
                o->mapped = 0;
        else
                o->mapped &= ~mask_of(ids, n);
}

static void op_vmm_reserve(World *w)
{
        int ci = pick_client(w), want = 0, r;
        uint64_t size = PAGE * (4 + below(w, 60)), alignment = 0, fixed = 0, va = 0, align;
        Reason why = {""};

        if (chance(w, 10))
                size = 2ull << 20;
        if (chance(w, 3))
                size = chance(w, 50) ? 0 : size + 100;
        if (chance(w, 10))
                alignment = chance(w, 10) ? 6000 : PAGE << below(w, 9);
        align = alignment ? alignment : size >= (2ull << 20) ? 2ull << 20 : PAGE;
        if (size == 0 || size % PAGE)
                want = -EINVAL;
        else if (alignment && (alignment < PAGE || (alignment & (alignment - 1))))
                want = -EINVAL;
        else
                want = client_fits(w, ci, &(Ask){.objects = 1});
        if (!want && chance(w, 15))
                fixed = pick_fixed(w, ci, size, align, &want);
        describe(w, "client %d vmm_reserve %" PRIu64 " align %" PRIu64 " at 0x%" PRIx64, ci, size, alignment,
                 fixed);
        r = broker_vmm_reserve(w->clients[ci].bc, size, alignment, fixed, &va, &why);
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        check_placed(w, ci, va, size, align, fixed);
        int oi = obj_new(w, ci, BROKER_KIND_RESERVATION, 0, size, 0);
        w->objs[oi].va = va;
        /* the handle is the broker's: found by its VA */
        BrokerObjInfo info[64];
        size_t cursor = 0, n;
        do {
                n = broker_client_list(w->clients[ci].bc, &cursor, info, 64);
                for (size_t i = 0; i < n; i++)
                        if (info[i].kind == BROKER_KIND_RESERVATION && info[i].va == va)
                                w->objs[oi].handle = info[i].handle;
        } while (cursor);
}

static size_t maps_in(const World *w, int res)
{
        size_t n = 0;

        for (size_t i = 0; i < w->n_maps; i++)
                n += w->maps[i].live && w->maps[i].res == res;
        return n;
}

static bool is_reservation(const Obj *o)
{
        return o->kind == BROKER_KIND_RESERVATION;
}

static void op_vmm_free(World *w)
{
        int ci = pick_client(w), oi, want = 0, r;
        Reason why = {""};
        uint64_t va, size;

        pick_handle(w, ci, is_reservation, &oi);
        va = oi >= 0 ? w->objs[oi].va : w->clients[ci].base + PAGE * below(w, 64);
        size = oi >= 0 ? w->objs[oi].size : PAGE;
        if (chance(w, 5))
                size += PAGE;
        if (oi < 0) {
                /* an address where no reservation starts */
                for (size_t i = 0; i < w->n_objs; i++)
                        if (w->objs[i].live && w->objs[i].client == ci &&
                            w->objs[i].kind == BROKER_KIND_RESERVATION && w->objs[i].va == va)
                                oi = (int)i;
        }
        if (oi < 0)
                want = -ENOENT;
        else if (size != w->objs[oi].size)
                want = -EINVAL;
        else if (maps_in(w, oi))
                want = -EBUSY;
        describe(w, "client %d vmm_free 0x%" PRIx64 "+0x%" PRIx64, ci, va, size);
        r = broker_vmm_free(w->clients[ci].bc, va, size, &why);
        expect_rc(w, r, want, &why);
        if (r == 0)
                obj_gone(w, oi);
}

static void op_vmm_create(World *w)
{
        int ci = pick_client(w), want = 0, r;
        uint64_t size = round_up(PAGE * (1 + below(w, 16)), w->gran), handle = 0;
        uint32_t gpu = pick_gpu(w), flags = 0;
        int import_fd = -1;
        Reason why = {""};
        unsigned before;

        if (chance(w, 20))
                flags |= BROKER_FLAG_HOST_VISIBLE;
        if (chance(w, 10))
                flags |= BROKER_FLAG_READ_ONLY;
        if (chance(w, 3))
                flags |= BROKER_FLAG_EXT_COHERENT;
        if (chance(w, 3))
                size = chance(w, 50) ? 0 : size + (w->gran > PAGE && chance(w, 50) ? PAGE : 1);
        if (size == 0 || size % PAGE || size % w->gran)
                want = -EINVAL;
        else if ((want = gpu_ok(w, ci, gpu)) < 0)
                ;
        else if (flags & BROKER_FLAG_EXT_COHERENT)
                want = -EINVAL;
        else
                want = client_fits(w, ci,
                                   &(Ask){.objects = 1,
                                          .fds = w->fdps && (flags & BROKER_FLAG_HOST_VISIBLE),
                                          .kind = BROKER_KIND_VMM,
                                          .gpu_id = gpu,
                                          .bytes = size});
        describe(w, "client %d vmm_create %" PRIu64 " on GPU %u flags 0x%x", ci, size, gpu, flags);
        if (!want) {
                static const FakeOp ops[] = {FAKE_OP_CTX_NEW, FAKE_OP_ALLOC_VRAM};
                fault_maybe(w, ops, 2);
        }
        before = fake_ctx_last(w->drv);
        r = broker_vmm_create(w->clients[ci].bc, size, gpu, flags, &handle, &import_fd, &why);
        if (!outcome(w, ci, before, r, want, &why))
                return;
        if (import_fd >= 0)
                fail(w, "an import fd %d without DRIVER_CAP_CLIENT_MAPS", import_fd);
        int oi = obj_new(w, ci, BROKER_KIND_VMM, handle, size, gpu);
        Obj *o = &w->objs[oi];
        o->flags = flags;
        o->client_refs = 1;
        o->backing = w->fdps && (flags & BROKER_FLAG_HOST_VISIBLE);
        o->mem = mem_new(w, BROKER_KIND_VMM, gpu, size);
        w->mems[o->mem].obj = oi;
}

static bool is_phys(const Obj *o)
{
        return o->kind == BROKER_KIND_VMM || o->kind == BROKER_KIND_IMPORT;
}

/* The reservation of @ci's window that holds [va, va+size) whole, or -1. */
static int reservation_holding(const World *w, int ci, uint64_t va, uint64_t size)
{
        for (size_t i = 0; i < w->n_objs; i++) {
                const Obj *o = &w->objs[i];
                if (o->live && o->client == ci && o->kind == BROKER_KIND_RESERVATION && va >= o->va &&
                    va < o->va + o->size)
                        return va + size <= o->va + o->size ? (int)i : -1;
        }
        return -1;
}

static bool in_window(const World *w, int ci, uint64_t va, uint64_t size)
{
        uint64_t lo = w->clients[ci].base;
        return va >= lo && size <= WINDOW_SIZE && va - lo <= WINDOW_SIZE - size;
}

/* The live mapping of reservation @res that holds @va, or -1. */
static int map_at(const World *w, int res, uint64_t va)
{
        for (size_t i = 0; i < w->n_maps; i++)
                if (w->maps[i].live && w->maps[i].res == res && va >= w->maps[i].va &&
                    va < w->maps[i].va + w->maps[i].size)
                        return (int)i;
        return -1;
}

static void op_vmm_create(World *w);
static void op_vmm_reserve(World *w);

static void op_vmm_map(World *w)
{
        int ci = pick_client(w), pi, want = 0, r, res;

        if (!has_obj(w, ci, BROKER_KIND_RESERVATION) && chance(w, 90)) {
                instead(w, op_vmm_reserve);
                return;
        }
        if (!has_obj(w, ci, BROKER_KIND_VMM) && !has_obj(w, ci, BROKER_KIND_IMPORT) && chance(w, 90)) {
                instead(w, op_vmm_create);
                return;
        }

        uint64_t h = pick_handle(w, ci, is_phys, &pi), va, size, offset = 0;
        Reason why = {""};
        const Obj *p = pi >= 0 ? &w->objs[pi] : NULL;

        res = PICK(w, w->objs, w->n_objs,
                   it->live && it->client == ci && it->kind == BROKER_KIND_RESERVATION);
        size = p ? PAGE * (1 + below(w, p->size / PAGE)) : PAGE;
        if (p && chance(w, 30))
                offset = PAGE * below(w, (p->size - size) / PAGE + 1);
        va = res >= 0 ? w->objs[res].va + PAGE * below(w, w->objs[res].size / PAGE) : w->clients[ci].base;
        if (res >= 0 && chance(w, 80)) {
                /* mostly where it fits: the first free gap of the reservation, the size cut to it */
                const Obj *rv = &w->objs[res];
                for (uint64_t at = rv->va; at < rv->va + rv->size; at += PAGE) {
                        int m = map_at(w, res, at);
                        if (m >= 0) {
                                at = w->maps[m].va + w->maps[m].size - PAGE;
                                continue;
                        }
                        uint64_t end = at;
                        while (end < rv->va + rv->size && map_at(w, res, end) < 0)
                                end += PAGE;
                        va = at;
                        if (size > end - at)
                                size = end - at;
                        break;
                }
        }
        if (chance(w, 3))
                va += 100;
        if (chance(w, 3))
                size += PAGE; /* beyond the handle, maybe */
        describe(w, "client %d vmm_map 0x%" PRIx64 "+0x%" PRIx64 " offset 0x%" PRIx64 " handle 0x%" PRIx64,
                 ci, va, size, offset, h);
        if (!p)
                want = -ENOENT;
        else if (va % PAGE)
                want = -EINVAL;
        else if (offset > p->size || size > p->size - offset)
                want = -EINVAL;
        else if (!in_window(w, ci, va, size) || (res = reservation_holding(w, ci, va, size)) < 0)
                want = -EINVAL;
        else if ((want = client_fits(w, ci, &(Ask){.objects = 1})) < 0)
                ;
        else {
                for (size_t i = 0; i < w->n_maps; i++)
                        if (w->maps[i].live && w->maps[i].res == res &&
                            va < w->maps[i].va + w->maps[i].size && w->maps[i].va < va + size)
                                want = -EADDRINUSE;
        }
        r = broker_vmm_map(w->clients[ci].bc, va, size, offset, h, &why);
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        if (w->n_maps == MAX_MAPS)
                fail(w, "the model is out of mapping records");
        w->maps[w->n_maps++] = (Map){.live = true,
                                     .client = ci,
                                     .res = res,
                                     .phys = pi,
                                     .va = va,
                                     .size = size,
                                     .offset = offset,
                                     .cpu_access = BROKER_ACCESS_NONE};
        w->objs[pi].map_refs++;
}

/* The mappings of one reservation of @ci that lie in [va, va+size), in address order; -EINVAL as
 * covered_maps() refuses a range, else how many. */
static int covered(World *w, int ci, uint64_t va, uint64_t size, int *out, size_t cap)
{
        int res, n = 0;

        if (size == 0 || !in_window(w, ci, va, size) || (res = reservation_holding(w, ci, va, size)) < 0)
                return -EINVAL;
        for (uint64_t at = va;;) {
                int next = -1;
                for (size_t i = 0; i < w->n_maps; i++) {
                        const Map *m = &w->maps[i];
                        if (m->live && m->res == res && m->va >= at && m->va < va + size &&
                            (next < 0 || m->va < w->maps[next].va))
                                next = (int)i;
                }
                if (next < 0)
                        break;
                if (w->maps[next].va + w->maps[next].size > va + size)
                        return -EINVAL;
                if ((size_t)n == cap)
                        return -E2BIG;
                out[n++] = next;
                at = w->maps[next].va + w->maps[next].size;
        }
        int first = map_at(w, res, va);
        if (first >= 0 && w->maps[first].va != va)
                return -EINVAL;
        return n ? n : -EINVAL;
}

/* A range of whole mappings of one reservation, mostly; sometimes one that cuts a mapping. */
static void pick_range(World *w, int ci, uint64_t *ret_va, uint64_t *ret_size)
{
        int mi = PICK(w, w->maps, w->n_maps, it->live && it->client == ci);
        uint64_t va, end;

        if (mi < 0) {
                *ret_va = w->clients[ci].base + PAGE * below(w, 16);
                *ret_size = PAGE;
                return;
        }
        va = w->maps[mi].va;
        end = va + w->maps[mi].size;
        /* and the mappings after it, now and then */
        while (chance(w, 30)) {
                int next = map_at(w, w->maps[mi].res, end);
                if (next < 0) {
                        uint64_t best = UINT64_MAX;
                        for (size_t i = 0; i < w->n_maps; i++)
                                if (w->maps[i].live && w->maps[i].res == w->maps[mi].res &&
                                    w->maps[i].va >= end && w->maps[i].va < best) {
                                        best = w->maps[i].va;
                                        next = (int)i;
                                }
                }
                if (next < 0)
                        break;
                end = w->maps[next].va + w->maps[next].size;
        }
        /* now and then a range that cuts a mapping at its end or starts inside one */
        if (chance(w, 5))
                end += PAGE;
        if (chance(w, 8) && end - va > PAGE)
                va += PAGE;
        *ret_va = va;
        *ret_size = end - va;
}

/* The mapping @m goes: its GPU access is gone, its record refunded, and its handle with it if nothing names
 * or maps that any more. */
static void map_gone(World *w, int mi)
{
        Map *m = &w->maps[mi];

        m->live = false;
        for (int g = 0; g < N_GPUS; g++)
                m->access[g] = BROKER_ACCESS_NONE;
        w->objs[m->phys].map_refs--;
        phys_maybe_gone(w, m->phys);
}

static unsigned grants_of(const Map *m)
{
        unsigned n = 0;

        for (int g = 0; g < N_GPUS; g++)
                n += m->access[g] != BROKER_ACCESS_NONE;
        return n;
}

static void op_vmm_map(World *w);

static void op_vmm_unmap(World *w)
{
        int ci = pick_client(w), want, r, maps[64];
        uint64_t va, size;
        Reason why = {""};
        FakeOp ops[2];
        size_t n_ops = 0;
        const Obj *phys;

        if (!has_map(w, ci) && chance(w, 90)) {
                instead(w, op_vmm_map);
                return;
        }

        pick_range(w, ci, &va, &size);
        describe(w, "client %d vmm_unmap 0x%" PRIx64 "+0x%" PRIx64, ci, va, size);
        want = covered(w, ci, va, size, maps, 64);
        phys = want == 1 ? &w->objs[w->maps[maps[0]].phys] : NULL;
        /* a revoke the driver refuses stops the unmap there; one that is the only grant of the only mapping
         * leaves nothing changed */
        if (want == 1 && grants_of(&w->maps[maps[0]]) == 1)
                ops[n_ops++] = FAKE_OP_REVOKE;
        /* the mapping is the last of a released handle, which goes with it: where the driver refuses to free
         * its memory, the handle and the mapping stay, the mapping's GPU access gone */
        if (want == 1 && !has_readers(w, phys) && phys->client_refs == 0 && phys->map_refs == 1)
                ops[n_ops++] = FAKE_OP_FREE;
        fault_maybe(w, ops, n_ops);
        r = broker_vmm_unmap(w->clients[ci].bc, va, size, &why);
        if (fault_fired(w)) {
                expect_rc(w, r, w->fault.err, &why);
                if (w->fault.op == FAKE_OP_FREE)
                        for (int g = 0; g < N_GPUS; g++)
                                w->maps[maps[0]].access[g] = BROKER_ACCESS_NONE;
                return;
        }
        expect_rc(w, r, want < 0 ? want : 0, &why);
        if (r < 0)
                return;
        for (int i = 0; i < want; i++)
                map_gone(w, maps[i]);
        settle(w);
}

static void op_vmm_release(World *w)
{
        int ci = pick_client(w), oi, want = 0, r;
        uint64_t h = pick_handle(w, ci, chance(w, 90) ? is_phys : NULL, &oi);
        Reason why = {""};

        describe(w, "client %d vmm_release 0x%" PRIx64, ci, h);
        if (oi < 0 || !is_phys(&w->objs[oi]))
                want = -ENOENT;
        /* its last name, mapped nowhere: a refused free leaves it as it was */
        if (!want && w->objs[oi].client_refs == 1 && w->objs[oi].map_refs == 0 &&
            !has_readers(w, &w->objs[oi])) {
                static const FakeOp ops[] = {FAKE_OP_FREE};
                fault_maybe(w, ops, 1);
        }
        r = broker_vmm_release(w->clients[ci].bc, h, &why);
        if (fault_fired(w)) {
                expect_rc(w, r, w->fault.err, &why);
                return;
        }
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        w->objs[oi].client_refs--;
        phys_maybe_gone(w, oi);
        settle(w);
}

static void op_vmm_retain(World *w)
{
        if (!has_map(w, w->focus) && chance(w, 80)) {
                instead(w, op_vmm_map);
                return;
        }
        int ci = pick_client(w), mi = PICK(w, w->maps, w->n_maps, it->live && it->client == ci), want = 0, r;
        uint64_t va =
                mi >= 0 ? w->maps[mi].va + PAGE * below(w, w->maps[mi].size / PAGE) : w->clients[ci].base;
        uint64_t handle = 0;
        Reason why = {""};
        int res;

        if (mi < 0 || chance(w, 5)) {
                va = w->clients[ci].base + PAGE * below(w, 256);
                res = reservation_holding(w, ci, va, 1);
                mi = res >= 0 ? map_at(w, res, va) : -1;
        }
        describe(w, "client %d vmm_retain 0x%" PRIx64, ci, va);
        if (mi < 0)
                want = -EINVAL;
        r = broker_vmm_retain(w->clients[ci].bc, va, &handle, &why);
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        Obj *p = &w->objs[w->maps[mi].phys];
        if (handle != p->handle)
                fail(w, "retained handle 0x%" PRIx64 ", the mapping maps 0x%" PRIx64, handle, p->handle);
        p->client_refs++;
}

/* Does the driver make a file for @o's memory the first time it is exported or granted (one more fd)? */
static bool file_on_export(const World *w, const Obj *o)
{
        return w->fdps && !o->backing && !o->memfd &&
               (o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_VMM);
}

/* One driver call of a simulated broker call: does the failure armed for @op hit it? @calls counts them. */
static bool sim_call(World *w, FakeOp op, unsigned *calls, bool *spent)
{
        if (!w->fault.armed || w->fault.op != op || *spent || ++*calls != w->fault.nth)
                return false;
        *spent = true;
        return true;
}

/* A grant or a CPU file of @p's memory: the fd the driver's file may cost is charged first, then the driver
 * is called. False where either fails, *@ret_r saying how. */
static bool sim_with_file(World *w, int ci, Obj *p, FakeOp op, unsigned *calls, bool *spent, int *ret_r)
{
        bool taken = file_on_export(w, p);

        if (taken && (*ret_r = client_fits(w, ci, &(Ask){.fds = 1})) < 0)
                return false;
        if (sim_call(w, op, calls, spent)) {
                *ret_r = w->fault.err;
                return false;
        }
        p->backing |= taken;
        return true;
}

static void op_set_access(World *w)
{
        int ci = pick_client(w), want = 0, r, maps[64], n_maps = 0;

        if (!has_map(w, ci) && chance(w, 90)) {
                instead(w, op_vmm_map);
                return;
        }
        BrokerAccess d[4];
        BrokerCpuMap cpu[BROKER_MAX_CPU_MAPS];
        size_t n = 1 + below(w, 3), n_cpu = 0;
        const BrokerAccess *cpu_desc = NULL;
        bool any_gpu = false;
        uint64_t va, size;
        Reason why = {""};
        unsigned before;

        pick_range(w, ci, &va, &size);
        for (size_t i = 0; i < n; i++) {
                static const int acc[] = {BROKER_ACCESS_NONE, BROKER_ACCESS_READ, BROKER_ACCESS_READ_WRITE};
                d[i].gpu_id = chance(w, 25) ? 0 : pick_gpu(w);
                d[i].access = chance(w, 2) ? 2 : acc[below(w, 3)];
        }
        describe(w, "client %d vmm_set_access 0x%" PRIx64 "+0x%" PRIx64 " %u:%d %u:%d %u:%d (%zu)", ci, va,
                 size, d[0].gpu_id, d[0].access, n > 1 ? d[1].gpu_id : 0, n > 1 ? d[1].access : 0,
                 n > 2 ? d[2].gpu_id : 0, n > 2 ? d[2].access : 0, n);
        for (size_t i = 0; i < n && !want; i++) {
                if (d[i].access != BROKER_ACCESS_NONE && d[i].access != BROKER_ACCESS_READ &&
                    d[i].access != BROKER_ACCESS_READ_WRITE)
                        want = -EINVAL;
                else if (d[i].gpu_id && d[i].access == BROKER_ACCESS_NONE && gpu_index(d[i].gpu_id) < 0)
                        want = -ENODEV;
                else if (d[i].gpu_id && d[i].access != BROKER_ACCESS_NONE)
                        want = gpu_ok(w, ci, d[i].gpu_id);
                for (size_t k = 0; k < i && !want; k++)
                        if (d[k].gpu_id == d[i].gpu_id)
                                want = -EINVAL;
                if (d[i].gpu_id == 0)
                        cpu_desc = &d[i];
                else
                        any_gpu = true;
        }
        if (!want && any_gpu && !(w->caps & DRIVER_CAP_VA_GRANTS))
                want = -EOPNOTSUPP;
        if (!want) {
                n_maps = covered(w, ci, va, size, maps, 64);
                if (n_maps < 0)
                        want = n_maps;
        }
        for (int i = 0; !want && i < n_maps; i++)
                for (size_t k = 0; k < n; k++)
                        if (d[k].access == BROKER_ACCESS_READ_WRITE &&
                            obj_read_only(&w->objs[w->maps[maps[i]].phys]))
                                want = -EACCES;
        if (!want && cpu_desc && cpu_desc->access != BROKER_ACCESS_NONE && n_maps > BROKER_MAX_CPU_MAPS)
                want = -E2BIG;
        if (!want) {
                static const FakeOp ops[] = {FAKE_OP_CTX_NEW, FAKE_OP_GRANT, FAKE_OP_REVOKE, FAKE_OP_EXPORT};
                fault_maybe(w, ops, 4);
        }

        /* the broker's loop, step by step: grants, then the CPU's files; a failure puts the old grants back
         */
        int old[64][N_GPUS];
        bool spent = false, failed = false;
        unsigned calls = 0; /* of the operation that fails */
        int sim_r = 0, n_files = 0;
        struct {
                int mem;
                bool ro;
        } files[BROKER_MAX_CPU_MAPS];
        for (int i = 0; !want && i < n_maps; i++)
                memcpy(old[i], w->maps[maps[i]].access, sizeof(old[i]));
        if (!want && (w->caps & DRIVER_CAP_PRIVATE_VM) && !w->clients[ci].ctx &&
            sim_call(w, FAKE_OP_CTX_NEW, &calls, &spent)) {
                failed = true;
                sim_r = w->fault.err;
        }
        for (int i = 0; !want && !failed && i < n_maps; i++) {
                Map *m = &w->maps[maps[i]];
                Obj *p = &w->objs[m->phys];
                for (size_t k = 0; k < n && !failed; k++) {
                        int g = gpu_index(d[k].gpu_id);
                        if (d[k].gpu_id == 0 || m->access[g] == d[k].access)
                                continue;
                        if (m->access[g] != BROKER_ACCESS_NONE) {
                                if (sim_call(w, FAKE_OP_REVOKE, &calls, &spent)) {
                                        failed = true;
                                        sim_r = w->fault.err;
                                        break;
                                }
                                m->access[g] = BROKER_ACCESS_NONE;
                        }
                        if (d[k].access == BROKER_ACCESS_NONE)
                                continue;
                        if (!sim_with_file(w, ci, p, FAKE_OP_GRANT, &calls, &spent, &sim_r)) {
                                failed = true;
                                break;
                        }
                        m->access[g] = d[k].access;
                }
        }
        for (int i = 0; !want && !failed && cpu_desc && cpu_desc->access != BROKER_ACCESS_NONE && i < n_maps;
             i++) {
                Obj *p = &w->objs[w->maps[maps[i]].phys];
                if (!sim_with_file(w, ci, p, FAKE_OP_EXPORT, &calls, &spent, &sim_r)) {
                        failed = true;
                        break;
                }
                /* memory sealed read-only takes no new writable mapping */
                if (cpu_desc->access == BROKER_ACCESS_READ_WRITE && w->mems[p->mem].sealed) {
                        failed = true;
                        sim_r = -EPERM;
                        break;
                }
                p->handed_out = true;
                files[n_files].mem = p->mem;
                files[n_files++].ro = cpu_desc->access != BROKER_ACCESS_READ_WRITE;
        }
        if (failed) /* rolled back: every GPU's access as it was; files the driver made stay */
                for (int i = 0; i < n_maps; i++)
                        memcpy(w->maps[maps[i]].access, old[i], sizeof(old[i]));

        before = fake_ctx_last(w->drv);
        r = broker_vmm_set_access(w->clients[ci].bc, va, size, d, n, cpu, &n_cpu, &why);
        note_ctx(w, ci, before);
        if (fault_fired(w) != (spent && failed && sim_r == w->fault.err))
                fail(w, "the failure injected in %s %s, the model says it %s", fake_op_name(w->fault.op),
                     spent && failed ? "did not come" : "came",
                     spent && failed ? "should have" : "should not");
        expect_rc(w, r, want ? want : failed ? sim_r : 0, &why);
        if (r < 0)
                return;
        if (n_cpu != (size_t)n_files)
                fail(w, "%zu CPU files handed out, the model expects %d", n_cpu, n_files);
        for (size_t i = 0; i < n_cpu; i++)
                fd_add(w, cpu[i].fd, files[i].mem, files[i].ro);
        for (int i = 0; cpu_desc && i < n_maps; i++)
                w->maps[maps[i]].cpu_access = cpu_desc->access;
}

static void op_get_access(World *w)
{
        if (!has_map(w, w->focus) && chance(w, 80)) {
                instead(w, op_vmm_map);
                return;
        }
        int ci = pick_client(w), mi = PICK(w, w->maps, w->n_maps, it->live && it->client == ci), want = 0, r;
        uint32_t gpu = chance(w, 25) ? 0 : pick_gpu(w);
        uint64_t va = mi >= 0 ? w->maps[mi].va : w->clients[ci].base;
        int access = -1, res;
        Reason why = {""};

        res = reservation_holding(w, ci, va, 1);
        mi = res >= 0 ? map_at(w, res, va) : -1;
        describe(w, "client %d vmm_get_access 0x%" PRIx64 " GPU %u", ci, va, gpu);
        if (gpu && gpu_index(gpu) < 0)
                want = -ENODEV;
        else if (mi < 0)
                want = -EINVAL;
        r = broker_vmm_get_access(w->clients[ci].bc, va, gpu, &access, &why);
        expect_rc(w, r, want, &why);
        if (r != 0 || mi < 0)
                return;
        /* r == 0: the GPU, when named, is one of the model's (else -ENODEV above) */
        int gi = gpu ? gpu_index(gpu) : -1, model = gi >= 0 ? w->maps[mi].access[gi] : w->maps[mi].cpu_access;
        if (access != model)
                fail(w, "access %d, the model says %d", access, model);
}

static void op_export(World *w)
{
        int ci = pick_client(w), oi, want = 0, r, fd = -1;
        uint64_t h = pick_handle(w, ci, chance(w, 90) ? is_memory : NULL, &oi), size = 0;
        bool ro = chance(w, 25);
        Obj *o = oi >= 0 ? &w->objs[oi] : NULL;
        Reason why = {""};
        bool taken = false;

        describe(w, "client %d export 0x%" PRIx64 " (%s)%s", ci, h, o ? kind_name(o->kind) : "none",
                 ro ? " read-only" : "");
        if (!o)
                want = -ENOENT;
        else if (o->kind == BROKER_KIND_RESERVATION || o->kind == BROKER_KIND_SHARE)
                want = -EINVAL;
        else if (!o->memfd && (taken = file_on_export(w, o)))
                want = client_fits(w, ci, &(Ask){.fds = 1});
        if (!want && !o->memfd) {
                static const FakeOp ops[] = {FAKE_OP_EXPORT};
                fault_maybe(w, ops, 1);
        }
        r = broker_export(w->clients[ci].bc, h, ro, &fd, &size, &why);
        if (fault_fired(w)) {
                want = w->fault.err;
        } else if (!want) {
                /* the file made, it is sealed when handed out read-only, or refused read-write if it was */
                want = ro || obj_read_only(o) ? mem_seal(w, o->mem) : w->mems[o->mem].sealed ? -EPERM : 0;
                o->backing |= taken;
        }
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        if (size != o->size)
                fail(w, "exported %" PRIu64 " bytes of a %" PRIu64 "-byte object", size, o->size);
        o->backing |= taken;
        o->handed_out = true;
        /* an import's file is the memory it imported */
        fd_add(w, fd, o->mem, ro || obj_read_only(o));
}

/* A file the test makes itself: memory gpumemd never saw. */
static int foreign_file(World *w, uint64_t *ret_size, bool *ret_ro)
{
        uint64_t size = PAGE * (1 + below(w, 8)) - (chance(w, 20) ? below(w, PAGE - 1) + 1 : 0);
        int fd = memfd_create("test-foreign", MFD_CLOEXEC);

        if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
                fail(w, "cannot make a file: %s", strerror(errno));
        *ret_ro = chance(w, 20);
        if (*ret_ro) {
                char path[64];
                int ro;
                snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
                ro = open(path, O_RDONLY | O_CLOEXEC);
                if (ro < 0)
                        fail(w, "cannot open a file again: %s", strerror(errno));
                close(fd);
                fd = ro;
        }
        *ret_size = round_up(size, PAGE);
        return fd;
}

static void op_import(World *w)
{
        int ci = pick_client(w), fi = PICK(w, w->fds, w->n_fds, it->open), want = 0, r, fd, mi;
        uint32_t gpu = chance(w, 40) ? 0 : pick_gpu(w), g;
        uint64_t handle = 0, size = 0, fsize;
        bool own, ro, src_ro = false;
        Reason why = {""};
        unsigned before;

        if (fi < 0 || chance(w, 20)) {
                fd = foreign_file(w, &fsize, &ro);
                mi = mem_new(w, BROKER_KIND_IMPORT, 0, fsize);
                w->mems[mi].state = MEM_GONE;
                fi = fd_add(w, fd, mi, ro);
        }
        fd = w->fds[fi].fd;
        mi = w->fds[fi].mem;
        ro = w->fds[fi].ro;
        fsize = w->mems[mi].size;
        own = mem_own(w, mi);
        if (w->mems[mi].obj >= 0 && w->objs[w->mems[mi].obj].live)
                src_ro = obj_read_only(&w->objs[w->mems[mi].obj]);
        g = gpu ? gpu : gpu_ids[0];
        describe(w, "client %d import fd %d (%s memory, %s) on GPU %u", ci, fd, kind_name(w->mems[mi].kind),
                 own ? "own" : "foreign", gpu);
        if ((want = gpu_ok(w, ci, g)) < 0)
                ;
        else if ((want = client_fits(w, ci,
                                     &(Ask){.objects = 1,
                                            .fds = !own && w->fdps,
                                            .kind = BROKER_KIND_IMPORT,
                                            .gpu_id = g,
                                            .bytes = own ? 0 : fsize,
                                            .foreign = true})) < 0)
                ;
        else if (!acct_of(w, ci)->import_foreign && !mem_driver_own(w, mi))
                want = -EACCES;
        if (!want) {
                static const FakeOp ops[] = {FAKE_OP_CTX_NEW, FAKE_OP_IMPORT};
                fault_maybe(w, ops, 2);
        }
        before = fake_ctx_last(w->drv);
        r = broker_import(w->clients[ci].bc, fd, gpu, &handle, &size, &why);
        if (!outcome(w, ci, before, r, want, &why))
                return;
        if (size != fsize)
                fail(w, "imported %" PRIu64 " bytes of a %" PRIu64 "-byte file", size, fsize);
        int oi = obj_new(w, ci, BROKER_KIND_IMPORT, handle, size, g);
        Obj *o = &w->objs[oi];
        o->mem = mi;
        o->client_refs = 1;
        o->foreign = !own;
        o->read_only = ro || src_ro || w->mems[mi].sealed; /* a sealed file imports read-only */
        o->flags = o->read_only ? BROKER_FLAG_READ_ONLY : 0;
        o->backing = !own && w->fdps;
}

/* The test lets go of a file; the daemon's loop then reads what the kernel said. */
static void op_close(World *w)
{
        int fi = PICK(w, w->fds, w->n_fds, it->open);

        if (fi < 0)
                return;
        describe(w, "close fd %d (%s memory)", w->fds[fi].fd, kind_name(w->mems[w->fds[fi].mem].kind));
        close(w->fds[fi].fd);
        w->fds[fi].open = false;
        broker_process_events(w->b);
        settle(w);
}

static int share_named(const World *w, const char *name)
{
        for (size_t i = 0; i < w->n_shares; i++)
                if (w->shares[i].named && strcmp(w->shares[i].name, name) == 0)
                        return (int)i;
        return -1;
}

static bool shares_served(const World *w)
{
        return (w->caps & (DRIVER_CAP_PRIVATE_VM | DRIVER_CAP_VA_GRANTS)) ==
               (DRIVER_CAP_PRIVATE_VM | DRIVER_CAP_VA_GRANTS);
}

static void op_share_publish(World *w)
{
        int ci = pick_client(w), oi, want = 0, r;
        uint64_t h = pick_handle(w, ci, chance(w, 90) ? is_publishable : NULL, &oi);
        const char *name = share_names[below(w, N_NAMES)];
        bool ro = chance(w, 30), persistent = chance(w, 50), taken = false;
        Obj *o = oi >= 0 ? &w->objs[oi] : NULL;
        BrokerShareInfo info;
        Reason why = {""};

        describe(w, "client %d publish 0x%" PRIx64 " (%s) as %s%s%s", ci, h, o ? kind_name(o->kind) : "none",
                 name, ro ? " read-only" : "", persistent ? " persistent" : "");
        if (!shares_served(w))
                want = -EOPNOTSUPP;
        else if (!o)
                want = -ENOENT;
        else if (o->kind != BROKER_KIND_DEVICE && o->kind != BROKER_KIND_HOST && o->kind != BROKER_KIND_VMM)
                want = -EINVAL;
        else if (o->share >= 0)
                want = -EBUSY;
        else if ((want = client_fits(w, ci, &(Ask){.objects = 1, .fds = 1})) < 0)
                ;
        else if (!o->memfd && (taken = file_on_export(w, o))) {
                /* the share's charge is taken first, then the file's */
                BrokerAccount *a = acct_of(w, ci);
                BrokerUsage u;
                expect_account(w, w->clients[ci].acct, &u);
                if ((uint64_t)u.held_fds + 2 > a->max_fds)
                        want = -EDQUOT;
        }
        if (!want && !o->memfd) {
                static const FakeOp ops[] = {FAKE_OP_EXPORT};
                fault_maybe(w, ops, 1);
        }
        bool fired;
        r = broker_share_publish(w->clients[ci].bc, h, name, ro, persistent, &info, &why);
        fired = fault_fired(w);
        if (fired) {
                want = w->fault.err;
        } else if (!want) {
                /* the driver made the file; refused read-write if it was sealed; a taken name refuses it;
                 * sealed for a read-only share only once nothing else refused it */
                o->backing |= taken;
                if (!ro && !obj_read_only(o) && w->mems[o->mem].sealed)
                        want = -EPERM;
                else if (share_named(w, name) >= 0)
                        want = -EEXIST;
                else if (ro || obj_read_only(o))
                        want = mem_seal(w, o->mem);
        }
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        if (w->n_shares == MAX_SHARES)
                fail(w, "the model is out of share records");
        int si = (int)w->n_shares++;
        Share *s = &w->shares[si];
        *s = (Share){.named = true,
                     .mem = o->mem,
                     .src = oi,
                     .owner = ci,
                     .persistent = persistent,
                     .read_only = ro || obj_read_only(o),
                     .payer = -1,
                     .va = info.va,
                     .size = o->size,
                     .gpu_id = o->gpu_id,
                     .kind = o->kind};
        snprintf(s->name, sizeof(s->name), "%s", name);
        if (info.size != o->size || info.readers || info.read_only != s->read_only ||
            info.persistent != persistent || strcmp(info.class_name, acct_names[w->clients[ci].acct]))
                fail(w, "the share is described as %" PRIu64 " bytes, %u readers, read-only %d, class '%s'",
                     info.size, info.readers, info.read_only, info.class_name);
        o->share = si;
        o->backing |= taken;
        o->handed_out = true;
}

static void op_share_publish(World *w);

static void op_share_open(World *w)
{
        int ci = pick_client(w), want = 0, r, fd = -1, si;
        const char *name = share_names[below(w, N_NAMES)];
        int named = PICK(w, w->shares, w->n_shares, it->named);
        bool write = chance(w, 50);
        uint32_t ids[N_GPUS + 1];
        size_t n = chance(w, 40) ? 0 : pick_gpus(w, ids, N_GPUS);
        uint64_t handle = 0, gpus;
        BrokerShareInfo info;
        Reason why = {""};
        unsigned before;

        if (n && chance(w, 5))
                ids[n++] = 999;
        if (named < 0 && chance(w, 80)) {
                instead(w, op_share_publish);
                return;
        }
        if (named >= 0 && chance(w, 90))
                name = w->shares[named].name;
        describe(w, "client %d open share %s%s on %zu GPUs", ci, name, write ? " read-write" : "", n);
        si = share_named(w, name);
        gpus = n ? mask_of(ids, n) : allowed(w, ci) & ((1u << N_GPUS) - 1);
        if (!shares_served(w))
                want = -EOPNOTSUPP;
        else if (n && (want = gpus_ok(w, ci, ids, n)) < 0)
                ;
        else if (!n && !gpus)
                want = -EACCES;
        if (!want)
                want = client_fits(w, ci, &(Ask){.objects = 1});
        if (!want && si < 0)
                want = -ENOENT;
        for (size_t i = 0; !want && i < w->n_objs; i++)
                if (w->objs[i].live && w->objs[i].kind == BROKER_KIND_SHARE && w->objs[i].client == ci &&
                    w->objs[i].reader_of == si)
                        want = -EBUSY;
        if (!want && write && w->shares[si].read_only)
                want = -EACCES;
        if (!want && write && w->mems[w->shares[si].mem].sealed)
                want = -EPERM;
        if (!want) {
                static const FakeOp ops[] = {FAKE_OP_CTX_NEW, FAKE_OP_IMPORT, FAKE_OP_GRANT};
                fault_maybe(w, ops, 3);
        }
        before = fake_ctx_last(w->drv);
        r = broker_share_open(w->clients[ci].bc, name, write, ids, n, &handle, &info, &fd, &why);
        note_ctx(w, ci, before);
        bool fired = fault_fired(w);
        /* a read-only reader's open seals the memory before the driver imports it */
        if (!want && (!write || w->shares[si].read_only) && (!fired || w->fault.op != FAKE_OP_CTX_NEW))
                w->mems[w->shares[si].mem].sealed = true;
        expect_rc(w, r, fired ? w->fault.err : want, &why);
        if (r < 0)
                return;
        Share *s = &w->shares[si];
        int oi = obj_new(w, ci, BROKER_KIND_SHARE, handle, s->size, s->gpu_id);
        Obj *o = &w->objs[oi];
        o->va = s->va;
        o->reader_of = si;
        o->read_only = !write || s->read_only;
        o->flags = o->read_only ? BROKER_FLAG_READ_ONLY : 0;
        o->client_refs = 1;
        o->reader_gpus = gpus;
        o->mem = s->mem;
        if (info.va != s->va || info.size != s->size)
                fail(w, "opened at 0x%" PRIx64 "+0x%" PRIx64 ", published at 0x%" PRIx64 "+0x%" PRIx64,
                     info.va, info.size, s->va, s->size);
        fd_add(w, fd, s->mem, o->read_only);
}

static void op_share_revoke(World *w)
{
        const char *name = share_names[below(w, N_NAMES)];
        int named = PICK(w, w->shares, w->n_shares, it->named), si, r;
        Reason why = {""};

        if (named >= 0 && chance(w, 80))
                name = w->shares[named].name;
        si = share_named(w, name);
        describe(w, "revoke share %s", name);
        r = broker_share_revoke(w->b, name, NULL, &why);
        expect_rc(w, r, si >= 0 ? 0 : -ENOENT, &why);
        if (r < 0)
                return;
        share_end(w, si);
        settle(w);
}

/* ---- managed memory --------------------------------------------------------------------------------- */

static bool is_location(uint32_t v, bool undefined_ok)
{
        return v == DRIVER_SVM_LOCATION_SYSMEM || (undefined_ok && v == DRIVER_SVM_LOCATION_UNDEFINED) ||
               gpu_index(v) >= 0;
}

static bool per_gpu(uint32_t t)
{
        return t == DRIVER_SVM_ATTR_ACCESS || t == DRIVER_SVM_ATTR_ACCESS_IN_PLACE ||
               t == DRIVER_SVM_ATTR_NO_ACCESS;
}

/* check_svm_attrs() and, setting them, the class's GPUs: 0, -EINVAL or -EACCES. */
static int svm_attrs_ok(World *w, int ci, const BrokerSvmAttr *a, size_t n, bool get)
{
        for (size_t i = 0; i < n; i++) {
                uint32_t t = a[i].type, v = a[i].value;
                switch (t) {
                case DRIVER_SVM_ATTR_PREFERRED_LOC:
                case DRIVER_SVM_ATTR_PREFETCH_LOC:
                        if (!get && !is_location(v, t == DRIVER_SVM_ATTR_PREFERRED_LOC))
                                return -EINVAL;
                        break;
                case DRIVER_SVM_ATTR_ACCESS:
                case DRIVER_SVM_ATTR_ACCESS_IN_PLACE:
                case DRIVER_SVM_ATTR_NO_ACCESS:
                        if ((get && t != DRIVER_SVM_ATTR_ACCESS) || gpu_index(v) < 0)
                                return -EINVAL;
                        break;
                case DRIVER_SVM_ATTR_SET_FLAGS:
                case DRIVER_SVM_ATTR_CLR_FLAGS:
                        if (!get && (v & ~0xffu))
                                return -EINVAL;
                        break;
                case DRIVER_SVM_ATTR_GRANULARITY:
                        if (!get && v > 0x3f)
                                return -EINVAL;
                        break;
                default:
                        return -EINVAL;
                }
                for (size_t k = 0; k < i; k++)
                        if (per_gpu(t) && per_gpu(a[k].type) ? a[k].value == v : a[k].type == t)
                                return -EINVAL;
        }
        for (size_t i = 0; !get && i < n; i++) {
                uint32_t t = a[i].type, v = a[i].value;
                bool names_gpu = t == DRIVER_SVM_ATTR_ACCESS || t == DRIVER_SVM_ATTR_ACCESS_IN_PLACE ||
                                 ((t == DRIVER_SVM_ATTR_PREFERRED_LOC || t == DRIVER_SVM_ATTR_PREFETCH_LOC) &&
                                  gpu_index(v) >= 0);
                if (names_gpu && gpu_ok(w, ci, v) < 0)
                        return -EACCES;
        }
        return 0;
}

static void op_svm(World *w)
{
        int ci = pick_client(w), want = 0, r, how = (int)below(w, 3);

        if (!has_obj(w, ci, BROKER_KIND_MANAGED) && chance(w, 80)) {
                w->alloc_kind = BROKER_KIND_MANAGED;
                instead(w, op_alloc);
                return;
        }
        int oi = PICK(w, w->objs, w->n_objs, it->live && it->client == ci && it->kind == BROKER_KIND_MANAGED);
        uint64_t va = w->clients[ci].base + PAGE * below(w, 64), size = PAGE;
        BrokerSvmAttr a[4];
        size_t n = 1 + below(w, 3);
        Reason why = {""};

        if (oi >= 0) {
                const Obj *o = &w->objs[oi];
                uint64_t first = below(w, o->size / PAGE);
                va = o->va + PAGE * first;
                size = PAGE * (1 + below(w, o->size / PAGE - first));
        }
        if (chance(w, 3))
                size = chance(w, 50) ? 0 : size + PAGE;
        if (chance(w, 2))
                va += 8;
        for (size_t i = 0; i < n; i++) {
                static const uint32_t types[] = {
                        DRIVER_SVM_ATTR_PREFERRED_LOC, DRIVER_SVM_ATTR_ACCESS,
                        DRIVER_SVM_ATTR_SET_FLAGS,     DRIVER_SVM_ATTR_CLR_FLAGS,
                        DRIVER_SVM_ATTR_GRANULARITY,   DRIVER_SVM_ATTR_ACCESS_IN_PLACE};
                a[i].type = types[below(w, sizeof(types) / sizeof(types[0]))];
                a[i].value = per_gpu(a[i].type) || chance(w, 40) ? pick_gpu(w) : (uint32_t)below(w, 4);
                if (chance(w, 2))
                        a[i].type = 20;
        }
        describe(w, "client %d svm %s 0x%" PRIx64 "+0x%" PRIx64 " %zu attributes (%u=%u)", ci,
                 how == 0   ? "get"
                 : how == 1 ? "set"
                            : "prefetch",
                 va, size, n, a[0].type, a[0].value);
        if (how == 2) {
                n = 1;
                a[0] = (BrokerSvmAttr){DRIVER_SVM_ATTR_PREFETCH_LOC, chance(w, 30) ? 0 : pick_gpu(w)};
        }
        int res = -1;
        if (size == 0 || va % PAGE || size % PAGE)
                want = -EINVAL;
        else if (!in_window(w, ci, va, size))
                want = -EFAULT;
        else {
                for (size_t i = 0; i < w->n_objs; i++) {
                        const Obj *o = &w->objs[i];
                        if (o->live && o->client == ci && o->va && o->va <= va && va < o->va + o->size &&
                            o->kind != BROKER_KIND_SHARE)
                                res = (int)i;
                }
                if (res < 0 || w->objs[res].kind != BROKER_KIND_MANAGED ||
                    va + size > w->objs[res].va + w->objs[res].size)
                        want = -EINVAL;
        }
        if (!want)
                want = svm_attrs_ok(w, ci, a, n, how == 0);
        if (!want) {
                FakeOp op = how == 0 ? FAKE_OP_SVM_GET : FAKE_OP_SVM_SET;
                fault_maybe(w, &op, 1);
        }
        if (how == 0)
                r = broker_svm_get(w->clients[ci].bc, va, size, a, n, &why);
        else if (how == 1)
                r = broker_svm_set(w->clients[ci].bc, va, size, a, n, &why);
        else
                r = broker_svm_prefetch(w->clients[ci].bc, va, size, a[0].value, &why);
        if (fault_fired(w))
                want = w->fault.err;
        expect_rc(w, r, want, &why);
}

/* ---- clients ---------------------------------------------------------------------------------------- */

static void client_start(World *w, int ci, int acct)
{
        Client *c = &w->clients[ci];
        int r;

        c->base = w->wk->window_bases[ci];
        c->ctx = 0;
        c->tag = ++w->next_tag;
        r = thunk_va_space_new(c->base, WINDOW_SIZE, 0, &c->win);
        if (r < 0)
                fail(w, "cannot make a window: %s", strerror(-r));
        r = broker_client_new(w->b, c->win, &c->bc);
        if (r < 0)
                fail(w, "cannot make a client: %s", strerror(-r));
        broker_client_set_tag(c->bc, c->tag);
        broker_client_set_account(c->bc, &w->accts[acct]);
        c->acct = acct;
}

/* The accounts add up to the totals, whatever is half torn down. */
static void check_sums(World *w)
{
        BrokerUsage got, sum = {0};

        for (int ai = 0; ai < N_ACCTS; ai++) {
                broker_account_usage(&w->accts[ai], &got);
                usage_sum(&sum, &got);
        }
        broker_totals(w->b, &got);
        compare_usage(w, "the accounts' sum", &sum, &got);
        if (fake_violation(w->drv))
                fail(w, "the broker broke the driver's contract: %s", fake_violation(w->drv));
}

/* Tear client @ci down in slices of a few records, and check that nothing of it is left. */
static void teardown(World *w, int ci)
{
        Client *c = &w->clients[ci];
        uint64_t records = broker_client_records(c->bc), left;
        unsigned steps = 0;

        for (;;) {
                size_t budget = 1 + below(w, 3);
                bool done = broker_client_teardown_step(c->bc, budget);
                steps++;
                left = broker_client_records(c->bc);
                check_sums(w);
                if (done)
                        break;
                /* a slice takes its budget of mappings or objects, and with a mapping the handle only it
                 * kept, with an object or handle the share it was published as */
                if (left >= records || records - left > 3 * budget)
                        fail(w, "a teardown slice of %zu took %" PRIu64 " records (%" PRIu64 " left)", budget,
                             records - left, left);
                if (steps > 10000)
                        fail(w, "the teardown does not end");
                records = left;
        }
        if (left != 0 || broker_client_objects(c->bc) != 0)
                fail(w, "torn down, the client still has %" PRIu64 " records, %zu objects", left,
                     broker_client_objects(c->bc));
        c->bc = broker_client_free(c->bc);
        c->win = thunk_va_space_free(c->win);
        if (c->ctx && (fake_ctx_alive(w->drv, c->ctx) || fake_objects_in_ctx(w->drv, c->ctx)))
                fail(w, "the client's context %u lives on with %zu objects", c->ctx,
                     fake_objects_in_ctx(w->drv, c->ctx));
        /* driver_ctx_free(): "its memory must have been freed first" */
        if (fake_released_with_ctx(w->drv))
                fail(w, "the client's context went with %" PRIu64 " objects of it still in the driver",
                     fake_released_with_ctx(w->drv));
        if (fake_objects_in_range(w->drv, c->base, c->base + WINDOW_SIZE))
                fail(w, "%zu objects of the driver are left in the client's window",
                     fake_objects_in_range(w->drv, c->base, c->base + WINDOW_SIZE));
        /* the model: mappings first, then every object */
        for (size_t i = 0; i < w->n_maps; i++)
                if (w->maps[i].live && w->maps[i].client == ci)
                        map_gone(w, (int)i);
        for (size_t i = 0; i < w->n_objs; i++)
                if (w->objs[i].live && w->objs[i].client == ci) {
                        w->objs[i].client_refs = w->objs[i].map_refs = 0;
                        obj_gone(w, (int)i);
                }
        settle(w);
        c->ctx = 0;
        w->wk->stats.teardowns++;
}

static void op_teardown(World *w)
{
        int ci = pick_client(w), acct = (int)below(w, N_ACCTS);

        describe(w, "tear client %d down, a new one of account %s in its place", ci, acct_names[acct]);
        teardown(w, ci);
        client_start(w, ci, acct);
}

static void op_set_account(World *w)
{
        int ci = pick_client(w), acct = (int)below(w, N_ACCTS);

        describe(w, "client %d moves to account %s", ci, acct_names[acct]);
        broker_client_set_account(w->clients[ci].bc, &w->accts[acct]);
        w->clients[ci].acct = acct;
}

/* ---- queries ---------------------------------------------------------------------------------------- */

static void op_pointer_info(World *w)
{
        int ci = pick_client(w), want = 0, r;
        int oi = PICK(w, w->objs, w->n_objs, it->live && it->client == ci && it->va);
        uint64_t va = oi >= 0 ? w->objs[oi].va + PAGE * below(w, w->objs[oi].size / PAGE)
                              : w->clients[ci].base + PAGE * below(w, 64);
        BrokerPtrInfo info;
        Reason why = {""};
        const Obj *o = NULL;
        const Map *m = NULL;

        if (chance(w, 5))
                va = chance(w, 50) ? w->clients[ci].base + PAGE * below(w, 64) : w->clients[ci].base - PAGE;
        describe(w, "client %d pointer_info 0x%" PRIx64, ci, va);
        for (size_t i = 0; i < w->n_objs; i++) {
                const Obj *x = &w->objs[i];
                if (x->live && x->client == ci && x->va && va >= x->va && va < x->va + x->size &&
                    (x->kind == BROKER_KIND_SHARE) == !in_window(w, ci, va, 1))
                        o = x;
        }
        if (!in_window(w, ci, va, 1) && !o)
                want = -EFAULT;
        else if (!o)
                want = -ENOENT;
        else if (o->kind == BROKER_KIND_SHARE && o->revoked)
                want = -ESTALE;
        else if (o->kind == BROKER_KIND_RESERVATION) {
                int mi = map_at(w, (int)(o - w->objs), va);
                if (mi < 0)
                        want = -ENOENT;
                else
                        m = &w->maps[mi];
        }
        r = broker_pointer_info(w->clients[ci].bc, va, &info, &why);
        expect_rc(w, r, want, &why);
        if (r < 0)
                return;
        uint64_t mapped = 0;
        for (size_t i = 0; i < info.n_mapped; i++)
                mapped |= 1ull << gpu_index(info.mapped[i]);
        if (m) {
                const Obj *p = &w->objs[m->phys];
                uint64_t granted = 0;
                for (int g = 0; g < N_GPUS; g++)
                        granted |= (uint64_t)(m->access[g] != BROKER_ACCESS_NONE) << g;
                if (info.handle != (p->client_refs ? p->handle : 0) || info.kind != p->kind ||
                    info.base != m->va || info.size != m->size ||
                    info.cpu_accessible != (m->cpu_access != BROKER_ACCESS_NONE) || mapped != granted)
                        fail(w,
                             "the mapping is told as handle 0x%" PRIx64 " %s 0x%" PRIx64 "+0x%" PRIx64
                             " on GPUs 0x%" PRIx64,
                             info.handle, kind_name(info.kind), info.base, info.size, mapped);
                return;
        }
        uint64_t want_mapped = o->kind == BROKER_KIND_SHARE ? o->reader_gpus : o->mapped;
        if (info.handle != o->handle || info.kind != o->kind || info.base != o->va || info.size != o->size ||
            info.gpu_id != o->gpu_id || mapped != want_mapped)
                fail(w,
                     "told as handle 0x%" PRIx64 " %s 0x%" PRIx64 "+0x%" PRIx64 " GPU %u on GPUs 0x%" PRIx64
                     "; the model: 0x%" PRIx64 " %s on 0x%" PRIx64,
                     info.handle, kind_name(info.kind), info.base, info.size, info.gpu_id, mapped, o->handle,
                     kind_name(o->kind), want_mapped);
}

static void op_properties(World *w)
{
        int ci = pick_client(w), oi, want = 0, r;
        uint64_t h = pick_handle(w, ci, NULL, &oi);
        const Obj *o = oi >= 0 ? &w->objs[oi] : NULL;
        BrokerProps p;
        Reason why = {""};

        describe(w, "client %d properties of 0x%" PRIx64 " (%s)", ci, h, o ? kind_name(o->kind) : "none");
        if (!o || o->kind == BROKER_KIND_RESERVATION)
                want = -ENOENT;
        r = broker_vmm_properties(w->clients[ci].bc, h, &p, &why);
        expect_rc(w, r, want, &why);
        if (r == 0 &&
            (p.kind != o->kind || p.gpu_id != o->gpu_id || p.size != o->size || p.flags != o->flags))
                fail(w,
                     "told as %s on GPU %u, %" PRIu64 " bytes, flags 0x%x; the model: %s on %u, %" PRIu64
                     ", 0x%x",
                     kind_name(p.kind), p.gpu_id, p.size, p.flags, kind_name(o->kind), o->gpu_id, o->size,
                     o->flags);
}

static void op_mem_info(World *w)
{
        int ci = pick_client(w), r;
        uint32_t gpu = chance(w, 50) ? 0 : pick_gpu(w);
        BrokerGpuMem out[BROKER_MAX_GPUS];
        const BrokerAccount *a = acct_of(w, ci);
        BrokerUsage u;
        Reason why = {""};
        size_t n = 0;
        FakeCounts k;

        describe(w, "client %d mem_info GPU %u", ci, gpu);
        r = broker_mem_info(w->clients[ci].bc, gpu, out, &n, &why);
        expect_rc(w, r, gpu && gpu_index(gpu) < 0 ? -ENODEV : 0, &why);
        if (r < 0)
                return;
        if (n != (gpu ? 1u : N_GPUS))
                fail(w, "%zu GPUs told", n);
        expect_account(w, w->clients[ci].acct, &u);
        fake_counts(w->drv, &k);
        for (size_t i = 0; i < n; i++) {
                int gi = gpu_index(out[i].gpu_id);
                uint64_t total = 64ull << 30, avail = total - k.vram_used[gi],
                         vram = u.device_bytes + u.vmm_bytes;
                uint64_t left_gpu =
                        u.vram_bytes[gi] < a->max_vram_gpu[gi] ? a->max_vram_gpu[gi] - u.vram_bytes[gi] : 0;
                uint64_t left_all = vram < a->max_vram ? a->max_vram - vram : 0;
                uint64_t allow = a->max_vram_gpu[gi] < a->max_vram ? a->max_vram_gpu[gi] : a->max_vram;
                uint64_t free = avail;
                if (!(a->allowed_gpus & (1ull << gi)))
                        allow = left_gpu = 0;
                if (allow < total)
                        total = allow;
                if (left_gpu < free)
                        free = left_gpu;
                if (left_all < free)
                        free = left_all;
                if (out[i].total != total || out[i].free != free || out[i].used != u.vram_bytes[gi])
                        fail(w,
                             "GPU %u told total %" PRIu64 " free %" PRIu64 " used %" PRIu64
                             "; the model: %" PRIu64 " %" PRIu64 " %" PRIu64,
                             out[i].gpu_id, out[i].total, out[i].free, out[i].used, total, free,
                             u.vram_bytes[gi]);
        }
}

/* The fake driver runs no queues: a queue the broker lets through is refused there, and refunded. */
static void op_queue(World *w)
{
        int ci = pick_client(w), want, r;
        int oi = PICK(w, w->objs, w->n_objs, it->live && it->client == ci && it->kind == BROKER_KIND_DEVICE);
        DriverQueueArgs q = {
                .gpu_id = gpu_ids[below(w, N_GPUS)], .type = DRIVER_QUEUE_COMPUTE_AQL, .ring_size = PAGE};
        uint32_t id;
        uint64_t doorbell;
        Reason why = {""};
        unsigned before;

        if (oi < 0)
                return;
        q.ring_va = q.rptr_va = w->objs[oi].va;
        q.wptr_va = q.rptr_va + 8;
        describe(w, "client %d queue on GPU %u, ring at 0x%" PRIx64, ci, q.gpu_id, q.ring_va);
        want = gpu_ok(w, ci, q.gpu_id);
        if (!want)
                want = client_fits(w, ci, &(Ask){.objects = 1});
        if (!want)
                want = -EOPNOTSUPP;
        before = fake_ctx_last(w->drv);
        r = broker_queue_create(w->clients[ci].bc, &q, &id, &doorbell, &why);
        note_ctx(w, ci, before);
        expect_rc(w, r, want, &why);
}

/* ---- brokers that end ------------------------------------------------------------------------------- */

/*
 * The last close of an inotify fd whose watches went waits for an RCU grace period (some 10 ms, more than a
 * whole sequence takes). A broker that ends leaves a copy of its fd to closer threads, which wait together.
 */
static struct {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        int fds[CLOSER_MAX];
        size_t n;
        bool stop;
        pthread_t threads[CLOSERS];
} closer = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *closer_main(void *arg)
{
        (void)arg;
        pthread_mutex_lock(&closer.lock);
        for (;;) {
                while (closer.n == 0 && !closer.stop)
                        pthread_cond_wait(&closer.cond, &closer.lock);
                if (closer.n == 0)
                        break;
                int fd = closer.fds[--closer.n];
                pthread_cond_broadcast(&closer.cond); /* room for one more */
                pthread_mutex_unlock(&closer.lock);
                close(fd);
                pthread_mutex_lock(&closer.lock);
        }
        pthread_mutex_unlock(&closer.lock);
        return NULL;
}

static void closer_push(int fd)
{
        pthread_mutex_lock(&closer.lock);
        while (closer.n == CLOSER_MAX)
                pthread_cond_wait(&closer.cond, &closer.lock);
        closer.fds[closer.n++] = fd;
        pthread_cond_broadcast(&closer.cond);
        pthread_mutex_unlock(&closer.lock);
}

static void end_broker(Broker *b)
{
        int fd = fcntl(broker_event_fd(b), F_DUPFD_CLOEXEC, 3);

        broker_free(b);
        if (fd >= 0)
                closer_push(fd);
}

/* Nothing left in the driver: every object the broker made is freed. */
static void check_driver_empty(World *w, Driver *drv, const char *when)
{
        FakeCounts k;

        fake_counts(drv, &k);
        if (fake_violation(drv))
                fail(w, "the broker broke the driver's contract: %s", fake_violation(drv));
        if (fake_released_with_ctx(drv))
                fail(w, "%s, %" PRIu64 " objects went only with their contexts", when,
                     fake_released_with_ctx(drv));
        if (k.mems[FAKE_MEM_VRAM] + k.mems[FAKE_MEM_HOST] + k.mems[FAKE_MEM_IMPORT] + k.grants + k.managed +
            k.contexts)
                fail(w,
                     "%s, the driver still holds %" PRIu64 " VRAM, %" PRIu64 " host, %" PRIu64
                     " imports, %" PRIu64 " grants, %" PRIu64 " managed ranges, %" PRIu64 " contexts",
                     when, k.mems[FAKE_MEM_VRAM], k.mems[FAKE_MEM_HOST], k.mems[FAKE_MEM_IMPORT], k.grants,
                     k.managed, k.contexts);
}

/* ---- a restart: every client carried to a new broker over a new driver ------------------------------ */

typedef struct Carried {
        BrokerCarry *objs;
        size_t n_objs;
        BrokerCarryMap *maps;
        size_t n_maps;
} Carried;

typedef struct CarriedShares {
        BrokerCarryShare *v;
        size_t n;
} CarriedShares;

static int carry_obj(void *arg, const BrokerCarry *k)
{
        Carried *c = arg;
        BrokerCarry *more = realloc(c->objs, (c->n_objs + 1) * sizeof(*more)), *o;

        if (!more) {
                safe_close(k->fd);
                return -ENOMEM;
        }
        c->objs = more;
        o = &c->objs[c->n_objs++];
        *o = *k;
        /* what the record borrows from the broker that lists it: copied, as the hand-over state does */
        o->share_name = k->share_name ? strdup(k->share_name) : NULL;
        o->svm = NULL;
        if (k->n_svm) {
                BrokerSvmCall *svm = malloc(k->n_svm * sizeof(*svm));
                if (!svm)
                        return -ENOMEM;
                memcpy(svm, k->svm, k->n_svm * sizeof(*svm));
                o->svm = svm;
        }
        return 0;
}

static int carry_map(void *arg, const BrokerCarryMap *m)
{
        Carried *c = arg;
        BrokerCarryMap *more = realloc(c->maps, (c->n_maps + 1) * sizeof(*more));

        if (!more)
                return -ENOMEM;
        c->maps = more;
        c->maps[c->n_maps++] = *m;
        return 0;
}

static int carry_share(void *arg, const BrokerCarryShare *s)
{
        CarriedShares *c = arg;
        BrokerCarryShare *more = realloc(c->v, (c->n + 1) * sizeof(*more));

        if (!more) {
                safe_close(s->fd);
                return -ENOMEM;
        }
        c->v = more;
        c->v[c->n] = *s;
        c->v[c->n].name = strdup(s->name);
        c->v[c->n].class_name = strdup(s->class_name ? s->class_name : "");
        c->n++;
        return 0;
}

static BrokerAccount *account_named(void *arg, const char *name)
{
        World *w = arg;

        for (int ai = 0; ai < N_ACCTS; ai++)
                if (name && strcmp(name, acct_names[ai]) == 0)
                        return &w->accts[ai];
        return NULL;
}

/* A context made for client @ci while it came back. */
static void note_ctx_restored(World *w, int ci, unsigned before)
{
        if (fake_ctx_last(w->drv) != before && !w->clients[ci].ctx)
                w->clients[ci].ctx = fake_ctx_last(w->drv);
        else if (fake_ctx_last(w->drv) != before)
                fail(w, "client %d got a second context", ci);
}

static void restore_objects(World *w, int ci, Carried *k, bool imports)
{
        for (size_t i = 0; i < k->n_objs; i++) {
                BrokerCarry *o = &k->objs[i];
                Reason why = {""};
                int r;
                if ((o->kind == BROKER_KIND_IMPORT || o->kind == BROKER_KIND_SHARE) != imports)
                        continue;
                r = broker_carry_restore(w->clients[ci].bc, o, &why);
                if (r < 0)
                        fail(w, "client %d: %s handle 0x%" PRIx64 " does not come back: %s", ci,
                             kind_name(o->kind), o->handle, why.msg);
        }
}

static void op_restart(World *w)
{
        Carried carried[N_CLIENTS] = {0};
        CarriedShares shares = {0};
        BrokerAccount old_accts[N_ACCTS];
        Broker *old_b = w->b;
        Driver *old_drv = w->drv;
        FakeConfig cfg;
        int r;

        describe(w, "restart: every client carried to a new broker");
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                bool revoked = false;
                Reason why = {""};
                for (size_t i = 0; i < w->n_objs; i++)
                        revoked |= w->objs[i].live && w->objs[i].client == ci &&
                                   w->objs[i].kind == BROKER_KIND_SHARE && w->objs[i].revoked;
                r = broker_client_carry_check(w->clients[ci].bc, &why);
                expect_rc(w, r, revoked ? -EOPNOTSUPP : 0, &why);
                if (r < 0) {
                        w->wk->stats.restarts_refused++;
                        return;
                }
        }
        /* the SVM attributes each managed range has now: the calls replayed there must give them again */
        uint32_t(*attrs)[FAKE_SVM_ATTRS] = calloc(w->n_objs ? w->n_objs : 1, sizeof(*attrs));
        if (!attrs)
                fail(w, "out of memory");
        for (size_t i = 0; i < w->n_objs; i++)
                if (w->objs[i].live && w->objs[i].kind == BROKER_KIND_MANAGED &&
                    fake_managed_attrs(w->drv, w->objs[i].va, attrs[i]) < 0)
                        fail(w, "the driver has no managed range at 0x%" PRIx64, w->objs[i].va);

        for (int ci = 0; ci < N_CLIENTS; ci++) {
                r = broker_client_carry_each(w->clients[ci].bc, carry_obj, carry_map, &carried[ci]);
                if (r < 0)
                        fail(w, "client %d cannot be listed for the next broker: %s", ci, strerror(-r));
        }
        r = broker_carry_shares_each(w->b, carry_share, &shares);
        if (r < 0)
                fail(w, "the shares cannot be listed for the next broker: %s", strerror(-r));

        /* the old daemon goes: what it held goes with it, and its driver has nothing left */
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                w->clients[ci].bc = broker_client_free(w->clients[ci].bc);
                w->clients[ci].win = thunk_va_space_free(w->clients[ci].win);
        }
        end_broker(old_b);
        check_driver_empty(w, old_drv, "the old broker gone");
        cfg = (FakeConfig){
                .caps = w->caps, .n_gpus = N_GPUS, .vram_bytes = 64ull << 30, .granularity = w->gran};
        memcpy(cfg.gpu_ids, gpu_ids, sizeof(gpu_ids));
        driver_close(old_drv);
        memcpy(old_accts, w->accts, sizeof(old_accts));
        for (int ai = 0; ai < N_ACCTS; ai++) {
                broker_account_done(&w->accts[ai]);
                broker_account_init(&w->accts[ai], acct_names[ai]);
                /* the class's limits as they were: the configuration is the same */
                w->accts[ai].max_vram = old_accts[ai].max_vram;
                memcpy(w->accts[ai].max_vram_gpu, old_accts[ai].max_vram_gpu,
                       sizeof(old_accts[ai].max_vram_gpu));
                w->accts[ai].max_host = old_accts[ai].max_host;
                w->accts[ai].max_managed = old_accts[ai].max_managed;
                w->accts[ai].max_handles = old_accts[ai].max_handles;
                w->accts[ai].max_fds = old_accts[ai].max_fds;
                w->accts[ai].max_foreign = old_accts[ai].max_foreign;
                w->accts[ai].max_foreign_one = old_accts[ai].max_foreign_one;
                w->accts[ai].max_host_one = old_accts[ai].max_host_one;
                w->accts[ai].allowed_gpus = old_accts[ai].allowed_gpus;
                w->accts[ai].import_foreign = old_accts[ai].import_foreign;
        }

        /* the new one */
        if ((r = fake_driver_new(&cfg, &w->drv)) < 0 || (r = broker_new(w->drv, &w->b)) < 0 ||
            (r = broker_share_region(w->b, w->wk->region_base, REGION_SIZE)) < 0)
                fail(w, "cannot start the next broker: %s", strerror(-r));
        for (size_t i = 0; i < shares.n; i++) {
                Reason why = {""};
                r = broker_carry_share_restore(w->b, &shares.v[i], &why);
                if (r < 0)
                        fail(w, "share %s does not come back: %s", shares.v[i].name, why.msg);
        }
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                Client *c = &w->clients[ci];
                unsigned before;
                r = thunk_va_space_new(c->base, WINDOW_SIZE, 0, &c->win);
                if (r < 0 || (r = broker_client_new(w->b, c->win, &c->bc)) < 0)
                        fail(w, "cannot make client %d again: %s", ci, strerror(-r));
                broker_client_set_tag(c->bc, c->tag);
                broker_client_set_account(c->bc, &w->accts[c->acct]);
                c->ctx = 0;
                before = fake_ctx_last(w->drv);
                restore_objects(w, ci, &carried[ci], false);
                broker_carry_claim_shares(c->bc);
                note_ctx_restored(w, ci, before);
        }
        broker_carry_shares_unclaimed(w->b, account_named, w);
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                unsigned before = fake_ctx_last(w->drv);
                Reason why = {""};
                restore_objects(w, ci, &carried[ci], true);
                for (size_t i = 0; i < carried[ci].n_maps; i++) {
                        r = broker_carry_restore_map(w->clients[ci].bc, &carried[ci].maps[i], &why);
                        if (r < 0)
                                fail(w, "client %d: the mapping at 0x%" PRIx64 " does not come back: %s", ci,
                                     carried[ci].maps[i].va, why.msg);
                }
                r = broker_carry_finish(w->clients[ci].bc, &why);
                if (r < 0)
                        fail(w, "client %d does not finish coming back: %s", ci, why.msg);
                note_ctx_restored(w, ci, before);
        }
        if (broker_carry_shares_settle(w->b) != 0)
                fail(w, "a share ended, though every publisher came back");
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                for (size_t i = 0; i < carried[ci].n_objs; i++) {
                        free((char *)carried[ci].objs[i].share_name);
                        free((BrokerSvmCall *)carried[ci].objs[i].svm);
                }
                free(carried[ci].objs);
                free(carried[ci].maps);
        }
        for (size_t i = 0; i < shares.n; i++) {
                free((char *)shares.v[i].name);
                free((char *)shares.v[i].class_name);
        }
        free(shares.v);

        /* the model: what lingered is the old broker's and goes with it; the driver keeps a file for every
         * buffer it took back; a share that holds its memory has it taken back by the driver */
        for (size_t i = 0; i < w->n_mems; i++)
                if (w->mems[i].state == MEM_LINGER)
                        w->mems[i].state = MEM_FORGOTTEN;
        for (size_t i = 0; i < w->n_objs; i++) {
                if (w->objs[i].live &&
                    (w->objs[i].kind == BROKER_KIND_DEVICE || w->objs[i].kind == BROKER_KIND_VMM))
                        w->objs[i].backing = w->fdps;
                /* not carried (only an object gone has it) */
                w->objs[i].share_kept = false;
        }
        for (size_t i = 0; i < w->n_shares; i++)
                if (w->shares[i].named && w->shares[i].held)
                        w->shares[i].carry_mem = w->shares[i].kind == BROKER_KIND_DEVICE ||
                                                 w->shares[i].kind == BROKER_KIND_VMM;
        /* imports and readers of memory sealed since they had it read-write have it read-only now, and
         * what wrote it (GPU grants, CPU access) reads it */
        for (size_t i = 0; i < w->n_objs; i++) {
                Obj *o = &w->objs[i];
                if (!o->live || o->read_only ||
                    (o->kind != BROKER_KIND_IMPORT && o->kind != BROKER_KIND_SHARE) || o->mem < 0 ||
                    !w->mems[o->mem].sealed)
                        continue;
                o->read_only = true;
                if (o->kind == BROKER_KIND_SHARE)
                        o->flags = BROKER_FLAG_READ_ONLY;
                for (size_t k = 0; k < w->n_maps; k++) {
                        Map *m = &w->maps[k];
                        if (!m->live || m->phys != (int)i)
                                continue;
                        for (int g = 0; g < N_GPUS; g++)
                                if (m->access[g] == BROKER_ACCESS_READ_WRITE)
                                        m->access[g] = BROKER_ACCESS_READ;
                        if (m->cpu_access == BROKER_ACCESS_READ_WRITE)
                                m->cpu_access = BROKER_ACCESS_READ;
                }
        }
        for (size_t i = 0; i < w->n_objs; i++) {
                uint32_t now[FAKE_SVM_ATTRS];
                if (!w->objs[i].live || w->objs[i].kind != BROKER_KIND_MANAGED)
                        continue;
                if (fake_managed_attrs(w->drv, w->objs[i].va, now) < 0)
                        fail(w, "the managed range at 0x%" PRIx64 " did not come back", w->objs[i].va);
                for (int t = 0; t < FAKE_SVM_ATTRS; t++)
                        if (now[t] != attrs[i][t])
                                fail(w,
                                     "the managed range at 0x%" PRIx64 " has SVM attribute %d %u, %u before",
                                     w->objs[i].va, t, now[t], attrs[i][t]);
        }
        free(attrs);
        w->restarts++;
        w->wk->stats.restarts++;
}

/* ---- sequences -------------------------------------------------------------------------------------- */

static void random_limits(World *w, BrokerAccount *a)
{
        if (chance(w, 50))
                a->max_handles = 3 + below(w, 14);
        if (chance(w, 40))
                a->max_fds = 1 + below(w, 8);
        if (chance(w, 40))
                a->max_vram = PAGE * (4 + below(w, 80));
        if (chance(w, 30))
                a->max_vram_gpu[below(w, N_GPUS)] = PAGE * (2 + below(w, 40));
        if (chance(w, 40))
                a->max_host = PAGE * (2 + below(w, 60));
        if (chance(w, 20))
                a->max_host_one = PAGE * (1 + below(w, 10));
        if (chance(w, 40))
                a->max_managed = PAGE * (2 + below(w, 60));
        if (chance(w, 30))
                a->max_foreign = PAGE * (1 + below(w, 20));
        if (chance(w, 20))
                a->max_foreign_one = PAGE * (1 + below(w, 6));
        if (chance(w, 25))
                a->allowed_gpus = 1 + below(w, (1u << N_GPUS) - 1);
        if (chance(w, 20))
                a->import_foreign = false;
}

static void world_start(World *w, uint64_t seed)
{
        FakeConfig cfg = {.n_gpus = N_GPUS, .vram_bytes = 64ull << 30};
        int r;

        w->seed = w->rng = seed;
        describe(w, "start");
        /* mostly a driver like the model (a GPU VM per client, grants, managed memory, a file per shared
         * buffer), sometimes without one of them */
        w->caps = DRIVER_CAP_PRIVATE_VM | DRIVER_CAP_MANAGED | DRIVER_CAP_VA_GRANTS | DRIVER_CAP_EXPORT |
                  DRIVER_CAP_FD_PER_SHARED_BUFFER | DRIVER_CAP_BACKEND_STATS | DRIVER_CAP_TEST_FAULTS;
        if (chance(w, 25))
                w->caps &= ~(unsigned)DRIVER_CAP_FD_PER_SHARED_BUFFER;
        if (chance(w, 5))
                w->caps &= ~(unsigned)DRIVER_CAP_MANAGED;
        if (chance(w, 5))
                w->caps &= ~(unsigned)DRIVER_CAP_PRIVATE_VM;
        if (chance(w, 5))
                w->caps &= ~(unsigned)DRIVER_CAP_VA_GRANTS;
        w->fdps = w->caps & DRIVER_CAP_FD_PER_SHARED_BUFFER;
        w->gran = chance(w, 20) ? 64ull << 10 : PAGE;
        cfg.caps = w->caps;
        cfg.granularity = w->gran == PAGE ? 0 : w->gran;
        memcpy(cfg.gpu_ids, gpu_ids, sizeof(gpu_ids));
        /* the worker's broker of this granularity, which the last sequence left holding nothing */
        w->drv = w->wk->drv[w->gran != PAGE];
        w->b = w->wk->b[w->gran != PAGE];
        if (w->drv) {
                fake_set_caps(w->drv, w->caps);
        } else if ((r = fake_driver_new(&cfg, &w->drv)) < 0 || (r = broker_new(w->drv, &w->b)) < 0 ||
                   (r = broker_share_region(w->b, w->wk->region_base, REGION_SIZE)) < 0) {
                fail(w, "cannot start: %s", strerror(-r));
        }
        for (int ai = 0; ai < N_ACCTS; ai++) {
                broker_account_init(&w->accts[ai], acct_names[ai]);
                if (ai > 0)
                        random_limits(w, &w->accts[ai]);
        }
        for (int ci = 0; ci < N_CLIENTS; ci++)
                client_start(w, ci, (int)below(w, N_ACCTS));
}

static void expect_zero(World *w, const char *who, const BrokerUsage *got)
{
        BrokerUsage zero = {0};
        compare_usage(w, who, got, &zero);
}

static void world_end(World *w)
{
        BrokerUsage got;

        describe(w, "end: every client torn down, every share revoked, every file closed");
        for (int ci = 0; ci < N_CLIENTS; ci++)
                teardown(w, ci);
        for (size_t i = 0; i < w->n_shares; i++)
                if (w->shares[i].named) {
                        Reason why = {""};
                        int r = broker_share_revoke(w->b, w->shares[i].name, NULL, &why);
                        expect_rc(w, r, 0, &why);
                        share_end(w, (int)i);
                }
        for (size_t i = 0; i < w->n_fds; i++)
                if (w->fds[i].open) {
                        close(w->fds[i].fd);
                        w->fds[i].open = false;
                }
        broker_process_events(w->b);
        settle(w);
        for (int ai = 0; ai < N_ACCTS; ai++) {
                char who[32];
                snprintf(who, sizeof(who), "account %s at the end", acct_names[ai]);
                broker_account_usage(&w->accts[ai], &got);
                expect_zero(w, who, &got);
        }
        broker_totals(w->b, &got);
        expect_zero(w, "the totals at the end", &got);
        check_driver_empty(w, w->drv, "every client gone");
        for (int ai = 0; ai < N_ACCTS; ai++)
                broker_account_done(&w->accts[ai]);
        /* the broker and its driver, as they were found, for the worker's next sequence */
        fake_forget_freed(w->drv);
        w->wk->drv[w->gran != PAGE] = w->drv;
        w->wk->b[w->gran != PAGE] = w->b;
}

typedef struct OpKind {
        void (*fn)(World *w);
        unsigned weight;
        const char *name;
} OpKind;

static void op_map_gpus(World *w)
{
        op_map(w, false);
}

static void op_unmap_gpus(World *w)
{
        op_map(w, true);
}

static void op_restart_maybe(World *w)
{
        /* a restart costs a broker and a driver: now and then */
        if (w->restarts < 2)
                op_restart(w);
}

static const OpKind op_kinds[] = {
        {op_alloc, 18, "alloc"},
        {op_free, 10, "free"},
        {op_map_gpus, 4, "map"},
        {op_unmap_gpus, 4, "unmap"},
        {op_vmm_reserve, 5, "vmm_reserve"},
        {op_vmm_free, 3, "vmm_free"},
        {op_vmm_create, 6, "vmm_create"},
        {op_vmm_map, 8, "vmm_map"},
        {op_vmm_unmap, 4, "vmm_unmap"},
        {op_set_access, 8, "vmm_set_access"},
        {op_get_access, 2, "vmm_get_access"},
        {op_vmm_release, 4, "vmm_release"},
        {op_vmm_retain, 2, "vmm_retain"},
        {op_export, 6, "export"},
        {op_import, 7, "import"},
        {op_close, 5, "close"},
        {op_share_publish, 4, "share_publish"},
        {op_share_open, 4, "share_open"},
        {op_share_revoke, 2, "share_revoke"},
        {op_svm, 3, "svm"},
        {op_teardown, 2, "teardown"},
        {op_set_account, 2, "set_account"},
        {op_restart_maybe, 1, "restart"},
        {op_pointer_info, 3, "pointer_info"},
        {op_properties, 2, "properties"},
        {op_mem_info, 1, "mem_info"},
        {op_queue, 1, "queue_create"},
};
_Static_assert(sizeof(op_kinds) / sizeof(op_kinds[0]) <= N_OP_KINDS, "op kinds");

/* Open fds, the inotify ones aside: the closer threads close those in their time. */
static unsigned open_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        unsigned n = 0;

        if (!d)
                return 0;
        while ((e = readdir(d))) {
                char path[300], target[64];
                ssize_t len;
                snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
                len = readlink(path, target, sizeof(target) - 1);
                /* one that went meanwhile was an inotify fd the closers closed */
                n += len >= 0 && ((size_t)len != strlen("anon_inode:inotify") ||
                                  memcmp(target, "anon_inode:inotify", (size_t)len) != 0);
        }
        closedir(d);
        return n;
}

/* The run: sequences handed to workers by seed, their counts summed. */
static struct {
        pthread_mutex_t lock;
        uint64_t next, end;
        bool verbose, count_fds;
        Stats stats;
} run = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void run_sequence(Worker *wk, World *w, uint64_t seed)
{
        unsigned total = 0, fds = run.count_fds ? open_fds() : 0, ops;

        memset(w, 0, sizeof(*w));
        w->wk = wk;
        w->verbose = run.verbose;
        world_start(w, seed);
        for (size_t i = 0; i < sizeof(op_kinds) / sizeof(op_kinds[0]); i++)
                total += op_kinds[i].weight;
        ops = 20 + (unsigned)below(w, 31);
        for (unsigned i = 0; i < ops; i++) {
                unsigned pick = (unsigned)below(w, total);
                size_t k = 0;
                while (pick >= op_kinds[k].weight)
                        pick -= op_kinds[k++].weight;
                w->op_index = (int)i;
                describe(w, "?");
                w->last_rc = 1;
                w->fault_note[0] = 0;
                op_kinds[k].fn(w);
                wk->stats.runs[k]++;
                wk->stats.ok[k] += w->last_rc == 0;
                if (w->verbose)
                        printf("seed %" PRIu64 " op %u: %s: %s%s\n", seed, i, w->op,
                               w->last_rc == 1 ? "done"
                               : w->last_rc    ? strerror(-w->last_rc)
                                               : "ok",
                               w->fault_note);
                check_world(w);
                wk->stats.operations++;
        }
        w->op_index = (int)ops;
        world_end(w);
        /* one worker alone: every fd but the inotify ones the closers have not closed yet is its own */
        if (run.count_fds && open_fds() != fds)
                fail(w, "%u fds open after the sequence, %u before", open_fds(), fds);
        wk->stats.sequences++;
}

/* A worker's windows and shared region: reserved in this process as the daemon reserves them. */
static int reserve_space(Worker *w)
{
        uint64_t need = N_CLIENTS * (WINDOW_SIZE + WINDOW_ALIGN) + REGION_SIZE + WINDOW_ALIGN, at;
        void *p = mmap(NULL, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

        if (p == MAP_FAILED)
                return -errno;
        at = round_up((uint64_t)(uintptr_t)p, WINDOW_ALIGN);
        /* a gap between windows: no object of one touches another */
        for (int ci = 0; ci < N_CLIENTS; ci++) {
                w->window_bases[ci] = at;
                at += WINDOW_SIZE + WINDOW_ALIGN;
        }
        w->region_base = at;
        return 0;
}

/* A worker runs sequences one at a time, the next seed each (one worker by default; --jobs N runs more). */
static void *worker(void *arg)
{
        Worker *wk = calloc(1, sizeof(*wk));
        World *w = calloc(1, sizeof(*w));

        (void)arg;
        if (!wk || !w || reserve_space(wk) < 0) {
                fprintf(stderr, "broker-model: cannot set a worker up: %s\n", strerror(errno));
                exit(EXIT_FAILURE);
        }
        for (;;) {
                uint64_t seed;
                pthread_mutex_lock(&run.lock);
                seed = run.next < run.end ? run.next++ : 0;
                pthread_mutex_unlock(&run.lock);
                if (!seed)
                        break;
                run_sequence(wk, w, seed);
        }
        for (int i = 0; i < 2; i++)
                if (wk->b[i]) {
                        end_broker(wk->b[i]);
                        driver_close(wk->drv[i]);
                }
        pthread_mutex_lock(&run.lock);
        run.stats.sequences += wk->stats.sequences;
        run.stats.operations += wk->stats.operations;
        run.stats.injected += wk->stats.injected;
        run.stats.errors += wk->stats.errors;
        run.stats.restarts += wk->stats.restarts;
        run.stats.restarts_refused += wk->stats.restarts_refused;
        run.stats.teardowns += wk->stats.teardowns;
        for (int i = 0; i < N_OP_KINDS; i++) {
                run.stats.runs[i] += wk->stats.runs[i];
                run.stats.ok[i] += wk->stats.ok[i];
        }
        pthread_mutex_unlock(&run.lock);
        free(w);
        free(wk);
        return NULL;
}

int main(int argc, char **argv)
{
        uint64_t count = 10000, first = 1;
        unsigned jobs = 1, fds = open_fds();
        bool one = false, coverage = false;
        const char *env = getenv("BROKER_MODEL_SEQUENCES");
        pthread_t threads[64];

        if (env && *env)
                count = strtoull(env, NULL, 0);
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
                        count = strtoull(argv[++i], NULL, 0);
                else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
                        first = strtoull(argv[++i], NULL, 0);
                        one = true;
                } else if (strcmp(argv[i], "--from") == 0 && i + 1 < argc)
                        first = strtoull(argv[++i], NULL, 0);
                else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc)
                        jobs = (unsigned)strtoul(argv[++i], NULL, 0);
                else if (strcmp(argv[i], "--verbose") == 0)
                        run.verbose = true;
                else if (strcmp(argv[i], "--coverage") == 0)
                        coverage = true;
                else {
                        fprintf(stderr,
                                "usage: %s [--count N] [--from SEED] [--seed SEED] [--jobs N] [--verbose] "
                                "[--coverage]\n",
                                argv[0]);
                        return 2;
                }
        }
        if (one)
                count = 1;
        if (one || run.verbose)
                jobs = 1;
        if (jobs < 1)
                jobs = 1;
        if (jobs > 64)
                jobs = 64;
        if (first == 0)
                first = 1; /* 0 ends a worker */
        run.next = first;
        run.end = first + count;
        run.count_fds = jobs == 1;
        for (unsigned j = 0; j < CLOSERS; j++)
                if (pthread_create(&closer.threads[j], NULL, closer_main, NULL) != 0) {
                        fprintf(stderr, "broker-model: cannot start a closer\n");
                        return 1;
                }
        for (unsigned j = 0; j < jobs; j++)
                if (pthread_create(&threads[j], NULL, worker, NULL) != 0) {
                        fprintf(stderr, "broker-model: cannot start a worker\n");
                        return 1;
                }
        for (unsigned j = 0; j < jobs; j++)
                pthread_join(threads[j], NULL);
        pthread_mutex_lock(&closer.lock);
        closer.stop = true;
        pthread_cond_broadcast(&closer.cond);
        pthread_mutex_unlock(&closer.lock);
        for (unsigned j = 0; j < CLOSERS; j++)
                pthread_join(closer.threads[j], NULL);
        if (open_fds() != fds) {
                fprintf(stderr,
                        "broker-model: %u fds open at the end, %u at the start (--jobs 1 finds the seed)\n",
                        open_fds(), fds);
                return 1;
        }
        printf("broker-model: %" PRIu64 " sequences, %" PRIu64 " operations, %" PRIu64
               " injected failures (%" PRIu64 " errors expected and met, %" PRIu64 " restarts, %" PRIu64
               " refused, %" PRIu64 " teardowns)\n",
               run.stats.sequences, run.stats.operations, run.stats.injected, run.stats.errors,
               run.stats.restarts, run.stats.restarts_refused, run.stats.teardowns);
        for (size_t i = 0; coverage && i < sizeof(op_kinds) / sizeof(op_kinds[0]); i++)
                printf("broker-model: %-15s %8" PRIu64 " made, %8" PRIu64 " succeeded\n", op_kinds[i].name,
                       run.stats.runs[i], run.stats.ok[i]);
        return 0;
}
