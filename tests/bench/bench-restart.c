/* gpumem-bench, section restart: from the signal to serving again, with the clients' objects carried. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/* When the daemon serving @c started (its admin status), 0 when it cannot be read. */
static uint64_t started_usec(gm_client *c)
{
        gm_status *s = NULL;
        uint64_t t = 0;

        if (gm_admin_status(c, &s) == 0 && s)
                t = s->started_usec;
        gm_status_free(s);
        return t;
}

/*
 * One hand-over in place (SIGUSR1: the daemon re-executes itself with the fds inherited, the same path as
 * systemd's fd store but for the store itself): the time from the signal until a carried client is
 * answered by the new daemon, which it tells by the daemon's start time in its status; until then the old
 * one may still answer, and a request sent meanwhile waits in the socket. Then a pointer query on one of its
 * allocations must find it where it was.
 */
static double one_switch(BenchDaemon *d, Ops *o, void *probe, gm_handle want)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        uint64_t before = started_usec(o->c), t0, now;
        double ms;

        if (!before)
                die("the restart client cannot read the daemon's status");
        t0 = now_ns();
        if (kill(d->pid, SIGUSR1) < 0)
                die("SIGUSR1: %s", strerror(errno));
        do {
                now = started_usec(o->c);
                if (!now)
                        die("the carried client lost its connection at the hand-over");
        } while (now == before);
        ms = (double)(now_ns() - t0) / 1e6;
        if (probe && (gm_pointer_get_attributes(o->c, probe, &pa) < 0 || pa.handle != want))
                die("an allocation was not carried over");
        return ms;
}

/* Rounds of switches at each size: the client's live objects and (beside it) idle connections. */
void run_restart(const Settings *st, Report *rep)
{
        size_t sizes[] = {0, 1000, st->restart_objects};
        unsigned long long nofile;
        BenchDaemon d;
        Ops o;
        int r, err = 0;
        size_t have = 0;

        rep->restart_ran = true;
        r = bench_daemon_start(&d, st, NULL, 0);
        if (r < 0)
                die("cannot start gpumemd for the restart run: %s", strerror(-r));
        /* On the model a hand-over holds two fds per device buffer for a moment (the file the model gives
         * it, and the copy for the next daemon): the largest point is what the daemon's fd limit allows. */
        nofile = proc_nofile(d.pid);
        if (nofile && sizes[2] * 2 + 256 > nofile) {
                sizes[2] = (size_t)((nofile - 256) / 2);
                snprintf(rep->restart_note, sizeof(rep->restart_note),
                         "%zu objects at most: the daemon's fd limit is %llu (two fds per device buffer at "
                         "the "
                         "hand-over on the model)",
                         sizes[2], nofile);
        }
        r = ops_setup(&o, d.sock, "bench-restart");
        if (r < 0)
                die("restart client: %s", strerror(-r));
        /* managed memory is not carried yet (a client holding some is closed at the hand-over) */
        if (o.managed && (r = gm_mem_free(o.c, o.managed)) < 0)
                die("restart client: %s", strerror(-r));
        o.managed = NULL;
        for (size_t k = 0; k < ARRAY_SIZE(sizes) && k < ARRAY_SIZE(rep->restart_rows); k++) {
                double ms[8];
                void *probe = NULL;
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                RestartRow *row = &rep->restart_rows[rep->n_restart_rows];

                if (sizes[k] > have)
                        have += fill(o.c, o.gpu[0], sizes[k] - have, &err);
                if (err)
                        die("cannot hold %zu allocations: %s", sizes[k], strerror(-err));
                /* the ops' own allocation is one of the objects too */
                probe = o.dev;
                if (probe && gm_pointer_get_attributes(o.c, probe, &pa) < 0)
                        die("pointer query before the hand-over");
                for (size_t i = 0; i < ARRAY_SIZE(ms); i++)
                        ms[i] = one_switch(&d, &o, probe, pa.handle);
                qsort(ms, ARRAY_SIZE(ms), sizeof(ms[0]), cmp_double);
                row->objects = have;
                row->fds = proc_fd_count(d.pid);
                row->min_ms = ms[0];
                row->p50_ms = (ms[ARRAY_SIZE(ms) / 2 - 1] + ms[ARRAY_SIZE(ms) / 2]) / 2;
                row->max_ms = ms[ARRAY_SIZE(ms) - 1];
                rep->n_restart_rows++;
        }
        ops_done(&o);
        bench_daemon_kill(&d);
}
