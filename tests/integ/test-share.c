/* Named shares across uids and classes: publish, open, revoke, roles on GPU and CPU, lifetimes, accounting.
 * One daemon with one policy; every case leaves the daemon as it found it. Needs root (readers are other
 * uids). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB       (1ull << 20)
#define UID_READ  65534 /* class readers: may read weights and scratch shares */
#define UID_WRITE 65533 /* class writers: may read and write scratch shares */
#define UID_OTHER 65532 /* class others: no share rights */

/* Root publishes; weights/ outlive their publisher. */
#define SHARE_CONFIG                                                                                         \
        "[daemon]\nlog-level = warning\n"                                                                    \
        "[class loaders]\nmatch-uid = 0\nshare-publish = weights/* scratch/*\n"                              \
        "share-persistent = weights/*\nshare-write = scratch/*\n"                                            \
        "[class readers]\nmatch-uid = 65534\nshare-read = weights/* scratch/*\nhandles = 8\n"                \
        "[class writers]\nmatch-uid = 65533\nshare-write = scratch/*\n"                                      \
        "[class others]\nmatch-all = yes\n"

static Daemon dmn;
static DaemonState base;
static uint32_t gpus[16];
static size_t n_gpus;

static uint64_t class_used(const char *cls, int resource)
{
        uint64_t used;

        CHECK_RC(daemon_class_quota(&dmn, cls, resource, 0, &used, NULL), 0);
        return used;
}

/* Wait (memory files are refunded a moment after their last holder goes) until @cls uses @want of @res. */
static bool class_reaches(const char *cls, int res, uint64_t want)
{
        return daemon_class_reaches(&dmn, cls, res, want, 5000) == 0;
}

/* The share @name as administrators list it; false when there is none. */
static bool find_share(const char *name, gm_share_info *ret)
{
        int r = daemon_share_info(&dmn, name, ret);

        if (r != -ENOENT)
                CHECK_RC(r, 0);
        return r == 0;
}

static gm_handle handle_of(gm_client *c, const void *p)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        return gm_pointer_get_attributes(c, p, &pa) == 0 ? pa.handle : 0;
}

static bool pattern_ok(const volatile uint8_t *p, size_t size, uint8_t seed)
{
        for (size_t i = 0; i < size; i += 4096)
                if (p[i] != (uint8_t)(seed + i / 4096))
                        return false;
        return true;
}

static void pattern_fill(volatile uint8_t *p, size_t size, uint8_t seed)
{
        for (size_t i = 0; i < size; i += 4096)
                p[i] = (uint8_t)(seed + i / 4096);
}

/* Whether writing to @p kills the writer (a read-only mapping), tried in a child. */
static bool write_faults(volatile uint8_t *p)
{
        pid_t pid = fork();

        if (pid == 0) {
                signal(SIGSEGV, SIG_DFL);
                p[0] = 0xee;
                _exit(0);
        }
        return child_status(pid) == 128 + SIGSEGV; /* it could only exit 0 */
}

/* ---- the GPU's side: an SDMA queue of the reader's writes into the share ---- */

#define SDMA_FENCE 5u /* the model's SDMA packet: write a dword at an address */

/*
 * A queue of @c on @gpu writes @value at @va, then a fence into @c's own memory: 1 when both ran; 0 when
 * the GPU faulted on @va's page as a write to read-only memory and nothing behind it ran; -1 otherwise.
 */
static int gpu_write(gm_client *c, uint32_t gpu, uint64_t va, uint32_t value)
{
        gm_alloc_desc d = {
                .kind = GM_KIND_HOST, .size = 64 << 10, .gpu_id = gpu, .flags = GM_MEM_GTT, .numa_node = -1};
        gm_memory_exception exc[2];
        size_t n_exc = 0;
        uint8_t *mem = NULL;
        uint32_t q_id = 0, ev = 0;
        uint64_t db = 0;
        pthread_t th;
        int ret = -1;

        if (gm_malloc_desc(c, &d, (void **)&mem) != 0)
                return -1;
        GttQueue g;

        gtt_queue_init(&g, mem, gpu);
        gm_queue_desc q = g.desc;
        if (gm_queue_create(c, &q, &q_id, &db) != 0 || gm_event_create(c, 8, false, NULL, &ev, NULL) != 0)
                return -1;
        EventWaiter w = {c, ev, -1};
        if (pthread_create(&th, NULL, event_waiter, &w) != 0)
                return -1;
        usleep(100000); /* the memory event's wait is pending before the GPU runs anything */
        const uint32_t p[] = {SDMA_FENCE,
                              (uint32_t)va,
                              (uint32_t)(va >> 32),
                              value,
                              SDMA_FENCE,
                              (uint32_t)(uintptr_t)g.fence,
                              (uint32_t)((uintptr_t)g.fence >> 32),
                              0xC0FFEEu};
        memcpy(g.ring, p, sizeof(p));
        __atomic_store_n(g.wptr, (uint64_t)sizeof(p), __ATOMIC_RELEASE);
        if (wait_u32(g.fence, 0xC0FFEEu, 1000)) {
                ret = 1;
                (void)gm_event_destroy(c, ev); /* the pending wait ends with it */
                pthread_join(th, NULL);
                (void)gm_queue_destroy(c, q_id);
                return ret;
        }
        pthread_join(th, NULL);
        if (w.result == 0 && gm_event_wait_faults(c, &ev, 1, false, 0, exc, 2, &n_exc) == 0 && n_exc == 1 &&
            exc[0].va == (va & ~4095ull) && exc[0].read_only && !exc[0].not_present && *g.fence == 0)
                ret = 0;
        else
                fprintf(stderr, "gpu_write: wait %d, %zu faults, va %#llx ro %d np %d\n", w.result, n_exc,
                        n_exc ? (unsigned long long)exc[0].va : 0ull, n_exc ? exc[0].read_only : -1,
                        n_exc ? exc[0].not_present : -1);
        return ret;
}

typedef struct Expect {
        const char *name;
        size_t size;
        uint8_t seed;
        void *va;
} Expect;

/* A reader: opens read-only, finds the data at the share's address, cannot write it on any path. */
static int reader_checks(void *arg)
{
        const Expect *x = arg;
        gm_client *c = daemon_client(&dmn, "reader");
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        gm_access_desc rw = {gpus[0], GM_ACCESS_READ_WRITE};
        gm_handle h = 0;
        size_t size = 0;
        void *p = NULL;
        int access = -1;

        REQUIRE(c);
        CHECK_EQ(gm_share_open(c, x->name, GM_SHARE_WRITE, NULL, 0, &p, NULL, NULL), -EACCES);
        REQUIRE_EQ(gm_share_open(c, x->name, 0, NULL, 0, &p, &size, &h), 0);
        CHECK(p == x->va);
        CHECK_EQ(size, x->size);
        CHECK(pattern_ok(p, size, x->seed));
        CHECK(write_faults(p));
        CHECK(mprotect(p, size, PROT_READ | PROT_WRITE) < 0 && errno == EACCES);
        CHECK_EQ(gm_pointer_get_attributes(c, (uint8_t *)p + 4096, &pa), 0);
        CHECK_EQ(pa.kind, GM_KIND_SHARE);
        CHECK_EQ(pa.handle, h);
        CHECK(pa.base == p);
        CHECK_EQ(pa.n_mapped_gpus, n_gpus); /* every GPU its class may use */
        CHECK_EQ(gm_mem_get_access(c, p, gpus[0], &access), 0);
        CHECK_EQ(access, GM_ACCESS_READ);
        CHECK_EQ(gm_mem_set_access(c, p, size, &rw, 1), -EACCES);
        /* the GPU's mapping is read-only too: a write from the reader's own queue faults, changes nothing */
        CHECK_EQ(gpu_write(c, gpus[1 % n_gpus], (uintptr_t)p + 8192, 0xbad), 0);
        CHECK(pattern_ok(p, size, x->seed));
        CHECK_EQ(gm_share_open(c, x->name, 0, NULL, 0, &p, NULL, NULL), -EBUSY);
        /* nothing else of the client's goes where its share is: not the memory of an SVM range */
        {
                gm_alloc_desc d = {.kind = GM_KIND_HOST,
                                   .size = 2 * MiB,
                                   .flags = GM_MEM_GTT | GM_MEM_SVM_RANGE,
                                   .numa_node = -1,
                                   .fixed_addr = p};
                void *q = NULL;
                int r = gm_malloc_desc(c, &d, &q);
                CHECK(r == -EADDRINUSE || r == -EEXIST);
        }
        /* a reader's handle is opened by name only: not exported again, not revoked by it */
        CHECK_EQ(gm_mem_export(c, h, &(int){-1}, NULL), -EINVAL);
        CHECK_EQ(gm_share_revoke(c, x->name), -EACCES);
        CHECK_EQ(gm_share_close(c, p), 0);
        gm_client_close(c);
        return 0;
}

/* A read-write reader writes; the publisher sees it. */
static int writer_checks(void *arg)
{
        const Expect *x = arg;
        gm_client *c = daemon_client(&dmn, "writer");
        int access = -1;
        void *p = NULL;

        REQUIRE(c);
        /* an SVM range of its own where the share lives: the share cannot be opened over it */
        {
                gm_alloc_desc d = {.kind = GM_KIND_HOST,
                                   .size = 2 * MiB,
                                   .flags = GM_MEM_GTT | GM_MEM_SVM_RANGE,
                                   .numa_node = -1,
                                   .fixed_addr = x->va};
                void *q = NULL;
                CHECK_EQ(gm_malloc_desc(c, &d, &q), 0);
                CHECK_EQ(gm_share_open(c, x->name, GM_SHARE_WRITE, NULL, 0, &p, NULL, NULL), -EADDRINUSE);
                CHECK_EQ(gm_mem_free(c, q), 0);
        }
        CHECK_EQ(gm_share_open(c, x->name, GM_SHARE_WRITE, &(uint32_t){12345}, 1, &p, NULL, NULL), -ENODEV);
        REQUIRE_EQ(gm_share_open(c, x->name, GM_SHARE_WRITE, &gpus[0], 1, &p, NULL, NULL), 0);
        CHECK(pattern_ok(p, x->size, x->seed));
        pattern_fill(p, x->size, (uint8_t)(x->seed + 1));
        /* a read-write reader's GPU writes the share (a word the page pattern does not look at) */
        CHECK_EQ(gpu_write(c, gpus[0], (uintptr_t)p + 4096 + 64, 0x600dcafe), 1);
        CHECK_EQ(gm_mem_get_access(c, p, gpus[0], &access), 0);
        CHECK_EQ(access, GM_ACCESS_READ_WRITE);
        if (n_gpus > 1) {
                CHECK_EQ(gm_mem_get_access(c, p, gpus[1], &access), 0);
                CHECK_EQ(access, GM_ACCESS_NONE); /* only the GPU it asked for */
        }
        CHECK_EQ(gm_share_close(c, p), 0);
        gm_client_close(c);
        return 0;
}

static int open_expect(void *arg);

/*
 * Publish device memory, open it from two other classes with their roles, revoke it: the publisher's class
 * pays once (the memory, one handle for the share, one fd), readers pay a handle each.
 */
static void test_publish_open_revoke(void)
{
        gm_client *pub = daemon_client(&dmn, "loader");
        gm_share_info info = {0}, listed = {0};
        void *dev = NULL;
        Expect x = {"scratch/a", 4 * MiB, 7, NULL};

        if (!pub)
                return;
        CHECK_EQ(gm_malloc(pub, x.size, gpus[0], GM_MEM_HOST_VISIBLE, &dev), 0);
        if (!dev)
                goto out;
        pattern_fill(dev, x.size, x.seed);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, dev), x.name, 0, &info), 0);
        x.va = info.ptr;
        CHECK(info.ptr != NULL && info.ptr != dev);
        CHECK_EQ(info.size, x.size);
        CHECK(!info.persistent); /* scratch/ is not share-persistent */
        CHECK(class_reaches("loaders", GM_RESOURCE_VRAM, x.size));
        CHECK(class_reaches("loaders", GM_RESOURCE_HANDLES, 2));
        CHECK(find_share(x.name, &listed));
        CHECK_EQ(listed.owner_client_id, gm_client_id(pub));
        CHECK_STR_CONTAINS(listed.owner_class, "loaders");
        CHECK_EQ(listed.kind, GM_KIND_DEVICE);
        CHECK_EQ(listed.readers, 0);

        /* the writer first: once a reader opened the share read-only, its memory is sealed against new
         * writable mappings, and a writer's open is refused */
        CHECK_EQ(run_as(UID_WRITE, writer_checks, &x), 0);
        CHECK(pattern_ok(dev, x.size, (uint8_t)(x.seed + 1))); /* the writer's data, in the original */
        CHECK_EQ(((volatile uint32_t *)dev)[(4096 + 64) / 4], 0x600dcafeu); /* and its GPU's */
        x.seed++;
        CHECK_EQ(run_as(UID_READ, reader_checks, &x), 0);
        CHECK_EQ(run_as(UID_WRITE, open_expect, &(Expect){x.name, EPERM, GM_SHARE_WRITE, NULL}), 0);
        /* the publisher's own mapping, made before the seal, stays writable */
        pattern_fill(dev, x.size, (uint8_t)(x.seed + 1));
        CHECK(pattern_ok(dev, x.size, (uint8_t)(x.seed + 1)));
        CHECK(find_share(x.name, &listed));
        CHECK_EQ(listed.opens, 2); /* the reader's and the writer's; refused opens do not count */
        CHECK_EQ(listed.readers, 0);
        CHECK(class_reaches("readers", GM_RESOURCE_HANDLES, 0));
        /* readers paid nothing for the memory */
        CHECK_EQ(class_used("readers", GM_RESOURCE_VRAM), 0);
        CHECK_EQ(class_used("writers", GM_RESOURCE_VRAM), 0);

        CHECK_EQ(gm_share_revoke(pub, x.name), 0);
        CHECK(!find_share(x.name, &listed));
        CHECK_EQ(gm_share_revoke(pub, x.name), -ENOENT);
        /* the name is free again at once; the memory, sealed, is published again read-only only */
        {
                gm_share_info again = {0};
                CHECK_EQ(gm_share_publish(pub, handle_of(pub, dev), x.name, 0, &again), -EPERM);
                CHECK_EQ(gm_share_publish(pub, handle_of(pub, dev), x.name, GM_SHARE_READ_ONLY, &again), 0);
                CHECK_EQ(gm_share_revoke(pub, x.name), 0);
        }
        CHECK(class_reaches("loaders", GM_RESOURCE_HANDLES, 1));
        CHECK_EQ(gm_mem_free(pub, dev), 0);
        CHECK(class_reaches("loaders", GM_RESOURCE_VRAM, 0));
out:
        gm_client_close(pub);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

typedef struct Sealing {
        const char *name;
        int ready[2], go[2];
} Sealing;

/* A read-write reader that maps the share before it is sealed and writes it with its GPU after. */
static int gpu_writer_across_seal(void *arg)
{
        Sealing *x = arg;
        gm_client *c = daemon_client(&dmn, "writer");
        void *p = NULL;
        char b = 0;
        int r;

        REQUIRE(c);
        REQUIRE_EQ(gm_share_open(c, x->name, GM_SHARE_WRITE, &gpus[0], 1, &p, NULL, NULL), 0);
        REQUIRE(write(x->ready[1], "r", 1) == 1 && read(x->go[0], &b, 1) == 1);
        r = gpu_write(c, gpus[0], (uintptr_t)p + 64, 0x5ea1ed);
        CHECK_EQ(r, 1);
        CHECK_EQ(gm_share_close(c, p), 0);
        gm_client_close(c);
        return r == 1 ? 0 : 1;
}

static int read_only_open(void *arg)
{
        gm_client *c = daemon_client(&dmn, "reader");
        void *p = NULL;
        int r;

        REQUIRE(c);
        r = gm_share_open(c, arg, 0, NULL, 0, &p, NULL, NULL);
        gm_client_close(c);
        return r == 0 ? 0 : 1;
}

typedef struct WriterRun {
        Sealing *x;
        int status;
} WriterRun;

static void *writer_thread(void *arg)
{
        WriterRun *w = arg;
        w->status = run_as(UID_WRITE, gpu_writer_across_seal, w->x);
        return NULL;
}

/*
 * A read-only open seals the share's memory against new writable mappings; GPU access granted before keeps
 * writing it: a read-write reader's queue, which had not touched the memory before the seal, writes after
 * it, and the publisher sees it.
 */
static int seal_gpu_case(void)
{
        gm_client *pub = daemon_client(&dmn, "loader");
        Sealing x = {"scratch/gpu", {-1, -1}, {-1, -1}};
        WriterRun w = {&x, -1};
        pthread_t th;
        void *dev = NULL;
        char b = 0;

        REQUIRE(pub);
        REQUIRE_EQ(pipe(x.ready), 0);
        REQUIRE_EQ(pipe(x.go), 0);
        REQUIRE_EQ(gm_malloc(pub, 2 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &dev), 0);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, dev), x.name, 0, NULL), 0);
        REQUIRE_EQ(pthread_create(&th, NULL, writer_thread, &w), 0);
        CHECK(read(x.ready[0], &b, 1) == 1);
        CHECK_EQ(run_as(UID_READ, read_only_open, (void *)x.name), 0);
        CHECK(write(x.go[1], "g", 1) == 1);
        pthread_join(th, NULL);
        CHECK_EQ(w.status, 0);
        CHECK_EQ(((volatile uint32_t *)dev)[64 / 4], 0x5ea1edu);
        CHECK_EQ(gm_share_revoke(pub, x.name), 0);
        CHECK_EQ(gm_mem_free(pub, dev), 0);
        for (int i = 0; i < 2; i++) {
                close(x.ready[i]);
                close(x.go[i]);
        }
        gm_client_close(pub);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
        return 0;
}

static void test_seal_keeps_gpu_writes(void)
{
        (void)seal_gpu_case();
}

static int open_expect(void *arg)
{
        const Expect *x = arg;
        gm_client *c = daemon_client(&dmn, "denied");
        void *p = NULL;
        int r;

        REQUIRE(c);
        r = gm_share_open(c, x->name, x->seed, NULL, 0, &p, NULL, NULL);
        gm_client_close(c);
        return r == -(int)x->size ? 0 : 1;
}

static int publish_denied(void *arg)
{
        gm_client *c = daemon_client(&dmn, "reader-publishes");
        void *dev = NULL;
        int r = 1;

        (void)arg;
        REQUIRE(c);
        if (gm_malloc(c, 2 * MiB, gpus[0], 0, &dev) == 0)
                r = gm_share_publish(c, handle_of(c, dev), "weights/mine", 0, NULL) == -EACCES ? 0 : 1;
        gm_client_close(c);
        return r;
}

/* Names that conflict or are invalid, rights a class lacks, shares that do not exist. */
static void test_denials(void)
{
        gm_client *pub = daemon_client(&dmn, "loader");
        void *a = NULL, *b = NULL;

        if (!pub)
                return;
        CHECK_EQ(gm_malloc(pub, 2 * MiB, gpus[0], 0, &a), 0);
        CHECK_EQ(gm_malloc(pub, 2 * MiB, gpus[0], 0, &b), 0);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, a), "scratch/x", 0, NULL), 0);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, b), "scratch/x", 0, NULL), -EEXIST);
        /* a read-only publish refused (here: a name another holds) seals nothing: still exported writable */
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, b), "scratch/x", GM_SHARE_READ_ONLY, NULL), -EEXIST);
        {
                int fd = -1;
                CHECK_EQ(gm_mem_export(pub, handle_of(pub, b), &fd, NULL), 0);
                if (fd >= 0)
                        close(fd);
        }
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, a), "scratch/y", 0, NULL), -EBUSY);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, b), "other/x", 0, NULL), -EACCES);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, b), "scratch/../x", 0, NULL), -EINVAL);
        CHECK_EQ(gm_share_publish(pub, 12345, "scratch/z", 0, NULL), -ENOENT);
        CHECK_EQ(gm_share_revoke(pub, "scratch/none"), -ENOENT);
        /* a class with no share rights opens nothing; a read-only class does not write */
        CHECK_EQ(run_as(UID_OTHER, open_expect, &(Expect){"scratch/x", EACCES, 0, NULL}), 0);
        CHECK_EQ(run_as(UID_READ, open_expect, &(Expect){"scratch/none", ENOENT, 0, NULL}), 0);
        CHECK_EQ(run_as(UID_READ, open_expect, &(Expect){"scratch/x", EACCES, GM_SHARE_WRITE, NULL}), 0);
        CHECK_EQ(run_as(UID_READ, publish_denied, NULL), 0);
        CHECK_EQ(class_used("loaders", GM_RESOURCE_HANDLES), 3);
        CHECK_EQ(gm_mem_free(pub, a), 0); /* not persistent: the share ends with its memory */
        {
                gm_share_info i;
                CHECK(!find_share("scratch/x", &i));
        }
        CHECK_EQ(gm_mem_free(pub, b), 0);
        gm_client_close(pub);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

/* A reader that holds a share open and waits to be told what to check, over a pipe. */
typedef struct Holder {
        pid_t pid;
        int sync; /* the holder writes 'o' once it holds the share, and waits for 'g' */
} Holder;

static const char *holder_share; /* the share the next holder opens, set before it is forked */

static int holder_main(void *arg)
{
        int sync = *(int *)arg;
        const char *name = holder_share;
        gm_client *c = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        void *p = NULL;
        size_t size = 0;
        char ch;
        int r;

        if (gm_client_connect(dmn.sock, "holder", &c) != 0 ||
            gm_share_open(c, name, 0, NULL, 0, &p, &size, NULL))
                return 2;
        if (write(sync, "o", 1) != 1)
                return 3;
        /* told that the share went: its GPU access is gone, the CPU mapping stays readable */
        if (read(sync, &ch, 1) != 1)
                return 4;
        r = gm_pointer_get_attributes(c, p, &pa);
        if (r != -ESTALE)
                return 5;
        if (!pattern_ok(p, size, 9))
                return 6;
        if (gm_share_close(c, p) != 0)
                return 7;
        gm_client_close(c);
        return 0;
}

static bool holder_start(Holder *h, uid_t uid, const char *name)
{
        char ch;

        holder_share = name;
        h->pid = fork_as_synced(uid, holder_main, &h->sync);
        return h->pid > 0 && read(h->sync, &ch, 1) == 1;
}

static int holder_finish(Holder *h)
{
        if (write(h->sync, "g", 1) != 1)
                kill(h->pid, SIGKILL);
        close(h->sync);
        return child_status(h->pid);
}

/*
 * A persistent share outlives its handle and its publisher's connection, charged to the publisher's class
 * all along; an administrator revokes it: a reader that holds it gets -ESTALE, keeps its CPU mapping, and the
 * class is refunded once that goes too.
 */
static void test_persistent(void)
{
        gm_client *pub = daemon_client(&dmn, "loader"), *adm;
        gm_share_info info = {0}, listed = {0};
        Holder h = {0};
        void *host = NULL;

        if (!pub)
                return;
        /* host memory this time */
        CHECK_EQ(gm_host_malloc(pub, 2 * MiB, 0, -1, 0, &host), 0);
        if (!host)
                goto out;
        pattern_fill(host, 2 * MiB, 9);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, host), "weights/llm", GM_SHARE_READ_ONLY, &info), 0);
        CHECK(info.persistent && info.read_only);
        CHECK_EQ(gm_mem_free(pub, host), 0);
        gm_client_close(pub);
        pub = NULL;
        CHECK(find_share("weights/llm", &listed));
        CHECK_EQ(listed.owner_client_id, 0); /* its publisher went */
        CHECK_EQ(listed.kind, GM_KIND_HOST);
        CHECK(class_reaches("loaders", GM_RESOURCE_HOST, 2 * MiB));
        CHECK(class_reaches("loaders", GM_RESOURCE_HANDLES, 1));
        CHECK(class_reaches("loaders", GM_RESOURCE_FDS, 1));

        CHECK(holder_start(&h, UID_READ, "weights/llm"));
        CHECK(find_share("weights/llm", &listed));
        CHECK_EQ(listed.readers, 1);
        adm = daemon_client(&dmn, "admin");
        if (adm) {
                CHECK_EQ(gm_share_revoke(adm, "weights/llm"), 0);
                gm_client_close(adm);
        }
        CHECK(!find_share("weights/llm", &listed));
        /* the reader's CPU mapping still holds the memory: still charged */
        CHECK_EQ(class_used("loaders", GM_RESOURCE_HOST), 2 * MiB);
        /* the name is free again, but not the address the stale reader still maps */
        {
                gm_client *again = daemon_client(&dmn, "loader-again");
                gm_share_info i2 = {0};
                void *h2 = NULL;
                if (again) {
                        CHECK_EQ(gm_host_malloc(again, 2 * MiB, 0, -1, 0, &h2), 0);
                        CHECK_EQ(gm_share_publish(again, handle_of(again, h2), "weights/llm", 0, &i2), 0);
                        CHECK(i2.ptr != NULL && i2.ptr != info.ptr);
                        CHECK_EQ(gm_share_revoke(again, "weights/llm"), 0);
                        CHECK_EQ(gm_mem_free(again, h2), 0);
                        gm_client_close(again);
                }
        }
        CHECK_EQ(holder_finish(&h), 0);
        CHECK(class_reaches("loaders", GM_RESOURCE_HOST, 0));
        CHECK(class_reaches("loaders", GM_RESOURCE_HANDLES, 0));
        CHECK(class_reaches("readers", GM_RESOURCE_HANDLES, 0));
out:
        gm_client_close(pub);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

/* A publisher killed while a reader maps its (not persistent) share: the share ends with it. */
static void test_publisher_killed(void)
{
        int ready[2];
        Holder h = {0};
        pid_t pid;
        char ch;
        gm_share_info listed;

        CHECK(pipe(ready) == 0);
        pid = fork();
        if (pid == 0) {
                gm_client *c = NULL;
                gm_handle vh = 0;
                close(ready[0]);
                /* VMM memory, mapped here for the CPU to fill it */
                if (gm_client_connect(dmn.sock, "doomed", &c) != 0 ||
                    gm_mem_create(c, 2 * MiB, gpus[0], 0, &vh) != 0)
                        _exit(2);
                {
                        void *res = NULL;
                        gm_access_desc cpu = {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE};
                        if (gm_mem_address_reserve(c, 2 * MiB, 0, NULL, 0, &res) ||
                            gm_mem_map(c, res, 2 * MiB, 0, vh) || gm_mem_set_access(c, res, 2 * MiB, &cpu, 1))
                                _exit(3);
                        pattern_fill(res, 2 * MiB, 9);
                }
                if (gm_share_publish(c, vh, "scratch/doomed", 0, NULL) != 0)
                        _exit(4);
                if (write(ready[1], "r", 1) != 1)
                        _exit(5);
                pause();
                _exit(0);
        }
        close(ready[1]);
        CHECK(pid > 0 && read(ready[0], &ch, 1) == 1);
        close(ready[0]);
        CHECK(holder_start(&h, UID_READ, "scratch/doomed"));
        CHECK(find_share("scratch/doomed", &listed));
        CHECK_EQ(listed.kind, GM_KIND_VMM);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        for (int i = 0; i < 250 && find_share("scratch/doomed", &listed); i++)
                usleep(20000);
        CHECK(!find_share("scratch/doomed", &listed));
        CHECK_EQ(holder_finish(&h), 0);
        CHECK(class_reaches("loaders", GM_RESOURCE_VRAM, 0));
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

/* A reader killed while it maps a share: its part goes, the share and its accounting stay as they were. */
static void test_reader_killed(void)
{
        gm_client *pub = daemon_client(&dmn, "loader");
        gm_share_info listed = {0};
        Holder h = {0};
        void *dev = NULL;

        if (!pub)
                return;
        CHECK_EQ(gm_malloc(pub, 2 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &dev), 0);
        if (!dev)
                goto out;
        pattern_fill(dev, 2 * MiB, 9);
        CHECK_EQ(gm_share_publish(pub, handle_of(pub, dev), "scratch/r", 0, NULL), 0);
        CHECK(holder_start(&h, UID_READ, "scratch/r"));
        CHECK(class_reaches("readers", GM_RESOURCE_HANDLES, 1));
        kill(h.pid, SIGKILL);
        CHECK_EQ(holder_finish(&h), 128 + SIGKILL);
        CHECK(class_reaches("readers", GM_RESOURCE_HANDLES, 0));
        CHECK(find_share("scratch/r", &listed));
        CHECK_EQ(listed.readers, 0);
        CHECK_EQ(class_used("loaders", GM_RESOURCE_VRAM), 2 * MiB);
        CHECK_EQ(class_used("loaders", GM_RESOURCE_HANDLES), 2);
        CHECK_EQ(gm_mem_free(pub, dev), 0);
out:
        gm_client_close(pub);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

int main(void)
{
        static const TestCase cases[] = {
                {"publish, open with each role, revoke", test_publish_open_revoke},
                {"a read-only open keeps the GPU writes granted before it", test_seal_keeps_gpu_writes},
                {"conflicts, invalid names and denials", test_denials},
                {"a persistent share outlives its publisher until revoked", test_persistent},
                {"a publisher killed while a reader maps its share", test_publisher_killed},
                {"a reader killed while it maps a share", test_reader_killed},
        };
        int r = EXIT_FAILURE;

        if (geteuid() != 0) {
                fprintf(stderr, "not root: readers of other uids cannot be made\n");
                return 77;
        }
        signal(SIGPIPE, SIG_IGN);
        if (daemon_start(&dmn, "mi300x", SHARE_CONFIG, NULL) == 0 && daemon_gpus(&dmn, gpus, 16) > 0 &&
            daemon_base_state(&dmn, &base) == 0) {
                /* readers of other uids reach the socket; the policy decides what they may do */
                chmod(dmn.dir, 0755);
                chmod(dmn.sock, 0666);
                n_gpus = (size_t)daemon_gpus(&dmn, gpus, 16);
                r = run_tests(cases, ARRAY_SIZE(cases));
        }
        if (dmn.pid > 0 && daemon_stop(&dmn) != 0)
                r = EXIT_FAILURE;
        daemon_cleanup(&dmn);
        return r;
}
