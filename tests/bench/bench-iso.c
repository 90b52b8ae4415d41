/* gpumem-bench, section iso: small ops while other clients run slow ones. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* A background client: large host allocations (pinned pages) or prefetches of a large managed range. */
static void slow_client(const char *sock, int kind, int stop_r, int result_w)
{
        gm_client *c = NULL;
        gm_topology *t = NULL;
        uint32_t gpu = 0;
        uint64_t n = 0, busy_ns = 0;
        void *managed = NULL;
        const size_t big = 64 * MIB;

        if (gm_client_connect(sock, "bench-slow", &c) < 0 || gm_topology_get(c, false, &t) < 0)
                _exit(2);
        for (size_t i = 0; i < t->n_nodes; i++)
                if (t->nodes[i].is_gpu && !gpu)
                        gpu = t->nodes[i].gpu_id;
        gm_topology_free(t);
        if (kind == 1 && gm_malloc_managed(c, big, 0, &managed) < 0)
                _exit(2);
        for (;;) {
                struct pollfd p = {.fd = stop_r, .events = POLLIN};
                uint64_t t0 = now_ns();
                int r;

                if (poll(&p, 1, 0) > 0)
                        break;
                if (kind == 0) {
                        void *h = NULL;
                        r = gm_host_malloc(c, big, gpu, -1, 0, &h);
                        if (r >= 0)
                                r = gm_mem_free(c, h);
                } else {
                        r = gm_mem_prefetch(c, managed, big, (n & 1) ? GM_LOCATION_CPU : gpu);
                }
                if (r < 0)
                        _exit(3);
                busy_ns += now_ns() - t0;
                n++;
        }
        uint64_t out[2] = {n, busy_ns};
        (void)!write(result_w, out, sizeof(out));
        gm_client_close(c);
        _exit(0);
}

void run_isolation(const Settings *st, Report *rep, const BenchDaemon *d)
{
        int stop[2], res[2][2];
        pid_t pids[2];
        uint64_t t_start, t_end;
        Ops o;
        int r = ops_setup(&o, d->sock, "bench-isolation");

        if (r < 0)
                die("isolation client: %s", strerror(-r));
        /* the loop that serves the measured client shares its CPU with it alone: the daemon's other loops
         * (which serve the slow clients) and its worker threads (the slow part of the slow ops) go with
         * the slow clients, as a scheduler spreads busy threads over the CPUs */
        if (pin_serving_loop_apart(d->pid, &o, st->cpu_a, st->cpu_b) == 0)
                fprintf(stderr,
                        "isolation: the loop serving the client was not found; every loop on CPU %d\n",
                        st->cpu_a);
        pin_self(st->cpu_a);
        rep->iso_idle = measure_op(op_ping, &o, st->op_iters, "ping");

        if (pipe2(stop, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        for (int k = 0; k < 2; k++) {
                if (pipe2(res[k], O_CLOEXEC) < 0)
                        die("pipe: %s", strerror(errno));
                pids[k] = fork();
                if (pids[k] == 0) {
                        close(stop[1]);
                        close(res[k][0]);
                        /* on the other CPU: only the daemon's time is shared with the measured client */
                        pin_self(st->cpu_b);
                        slow_client(d->sock, k, stop[0], res[k][1]);
                }
                close(res[k][1]);
        }
        close(stop[0]);
        usleep(200000); /* let the slow clients get going */
        t_start = now_ns();
        rep->iso_loaded = measure_op(op_ping, &o, st->op_iters, "ping under load");
        t_end = now_ns();
        close(stop[1]);
        for (int k = 0; k < 2; k++) {
                uint64_t out[2] = {0, 0};
                if (read(res[k][0], out, sizeof(out)) != (ssize_t)sizeof(out))
                        die("a slow client failed");
                close(res[k][0]);
                waitpid(pids[k], NULL, 0);
                rep->iso_bg_ops_per_s[k] = (double)out[0] / ((double)(t_end - t_start) / 1e9);
                rep->iso_bg_mean_ms[k] = out[0] ? (double)out[1] / (double)out[0] / 1e6 : 0;
        }
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        ops_done(&o);
}
