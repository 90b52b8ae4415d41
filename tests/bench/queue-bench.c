/* gpumem-queue-bench: the CPU time gpumemd spends on user-mode queues that have no work (run by hand). */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../integ/harness.h"
#include "gpumem-client.h"

#define QUEUE_BYTES 8192 /* per queue: a 4 KiB ring, then its read and write pointers */

/* utime + stime of process @pid, in clock ticks; -1 if it cannot be read. */
static long long cpu_ticks(pid_t pid)
{
        char path[64], buf[1024], *p;
        unsigned long long ut = 0, st = 0;
        FILE *f;
        size_t n;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        f = fopen(path, "r");
        if (!f)
                return -1;
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        p = strrchr(buf, ')'); /* the name may hold spaces */
        if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                return -1;
        return (long long)(ut + st);
}

#define MAX_TASKS 256

/* The threads of @pid: their ids and CPU ticks so far; how many. */
static int task_ticks(pid_t pid, int *ids, long long *ticks)
{
        char path[64];
        DIR *dir;
        struct dirent *e;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        dir = opendir(path);
        while (dir && (e = readdir(dir)) != NULL && n < MAX_TASKS) {
                int tid = atoi(e->d_name);
                char sub[96], buf[1024], *p;
                unsigned long long ut = 0, st = 0;
                FILE *f;
                size_t len;

                if (tid <= 0)
                        continue;
                snprintf(sub, sizeof(sub), "/proc/%d/task/%d/stat", (int)pid, tid);
                f = fopen(sub, "r");
                if (!f)
                        continue;
                len = fread(buf, 1, sizeof(buf) - 1, f);
                fclose(f);
                buf[len] = 0;
                p = strrchr(buf, ')');
                if (!p ||
                    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                        continue;
                ids[n] = tid;
                ticks[n++] = (long long)(ut + st);
        }
        if (dir)
                closedir(dir);
        return n;
}

/* Each thread's share of a core between two task_ticks() looks @seconds apart, with its name. */
static void print_threads(pid_t pid, const int *ids0, const long long *t0, int n0, const int *ids1,
                          const long long *t1, int n1, int seconds, long hz)
{
        for (int i = 0; i < n1; i++) {
                long long before = 0;
                char path[96], name[64] = "?";
                FILE *f;

                for (int j = 0; j < n0; j++)
                        if (ids0[j] == ids1[i])
                                before = t0[j];
                if (t1[i] == before)
                        continue;
                snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)pid, ids1[i]);
                f = fopen(path, "r");
                if (f) {
                        if (fgets(name, sizeof(name), f))
                                name[strcspn(name, "\n")] = 0;
                        fclose(f);
                }
                printf("    thread %-16s %6.1f%%\n", name,
                       100.0 * (double)(t1[i] - before) / (double)hz / seconds);
        }
}

/* @n idle SDMA queues of @c in its GTT memory: rings of nothing, write pointers at 0; each in a buffer of
 * its own with @own, else all in one. */
static int idle_queues(gm_client *c, uint32_t gpu, int n, bool own)
{
        gm_alloc_desc d = {.kind = GM_KIND_HOST,
                           .size = (size_t)(own ? 1 : n) * QUEUE_BYTES,
                           .flags = GM_MEM_GTT,
                           .numa_node = -1};
        uint8_t *mem = NULL;
        int r = gm_malloc_desc(c, &d, (void **)&mem);

        for (int k = 0; r == 0 && k < n; k++) {
                uint8_t *base = mem + (size_t)(own ? 0 : k) * QUEUE_BYTES;

                if (own && k > 0 && (r = gm_malloc_desc(c, &d, (void **)&base)) < 0)
                        break;
                gm_queue_desc q = {.gpu_id = gpu,
                                   .type = 1 /* SDMA */,
                                   .percentage = 100,
                                   .priority = 7,
                                   .ring_va = (uintptr_t)base,
                                   .ring_size = 4096,
                                   .rptr_va = (uintptr_t)(base + 4096),
                                   .wptr_va = (uintptr_t)(base + 4104)};
                uint32_t id;
                uint64_t db;

                r = gm_queue_create(c, &q, &id, &db);
        }
        return r;
}

int main(int argc, char **argv)
{
        int clients = argc > 1 ? atoi(argv[1]) : 8, per = argc > 2 ? atoi(argv[2]) : 1024;
        int seconds = argc > 3 ? atoi(argv[3]) : 10;
        bool own = argc > 4 && strcmp(argv[4], "own") == 0;
        long hz = sysconf(_SC_CLK_TCK);
        gm_client **cs = calloc((size_t)clients, sizeof(*cs));
        uint32_t gpus[16];
        long long t0, t1, base0, base1;
        Daemon d;
        int r;

        if (clients < 1 || per < 0 || seconds < 1 || !cs) {
                fprintf(stderr, "usage: GPUMEMD=path %s [CLIENTS [QUEUES-EACH [SECONDS [own]]]]\n", argv[0]);
                return 2;
        }
        r = daemon_setup(&d, "mi300x", "[daemon]\nlog-level = warning\n", NULL, gpus, 16);
        if (r <= 0)
                return 1;
        for (int i = 0; i < clients; i++) {
                cs[i] = daemon_client(&d, "idle-queues");
                if (!cs[i])
                        return 1;
        }
        /* the daemon with the clients connected and no queue: what idle clients cost */
        sleep(1);
        base0 = cpu_ticks(d.pid);
        sleep((unsigned)seconds);
        base1 = cpu_ticks(d.pid);
        for (int i = 0; i < clients; i++) {
                r = idle_queues(cs[i], gpus[0], per, own);
                if (r < 0) {
                        fprintf(stderr, "client %d: queue_create: %s\n", i, strerror(-r));
                        return 1;
                }
        }
        sleep(1); /* the engines and the relay settle */
        static int ids0[MAX_TASKS], ids1[MAX_TASKS];
        static long long tt0[MAX_TASKS], tt1[MAX_TASKS];
        int n0 = task_ticks(d.pid, ids0, tt0), n1;

        t0 = cpu_ticks(d.pid);
        sleep((unsigned)seconds);
        t1 = cpu_ticks(d.pid);
        n1 = task_ticks(d.pid, ids1, tt1);
        printf("no queues:              %6.1f%% of a core over %d s\n",
               100.0 * (double)(base1 - base0) / (double)hz / seconds, seconds);
        printf("%5d idle SDMA queues: %6.1f%% of a core over %d s (%d clients x %d, %s)\n", clients * per,
               100.0 * (double)(t1 - t0) / (double)hz / seconds, seconds, clients, per,
               own ? "a buffer each" : "one buffer per client");
        print_threads(d.pid, ids0, tt0, n0, ids1, tt1, n1, seconds, hz);
        for (int i = 0; i < clients; i++)
                gm_client_close(cs[i]);
        free(cs);
        return daemon_finish(&d, 0);
}
