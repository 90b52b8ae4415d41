/* The client library's hot path: calls that allocate nothing, and one gm_client shared by many threads. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB (1ull << 20)

/*
 * Allocations are counted on the calling thread only, while it counts: the harness's own thread and the
 * rest of the process go on allocating as they like. A sanitizer owns malloc and offers hooks for this;
 * otherwise this program defines malloc and its kin over glibc's, which every shared object of the
 * process then calls (protobuf-c's default allocator included). Linking with --wrap=malloc would see only
 * the calls made from this program's own objects, not from libgpumem_client or libprotobuf-c.
 */
static __thread bool counting;
static __thread unsigned long counted;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZER_ALLOCATOR 1
#endif
#endif

#ifdef SANITIZER_ALLOCATOR
/* from compiler-rt's sanitizer/allocator_interface.h, which GCC does not install */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));

static void on_malloc(const volatile void *p, size_t size)
{
        (void)p;
        (void)size;
        if (counting)
                counted++;
}

static void on_free(const volatile void *p)
{
        (void)p;
}

static void count_init(void)
{
        __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}
#else
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);

void *malloc(size_t size)
{
        if (counting)
                counted++;
        return __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
        if (counting)
                counted++;
        return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
        if (counting)
                counted++;
        return __libc_realloc(p, size);
}

void free(void *p)
{
        __libc_free(p);
}

static void count_init(void)
{
}
#endif

static Daemon dmn;
static uint32_t gpus[16];
static size_t n_gpus;

/* What one kind of call costs in allocations; @max is what it may take per call. */
typedef struct Op {
        const char *name;
        int (*fn)(gm_client *c, void *arg);
        unsigned max;
} Op;

typedef struct Target {
        void *dev;     /* 4 KiB of device memory on the first GPU */
        void *managed; /* 2 MiB of managed memory */
} Target;

static int op_ping(gm_client *c, void *arg)
{
        (void)arg;
        return gm_ping(c);
}

static int op_pointer_query(gm_client *c, void *arg)
{
        const Target *t = arg;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int r = gm_pointer_get_attributes(c, t->dev, &pa);
        return r < 0 ? r : pa.base == t->dev && pa.size == 4096 ? 0 : -EPROTO;
}

static int op_pointer_query_missing(gm_client *c, void *arg)
{
        const Target *t = arg;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        /* an error reply carries a reason: decoded and kept without an allocation too */
        int r = gm_pointer_get_attributes(c, (char *)t->dev + 64 * MiB, &pa);
        return r == -ENOENT || r == -EFAULT ? 0 : -EPROTO;
}

static int op_mem_info(gm_client *c, void *arg)
{
        size_t free_b = 0, total = 0;
        (void)arg;
        return gm_mem_get_info(c, gpus[0], &free_b, &total);
}

static int op_map_unmap(gm_client *c, void *arg)
{
        const Target *t = arg;
        int r = gm_mem_map_gpus(c, t->dev, &gpus[1], 1);
        return r < 0 ? r : gm_mem_unmap_gpus(c, t->dev, &gpus[1], 1);
}

static int op_svm_set(gm_client *c, void *arg)
{
        const Target *t = arg;
        gm_svm_attr a[] = {{GM_SVM_ATTR_PREFERRED_LOC, gpus[0]}, {GM_SVM_ATTR_GRANULARITY, 9}};
        return gm_svm_set_attributes(c, t->managed, 2 * MiB, a, ARRAY_SIZE(a));
}

static int op_svm_get(gm_client *c, void *arg)
{
        const Target *t = arg;
        gm_svm_attr a[] = {{GM_SVM_ATTR_PREFERRED_LOC, 0}, {GM_SVM_ATTR_GRANULARITY, 0}};
        return gm_svm_get_attributes(c, t->managed, 2 * MiB, a, ARRAY_SIZE(a));
}

static int op_export(gm_client *c, void *arg)
{
        const Target *t = arg;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int fd = -1;
        int r = gm_pointer_get_attributes(c, t->dev, &pa);
        if (r == 0)
                r = gm_mem_export(c, pa.handle, &fd, NULL);
        if (fd >= 0)
                close(fd);
        return r;
}

static int op_alloc_free(gm_client *c, void *arg)
{
        void *p = NULL;
        int r;
        (void)arg;
        r = gm_malloc(c, 4096, gpus[0], 0, &p);
        return r < 0 ? r : gm_mem_free(c, p);
}

/* Run @op @n times while counting; returns the allocations it made, or ~0ul when a call failed. */
static unsigned long count_calls(gm_client *c, const Op *op, void *arg, unsigned n)
{
        unsigned long got;
        int failed = 0;

        counted = 0;
        counting = true;
        for (unsigned i = 0; i < n; i++)
                failed |= op->fn(c, arg) < 0;
        counting = false;
        got = counted;
        return failed ? ~0ul : got;
}

static void test_allocations(void)
{
        static const Op ops[] = {
                {"ping", op_ping, 0},
                {"pointer query", op_pointer_query, 0},
                {"pointer query (error reply)", op_pointer_query_missing, 0},
                {"mem info", op_mem_info, 0},
                {"map+unmap (second GPU)", op_map_unmap, 0},
                {"svm set attributes", op_svm_set, 0},
                {"svm get attributes", op_svm_get, 0},
                {"pointer query + dmabuf export (+fd)", op_export, 0},
                /* the library's record of the allocation, and nothing else */
                {"alloc+free (4 KiB device)", op_alloc_free, 1},
        };
        gm_client *c = daemon_client(&dmn, "allocations");
        Target t = {0};
        enum { N = 1000 };

        if (!c)
                return;
        CHECK(n_gpus >= 2);
        CHECK_EQ(gm_malloc(c, 4096, gpus[0], 0, &t.dev), 0);
        CHECK_EQ(gm_malloc_managed(c, 2 * MiB, 0, &t.managed), 0);
        if (t.dev && t.managed && n_gpus >= 2) {
                for (size_t i = 0; i < ARRAY_SIZE(ops); i++) {
                        /* the first calls may set up what later ones reuse */
                        CHECK_EQ(count_calls(c, &ops[i], &t, 10) == ~0ul, 0);
                        unsigned long got = count_calls(c, &ops[i], &t, N);
                        printf("# %-36s %lu allocations in %u calls\n", ops[i].name, got, N);
                        if (got > (unsigned long)ops[i].max * N)
                                fprintf(stderr, "%s: %lu allocations in %u calls, at most %u each allowed\n",
                                        ops[i].name, got, N, ops[i].max);
                        CHECK(got <= (unsigned long)ops[i].max * N);
                }
        }
        CHECK_EQ(gm_mem_free(c, t.managed), 0);
        CHECK_EQ(gm_mem_free(c, t.dev), 0);
        gm_client_close(c);
}

typedef struct Worker {
        gm_client *c;
        unsigned idx;
        unsigned rounds;
        int failures;
        char why[256];
} Worker;

static void worker_fail(Worker *w, const char *what, int r)
{
        char msg[256];
        if (!w->failures++)
                snprintf(w->why, sizeof(w->why), "thread %u: %s: %s", w->idx, what,
                         gm_strerror(w->c, r, msg, sizeof(msg)));
}

/* Each reply must be the one its thread asked for: sizes, addresses and reasons are the thread's own. */
static void *mixed_calls(void *arg)
{
        Worker *w = arg;
        uint32_t gpu = gpus[w->idx % n_gpus];
        size_t size = 4096 * (w->idx + 1);
        char msg[256], want[64];
        uint64_t base = 0, wsize = 0, bad;
        int r;

        gm_client_window(w->c, &base, &wsize);
        bad = base + wsize + (uint64_t)w->idx * w->rounds * 4096;

        for (unsigned i = 0; i < w->rounds; i++) {
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                void *p = NULL;
                int fd = -1;
                size_t esize = 0;

                if ((r = gm_ping(w->c)) < 0) {
                        worker_fail(w, "ping", r);
                        continue;
                }
                if ((r = gm_malloc(w->c, size, gpu, 0, &p)) < 0) {
                        worker_fail(w, "alloc", r);
                        continue;
                }
                r = gm_pointer_get_attributes(w->c, (char *)p + 100, &pa);
                if (r < 0 || pa.base != p || pa.size != size || pa.gpu_id != gpu)
                        worker_fail(w, "pointer query answered for another allocation", r);
                if (i % 8 == 0) {
                        struct stat st;
                        r = gm_mem_export(w->c, pa.handle, &fd, &esize);
                        if (r < 0 || fd < 0 || fstat(fd, &st) < 0 || esize != size)
                                worker_fail(w, "export", r);
                        if (fd >= 0)
                                close(fd);
                }
                if (i % 16 == 3) {
                        /* a reply too big for a reply arena */
                        gm_topology *t = NULL;
                        r = gm_topology_get(w->c, true, &t);
                        if (r < 0 || !t || t->n_nodes < n_gpus)
                                worker_fail(w, "topology", r);
                        gm_topology_free(t);
                }
                if ((r = gm_mem_free(w->c, p)) < 0)
                        worker_fail(w, "free", r);
                /* an error reply, whose reason (naming an address of this thread's) must reach this thread */
                bad += 4096;
                r = gm_pointer_get_attributes(w->c, (void *)(uintptr_t)bad, &pa);
                snprintf(want, sizeof(want), "0x%llx", (unsigned long long)bad);
                if (r != -EFAULT || !strstr(gm_strerror(w->c, r, msg, sizeof(msg)), want))
                        worker_fail(w, "pointer query outside the window", r);
        }
        return NULL;
}

static void run_threads(unsigned n, unsigned rounds)
{
        gm_client *c = daemon_client(&dmn, "threads");
        pthread_t th[32];
        Worker w[32];
        unsigned started = 0;

        if (!c)
                return;
        for (unsigned i = 0; i < n && i < ARRAY_SIZE(th); i++) {
                w[i] = (Worker){.c = c, .idx = i, .rounds = rounds};
                if (pthread_create(&th[i], NULL, mixed_calls, &w[i]) != 0)
                        break;
                started++;
        }
        CHECK_EQ(started, n);
        for (unsigned i = 0; i < started; i++) {
                pthread_join(th[i], NULL);
                if (w[i].failures)
                        fprintf(stderr, "%d failure(s), the first: %s\n", w[i].failures, w[i].why);
                CHECK_EQ(w[i].failures, 0);
        }
        CHECK_EQ(gm_ping(c), 0);
        gm_client_close(c);
}

static void test_eight_threads(void)
{
        run_threads(8, 200);
}

/* More threads than a client keeps reply arenas: some replies are decoded without one. */
static void test_many_threads(void)
{
        run_threads(32, 40);
}

/* A thread in long event waits, counting what they end with. */
typedef struct LongWait {
        gm_client *c;
        uint32_t id;
        unsigned rounds;
        uint32_t timeout_ms;
        unsigned completed, timed_out; /* atomic */
        int error;                     /* the first error, 0 if none */
} LongWait;

static void *long_waits(void *arg)
{
        LongWait *l = arg;

        for (unsigned i = 0; i < l->rounds; i++) {
                int r = gm_event_wait(l->c, &l->id, 1, false, l->timeout_ms);
                if (r < 0 || r > 1) {
                        l->error = r < 0 ? r : -EPROTO;
                        return NULL;
                }
                __atomic_add_fetch(r == 0 ? &l->completed : &l->timed_out, 1, __ATOMIC_RELEASE);
        }
        return NULL;
}

/* Calls on the waiters' connection in bursts with pauses, each pause longer than a wait's timeout. */
static void *bursts(void *arg)
{
        Worker *w = arg;

        for (unsigned i = 0; i < w->rounds; i++) {
                for (unsigned k = 0; k < 1 + i % 5; k++) {
                        int r = gm_ping(w->c);
                        if (r < 0)
                                worker_fail(w, "ping", r);
                }
                usleep(i % 3 == 0 ? 30000 : 1000 * (i % 7));
        }
        return NULL;
}

/*
 * Threads in long event waits share the connection with threads making other calls (a ROCm runtime's
 * event thread beside its callers): the waits sleep apart from the socket's other replies, and whoever
 * reads for them must hand them theirs, or tell them when nobody reads any more. The waits end by their
 * 20 ms timeout or by their event, often while nobody else calls: a wake-up lost hangs a waiter (and the
 * test) for good, since no later call comes to read its reply.
 */
static void test_long_waits(void)
{
        enum { N_WAIT = 3, N_CALL = 2, ROUNDS = 60 };
        gm_client *c = daemon_client(&dmn, "long-waits");
        pthread_t wt[N_WAIT], ct[N_CALL + 1];
        LongWait l[N_WAIT];
        Worker w[N_CALL + 1];

        if (!c)
                return;
        for (unsigned i = 0; i < N_WAIT; i++) {
                l[i] = (LongWait){.c = c, .rounds = ROUNDS, .timeout_ms = 20};
                CHECK_EQ(gm_event_create(c, 0, true, NULL, &l[i].id, NULL), 0);
        }
        for (unsigned i = 0; i < N_WAIT; i++)
                CHECK_EQ(pthread_create(&wt[i], NULL, long_waits, &l[i]), 0);
        for (unsigned i = 0; i < N_CALL; i++) {
                w[i] = (Worker){.c = c, .idx = i, .rounds = ROUNDS / 2};
                CHECK_EQ(pthread_create(&ct[i], NULL, bursts, &w[i]), 0);
        }
        w[N_CALL] = (Worker){.c = c, .idx = N_CALL, .rounds = ROUNDS / 4};
        CHECK_EQ(pthread_create(&ct[N_CALL], NULL, mixed_calls, &w[N_CALL]), 0);
        for (unsigned round = 0; round < ROUNDS; round++) {
                CHECK_EQ(gm_event_set(c, l[round % N_WAIT].id), 0);
                usleep(round % 4 == 0 ? 25000 : 3000);
        }
        for (unsigned i = 0; i <= N_CALL; i++) {
                pthread_join(ct[i], NULL);
                if (w[i].failures)
                        fprintf(stderr, "%d failure(s), the first: %s\n", w[i].failures, w[i].why);
                CHECK_EQ(w[i].failures, 0);
        }
        for (unsigned i = 0; i < N_WAIT; i++) {
                pthread_join(wt[i], NULL);
                CHECK_EQ(l[i].error, 0);
                CHECK_EQ(l[i].completed + l[i].timed_out, ROUNDS);
                CHECK(l[i].completed > 0);
        }
        gm_client_close(c);
}

/* A connection that breaks ends the long waits on it at once, with the connection's error. */
static void test_long_waits_broken(void)
{
        gm_client *c = daemon_client(&dmn, "long-broken"), *adm = daemon_client(&dmn, "long-broken-admin");
        pthread_t wt[2];
        LongWait l[2];

        if (!c || !adm)
                goto out;
        for (unsigned i = 0; i < 2; i++) {
                l[i] = (LongWait){.c = c, .rounds = 1, .timeout_ms = UINT32_MAX};
                CHECK_EQ(gm_event_create(c, 0, true, NULL, &l[i].id, NULL), 0);
                CHECK_EQ(pthread_create(&wt[i], NULL, long_waits, &l[i]), 0);
        }
        usleep(50000); /* both asleep in their waits */
        CHECK_EQ(gm_ping(c), 0);
        CHECK_EQ(gm_admin_disconnect(adm, gm_client_id(c)), 0);
        for (unsigned i = 0; i < 2; i++) {
                pthread_join(wt[i], NULL); /* a missed wake-up hangs here, with no timeout to end it */
                CHECK(l[i].error < 0);
                CHECK_EQ(l[i].completed, 0);
        }
out:
        if (c)
                gm_client_close(c);
        if (adm)
                gm_client_close(adm);
}

/* A call refused for a missing argument says so itself: gm_strerror() never shows an earlier call's reason.
 */
static void test_argument_reasons(void)
{
        gm_client *c = NULL;
        char buf[256];
        void *p = NULL;

        if (gm_client_connect(dmn.sock, "reasons", &c) < 0) {
                CHECK(false);
                return;
        }
        /* an earlier failure leaves its reason on this thread */
        CHECK_EQ(gm_malloc(c, 4096, 424242, 0, &p), -ENODEV);
        CHECK_EQ(gm_admin_status(c, NULL), -EINVAL);
        CHECK_STR_CONTAINS(gm_strerror(c, -EINVAL, buf, sizeof(buf)), "gm_admin_status: a required argument");
        CHECK_EQ(gm_event_create(c, 0, false, NULL, NULL, NULL), -EINVAL);
        CHECK_STR_CONTAINS(gm_strerror(c, -EINVAL, buf, sizeof(buf)), "gm_event_create: a required argument");
        gm_client_close(c);
}

/*
 * gm_pointer_attributes by its struct_size: a full one is written whole (the GPUs beyond those mapped read 0,
 * struct_size kept), a shorter one up to its size and nothing after, a larger one (a caller built against a
 * newer header) up to this library's size with struct_size lowered to it; a failed query writes nothing.
 */
static void test_pointer_struct_sizes(void)
{
        enum { POISON = 0xa5 };
        struct {
                gm_pointer_attributes pa;
                uint8_t beyond[32];
        } big;
        gm_pointer_attributes pa, before;
        gm_client *c = NULL;
        void *p = NULL;
        size_t prefix = offsetof(gm_pointer_attributes, flags);

        CHECK_EQ(gm_client_connect(dmn.sock, "struct-sizes", &c), 0);
        if (!c)
                return;
        CHECK_EQ(gm_malloc(c, 8192, gpus[0], 0, &p), 0);

        memset(&pa, POISON, sizeof(pa));
        pa.struct_size = sizeof(pa);
        CHECK_EQ(gm_pointer_get_attributes(c, (char *)p + 10, &pa), 0);
        CHECK_EQ(pa.struct_size, sizeof(pa));
        CHECK(pa.base == p);
        CHECK_EQ(pa.size, 8192);
        CHECK_EQ(pa.n_mapped_gpus, 1);
        CHECK_EQ(pa.mapped_gpus[0], gpus[0]);
        for (size_t i = pa.n_mapped_gpus; i < ARRAY_SIZE(pa.mapped_gpus); i++)
                CHECK_EQ(pa.mapped_gpus[i], 0);

        memset(&pa, POISON, sizeof(pa));
        pa.struct_size = prefix;
        CHECK_EQ(gm_pointer_get_attributes(c, p, &pa), 0);
        CHECK_EQ(pa.struct_size, prefix);
        CHECK(pa.base == p);
        CHECK_EQ(pa.size, 8192);
        for (size_t i = prefix; i < sizeof(pa); i++)
                CHECK_EQ(((const uint8_t *)&pa)[i], POISON);

        memset(&big, POISON, sizeof(big));
        big.pa.struct_size = sizeof(big);
        CHECK_EQ(gm_pointer_get_attributes(c, p, &big.pa), 0);
        CHECK_EQ(big.pa.struct_size, sizeof(big.pa));
        CHECK(big.pa.base == p);
        for (size_t i = 0; i < sizeof(big.beyond); i++)
                CHECK_EQ(big.beyond[i], POISON);

        memset(&pa, POISON, sizeof(pa));
        pa.struct_size = sizeof(pa);
        before = pa;
        CHECK(gm_pointer_get_attributes(c, (char *)p + 64 * MiB, &pa) < 0);
        CHECK(memcmp(&pa, &before, sizeof(pa)) == 0);

        CHECK_EQ(gm_mem_free(c, p), 0);
        gm_client_close(c);
}

/* gm_allocation_prop by its struct_size: the same rules (docs/client-api.md states them for both structs). */
static void test_allocation_prop_struct_sizes(void)
{
        enum { POISON = 0x5a };
        gm_allocation_prop pr, before;
        gm_client *c = NULL;
        gm_handle h = 0;
        size_t prefix = offsetof(gm_allocation_prop, size);

        CHECK_EQ(gm_client_connect(dmn.sock, "prop-sizes", &c), 0);
        if (!c)
                return;
        CHECK_EQ(gm_mem_create(c, 2 * MiB, gpus[0], 0, &h), 0);

        memset(&pr, POISON, sizeof(pr));
        pr.struct_size = sizeof(pr);
        CHECK_EQ(gm_mem_get_allocation_properties(c, h, &pr), 0);
        CHECK_EQ(pr.struct_size, sizeof(pr));
        CHECK_EQ(pr.gpu_id, gpus[0]);
        CHECK_EQ(pr.size, 2 * MiB);

        memset(&pr, POISON, sizeof(pr));
        pr.struct_size = prefix;
        CHECK_EQ(gm_mem_get_allocation_properties(c, h, &pr), 0);
        CHECK_EQ(pr.struct_size, prefix);
        CHECK_EQ(pr.gpu_id, gpus[0]);
        for (size_t i = prefix; i < sizeof(pr); i++)
                CHECK_EQ(((const uint8_t *)&pr)[i], POISON);

        memset(&pr, POISON, sizeof(pr));
        pr.struct_size = sizeof(pr);
        before = pr;
        CHECK(gm_mem_get_allocation_properties(c, h ^ 1, &pr) < 0); /* no such handle */
        CHECK(memcmp(&pr, &before, sizeof(pr)) == 0);

        CHECK_EQ(gm_mem_release(c, h), 0);
        gm_client_close(c);
}

int main(void)
{
        static const TestCase cases[] = {
                {"an argument refused by the library has its own reason", test_argument_reasons},
                {"calls on the hot path allocate nothing", test_allocations},
                {"eight threads share one client with mixed calls", test_eight_threads},
                {"more threads than reply arenas", test_many_threads},
                {"long event waits beside other calls miss no wake-up", test_long_waits},
                {"a broken connection ends long event waits", test_long_waits_broken},
                {"a pointer query writes what the caller's struct_size holds", test_pointer_struct_sizes},
                {"allocation properties write what the caller's struct_size holds",
                 test_allocation_prop_struct_sizes},
        };
        int r;

        count_init();
        signal(SIGPIPE, SIG_IGN);
        r = daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, gpus, ARRAY_SIZE(gpus));
        if (r < 0)
                return EXIT_FAILURE;
        n_gpus = (size_t)r;
        r = run_tests(cases, ARRAY_SIZE(cases));
        return daemon_finish(&dmn, r);
}
