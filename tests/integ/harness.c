/* Integration harness: spawn gpumemd on the model, collect sd_notify messages, talk raw protocol. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void *notify_reader(void *userdata)
{
        Daemon *d = userdata;

        while (!d->notify_stop) {
                struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
                char buf[1024];
                ssize_t n;

                if (poll(&p, 1, 50) <= 0)
                        continue;
                n = recv(d->notify_fd, buf, sizeof(buf) - 1, 0);
                if (n <= 0)
                        continue;
                buf[n] = '\0';
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
        }
        return NULL;
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

int daemon_start(Daemon *d, const char *preset, const char *config_text, const char *const *extra_args)
{
        const char *bin = getenv("GPUMEMD");
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        const char *argv[32];
        size_t n = 0;
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

        argv[n++] = bin;
        argv[n++] = "--socket";
        argv[n++] = d->sock;
        argv[n++] = "--config";
        argv[n++] = d->conf;
        argv[n++] = "--backend";
        argv[n++] = "model";
        argv[n++] = "--model-preset";
        argv[n++] = preset ? preset : "mi300x";
        for (size_t i = 0; extra_args && extra_args[i] && n < 30; i++)
                argv[n++] = extra_args[i];
        argv[n] = NULL;

        d->pid = fork();
        if (d->pid < 0)
                return -errno;
        if (d->pid == 0) {
                setenv("NOTIFY_SOCKET", d->notify_path, 1);
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_PID");
                execv(bin, (char *const *)argv);
                _exit(127);
        }
        r = daemon_wait_notify(d, "READY=1", 10000);
        if (r < 0) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, NULL, 0);
                d->pid = 0;
        }
        return r;
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

int daemon_stop(Daemon *d)
{
        int status;

        if (d->pid <= 0)
                return -ECHILD;
        kill(d->pid, SIGTERM);
        if (waitpid(d->pid, &status, 0) < 0)
                return -errno;
        d->pid = 0;
        if (WIFEXITED(status))
                return WEXITSTATUS(status);
        return -1000 - WTERMSIG(status);
}

void daemon_cleanup(Daemon *d)
{
        char cmd[128];

        if (d->pid > 0) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, NULL, 0);
                d->pid = 0;
        }
        if (d->notify_thread_running) {
                d->notify_stop = true;
                pthread_join(d->notify_thread, NULL);
                d->notify_thread_running = false;
        }
        if (d->notify_fd >= 0)
                close(d->notify_fd);
        d->notify_fd = -1;
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
        int min = count_fds(d->pid);

        /* fds the daemon opens for a moment (a notification socket, say) must not count */
        for (int i = 0; i < 10; i++) {
                usleep(20000);
                int n = count_fds(d->pid);
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
        GmFrameHdr h;
        ssize_t n;

        if (poll(&p, 1, timeout_ms) <= 0)
                return -ETIMEDOUT;
        n = gm_wire_recv(fd, buf, sizeof(buf), fds, &n_fds, 0);
        if (n == 0)
                return -ECONNRESET;
        if (n < 0)
                return (int)n;
        gm_wire_close_fds(fds, n_fds);
        if (gm_frame_parse(buf, (size_t)n, n_fds, 1, &h, NULL) < 0)
                return -EPROTO;
        reply = gpumem__reply__unpack(NULL, h.body_len, buf + GM_FRAME_HDR_SIZE);
        if (!reply || !reply->status) {
                if (reply)
                        gpumem__reply__free_unpacked(reply, NULL);
                return -EBADMSG;
        }
        *ret_id = h.request_id;
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
