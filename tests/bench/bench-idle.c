/* gpumem-bench, section idle: the memory an idle connection costs the daemon and the kernel. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../integ/harness.h"
#include "bench.h"

void run_idle(const Settings *st, Report *rep)
{
        char conf[256];
        BenchDaemon d;
        size_t want_n = st->idle_conns;
        int *fds = calloc(want_n + 1, sizeof(int));
        long slab0;
        size_t n = 0;
        int r;

        if (!fds)
                die("out of memory");
        snprintf(conf, sizeof(conf), "[daemon]\nmax-connections = %zu\nmax-connections-per-uid = %zu\n",
                 st->idle_conns + 64, st->idle_conns + 64);
        r = bench_daemon_start(&d, st, conf, 0);
        if (r < 0)
                die("cannot start gpumemd for the idle-connection run: %s", strerror(-r));
        rep->idle_want = want_n;
        {
                /* a connection holds two fds in the daemon: its socket and the peer's pidfd */
                unsigned long long lim = proc_nofile(d.pid);
                if (lim && lim < 2 * want_n + 256) {
                        want_n = lim > 256 + 200 ? (size_t)(lim - 256) / 2 : 100;
                        snprintf(rep->idle_note, sizeof(rep->idle_note),
                                 "capped at %zu of %zu wanted: each connection holds a socket and a pidfd in "
                                 "the "
                                 "daemon, whose RLIMIT_NOFILE hard limit is %llu",
                                 want_n, rep->idle_want, lim);
                }
        }
        /* one connection first, so what every daemon allocates once is not counted */
        fds[0] = raw_connect(d.sock);
        if (fds[0] < 0 || raw_hello_window(fds[0], 2 * MIB) < 0)
                die("idle: first connection failed");
        usleep(100000);
        rep->idle_rss_before_kb = proc_status_kb(d.pid, "VmRSS");
        slab0 = meminfo_kb("Slab");
        for (n = 1; n <= want_n; n++) {
                int fd = raw_connect(d.sock);
                if (fd < 0) {
                        snprintf(rep->idle_note, sizeof(rep->idle_note), "connect %zu: %s", n, strerror(-fd));
                        break;
                }
                fds[n] = fd;
                r = raw_hello_window(fd, 2 * MIB);
                if (r < 0) {
                        snprintf(rep->idle_note, sizeof(rep->idle_note), "hello %zu: %s", n, strerror(-r));
                        break;
                }
        }
        usleep(100000);
        rep->idle_n = n - 1;
        rep->idle_rss_after_kb = proc_status_kb(d.pid, "VmRSS");
        rep->idle_slab_delta_kb = meminfo_kb("Slab") - slab0;
        rep->idle_bytes_per_conn = rep->idle_n ? (double)(rep->idle_rss_after_kb - rep->idle_rss_before_kb) *
                                                         1024.0 / (double)rep->idle_n
                                               : NAN;
        rep->idle_slab_per_conn =
                rep->idle_n ? (double)rep->idle_slab_delta_kb * 1024.0 / (double)rep->idle_n : NAN;
        for (size_t i = 0; i <= n && i <= want_n; i++)
                if (fds[i] > 0)
                        close(fds[i]);
        free(fds);
        bench_daemon_kill(&d);
}
