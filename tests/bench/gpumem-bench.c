/* gpumemd benchmarks: broker round trips against the raw SOCK_SEQPACKET floor, throughput, isolation, scale,
 * a million live allocations under 20,000 fds. The command line and the order of the sections; each section
 * is in bench-SECTION.c. */
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static void usage(void)
{
        printf("usage: gpumem-bench --gpumemd PATH --preset DIR [--json FILE] [--long] [--only SECTIONS]\n"
               "  --long (or GPUMEM_BENCH_LONG=1): more iterations, 1M live allocations, 10k idle "
               "connections\n"
               "  GPUMEM_BENCH_ALLOCS=N, GPUMEM_BENCH_CONNS=N override those counts\n"
               "  --only: comma-separated subset of broker (with the "
               "floors),inproc,tput,iso,scale,many,idle,restart,rocm;\n"
               "    many (1M live allocations in a daemon limited to 20,000 fds; GPUMEM_BENCH_MANY=N sets\n"
               "    the count) runs in a --long run or when named\n"
               "  rocm (when named): HIP through gpumemd beside the in-process model; GPUMEM_BENCH_HIP,\n"
               "    GPUMEM_BENCH_MODEL_PRELOAD and GPUMEM_BENCH_KFD_PRELOAD name the timing program and\n"
               "    the two KFD libraries (the meson benchmark sets them)\n"
               "  --kfd-preload PATH (default $GPUMEM_BENCH_MODEL_PRELOAD): the broker section again with\n"
               "    gpumemd --backend kfd under the model's preload (rows gpumemd-kfd, floor-kfd)\n");
}

static bool want(const char *only, const char *what)
{
        return !only || strstr(only, what) != NULL;
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                {"gpumemd", required_argument, NULL, 'd'}, {"preset", required_argument, NULL, 'p'},
                {"json", required_argument, NULL, 'j'},    {"long", no_argument, NULL, 'l'},
                {"only", required_argument, NULL, 'o'},    {"kfd-preload", required_argument, NULL, 'k'},
                {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
        };
        static Report rep;
        Settings st = {.json_path = "gpumem-bench.json"};
        const char *only = NULL, *env;
        cpu_set_t mine;
        BenchDaemon d;
        int c, r;

        st.gpumemd = getenv("GPUMEMD");
        st.kfd_preload = getenv("GPUMEM_BENCH_MODEL_PRELOAD");
        while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        st.gpumemd = optarg;
                        break;
                case 'p':
                        st.preset = optarg;
                        break;
                case 'j':
                        st.json_path = optarg;
                        break;
                case 'l':
                        st.long_run = true;
                        break;
                case 'o':
                        only = optarg;
                        break;
                case 'k':
                        st.kfd_preload = optarg;
                        break;
                case 'h':
                        usage();
                        return 0;
                default:
                        usage();
                        return 2;
                }
        }
        if (!st.gpumemd || !st.preset) {
                usage();
                return 2;
        }
        env = getenv("GPUMEM_BENCH_LONG");
        if (env && *env && strcmp(env, "0") != 0)
                st.long_run = true;
        st.floor_iters = st.long_run ? 200000 : 40000;
        st.op_iters = st.long_run ? 100000 : 10000;
        st.seq_iters = st.long_run ? 20000 : 2000;
        st.tput_seconds = st.long_run ? 5.0 : 2.0;
        st.scale_small = 1000;
        st.scale_big = st.long_run ? 1000000 : 20000;
        st.idle_conns = 10000;
        st.many_small = 1000;
        st.many_big = 1000000;
        st.many_nofile = 20000;
        st.restart_objects = 10000;
        if ((env = getenv("GPUMEM_BENCH_MANY")) && atol(env) > 1000)
                st.many_big = (size_t)atol(env);
        if ((env = getenv("GPUMEM_BENCH_ALLOCS")) && atol(env) > 1000)
                st.scale_big = (size_t)atol(env);
        if ((env = getenv("GPUMEM_BENCH_CONNS")) && atol(env) > 0)
                st.idle_conns = (size_t)atol(env);

        /* CPUs this process may use: latency runs on the first, slow neighbours on the second */
        sched_getaffinity(0, sizeof(mine), &mine);
        st.all_cpus = mine;
        st.cpu_a = st.cpu_b = -1;
        for (int i = 0; i < CPU_SETSIZE; i++)
                if (CPU_ISSET(i, &mine)) {
                        if (st.cpu_a < 0)
                                st.cpu_a = i;
                        else if (st.cpu_b < 0)
                                st.cpu_b = i;
                }
        if (st.cpu_b < 0)
                st.cpu_b = st.cpu_a;
        (void)raise_nofile(); /* 10k idle connections live in this process */
        signal(SIGPIPE, SIG_IGN);

        r = bench_daemon_start(&d, &st, NULL, 0);
        if (r < 0)
                die("cannot start %s: %s", st.gpumemd, strerror(-r));
        r = measure_frame_sizes(&rep, d.sock);
        if (r < 0)
                die("cannot measure frame sizes: %s", strerror(-r));
        if (want(only, "broker"))
                run_latency(&st, &rep, &d, "");
        if (want(only, "broker") && st.kfd_preload) {
                Settings sk = st;
                BenchDaemon dk;
                sk.kfd = true;
                r = bench_daemon_start(&dk, &sk, NULL, 0);
                if (r < 0)
                        die("cannot start %s --backend kfd under %s: %s", st.gpumemd, st.kfd_preload,
                            strerror(-r));
                run_latency(&sk, &rep, &dk, "-kfd");
                bench_daemon_kill(&dk);
        }
        if (want(only, "inproc"))
                run_inproc(&st, &rep);
        if (want(only, "tput"))
                run_throughput(&st, &rep, &d);
        if (want(only, "iso"))
                run_isolation(&st, &rep, &d);
        bench_daemon_kill(&d);
        if (want(only, "scale"))
                run_scaling(&st, &rep);
        if (only ? want(only, "many") : st.long_run)
                run_many(&st, &rep);
        if (want(only, "restart"))
                run_restart(&st, &rep);
        if (want(only, "idle"))
                run_idle(&st, &rep);
        if (only && want(only, "rocm"))
                run_rocm(&st, &rep);

        compute_ratios(&rep);
        if (!only)
                compute_targets(&rep);
        else if (want(only, "rocm"))
                compute_rocm_targets(&rep);
        print_report(&st, &rep);
        r = write_json(&st, &rep);
        if (r < 0)
                die("cannot write %s: %s", st.json_path, strerror(-r));
        printf("JSON: %s\n", st.json_path);
        return 0;
}
