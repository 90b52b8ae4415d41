/* gpumem-bench, section restart: from the signal to serving again, with the clients' objects carried. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../integ/harness.h"
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

/* The supervisor's half of `systemctl restart`, on a thread of its own while the client asks. */
typedef struct Supervisor {
        Daemon *d;
        const char *preset;
        int stopped, started;
} Supervisor;

static void *supervisor_main(void *arg)
{
        Supervisor *s = arg;

        s->stopped = daemon_term(s->d);
        s->started = s->stopped == 0 ? daemon_restart_handover(s->d, s->preset, NULL) : -ECHILD;
        return NULL;
}

/*
 * One hand-over, as `systemctl restart` makes it (SIGTERM: the daemon puts its fds in the supervisor's store
 * and exits; the supervisor, the harness's, starts the next process with them) when @store is set, or in
 * place (SIGUSR1: the daemon re-executes itself with the fds inherited). Timed from the signal until a
 * carried client is answered by the new daemon, which it tells by the daemon's start time in its status;
 * until then the old one may still answer, and a request sent meanwhile waits in the socket. The supervisor
 * works on a thread of its own, so its own wait for READY=1 is not in the time. Then a pointer query on one
 * of the client's allocations must find it where it was.
 */
static double one_switch(pid_t pid, Daemon *store, const char *preset, Ops *o, void *probe, gm_handle want)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        uint64_t before = started_usec(o->c), t0, now;
        Supervisor sv = {.d = store, .preset = preset};
        pthread_t th;
        double ms;

        if (!before)
                die("the restart client cannot read the daemon's status");
        t0 = now_ns();
        if (store) {
                if (pthread_create(&th, NULL, supervisor_main, &sv) != 0)
                        die("cannot start the supervisor's thread");
        } else if (kill(pid, SIGUSR1) < 0) {
                die("SIGUSR1: %s", strerror(errno));
        }
        do {
                now = started_usec(o->c);
                if (!now)
                        die("the carried client lost its connection at the hand-over");
        } while (now == before);
        ms = (double)(now_ns() - t0) / 1e6;
        if (store) {
                pthread_join(th, NULL);
                if (sv.stopped != 0)
                        die("the daemon stopped with %d at the hand-over", sv.stopped);
                if (sv.started < 0)
                        die("the next daemon did not start: %s", strerror(-sv.started));
        }
        if (probe && (gm_pointer_get_attributes(o->c, probe, &pa) < 0 || pa.handle != want))
                die("an allocation was not carried over");
        return ms;
}

/* Rounds of switches at each size of the client's live objects, one way (@store or in place). */
static void restart_rows(const Settings *st, Report *rep, bool store)
{
        size_t sizes[] = {0, 1000, st->restart_objects};
        unsigned long long nofile;
        BenchDaemon bd;
        Daemon d;
        pid_t pid;
        const char *sock;
        Ops o;
        int r, err = 0;
        size_t have = 0;

        if (store) {
                /* the harness's supervisor: the fd store and the notify protocol, as systemd speaks them */
                (void)raise_nofile();
                setenv("GPUMEMD", st->gpumemd, 1);
                r = daemon_start(&d, st->preset, "[daemon]\nlog-level = warning\n", NULL);
                pid = d.pid;
                sock = d.sock;
        } else {
                r = bench_daemon_start(&bd, st, NULL, 0);
                pid = bd.pid;
                sock = bd.sock;
        }
        if (r < 0)
                die("cannot start gpumemd for the restart run: %s", strerror(-r));
        /* On the model a hand-over holds two fds per device buffer for a moment (the file the model gives
         * it, and the copy for the next daemon): the largest point is what the daemon's fd limit allows. */
        nofile = proc_nofile(pid);
        if (nofile && sizes[2] * 2 + 256 > nofile) {
                sizes[2] = (size_t)((nofile - 256) / 2);
                snprintf(rep->restart_note, sizeof(rep->restart_note),
                         "%zu objects at most: the daemon's fd limit is %llu (two fds per device buffer at "
                         "the hand-over on the model)",
                         sizes[2], nofile);
        }
        /* the ops' client holds a device allocation and 2 MiB of managed memory, carried with the rest */
        r = ops_setup(&o, sock, "bench-restart");
        if (r < 0)
                die("restart client: %s", strerror(-r));
        for (size_t k = 0; k < ARRAY_SIZE(sizes) && rep->n_restart_rows < ARRAY_SIZE(rep->restart_rows);
             k++) {
                double ms[8];
                void *probe = NULL;
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                RestartRow *row = &rep->restart_rows[rep->n_restart_rows];

                if (sizes[k] > have)
                        have += fill(o.c, o.gpu[0], sizes[k] - have, &err);
                if (err)
                        die("cannot hold %zu allocations: %s", sizes[k], strerror(-err));
                /* the ops' own allocations are among the objects too */
                probe = o.dev;
                if (probe && gm_pointer_get_attributes(o.c, probe, &pa) < 0)
                        die("pointer query before the hand-over");
                for (size_t i = 0; i < ARRAY_SIZE(ms); i++)
                        ms[i] = one_switch(store ? 0 : bd.pid, store ? &d : NULL, st->preset, &o, probe,
                                           pa.handle);
                qsort(ms, ARRAY_SIZE(ms), sizeof(ms[0]), cmp_double);
                row->how = store ? "store" : "exec";
                row->objects = have;
                row->fds = proc_fd_count(store ? d.pid : bd.pid);
                row->min_ms = ms[0];
                row->p50_ms = (ms[ARRAY_SIZE(ms) / 2 - 1] + ms[ARRAY_SIZE(ms) / 2]) / 2;
                row->max_ms = ms[ARRAY_SIZE(ms) - 1];
                rep->n_restart_rows++;
        }
        ops_done(&o);
        if (store) {
                (void)daemon_stop(&d);
                daemon_cleanup(&d);
        } else {
                bench_daemon_kill(&bd);
        }
}

void run_restart(const Settings *st, Report *rep)
{
        rep->restart_ran = true;
        restart_rows(st, rep, true);
        restart_rows(st, rep, false);
}
