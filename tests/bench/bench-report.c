/* gpumem-bench: ratios, targets, and the report as a table and as JSON. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench.h"

void compute_ratios(Report *rep)
{
        for (size_t i = 0; i < rep->n_rows; i++) {
                Row *w = &rep->rows[i];
                const Row *f;
                char floor_section[32];
                if (strcmp(w->section, "gpumemd") != 0 && strcmp(w->section, "gpumemd-kfd") != 0)
                        continue;
                /* each backend's ops against the floors measured beside them */
                snprintf(floor_section, sizeof(floor_section), "floor%s", w->section + 7);
                f = find_row(rep, floor_section, w->floor);
                if (!f)
                        continue;
                /* a sequence of k round trips is held against k floors */
                w->ratio_p50 = w->pinned.p50_us / (w->rtts * f->pinned.p50_us);
                w->ratio_p99 = w->pinned.p99_us / (w->rtts * f->pinned.p99_us);
        }
}

/* A row through gpumemd against the same row in process: p50 at most @x times it, or it plus @plus_us. */
static void rocm_target(Report *rep, const char *name, const char *what, double x, double plus_us)
{
        const Row *g = find_row(rep, "rocm-gpumemd", name), *m = find_row(rep, "rocm-model", name);
        char meas[96];

        if (!g || !m || !g->pinned.n || !m->pinned.n)
                return;
        double limit = x * m->pinned.p50_us;
        if (plus_us > 0 && m->pinned.p50_us + plus_us > limit)
                limit = m->pinned.p50_us + plus_us;
        snprintf(meas, sizeof(meas), "%.1f us vs %.1f us in process", g->pinned.p50_us, m->pinned.p50_us);
        add_target(rep, what, meas, g->pinned.p50_us / limit, 1.0, false);
}

/* The HIP section's targets (run with --only rocm). */
void compute_rocm_targets(Report *rep)
{
        if (!rep->rocm_ran)
                return;
        rocm_target(rep, "hipMemcpy-pinned-64MiB", "HIP: pinned hipMemcpy 64 MiB <= 1.2x in process", 1.2, 0);
        rocm_target(rep, "hipMemcpy-pageable-64MiB", "HIP: pageable hipMemcpy 64 MiB <= 2x in process", 2.0,
                    0);
        rocm_target(rep, "hipHostMalloc+hipHostFree",
                    "HIP: hipHostMalloc+hipHostFree <= 3x or in process + 100 us", 3.0, 100);
        rocm_target(rep, "hipMallocManaged+prefetch+free",
                    "HIP: hipMallocManaged+prefetch+free <= 3x or in process + 100 us", 3.0, 100);
        rocm_target(rep, "hipMalloc+hipFree", "HIP: hipMalloc+hipFree <= 3x in process", 3.0, 0);
}

void compute_targets(Report *rep)
{
        const Row *floor = find_row(rep, "floor", "small");
        char m[64], what[128];

        for (size_t i = 0; i < N_BROKER_OPS; i++) {
                const Row *w = find_row(rep, "gpumemd", broker_ops[i].name);
                if (!w || !broker_ops[i].small)
                        continue;
                snprintf(what, sizeof(what), "%s p50 <= 1.3x floor p50 (pinned)", w->name);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->pinned.p50_us, floor->pinned.p50_us);
                add_target(rep, what, m, w->ratio_p50, 1.3, false);
                snprintf(what, sizeof(what), "%s p50 <= 1.3x floor p50 measured beside it (pinned)", w->name);
                add_target(rep, what, "median of the rounds' pairs", w->paired_p50, 1.3, false);
                snprintf(what, sizeof(what), "%s p99 <= 2x floor p99 (pinned)", w->name);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->pinned.p99_us, floor->pinned.p99_us);
                add_target(rep, what, m, w->ratio_p99, 2.0, false);
        }
        {
                const Row *w = find_row(rep, "gpumemd", "dmabuf export (+fd)");
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->pinned.p50_us, floor->pinned.p50_us);
                add_target(rep, "dmabuf export (+fd) p50 <= 1.6x plain floor p50 (pinned)", m, w->ratio_p50,
                           1.6, false);
                add_target(rep, "dmabuf export (+fd) p50 <= 1.6x plain floor p50 measured beside it (pinned)",
                           "median of the rounds' pairs", w->paired_p50, 1.6, false);
        }
        for (size_t i = 0; i < rep->n_tput; i++)
                if (rep->tput_clients[i] == 16) {
                        snprintf(m, sizeof(m), "%.0f vs %.0f ops/s", rep->tput_gpumemd[i], rep->tput_raw[i]);
                        add_target(rep, "throughput, 16 clients >= 0.65x thread-per-connection server", m,
                                   rep->tput_gpumemd[i] / rep->tput_raw[i], 0.65, true);
                }
        snprintf(m, sizeof(m), "%.2f us vs %.2f us", rep->iso_loaded.p99_us, rep->iso_idle.p99_us);
        add_target(rep, "ping p99 under slow ops <= 2x idle p99 (pinned)", m,
                   rep->iso_loaded.p99_us / rep->iso_idle.p99_us, 2.0, false);
        for (size_t i = 0; i < rep->n_scale_rows; i++) {
                const Row *w = &rep->scale_rows[i];
                snprintf(what, sizeof(what), "%s p50 at %zu <= 1.2x at %zu allocations", w->name,
                         rep->scale_reached, rep->scale_small);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->unpinned.p50_us, w->pinned.p50_us);
                add_target(rep, what, m, w->ratio_p50, 1.2, false);
                snprintf(what, sizeof(what), "%s p50 at %zu <= 1.2x at %zu allocations (paired)", w->name,
                         rep->scale_reached, rep->scale_small);
                add_target(rep, what, "each point against the floor beside it", w->paired_p50, 1.2, false);
        }
        for (size_t i = 0; i < rep->n_many_rows; i++) {
                const Row *w = &rep->many_rows[i];
                snprintf(what, sizeof(what), "%s p50 at %zu <= 1.2x at %zu, %llu fds", w->name,
                         rep->many_reached, rep->many_small, rep->many_nofile);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->unpinned.p50_us, w->pinned.p50_us);
                add_target(rep, what, m, w->ratio_p50, 1.2, false);
                snprintf(what, sizeof(what), "%s p50 at %zu <= 1.2x at %zu, %llu fds (paired)", w->name,
                         rep->many_reached, rep->many_small, rep->many_nofile);
                add_target(rep, what, "each point against the floor beside it", w->paired_p50, 1.2, false);
        }
        if (rep->many_ran && rep->many_reached < rep->many_want) {
                snprintf(m, sizeof(m), "%zu of %zu", rep->many_reached, rep->many_want);
                add_target(rep, "live allocations held under 20,000 fds", m,
                           (double)rep->many_reached / (double)rep->many_want, 1.0, true);
        }
        if (rep->scale_reached < rep->scale_big) {
                snprintf(m, sizeof(m), "%zu of %zu", rep->scale_reached, rep->scale_big);
                add_target(rep, "live allocations held", m,
                           (double)rep->scale_reached / (double)rep->scale_big, 1.0, true);
        }
        /* the last row of each way is its largest point */
        for (size_t i = 0; rep->restart_ran && i < rep->n_restart_rows; i++) {
                const RestartRow *w = &rep->restart_rows[i];
                bool store = strcmp(w->how, "store") == 0;
                if (i + 1 < rep->n_restart_rows && strcmp(rep->restart_rows[i + 1].how, w->how) == 0)
                        continue;
                snprintf(m, sizeof(m), "%.1f ms with %zu objects", w->p50_ms, w->objects);
                add_target(rep,
                           store ? "restart to serving again with 10,000 objects < 200 ms (p50, SIGTERM)"
                                 : "restart to serving again with 10,000 objects < 200 ms (p50, re-exec)",
                           m, w->p50_ms / 200.0, 1.0, false);
        }
        if (rep->idle_n < rep->idle_want) {
                snprintf(m, sizeof(m), "%zu of %zu", rep->idle_n, rep->idle_want);
                add_target(rep, "idle connections held", m, (double)rep->idle_n / (double)rep->idle_want, 1.0,
                           true);
        }
        compute_rocm_targets(rep);
        snprintf(m, sizeof(m), "%.0f bytes over %zu connections", rep->idle_bytes_per_conn, rep->idle_n);
        add_target(rep, "daemon RSS per idle connection < 16 KiB", m, rep->idle_bytes_per_conn / 16384.0, 1.0,
                   false);
        /* "< 16 KiB" is strict */
        if (rep->idle_bytes_per_conn >= 16384.0)
                rep->targets[rep->n_targets - 1].met = false;
}

static void print_lat_cells(const Lat *l)
{
        if (l->n)
                printf(" %9.2f %9.2f", l->p50_us, l->p99_us);
        else
                printf(" %9s %9s", "-", "-");
}

void print_report(const Settings *st, const Report *rep)
{
        struct utsname u;

        uname(&u);
        printf("\ngpumemd benchmark (%s run) on %s %s, %ld CPUs; model backend, preset %s%s\n",
               st->long_run ? "long" : "default", u.sysname, u.release, sysconf(_SC_NPROCESSORS_ONLN),
               st->preset,
               st->kfd_preload ? "; sections *-kfd: the kfd backend under the model's preload" : "");
        printf("Latency: microseconds; 'pinned' = daemon (every thread) and client on CPU %d; 'unpinned' = "
               "scheduler's choice.\nThroughput is unpinned. Ratios use the pinned figures; a sequence of k "
               "round trips is held against k floors.\n'paired': the median over the rounds of an op's p50 "
               "against its floor's, measured again just before it; in the scaling and many tables, "
               "that\nmedian at "
               "the large point over the one at the small point.\n",
               st->cpu_a);
        printf("Frame sizes on the wire: ping %zu/%zu bytes, topology %zu/%zu, dmabuf export reply %zu (+1 "
               "fd)\n\n",
               rep->sz_ping_req, rep->sz_ping_rep, rep->sz_topo_req, rep->sz_topo_rep, rep->sz_export_rep);

        printf("%-11s %-27s %3s %9s %9s %11s %9s %9s  %-14s %6s %6s %7s\n", "section", "operation", "RTT",
               "p50", "p99", "ops/s", "p50", "p99", "floor", "x p50", "x p99", "paired");
        printf("%-11s %-27s %3s %9s %9s %11s %9s %9s\n", "", "", "", "pinned", "pinned", "pinned", "unpinned",
               "unpinned");
        for (size_t i = 0; i < rep->n_rows; i++) {
                const Row *w = &rep->rows[i];
                printf("%-11s %-27s %3u", w->section, w->name, w->rtts);
                print_lat_cells(&w->pinned);
                printf(" %11.0f", w->pinned.ops_per_s);
                print_lat_cells(&w->unpinned);
                if (strcmp(w->section, "gpumemd") == 0 || strcmp(w->section, "gpumemd-kfd") == 0) {
                        printf("  %-14s %6.2f %6.2f", w->floor, w->ratio_p50, w->ratio_p99);
                        if (w->paired_p50 > 0)
                                printf(" %7.2f", w->paired_p50);
                } else if (strcmp(w->section, "rocm-gpumemd") == 0) {
                        const Row *b = find_row(rep, "rocm-model", w->name);
                        if (b && b->pinned.n)
                                printf("  %-14s %6.2f %6.2f", "(this/model)",
                                       w->pinned.p50_us / b->pinned.p50_us,
                                       w->pinned.p99_us / b->pinned.p99_us);
                } else if (strcmp(w->section, "in-process") == 0) {
                        const Row *b = find_row(rep, "gpumemd", w->name);
                        if (b)
                                printf("  %-14s %6.2f %6.2f", "(broker/this)",
                                       b->pinned.p50_us / w->pinned.p50_us,
                                       b->pinned.p99_us / w->pinned.p99_us);
                }
                printf("\n");
        }

        printf("\nThroughput (ping, unpinned, %.1f s per point)\n%8s %14s %14s %7s\n", st->tput_seconds,
               "clients", "gpumemd ops/s", "raw ops/s", "ratio");
        for (size_t i = 0; i < rep->n_tput; i++)
                printf("%8u %14.0f %14.0f %7.2f\n", rep->tput_clients[i], rep->tput_gpumemd[i],
                       rep->tput_raw[i], rep->tput_gpumemd[i] / rep->tput_raw[i]);
        if (rep->n_tput) {
                printf("\nThroughput of alloc+free (4 KiB device, unpinned; every memory request takes the "
                       "daemon's books' lock)\n%8s %14s %10s\n",
                       "clients", "pairs/s", "x 1 client");
                for (size_t i = 0; i < rep->n_tput; i++)
                        printf("%8u %14.0f %10.2f\n", rep->tput_clients[i], rep->tput_alloc[i],
                               rep->tput_alloc[0] > 0 ? rep->tput_alloc[i] / rep->tput_alloc[0] : 0.0);
        }

        printf("\nSmall ops beside slow ones (ping pinned with the daemon's loop serving it on CPU %d; two "
               "clients, the daemon's other loops and its workers on CPU %d run 64 MiB host alloc+free and "
               "64 MiB prefetches)\n",
               st->cpu_a, st->cpu_b);
        printf("  idle:   p50 %8.2f us  p99 %8.2f us\n  loaded: p50 %8.2f us  p99 %8.2f us  (p99 x%.2f)\n",
               rep->iso_idle.p50_us, rep->iso_idle.p99_us, rep->iso_loaded.p50_us, rep->iso_loaded.p99_us,
               rep->iso_loaded.p99_us / rep->iso_idle.p99_us);
        printf("  slow ops: host alloc+free %.1f/s (%.2f ms each), prefetch %.1f/s (%.2f ms each)\n",
               rep->iso_bg_ops_per_s[0], rep->iso_bg_mean_ms[0], rep->iso_bg_ops_per_s[1],
               rep->iso_bg_mean_ms[1]);

        printf("\nScaling: one client holding %zu vs %zu live 4 KiB device allocations (pinned; daemon "
               "RLIMIT_NOFILE %llu)\n",
               rep->scale_small, rep->scale_reached, rep->daemon_nofile);
        if (rep->scale_note[0])
                printf("  %s\n", rep->scale_note);
        printf("%-27s %10s %10s %10s %10s %7s %7s %7s\n", "operation", "p50 small", "p99 small", "p50 large",
               "p99 large", "x p50", "x p99", "paired");
        for (size_t i = 0; i < rep->n_scale_rows; i++) {
                const Row *w = &rep->scale_rows[i];
                printf("%-27s %10.2f %10.2f %10.2f %10.2f %7.2f %7.2f %7.2f\n", w->name, w->pinned.p50_us,
                       w->pinned.p99_us, w->unpinned.p50_us, w->unpinned.p99_us, w->ratio_p50, w->ratio_p99,
                       w->paired_p50);
        }
        printf("  filling took %.1f s; freeing them all at disconnect kept the daemon busy %.2f s\n",
               rep->scale_fill_seconds, rep->scale_teardown_seconds);

        if (rep->many_ran) {
                printf("\nMany live allocations: one client holding %zu vs %zu live 4 KiB device allocations "
                       "(pinned; daemon RLIMIT_NOFILE %llu, soft and hard)\n",
                       rep->many_small, rep->many_reached, rep->many_nofile);
                if (rep->many_note[0])
                        printf("  %s\n", rep->many_note);
                printf("%-27s %10s %10s %10s %10s %7s %7s %7s\n", "operation", "p50 small", "p99 small",
                       "p50 large", "p99 large", "x p50", "x p99", "paired");
                for (size_t i = 0; i < rep->n_many_rows; i++) {
                        const Row *w = &rep->many_rows[i];
                        printf("%-27s %10.2f %10.2f %10.2f %10.2f %7.2f %7.2f %7.2f\n", w->name,
                               w->pinned.p50_us, w->pinned.p99_us, w->unpinned.p50_us, w->unpinned.p99_us,
                               w->ratio_p50, w->ratio_p99, w->paired_p50);
                }
                printf("  filling (4 threads, one connection): %.2f us per allocation for the first %zu, "
                       "%.2f us "
                       "for the next %zu (%.1f s)\n",
                       rep->many_fill_small_us, rep->many_small, rep->many_fill_big_us,
                       rep->many_reached - rep->many_small, rep->many_fill_seconds);
                printf("  daemon fds %d at %zu, %d at %zu; daemon RSS %ld KiB at %zu, %ld KiB at %zu (%.0f "
                       "bytes "
                       "per allocation)\n",
                       rep->many_fds_small, rep->many_small, rep->many_fds_big, rep->many_reached,
                       rep->many_rss_small_kb, rep->many_small, rep->many_rss_big_kb, rep->many_reached,
                       rep->many_reached > rep->many_small
                               ? (double)(rep->many_rss_big_kb - rep->many_rss_small_kb) * 1024.0 /
                                         (double)(rep->many_reached - rep->many_small)
                               : NAN);
                printf("  freeing them all at disconnect kept the daemon busy %.2f s\n",
                       rep->many_teardown_seconds);
        }

        if (rep->restart_ran) {
                printf("\nRestart with the clients carried, from the signal to a carried client answered by "
                       "the "
                       "new daemon, 8 rounds each (store: SIGTERM, the supervisor's fd store and a new "
                       "process, "
                       "as systemctl restart; exec: SIGUSR1, the daemon re-executes itself)\n");
                if (rep->restart_note[0])
                        printf("  %s\n", rep->restart_note);
                printf("%6s %12s %8s %10s %10s %10s\n", "how", "objects", "fds", "min ms", "p50 ms",
                       "max ms");
                for (size_t i = 0; i < rep->n_restart_rows; i++) {
                        const RestartRow *w = &rep->restart_rows[i];
                        printf("%6s %12zu %8d %10.2f %10.2f %10.2f\n", w->how, w->objects, w->fds, w->min_ms,
                               w->p50_ms, w->max_ms);
                }
        }

        printf("\nIdle connections: %zu (each after hello with a 2 MiB window): daemon RSS %ld -> %ld KiB, "
               "%.0f "
               "bytes each; kernel slab %+.0f bytes each%s%s\n",
               rep->idle_n, rep->idle_rss_before_kb, rep->idle_rss_after_kb, rep->idle_bytes_per_conn,
               rep->idle_slab_per_conn, rep->idle_note[0] ? "; " : "", rep->idle_note);

        printf("\nTargets\n");
        for (size_t i = 0; i < rep->n_targets; i++) {
                const Target *t = &rep->targets[i];
                printf("  [%s] %-72s %6.2f (limit %s%.2f)  %s\n", t->met ? "met   " : "MISSED", t->what,
                       t->ratio, t->higher_is_better ? ">=" : "<=", t->limit, t->measured);
        }
        printf("\n");
}

static void json_lat(FILE *f, const char *key, const Lat *l)
{
        fprintf(f,
                "\"%s\": {\"n\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f, \"mean_us\": %.3f, \"ops_per_s\": "
                "%.1f}",
                key, l->n, l->p50_us, l->p99_us, l->mean_us, l->ops_per_s);
}

static double json_num(double v)
{
        return isnan(v) || isinf(v) ? -1 : v;
}

/* The "ops" of a many-allocation section: each op at the small point and at the large one. */
static void json_held_rows(FILE *f, const Row *rows, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                const Row *w = &rows[i];
                fprintf(f, "    {\"op\": \"%s\", ", w->name);
                json_lat(f, "small", &w->pinned);
                fprintf(f, ", ");
                json_lat(f, "large", &w->unpinned);
                fprintf(f, ", \"ratio_p50\": %.3f, \"ratio_p99\": %.3f, \"paired_ratio_p50\": %.3f}%s\n",
                        json_num(w->ratio_p50), json_num(w->ratio_p99), json_num(w->paired_p50),
                        i + 1 < n ? "," : "");
        }
}

int write_json(const Settings *st, const Report *rep)
{
        struct utsname u;
        FILE *f = fopen(st->json_path, "we");

        if (!f)
                return -errno;
        uname(&u);
        fprintf(f, "{\n  \"machine\": {\"kernel\": \"%s %s\", \"cpus\": %ld, \"arch\": \"%s\"},\n", u.sysname,
                u.release, sysconf(_SC_NPROCESSORS_ONLN), u.machine);
        fprintf(f,
                "  \"run\": {\"long\": %s, \"pinned_cpu\": %d, \"other_cpu\": %d, \"backend\": \"model\", "
                "\"preset\": \"%s\", \"latency\": \"pinned: daemon and client on one CPU; unpinned beside "
                "it\", "
                "\"throughput\": \"unpinned\"},\n",
                st->long_run ? "true" : "false", st->cpu_a, st->cpu_b, st->preset);
        fprintf(f,
                "  \"frame_sizes\": {\"ping_request\": %zu, \"ping_reply\": %zu, \"topology_request\": %zu, "
                "\"topology_reply\": %zu, \"export_reply\": %zu},\n",
                rep->sz_ping_req, rep->sz_ping_rep, rep->sz_topo_req, rep->sz_topo_rep, rep->sz_export_rep);
        fprintf(f, "  \"latency\": [\n");
        for (size_t i = 0; i < rep->n_rows; i++) {
                const Row *w = &rep->rows[i];
                fprintf(f, "    {\"section\": \"%s\", \"op\": \"%s\", \"round_trips\": %u, \"fd\": %s, ",
                        w->section, w->name, w->rtts, w->fd ? "true" : "false");
                json_lat(f, "pinned", &w->pinned);
                fprintf(f, ", ");
                json_lat(f, "unpinned", &w->unpinned);
                if (strcmp(w->section, "gpumemd") == 0 || strcmp(w->section, "gpumemd-kfd") == 0)
                        fprintf(f,
                                ", \"floor\": \"%s\", \"ratio_p50\": %.3f, \"ratio_p99\": %.3f, "
                                "\"paired_ratio_p50\": %.3f",
                                w->floor, json_num(w->ratio_p50), json_num(w->ratio_p99),
                                json_num(w->paired_p50));
                fprintf(f, "}%s\n", i + 1 < rep->n_rows ? "," : "");
        }
        fprintf(f, "  ],\n  \"throughput\": [\n");
        for (size_t i = 0; i < rep->n_tput; i++)
                fprintf(f,
                        "    {\"clients\": %u, \"gpumemd_ops_per_s\": %.1f, \"raw_ops_per_s\": %.1f, "
                        "\"ratio\": %.3f, \"alloc_free_per_s\": %.1f}%s\n",
                        rep->tput_clients[i], rep->tput_gpumemd[i], rep->tput_raw[i],
                        rep->tput_gpumemd[i] / rep->tput_raw[i], rep->tput_alloc[i],
                        i + 1 < rep->n_tput ? "," : "");
        fprintf(f, "  ],\n  \"isolation\": {");
        json_lat(f, "idle", &rep->iso_idle);
        fprintf(f, ", ");
        json_lat(f, "loaded", &rep->iso_loaded);
        fprintf(f,
                ", \"p99_ratio\": %.3f, \"host_alloc_free_per_s\": %.2f, \"host_alloc_free_ms\": %.3f, "
                "\"prefetch_per_s\": %.2f, \"prefetch_ms\": %.3f},\n",
                json_num(rep->iso_loaded.p99_us / rep->iso_idle.p99_us), rep->iso_bg_ops_per_s[0],
                rep->iso_bg_mean_ms[0], rep->iso_bg_ops_per_s[1], rep->iso_bg_mean_ms[1]);
        fprintf(f,
                "  \"scaling\": {\"small\": %zu, \"large_wanted\": %zu, \"large\": %zu, \"daemon_nofile\": "
                "%llu, "
                "\"fill_seconds\": %.2f, \"teardown_seconds\": %.3f, \"note\": \"%s\", \"ops\": [\n",
                rep->scale_small, rep->scale_want, rep->scale_reached, rep->daemon_nofile,
                rep->scale_fill_seconds, rep->scale_teardown_seconds, rep->scale_note);
        json_held_rows(f, rep->scale_rows, rep->n_scale_rows);
        fprintf(f, "  ]},\n");
        if (rep->restart_ran) {
                fprintf(f, "  \"restart\": [\n");
                for (size_t i = 0; i < rep->n_restart_rows; i++) {
                        const RestartRow *w = &rep->restart_rows[i];
                        fprintf(f,
                                "    {\"how\": \"%s\", \"objects\": %zu, \"fds\": %d, \"min_ms\": %.3f, "
                                "\"p50_ms\": %.3f, \"max_ms\": %.3f}%s\n",
                                w->how, w->objects, w->fds, w->min_ms, w->p50_ms, w->max_ms,
                                i + 1 < rep->n_restart_rows ? "," : "");
                }
                fprintf(f, "  ],\n");
        }
        if (rep->many_ran) {
                fprintf(f,
                        "  \"many\": {\"small\": %zu, \"large_wanted\": %zu, \"large\": %zu, "
                        "\"daemon_nofile\": %llu, \"fill_us_small\": %.3f, \"fill_us_large\": %.3f, "
                        "\"fill_seconds\": %.2f, \"teardown_seconds\": %.3f, \"daemon_fds_small\": %d, "
                        "\"daemon_fds_large\": %d, \"daemon_rss_kb_small\": %ld, \"daemon_rss_kb_large\": "
                        "%ld, "
                        "\"note\": \"%s\", \"ops\": [\n",
                        rep->many_small, rep->many_want, rep->many_reached, rep->many_nofile,
                        json_num(rep->many_fill_small_us), json_num(rep->many_fill_big_us),
                        rep->many_fill_seconds, rep->many_teardown_seconds, rep->many_fds_small,
                        rep->many_fds_big, rep->many_rss_small_kb, rep->many_rss_big_kb, rep->many_note);
                json_held_rows(f, rep->many_rows, rep->n_many_rows);
                fprintf(f, "  ]},\n");
        }
        fprintf(f,
                "  \"idle_connections\": {\"n\": %zu, \"rss_before_kb\": %ld, \"rss_after_kb\": %ld, "
                "\"bytes_per_connection\": %.1f, \"kernel_slab_bytes_per_connection\": %.1f, \"note\": "
                "\"%s\"},\n",
                rep->idle_n, rep->idle_rss_before_kb, rep->idle_rss_after_kb,
                json_num(rep->idle_bytes_per_conn), json_num(rep->idle_slab_per_conn), rep->idle_note);
        fprintf(f, "  \"targets\": [\n");
        for (size_t i = 0; i < rep->n_targets; i++) {
                const Target *t = &rep->targets[i];
                fprintf(f,
                        "    {\"target\": \"%s\", \"measured\": \"%s\", \"ratio\": %.3f, \"limit\": %.2f, "
                        "\"higher_is_better\": %s, \"met\": %s}%s\n",
                        t->what, t->measured, json_num(t->ratio), t->limit,
                        t->higher_is_better ? "true" : "false", t->met ? "true" : "false",
                        i + 1 < rep->n_targets ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        return fclose(f) == 0 ? 0 : -errno;
}
