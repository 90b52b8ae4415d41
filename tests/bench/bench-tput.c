/* gpumem-bench, section tput: ping throughput of 1 to 64 client processes, against a raw echo server; and
 * how alloc+free scales with its clients (every memory request takes the daemon's books' lock). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../integ/harness.h"
#include "frame.h"
#include "bench.h"

/* A client process: connect, report ready, wait for the start, run for @seconds, write its count. */
typedef enum FleetOp {
        FLEET_PING,
        FLEET_RAW,   /* the raw echo server's ping */
        FLEET_ALLOC, /* alloc+free of 4 KiB of device memory: one count per pair */
} FleetOp;

static void fleet_client(const char *sock, FleetOp op, size_t req_len, double seconds, int ready_w, int go_r,
                         int result_w)
{
        bool raw = op == FLEET_RAW;
        uint32_t gpu = 0;
        static uint8_t buf[GM_FRAME_MAX], in[GM_FRAME_MAX];
        gm_client *c = NULL;
        uint64_t count = 0, deadline;
        char one = 1;
        int fd = -1;

        if (raw)
                fd = raw_connect(sock);
        else if (gm_client_connect(sock, "bench-tput", &c) < 0)
                _exit(2);
        if (raw && fd < 0)
                _exit(2);
        if (op == FLEET_ALLOC) {
                gm_topology *t = NULL;
                if (gm_topology_get(c, false, &t) < 0)
                        _exit(2);
                for (size_t i = 0; i < t->n_nodes && !gpu; i++)
                        if (t->nodes[i].is_gpu)
                                gpu = t->nodes[i].gpu_id;
                gm_topology_free(t);
        }
        memset(buf, 0xa5, req_len);
        (void)!write(ready_w, &one, 1);
        close(ready_w);
        (void)!read(go_r, &one, 1); /* EOF when the parent closes the other end */
        deadline = now_ns() + (uint64_t)(seconds * 1e9);
        while (now_ns() < deadline) {
                for (int k = 0; k < 16; k++) {
                        if (raw) {
                                if (send_packet(fd, buf, req_len, -1) < 0 ||
                                    recv_packet(fd, in, sizeof(in), NULL) <= 0)
                                        _exit(3);
                        } else if (op == FLEET_ALLOC) {
                                void *p = NULL;
                                if (gm_malloc(c, 4096, gpu, 0, &p) < 0 || gm_mem_free(c, p) < 0)
                                        _exit(3);
                        } else if (gm_ping(c) < 0) {
                                _exit(3);
                        }
                        count++;
                }
        }
        (void)!write(result_w, &count, sizeof(count));
        _exit(0);
}

static double fleet_run(const Settings *st, const char *sock, FleetOp op, size_t req_len, unsigned n)
{
        int go[2], ready[2];
        pid_t pids[64];
        int res[64];
        uint64_t total = 0;
        char b;

        if (pipe2(go, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        for (unsigned i = 0; i < n; i++) {
                int rp[2];
                if (pipe2(rp, O_CLOEXEC) < 0)
                        die("pipe: %s", strerror(errno));
                pids[i] = fork();
                if (pids[i] == 0) {
                        close(go[1]);
                        close(ready[0]);
                        close(rp[0]);
                        unpin_self(st);
                        fleet_client(sock, op, req_len, st->tput_seconds, ready[1], go[0], rp[1]);
                }
                close(rp[1]);
                res[i] = rp[0];
        }
        close(ready[1]);
        close(go[0]);
        for (unsigned i = 0; i < n; i++)
                if (read(ready[0], &b, 1) != 1)
                        die("a throughput client failed to connect");
        close(ready[0]);
        close(go[1]);
        for (unsigned i = 0; i < n; i++) {
                uint64_t c = 0;
                if (read(res[i], &c, sizeof(c)) != (ssize_t)sizeof(c))
                        die("a throughput client failed");
                total += c;
                close(res[i]);
                waitpid(pids[i], NULL, 0);
        }
        return (double)total / st->tput_seconds;
}

void run_throughput(const Settings *st, Report *rep, const BenchDaemon *d)
{
        static const unsigned counts[] = {1, 4, 16, 64};
        RawServer rs;

        raw_server_start(&rs, d->dir, rep->sz_ping_rep, st);
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        for (size_t i = 0; i < 4; i++) {
                rep->tput_clients[i] = counts[i];
                rep->tput_gpumemd[i] = fleet_run(st, d->sock, FLEET_PING, 0, counts[i]);
                rep->tput_raw[i] = fleet_run(st, rs.path, FLEET_RAW, rep->sz_ping_req, counts[i]);
                rep->tput_alloc[i] = fleet_run(st, d->sock, FLEET_ALLOC, 0, counts[i]);
        }
        rep->n_tput = 4;
        raw_server_stop(&rs);
}
