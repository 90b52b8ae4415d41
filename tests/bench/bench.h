/* gpumem-bench's shared declarations: settings, results, the daemon, client ops, and each file's entry
 * points. */
#pragma once

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "gpumem-client.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

/* ---- settings and results ------------------------------------------------------------------------------ */

typedef struct Settings {
        const char *gpumemd;
        const char *preset;
        const char *json_path;
        bool long_run;
        size_t floor_iters;  /* ping-pong iterations per floor */
        size_t op_iters;     /* iterations per single-round-trip broker op */
        size_t seq_iters;    /* iterations of multi-round-trip sequences */
        double tput_seconds; /* per throughput point */
        size_t scale_small;  /* live allocations, small point */
        size_t scale_big;    /* live allocations, large point */
        size_t idle_conns;
        size_t many_small;              /* live allocations, small point of the fd-limited run */
        size_t many_big;                /* live allocations, large point */
        unsigned long long many_nofile; /* the daemon's RLIMIT_NOFILE in that run */
        size_t restart_objects;         /* live allocations at the largest point of the restart run */
        int cpu_a, cpu_b; /* latency CPU, and the other CPU (== cpu_a on a single-CPU machine) */
        /* libgpumem-model-preload.so: the broker section again with gpumemd --backend kfd under it (the
         * kernel path, every open, ioctl and mmap reaching the model), as rows of section "gpumemd-kfd" */
        const char *kfd_preload;
        bool kfd; /* the daemon bench_daemon_start() starts runs the kfd backend under kfd_preload */
        cpu_set_t all_cpus;
} Settings;

typedef struct Lat {
        size_t n;
        double p50_us, p99_us, mean_us;
        double ops_per_s; /* one iteration per operation, back to back */
} Lat;

typedef struct Row {
        char section[24];
        char name[48];
        unsigned rtts; /* round trips per iteration */
        bool fd;       /* the reply carries an fd */
        Lat pinned, unpinned;
        char floor[32]; /* floor row the ratios use */
        double ratio_p50, ratio_p99;
        /* the median over the rounds of the op's pinned p50 against its floor's measured just before it, in
         * the same round (0: not measured so); in the rows of scaling and many, that median at the large
         * point over the one at the small point */
        double paired_p50;
} Row;

/* Hand-overs at one size of the restart run. */
typedef struct RestartRow {
        const char *how; /* "store": SIGTERM, the fd store, a new process; "exec": SIGUSR1, in place */
        size_t objects;  /* the client's live allocations */
        int fds;         /* the daemon's open fds then */
        double min_ms, p50_ms, max_ms;
} RestartRow;

typedef struct Target {
        char what[96];
        char measured[64];
        double ratio, limit;
        bool higher_is_better;
        bool met;
} Target;

typedef struct Report {
        Row rows[64];
        size_t n_rows;
        Target targets[32];
        size_t n_targets;
        /* throughput */
        unsigned tput_clients[4];
        double tput_gpumemd[4], tput_raw[4];
        size_t n_tput;
        double tput_alloc[4]; /* alloc+free (4 KiB device) of as many clients, each with its own connection */
        /* slow-op isolation */
        Lat iso_idle, iso_loaded;
        double iso_bg_ops_per_s[2], iso_bg_mean_ms[2];
        /* scaling */
        size_t scale_small, scale_big, scale_reached, scale_want;
        char scale_note[256];
        double scale_fill_seconds, scale_teardown_seconds;
        Row scale_rows[8];
        size_t n_scale_rows;
        unsigned long long daemon_nofile;
        /* many live allocations under a low fd limit */
        bool many_ran;
        size_t many_small, many_want, many_reached;
        unsigned long long many_nofile;
        double many_fill_small_us, many_fill_big_us; /* wall time per allocation while filling */
        double many_fill_seconds, many_teardown_seconds;
        int many_fds_small, many_fds_big;        /* the daemon's open fds at each point */
        long many_rss_small_kb, many_rss_big_kb; /* its RSS */
        char many_note[256];
        Row many_rows[8];
        size_t n_many_rows;
        /* restart: signal to serving again */
        bool restart_ran;
        RestartRow restart_rows[8];
        size_t n_restart_rows;
        char restart_note[160];
        /* idle connections */
        size_t idle_n, idle_want;
        long idle_rss_before_kb, idle_rss_after_kb, idle_slab_delta_kb;
        double idle_bytes_per_conn, idle_slab_per_conn;
        char idle_note[256];
        /* HIP through gpumemd beside the in-process model */
        bool rocm_ran;
        char rocm_note[256];
        /* frame sizes */
        size_t sz_ping_req, sz_ping_rep, sz_topo_req, sz_topo_rep, sz_export_rep;
} Report;

/* bench-common.c */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
uint64_t now_ns(void);
Lat lat_of(uint64_t *s, size_t n);
/* The p50 of @n samples in microseconds, sorting a copy into @tmp (room for @n): @s keeps its order. */
double block_p50(const uint64_t *s, size_t n, uint64_t *tmp);
Row *add_row(Report *r, const char *section, const char *name, unsigned rtts, bool fd);
const Row *find_row(const Report *r, const char *section, const char *name);
void add_target(Report *r, const char *what, const char *measured, double ratio, double limit,
                bool higher_is_better);
void set_affinity_tid(pid_t tid, const cpu_set_t *set);
void pin_self(int cpu);
void unpin_self(const Settings *st);
void place_process(pid_t pid, const cpu_set_t *set);
void pin_loop_apart(pid_t pid, int loop_cpu, int others_cpu);
void pin_process(pid_t pid, int cpu);

/* ---- the daemon (bench-daemon.c) ----------------------------------------------------------------------- */

/*
 * Not the integration harness's Daemon: the bench sets the daemon's fd limit and CPUs between fork and exec,
 * and stops reading its notifications once it is ready (no reader thread beside the measured one).
 */
typedef struct BenchDaemon {
        pid_t pid;
        char dir[32];
        char sock[96];
        char notify[96];
        int notify_fd;
} BenchDaemon;

unsigned long long raise_nofile(void);
int bench_daemon_start(BenchDaemon *d, const Settings *st, const char *config_text,
                       unsigned long long nofile);
void bench_daemon_kill(BenchDaemon *d);
long proc_status_kb(pid_t pid, const char *key);
long meminfo_kb(const char *key);
unsigned long long proc_nofile(pid_t pid);
int proc_fd_count(pid_t pid);

/* ---- the raw protocol, the floors and the raw server (bench-raw.c) ------------------------------------- */

int raw_hello_window(int fd, uint64_t window_size);
int measure_frame_sizes(Report *rep, const char *sock);
ssize_t recv_packet(int fd, void *buf, size_t cap, int *ret_fd);
int send_packet(int fd, const void *buf, size_t len, int pass_fd);
void floor_samples(const Settings *st, size_t req_len, size_t rep_len, bool with_fd, int cpu, size_t iters,
                   uint64_t *s);

typedef struct RawServer {
        pid_t pid;
        char path[96];
} RawServer;

void raw_server_start(RawServer *s, const char *dir, size_t rep_len, const Settings *st);
void raw_server_stop(RawServer *s);

/* ---- broker operations through libgpumem_client (bench-ops.c) ------------------------------------------ */

typedef struct Ops {
        gm_client *c;
        uint32_t gpu[2];
        void *dev; /* a device allocation for map/unmap, export and pointer queries */
        gm_handle dev_handle;
        void *managed; /* managed memory for SVM attributes */
        size_t managed_size;
        unsigned flip;
} Ops;

typedef int (*OpFn)(Ops *o);

/* The thread of @pid that serves @o's connection (the one whose CPU time grows while @o pings) on
 * @loop_cpu, every other thread (the other loops, the workers) on @others_cpu; pin_loop_apart() when no
 * thread can be told apart. Returns the serving thread's id, or 0. */
pid_t pin_serving_loop_apart(pid_t pid, Ops *o, int loop_cpu, int others_cpu);

int op_ping(Ops *o);
int op_alloc_free(Ops *o);
int op_map_unmap(Ops *o);
int op_pointer(Ops *o);
void measure_samples(OpFn fn, Ops *o, size_t iters, const char *name, uint64_t *s);
Lat measure_op(OpFn fn, Ops *o, size_t iters, const char *name);
int ops_setup(Ops *o, const char *sock, const char *name);
void ops_done(Ops *o);

/* The ops of the broker section, each against its floor. */
typedef struct BrokerOp {
        const char *name;
        OpFn fn;
        unsigned rtts;
        bool fd;
        bool small; /* a one-round-trip op the small-op targets apply to */
        const char *floor;
} BrokerOp;
#define N_BROKER_OPS 9
extern const BrokerOp broker_ops[N_BROKER_OPS];

/* ---- the sections, each in bench-SECTION.c, and the report (bench-report.c) ---------------------------- */

/* The broker's ops against their floors, as rows of sections "floor" and "gpumemd", each followed by
 * @suffix ("" or "-kfd"). */
void run_latency(const Settings *st, Report *rep, const BenchDaemon *d, const char *suffix);
void run_inproc(const Settings *st, Report *rep);
void run_throughput(const Settings *st, Report *rep, const BenchDaemon *d);
void run_isolation(const Settings *st, Report *rep, const BenchDaemon *d);
void run_scaling(const Settings *st, Report *rep);
void run_many(const Settings *st, Report *rep);
void run_idle(const Settings *st, Report *rep);
void run_restart(const Settings *st, Report *rep);
void run_rocm(const Settings *st, Report *rep);

/* bench-scale.c, for bench-many.c and bench-restart.c too */
size_t fill(gm_client *c, uint32_t gpu, size_t n, int *ret_err);

/* A daemon whose one client holds many allocations, a few ops timed at a small count and at a large one. */
#define N_HELD_OPS 4
typedef struct HeldRun {
        BenchDaemon d;
        Ops o;
        Lat small[N_HELD_OPS]; /* the ops at the small count */
        double small_vs_floor[N_HELD_OPS];
} HeldRun;
/* The daemon (RLIMIT_NOFILE @nofile; 0: as high as allowed) and its client @client; dies naming @run when
 * either cannot be had. */
void held_run_start(HeldRun *h, const Settings *st, unsigned long long nofile, const char *run,
                    const char *client);
/* fill() to @n allocations (the first fill), or die. */
size_t held_run_fill(HeldRun *h, size_t n);
/* Time the ops at the count held now: the small point. */
void held_run_small(HeldRun *h, const Settings *st, const Report *rep);
/* Time them again (the large point) and add a row of @section for each. */
void held_run_rows(HeldRun *h, const Settings *st, const Report *rep, const char *section, Row *rows,
                   size_t *n_rows);
/* The client goes: the seconds its teardown keeps the daemon busy (its books polled every @poll_us); then
 * the daemon is killed. */
double held_run_end(HeldRun *h, unsigned poll_us);

void compute_ratios(Report *rep);
void compute_targets(Report *rep);
void compute_rocm_targets(Report *rep);
void print_report(const Settings *st, const Report *rep);
int write_json(const Settings *st, const Report *rep);
