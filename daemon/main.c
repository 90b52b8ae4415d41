/* gpumemd: parse options, check or load the configuration, run the manager. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "config.h"
#include "base/handover.h"
#include "base/log.h"
#include "manager.h"
#include "config/options.h"
#include "config/policy.h"

/*
 * The kernel's OOM killer picks by resident memory, and the daemon has every tenant's host memory resident
 * (it populates the pages through its own mapping): it would be the first choice, and its end would take
 * every client's memory with it. At -900 a tenant's process goes first, and its end frees its memory
 * through the daemon. Lowering needs CAP_SYS_RESOURCE, which the unit does not give: there systemd sets it
 * (OOMScoreAdjust=), and this only lowers what it finds above.
 */
#define GPUMEMD_OOM_SCORE_ADJ (-900)

static void set_oom_score(void)
{
        FILE *f = fopen("/proc/self/oom_score_adj", "r+e");
        int now = 0;

        if (!f)
                return;
        if (fscanf(f, "%d", &now) == 1 && now > GPUMEMD_OOM_SCORE_ADJ) {
                rewind(f);
                if (fprintf(f, "%d\n", GPUMEMD_OOM_SCORE_ADJ) < 0 || fflush(f) != 0)
                        log_notice("cannot lower the OOM score adjustment to %d (now %d): %m; set "
                                   "OOMScoreAdjust= in the unit",
                                   GPUMEMD_OOM_SCORE_ADJ, now);
        }
        fclose(f);
}

int main(int argc, char **argv)
{
        Options opts;
        Manager *m = NULL;
        char err[8192], path[PATH_MAX];
        int r;

        log_setup();
        options_init(&opts);
        r = options_parse_argv(&opts, argc, argv);
        if (r != 0) {
                options_done(&opts);
                return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
        }
        /* A copy: loading the file replaces the options, strings included. */
        snprintf(path, sizeof(path), "%s", opts.config_path ? opts.config_path : GPUMEMD_CONFIG_FILE);
        r = options_load_file(&opts, path, opts.config_explicit || opts.check_config, err, sizeof(err));
        if (opts.check_config) {
                /* both readers of the file, so every error of either is listed with its line */
                char perr[8192] = "";
                Policy *p = NULL;
                int rp = r == -ENOENT ? 0 : policy_load(path, true, &p, perr, sizeof(perr));
                if (r < 0)
                        fputs(err, stderr);
                if (rp < 0)
                        fputs(perr, stderr);
                if (r >= 0 && rp >= 0) {
                        printf("%s: OK (%zu class%s", path, p->n_classes, p->n_classes == 1 ? "" : "es");
                        for (size_t i = 0; i < p->n_classes; i++)
                                printf("%s%s", i ? ", " : ": ", p->classes[i].name);
                        printf(")\n");
                }
                policy_free(p);
                options_done(&opts);
                return r < 0 || rp < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }
        if (r < 0) {
                fputs(err, stderr);
                options_done(&opts);
                return EXIT_FAILURE;
        }
        log_set_level(opts.log_level);

        /* Writes to a vanished client must fail with EPIPE, never kill the daemon. */
        signal(SIGPIPE, SIG_IGN);
        set_oom_score();

        /* Every client holds a socket and a pidfd here, host and managed memory a memfd each, and the KFD
         * model one memfd per buffer that can be shared (docs/thunk-model.md): take all the fds the hard
         * limit allows (the loop is epoll, so fds above 1024 are fine). */
        {
                struct rlimit rl;
                if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                        rl.rlim_cur = rl.rlim_max;
                        (void)setrlimit(RLIMIT_NOFILE, &rl);
                }
        }

        r = manager_new(&m, &opts);
        options_done(&opts);
        if (r < 0)
                return r == -ENODEV ? GPUMEMD_EXIT_NO_DEVICE : EXIT_FAILURE;
        manager_set_argv(m, argv);
        r = manager_run(m);
        {
                HandoverFds fds;
                int how = manager_take_handover(m, &fds);
                char *exe = how == MANAGER_HANDOVER_EXEC && m->exe_path ? strdup(m->exe_path) : NULL;

                /* everything of this daemon is released first: the next one starts from the fds alone */
                manager_free(m);
                if (how == MANAGER_HANDOVER_STORE) {
                        int rs = handover_store(&fds);
                        if (rs < 0)
                                log_error_errno(rs, "cannot hand the clients to systemd's fd store: %s",
                                                strerror(-rs));
                } else if (how == MANAGER_HANDOVER_EXEC && exe) {
                        int rs = handover_exec(exe, argv, &fds);
                        /* not through the log: its journal socket may have been replaced by a moved fd */
                        fprintf(stderr, "gpumemd: cannot re-execute %s: %s\n", exe, strerror(-rs));
                        r = rs;
                }
                free(exe);
                handover_fds_done(&fds);
        }
        return r == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
