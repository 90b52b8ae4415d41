/* Tenants of different uids against each other through the GPU: queues in a shared context, faulting queues.
 * One case per run (its name is the first argument), each on a daemon of its own. Needs root: one tenant is
 * root with every capability, the other uid 65534. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define UID_TENANT 65534

/* The model's SDMA packets: write a dword at an address; copy bytes (count - 1, flags, source, destination).
 */
#define SDMA_COPY  1u
#define SDMA_FENCE 5u

#define SECRET      0x5EC12E7u
#define UNMAPPED_VA 0x10000ull /* below every window: no memory of anyone's */

static Daemon dmn;
static uint32_t gpu;
static char log_path[] = "/tmp/gpumemd-isolation-log-XXXXXX"; /* the daemon's stderr */
static int log_fd = -1;

/* A tenant's queue and the memory it lives in (GTT host memory of its own). */
typedef struct Tenant {
        gm_client *c;
        uint8_t *mem;
        GttQueue g;
        uint32_t q_id;
        int created; /* gm_queue_create's result */
} Tenant;

static int tenant_open(Tenant *t, const char *name)
{
        gm_alloc_desc d = {
                .kind = GM_KIND_HOST, .size = 64 << 10, .gpu_id = gpu, .flags = GM_MEM_GTT, .numa_node = -1};
        uint64_t db = 0;

        memset(t, 0, sizeof(*t));
        t->c = daemon_client(&dmn, name);
        if (!t->c)
                return -1;
        /* memory ops stay allowed whatever the context */
        CHECK_EQ(gm_malloc_desc(t->c, &d, (void **)&t->mem), 0);
        if (!t->mem)
                return -1;
        gtt_queue_init(&t->g, t->mem, gpu);
        t->created = gm_queue_create(t->c, &t->g.desc, &t->q_id, &db);
        return 0;
}

static void tenant_close(Tenant *t)
{
        if (t->c && t->created == 0)
                (void)gm_queue_destroy(t->c, t->q_id);
        if (t->c && t->mem)
                (void)gm_mem_free(t->c, t->mem);
        gm_client_close(t->c);
}

/* Packets @p (@n dwords) after what the queue ran so far. */
static void submit(Tenant *t, const uint32_t *p, size_t n)
{
        uint64_t w = __atomic_load_n(t->g.wptr, __ATOMIC_ACQUIRE);

        memcpy((uint8_t *)t->g.ring + w, p, n * 4);
        __atomic_store_n(t->g.wptr, w + n * 4, __ATOMIC_RELEASE);
}

/* A fence of @value into the queue's own fence dword; whether the GPU wrote it within @ms. */
static bool fence(Tenant *t, uint32_t value, int ms)
{
        uint64_t va = (uintptr_t)t->g.fence;
        const uint32_t p[] = {SDMA_FENCE, (uint32_t)va, (uint32_t)(va >> 32), value};

        submit(t, p, 4);
        return wait_u32(t->g.fence, value, ms);
}

/* A copy of @bytes from @src to @dst, then a fence of @value. */
static void copy_then_fence(Tenant *t, uint64_t src, uint64_t dst, uint32_t bytes, uint32_t value)
{
        uint64_t f = (uintptr_t)t->g.fence;
        const uint32_t p[] = {SDMA_COPY,
                              bytes - 1,
                              0,
                              (uint32_t)src,
                              (uint32_t)(src >> 32),
                              (uint32_t)dst,
                              (uint32_t)(dst >> 32),
                              SDMA_FENCE,
                              (uint32_t)f,
                              (uint32_t)(f >> 32),
                              value};
        submit(t, p, sizeof(p) / 4);
}

/* ---- another tenant's secret through the GPU ---- */

typedef struct Steal {
        uint64_t secret_va; /* root's */
        bool expect_queue;  /* the class accepts a shared context */
} Steal;

/* As uid 65534: a queue, and with it a copy of root's secret into its own memory. 0 when what happened is
 * what @arg expects. */
static int steal_main(void *arg)
{
        const Steal *s = arg;
        char why[256];
        Tenant t;

        if (tenant_open(&t, "thief") < 0)
                return 2;
        if (!s->expect_queue) {
                CHECK_EQ(t.created, -EOPNOTSUPP);
                gm_strerror(t.c, t.created, why, sizeof(why));
                CHECK(strstr(why, "ABI 1.19") != NULL);
                CHECK(strstr(why, "AMDKFD_IOC_CREATE_PROCESS") != NULL);
                CHECK(strstr(why, "shared-gpu-context = yes") != NULL);
        } else {
                uint32_t *loot = (uint32_t *)(t.mem + 12288);
                CHECK_EQ(t.created, 0);
                *loot = 0;
                copy_then_fence(&t, s->secret_va, (uintptr_t)loot, 4, 1);
                CHECK(wait_u32(t.g.fence, 1, 5000));
                /* what the class gave up: the other tenant's bytes are its */
                CHECK_EQ(*loot, SECRET);
        }
        tenant_close(&t);
        return 0;
}

static void steal_case(bool shared)
{
        Tenant root;
        Steal s = {.expect_queue = shared};

        if (tenant_open(&root, "victim") < 0)
                return;
        /* root with every capability is refused alike: the class decides, not the uid */
        CHECK_EQ(root.created, shared ? 0 : -EOPNOTSUPP);
        *(volatile uint32_t *)(root.mem + 12288) = SECRET;
        s.secret_va = (uintptr_t)(root.mem + 12288);
        CHECK_EQ(run_as(UID_TENANT, steal_main, &s), 0);
        CHECK_EQ(*(volatile uint32_t *)(root.mem + 12288), SECRET);
        tenant_close(&root);
}

/* No context per client (KFD ABI 1.18), no class that accepts sharing one: no queue for anyone. */
static void test_no_shared_queues(void)
{
        steal_case(false);
}

/* How often the daemon's log holds the warning of a class that shares a context. */
static int sharing_warnings(void)
{
        static const char warning[] = "class 'tenants' has shared-gpu-context = yes and the kernel gives no "
                                      "GPU context per client";
        char buf[16384];
        ssize_t n = pread(log_fd, buf, sizeof(buf) - 1, 0);
        int count = 0;

        buf[n > 0 ? n : 0] = '\0';
        for (const char *p = buf; (p = strstr(p, warning)); p++)
                count++;
        return count;
}

/* The same with shared-gpu-context = yes: queues run, in one context, and one tenant reads another's. The
 * daemon warns of the class at start and at each reload. */
static void test_shared_opt_in(void)
{
        steal_case(true);
        CHECK_EQ(sharing_warnings(), 1);
        CHECK_EQ(kill(dmn.pid, SIGHUP), 0);
        for (int i = 0; i < 500 && sharing_warnings() < 2; i++)
                usleep(10000);
        CHECK_EQ(sharing_warnings(), 2);
}

/* ---- a faulting queue ---- */

/* The fault of @ev's context at UNMAPPED_VA, within 5 s: whether it came, as KFD reports it. */
static bool fault_heard(gm_client *c, uint32_t ev)
{
        gm_memory_exception exc[2];
        size_t n_exc = 0;

        CHECK_EQ(gm_event_wait_faults(c, &ev, 1, false, 5000, exc, 2, &n_exc), 0);
        CHECK_EQ(n_exc, 1);
        CHECK(n_exc && exc[0].va == UNMAPPED_VA && exc[0].not_present && exc[0].gpu_id == gpu);
        return n_exc == 1 && exc[0].va == UNMAPPED_VA;
}

/* As uid 65534: a queue that copies from an address where nothing is mapped, then a fence that never runs;
 * the fault reaches its memory event, and its context makes no queue any more. It then tells the parent and
 * holds its queue until the parent is done. */
static int fault_main(void *arg)
{
        int sync = *(int *)arg;
        uint32_t ev = 0, again = 0;
        uint64_t db = 0;
        char done = 0, why[256];
        Tenant t;

        if (tenant_open(&t, "faulter") < 0)
                return 2;
        CHECK_EQ(t.created, 0);
        CHECK_EQ(gm_event_create(t.c, 8, false, NULL, &ev, NULL), 0);
        copy_then_fence(&t, UNMAPPED_VA, (uintptr_t)(t.mem + 12288), 4, 1);
        CHECK(fault_heard(t.c, ev));
        CHECK(!wait_u32(t.g.fence, 1, 300)); /* the fence behind the fault never ran */
        /* nor would a new queue of its context: none is made */
        CHECK_EQ(gm_queue_create(t.c, &t.g.desc, &again, &db), -EIO);
        gm_strerror(t.c, -EIO, why, sizeof(why));
        CHECK(strstr(why, "stopped every queue of") != NULL);
        CHECK_EQ(write(sync, "f", 1), 1);
        CHECK_EQ(read(sync, &done, 1), 0); /* the parent closed its end: done */
        (void)gm_event_destroy(t.c, ev);
        tenant_close(&t);
        return 0;
}

/*
 * Root's queue completes fences before and after the other tenant's queue faulted; @survives says whether
 * it must (a context each) or must not (one shared context: the kernel stops every queue of a context that
 * faulted, and the daemon cannot start them again). In the shared context root hears the fault on its own
 * memory event, so that nothing of its waits for its dead queue, and gets no new queue there.
 */
static void fault_case(bool survives)
{
        Tenant root;
        int sync = -1;
        uint32_t ev = 0, second = 0;
        uint64_t db = 0;
        char got = 0, why[256];
        pid_t pid;

        if (tenant_open(&root, "bystander") < 0)
                return;
        CHECK_EQ(root.created, 0);
        CHECK_EQ(gm_event_create(root.c, 8, false, NULL, &ev, NULL), 0);
        CHECK(fence(&root, 1, 5000));
        pid = fork_as_synced(UID_TENANT, fault_main, &sync);
        CHECK(pid > 0);
        if (pid > 0) {
                CHECK_EQ(read(sync, &got, 1), 1);
                CHECK_EQ(got, 'f');
                if (survives) {
                        for (uint32_t v = 2; v < 10; v++)
                                CHECK(fence(&root, v, 5000));
                        CHECK_EQ(gm_event_wait(root.c, &ev, 1, false, 0), 1); /* not root's fault */
                        CHECK_EQ(gm_queue_create(root.c, &root.g.desc, &second, &db), 0);
                        CHECK_EQ(gm_queue_destroy(root.c, second), 0);
                } else {
                        CHECK(fault_heard(root.c, ev));
                        CHECK(!fence(&root, 2, 500));
                        CHECK_EQ(gm_queue_create(root.c, &root.g.desc, &second, &db), -EIO);
                        gm_strerror(root.c, -EIO, why, sizeof(why));
                        CHECK(strstr(why, "until gpumemd restarts") != NULL);
                }
                CHECK_EQ(child_end(pid, sync), 0);
        }
        (void)gm_event_destroy(root.c, ev);
        tenant_close(&root);
}

/* A context per client (KFD ABI 1.19): the fault stops the faulting tenant's queue, not the other's. */
static void test_fault_own(void)
{
        fault_case(true);
}

/* One shared context (ABI 1.18, shared-gpu-context = yes): the fault stops every queue in it, and every
 * tenant there hears of it. */
static void test_fault_shared(void)
{
        fault_case(false);
}

/* What the daemon said, for the reader of a failure. */
static void dump_log(void)
{
        char buf[4096];
        ssize_t n;

        for (off_t at = 0; (n = pread(log_fd, buf, sizeof(buf), at)) > 0; at += n)
                fwrite(buf, 1, (size_t)n, stderr);
}

#define SHARED_CONFIG                                                                                        \
        "[daemon]\nlog-level = warning\n[class tenants]\nmatch-all = yes\nshared-gpu-context = yes\n"

int main(int argc, char **argv)
{
        static const struct {
                const char *name;
                const char *minor;
                const char *config;
                TestCase tc;
        } cases[] = {
                {"no-shared-queues",
                 "18",
                 NULL,
                 {"without a context per client no tenant runs a queue, nor reads another's memory",
                  test_no_shared_queues}},
                {"shared-opt-in",
                 "18",
                 SHARED_CONFIG,
                 {"a class that accepts a shared context runs queues there, and gives up isolation",
                  test_shared_opt_in}},
                {"fault-own",
                 "19",
                 NULL,
                 {"a faulting queue stops its own tenant's queues only", test_fault_own}},
                {"fault-shared",
                 "18",
                 SHARED_CONFIG,
                 {"a faulting queue in a shared context stops every tenant's there", test_fault_shared}},
        };
        int r = EXIT_FAILURE;

        if (geteuid() != 0) {
                fprintf(stderr, "not root: tenants of other uids cannot be made\n");
                return 77;
        }
        signal(SIGPIPE, SIG_IGN);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                if (argc > 1 && strcmp(argv[1], cases[i].name) == 0) {
                        const char *extra[] = {"--model-kfd-minor", cases[i].minor, NULL};
                        int err = dup(STDERR_FILENO), started;
                        /* the daemon's log into a file of ours: its warnings are part of what is tested */
                        log_fd = mkstemp(log_path);
                        if (log_fd < 0 || err < 0)
                                return EXIT_FAILURE;
                        unlink(log_path);
                        dup2(log_fd, STDERR_FILENO);
                        started = daemon_setup(&dmn, "mi300x", cases[i].config, extra, &gpu, 1);
                        dup2(err, STDERR_FILENO);
                        close(err);
                        if (started > 0) {
                                /* tenants of another uid reach the socket; the policy decides the rest */
                                chmod(dmn.dir, 0755);
                                chmod(dmn.sock, 0666);
                                r = run_tests(&cases[i].tc, 1);
                        }
                        if (dmn.pid > 0 && daemon_stop(&dmn) != 0)
                                r = EXIT_FAILURE;
                        daemon_cleanup(&dmn);
                        if (r != EXIT_SUCCESS)
                                dump_log();
                        close(log_fd);
                        return r;
                }
        fprintf(stderr, "usage: %s CASE (", argv[0]);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                fprintf(stderr, "%s%s", i ? ", " : "", cases[i].name);
        fprintf(stderr, ")\n");
        return 2;
}
