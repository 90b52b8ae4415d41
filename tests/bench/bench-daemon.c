/* gpumem-bench: the daemon it starts for its sections, and what it reads of it in /proc. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../integ/harness.h"
#include "bench.h"

static unsigned long long nofile_max(void)
{
        unsigned long long v = 0;
        FILE *f = fopen("/proc/sys/fs/nr_open", "re");

        if (f) {
                if (fscanf(f, "%llu", &v) != 1)
                        v = 0;
                fclose(f);
        }
        return v ? v : 1048576;
}

/* Raise this process's fd limit as far as allowed (inherited by what it execs). */
unsigned long long raise_nofile(void)
{
        struct rlimit rl;
        unsigned long long want = nofile_max();

        rl.rlim_cur = rl.rlim_max = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        return (unsigned long long)rl.rlim_cur;
}

/* Start gpumemd with @config_text (NULL: none) and RLIMIT_NOFILE @nofile (soft and hard; 0: as high as this
 * process may raise it). */
int bench_daemon_start(BenchDaemon *d, const Settings *st, const char *config_text, unsigned long long nofile)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        char conf[160] = "/dev/null";
        uint64_t deadline;

        memset(d, 0, sizeof(*d));
        d->notify_fd = -1;
        snprintf(d->dir, sizeof(d->dir), "/tmp/gpumem-bench-XXXXXX");
        if (!mkdtemp(d->dir))
                return -errno;
        snprintf(d->sock, sizeof(d->sock), "%s/gpumemd.sock", d->dir);
        snprintf(d->notify, sizeof(d->notify), "%s/notify", d->dir);
        if (config_text) {
                FILE *f;
                snprintf(conf, sizeof(conf), "%s/gpumemd.conf", d->dir);
                f = fopen(conf, "we");
                if (!f)
                        return -errno;
                fputs(config_text, f);
                fclose(f);
        }
        d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (d->notify_fd < 0)
                return -errno;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->notify);
        if (bind(d->notify_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                return -errno;

        d->pid = fork();
        if (d->pid < 0)
                return -errno;
        if (d->pid == 0) {
                if (nofile) {
                        /* the hard limit too: gpumemd raises its soft limit to the hard one */
                        struct rlimit rl = {.rlim_cur = nofile, .rlim_max = nofile};
                        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                                _exit(126);
                } else {
                        (void)raise_nofile();
                }
                set_affinity_tid(0, &st->all_cpus);
                setenv("NOTIFY_SOCKET", d->notify, 1);
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_PID");
                if (st->kfd) {
                        /* the kernel path, served by the model at the libc level */
                        setenv("LD_PRELOAD", st->kfd_preload, 1);
                        setenv("GPUMEM_MODEL_PRESET", st->preset, 1);
                        execl(st->gpumemd, st->gpumemd, "--socket", d->sock, "--config", conf, "--log-level",
                              "warning", "--backend", "kfd", (char *)NULL);
                        _exit(127);
                }
                execl(st->gpumemd, st->gpumemd, "--socket", d->sock, "--config", conf, "--log-level",
                      "warning", "--backend", "model", "--model-preset", st->preset, (char *)NULL);
                _exit(127);
        }
        deadline = now_ns() + 20ull * 1000000000ull;
        for (;;) {
                struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
                char buf[1024];
                ssize_t n;

                if (poll(&p, 1, 50) > 0) {
                        n = recv(d->notify_fd, buf, sizeof(buf) - 1, 0);
                        if (n > 0) {
                                buf[n] = '\0';
                                if (strstr(buf, "READY=1")) {
                                        /* Nobody reads it from now on: gone, it cannot fill up and block
                                         * the daemon's later STATUS= messages. */
                                        close(d->notify_fd);
                                        d->notify_fd = -1;
                                        unlink(d->notify);
                                        return 0;
                                }
                        }
                }
                if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
                        d->pid = 0;
                        return -ECHILD;
                }
                if (now_ns() > deadline)
                        return -ETIMEDOUT;
        }
}

void bench_daemon_kill(BenchDaemon *d)
{
        char cmd[128];

        kill_and_reap(&d->pid);
        if (d->notify_fd >= 0)
                close(d->notify_fd);
        d->notify_fd = -1;
        if (d->dir[0]) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
                (void)!system(cmd);
                d->dir[0] = '\0';
        }
}

/* The number after "@key:" in @path (a "Key: value kB" file of /proc), -1 if there is none. */
static long kb_field(const char *path, const char *key)
{
        char line[256];
        size_t kl = strlen(key);
        long v = -1;
        FILE *f = fopen(path, "re");

        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
                        v = strtol(line + kl + 1, NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

long proc_status_kb(pid_t pid, const char *key)
{
        char path[64];

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        return kb_field(path, key);
}

long meminfo_kb(const char *key)
{
        return kb_field("/proc/meminfo", key);
}

unsigned long long proc_nofile(pid_t pid)
{
        char path[64], line[256];
        unsigned long long v = 0;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, "Max open files", 14) == 0) {
                        v = strtoull(line + 14, NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

/* Open fds of @pid, -1 if they cannot be read. */
int proc_fd_count(pid_t pid)
{
        char path[64];
        struct dirent *e;
        DIR *dir;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
        dir = opendir(path);
        if (!dir)
                return -1;
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(dir);
        return n;
}
