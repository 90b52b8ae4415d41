/* gpumem-bench, section scale: op latency with a thousand and with many live allocations, and the
 * filling and teardown the many-allocation sections share. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

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
double teardown_seconds(const char *sock, Ops *o, unsigned poll_us)
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

/* Time held_ops into @ret (N_HELD_OPS), the daemon @pid and this thread on the latency CPU. */
void held_ops_measure(const Settings *st, pid_t pid, Ops *o, Lat *ret)
{
        pin_process(pid, st->cpu_a);
        pin_self(st->cpu_a);
        for (size_t i = 0; i < N_HELD_OPS; i++)
                ret[i] = measure_op(held_ops[i].fn, o, held_ops[i].seq ? st->seq_iters : st->op_iters,
                                    held_ops[i].name);
        place_process(pid, &st->all_cpus);
        unpin_self(st);
}

/* Time held_ops again and add a row of @section for each: @small as "pinned", now as "unpinned". */
void held_ops_rows(const Settings *st, pid_t pid, Ops *o, const Lat *small, const char *section, Row *rows,
                   size_t *n_rows)
{
        Lat large[N_HELD_OPS];

        held_ops_measure(st, pid, o, large);
        for (size_t i = 0; i < N_HELD_OPS; i++) {
                Row *w = &rows[(*n_rows)++];
                memset(w, 0, sizeof(*w));
                snprintf(w->section, sizeof(w->section), "%s", section);
                snprintf(w->name, sizeof(w->name), "%s", held_ops[i].name);
                w->pinned = small[i];
                w->unpinned = large[i];
                w->ratio_p50 = w->unpinned.p50_us / w->pinned.p50_us;
                w->ratio_p99 = w->unpinned.p99_us / w->pinned.p99_us;
        }
}

void run_scaling(const Settings *st, Report *rep)
{
        Lat small[N_HELD_OPS];
        BenchDaemon d;
        Ops o;
        size_t have, got;
        uint64_t t0;
        int r, err = 0;

        rep->scale_small = st->scale_small;
        rep->scale_big = rep->scale_want = st->scale_big;
        r = bench_daemon_start(&d, st, NULL, 0);
        if (r < 0)
                die("cannot start gpumemd for the scaling run: %s", strerror(-r));
        rep->daemon_nofile = proc_nofile(d.pid);
        r = ops_setup(&o, d.sock, "bench-scale");
        if (r < 0)
                die("scaling client: %s", strerror(-r));
        have = fill(o.c, o.gpu[0], st->scale_small, &err);
        if (err)
                die("cannot hold %zu allocations: %s", st->scale_small, strerror(-err));
        held_ops_measure(st, d.pid, &o, small);

        t0 = now_ns();
        got = fill(o.c, o.gpu[0], rep->scale_big - have, &err);
        rep->scale_fill_seconds = (double)(now_ns() - t0) / 1e9;
        have += got;
        rep->scale_reached = have;
        if (err)
                snprintf(rep->scale_note, sizeof(rep->scale_note),
                         "stopped at %zu live allocations: %s (daemon RLIMIT_NOFILE %llu)", have,
                         strerror(-err), rep->daemon_nofile);

        held_ops_rows(st, d.pid, &o, small, "scaling", rep->scale_rows, &rep->n_scale_rows);

        /* Teardown: how long the daemon is busy freeing what a client held when it leaves (it serves
         * nobody meanwhile). Measured until its books show the objects gone. */
        rep->scale_teardown_seconds = teardown_seconds(d.sock, &o, 1000);
        bench_daemon_kill(&d);
}
