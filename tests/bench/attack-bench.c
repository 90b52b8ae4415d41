/* gpumem-attack-bench: another tenant's ping, 4 MiB alloc and admin status while one tenant attacks. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../integ/harness.h"
#include "bench.h"

/*
 * Each attack runs against its own fresh gpumemd on the model with the shipped configuration's classes for
 * tenants, and a class of its own for the measured client (root, an administrator: it also reads the admin
 * status). The attacker is another uid (nobody) in the shipped tenant class: it connects, does its attack
 * as fast as it can, and keeps doing it (or holds what it made) while the victim measures. The victim's p99
 * under attack is compared with its idle p99 measured on the same daemon just before.
 */

#define ATTACKER_UID 65534
#define SAMPLES      300

typedef struct Victim {
        gm_client *c;
        uint32_t gpu;
} Victim;

typedef struct Attack {
        const char *name;
        const char *what;
        /* runs in the attacker process: set things up, write one byte to @ready, then attack until killed */
        void (*fn)(const char *sock, uint32_t gpu, int ready);
        unsigned procs; /* attacker processes (connections) */
} Attack;

static uint32_t first_gpu(gm_client *c)
{
        gm_topology *t = NULL;
        uint32_t gpu = 0;

        if (gm_topology_get(c, false, &t) < 0)
                return 0;
        for (size_t i = 0; i < t->n_nodes && !gpu; i++)
                if (t->nodes[i].is_gpu)
                        gpu = t->nodes[i].gpu_id;
        gm_topology_free(t);
        return gpu;
}

static gm_client *attacker_connect(const char *sock)
{
        gm_client *c = NULL;

        if (gm_client_connect(sock, "attacker", &c) < 0)
                _exit(2);
        return c;
}

static void ready_once(int *ready)
{
        if (*ready >= 0) {
                (void)!write(*ready, "r", 1);
                close(*ready);
                *ready = -1;
        }
}

/* GTT memory of @n_queues SDMA queues, 8 KiB each: the ring, then its read and write pointers. */
static uint8_t *queue_memory(gm_client *c, uint32_t gpu, size_t n_queues)
{
        gm_alloc_desc d = {.kind = GM_KIND_HOST,
                           .size = n_queues * 8192,
                           .gpu_id = gpu,
                           .flags = GM_MEM_GTT,
                           .numa_node = -1};
        void *mem = NULL;

        if (gm_malloc_desc(c, &d, &mem) < 0)
                return NULL;
        memset(mem, 0, d.size); /* zeros: SDMA NOPs */
        return mem;
}

/* @n SDMA queues spread over every GPU (a GPU takes so many); with @busy each one's write pointer far ahead
 * of its read pointer (a ring of NOPs it walks round and round). How many were made. */
static size_t make_queues(gm_client *c, size_t n, bool busy)
{
        gm_topology *t = NULL;
        uint32_t gpus[64];
        size_t n_gpus = 0, made = 0;

        if (gm_topology_get(c, false, &t) < 0)
                return 0;
        for (size_t i = 0; i < t->n_nodes && n_gpus < 64; i++)
                if (t->nodes[i].is_gpu)
                        gpus[n_gpus++] = t->nodes[i].gpu_id;
        gm_topology_free(t);
        for (size_t g = 0; g < n_gpus; g++) {
                size_t want = (n - made) / (n_gpus - g);
                uint8_t *mem = queue_memory(c, gpus[g], want);
                for (size_t i = 0; mem && i < want; i++) {
                        uint8_t *q = mem + i * 8192;
                        uint64_t *rptr = (uint64_t *)(q + 4096), *wptr = rptr + 1;
                        gm_queue_desc d = {.gpu_id = gpus[g],
                                           .type = 1,
                                           .percentage = 100,
                                           .priority = 7,
                                           .ring_va = (uintptr_t)q,
                                           .ring_size = 4096,
                                           .rptr_va = (uintptr_t)rptr,
                                           .wptr_va = (uintptr_t)wptr};
                        uint32_t id = 0;
                        uint64_t db = 0;
                        int r = gm_queue_create(c, &d, &id, &db);

                        if (r < 0) {
                                fprintf(stderr, "  attacker: queue %zu refused: %s\n", made, strerror(-r));
                                return made;
                        }
                        if (busy)
                                __atomic_store_n(wptr, 1ull << 40, __ATOMIC_RELEASE);
                        made++;
                }
        }
        return made;
}

static void hold(void)
{
        for (;;)
                pause();
}

static void attack_busy_queues(const char *sock, uint32_t gpu, int ready)
{
        (void)gpu;
        gm_client *c = attacker_connect(sock);
        size_t n = make_queues(c, 1024, true);

        fprintf(stderr, "  attacker: %zu busy SDMA queues\n", n);
        ready_once(&ready);
        hold();
}

static void attack_idle_queues(const char *sock, uint32_t gpu, int ready)
{
        (void)gpu;
        gm_client *c = attacker_connect(sock);
        size_t n = make_queues(c, 1024, false);

        fprintf(stderr, "  attacker: %zu idle SDMA queues\n", n);
        ready_once(&ready);
        hold();
}

/* Small host allocations as fast as the daemon takes them; refused ones are retried (at full speed). */
static void attack_small_host(const char *sock, uint32_t gpu, int ready)
{
        gm_client *c = attacker_connect(sock);
        size_t n = 0, refused = 0;

        (void)gpu;
        for (;;) {
                void *p = NULL;
                if (gm_host_malloc(c, 4096, 0, -1, 0, &p) == 0)
                        n++;
                else if (++refused == 1) {
                        fprintf(stderr, "  attacker: first refusal after %zu host allocations of 4 KiB\n", n);
                        ready_once(&ready);
                }
                if (n == 100000 && !refused)
                        ready_once(&ready);
        }
}

/* Named shares of small host allocations until refused, then more attempts. */
static void attack_shares(const char *sock, uint32_t gpu, int ready)
{
        gm_client *c = attacker_connect(sock);
        size_t n = 0, refused = 0;

        (void)gpu;
        for (unsigned i = 0;; i++) {
                void *p = NULL;
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                char name[64];
                int r = gm_host_malloc(c, 4096, 0, -1, 0, &p);

                snprintf(name, sizeof(name), "attack-%u", i);
                if (r == 0 && gm_pointer_get_attributes(c, p, &pa) == 0)
                        r = gm_share_publish(c, pa.handle, name, 0, NULL);
                if (r == 0)
                        n++;
                else {
                        if (p)
                                gm_mem_free(c, p);
                        if (++refused == 1) {
                                fprintf(stderr, "  attacker: first refusal after %zu shares (%s)\n", n,
                                        strerror(-r));
                                ready_once(&ready);
                        }
                }
                if (n == 20000 && !refused)
                        ready_once(&ready);
        }
}

/* Host alloc+free of @size in a loop (the slow ops of the worker threads). */
static void alloc_free_loop(const char *sock, size_t size, int ready)
{
        gm_client *c = attacker_connect(sock);

        ready_once(&ready);
        for (;;) {
                void *p = NULL;
                if (gm_host_malloc(c, size, 0, -1, 0, &p) == 0)
                        gm_mem_free(c, p);
                else
                        usleep(1000);
        }
}

static void attack_big_alloc(const char *sock, uint32_t gpu, int ready)
{
        (void)gpu;
        alloc_free_loop(sock, 512 * MIB, ready);
}

static void attack_big_free(const char *sock, uint32_t gpu, int ready)
{
        (void)gpu;
        alloc_free_loop(sock, 4 * GIB, ready);
}

/* Many connections, idle. */
static void attack_connections(const char *sock, uint32_t gpu, int ready)
{
        size_t n = 0;

        (void)gpu;
        for (; n < 2000; n++) {
                gm_client *c = NULL;
                if (gm_client_connect(sock, "idle", &c) < 0)
                        break;
        }
        fprintf(stderr, "  attacker: %zu idle connections\n", n);
        ready_once(&ready);
        hold();
}

static const Attack attacks[] = {
        {"busy-queues", "1024 SDMA queues with a far-ahead write pointer", attack_busy_queues, 1},
        {"idle-queues", "8 connections of 1024 idle SDMA queues", attack_idle_queues, 8},
        {"small-host", "4 KiB host allocations until refused, and on", attack_small_host, 1},
        {"shares", "named shares until refused, and on", attack_shares, 1},
        {"big-alloc", "8 connections of 512 MiB host alloc+free", attack_big_alloc, 8},
        {"big-free", "4 GiB host alloc+free", attack_big_free, 1},
        {"connections", "2000 idle connections", attack_connections, 1},
};

static int victim_ping(Victim *v)
{
        return gm_ping(v->c);
}

static int victim_alloc(Victim *v)
{
        void *p = NULL;
        int r = gm_malloc(v->c, 4 * MIB, v->gpu, 0, &p);

        return r < 0 ? r : gm_mem_free(v->c, p);
}

static int victim_host(Victim *v)
{
        void *p = NULL;
        int r = gm_host_malloc(v->c, 4 * MIB, 0, -1, 0, &p);

        return r < 0 ? r : gm_mem_free(v->c, p);
}

static int victim_status(Victim *v)
{
        gm_status *s = NULL;
        int r = gm_admin_status(v->c, &s);

        gm_status_free(s);
        return r;
}

static const struct {
        const char *name;
        int (*fn)(Victim *v);
} victim_ops[] = {{"ping", victim_ping},
                  {"device 4 MiB", victim_alloc},
                  {"host 4 MiB", victim_host},
                  {"status", victim_status}};
#define N_OPS (sizeof(victim_ops) / sizeof(victim_ops[0]))

/* p99 of @n runs of op @k in microseconds; -1 when one failed (its errno on stderr). */
static double p99_of(Victim *v, size_t k, size_t n)
{
        uint64_t s[SAMPLES];

        for (size_t i = 0; i < n; i++) {
                uint64_t t0 = now_ns();
                int r = victim_ops[k].fn(v);
                s[i] = now_ns() - t0;
                if (r < 0) {
                        fprintf(stderr, "  victim: %s failed: %s\n", victim_ops[k].name, strerror(-r));
                        return -1;
                }
        }
        return lat_of(s, n).p99_us;
}

/* Whether @name is one of the comma-separated @list. */
static bool listed(const char *list, const char *name)
{
        size_t len = strlen(name);

        for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
                if (strncmp(p, name, len) == 0 && (p[len] == ',' || p[len] == '\0'))
                        return true;
        return false;
}

static char *read_text(const char *path)
{
        FILE *f = fopen(path, "re");
        char *buf = NULL;
        size_t len = 0;

        if (!f)
                return NULL;
        if (getdelim(&buf, &len, '\0', f) < 0) {
                free(buf);
                buf = NULL;
        }
        fclose(f);
        return buf;
}

/* The CPU time of process @pid so far, in seconds (utime + stime of /proc/PID/stat), or -1. */
static double cpu_seconds(pid_t pid)
{
        char path[64], buf[1024];
        unsigned long long ut = 0, stt = 0;
        FILE *f;
        char *p;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
        fclose(f);
        /* after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
         * stime */
        if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stt) != 2)
                return -1;
        return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static pid_t start_attacker(const Attack *a, const char *sock, uint32_t gpu, int ready_w)
{
        pid_t pid = fork();

        if (pid != 0)
                return pid;
        if (setgroups(0, NULL) < 0 || setgid(ATTACKER_UID) < 0 || setuid(ATTACKER_UID) < 0)
                _exit(100);
        a->fn(sock, gpu, ready_w);
        _exit(0);
}

static bool run_attack(const Settings *st, const Attack *a, const char *config, size_t n)
{
        BenchDaemon d;
        Victim v = {0};
        pid_t pids[8] = {0};
        double idle[N_OPS], hit[N_OPS];
        bool ok = true;
        int r;

        r = bench_daemon_start(&d, st, config, 0);
        if (r < 0)
                die("cannot start %s: %s", st->gpumemd, strerror(-r));
        (void)chmod(d.dir, 0755);
        if (gm_client_connect(d.sock, "victim", &v.c) < 0 || !(v.gpu = first_gpu(v.c)))
                die("the victim cannot connect");
        for (size_t k = 0; k < N_OPS; k++) /* warm: the first runs fault in the daemon's paths */
                (void)p99_of(&v, k, n);
        for (size_t k = 0; k < N_OPS; k++)
                idle[k] = p99_of(&v, k, n);

        printf("%-12s %s\n", a->name, a->what);
        for (unsigned i = 0; i < a->procs; i++) {
                int p[2];
                char b;
                if (pipe2(p, O_CLOEXEC) < 0)
                        die("pipe: %s", strerror(errno));
                pids[i] = start_attacker(a, d.sock, v.gpu, p[1]);
                close(p[1]);
                struct pollfd pf = {.fd = p[0], .events = POLLIN};
                if (poll(&pf, 1, 120000) <= 0 || read(p[0], &b, 1) != 1)
                        fprintf(stderr, "  attacker %u not ready in 120 s, measuring anyway\n", i);
                close(p[0]);
        }
        usleep(200000);
        double cpu0 = cpu_seconds(d.pid);
        uint64_t t0 = now_ns();
        sleep(2);
        double cpu = (cpu_seconds(d.pid) - cpu0) / ((double)(now_ns() - t0) / 1e9);
        printf("  the daemon's CPU meanwhile: %.0f%% of a core\n", cpu * 100);
        for (size_t k = 0; k < N_OPS; k++)
                hit[k] = p99_of(&v, k, n);
        for (size_t k = 0; k < N_OPS; k++) {
                double ratio = idle[k] > 0 && hit[k] > 0 ? hit[k] / idle[k] : -1;
                bool met = ratio >= 0 && ratio <= 3.0;
                printf("  %-12s p99 idle %10.1f us  attacked %10.1f us  x%-7.2f %s\n", victim_ops[k].name,
                       idle[k], hit[k], ratio,
                       ratio < 0 ? "FAILED"
                       : met     ? "within 3x"
                                 : "OVER 3x");
                ok = ok && met;
        }
        fflush(stdout);
        for (unsigned i = 0; i < a->procs; i++)
                kill_and_reap(&pids[i]);
        gm_client_close(v.c);
        bench_daemon_kill(&d);
        return ok;
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                {"gpumemd", required_argument, NULL, 'd'}, {"preset", required_argument, NULL, 'p'},
                {"config", required_argument, NULL, 'c'},  {"only", required_argument, NULL, 'o'},
                {"samples", required_argument, NULL, 'n'}, {NULL, 0, NULL, 0},
        };
        Settings st = {0};
        const char *only = NULL, *shipped = NULL;
        char *tenants, *config;
        size_t n = 200, missed = 0;
        int c;

        while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
                if (c == 'd')
                        st.gpumemd = optarg;
                else if (c == 'p')
                        st.preset = optarg;
                else if (c == 'c')
                        shipped = optarg;
                else if (c == 'o')
                        only = optarg;
                else if (c == 'n')
                        n = (size_t)atol(optarg);
                else
                        return 2;
        }
        if (!st.gpumemd || !st.preset || !shipped || n < 10 || n > SAMPLES) {
                fprintf(stderr,
                        "usage: gpumem-attack-bench --gpumemd PATH --preset DIR --config SHIPPED.conf "
                        "[--only A,B] [--samples 10..%d]\n",
                        SAMPLES);
                return 2;
        }
        tenants = read_text(shipped);
        if (!tenants)
                die("cannot read %s: %s", shipped, strerror(errno));
        /* the shipped file (its [daemon] backend is overridden by the command line) after a class of the
         * victim's own; tenants may publish shares, which the shipped file leaves to the operator */
        if (asprintf(&config,
                     "[daemon]\nsocket-mode = 0666\n[class victim]\nmatch-uid = root\nadmin = yes\n%s\n"
                     "share-publish = attack-*\n",
                     tenants) < 0)
                die("out of memory");
        sched_getaffinity(0, sizeof(st.all_cpus), &st.all_cpus);
        (void)raise_nofile();
        signal(SIGPIPE, SIG_IGN);
        if (getuid() != 0)
                die("run as root: the attacker is another uid");
        for (size_t i = 0; i < sizeof(attacks) / sizeof(attacks[0]); i++)
                if (!only || listed(only, attacks[i].name))
                        missed += !run_attack(&st, &attacks[i], config, n);
        printf("%zu attack(s) over 3x of the idle p99 or failed\n", missed);
        free(config);
        free(tenants);
        return 0;
}
