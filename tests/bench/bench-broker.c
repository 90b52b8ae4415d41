/* gpumem-bench, section broker: the floors and the broker ops, pinned and unpinned. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/*
 * The floors and the broker ops, pinned and unpinned, in interleaved rounds: whatever else the machine does
 * during the run falls on every row alike, so the ratios compare like with like.
 */
void run_latency(const Settings *st, Report *rep, const BenchDaemon *d)
{
        const struct {
                const char *name;
                size_t req, rep;
                bool fd;
        } f[] = {
                {"small", rep->sz_ping_req, rep->sz_ping_rep, false},
                {"small+fd", rep->sz_ping_req, rep->sz_export_rep, true},
                {"topology-size", rep->sz_topo_req, rep->sz_topo_rep, false},
        };
        enum { N_FLOORS = sizeof(f) / sizeof(f[0]), N_ROWS = N_FLOORS + N_BROKER_OPS };
        const unsigned rounds = 5;
        uint64_t *samples[N_ROWS][2];
        size_t iters[N_ROWS];
        Row *rows[N_ROWS];
        Ops o;
        int r = ops_setup(&o, d->sock, "bench-latency");

        if (r < 0)
                die("cannot set up the latency client: %s", strerror(-r));
        for (size_t i = 0; i < N_ROWS; i++) {
                if (i < N_FLOORS) {
                        rows[i] = add_row(rep, "floor", f[i].name, 1, f[i].fd);
                        snprintf(rows[i]->floor, sizeof(rows[i]->floor), "%s", f[i].name);
                        rows[i]->ratio_p50 = rows[i]->ratio_p99 = 1.0;
                        iters[i] = st->floor_iters / rounds;
                } else {
                        size_t k = i - N_FLOORS;
                        rows[i] = add_row(rep, "gpumemd", broker_ops[k].name, broker_ops[k].rtts,
                                          broker_ops[k].fd);
                        snprintf(rows[i]->floor, sizeof(rows[i]->floor), "%s", broker_ops[k].floor);
                        iters[i] = (broker_ops[k].rtts > 1 ? st->seq_iters : st->op_iters) / rounds;
                }
                for (int m = 0; m < 2; m++) {
                        samples[i][m] = calloc(iters[i] * rounds, sizeof(uint64_t));
                        if (!samples[i][m])
                                die("out of memory");
                }
        }
        for (unsigned round = 0; round < rounds; round++) {
                for (size_t i = 0; i < N_ROWS; i++) {
                        for (int m = 0; m < 2; m++) {
                                uint64_t *out = samples[i][m] + round * iters[i];
                                bool pinned = m == 0;
                                if (pinned) {
                                        pin_process(d->pid, st->cpu_a);
                                        pin_self(st->cpu_a);
                                } else {
                                        place_process(d->pid, &st->all_cpus);
                                        unpin_self(st);
                                }
                                if (i < N_FLOORS)
                                        floor_samples(st, f[i].req, f[i].rep, f[i].fd,
                                                      pinned ? st->cpu_a : -1, iters[i], out);
                                else
                                        measure_samples(broker_ops[i - N_FLOORS].fn, &o, iters[i],
                                                        broker_ops[i - N_FLOORS].name, out);
                        }
                }
        }
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        for (size_t i = 0; i < N_ROWS; i++) {
                rows[i]->pinned = lat_of(samples[i][0], iters[i] * rounds);
                rows[i]->unpinned = lat_of(samples[i][1], iters[i] * rounds);
                free(samples[i][0]);
                free(samples[i][1]);
        }
        ops_done(&o);
}
