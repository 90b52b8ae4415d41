/* gpumem-bench: what every section uses: failing, clocks, latency figures, result rows, CPU placement. */
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "clock.h"

void die(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        fputs("gpumem-bench: ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        exit(1);
}

uint64_t now_ns(void)
{
        return bench_now_ns();
}

/* Sorts @s. */
Lat lat_of(uint64_t *s, size_t n)
{
        Lat l = {.n = n};
        double sum = 0;

        if (n == 0)
                return l;
        qsort(s, n, sizeof(*s), bench_cmp_u64);
        for (size_t i = 0; i < n; i++)
                sum += (double)s[i];
        l.p50_us = (double)s[n / 2] / 1e3;
        l.p99_us = (double)s[(size_t)((double)(n - 1) * 0.99)] / 1e3;
        l.mean_us = sum / (double)n / 1e3;
        l.ops_per_s = sum > 0 ? (double)n / (sum / 1e9) : 0;
        return l;
}

double block_p50(const uint64_t *s, size_t n, uint64_t *tmp)
{
        memcpy(tmp, s, n * sizeof(*s));
        return lat_of(tmp, n).p50_us;
}

Row *add_row(Report *r, const char *section, const char *name, unsigned rtts, bool fd)
{
        Row *w;

        if (r->n_rows >= sizeof(r->rows) / sizeof(r->rows[0]))
                die("too many result rows");
        w = &r->rows[r->n_rows++];
        memset(w, 0, sizeof(*w));
        snprintf(w->section, sizeof(w->section), "%s", section);
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->rtts = rtts;
        w->fd = fd;
        return w;
}

const Row *find_row(const Report *r, const char *section, const char *name)
{
        for (size_t i = 0; i < r->n_rows; i++)
                if (strcmp(r->rows[i].section, section) == 0 && strcmp(r->rows[i].name, name) == 0)
                        return &r->rows[i];
        return NULL;
}

void add_target(Report *r, const char *what, const char *measured, double ratio, double limit,
                bool higher_is_better)
{
        Target *t = &r->targets[r->n_targets++];

        snprintf(t->what, sizeof(t->what), "%s", what);
        snprintf(t->measured, sizeof(t->measured), "%s", measured);
        t->ratio = ratio;
        t->limit = limit;
        t->higher_is_better = higher_is_better;
        t->met = !isnan(ratio) && (higher_is_better ? ratio >= limit : ratio <= limit);
}

void set_affinity_tid(pid_t tid, const cpu_set_t *set)
{
        (void)sched_setaffinity(tid, sizeof(*set), set);
}

void pin_self(int cpu)
{
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        set_affinity_tid(0, &s);
}

void unpin_self(const Settings *st)
{
        set_affinity_tid(0, &st->all_cpus);
}

/* Every thread of @pid, as taskset -a does. */
void place_process(pid_t pid, const cpu_set_t *set)
{
        char path[64];
        struct dirent *e;
        DIR *dir;

        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        dir = opendir(path);
        if (!dir) {
                set_affinity_tid(pid, set);
                return;
        }
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.')
                        set_affinity_tid((pid_t)atoi(e->d_name), set);
        closedir(dir);
}

/* The event loop (the main thread) on @loop_cpu, every other thread of @pid (its workers) on @others_cpu. */
void pin_loop_apart(pid_t pid, int loop_cpu, int others_cpu)
{
        char path[64];
        struct dirent *e;
        cpu_set_t a, b;
        DIR *dir;

        CPU_ZERO(&a);
        CPU_SET(loop_cpu, &a);
        CPU_ZERO(&b);
        CPU_SET(others_cpu, &b);
        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        dir = opendir(path);
        if (!dir) {
                set_affinity_tid(pid, &a);
                return;
        }
        /* the main thread and the other event loops ("gpumemd-loop") on @loop_cpu, the worker threads
         * ("gpumemd-work") on @others_cpu */
        while ((e = readdir(dir))) {
                char comm_path[sizeof(path) + 280], comm[32] = "";
                FILE *f;
                if (e->d_name[0] == '.')
                        continue;
                snprintf(comm_path, sizeof(comm_path), "%s/%s/comm", path, e->d_name);
                f = fopen(comm_path, "re");
                if (f) {
                        if (!fgets(comm, sizeof(comm), f))
                                comm[0] = '\0';
                        fclose(f);
                }
                set_affinity_tid((pid_t)atoi(e->d_name), strncmp(comm, "gpumemd-work", 12) == 0 ? &b : &a);
        }
        closedir(dir);
}

/* The CPU time (user and system, clock ticks) of each of @pid's threads, at most @cap. */
static size_t task_times(pid_t pid, pid_t *tids, unsigned long long *ticks, size_t cap)
{
        char path[64];
        struct dirent *e;
        size_t n = 0;
        DIR *dir;

        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        dir = opendir(path);
        if (!dir)
                return 0;
        while (n < cap && (e = readdir(dir))) {
                char stat_path[sizeof(path) + 280], buf[1024];
                unsigned long long ut = 0, stime = 0;
                const char *p;
                FILE *f;
                size_t len;
                if (e->d_name[0] == '.')
                        continue;
                snprintf(stat_path, sizeof(stat_path), "%s/%s/stat", path, e->d_name);
                f = fopen(stat_path, "re");
                if (!f)
                        continue;
                len = fread(buf, 1, sizeof(buf) - 1, f);
                fclose(f);
                buf[len] = '\0';
                /* after the name in parentheses: state, then utime and stime are the 12th and 13th fields */
                p = strrchr(buf, ')');
                if (!p ||
                    sscanf(p + 2, "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &ut, &stime) != 2)
                        continue;
                tids[n] = (pid_t)atoi(e->d_name);
                ticks[n++] = ut + stime;
        }
        closedir(dir);
        return n;
}

pid_t pin_serving_loop_apart(pid_t pid, Ops *o, int loop_cpu, int others_cpu)
{
        pid_t before[256], after[256], best = 0;
        unsigned long long t0[256], t1[256], best_d = 0;
        size_t n0, n1;
        cpu_set_t a, b;

        n0 = task_times(pid, before, t0, 256);
        for (int i = 0; i < 20000; i++)
                (void)op_ping(o);
        n1 = task_times(pid, after, t1, 256);
        for (size_t i = 0; i < n1; i++)
                for (size_t k = 0; k < n0; k++)
                        if (after[i] == before[k] && t1[i] - t0[k] > best_d) {
                                best_d = t1[i] - t0[k];
                                best = after[i];
                        }
        if (!best) {
                pin_loop_apart(pid, loop_cpu, others_cpu);
                return 0;
        }
        CPU_ZERO(&a);
        CPU_SET(loop_cpu, &a);
        CPU_ZERO(&b);
        CPU_SET(others_cpu, &b);
        for (size_t i = 0; i < n1; i++)
                set_affinity_tid(after[i], after[i] == best ? &a : &b);
        return best;
}

void pin_process(pid_t pid, int cpu)
{
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        place_process(pid, &s);
}
