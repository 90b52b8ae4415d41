/* gpumem-bench, section rocm: HIP memory calls through gpumemd (libgpumem-kfd.so) beside the same calls on
 * the in-process KFD model (the model's preload), in the same HIP program. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

/* the rows hip-timing prints */
#define ROCM_ROWS 7

/* Run the timing program with @env_extra set (NULL-terminated "K=V" list) on @cpu (-1: anywhere); parse
 * its "op" lines into rows of @section. 0, or a negative errno with a line on stderr. */
static int run_timing(const Settings *st, Report *rep, const char *prog, const char *const *env_extra,
                      const char *section, bool pinned, size_t iters)
{
        char cmd[PATH_MAX * 2], line[256];
        FILE *f;
        int n = 0, r;

        /* the environment goes through the shell: K=V pairs and the program, quoted */
        size_t len = 0;
        len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, "exec env");
        for (size_t i = 0; env_extra[i]; i++)
                len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " '%s'", env_extra[i]);
        if (pinned)
                len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " taskset -c %d", st->cpu_a);
        snprintf(cmd + len, sizeof(cmd) - len, " '%s' %zu 2>/dev/null", prog, iters);
        f = popen(cmd, "r");
        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f)) {
                char name[48];
                unsigned long long cnt, p50, p99, mean;
                if (sscanf(line, "op %47s %llu %llu %llu %llu", name, &cnt, &p50, &p99, &mean) != 5)
                        continue;
                Row *w = (Row *)find_row(rep, section, name);
                if (!w)
                        w = add_row(rep, section, name, 0, false);
                Lat *l = pinned ? &w->pinned : &w->unpinned;
                l->n = cnt;
                l->p50_us = p50 / 1e3;
                l->p99_us = p99 / 1e3;
                l->mean_us = mean / 1e3;
                l->ops_per_s = mean ? 1e9 / (double)mean : 0;
                n++;
        }
        r = pclose(f);
        if (r != 0 || n != ROCM_ROWS) {
                fprintf(stderr, "rocm: %s under %s: exit %d, %d rows\n", prog, section, r, n);
                return -EIO;
        }
        return 0;
}

void run_rocm(const Settings *st, Report *rep)
{
        const char *prog = getenv("GPUMEM_BENCH_HIP"), *model = getenv("GPUMEM_BENCH_MODEL_PRELOAD"),
                   *kfd = getenv("GPUMEM_BENCH_KFD_PRELOAD");
        char preset[PATH_MAX], tmp[PATH_MAX], e_preload[PATH_MAX + 16], e_preset[PATH_MAX + 32],
                e_sock[PATH_MAX + 16];
        /* few: until queues are served, HIP's every hipFree through gpumemd retries its blit queue */
        size_t iters = st->long_run ? 200 : 30;
        Settings gfx908 = *st;
        BenchDaemon d;
        int r;

        if (!prog || !model || !kfd || access(prog, X_OK) < 0) {
                snprintf(rep->rocm_note, sizeof(rep->rocm_note),
                         "not run: GPUMEM_BENCH_HIP, GPUMEM_BENCH_MODEL_PRELOAD and GPUMEM_BENCH_KFD_PRELOAD "
                         "name the HIP timing program and the two KFD libraries");
                return;
        }
        /* ROCm 5.2.3 knows gfx908: the preset beside the bench's */
        snprintf(tmp, sizeof(tmp), "%s", st->preset);
        snprintf(preset, sizeof(preset), "%s/gfx908", dirname(tmp));
        gfx908.preset = preset;

        snprintf(e_preload, sizeof(e_preload), "LD_PRELOAD=%s", model);
        snprintf(e_preset, sizeof(e_preset), "GPUMEM_MODEL_PRESET=%s", preset);
        const char *in_model[] = {e_preload, e_preset, NULL};
        if (run_timing(st, rep, prog, in_model, "rocm-model", true, iters) < 0)
                return;

        r = bench_daemon_start(&d, &gfx908, "[daemon]\nlog-level = warning\n", 0);
        if (r < 0) {
                snprintf(rep->rocm_note, sizeof(rep->rocm_note), "cannot start gpumemd: %s", strerror(-r));
                return;
        }
        snprintf(e_preload, sizeof(e_preload), "LD_PRELOAD=%s", kfd);
        snprintf(e_sock, sizeof(e_sock), "GPUMEM_SOCKET=%s", d.sock);
        const char *through[] = {e_preload, e_sock, NULL};
        if (run_timing(st, rep, prog, through, "rocm-gpumemd", true, iters) == 0)
                rep->rocm_ran = true;
        bench_daemon_kill(&d);
}
