/* gpumem-bench, section broker: the floors and the broker ops, pinned and unpinned. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "clock.h"

/*
 * The floors and the broker ops, pinned and unpinned, in interleaved rounds: whatever else the machine does
 * during the run falls on every row alike, so the ratios compare like with like. A machine whose speed
 * changes in steps (a VM whose host moves it, CPUs that change state) can still put an op's block in one
 * state and its floor's in another, seconds apart: so before each op's pinned block its floor is measured
 * again, as many round trips, and the pair's ratio is taken per round; the row's paired ratio is the median
 * over the rounds.
 */

void run_latency(const Settings *st, Report *rep, const BenchDaemon *d, const char *suffix)
{
        char floor_section[24], ops_section[24];
        const struct {
                const char *name;
                size_t req, rep;
                bool fd;
        } f[] = {
                {"small", rep->sz_ping_req, rep->sz_ping_rep, false},
                {"small+fd", rep->sz_ping_req, rep->sz_export_rep, true},
                {"topology-size", rep->sz_topo_req, rep->sz_topo_rep, false},
        };
        enum { N_FLOORS = sizeof(f) / sizeof(f[0]), N_ROWS = N_FLOORS + N_BROKER_OPS, ROUNDS = 5 };
        const unsigned rounds = ROUNDS;
        uint64_t *samples[N_ROWS][2], *beside = NULL, *tmp = NULL;
        double paired[N_BROKER_OPS][ROUNDS];
        size_t iters[N_ROWS], most = 0;
        size_t floor_of[N_BROKER_OPS];
        Row *rows[N_ROWS];
        Ops o;
        int r = ops_setup(&o, d->sock, "bench-latency");

        if (r < 0)
                die("cannot set up the latency client: %s", strerror(-r));
        snprintf(floor_section, sizeof(floor_section), "floor%s", suffix);
        snprintf(ops_section, sizeof(ops_section), "gpumemd%s", suffix);
        for (size_t i = 0; i < N_ROWS; i++) {
                if (i < N_FLOORS) {
                        rows[i] = add_row(rep, floor_section, f[i].name, 1, f[i].fd);
                        snprintf(rows[i]->floor, sizeof(rows[i]->floor), "%s", f[i].name);
                        rows[i]->ratio_p50 = rows[i]->ratio_p99 = 1.0;
                        iters[i] = st->floor_iters / rounds;
                } else {
                        size_t k = i - N_FLOORS;
                        rows[i] = add_row(rep, ops_section, broker_ops[k].name, broker_ops[k].rtts,
                                          broker_ops[k].fd);
                        snprintf(rows[i]->floor, sizeof(rows[i]->floor), "%s", broker_ops[k].floor);
                        iters[i] = (broker_ops[k].rtts > 1 ? st->seq_iters : st->op_iters) / rounds;
                }
                for (int m = 0; m < 2; m++) {
                        samples[i][m] = calloc(iters[i] * rounds, sizeof(uint64_t));
                        if (!samples[i][m])
                                die("out of memory");
                }
                if (iters[i] > most)
                        most = iters[i];
        }
        for (size_t k = 0; k < N_BROKER_OPS; k++) {
                floor_of[k] = 0;
                for (size_t j = 0; j < N_FLOORS; j++)
                        if (strcmp(f[j].name, broker_ops[k].floor) == 0)
                                floor_of[k] = j;
        }
        beside = calloc(most, sizeof(uint64_t));
        tmp = calloc(most, sizeof(uint64_t));
        if (!beside || !tmp)
                die("out of memory");
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
                                if (i < N_FLOORS) {
                                        floor_samples(st, f[i].req, f[i].rep, f[i].fd,
                                                      pinned ? st->cpu_a : -1, iters[i], out);
                                        continue;
                                }
                                size_t k = i - N_FLOORS;
                                const size_t fl = floor_of[k];
                                if (pinned) /* its floor, right before it: the same state of the machine */
                                        floor_samples(st, f[fl].req, f[fl].rep, f[fl].fd, st->cpu_a, iters[i],
                                                      beside);
                                measure_samples(broker_ops[k].fn, &o, iters[i], broker_ops[k].name, out);
                                if (pinned)
                                        paired[k][round] =
                                                block_p50(out, iters[i], tmp) /
                                                (broker_ops[k].rtts * block_p50(beside, iters[i], tmp));
                        }
                }
        }
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        for (size_t i = 0; i < N_ROWS; i++) {
                rows[i]->pinned = lat_of(samples[i][0], iters[i] * rounds);
                rows[i]->unpinned = lat_of(samples[i][1], iters[i] * rounds);
                if (i >= N_FLOORS) {
                        double *v = paired[i - N_FLOORS];
                        qsort(v, rounds, sizeof(*v), bench_cmp_double);
                        rows[i]->paired_p50 = v[rounds / 2];
                }
                free(samples[i][0]);
                free(samples[i][1]);
        }
        free(beside);
        free(tmp);
        ops_done(&o);
}
