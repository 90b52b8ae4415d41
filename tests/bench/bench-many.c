/* gpumem-bench, section many: a million live allocations in a daemon limited to 20,000 fds. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

/*
 * The goal this measures: device allocations cost the daemon no fd, so a daemon whose RLIMIT_NOFILE is
 * 20,000 (soft and hard, set before exec) holds a million of them, at the per-op latency of a thousand.
 * One client fills from 4 threads on one connection; each point's ops run pinned, as in the scaling run.
 * Numbers only: nothing here fails on timing.
 */
void run_many(const Settings *st, Report *rep)
{
        HeldRun h;
        size_t have, got;
        uint64_t t0;
        int err = 0;

        rep->many_ran = true;
        rep->many_small = st->many_small;
        rep->many_want = st->many_big;
        held_run_start(&h, st, st->many_nofile, "many-allocations", "bench-many");
        rep->many_nofile = proc_nofile(h.d.pid);
        t0 = now_ns();
        have = held_run_fill(&h, st->many_small);
        rep->many_fill_small_us = (double)(now_ns() - t0) / 1e3 / (double)have;
        rep->many_fds_small = proc_fd_count(h.d.pid);
        rep->many_rss_small_kb = proc_status_kb(h.d.pid, "VmRSS");
        held_run_small(&h, st, rep);

        t0 = now_ns();
        got = fill(h.o.c, h.o.gpu[0], st->many_big - have, &err);
        rep->many_fill_seconds = (double)(now_ns() - t0) / 1e9;
        rep->many_fill_big_us = got ? rep->many_fill_seconds * 1e6 / (double)got : NAN;
        have += got;
        rep->many_reached = have;
        rep->many_fds_big = proc_fd_count(h.d.pid);
        rep->many_rss_big_kb = proc_status_kb(h.d.pid, "VmRSS");
        if (err)
                snprintf(rep->many_note, sizeof(rep->many_note), "stopped at %zu live allocations: %s", have,
                         strerror(-err));

        held_run_rows(&h, st, rep, "many", rep->many_rows, &rep->n_many_rows);
        /* the probe's status calls walk the model's books: not too often while a million go */
        rep->many_teardown_seconds = held_run_end(&h, 20000);
}
