/* Stress: clients SIGKILLed mid-sequence beside working ones (crash), and a mixed-load soak (load). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
        if (r->n_lat < ARRAY_LEN(r->lat_us))
                r->lat_us[r->n_lat++] = us;
        else
                r->lat_us[(uint32_t)rand() % ARRAY_LEN(r->lat_us)] = us;
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
                void *p, *h, *m, *res;
                gm_handle vh;
                int fd;
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                gm_access_desc rw = {gpus[0], GM_ACCESS_READ_WRITE};
                gm_svm_attr a = {GM_SVM_ATTR_PREFERRED_LOC, gpus[0]};
                /* leave things allocated: the daemon must free them when the client dies */
                (void)gm_malloc(c, 2 * MiB, gpus[seed % n_gpus], GM_MEM_HOST_VISIBLE, &p);
                (void)gm_mem_map_gpus(c, p, &gpus[n_gpus - 1], 1);
                if (gm_pointer_get_attributes(c, p, &pa) == 0 &&
                    gm_mem_export(c, pa.handle, &fd, NULL) == 0) {
                        gm_handle ih;
                        (void)gm_mem_import(c, fd, gpus[0], &ih, NULL);
                        close(fd);
                }
                (void)gm_host_malloc(c, MiB, 0, -1, 0, &h);
                (void)gm_malloc_managed(c, 2 * MiB, 0, &m);
                (void)gm_svm_set_attributes(c, m, 2 * MiB, &a, 1);
                (void)gm_mem_address_reserve(c, 4 * MiB, 0, NULL, 0, &res);
                (void)gm_mem_create(c, 2 * MiB, gpus[0], 0, &vh);
                (void)gm_mem_map(c, res, 2 * MiB, 0, vh);
                (void)gm_mem_set_access(c, res, 2 * MiB, &rw, 1);
                one_round(c, rep, seed++);
        }
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
        static WorkerReport total, rep;
        DaemonState base, s;
        long rss_base, rss_warm = 0, rss_max = 0, rss_end;
        int fds_max = 0, kills = 0, failed = 0;
        int64_t t_end;

        CHECK_EQ(daemon_state(&dmn, &base), 0);
        base.fds = daemon_quiet_fd_count(&dmn);
        rss_base = daemon_rss_kb(&dmn);
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
                        long rss = daemon_rss_kb(&dmn);
                        int fds = daemon_fd_count(&dmn);
                        if (rss > rss_max)
                                rss_max = rss;
                        if (fds > fds_max)
                                fds_max = fds;
                        if (!rss_warm && now_us() > t_end - (int64_t)cfg->seconds * 750000)
                                rss_warm = rss; /* after the first quarter: caches and pools are warm */
                        next_sample = now_us() + 1000000;
                }
        }
        for (int i = 0; i < cfg->workers; i++)
                kill(pids[i], SIGTERM);
        for (int i = 0; i < cfg->workers; i++) {
                int st = 0;
                ssize_t n = 0, got;
                while (n < (ssize_t)sizeof(rep) &&
                       (got = read(pipes[i][0], (char *)&rep + n, sizeof(rep) - (size_t)n)) > 0)
                        n += got;
                waitpid(pids[i], &st, 0);
                close(pipes[i][0]);
                if (n != sizeof(rep) || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                        fprintf(stderr, "worker %d did not report (status 0x%x)\n", i, st);
                        failed++;
                        continue;
                }
                for (int k = 0; k < N_OPS; k++)
                        total.ops[k] += rep.ops[k];
                total.errors += rep.errors;
                total.corruptions += rep.corruptions;
                for (uint32_t k = 0; k < rep.n_lat && total.n_lat < ARRAY_LEN(total.lat_us); k++)
                        total.lat_us[total.n_lat++] = rep.lat_us[(k * 7) % rep.n_lat];
        }
        CHECK_EQ(failed, 0);
        /* the daemon is back where it began: nothing held, the model's books and its fds as at the start */
        CHECK_EQ(daemon_wait_base(&dmn, &base, 20000, &s), 0);
        rss_end = daemon_rss_kb(&dmn);
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
        printf("  daemon RSS (KiB): start %ld, warm %ld, peak %ld, end %ld; fds: start %d, peak %d, end %d\n",
               rss_base, rss_warm, rss_max, rss_end, base.fds, fds_max, s.fds);
        fflush(stdout);
        CHECK_EQ(total.errors, 0);
        CHECK_EQ(total.corruptions, 0);
        CHECK(n_ops > 0);
        /* memory back near its warm level: what clients held is returned (allow for allocator slack); a
         * sanitizer's allocator keeps freed memory in quarantine, so its RSS says nothing here */
#if !defined(__SANITIZE_ADDRESS__)
        if (rss_warm)
                CHECK(rss_end <= rss_warm + 16 * 1024);
#endif
        return check_failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
        Run cfg = {.seconds = 20, .workers = 4, .crash = false};
        const char *env = getenv("GPUMEM_STRESS_SECONDS");
        gm_client *c = NULL;
        gm_topology *t = NULL;
        int r;

        if (argc < 2 || (strcmp(argv[1], "crash") != 0 && strcmp(argv[1], "load") != 0)) {
                fprintf(stderr,
                        "usage: %s crash|load [SECONDS [WORKERS]]  (GPUMEM_STRESS_SECONDS overrides)\n",
                        argv[0]);
                return 2;
        }
        cfg.crash = strcmp(argv[1], "crash") == 0;
        if (argc > 2)
                cfg.seconds = atoi(argv[2]);
        if (argc > 3)
                cfg.workers = atoi(argv[3]);
        if (env && atoi(env) > 0)
                cfg.seconds = atoi(env);
        if (cfg.seconds <= 0 || cfg.workers <= 0 || cfg.workers > 64)
                return 2;
        signal(SIGPIPE, SIG_IGN);
        r = daemon_start(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL);
        if (r < 0) {
                fprintf(stderr, "cannot start gpumemd: %s\n", strerror(-r));
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        if (gm_client_connect(dmn.sock, "setup", &c) < 0 || gm_topology_get(c, false, &t) < 0) {
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < t->n_nodes && n_gpus < ARRAY_LEN(gpus); i++)
                if (t->nodes[i].is_gpu)
                        gpus[n_gpus++] = t->nodes[i].gpu_id;
        gm_topology_free(t);
        gm_client_close(c);
        r = run(&cfg);
        if (daemon_stop(&dmn) != 0)
                r = EXIT_FAILURE;
        daemon_cleanup(&dmn);
        return r;
}
