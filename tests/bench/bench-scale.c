/* gpumem-bench, section scale: op latency with a thousand and with many live allocations, and the
 * filling and teardown the many-allocation sections share. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "clock.h"

typedef struct Filler {
        gm_client *c;
        uint32_t gpu;
        size_t n;
        int err;
} Filler;

static void *fill_thread(void *userdata)
{
        Filler *f = userdata;

        for (size_t i = 0; i < f->n; i++) {
                void *p = NULL;
                int r = gm_malloc(f->c, 4 * KIB, f->gpu, 0, &p);
                if (r < 0) {
                        f->err = r;
                        f->n = i;
                        break;
                }
        }
        return NULL;
}

/* Add @n device allocations of 4 KiB to @c's books, from 4 threads on the one connection. */
size_t fill(gm_client *c, uint32_t gpu, size_t n, int *ret_err)
{
        Filler f[4];
        pthread_t t[4];
        size_t done = 0;

        *ret_err = 0;
        for (int i = 0; i < 4; i++) {
                f[i] = (Filler){c, gpu, n / 4 + (i == 0 ? n % 4 : 0), 0};
                pthread_create(&t[i], NULL, fill_thread, &f[i]);
        }
        for (int i = 0; i < 4; i++) {
                pthread_join(t[i], NULL);
                done += f[i].n;
                if (f[i].err)
                        *ret_err = f[i].err;
        }
        return done;
}

/* The time a disconnect keeps the daemon busy freeing what the client held, until its books show nothing. */
static double teardown_seconds(const char *sock, Ops *o, unsigned poll_us)
{
        gm_client *probe = NULL;
        uint64_t t0;
        int r = gm_client_connect(sock, "bench-probe", &probe);

        if (r < 0)
                die("probe client: %s", strerror(-r));
        t0 = now_ns();
        ops_done(o);
        for (;;) {
                gm_status *s = NULL;
                uint64_t left;
                r = gm_admin_status(probe, &s);
                if (r < 0)
                        die("admin status: %s", strerror(-r));
                left = s->allocations;
                gm_status_free(s);
                if (left == 0 || now_ns() - t0 > 1200ull * 1000000000ull)
                        break;
                usleep(poll_us);
        }
        gm_client_close(probe);
        return (double)(now_ns() - t0) / 1e9;
}

/* The ops the many-allocation sections time at their small point and again at their large one. */
static const struct {
        const char *name;
        OpFn fn;
        bool seq;
} held_ops[N_HELD_OPS] = {
        {"ping", op_ping, false},
        {"pointer query", op_pointer, false},
        {"alloc+free (4 KiB device)", op_alloc_free, true},
        {"map+unmap (second GPU)", op_map_unmap, true},
};

/*
 * Time held_ops into @ret (N_HELD_OPS), the daemon @pid and this thread on the latency CPU, in HELD_ROUNDS
 * rounds. Before each op's block the ping floor is measured again for as many round trips, and
 * @ret_vs_floor gets the median over the rounds of the block's p50 against that floor's. The small and the
 * large point of a run lie seconds to minutes apart, the filling between them: a machine whose speed
 * changes meanwhile moves the plain ratio of the two points, not the ratio of these.
 */
enum { HELD_ROUNDS = 5 };
static void held_ops_measure(const Settings *st, const Report *rep, pid_t pid, Ops *o, Lat *ret,
                             double *ret_vs_floor)
{
        pin_process(pid, st->cpu_a);
        pin_self(st->cpu_a);
        for (size_t i = 0; i < N_HELD_OPS; i++) {
                size_t per = (held_ops[i].seq ? st->seq_iters : st->op_iters) / HELD_ROUNDS;
                uint64_t *s, *fl, *tmp;
                double v[HELD_ROUNDS];

                if (per == 0)
                        per = 1;
                s = calloc(per * HELD_ROUNDS, sizeof(*s));
                fl = calloc(per, sizeof(*fl));
                tmp = calloc(per, sizeof(*tmp));
                if (!s || !fl || !tmp)
                        die("out of memory");
                for (unsigned round = 0; round < HELD_ROUNDS; round++) {
                        uint64_t *block = s + round * per;
                        floor_samples(st, rep->sz_ping_req, rep->sz_ping_rep, false, st->cpu_a, per, fl);
                        measure_samples(held_ops[i].fn, o, per, held_ops[i].name, block);
                        v[round] = block_p50(block, per, tmp) / block_p50(fl, per, tmp);
                }
                qsort(v, HELD_ROUNDS, sizeof(v[0]), bench_cmp_double);
                ret_vs_floor[i] = v[HELD_ROUNDS / 2];
                ret[i] = lat_of(s, per * HELD_ROUNDS);
                free(s);
                free(fl);
                free(tmp);
        }
        place_process(pid, &st->all_cpus);
        unpin_self(st);
}

void held_run_start(HeldRun *h, const Settings *st, unsigned long long nofile, const char *run,
                    const char *client)
{
        int r = bench_daemon_start(&h->d, st, NULL, nofile);

        if (r < 0)
                die("cannot start gpumemd for the %s run: %s", run, strerror(-r));
        r = ops_setup(&h->o, h->d.sock, client);
        if (r < 0)
                die("%s client: %s", run, strerror(-r));
}

size_t held_run_fill(HeldRun *h, size_t n)
{
        int err = 0;
        size_t have = fill(h->o.c, h->o.gpu[0], n, &err);

        if (err)
                die("cannot hold %zu allocations: %s", n, strerror(-err));
        return have;
}

void held_run_small(HeldRun *h, const Settings *st, const Report *rep)
{
        held_ops_measure(st, rep, h->d.pid, &h->o, h->small, h->small_vs_floor);
}

/* The rows: the small point as "pinned", the large one as "unpinned", and as paired the growth of each op's
 * ratio to the floor beside it. */
void held_run_rows(HeldRun *h, const Settings *st, const Report *rep, const char *section, Row *rows,
                   size_t *n_rows)
{
        const Lat *small = h->small;
        const double *small_vs_floor = h->small_vs_floor;
        Lat large[N_HELD_OPS];
        double large_vs_floor[N_HELD_OPS];

        held_ops_measure(st, rep, h->d.pid, &h->o, large, large_vs_floor);
        for (size_t i = 0; i < N_HELD_OPS; i++) {
                Row *w = &rows[(*n_rows)++];
                memset(w, 0, sizeof(*w));
                snprintf(w->section, sizeof(w->section), "%s", section);
                snprintf(w->name, sizeof(w->name), "%s", held_ops[i].name);
                w->pinned = small[i];
                w->unpinned = large[i];
                w->ratio_p50 = w->unpinned.p50_us / w->pinned.p50_us;
                w->ratio_p99 = w->unpinned.p99_us / w->pinned.p99_us;
                w->paired_p50 = large_vs_floor[i] / small_vs_floor[i];
        }
}

double held_run_end(HeldRun *h, unsigned poll_us)
{
        double seconds = teardown_seconds(h->d.sock, &h->o, poll_us);

        bench_daemon_kill(&h->d);
        return seconds;
}

void run_scaling(const Settings *st, Report *rep)
{
        HeldRun h;
        size_t have, got;
        uint64_t t0;
        int err = 0;

        rep->scale_small = st->scale_small;
        rep->scale_big = rep->scale_want = st->scale_big;
        held_run_start(&h, st, 0, "scaling", "bench-scale");
        rep->daemon_nofile = proc_nofile(h.d.pid);
        have = held_run_fill(&h, st->scale_small);
        held_run_small(&h, st, rep);

        t0 = now_ns();
        got = fill(h.o.c, h.o.gpu[0], rep->scale_big - have, &err);
        rep->scale_fill_seconds = (double)(now_ns() - t0) / 1e9;
        have += got;
        rep->scale_reached = have;
        if (err)
                snprintf(rep->scale_note, sizeof(rep->scale_note),
                         "stopped at %zu live allocations: %s (daemon RLIMIT_NOFILE %llu)", have,
                         strerror(-err), rep->daemon_nofile);

        held_run_rows(&h, st, rep, "scaling", rep->scale_rows, &rep->n_scale_rows);

        /* Teardown: how long the daemon is busy freeing what a client held when it leaves (it serves
         * nobody meanwhile). Measured until its books show the objects gone. */
        rep->scale_teardown_seconds = held_run_end(&h, 1000);
}
