/* Stress: clients SIGKILLed mid-sequence beside working ones (crash), a mixed-load soak (load), and a kill
 * storm (storm): thousands of clients, several alive at once, killed at random points of random sequences. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "../integ/harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static uint32_t gpus[16];
static size_t n_gpus;
static volatile sig_atomic_t stop_flag;

static int64_t now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void on_stop(int sig)
{
        (void)sig;
        stop_flag = 1;
}

static void fill(void *p, size_t n, uint32_t seed)
{
        uint32_t *w = p;
        for (size_t i = 0; i < n / 4; i += 1024)
                w[i] = seed ^ (uint32_t)i;
}

static bool same(const void *p, size_t n, uint32_t seed)
{
        const uint32_t *w = p;
        for (size_t i = 0; i < n / 4; i += 1024)
                if (w[i] != (seed ^ (uint32_t)i))
                        return false;
        return true;
}

/* ---- a worker: mixed operations with data checks, latencies recorded ------------------------------- */

enum { OP_DEVICE, OP_HOST, OP_MANAGED, OP_VMM, OP_SHARE, OP_PING, N_OPS };
static const char *const op_names[N_OPS] = {"device", "host", "managed", "vmm", "export", "ping"};

typedef struct WorkerReport {
        uint64_t ops[N_OPS];
        uint64_t errors;      /* a call that failed */
        uint64_t corruptions; /* data that read back wrong */
        uint32_t n_lat;
        uint32_t lat_us[20000]; /* a sample of call latencies */
} WorkerReport;

static void lat(WorkerReport *r, int64_t t0)
{
        uint32_t us = (uint32_t)(now_us() - t0);
        if (r->n_lat < ARRAY_SIZE(r->lat_us))
                r->lat_us[r->n_lat++] = us;
        else
                r->lat_us[(uint32_t)rand() % ARRAY_SIZE(r->lat_us)] = us;
}

#define TIMED(r, call)                                                                                       \
        ({                                                                                                   \
                int64_t _t0 = now_us();                                                                      \
                int _rc = (call);                                                                            \
                lat((r), _t0);                                                                               \
                if (_rc != 0)                                                                                \
                        (r)->errors++;                                                                       \
                _rc;                                                                                         \
        })

static void one_round(gm_client *c, WorkerReport *r, unsigned seed)
{
        int op = (int)(seed % N_OPS);
        void *p = NULL, *res = NULL;
        gm_handle h = 0;
        uint32_t pat = seed * 2654435761u;
        gm_access_desc rw[2] = {{gpus[seed % n_gpus], GM_ACCESS_READ_WRITE},
                                {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
        size_t size = (1 + seed % 4) * MiB;

        r->ops[op]++;
        switch (op) {
        case OP_DEVICE:
                if (TIMED(r, gm_malloc(c, size, gpus[seed % n_gpus], GM_MEM_HOST_VISIBLE, &p)) == 0) {
                        fill(p, size, pat);
                        if (n_gpus > 1)
                                (void)TIMED(r, gm_mem_map_gpus(c, p, &gpus[(seed + 1) % n_gpus], 1));
                        if (!same(p, size, pat))
                                r->corruptions++;
                        (void)TIMED(r, gm_mem_free(c, p));
                }
                break;
        case OP_HOST:
                if (TIMED(r, gm_host_malloc(c, size, 0, -1, 0, &p)) == 0) {
                        fill(p, size, pat);
                        if (!same(p, size, pat))
                                r->corruptions++;
                        (void)TIMED(r, gm_mem_free(c, p));
                }
                break;
        case OP_MANAGED:
                if (TIMED(r, gm_malloc_managed(c, size, 0, &p)) == 0) {
                        gm_svm_attr a = {GM_SVM_ATTR_PREFERRED_LOC, gpus[seed % n_gpus]};
                        fill(p, size, pat);
                        (void)TIMED(r, gm_svm_set_attributes(c, p, size, &a, 1));
                        if (!same(p, size, pat))
                                r->corruptions++;
                        (void)TIMED(r, gm_mem_free(c, p));
                }
                break;
        case OP_VMM:
                if (TIMED(r, gm_mem_address_reserve(c, 2 * size, 0, NULL, 0, &res)) == 0) {
                        if (TIMED(r, gm_mem_create(c, size, gpus[seed % n_gpus], 0, &h)) == 0) {
                                if (TIMED(r, gm_mem_map(c, res, size, 0, h)) == 0) {
                                        if (TIMED(r, gm_mem_set_access(c, res, size, rw, 2)) == 0) {
                                                fill(res, size, pat);
                                                if (!same(res, size, pat))
                                                        r->corruptions++;
                                        }
                                        (void)TIMED(r, gm_mem_unmap(c, res, size));
                                }
                                (void)TIMED(r, gm_mem_release(c, h));
                        }
                        (void)TIMED(r, gm_mem_address_free(c, res, 2 * size));
                }
                break;
        case OP_SHARE:
                if (TIMED(r, gm_malloc(c, size, gpus[0], GM_MEM_HOST_VISIBLE, &p)) == 0) {
                        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                        int fd = -1;
                        fill(p, size, pat);
                        if (TIMED(r, gm_pointer_get_attributes(c, p, &pa)) == 0 &&
                            TIMED(r, gm_mem_export(c, pa.handle, &fd, NULL)) == 0) {
                                /* the export is the same memory: read it through the fd */
                                void *q = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
                                if (q == MAP_FAILED || !same(q, size, pat))
                                        r->corruptions++;
                                if (q != MAP_FAILED)
                                        munmap(q, size);
                                gm_handle ih = 0;
                                if (TIMED(r, gm_mem_import(c, fd, gpus[n_gpus - 1], &ih, NULL)) == 0)
                                        (void)TIMED(r, gm_mem_release(c, ih));
                                close(fd);
                        }
                        (void)TIMED(r, gm_mem_free(c, p));
                }
                break;
        default:
                (void)TIMED(r, gm_ping(c));
                break;
        }
}

/* Runs until SIGTERM; the report goes to @out (a pipe). */
static void worker(int out, unsigned id)
{
        static WorkerReport rep;
        gm_client *c = NULL;
        unsigned seed = id * 7919u + 1;

        signal(SIGTERM, on_stop);
        srand(id);
        if (gm_client_connect(dmn.sock, "stress-worker", &c) < 0)
                _exit(3);
        while (!stop_flag)
                one_round(c, &rep, seed++ * 2246822519u >> 3);
        gm_client_close(c);
        (void)!write(out, &rep, sizeof(rep));
        _exit(0);
}

/* A client that runs every multi-step sequence in a loop until it is killed. */
static void doomed(unsigned seed)
{
        gm_client *c = NULL;
        WorkerReport *rep = calloc(1, sizeof(*rep));

        if (!rep || gm_client_connect(dmn.sock, "doomed", &c) < 0)
                _exit(1);
        for (;;) {
                /* leave things allocated: the daemon must free them when the client dies */
                client_leave_objects(c, gpus[seed % n_gpus], gpus[n_gpus - 1], gpus[0], true);
                one_round(c, rep, seed++);
        }
}

/* The daemon's memory (KiB) and fds over a run: at the start, once warm, at the peak and at the end. */
typedef struct Usage {
        long rss_base, rss_warm, rss_max, rss_end;
        int fds_max;
} Usage;

/* A sample of the daemon's RSS and fds; the first once @warm (past the run's first quarter: caches and pools
 * are warm) is its warm level. */
static void usage_sample(Usage *u, bool warm)
{
        long rss = daemon_rss_kb(&dmn);
        int fds = daemon_fd_count(&dmn);

        if (rss > u->rss_max)
                u->rss_max = rss;
        if (fds > u->fds_max)
                u->fds_max = fds;
        if (!u->rss_warm && warm)
                u->rss_warm = rss;
}

static void usage_print(const Usage *u, const DaemonState *start, const DaemonState *end)
{
        printf("  daemon RSS (KiB): start %ld, warm %ld, peak %ld, end %ld; fds: start %d, peak %d, end %d\n",
               u->rss_base, u->rss_warm, u->rss_max, u->rss_end, start->fds, u->fds_max, end->fds);
}

/* Memory back near its warm level: what clients held is returned (allow for allocator slack); a sanitizer's
 * allocator keeps freed memory in quarantine, so its RSS says nothing there. */
static void usage_check(const Usage *u)
{
#if !defined(__SANITIZE_ADDRESS__)
        if (u->rss_warm)
                CHECK(u->rss_end <= u->rss_warm + 16 * 1024);
#endif
}

/* Add the report of @what @i to @total once it ended (@pid, the read end @fd of its pipe, closed here);
 * false when it did not report or did not exit 0. */
static bool add_report(const char *what, int i, pid_t pid, int fd, WorkerReport *total)
{
        static WorkerReport rep;
        int st = 0;
        ssize_t n = 0, got;

        while (n < (ssize_t)sizeof(rep) && (got = read(fd, (char *)&rep + n, sizeof(rep) - (size_t)n)) > 0)
                n += got;
        waitpid(pid, &st, 0);
        close(fd);
        if (n != sizeof(rep) || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "%s %d did not report (status 0x%x)\n", what, i, st);
                return false;
        }
        for (int k = 0; k < N_OPS; k++)
                total->ops[k] += rep.ops[k];
        total->errors += rep.errors;
        total->corruptions += rep.corruptions;
        for (uint32_t k = 0; k < rep.n_lat && total->n_lat < ARRAY_SIZE(total->lat_us); k++)
                total->lat_us[total->n_lat++] = rep.lat_us[(k * 7) % rep.n_lat];
        return true;
}

static int cmp_u32(const void *a, const void *b)
{
        uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
        return x < y ? -1 : x > y;
}

typedef struct Run {
        int seconds;
        int workers;
        bool crash; /* also kill clients mid-sequence */
} Run;

static int run(const Run *cfg)
{
        pid_t pids[64];
        int pipes[64][2];
        static WorkerReport total;
        DaemonState base, s;
        Usage u = {0};
        int kills = 0, failed = 0;
        int64_t t_end;

        CHECK_EQ(daemon_state(&dmn, &base), 0);
        base.fds = daemon_quiet_fd_count(&dmn);
        u.rss_base = daemon_rss_kb(&dmn);
        for (int i = 0; i < cfg->workers; i++) {
                CHECK_EQ(pipe2(pipes[i], O_CLOEXEC), 0);
                pids[i] = fork();
                if (pids[i] == 0) {
                        close(pipes[i][0]);
                        worker(pipes[i][1], (unsigned)i);
                }
                close(pipes[i][1]);
        }
        t_end = now_us() + (int64_t)cfg->seconds * 1000000;
        for (int64_t next_sample = 0; now_us() < t_end;) {
                if (cfg->crash) {
                        /* a doomed client, killed at a random point of its sequences */
                        pid_t d = fork();
                        if (d == 0)
                                doomed((unsigned)kills * 31u + 7);
                        usleep(1000 + (unsigned)rand() % 60000);
                        kill(d, SIGKILL);
                        waitpid(d, NULL, 0);
                        kills++;
                } else {
                        usleep(100000);
                }
                if (now_us() >= next_sample) {
                        usage_sample(&u, now_us() > t_end - (int64_t)cfg->seconds * 750000);
                        next_sample = now_us() + 1000000;
                }
        }
        for (int i = 0; i < cfg->workers; i++)
                kill(pids[i], SIGTERM);
        for (int i = 0; i < cfg->workers; i++)
                if (!add_report("worker", i, pids[i], pipes[i][0], &total))
                        failed++;
        CHECK_EQ(failed, 0);
        /* the daemon is back where it began: nothing held, the model's books and its fds as at the start */
        CHECK_EQ(daemon_wait_base(&dmn, &base, 20000, &s), 0);
        u.rss_end = daemon_rss_kb(&dmn);
        qsort(total.lat_us, total.n_lat, sizeof(uint32_t), cmp_u32);
        uint64_t n_ops = 0;
        for (int k = 0; k < N_OPS; k++)
                n_ops += total.ops[k];
        printf("%s run: %d s, %d workers%s\n", cfg->crash ? "crash-cleanup" : "load", cfg->seconds,
               cfg->workers, cfg->crash ? ", a doomed client SIGKILLed every 1-60 ms" : "");
        printf("  rounds: %llu (", (unsigned long long)n_ops);
        for (int k = 0; k < N_OPS; k++)
                printf("%s%s %llu", k ? ", " : "", op_names[k], (unsigned long long)total.ops[k]);
        printf("), %.0f rounds/s\n", (double)n_ops / cfg->seconds);
        if (cfg->crash)
                printf("  clients killed mid-sequence: %d\n", kills);
        printf("  failed calls: %llu, wrong data: %llu\n", (unsigned long long)total.errors,
               (unsigned long long)total.corruptions);
        if (total.n_lat)
                printf("  call latency (us): p50 %u, p95 %u, p99 %u, max %u (%u samples)\n",
                       total.lat_us[total.n_lat / 2], total.lat_us[total.n_lat * 95 / 100],
                       total.lat_us[total.n_lat * 99 / 100], total.lat_us[total.n_lat - 1], total.n_lat);
        usage_print(&u, &base, &s);
        fflush(stdout);
        CHECK_EQ(total.errors, 0);
        CHECK_EQ(total.corruptions, 0);
        CHECK(n_ops > 0);
        usage_check(&u);
        return check_failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- storm: clients killed at random points of random sequences, many at once ---------------------- */

/* What a storm client is doing, in memory shared with the parent: the step it was in when killed. */
enum {
        ST_FORKED, /* not yet running (killed before it was scheduled) */
        ST_CONNECT,
        ST_DEVICE,
        ST_HOST,
        ST_MANAGED,
        ST_VMM,
        ST_EXPORT,
        ST_IMPORT,
        ST_MAP,
        ST_RETAIN,
        ST_FREE,
        ST_VMM_TEARDOWN,
        ST_QUERY,
        ST_RECONNECT,
        N_STEPS
};
static const char *const step_names[N_STEPS] = {
        "not started", "connect",       "device alloc",
        "host alloc",  "managed + svm", "vmm reserve/create/map/access",
        "export",      "import",        "map/unmap gpus",
        "retain",      "free",          "vmm unmap/release/free",
        "query",       "reconnect"};

typedef struct StormSlot {
        volatile uint32_t steps; /* steps begun */
        volatile uint8_t step;   /* the step now running */
} StormSlot;

static uint64_t rng_next(uint64_t *s)
{
        uint64_t x = *s;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *s = x;
        return x * 0x2545F4914F6CDD1Dull;
}

static size_t storm_size(uint64_t *rng)
{
        uint64_t r = rng_next(rng) % 100;
        if (r < 60)
                return (size_t)(1 + rng_next(rng) % 16) << 12; /* 4 KiB - 64 KiB */
        if (r < 90)
                return (size_t)(1 + rng_next(rng) % 16) << 16; /* 64 KiB - 1 MiB */
        return (size_t)(1 + rng_next(rng) % 2) << 21;          /* 2 - 4 MiB */
}

/* Pass an fd to whichever storm client reads the mailbox next (the parent's copy keeps it in flight). */
static void mbox_post(int mbox, int fd)
{
        (void)send_with_fds(mbox, "x", 1, &fd, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static int mbox_take(int mbox)
{
        return recv_one_fd(mbox, MSG_DONTWAIT);
}

typedef struct StormVmm {
        void *va;
        size_t res_size, map_size; /* map_size 0: nothing mapped */
        gm_handle h;               /* 0: released (or never created) */
} StormVmm;

typedef struct StormMem {
        void *p;
        size_t size;
        int kind;
} StormMem;

/*
 * A client that runs random steps of every kind, leaving what it made in place at random depths (an
 * allocation mapped on other GPUs or not, a reservation with or without a handle, a mapping with or without
 * access, a handle released while mapped, imports of other clients' exports), until it is killed.
 * @mbox_tx/@mbox_rx: the two ends of a datagram socketpair every storm client shares, carrying dmabuf fds
 * from exporters to importers.
 */
static void storm_client(uint64_t seed, StormSlot *slot, int mbox_tx, int mbox_rx)
{
        uint64_t rng = seed | 1;
        gm_client *c = NULL;
        StormMem mem[32];
        StormVmm vmm[16];
        gm_handle extra[16]; /* retained or imported handles not mapped anywhere */
        int fds[4];
        size_t n_mem = 0, n_vmm = 0, n_extra = 0, n_fds = 0;

#define STEP(s) (slot->step = (s), slot->steps++)
        STEP(ST_CONNECT);
        if (gm_client_connect(dmn.sock, "storm", &c) < 0)
                _exit(3);
        for (;;) {
                uint32_t gpu = gpus[rng_next(&rng) % n_gpus], other = gpus[rng_next(&rng) % n_gpus];
                size_t size = storm_size(&rng);
                unsigned depth = (unsigned)(rng_next(&rng) % 5); /* how far a multi-step sequence goes */
                uint32_t pat = (uint32_t)rng_next(&rng);
                void *p = NULL;

                switch (rng_next(&rng) % 16) {
                case 0:
                case 1: {
                        static const unsigned flags[] = {0, GM_MEM_HOST_VISIBLE,
                                                         GM_MEM_HOST_VISIBLE | GM_MEM_COHERENT,
                                                         GM_MEM_UNCACHED};
                        unsigned f = flags[rng_next(&rng) % ARRAY_SIZE(flags)];
                        if (n_mem == ARRAY_SIZE(mem))
                                break;
                        STEP(ST_DEVICE);
                        if (gm_malloc(c, size, gpu, f, &p) != 0)
                                break;
                        mem[n_mem++] = (StormMem){p, size, GM_KIND_DEVICE};
                        if (f & GM_MEM_HOST_VISIBLE)
                                fill(p, size, pat);
                        if (depth > 1 && n_gpus > 1)
                                (void)gm_mem_map_gpus(c, p, &other, 1);
                        break;
                }
                case 2:
                        if (n_mem == ARRAY_SIZE(mem))
                                break;
                        STEP(ST_HOST);
                        if (gm_host_malloc(c, size, gpu, -1, depth & 1 ? GM_MEM_COHERENT : 0, &p) != 0)
                                break;
                        mem[n_mem++] = (StormMem){p, size, GM_KIND_HOST};
                        fill(p, size, pat);
                        break;
                case 3: {
                        gm_svm_attr a[3] = {{GM_SVM_ATTR_PREFERRED_LOC, depth & 1 ? gpu : GM_LOCATION_CPU},
                                            {GM_SVM_ATTR_ACCESS, other},
                                            {GM_SVM_ATTR_SET_FLAGS, GM_SVM_FLAG_COHERENT}};
                        if (n_mem == ARRAY_SIZE(mem))
                                break;
                        STEP(ST_MANAGED);
                        if (gm_malloc_managed(c, size, 0, &p) != 0)
                                break;
                        mem[n_mem++] = (StormMem){p, size, GM_KIND_MANAGED};
                        fill(p, size, pat);
                        if (depth > 0)
                                (void)gm_svm_set_attributes(c, p, size, a, 1 + depth % 3);
                        if (depth > 2)
                                (void)gm_mem_prefetch(c, p, size, gpu);
                        if (depth > 3) {
                                gm_svm_attr q = {GM_SVM_ATTR_PREFERRED_LOC, 0};
                                (void)gm_svm_get_attributes(c, p, size, &q, 1);
                        }
                        break;
                }
                case 4:
                case 5: {
                        StormVmm *v = &vmm[n_vmm];
                        gm_access_desc acc[2] = {{gpu, GM_ACCESS_READ_WRITE},
                                                 {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
                        if (n_vmm == ARRAY_SIZE(vmm))
                                break;
                        STEP(ST_VMM);
                        size = (size + (2 * MiB - 1)) & ~(2 * MiB - 1);
                        *v = (StormVmm){0};
                        if (gm_mem_address_reserve(c, 2 * size, 0, NULL, 0, &v->va) != 0)
                                break;
                        v->res_size = 2 * size;
                        n_vmm++;
                        if (depth < 1 || gm_mem_create(c, size, gpu, 0, &v->h) != 0)
                                break;
                        if (depth < 2 || gm_mem_map(c, v->va, size, 0, v->h) != 0)
                                break;
                        v->map_size = size;
                        if (depth < 3)
                                break;
                        if (gm_mem_set_access(c, v->va, size, acc, depth == 4 ? 2 : 1) == 0 && depth == 4)
                                fill(v->va, size, pat);
                        break;
                }
                case 6: {
                        /* export one of its device allocations: to the mailbox for another client, or
                         * kept (and mapped by the CPU) here */
                        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                        int fd = -1;
                        size_t k;
                        for (k = 0; k < n_mem && mem[(k + pat) % n_mem].kind != GM_KIND_DEVICE; k++)
                                ;
                        if (k == n_mem)
                                break;
                        STEP(ST_EXPORT);
                        p = mem[(k + pat) % n_mem].p;
                        if (gm_pointer_get_attributes(c, p, &pa) != 0 ||
                            gm_mem_export(c, pa.handle, &fd, NULL) != 0)
                                break;
                        if (depth < 3 || n_fds == ARRAY_SIZE(fds)) {
                                mbox_post(mbox_tx, fd);
                                close(fd);
                        } else {
                                void *q = mmap(NULL, pa.size, PROT_READ, MAP_SHARED, fd, 0);
                                (void)q; /* left mapped: it goes with the process */
                                fds[n_fds++] = fd;
                        }
                        break;
                }
                case 7: {
                        /* import what another client exported (it may be dead already), and map it */
                        gm_handle h = 0;
                        StormVmm *v = &vmm[n_vmm];
                        int fd = mbox_take(mbox_rx);
                        if (fd < 0)
                                break;
                        STEP(ST_IMPORT);
                        size_t isz = 0;
                        if (gm_mem_import(c, fd, gpu, &h, &isz) != 0) {
                                close(fd);
                                break;
                        }
                        if (depth == 0 && n_fds < ARRAY_SIZE(fds))
                                fds[n_fds++] = fd; /* hold the dmabuf too */
                        else if (depth == 1)
                                mbox_post(mbox_tx, fd), close(fd); /* pass it on */
                        else
                                close(fd);
                        if (depth < 2 || n_vmm == ARRAY_SIZE(vmm) ||
                            gm_mem_address_reserve(c, isz, 0, NULL, 0, &v->va) != 0) {
                                if (n_extra < ARRAY_SIZE(extra))
                                        extra[n_extra++] = h;
                                break;
                        }
                        *v = (StormVmm){v->va, isz, 0, h};
                        n_vmm++;
                        if (gm_mem_map(c, v->va, isz, 0, h) != 0)
                                break;
                        v->map_size = isz;
                        if (depth > 2) {
                                gm_access_desc acc = {other, GM_ACCESS_READ_WRITE};
                                (void)gm_mem_set_access(c, v->va, isz, &acc, 1);
                        }
                        break;
                }
                case 8:
                        if (!n_mem)
                                break;
                        STEP(ST_MAP);
                        p = mem[pat % n_mem].p;
                        if (depth & 1)
                                (void)gm_mem_unmap_gpus(c, p, depth > 2 ? NULL : &other, depth > 2 ? 0 : 1);
                        else
                                (void)gm_mem_map_gpus(c, p, &other, 1);
                        break;
                case 9: {
                        gm_handle h = 0;
                        StormVmm *v = n_vmm ? &vmm[pat % n_vmm] : NULL;
                        if (!v || !v->map_size || n_extra == ARRAY_SIZE(extra))
                                break;
                        STEP(ST_RETAIN);
                        if (gm_mem_retain_allocation_handle(c, v->va, &h) == 0)
                                extra[n_extra++] = h;
                        break;
                }
                case 10:
                case 11:
                        /* the free paths */
                        if (n_mem && (depth < 3 || !n_extra)) {
                                size_t k = pat % n_mem;
                                STEP(ST_FREE);
                                (void)gm_mem_free(c, mem[k].p);
                                mem[k] = mem[--n_mem];
                        } else if (n_extra) {
                                STEP(ST_FREE);
                                (void)gm_mem_release(c, extra[--n_extra]);
                        }
                        if (n_fds && depth == 4)
                                close(fds[--n_fds]);
                        break;
                case 12:
                case 13: {
                        /* VMM teardown, one step, in any order: unmap, release while mapped, free (-EBUSY
                         * while mapped) */
                        StormVmm *v = n_vmm ? &vmm[pat % n_vmm] : NULL;
                        if (!v)
                                break;
                        STEP(ST_VMM_TEARDOWN);
                        if (v->h && (depth < 2 || !v->map_size)) {
                                (void)gm_mem_release(c, v->h);
                                v->h = 0;
                        } else if (v->map_size && depth < 4) {
                                if (gm_mem_unmap(c, v->va, v->map_size) == 0)
                                        v->map_size = 0;
                        } else if (gm_mem_address_free(c, v->va, v->res_size) == 0 || !v->map_size) {
                                if (v->h)
                                        (void)gm_mem_release(c, v->h);
                                *v = vmm[--n_vmm];
                        }
                        break;
                }
                case 14: {
                        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                        size_t fr, tot;
                        STEP(ST_QUERY);
                        if (n_mem)
                                (void)gm_pointer_get_attributes(c, mem[pat % n_mem].p, &pa);
                        (void)gm_mem_get_info(c, gpu, &fr, &tot);
                        (void)gm_ping(c);
                        break;
                }
                default:
                        /* now and then a clean goodbye with everything held, and a new connection */
                        if (depth != 4 || (pat & 7))
                                break;
                        STEP(ST_RECONNECT);
                        gm_client_close(c);
                        n_mem = n_vmm = n_extra = 0;
                        if (gm_client_connect(dmn.sock, "storm", &c) < 0)
                                _exit(3);
                        break;
                }
        }
#undef STEP
}

/* A kill delay: mostly short (inside the first requests), some long (holding a lot). */
static int64_t storm_delay_us(uint64_t *rng)
{
        uint64_t r = rng_next(rng) % 100;
        if (r < 5)
                return 0;
        if (r < 60)
                return (int64_t)(rng_next(rng) % 20000);
        if (r < 90)
                return 20000 + (int64_t)(rng_next(rng) % 80000);
        return 100000 + (int64_t)(rng_next(rng) % 300000);
}

static int storm(int n_kills, int n_live, int n_bystanders)
{
        typedef struct Live {
                pid_t pid;
                int64_t deadline;
        } Live;
        Live live[64] = {{0}};
        StormSlot *slots;
        pid_t by_pids[8];
        int by_pipes[8][2], mbox[2];
        static WorkerReport total;
        uint64_t at_kill[N_STEPS] = {0}, rng = 0x9e3779b97f4a7c15ull, steps_at_kill = 0;
        DaemonState base, s;
        Usage u = {0};
        int kills = 0, started = 0, early = 0, alive = 0, failed = 0;
        int64_t t0, t_storm, t_settle, next_sample = 0;

        slots = mmap(NULL, sizeof(StormSlot) * 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(slots != MAP_FAILED);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, mbox), 0);
        if (check_failures)
                return EXIT_FAILURE;
        CHECK_EQ(daemon_state(&dmn, &base), 0);
        base.fds = daemon_quiet_fd_count(&dmn);
        u.rss_base = daemon_rss_kb(&dmn);
        for (int i = 0; i < n_bystanders; i++) {
                CHECK_EQ(pipe2(by_pipes[i], O_CLOEXEC), 0);
                by_pids[i] = fork();
                if (by_pids[i] == 0) {
                        close(by_pipes[i][0]);
                        close(mbox[0]);
                        close(mbox[1]);
                        worker(by_pipes[i][1], 100u + (unsigned)i);
                }
                close(by_pipes[i][1]);
        }
        t0 = now_us();
        while (kills + early < n_kills || alive) {
                int64_t now = now_us(), next = now + 10000;
                /* fill the free slots */
                for (int i = 0; i < n_live && kills + early + alive < n_kills; i++) {
                        if (live[i].pid)
                                continue;
                        uint64_t seed = rng_next(&rng);
                        slots[i] = (StormSlot){0, ST_FORKED};
                        live[i].deadline = now_us() + storm_delay_us(&rng);
                        live[i].pid = fork();
                        if (live[i].pid == 0) {
                                storm_client(seed, &slots[i], mbox[0], mbox[1]);
                                _exit(4); /* not reached: it runs until killed */
                        }
                        CHECK(live[i].pid > 0);
                        if (live[i].pid < 0) {
                                live[i].pid = 0;
                                break;
                        }
                        started++;
                        alive++;
                }
                /* kill those whose time has come; notice any that died on their own */
                now = now_us();
                for (int i = 0; i < n_live; i++) {
                        int st;
                        if (!live[i].pid)
                                continue;
                        if (now >= live[i].deadline) {
                                kill(live[i].pid, SIGKILL);
                                waitpid(live[i].pid, &st, 0);
                                if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
                                        kills++;
                                        at_kill[slots[i].step < N_STEPS ? slots[i].step : 0]++;
                                        steps_at_kill += slots[i].steps;
                                } else {
                                        early++;
                                        fprintf(stderr, "storm client %d ended by itself (status 0x%x)\n",
                                                (int)live[i].pid, st);
                                }
                                live[i].pid = 0;
                                alive--;
                        } else if (waitpid(live[i].pid, &st, WNOHANG) == live[i].pid) {
                                early++;
                                fprintf(stderr, "storm client %d ended by itself (status 0x%x)\n",
                                        (int)live[i].pid, st);
                                live[i].pid = 0;
                                alive--;
                        } else if (live[i].deadline < next) {
                                next = live[i].deadline;
                        }
                }
                if (now >= next_sample) {
                        usage_sample(&u, kills >= n_kills / 4);
                        next_sample = now + 200000;
                }
                now = now_us();
                if (next > now && !(kills + early + alive < n_kills && alive < n_live))
                        usleep((useconds_t)(next - now < 10000 ? next - now : 10000));
        }
        t_storm = now_us();
        for (int i = 0; i < n_bystanders; i++)
                kill(by_pids[i], SIGTERM);
        for (int i = 0; i < n_bystanders; i++)
                if (!add_report("bystander", i, by_pids[i], by_pipes[i][0], &total))
                        failed++;
        /* exports still in the mailbox: the last holders of some memory */
        int in_flight = 0;
        for (int fd; (fd = mbox_take(mbox[1])) >= 0 || (fd = mbox_take(mbox[0])) >= 0; in_flight++)
                close(fd);
        close(mbox[0]);
        close(mbox[1]);
        /* nothing left behind: the daemon exactly at its baseline (broker, model, fds), and no client or
         * window beyond the status connection's own */
        CHECK_EQ(daemon_wait_base(&dmn, &base, 120000, &s), 0);
        t_settle =
                now_us() - t_storm; /* from the last kill (the bystanders' stop and the mailbox included) */
        CHECK_EQ(s.clients, base.clients);
        CHECK_EQ(s.va_windows, base.va_windows);
        u.rss_end = daemon_rss_kb(&dmn);
        qsort(total.lat_us, total.n_lat, sizeof(uint32_t), cmp_u32);
        uint64_t n_ops = 0;
        for (int k = 0; k < N_OPS; k++)
                n_ops += total.ops[k];
        double wall = (double)(t_storm - t0) / 1e6;
        printf("storm run: %d clients killed, %d alive at once, %d bystander%s\n", n_kills, n_live,
               n_bystanders, n_bystanders == 1 ? "" : "s");
        printf("  clients started: %d, killed: %d, ended by themselves: %d; wall %.1f s, %.1f kills/s\n",
               started, kills, early, wall, kills / wall);
        printf("  killed in step:");
        for (int k = 0, first = 1; k < N_STEPS; k++)
                if (at_kill[k]) {
                        printf("%s %s %llu", first ? "" : ",", step_names[k], (unsigned long long)at_kill[k]);
                        first = 0;
                }
        printf("; %.1f steps begun per client on average\n", kills ? (double)steps_at_kill / kills : 0.0);
        printf("  exports still in flight at the end: %d (closed before the check)\n", in_flight);
        if (n_bystanders) {
                printf("  bystander rounds: %llu, failed calls: %llu, wrong data: %llu\n",
                       (unsigned long long)n_ops, (unsigned long long)total.errors,
                       (unsigned long long)total.corruptions);
                if (total.n_lat)
                        printf("  bystander call latency (us): p50 %u, p99 %u, max %u\n",
                               total.lat_us[total.n_lat / 2], total.lat_us[total.n_lat * 99 / 100],
                               total.lat_us[total.n_lat - 1]);
        }
        usage_print(&u, &base, &s);
        printf("  daemon requests served: %llu, protocol errors: %llu\n",
               (unsigned long long)(s.requests - base.requests),
               (unsigned long long)(s.protocol_errors - base.protocol_errors));
        printf("  settled in %.0f ms after the last kill: %s\n", (double)t_settle / 1000,
               daemon_state_is_base(&s, &base) && s.clients == base.clients && s.va_windows == base.va_windows
                       ? "allocations, bytes, model counters, fds, clients and windows as at the start"
                       : "NOT back at the baseline");
        fflush(stdout);
        CHECK_EQ(failed, 0);
        CHECK_EQ(early, 0);
        CHECK_EQ(kills, n_kills);
        CHECK_EQ(total.errors, 0);
        CHECK_EQ(total.corruptions, 0);
        usage_check(&u);
        munmap(slots, sizeof(StormSlot) * 64);
        return check_failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
        Run cfg = {.seconds = 20, .workers = 4, .crash = false};
        const char *env = getenv("GPUMEM_STRESS_SECONDS");
        int r;

        bool is_storm = argc >= 2 && strcmp(argv[1], "storm") == 0;
        int storm_kills = 1000, storm_live = 4, storm_bystanders = 1;

        if (argc < 2 || (strcmp(argv[1], "crash") != 0 && strcmp(argv[1], "load") != 0 && !is_storm)) {
                fprintf(stderr,
                        "usage: %s crash|load [SECONDS [WORKERS]]  (GPUMEM_STRESS_SECONDS overrides)\n"
                        "       %s storm [KILLS [CLIENTS_AT_ONCE [BYSTANDERS]]]  (default 1000 4 1)\n",
                        argv[0], argv[0]);
                return 2;
        }
        if (is_storm) {
                if (argc > 2)
                        storm_kills = atoi(argv[2]);
                if (argc > 3)
                        storm_live = atoi(argv[3]);
                if (argc > 4)
                        storm_bystanders = atoi(argv[4]);
                if (storm_kills <= 0 || storm_live <= 0 || storm_live > 64 || storm_bystanders < 0 ||
                    storm_bystanders > 8)
                        return 2;
        }
        cfg.crash = strcmp(argv[1], "crash") == 0;
        if (argc > 2 && !is_storm)
                cfg.seconds = atoi(argv[2]);
        if (argc > 3 && !is_storm)
                cfg.workers = atoi(argv[3]);
        if (env && atoi(env) > 0)
                cfg.seconds = atoi(env);
        if (cfg.seconds <= 0 || cfg.workers <= 0 || cfg.workers > 64)
                return 2;
        signal(SIGPIPE, SIG_IGN);
        r = daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, gpus, ARRAY_SIZE(gpus));
        if (r < 0)
                return EXIT_FAILURE;
        n_gpus = (size_t)r;
        r = is_storm ? storm(storm_kills, storm_live, storm_bystanders) : run(&cfg);
        return daemon_finish(&dmn, r);
}
