/* What one tenant can make the daemon spend is bounded: mappings, shares, threads, host memory, the OOM
 * killer's choice. One case per run (its name is the first argument), each on a daemon of its own. */
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define UID_A 65531 /* the hostile tenant */
#define UID_B 65530 /* another tenant */

static Daemon dmn;
static uint32_t gpus[16];
static size_t n_gpus;
static const char *shipped_conf; /* systemd/gpumemd.conf, from the command line */

/* Lines of /proc/PID/@what that start with @key (-1 when unreadable): entries of its memory map for
 * "maps" and NULL, or the number after "Threads:" for "status". */
static long proc_count(pid_t pid, const char *what, const char *key)
{
        char path[64], line[512];
        long n = 0;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f)) {
                if (!key)
                        n++;
                else if (strncmp(line, key, strlen(key)) == 0)
                        n = strtol(line + strlen(key), NULL, 10);
        }
        fclose(f);
        return n;
}

static long daemon_maps(void)
{
        return proc_count(dmn.pid, "maps", NULL);
}

static long daemon_threads(void)
{
        return proc_count(dmn.pid, "status", "Threads:");
}

static long max_map_count(void)
{
        FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
        long n = 65530;

        if (f) {
                if (fscanf(f, "%ld", &n) != 1)
                        n = 65530;
                fclose(f);
        }
        return n;
}

/* As many fds as the 1,000 clients and the daemon's memory files need (the daemon takes its hard limit). */
static void raise_fd_limit(void)
{
        struct rlimit rl = {200000, 200000};

        if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
}

static gm_client *connect_as_me(const char *name)
{
        gm_client *c = NULL;

        return gm_client_connect(dmn.sock, name, &c) == 0 ? c : NULL;
}

/* The daemon's section for cases whose clients run queues or wait on events: a KFD (the model's) with a GPU
 * context per client (ABI 1.19), where both are a client's own. */
#define OWN_CONTEXTS "[daemon]\nlog-level = warning\nmodel-kfd-minor = 19\n"

/* ------------------------------------------------------------------ mappings: host memory */

/* Tenant A: 4 KiB host buffers until the daemon refuses one; the refusal's errno is the exit status's
 * proof (0: refused with -EDQUOT naming the mappings), and it holds them until the parent says. */
static int host_hog(void *arg)
{
        int sync = *(int *)arg, r = 0, n = 0;
        gm_client *c = connect_as_me("host-hog");
        char why[256] = "", ch;
        void *p;

        if (!c)
                return 2;
        while (n < 100000 && (r = gm_host_malloc(c, 4096, 0, -1, 0, &p)) == 0)
                n++;
        gm_strerror(c, r, why, sizeof(why));
        fprintf(stderr, "tenant A: %d host buffers of 4 KiB, then %s\n", n, why);
        if (write(sync, "x", 1) != 1 || read(sync, &ch, 1) != 1)
                return 3;
        gm_client_close(c);
        return r == -EDQUOT && strstr(why, "mapping") ? 0 : 4;
}

/* Tenant B, and a new connection of it: still served. */
static int other_tenant(void *arg)
{
        gm_client *c = connect_as_me("other");
        void *h = NULL, *d = NULL;
        int r;

        (void)arg;
        if (!c)
                return 2; /* a new connection failed */
        r = gm_host_malloc(c, 4096, 0, -1, 0, &h);
        if (r == 0)
                r = gm_malloc(c, 4096, gpus[0], 0, &d);
        if (r < 0) {
                char why[256];
                fprintf(stderr, "tenant B: %s\n", gm_strerror(c, r, why, sizeof(why)));
        }
        gm_client_close(c);
        return r == 0 ? 0 : 3;
}

/*
 * One tenant allocating 4 KiB host buffers, each a mapping in the daemon, is refused at its uid's share of
 * the daemon's mappings; another uid still allocates and connects, and the daemon's memory map stays well
 * below vm.max_map_count.
 */
static void test_host_mappings(void)
{
        int sync = -1;
        pid_t a = fork_as_synced(UID_A, host_hog, &sync);
        long before = daemon_maps(), during;
        char ch;

        CHECK(a > 0);
        if (a <= 0)
                return;
        CHECK_EQ(read(sync, &ch, 1), 1);
        during = daemon_maps();
        fprintf(stderr, "daemon mappings: %ld before, %ld with tenant A refused (vm.max_map_count %ld)\n",
                before, during, max_map_count());
        CHECK(during > 0 && during < max_map_count() / 2);
        CHECK_EQ(run_as(UID_B, other_tenant, NULL), 0);
        CHECK_EQ(write(sync, "g", 1), 1);
        CHECK_EQ(child_end(a, sync), 0);
}

/*
 * All clients' mappings: with max-mappings = 40, two uids allocate host buffers (2 mappings each) until the
 * daemon keeps the rest for itself (-ENOSPC, its reason naming vm.max_map_count); a new connection is still
 * served, and a free makes room again.
 */
static int total_hog(void *arg)
{
        gm_client *c = connect_as_me("total");
        int r = 0, n = 0, want = *(int *)arg;
        char why[256] = "";
        void *p = NULL, *last = NULL;

        if (!c)
                return 2;
        while (n < 100 && (r = gm_host_malloc(c, 4096, 0, -1, 0, &p)) == 0) {
                last = p;
                n++;
                if (want && n == want)
                        break;
        }
        if (want) { /* the first tenant holds its buffers until it is killed */
                pause();
                return 0;
        }
        gm_strerror(c, r, why, sizeof(why));
        fprintf(stderr, "tenant B: %d host buffers, then %s\n", n, why);
        if (r != -ENOSPC || !strstr(why, "vm.max_map_count"))
                return 3;
        if (!last || gm_mem_free(c, last) != 0 || gm_host_malloc(c, 4096, 0, -1, 0, &p) != 0)
                return 4; /* a free makes room again */
        gm_client_close(c);
        return 0;
}

static void test_total_mappings(void)
{
        int fifteen = 15, none = 0;
        pid_t a = fork_as(UID_A, total_hog, &fifteen);
        uint64_t used = 0;
        gm_client *c;

        CHECK(a > 0);
        /* A holds 15 buffers (30 mappings) */
        for (int i = 0; i < 100 && used < 30; i++) {
                CHECK_RC(daemon_class_quota(&dmn, "node", GM_RESOURCE_MAPPINGS, 0, &used, NULL), 0);
                if (used < 30)
                        usleep(20000);
        }
        CHECK_EQ(used, 30);
        /* B gets the 5 left, then -ENOSPC */
        CHECK_EQ(run_as(UID_B, total_hog, &none), 0);
        c = connect_as_me("after");
        CHECK(c != NULL);
        gm_client_close(c);
        kill_and_reap(&a);
}

/* ------------------------------------------------------------------ mappings: fence-touched device memory */

#define SDMA_FENCE 5u
#define N_TOUCHED  2000

/* One fence packet of the queue @g into @va: whether the engines ran it (its read pointer reached *@wptr). */
static bool fence_into(GttQueue *g, uint64_t *wptr, uint64_t va, uint32_t value)
{
        const uint32_t p[] = {SDMA_FENCE, (uint32_t)va, (uint32_t)(va >> 32), value};

        memcpy((uint8_t *)g->ring + *wptr % 4096, p, sizeof(p));
        *wptr += sizeof(p);
        __atomic_store_n(g->wptr, *wptr, __ATOMIC_RELEASE);
        for (int i = 0; i < 5000 && __atomic_load_n(g->rptr, __ATOMIC_ACQUIRE) != *wptr; i++)
                usleep(1000);
        return __atomic_load_n(g->rptr, __ATOMIC_ACQUIRE) == *wptr;
}

/*
 * A queue whose fence packets write into one new device buffer after another: the model's engines reach
 * each through a CPU view in the daemon, which must not stay, one mapping per buffer ever touched. A buffer
 * sealed by a read-only export keeps its writable view through that (no writable one could be made again):
 * its owner's GPU still writes it after the others' views were dropped.
 */
static void test_device_mappings(void)
{
        gm_alloc_desc d = {.kind = GM_KIND_HOST, .size = 64 << 10, .flags = GM_MEM_GTT, .numa_node = -1};
        gm_client *c = connect_as_me("fences");
        uint8_t *mem = NULL;
        void **bufs = calloc(N_TOUCHED, sizeof(*bufs)), *sealed = NULL;
        uint64_t db = 0, wptr = 0;
        int ro_fd = -1;
        uint32_t id = 0;
        long before, after;
        GttQueue g;
        int n = 0;

        if (!c || !bufs)
                goto out;
        CHECK_EQ(gm_malloc_desc(c, &d, (void **)&mem), 0);
        if (!mem)
                goto out;
        gtt_queue_init(&g, mem, gpus[0]);
        CHECK_EQ(gm_queue_create(c, &g.desc, &id, &db), 0);
        CHECK_EQ(gm_malloc(c, 4096, gpus[0], GM_MEM_HOST_VISIBLE, &sealed), 0);
        if (sealed) {
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                CHECK_EQ(gm_pointer_get_attributes(c, sealed, &pa), 0);
                CHECK_EQ(gm_mem_export_flags(c, pa.handle, GM_EXPORT_READ_ONLY, &ro_fd, NULL), 0);
                CHECK(fence_into(&g, &wptr, (uintptr_t)sealed, 1));
        }
        before = daemon_maps();
        while (n < N_TOUCHED) {
                /* a batch of fences, one a buffer, that fits the ring once */
                int batch = 0;
                for (; batch < 128 && n < N_TOUCHED; batch++, n++) {
                        uint64_t va;
                        if (gm_malloc(c, 4096, gpus[0], 0, &bufs[n]) != 0)
                                break;
                        va = (uintptr_t)bufs[n];
                        const uint32_t p[] = {SDMA_FENCE, (uint32_t)va, (uint32_t)(va >> 32), (uint32_t)n};
                        memcpy((uint8_t *)g.ring + wptr % 4096, p, sizeof(p));
                        wptr += sizeof(p);
                }
                __atomic_store_n(g.wptr, wptr, __ATOMIC_RELEASE);
                for (int i = 0; i < 5000 && __atomic_load_n(g.rptr, __ATOMIC_ACQUIRE) != wptr; i++)
                        usleep(1000);
                CHECK_EQ(__atomic_load_n(g.rptr, __ATOMIC_ACQUIRE), wptr);
                if (__atomic_load_n(g.rptr, __ATOMIC_ACQUIRE) != wptr || batch == 0)
                        break;
        }
        after = daemon_maps();
        fprintf(stderr, "daemon mappings: %ld before, %ld after fences into %d device buffers\n", before,
                after, n);
        CHECK_EQ(n, N_TOUCHED);
        CHECK(after - before < N_TOUCHED / 4);
        if (sealed) {
                CHECK(fence_into(&g, &wptr, (uintptr_t)sealed, 0xabc));
                CHECK_EQ(*(volatile uint32_t *)sealed, 0xabc);
        }
        CHECK_EQ(gm_queue_destroy(c, id), 0);
out:
        if (ro_fd >= 0)
                close(ro_fd);
        free(bufs);
        gm_client_close(c);
}

/*
 * A queue costs the daemon mappings too (the doorbell relay's view of its write pointer, the model's of the
 * queue): with `mappings = 6`, the queue's GTT memory (2) and two queues (2 each) fit, a third is refused,
 * and destroying one gives its mappings back.
 */
static void test_queue_mappings(void)
{
        gm_alloc_desc d = {.kind = GM_KIND_HOST, .size = 64 << 10, .flags = GM_MEM_GTT, .numa_node = -1};
        gm_client *c = connect_as_me("queues");
        uint32_t ids[3] = {0};
        uint64_t db = 0, used = 0, limit = 0;
        uint8_t *mem = NULL;
        char why[256] = "";
        long before, after;
        GttQueue g;

        if (!c)
                return;
        CHECK_EQ(gm_malloc_desc(c, &d, (void **)&mem), 0);
        if (!mem)
                goto out;
        gtt_queue_init(&g, mem, gpus[0]);
        before = daemon_maps();
        CHECK_EQ(gm_queue_create(c, &g.desc, &ids[0], &db), 0);
        after = daemon_maps();
        fprintf(stderr, "daemon mappings: %ld before, %ld with one queue\n", before, after);
        CHECK_EQ(gm_queue_create(c, &g.desc, &ids[1], &db), 0);
        fprintf(stderr, "daemon mappings: %ld with two queues\n", daemon_maps());
        /* the first also started the daemon's relay and command processor threads (their stacks) and
         * mapped the context's doorbells: a queue more is what a queue is charged, or less; under
         * ThreadSanitizer its runtime maps shadow and its own allocator's memory as it goes (up to four
         * entries more were seen; the class's count just below is exact either way) */
        CHECK(daemon_maps() - after <= (daemon_under_tsan() ? 8 : 2));
        CHECK_RC(daemon_class_quota(&dmn, "node", GM_RESOURCE_MAPPINGS, 0, &used, &limit), 0);
        CHECK_EQ(used, 6);
        CHECK_EQ(limit, 6);
        CHECK_EQ(gm_queue_create(c, &g.desc, &ids[2], &db), -EDQUOT);
        CHECK_STR_CONTAINS(gm_strerror(c, -EDQUOT, why, sizeof(why)), "daemon mapping limit");
        CHECK_EQ(gm_queue_destroy(c, ids[1]), 0);
        CHECK_EQ(gm_queue_create(c, &g.desc, &ids[2], &db), 0);
        CHECK_EQ(gm_queue_destroy(c, ids[2]), 0);
        CHECK_EQ(gm_queue_destroy(c, ids[0]), 0);
        CHECK_EQ(gm_mem_free(c, mem), 0);
        CHECK_RC(daemon_class_quota(&dmn, "node", GM_RESOURCE_MAPPINGS, 0, &used, &limit), 0);
        CHECK_EQ(used, 0);
out:
        gm_client_close(c);
}

/* ------------------------------------------------------------------ shares */

#define SHARES_CONFIG                                                                                        \
        "[daemon]\nlog-level = warning\n"                                                                    \
        "[class a]\nmatch-uid = 65531\nshare-publish = a/*\n"                                                \
        "[class b]\nmatch-uid = 65530\nshare-publish = b/*\n"                                                \
        "[class rest]\nmatch-all = yes\n"

static int share_hog(void *arg)
{
        int sync = *(int *)arg, r = 0, n = 0;
        gm_client *c = connect_as_me("share-hog");
        char why[256] = "", name[64], ch;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        void *p;

        if (!c)
                return 2;
        while (n < 5000) {
                snprintf(name, sizeof(name), "a/%d", n);
                r = gm_malloc(c, 4096, gpus[0], 0, &p);
                if (r == 0)
                        r = gm_pointer_get_attributes(c, p, &pa);
                if (r == 0)
                        r = gm_share_publish(c, pa.handle, name, 0, NULL);
                if (r < 0)
                        break;
                n++;
        }
        gm_strerror(c, r, why, sizeof(why));
        fprintf(stderr, "class a: %d shares, then %s\n", n, why);
        if (write(sync, "x", 1) != 1 || read(sync, &ch, 1) != 1)
                return 3;
        gm_client_close(c);
        return r == -EDQUOT && strstr(why, "share") ? 0 : 4;
}

static int share_other(void *arg)
{
        gm_client *c = connect_as_me("share-other");
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        void *p = NULL;
        int r;

        (void)arg;
        if (!c)
                return 2;
        r = gm_malloc(c, 4096, gpus[0], 0, &p);
        if (r == 0)
                r = gm_pointer_get_attributes(c, p, &pa);
        if (r == 0)
                r = gm_share_publish(c, pa.handle, "b/still", 0, NULL);
        if (r < 0) {
                char why[256];
                fprintf(stderr, "class b: %s\n", gm_strerror(c, r, why, sizeof(why)));
        }
        gm_client_close(c);
        return r == 0 ? 0 : 3;
}

/* One class publishing until refused leaves room in the daemon's table of shares for another. */
static void test_shares(void)
{
        int sync = -1;
        pid_t a = fork_as_synced(UID_A, share_hog, &sync);
        uint64_t used = 0, limit = 0;
        char ch;

        CHECK(a > 0);
        if (a <= 0)
                return;
        CHECK_EQ(read(sync, &ch, 1), 1);
        CHECK_RC(daemon_class_quota(&dmn, "a", GM_RESOURCE_SHARES, 0, &used, &limit), 0);
        fprintf(stderr, "class a: %llu shares of its limit %llu\n", (unsigned long long)used,
                (unsigned long long)limit);
        CHECK_EQ(used, limit);
        CHECK_EQ(run_as(UID_B, share_other, NULL), 0);
        CHECK_EQ(write(sync, "g", 1), 1);
        CHECK_EQ(child_end(a, sync), 0);
}

/* ------------------------------------------------------------------ threads */

#define N_LISTENING 40

/* N_LISTENING clients of this uid, each with a fault event in a context of its own: how many the daemon
 * listens to, how many it refuses (-EUSERS), and the first refusal's reason into @why. */
static void listen_many(gm_client **cs, int *ret_served, int *ret_refused, char *why, size_t whylen)
{
        *ret_served = *ret_refused = 0;
        for (int i = 0; i < N_LISTENING; i++) {
                uint32_t id = 0, slot = 0;
                int r;
                cs[i] = connect_as_me("listener");
                if (!cs[i])
                        break;
                r = gm_event_create(cs[i], 8 /* KFD memory event */, true, NULL, &id, &slot);
                if (r == 0)
                        (*ret_served)++;
                else if (r == -EUSERS && (*ret_refused)++ == 0)
                        gm_strerror(cs[i], r, why, whylen);
                else if (r != -EUSERS)
                        CHECK_RC(r, 0);
        }
}

/*
 * Clients each with a fault event in a context of their own make the daemon wait on each context: in at
 * most max-event-threads threads, the next client refused with -EUSERS.
 */
static void test_event_threads(void)
{
        gm_client *cs[N_LISTENING] = {0};
        long before = daemon_threads(), after;
        int served = 0, refused = 0;
        char why[512] = "";

        listen_many(cs, &served, &refused, why, sizeof(why));
        after = daemon_threads();
        fprintf(stderr, "daemon threads: %ld before, %ld with %d clients listened to, %d refused\n", before,
                after, served, refused);
        CHECK_EQ(served, 32);
        CHECK_EQ(refused, N_LISTENING - 32);
        CHECK(after - before <= 32);
        for (int i = 0; i < N_LISTENING; i++)
                gm_client_close(cs[i]);
        /* a gone client's thread is given back: the next one is served */
        {
                gm_client *c = connect_as_me("listener-after");
                uint32_t id = 0, slot = 0;
                CHECK(c != NULL);
                for (int i = 0; c && i < 100; i++) {
                        int r = gm_event_create(c, 8, true, NULL, &id, &slot);
                        if (r != -EUSERS) {
                                CHECK_RC(r, 0);
                                break;
                        }
                        usleep(50000); /* the daemon frees a gone client a loop round later */
                }
                gm_client_close(c);
        }
}

/* A client of another uid that gets its context waited on: 0, or the event's refusal. */
static int listen_other(void *arg)
{
        gm_client *c = connect_as_me("listener-other");
        uint32_t id = 0, slot = 0;
        int r;

        (void)arg;
        if (!c)
                return 100;
        r = gm_event_create(c, 8, true, NULL, &id, &slot);
        gm_client_close(c);
        return r == 0 ? 0 : r == -EUSERS ? 101 : 102;
}

/*
 * One uid's clients have at most a quarter of the threads (max-event-threads 32: 8), with a reason that
 * names the uid's share; a client of another uid is still served.
 */
static void test_event_threads_per_uid(void)
{
        gm_client *cs[N_LISTENING] = {0};
        int served = 0, refused = 0;
        char why[512] = "";

        listen_many(cs, &served, &refused, why, sizeof(why));
        fprintf(stderr, "one uid: %d clients listened to, %d refused (%s)\n", served, refused, why);
        CHECK_EQ(served, 8);
        CHECK_EQ(refused, N_LISTENING - 8);
        CHECK(strstr(why, "max-event-threads-per-uid") != NULL);
        CHECK_EQ(run_as(UID_B, listen_other, NULL), 0);
        for (int i = 0; i < N_LISTENING; i++)
                gm_client_close(cs[i]);
}

/* ------------------------------------------------------------------ host memory and the OOM killer */

/* The shipped configuration parses and limits host memory. */
static void test_shipped_config(void)
{
        uint64_t used = 0, limit = 0;

        CHECK_RC(daemon_class_quota(&dmn, "node", GM_RESOURCE_HOST, 0, &used, &limit), 0);
        fprintf(stderr, "shipped class 'node': host limit %llu bytes\n", (unsigned long long)limit);
        CHECK(limit != UINT64_MAX && limit > 0);
}

/* Whether this process may lower an OOM score adjustment (CAP_SYS_RESOURCE), tried in a child. */
static bool may_lower_oom_score(void)
{
        pid_t pid = fork();

        if (pid == 0) {
                FILE *f = fopen("/proc/self/oom_score_adj", "we");
                _exit(f && fprintf(f, "-900\n") > 0 && fflush(f) == 0 ? 0 : 1);
        }
        return pid > 0 && child_status(pid) == 0;
}

/* The daemon lowered its OOM score adjustment, so the OOM killer takes a tenant first. */
static void test_oom_score(void)
{
        char path[64];
        FILE *f;
        int adj = 0;

        snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)dmn.pid);
        f = fopen(path, "re");
        CHECK(f != NULL);
        if (!f)
                return;
        CHECK_EQ(fscanf(f, "%d", &adj), 1);
        fclose(f);
        fprintf(stderr, "daemon oom_score_adj %d\n", adj);
        CHECK(adj <= -900);
}

/* Tenant A: 4 MiB host allocations until refused, which must be at its uid's 8 MiB. */
static int host_uid_hog(void *arg)
{
        gm_client *c = connect_as_me("host-uid");
        char why[256] = "";
        int r = 0, n = 0;
        void *p;

        (void)arg;
        if (!c)
                return 2;
        while (n < 64 && (r = gm_host_malloc(c, 4 << 20, 0, -1, 0, &p)) == 0)
                n++;
        gm_strerror(c, r, why, sizeof(why));
        fprintf(stderr, "tenant A: %d host allocations of 4 MiB, then %s\n", n, why);
        gm_client_close(c);
        return n == 2 && r == -EDQUOT && strstr(why, "uid 65531 host memory limit") ? 0 : 3;
}

static int host_uid_other(void *arg)
{
        gm_client *c = connect_as_me("host-uid-other");
        void *p = NULL;
        int r;

        (void)arg;
        if (!c)
                return 2;
        r = gm_host_malloc(c, 4 << 20, 0, -1, 0, &p);
        gm_client_close(c);
        return r == 0 ? 0 : 3;
}

/* One uid is held to max-host-per-uid, whatever its class allows; another uid of the class still gets
 * memory. */
static void test_host_per_uid(void)
{
        CHECK_EQ(run_as(UID_A, host_uid_hog, NULL), 0);
        CHECK_EQ(run_as(UID_B, host_uid_other, NULL), 0);
}

/* ------------------------------------------------------------------ 1,000 clients */

#define N_CROWD 1000

#define CROWD_CONFIG                                                                                         \
        OWN_CONTEXTS "window-size = 1G\nloops = 2\nworker-threads = 2\n"                                     \
                     "max-connections-per-uid = 2000\n"                                                      \
                     "[class all]\nmatch-all = yes\nshare-publish = crowd/*\nshare-read = crowd/*\n"

/* One client's mixed work, leaving it connected: host and device memory made and freed, some of it kept; a
 * share published and opened by every tenth, a queue made and destroyed by every fiftieth. */
static int crowd_work(gm_client *c, int i)
{
        gm_alloc_desc gtt = {.kind = GM_KIND_HOST, .size = 64 << 10, .flags = GM_MEM_GTT, .numa_node = -1};
        void *h = NULL, *d = NULL, *keep = NULL;
        int r;

        if ((r = gm_host_malloc(c, 64 << 10, 0, -1, 0, &h)) < 0 || (r = gm_mem_free(c, h)) < 0)
                return r;
        if ((r = gm_malloc(c, 1 << 20, gpus[i % n_gpus], 0, &d)) < 0 || (r = gm_mem_free(c, d)) < 0)
                return r;
        if ((r = gm_malloc(c, 64 << 10, gpus[i % n_gpus], 0, &keep)) < 0)
                return r;
        if (i % 10 == 0) {
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                char name[32];
                void *sp = NULL;
                size_t size = 0;
                snprintf(name, sizeof(name), "crowd/%d", i);
                if ((r = gm_pointer_get_attributes(c, keep, &pa)) < 0 ||
                    (r = gm_share_publish(c, pa.handle, name, 0, NULL)) < 0 ||
                    (r = gm_share_open(c, name, 0, NULL, 0, &sp, &size, NULL)) < 0 ||
                    (r = gm_share_close(c, sp)))
                        return r;
        }
        if (i % 50 == 0) {
                uint8_t *mem = NULL;
                uint32_t id = 0;
                uint64_t db = 0;
                GttQueue g;
                if ((r = gm_malloc_desc(c, &gtt, (void **)&mem)) < 0)
                        return r;
                gtt_queue_init(&g, mem, gpus[0]);
                if ((r = gm_queue_create(c, &g.desc, &id, &db)) < 0 || (r = gm_queue_destroy(c, id)) < 0 ||
                    (r = gm_mem_free(c, mem)) < 0)
                        return r;
        }
        return 0;
}

/*
 * 1,000 clients connected at once, each having done mixed work: the daemon stays under 1,000 entries in
 * its memory map and 64 threads (both printed).
 */
static void test_crowd(void)
{
        gm_client **cs = calloc(N_CROWD, sizeof(*cs));
        long maps, threads;
        int failed = 0;

        if (!cs)
                return;
        for (int i = 0; i < N_CROWD; i++) {
                int r;
                cs[i] = connect_as_me("crowd");
                if (!cs[i]) {
                        failed++;
                        break;
                }
                r = crowd_work(cs[i], i);
                if (r < 0 && failed++ < 5) {
                        char why[256];
                        fprintf(stderr, "client %d: %s\n", i, gm_strerror(cs[i], r, why, sizeof(why)));
                }
        }
        maps = daemon_maps();
        threads = daemon_threads();
        printf("1000 clients connected: the daemon has %ld mappings and %ld threads\n", maps, threads);
        fflush(stdout);
        CHECK_EQ(failed, 0);
        CHECK(maps > 0 && maps < 1000);
        CHECK(threads > 0 && threads < 64);
        for (int i = 0; i < N_CROWD; i++)
                gm_client_close(cs[i]);
        free(cs);
}

int main(int argc, char **argv)
{
        static const struct {
                const char *name;
                const char *config; /* the daemon's configuration file for the case; NULL: the shipped one */
                TestCase tc;
        } cases[] = {
                {"host-maps",
                 "[daemon]\nlog-level = warning\n[class node]\nmatch-all = yes\n",
                 {"4 KiB host buffers of one uid are refused before the daemon's mappings run out",
                  test_host_mappings}},
                {"maps-total",
                 "[daemon]\nlog-level = warning\nmax-mappings = 40\nmax-mappings-per-uid = 1000\n"
                 "[class node]\nmatch-all = yes\nmappings = 1000\n",
                 {"all clients' mappings are bounded, the rest kept for the daemon", test_total_mappings}},
                {"device-maps",
                 OWN_CONTEXTS "[class node]\nmatch-all = yes\n",
                 {"fences into device buffers leave no mapping behind each", test_device_mappings}},
                {"host-uid",
                 "[daemon]\nlog-level = warning\nmax-host-per-uid = 8M\n[class node]\nmatch-all = yes\n",
                 {"one uid's host memory is bounded across its connections", test_host_per_uid}},
                {"queue-maps",
                 OWN_CONTEXTS "[class node]\nmatch-all = yes\nmappings = 6\n",
                 {"queues cost the daemon mappings, within the class's limit", test_queue_mappings}},
                {"shares", SHARES_CONFIG, {"one class never fills the table of shares", test_shares}},
                {"threads",
                 OWN_CONTEXTS
                 "window-size = 1G\nmax-event-threads-per-uid = 40\n[class node]\nmatch-all = yes\n",
                 {"event threads are bounded", test_event_threads}},
                {"threads-uid",
                 OWN_CONTEXTS "window-size = 1G\n[class node]\nmatch-all = yes\n",
                 {"one uid's clients have a quarter of the event threads", test_event_threads_per_uid}},
                {"config", NULL, {"the shipped configuration limits host memory", test_shipped_config}},
                {"oom", NULL, {"the daemon's OOM score puts tenants first", test_oom_score}},
                {"crowd", CROWD_CONFIG, {"1,000 clients: under 1,000 mappings and 64 threads", test_crowd}},
        };
        int r = EXIT_FAILURE;

        signal(SIGPIPE, SIG_IGN);
        raise_fd_limit();
        shipped_conf = argc > 2 ? argv[2] : NULL;
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                char *text = NULL;
                if (argc < 2 || strcmp(argv[1], cases[i].name) != 0)
                        continue;
                if (getuid() != 0) {
                        fprintf(stderr, "SKIP: needs root (clients of other uids, the daemon's limits)\n");
                        return 77;
                }
                if (strcmp(argv[1], "oom") == 0 && !may_lower_oom_score()) {
                        /* a container without CAP_SYS_RESOURCE: the unit's OOMScoreAdjust= is the units
                         * test's */
                        fprintf(stderr, "SKIP: no CAP_SYS_RESOURCE here, nothing may lower an OOM score\n");
                        return 77;
                }
                if (!cases[i].config) {
                        /* the shipped file, its backend the model's */
                        FILE *f = shipped_conf ? fopen(shipped_conf, "re") : NULL;
                        size_t len = 0;
                        if (!f || !(text = calloc(1, 1 << 16)) ||
                            (len = fread(text, 1, (1 << 16) - 1, f)) == 0) {
                                fprintf(stderr, "cannot read the shipped configuration %s\n",
                                        shipped_conf ? shipped_conf : "(none given)");
                                if (f)
                                        fclose(f);
                                free(text);
                                return EXIT_FAILURE;
                        }
                        fclose(f);
                        text[len] = '\0';
                        char *be = strstr(text, "\nbackend = kfd");
                        if (be)
                                memcpy(be, "\nbackend=model", 14);
                }
                int n = daemon_setup(&dmn, "mi300x", text ? text : cases[i].config, NULL, gpus,
                                     ARRAY_SIZE(gpus));
                free(text);
                if (n > 0) {
                        /* tenants of other uids reach the socket */
                        chmod(dmn.dir, 0755);
                        chmod(dmn.sock, 0666);
                        n_gpus = (size_t)n;
                        r = run_tests(&cases[i].tc, 1);
                }
                return daemon_finish(&dmn, r);
        }
        fprintf(stderr, "usage: %s CASE [SHIPPED-CONF] (", argv[0]);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                fprintf(stderr, "%s%s", i ? ", " : "", cases[i].name);
        fprintf(stderr, ")\n");
        return 2;
}
