/* Integration harness: spawn gpumemd on the model, collect sd_notify messages, talk raw protocol. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "frame.h"
#include "gpumem.pb-c.h"
#include "wire.h"

static int64_t mono_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Under notify_lock. */
static void store_remove_locked(Daemon *d, const char *name)
{
        for (size_t i = 0; i < d->n_store;)
                if (strcmp(d->store[i].name, name) == 0) {
                        close(d->store[i].fd);
                        d->store[i] = d->store[--d->n_store];
                } else {
                        i++;
                }
}

/* systemd's poll of its store: an fd polled that hung up or failed is dropped. Under notify_lock. */
static void store_poll_locked(Daemon *d)
{
        for (size_t i = 0; i < d->n_store;) {
                struct pollfd p = {.fd = d->store[i].fd};
                if (d->store[i].poll && poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR))) {
                        fprintf(stderr, "fd store: '%s' hung up, dropped (as systemd does)\n",
                                d->store[i].name);
                        close(d->store[i].fd);
                        d->store[i] = d->store[--d->n_store];
                } else {
                        i++;
                }
        }
}

static void store_add_locked(Daemon *d, const char *name, int fd, bool poll_it)
{
        if (d->n_store >= HARNESS_FD_STORE_MAX) {
                fprintf(stderr, "fd store: full, '%s' refused (as systemd does)\n", name);
                close(fd);
                return;
        }
        if (d->n_store == d->cap_store) {
                size_t cap = d->cap_store ? d->cap_store * 2 : 64;
                StoredFd *v = realloc(d->store, cap * sizeof(*v));
                if (!v) {
                        close(fd);
                        return;
                }
                d->store = v;
                d->cap_store = cap;
        }
        snprintf(d->store[d->n_store].name, sizeof(d->store[0].name), "%s", name);
        d->store[d->n_store].poll = poll_it;
        d->store[d->n_store++].fd = fd;
        store_poll_locked(d);
}

/* The value of @key= in a notification (newline-separated assignments), into @out; false when absent. */
static bool notify_field(const char *msg, const char *key, char *out, size_t len)
{
        size_t k = strlen(key);

        for (const char *p = msg; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                if (strncmp(p, key, k) == 0 && p[k] == '=') {
                        size_t n = strcspn(p + k + 1, "\n");
                        if (n >= len)
                                n = len - 1;
                        memcpy(out, p + k + 1, n);
                        out[n] = '\0';
                        return true;
                }
        }
        return false;
}

/* What systemd does with a notification's fds: kept under FDNAME= with FDSTORE=1, closed otherwise. */
static void notify_fds(Daemon *d, const char *msg, const int *fds, size_t n_fds)
{
        char v[256], name[256] = "stored";
        bool store = notify_field(msg, "FDSTORE", v, sizeof(v)) && strcmp(v, "1") == 0;
        bool poll_it = !(notify_field(msg, "FDPOLL", v, sizeof(v)) && strcmp(v, "0") == 0);

        (void)notify_field(msg, "FDNAME", name, sizeof(name));
        pthread_mutex_lock(&d->notify_lock);
        if (notify_field(msg, "FDSTOREREMOVE", v, sizeof(v)) && strcmp(v, "1") == 0)
                store_remove_locked(d, name);
        for (size_t i = 0; i < n_fds; i++) {
                if (store)
                        store_add_locked(d, name, fds[i], poll_it);
                else
                        close(fds[i]);
        }
        pthread_mutex_unlock(&d->notify_lock);
}

static void *notify_reader(void *userdata)
{
        Daemon *d = userdata;

        while (!d->notify_stop) {
                struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
                char buf[1024];
                union {
                        struct cmsghdr h;
                        char b[CMSG_SPACE(64 * sizeof(int))];
                } ctl;
                struct iovec iov = {buf, sizeof(buf) - 1};
                struct msghdr mh = {
                        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof(ctl)};
                int fds[64];
                size_t n_fds = 0;
                ssize_t n;

                if (poll(&p, 1, 50) <= 0) {
                        pthread_mutex_lock(&d->notify_lock);
                        store_poll_locked(d);
                        pthread_mutex_unlock(&d->notify_lock);
                        continue;
                }
                d->notify_busy = true; /* before the datagram leaves the socket (daemon_term) */
                n = recvmsg(d->notify_fd, &mh, MSG_CMSG_CLOEXEC);
                if (n <= 0) {
                        d->notify_busy = false;
                        continue;
                }
                buf[n] = '\0';
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
                        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                                for (size_t i = 0;
                                     i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && n_fds < 64; i++)
                                        memcpy(&fds[n_fds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                notify_fds(d, buf, fds, n_fds);
                pthread_mutex_lock(&d->notify_lock);
                size_t used = strlen(d->notify_log);
                if (used + (size_t)n + 2 >= sizeof(d->notify_log)) {
                        /* keep the first line (READY) and the newest messages */
                        char *second = strchr(d->notify_log, '\n');
                        used = second ? (size_t)(second - d->notify_log) + 1 : 0;
                        d->notify_log[used] = '\0';
                }
                if (used + (size_t)n + 2 < sizeof(d->notify_log)) {
                        memcpy(d->notify_log + used, buf, (size_t)n);
                        d->notify_log[used + (size_t)n] = '\n';
                        d->notify_log[used + (size_t)n + 1] = '\0';
                }
                pthread_mutex_unlock(&d->notify_lock);
                d->notify_busy = false;
        }
        return NULL;
}

/* Every notification the daemon sent has been handled: none waits in the socket, none is in hand. */
static void notify_drain(Daemon *d)
{
        for (int i = 0; i < 500; i++) {
                int queued = 0;
                /* in this order: a datagram taken off the socket was marked in hand before */
                if (ioctl(d->notify_fd, FIONREAD, &queued) == 0 && queued == 0 && !d->notify_busy)
                        return;
                usleep(2000);
        }
}

size_t daemon_store_count(Daemon *d)
{
        size_t n;

        pthread_mutex_lock(&d->notify_lock);
        store_poll_locked(d);
        n = d->n_store;
        pthread_mutex_unlock(&d->notify_lock);
        return n;
}

int daemon_store_fd(Daemon *d, const char *name)
{
        int fd = -ENOENT;

        pthread_mutex_lock(&d->notify_lock);
        store_poll_locked(d);
        for (size_t i = 0; i < d->n_store; i++)
                if (strcmp(d->store[i].name, name) == 0)
                        fd = d->store[i].fd;
        pthread_mutex_unlock(&d->notify_lock);
        return fd;
}

void daemon_store_put(Daemon *d, const char *name, int fd)
{
        pthread_mutex_lock(&d->notify_lock);
        store_remove_locked(d, name);
        store_add_locked(d, name, fd, true);
        pthread_mutex_unlock(&d->notify_lock);
}

void daemon_store_clear(Daemon *d)
{
        pthread_mutex_lock(&d->notify_lock);
        for (size_t i = 0; i < d->n_store; i++)
                close(d->store[i].fd);
        d->n_store = 0;
        pthread_mutex_unlock(&d->notify_lock);
}

void daemon_notify_clear(Daemon *d)
{
        pthread_mutex_lock(&d->notify_lock);
        d->notify_log[0] = '\0';
        pthread_mutex_unlock(&d->notify_lock);
}

int daemon_write_config(Daemon *d, const char *config_text)
{
        char tmp[160];
        FILE *f;

        snprintf(tmp, sizeof(tmp), "%s.new", d->conf);
        f = fopen(tmp, "we");
        if (!f)
                return -errno;
        fputs(config_text ? config_text : "", f);
        if (fclose(f) != 0)
                return -errno;
        return rename(tmp, d->conf) < 0 ? -errno : 0;
}

int daemon_connect_carried(Daemon *d, const char *name, gm_client **ret)
{
        gm_client_options o = {.struct_size = sizeof(o),
                               .socket_path = d->sock,
                               .name = name,
                               .window_size = 4ull << 30,
                               .low_window = true};
        char err[256];

        if (!daemon_under_tsan())
                return gm_client_connect(d->sock, name, ret);
        return gm_client_open_with(&o, ret, err, sizeof(err));
}

const char *daemon_kfd_preload(void)
{
        const char *b = getenv("GPUMEM_TEST_BACKEND"), *p = getenv("GPUMEM_TEST_KFD_PRELOAD");

        return b && strcmp(b, "kfd") == 0 && p && *p ? p : NULL;
}

bool daemon_wrapped(void)
{
        const char *w = getenv("GPUMEMD_WRAPPER");
        return w && *w;
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HARNESS_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define HARNESS_TSAN 1
#endif

bool daemon_under_tsan(void)
{
#ifdef HARNESS_TSAN
        return true;
#else
        return false;
#endif
}

void kill_and_reap(pid_t *pid)
{
        if (*pid <= 0)
                return;
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
}

static int spawn(Daemon *d, const char *preset, const char *const *extra_args, bool pass_store)
{
        char *names = NULL;
        int *pass = NULL;
        size_t n_pass = 0;
        const char *bin = getenv("GPUMEMD");
        const char *wrapper = getenv("GPUMEMD_WRAPPER");
        const char *kfd_preload = daemon_kfd_preload();
        const char *kfd_minor = NULL;
        char wrap[1024];
        const char *argv[64];
        size_t n = 0;
        int r;

        if (!bin)
                return -ENOENT;
        if (wrapper && *wrapper) {
                snprintf(wrap, sizeof(wrap), "%s", wrapper);
                for (char *save = NULL, *t = strtok_r(wrap, " ", &save); t && n < 24;
                     t = strtok_r(NULL, " ", &save))
                        argv[n++] = t;
        }
        argv[n++] = bin;
        argv[n++] = "--socket";
        argv[n++] = d->sock;
        argv[n++] = "--config";
        argv[n++] = d->conf;
        argv[n++] = "--backend";
        if (kfd_preload) {
                /* the kernel path: every open, ioctl and mmap of /dev/kfd, the render nodes and the KFD's
                 * sysfs reaches the model through the preload, which takes the preset and the ABI from its
                 * environment */
                argv[n++] = "kfd";
        } else {
                argv[n++] = "model";
                argv[n++] = "--model-preset";
                argv[n++] = preset ? preset : "mi300x";
        }
        for (size_t i = 0; extra_args && extra_args[i] && n < 62; i++) {
                if (kfd_preload && strcmp(extra_args[i], "--model-kfd-minor") == 0 && extra_args[i + 1]) {
                        kfd_minor = extra_args[++i];
                        continue;
                }
                argv[n++] = extra_args[i];
        }
        argv[n] = NULL;

        pthread_mutex_lock(&d->notify_lock);
        d->notify_log[0] = '\0';
        store_poll_locked(d);
        if (pass_store && d->n_store) {
                /* the names joined by ':' as LISTEN_FDNAMES has them, made before the fork */
                size_t len = 1;
                for (size_t i = 0; i < d->n_store; i++)
                        len += strlen(d->store[i].name) + 1;
                names = calloc(1, len);
                pass = calloc(d->n_store, sizeof(int));
                for (size_t i = 0; names && pass && i < d->n_store; i++) {
                        if (i)
                                strcat(names, ":");
                        strcat(names, d->store[i].name);
                        pass[n_pass++] = d->store[i].fd;
                }
        }
        pthread_mutex_unlock(&d->notify_lock);
        d->pid = fork();
        if (d->pid < 0) {
                free(names);
                free(pass);
                return -errno;
        }
        if (d->pid == 0) {
                char num[32];
                setenv("NOTIFY_SOCKET", d->notify_path, 1);
                if (kfd_preload) {
                        setenv("LD_PRELOAD", kfd_preload, 1);
                        setenv("GPUMEM_MODEL_PRESET", preset ? preset : "mi300x", 1);
                        /* the test's own ABI, else the run's (GPUMEM_TEST_KFD_MINOR), else the model's */
                        if (!kfd_minor)
                                kfd_minor = getenv("GPUMEM_TEST_KFD_MINOR");
                        if (kfd_minor && *kfd_minor)
                                setenv("GPUMEM_MODEL_KFD_MINOR", kfd_minor, 1);
                        else
                                unsetenv("GPUMEM_MODEL_KFD_MINOR");
                }
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_PID");
                unsetenv("LISTEN_FDNAMES");
                if (n_pass) {
                        /* out of the way of 3..3+n first, then into place (dup2 clears close-on-exec) */
                        for (size_t i = 0; i < n_pass; i++)
                                pass[i] = fcntl(pass[i], F_DUPFD_CLOEXEC, (int)(3 + n_pass));
                        for (size_t i = 0; i < n_pass; i++)
                                if (pass[i] < 0 || dup2(pass[i], 3 + (int)i) < 0)
                                        _exit(126);
                        snprintf(num, sizeof(num), "%d", (int)getpid());
                        setenv("LISTEN_PID", num, 1);
                        snprintf(num, sizeof(num), "%zu", n_pass);
                        setenv("LISTEN_FDS", num, 1);
                        setenv("LISTEN_FDNAMES", names, 1);
                }
                execvp(argv[0], (char *const *)argv);
                _exit(127);
        }
        free(names);
        free(pass);
        r = daemon_wait_notify(d, "READY=1", daemon_wrapped() ? 120000 : 10000);
        if (r < 0) /* pid 0: the wait saw it exit already; kill(0) would hit our own group */
                kill_and_reap(&d->pid);
        return r;
}

int daemon_restart(Daemon *d, const char *preset, const char *const *extra_args)
{
        if (d->pid > 0)
                return -EBUSY;
        daemon_store_clear(d); /* a stop and a start: systemd empties the store when the service stops */
        return spawn(d, preset, extra_args, false);
}

int daemon_restart_handover(Daemon *d, const char *preset, const char *const *extra_args)
{
        if (d->pid > 0)
                return -EBUSY;
        return spawn(d, preset, extra_args, true);
}

int daemon_kill(Daemon *d)
{
        if (d->pid <= 0)
                return -ECHILD;
        kill_and_reap(&d->pid);
        return 0;
}

long daemon_rss_kb(const Daemon *d)
{
        char path[64], line[256];
        long kb = -ENOENT;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
        f = fopen(path, "re");
        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
                        break;
        fclose(f);
        return kb;
}

int daemon_start(Daemon *d, const char *preset, const char *config_text, const char *const *extra_args)
{
        const char *bin = getenv("GPUMEMD");
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int r;

        memset(d, 0, sizeof(*d));
        d->notify_fd = -1;
        if (!bin)
                return -ENOENT;
        snprintf(d->dir, sizeof(d->dir), "/tmp/gpumemd-test-XXXXXX");
        if (!mkdtemp(d->dir))
                return -errno;
        snprintf(d->sock, sizeof(d->sock), "%s/gpumemd.sock", d->dir);
        snprintf(d->conf, sizeof(d->conf), "%s/gpumemd.conf", d->dir);
        snprintf(d->notify_path, sizeof(d->notify_path), "%s/notify", d->dir);
        r = daemon_write_config(d, config_text);
        if (r < 0)
                return r;

        d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (d->notify_fd < 0)
                return -errno;
        strcpy(sa.sun_path, d->notify_path);
        if (bind(d->notify_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                return -errno;
        pthread_mutex_init(&d->notify_lock, NULL);
        if (pthread_create(&d->notify_thread, NULL, notify_reader, d) != 0)
                return -EAGAIN;
        d->notify_thread_running = true;
        return spawn(d, preset, extra_args, false);
}

int daemon_setup(Daemon *d, const char *preset, const char *config_text, const char *const *extra_args,
                 uint32_t *ret_gpus, size_t cap)
{
        int r = daemon_start(d, preset, config_text, extra_args);

        if (r < 0) {
                fprintf(stderr, "cannot start gpumemd: %s\n", strerror(-r));
                daemon_cleanup(d);
                return r;
        }
        if (!ret_gpus)
                return 0;
        r = daemon_gpus(d, ret_gpus, cap);
        if (r <= 0) {
                r = r < 0 ? r : -ENODEV;
                fprintf(stderr, "cannot list gpumemd's GPUs: %s\n", strerror(-r));
                daemon_cleanup(d);
        }
        return r;
}

int daemon_finish(Daemon *d, int r)
{
        if (daemon_stop(d) != 0)
                r = EXIT_FAILURE;
        daemon_cleanup(d);
        return r;
}

bool daemon_accepts_config(const char *config_text, bool show)
{
        char path[] = "/tmp/gpumemd-config-XXXXXX", cmd[1024];
        const char *bin = getenv("GPUMEMD");
        size_t len = strlen(config_text);
        int fd;
        bool ok;

        if (!bin)
                return false;
        fd = mkstemp(path);
        if (fd < 0)
                return false;
        ok = write(fd, config_text, len) == (ssize_t)len;
        close(fd);
        snprintf(cmd, sizeof(cmd), "'%s' --check-config --config '%s' %s", bin, path,
                 show ? ">&2" : ">/dev/null 2>&1");
        ok = ok && system(cmd) == 0;
        unlink(path);
        return ok;
}

int daemon_wait_notify(Daemon *d, const char *what, int timeout_ms)
{
        int64_t deadline = mono_ms() + timeout_ms;

        for (;;) {
                pthread_mutex_lock(&d->notify_lock);
                bool seen = strstr(d->notify_log, what) != NULL;
                pthread_mutex_unlock(&d->notify_lock);
                if (seen)
                        return 0;
                if (mono_ms() >= deadline)
                        return -ETIMEDOUT;
                if (d->pid > 0 && waitpid(d->pid, NULL, WNOHANG) == d->pid) {
                        d->pid = 0;
                        return -ECHILD;
                }
                usleep(10000);
        }
}

int daemon_term(Daemon *d)
{
        int status;

        if (d->pid <= 0)
                return -ECHILD;
        kill(d->pid, SIGTERM);
        if (waitpid(d->pid, &status, 0) < 0)
                return -errno;
        d->pid = 0;
        notify_drain(d); /* what it put in the store is there */
        if (WIFEXITED(status))
                return WEXITSTATUS(status);
        return -1000 - WTERMSIG(status);
}

int daemon_stop(Daemon *d)
{
        int r = daemon_term(d);

        /* stopped for good: systemd closes what the service left in its fd store */
        daemon_store_clear(d);
        return r;
}

void daemon_cleanup(Daemon *d)
{
        char cmd[128];

        kill_and_reap(&d->pid);
        if (d->notify_thread_running) {
                d->notify_stop = true;
                pthread_join(d->notify_thread, NULL);
                d->notify_thread_running = false;
        }
        if (d->notify_fd >= 0)
                close(d->notify_fd);
        d->notify_fd = -1;
        if (d->store) {
                daemon_store_clear(d);
                free(d->store);
                d->store = NULL;
                d->cap_store = 0;
        }
        if (d->dir[0]) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
                (void)!system(cmd);
        }
}

int daemon_fd_count(const Daemon *d)
{
        return count_fds(d->pid);
}

int daemon_quiet_fd_count(const Daemon *d)
{
        int min = daemon_own_fds(d);

        /* fds the daemon opens for a moment (a notification socket, say) must not count */
        for (int i = 0; i < 10; i++) {
                usleep(20000);
                int n = daemon_own_fds(d);
                if (n < min)
                        min = n;
        }
        return min;
}

int raw_connect(const char *sock)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        if (fd < 0)
                return -errno;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

int raw_send(int fd, const void *buf, size_t len, const int *fds, size_t n_fds)
{
        return gm_wire_send(fd, buf, len, NULL, 0, fds, n_fds, 0);
}

int raw_send_frame(int fd, uint32_t request_id, const void *body, size_t body_len, uint16_t version,
                   uint16_t hdr_n_fds, const int *fds, size_t n_fds)
{
        uint8_t hdr[GM_FRAME_HDR_SIZE];
        /* encode by hand: the header may deliberately disagree with what is sent */
        hdr[0] = 0x47, hdr[1] = 0x4d, hdr[2] = 0x45, hdr[3] = 0x4d;
        hdr[4] = (uint8_t)version, hdr[5] = (uint8_t)(version >> 8);
        hdr[6] = (uint8_t)hdr_n_fds, hdr[7] = (uint8_t)(hdr_n_fds >> 8);
        for (int i = 0; i < 4; i++) {
                hdr[8 + i] = (uint8_t)(body_len >> (8 * i));
                hdr[12 + i] = (uint8_t)(request_id >> (8 * i));
        }
        return gm_wire_send(fd, hdr, sizeof(hdr), body, body_len, fds, n_fds, 0);
}

int raw_hello(int fd)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Hello h = GPUMEM__HELLO__INIT;
        uint8_t body[256];
        size_t len;
        uint32_t id;
        int code, r;

        h.has_protocol_version = true;
        h.protocol_version = 1;
        h.client_name = "raw";
        req.op_case = GPUMEM__REQUEST__OP_HELLO;
        req.hello = &h;
        len = gpumem__request__pack(&req, body);
        r = raw_send_frame(fd, 1, body, len, 1, 0, NULL, 0);
        if (r < 0)
                return r;
        r = raw_recv_reply(fd, &id, &code, NULL, 0, 5000);
        if (r < 0)
                return r;
        return id == 1 ? code : -EPROTO;
}

int raw_recv_reply(int fd, uint32_t *ret_id, int *ret_code, char *reason, size_t reason_len, int timeout_ms)
{
        static uint8_t buf[GM_FRAME_MAX];
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        Gpumem__Reply *reply;
        uint32_t id;
        ssize_t n;
        int r;

        /* a daemon under valgrind answers tens of times slower */
        if (poll(&p, 1, daemon_wrapped() ? 12 * timeout_ms : timeout_ms) <= 0)
                return -ETIMEDOUT;
        n = gm_wire_recv(fd, buf, sizeof(buf), fds, &n_fds, 0);
        if (n == 0)
                return -ECONNRESET;
        if (n < 0)
                return (int)n;
        gm_wire_close_fds(fds, n_fds);
        r = raw_reply_parse(buf, (size_t)n, n_fds, &id, (void **)&reply);
        if (r < 0)
                return r;
        *ret_id = id;
        *ret_code = reply->status->code;
        if (reason && reason_len)
                snprintf(reason, reason_len, "%s", reply->status->reason ? reply->status->reason : "");
        gpumem__reply__free_unpacked(reply, NULL);
        return 0;
}

bool raw_closed(int fd, int timeout_ms)
{
        char buf[GM_FRAME_MAX];
        struct pollfd p = {.fd = fd, .events = POLLIN};

        while (poll(&p, 1, timeout_ms) > 0) {
                ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
                if (n == 0)
                        return true;
                if (n < 0)
                        return errno == ECONNRESET;
        }
        return false;
}

int raw_request(int fd, uint32_t request_id, const void *req, const int *fds, size_t n_fds, void **ret_reply,
                int *ret_fds, size_t *ret_n_fds, bool *ret_transport)
{
        static uint8_t buf[GM_FRAME_MAX];
        int in_fds[GM_FRAME_MAX_FDS];
        size_t n_in = 0, len;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        Gpumem__Reply *reply;
        uint32_t id = 0;
        ssize_t n;
        int r, code;

        if (ret_transport)
                *ret_transport = true;
        if (ret_n_fds)
                *ret_n_fds = 0;
        len = gpumem__request__get_packed_size(req);
        if (len > GM_FRAME_BODY_MAX)
                return -EMSGSIZE;
        gpumem__request__pack(req, buf + GM_FRAME_HDR_SIZE);
        gm_frame_hdr_encode(buf, 1, request_id, (uint32_t)len, (unsigned)n_fds);
        r = gm_wire_send(fd, buf, GM_FRAME_HDR_SIZE + len, NULL, 0, fds, n_fds, 0);
        if (r < 0)
                return r;
        for (;;) {
                if (poll(&p, 1, daemon_wrapped() ? 60000 : 10000) <= 0)
                        return -ETIMEDOUT;
                n = gm_wire_recv(fd, buf, sizeof(buf), in_fds, &n_in, 0);
                if (n == 0 || n == -ECONNRESET)
                        return -ECONNRESET;
                if (n < 0)
                        return (int)n;
                r = raw_reply_parse(buf, (size_t)n, n_in, &id, (void **)&reply);
                if (r == -EPROTO || id == request_id || id == 0)
                        break;
                raw_reply_free(reply); /* a reply to an earlier request nobody waited for */
                gm_wire_close_fds(in_fds, n_in);
        }
        if (r < 0) {
                gm_wire_close_fds(in_fds, n_in);
                return r;
        }
        code = reply->status->code;
        if (ret_fds) {
                memcpy(ret_fds, in_fds, n_in * sizeof(int));
                *ret_n_fds = n_in;
        } else {
                gm_wire_close_fds(in_fds, n_in);
        }
        if (ret_reply)
                *ret_reply = reply;
        else
                gpumem__reply__free_unpacked(reply, NULL);
        if (ret_transport)
                *ret_transport = false;
        return code;
}

void raw_reply_free(void *reply)
{
        if (reply)
                gpumem__reply__free_unpacked(reply, NULL);
}

int raw_hello_named(int fd, uint32_t request_id, const char *name, void **ret_reply)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Hello h = GPUMEM__HELLO__INIT;

        h.has_protocol_version = true;
        h.protocol_version = 1;
        h.client_name = (char *)name;
        req.op_case = GPUMEM__REQUEST__OP_HELLO;
        req.hello = &h;
        return raw_request(fd, request_id, &req, NULL, 0, ret_reply, NULL, NULL, NULL);
}

int raw_reply_parse(const void *pkt, size_t n, size_t n_fds, uint32_t *ret_id, void **ret_reply)
{
        Gpumem__Reply *reply;
        GmFrameHdr h;

        *ret_reply = NULL;
        if (gm_frame_parse(pkt, n, n_fds, GM_PROTOCOL_VERSION, &h, NULL) < 0)
                return -EPROTO;
        if (ret_id)
                *ret_id = h.request_id;
        reply = gpumem__reply__unpack(NULL, h.body_len, (const uint8_t *)pkt + GM_FRAME_HDR_SIZE);
        if (!reply || !reply->status) {
                raw_reply_free(reply);
                return -EBADMSG;
        }
        *ret_reply = reply;
        return 0;
}

/*
 * The daemon's fds, without those of a wrapper: valgrind keeps its own fds just under the process's soft
 * RLIMIT_NOFILE and opens some of them lazily, so under a wrapper the top 64 numbers are not counted.
 */
int daemon_own_fds(const Daemon *d)
{
        char path[64], line[256];
        long soft = -1;
        DIR *dir;
        struct dirent *e;
        FILE *f;
        int n = 0;

        if (!daemon_wrapped())
                return daemon_fd_count(d);
        snprintf(path, sizeof(path), "/proc/%d/limits", (int)d->pid);
        f = fopen(path, "re");
        if (f) {
                while (fgets(line, sizeof(line), f))
                        if (sscanf(line, "Max open files %ld", &soft) == 1)
                                break;
                fclose(f);
        }
        snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
        dir = opendir(path);
        if (!dir)
                return -errno;
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.' && (soft < 0 || atol(e->d_name) < soft - 64))
                        n++;
        closedir(dir);
        return n;
}

/* The request of op @op with @msg, on a connection of the harness's own after hello: its reply carrying
 * @want (raw_reply_free), or a negative errno. */
static int own_request(Daemon *d, Gpumem__Request__OpCase op, ProtobufCMessage *msg,
                       Gpumem__Reply__ResultCase want, Gpumem__Reply **ret)
{
        const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(&gpumem__request__descriptor, (unsigned)op);
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Reply *reply = NULL;
        bool transport;
        int fd, r;

        if (!f)
                return -EINVAL;
        req.op_case = op;
        *(ProtobufCMessage **)((uint8_t *)&req + f->offset) = msg; /* the op's member of the oneof */
        fd = raw_connect(d->sock);
        if (fd < 0)
                return fd;
        r = raw_hello(fd);
        if (r != 0) {
                close(fd);
                return r < 0 ? r : -EPROTO;
        }
        r = raw_request(fd, 2, &req, NULL, 0, (void **)&reply, NULL, NULL, &transport);
        close(fd);
        if (r != 0 || !reply || reply->result_case != want) {
                raw_reply_free(reply);
                return r < 0 ? r : -EBADMSG;
        }
        *ret = reply;
        return 0;
}

int daemon_gpus(Daemon *d, uint32_t *ret_ids, size_t cap)
{
        Gpumem__TopologyGet tg = GPUMEM__TOPOLOGY_GET__INIT;
        Gpumem__Reply *reply = NULL;
        size_t n = 0;
        int r = own_request(d, GPUMEM__REQUEST__OP_TOPOLOGY, &tg.base, GPUMEM__REPLY__RESULT_TOPOLOGY,
                            &reply);

        if (r < 0)
                return r;
        for (size_t i = 0; i < reply->topology->n_nodes && n < cap; i++)
                if (reply->topology->nodes[i]->is_gpu)
                        ret_ids[n++] = reply->topology->nodes[i]->gpu_id;
        raw_reply_free(reply);
        return (int)n;
}

int daemon_state(Daemon *d, DaemonState *ret)
{
        Gpumem__AdminStatus as = GPUMEM__ADMIN_STATUS__INIT;
        Gpumem__Reply *reply = NULL;
        Gpumem__AdminStatusReply *s;
        DaemonState st = {0};
        int r = own_request(d, GPUMEM__REQUEST__OP_ADMIN_STATUS, &as.base, GPUMEM__REPLY__RESULT_ADMIN_STATUS,
                            &reply);

        if (r < 0)
                return r;
        s = reply->admin_status;
        st.clients = s->clients;
        st.va_windows = s->va_windows;
        st.allocations = s->allocations;
        st.bytes_device = s->bytes_device;
        st.bytes_host = s->bytes_host;
        st.bytes_managed = s->bytes_managed;
        st.requests = s->requests;
        st.protocol_errors = s->protocol_errors;
        if (s->model) {
                st.has_model = true;
                st.model_contexts = s->model->contexts;
                st.model_buffers = s->model->buffers;
                st.model_handles = s->model->handles;
                st.model_imports = s->model->imports;
                st.model_mappings = s->model->mappings;
                st.model_gem_handles = s->model->gem_handles;
                st.model_svm_ranges = s->model->svm_ranges;
                st.model_system_bytes = s->model->system_bytes;
                st.model_vram_bytes = s->model->vram_bytes;
                st.model_queues = s->model->queues;
        }
        raw_reply_free(reply);
        st.fds = daemon_own_fds(d);
        *ret = st;
        return 0;
}

int daemon_base_state(Daemon *d, DaemonState *ret)
{
        int64_t deadline = mono_ms() + (daemon_wrapped() ? 100000 : 10000);
        int r;

        /* connections closed just before are freed by their loops a moment later: wait until the status
         * connection is the only client, then take the fds once the daemon has been quiet a while */
        for (;;) {
                r = daemon_state(d, ret);
                if (r < 0)
                        return r;
                if (ret->clients <= 1)
                        break;
                if (mono_ms() >= deadline)
                        return -ETIMEDOUT;
                usleep(10000);
        }
        ret->fds = daemon_quiet_fd_count(d);
        return ret->fds < 0 ? ret->fds : 0;
}

bool daemon_state_same_but(const DaemonState *a, const DaemonState *b, unsigned ignore)
{
        return a->allocations == b->allocations && a->bytes_device == b->bytes_device &&
               a->bytes_host == b->bytes_host && a->bytes_managed == b->bytes_managed &&
               a->model_buffers == b->model_buffers && a->model_handles == b->model_handles &&
               a->model_mappings == b->model_mappings && a->model_gem_handles == b->model_gem_handles &&
               a->model_svm_ranges == b->model_svm_ranges && a->model_system_bytes == b->model_system_bytes &&
               a->model_vram_bytes == b->model_vram_bytes &&
               ((ignore & DAEMON_STATE_CONTEXTS) || a->model_contexts == b->model_contexts) &&
               ((ignore & DAEMON_STATE_IMPORTS) || a->model_imports == b->model_imports) &&
               ((ignore & DAEMON_STATE_QUEUES) || a->model_queues == b->model_queues) &&
               ((ignore & DAEMON_STATE_FDS) || a->fds == b->fds);
}

bool daemon_state_is_base(const DaemonState *s, const DaemonState *base)
{
        return daemon_state_same_but(s, base, 0);
}

int daemon_wait_base(Daemon *d, const DaemonState *base, int timeout_ms, DaemonState *ret_last)
{
        int64_t deadline = mono_ms() + (daemon_wrapped() ? 10 * timeout_ms : timeout_ms);
        DaemonState s = {0};
        int r = -ETIMEDOUT;

        for (;;) {
                if (daemon_state(d, &s) == 0) {
                        /* the status connection itself is gone again once its fd count is taken */
                        for (int i = 0; i < 20 && s.fds != base->fds; i++) {
                                usleep(10000);
                                s.fds = daemon_own_fds(d);
                        }
                        if (daemon_state_is_base(&s, base)) {
                                r = 0;
                                break;
                        }
                }
                if (mono_ms() >= deadline)
                        break;
                usleep(20000);
        }
        if (r < 0)
                fprintf(stderr,
                        "daemon not back to its baseline: allocations %llu device %llu host %llu managed "
                        "%llu, "
                        "model contexts %u/%u buffers %llu/%llu handles %llu/%llu imports %llu/%llu mappings "
                        "%llu/%llu gem %llu/%llu svm %llu/%llu system %llu/%llu vram %llu/%llu queues "
                        "%llu/%llu, "
                        "fds %d/%d\n",
                        (unsigned long long)s.allocations, (unsigned long long)s.bytes_device,
                        (unsigned long long)s.bytes_host, (unsigned long long)s.bytes_managed,
                        s.model_contexts, base->model_contexts, (unsigned long long)s.model_buffers,
                        (unsigned long long)base->model_buffers, (unsigned long long)s.model_handles,
                        (unsigned long long)base->model_handles, (unsigned long long)s.model_imports,
                        (unsigned long long)base->model_imports, (unsigned long long)s.model_mappings,
                        (unsigned long long)base->model_mappings, (unsigned long long)s.model_gem_handles,
                        (unsigned long long)base->model_gem_handles, (unsigned long long)s.model_svm_ranges,
                        (unsigned long long)base->model_svm_ranges, (unsigned long long)s.model_system_bytes,
                        (unsigned long long)base->model_system_bytes, (unsigned long long)s.model_vram_bytes,
                        (unsigned long long)base->model_vram_bytes, (unsigned long long)s.model_queues,
                        (unsigned long long)base->model_queues, s.fds, base->fds);
        if (ret_last)
                *ret_last = s;
        return r;
}

gm_client *daemon_client(Daemon *d, const char *name)
{
        gm_client *c = NULL;

        CHECK_RC(gm_client_connect(d->sock, name, &c), 0);
        return c;
}

int daemon_class_quota(Daemon *d, const char *cls, int resource, uint32_t gpu, uint64_t *ret_used,
                       uint64_t *ret_limit)
{
        gm_client *c = NULL;
        gm_quota *q = NULL;
        size_t n = 0;
        int r;

        if (ret_used)
                *ret_used = UINT64_MAX;
        if (ret_limit)
                *ret_limit = UINT64_MAX;
        r = gm_client_connect(d->sock, "quota", &c);
        if (r < 0)
                return r;
        r = gm_admin_quota_get(c, cls, &q, &n);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (q[i].resource == resource && q[i].gpu_id == gpu) {
                        if (ret_used)
                                *ret_used = q[i].used;
                        if (ret_limit)
                                *ret_limit = q[i].limit;
                }
        gm_quota_free(q, n);
        gm_client_close(c);
        return r;
}

int daemon_class_reaches(Daemon *d, const char *cls, int resource, uint64_t want, int timeout_ms)
{
        uint64_t used = UINT64_MAX;

        for (int i = 0; i <= timeout_ms / 20; i++) {
                int r = daemon_class_quota(d, cls, resource, 0, &used, NULL);
                if (r < 0)
                        return r;
                if (used == want)
                        return 0;
                usleep(20000);
        }
        fprintf(stderr, "class %s uses %llu of resource %d, not %llu\n", cls, (unsigned long long)used,
                resource, (unsigned long long)want);
        return -ETIMEDOUT;
}

int daemon_share_info(Daemon *d, const char *name, gm_share_info *ret)
{
        gm_client *c = NULL;
        gm_share_info *all = NULL;
        size_t n = 0;
        bool found = false;
        int r = gm_client_connect(d->sock, "shares", &c);

        if (r < 0)
                return r;
        r = gm_admin_shares(c, &all, &n);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (strcmp(all[i].name, name) == 0) {
                        *ret = all[i];
                        found = true;
                }
        free(all);
        gm_client_close(c);
        return r < 0 ? r : found ? 0 : -ENOENT;
}

void client_leave_objects(gm_client *c, uint32_t dev_gpu, uint32_t map_gpu, uint32_t gpu, bool import)
{
        const size_t mib = 1u << 20;
        void *p = NULL, *h = NULL, *m = NULL, *res = NULL;
        gm_handle vh = 0, ih;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        gm_access_desc rw = {gpu, GM_ACCESS_READ_WRITE};
        gm_svm_attr a = {GM_SVM_ATTR_PREFERRED_LOC, gpu};
        int fd;

        (void)gm_malloc(c, 2 * mib, dev_gpu, GM_MEM_HOST_VISIBLE, &p);
        (void)gm_mem_map_gpus(c, p, &map_gpu, 1);
        if (gm_pointer_get_attributes(c, p, &pa) == 0 && gm_mem_export(c, pa.handle, &fd, NULL) == 0) {
                if (import)
                        (void)gm_mem_import(c, fd, gpu, &ih, NULL);
                close(fd);
        }
        (void)gm_host_malloc(c, mib, 0, -1, 0, &h);
        (void)gm_malloc_managed(c, 2 * mib, 0, &m);
        (void)gm_svm_set_attributes(c, m, 2 * mib, &a, 1);
        (void)gm_mem_address_reserve(c, 4 * mib, 0, NULL, 0, &res);
        (void)gm_mem_create(c, 2 * mib, gpu, 0, &vh);
        (void)gm_mem_map(c, res, 2 * mib, 0, vh);
        (void)gm_mem_set_access(c, res, 2 * mib, &rw, 1);
}

int daemon_wait_base_after(Daemon *d, const DaemonState *base, const char *what)
{
        int r = daemon_wait_base(d, base, 10000, NULL);

        if (r < 0)
                fprintf(stderr, "after %s\n", what);
        return r;
}

pid_t fork_doomed(Daemon *d, void (*fn)(gm_client *c, int ready, void *arg), void *arg)
{
        int pfd[2];
        char ch;
        pid_t pid;

        if (pipe2(pfd, O_CLOEXEC) < 0)
                return -1;
        pid = fork();
        if (pid == 0) {
                gm_client *c = NULL;

                close(pfd[0]);
                if (gm_client_connect(d->sock, "doomed", &c) < 0)
                        _exit(1);
                fn(c, pfd[1], arg);
                _exit(0);
        }
        close(pfd[1]);
        if (pid > 0 && read(pfd[0], &ch, 1) != 1)
                kill_and_reap(&pid);
        close(pfd[0]);
        return pid > 0 ? pid : -1;
}

void gtt_queue_init(GttQueue *g, void *mem, uint32_t gpu)
{
        uint8_t *m = mem;

        g->ring = (uint32_t *)m;
        g->rptr = (uint64_t *)(m + 4096);
        g->wptr = g->rptr + 1;
        g->fence = (volatile uint32_t *)(m + 8192);
        g->desc = (gm_queue_desc){.gpu_id = gpu,
                                  .type = 1 /* SDMA */,
                                  .percentage = 100,
                                  .priority = 7,
                                  .ring_va = (uintptr_t)g->ring,
                                  .ring_size = 4096,
                                  .rptr_va = (uintptr_t)g->rptr,
                                  .wptr_va = (uintptr_t)g->wptr};
}

void *event_waiter(void *arg)
{
        EventWaiter *w = arg;

        w->result = gm_event_wait(w->c, &w->id, 1, false, 10000);
        return NULL;
}

bool wait_u32(volatile uint32_t *p, uint32_t want, int ms)
{
        for (int i = 0; i < ms && __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; i++)
                usleep(1000);
        return __atomic_load_n(p, __ATOMIC_ACQUIRE) == want;
}

/* fork_as(), closing @other_fd (the parent's end of a socketpair, or -1) in the child. */
static pid_t fork_as_closing(uid_t uid, int (*fn)(void *), void *arg, int other_fd)
{
        pid_t pid = fork();

        if (pid == 0) {
                int r;

                check_failures = 0; /* the parent's, until here */
                if (other_fd >= 0)
                        close(other_fd);
                if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
                        _exit(100);
                r = fn(arg);
                _exit(r ? r : check_failures ? 1 : 0);
        }
        return pid;
}

pid_t fork_as(uid_t uid, int (*fn)(void *), void *arg)
{
        return fork_as_closing(uid, fn, arg, -1);
}

pid_t fork_as_synced(uid_t uid, int (*fn)(void *), int *ret_sync)
{
        int sv[2];
        pid_t pid;

        *ret_sync = -1;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return -1;
        pid = fork_as_closing(uid, fn, &sv[1], sv[0]);
        close(sv[1]);
        if (pid < 0) {
                close(sv[0]);
                return -1;
        }
        *ret_sync = sv[0];
        return pid;
}

int child_status(pid_t pid)
{
        int status;

        if (pid <= 0 || waitpid(pid, &status, 0) != pid)
                return -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int child_end(pid_t pid, int sync)
{
        if (sync >= 0)
                close(sync);
        return child_status(pid);
}

int run_as(uid_t uid, int (*fn)(void *), void *arg)
{
        return child_status(fork_as(uid, fn, arg));
}

void raw_send_request(int fd, uint32_t id, const void *req)
{
        const Gpumem__Request *q = req;
        uint8_t body[256];
        size_t n = gpumem__request__get_packed_size(q);

        CHECK(n <= sizeof(body));
        if (n > sizeof(body))
                return;
        gpumem__request__pack(q, body);
        CHECK_EQ(raw_send_frame(fd, id, body, n, GM_PROTOCOL_VERSION, 0, NULL, 0), 0);
}

void raw_send_host_alloc(int fd, uint32_t id, uint64_t size)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;

        a.has_kind = a.has_size = true;
        a.kind = GPUMEM__MEM_KIND__MEM_KIND_HOST;
        a.size = size;
        q.op_case = GPUMEM__REQUEST__OP_ALLOC;
        q.alloc = &a;
        raw_send_request(fd, id, &q);
}

void raw_send_ping(int fd, uint32_t id)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Ping pg = GPUMEM__PING__INIT;

        q.op_case = GPUMEM__REQUEST__OP_PING;
        q.ping = &pg;
        raw_send_request(fd, id, &q);
}
