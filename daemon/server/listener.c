/* gpumemd's listener: the listening socket, accept, admission to a class, placement on a loop. */
#include "listener.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "base/metrics.h"
#include "classes.h"
#include "frame.h"
#include "wire.h"

#define ACCEPTS_PER_WAKEUP 64

void listener_refuse_send(int fd, int code, const char *reason)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status st = GPUMEM__STATUS__INIT;
        uint8_t buf[256];
        size_t len;

        st.has_code = true;
        st.code = code;
        st.reason = (char *)reason;
        reply.status = &st;
        len = gpumem__reply__get_packed_size(&reply);
        if (len <= sizeof(buf) - GM_FRAME_HDR_SIZE &&
            gm_frame_hdr_encode(buf, GM_PROTOCOL_VERSION_MIN, 0, (uint32_t)len, 0) == 0) {
                gpumem__reply__pack(&reply, buf + GM_FRAME_HDR_SIZE);
                (void)gm_wire_send(fd, buf, GM_FRAME_HDR_SIZE + len, NULL, 0, NULL, 0, MSG_DONTWAIT);
        }
}

static void refuse(int fd, int code, const char *reason)
{
        listener_refuse_send(fd, code, reason);
        safe_close(fd);
}

Shard *listener_pick_shard(Manager *m)
{
        unsigned n = m->n_shards - 1;
        Shard *best = &m->shards[1];

        for (unsigned i = 0; i < n; i++) {
                Shard *sh = &m->shards[1 + (m->next_shard + i) % n];
                if (i == 0 || sh->n_conns < best->n_conns)
                        best = sh;
        }
        m->next_shard = best->index % n; /* the one after it first next time */
        return best;
}

static void start_cb(void *arg)
{
        conn_start(arg);
}

int listener_conn_new(Manager *m, int fd, Conn **ret)
{
        return conn_new(m, m->conn_host, &m->opts.send_timeout_sec, &m->opts.hello_timeout_sec, fd, ret);
}

void listener_place(Manager *m, Conn *c, Shard *sh)
{
        c->sh = sh;
        c->id = ++m->next_client_id;
        c->next = m->conns;
        if (m->conns)
                m->conns->prev = c;
        m->conns = c;
        m->n_conns++;
        sh->n_conns++;
}

static void on_accept_retry(evutil_socket_t fd, short what, void *userdata)
{
        Manager *m = userdata;
        if (!m->stopping)
                event_add(m->listen_ev, NULL);
}

/* Accept, check the caps, read the identity, admit to a class, and hand the connection to a loop. */
static void accept_one(Manager *m, Shard *main_sh, int fd, const struct ucred *cred)
{
        char reason[256];
        bool on_main;
        Conn *c;
        int r;

        manager_lock(m);
        if (m->n_conns >= m->opts.max_connections) {
                COUNTER_ADD(main_sh->stats.connections_refused, 1);
                metrics_deny(main_sh->metrics, DENY_CONNECTIONS);
                manager_unlock(m);
                refuse(fd, -EUSERS, "gpumemd is at its connection limit");
                return;
        }
        if (manager_conns_of_uid(m, cred->uid) >= m->opts.max_connections_per_uid) {
                COUNTER_ADD(main_sh->stats.connections_refused, 1);
                metrics_deny(main_sh->metrics, DENY_CONNECTIONS);
                manager_unlock(m);
                refuse(fd, -EUSERS, "too many connections from this user");
                return;
        }
        if (listener_conn_new(m, fd, &c) < 0) {
                manager_unlock(m);
                log_warning("cannot set up a connection from pid %d", (int)cred->pid);
                return;
        }
        r = classes_admit(m, c, reason, sizeof(reason));
        if (r < 0) {
                COUNTER_ADD(main_sh->stats.connections_refused, 1);
                COUNTER_ADD(main_sh->stats.denials, 1);
                metrics_deny(main_sh->metrics, r == -EACCES ? DENY_NO_CLASS : DENY_CONNECTIONS);
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &m->conn_log_rl, "refused: %s", reason);
                listener_refuse_send(c->t.fd, r, reason);
                conn_free(c);
                manager_unlock(m);
                return;
        }
        listener_place(m, c, listener_pick_shard(m));
        COUNTER_ADD(main_sh->stats.connections_total, 1);
        log_debug("accepted client %llu (pid %d uid %u) on loop %u", (unsigned long long)c->id,
                  (int)cred->pid, (unsigned)cred->uid, c->sh->index);
        /* From here only its loop touches its socket. Posted before the lock goes: whatever another loop
         * then posts there for it (an administrator's disconnect) comes after its start. */
        on_main = c->sh == main_sh;
        if (!on_main)
                loop_post_work(c->sh->loop, &c->start_work, start_cb, c);
        manager_unlock(m);
        /* (another loop's connection may be gone already: not touched here again) */
        if (on_main)
                conn_start(c);
}

static void on_accept(evutil_socket_t lfd, short what, void *userdata)
{
        Manager *m = userdata;

        for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
                struct ucred cred;
                socklen_t len = sizeof(cred);
                int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

                if (fd < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                                /* Out of fds: stop accepting for a second rather than spin. */
                                struct timeval tv = {1, 0};
                                log_warning_errno(errno, "accept: %s, pausing for a second", strerror(errno));
                                event_del(m->listen_ev);
                                evtimer_add(m->accept_retry_ev, &tv);
                        } else if (errno != EAGAIN) {
                                log_warning_errno(errno, "accept: %s", strerror(errno));
                        }
                        return;
                }
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                        safe_close(fd);
                        continue;
                }
                accept_one(m, &m->shards[0], fd, &cred);
        }
}

bool listener_fd_usable(int fd)
{
        return sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) > 0;
}

/* The listening socket a previous daemon handed over, where socket activation passed none. */
static void take_handed(Manager *m, const Gpumemd__HandoverState *st, HandoverFds *ours)
{
        int fd = handover_fds_take(ours, HANDOVER_NAME_LISTEN);

        if (fd < 0)
                return;
        if (m->listen_fd >= 0 || !listener_fd_usable(fd)) {
                safe_close(fd); /* socket activation's wins */
                return;
        }
        m->listen_fd = fd;
        /* who removes the socket file at the final stop: the daemon that bound it, or systemd */
        m->listen_bound = st && st->has_listen_bound && st->listen_bound;
}

/* A socket file left by a dead daemon is removed; one that answers belongs to a live daemon. */
static int remove_stale_socket(const struct sockaddr_un *sa)
{
        struct stat st;
        int fd, r;

        if (lstat(sa->sun_path, &st) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISSOCK(st.st_mode))
                return -EEXIST;
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
        safe_close(fd);
        if (r == 0)
                return -EADDRINUSE;
        if (unlink(sa->sun_path) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}

static int listen_bind(Manager *m)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        const char *path = m->opts.socket_path;
        int fd, r;

        if (strlen(path) >= sizeof(sa.sun_path))
                return log_error_errno(-ENAMETOOLONG, "socket path '%s' is too long", path);
        strcpy(sa.sun_path, path);
        r = remove_stale_socket(&sa);
        if (r == -EADDRINUSE)
                return log_error_errno(r, "another gpumemd is already listening on %s", path);
        if (r < 0)
                return log_error_errno(r, "cannot use %s: %s", path, strerror(-r));

        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return log_error_errno(errno, "socket: %s", strerror(errno));
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                r = -errno;
                safe_close(fd);
                return log_error_errno(r, "cannot bind %s: %s", path, strerror(-r));
        }
        if (chmod(path, m->opts.socket_mode) < 0 || listen(fd, SOMAXCONN) < 0) {
                r = -errno;
                unlink(path);
                safe_close(fd);
                return log_error_errno(r, "cannot listen on %s: %s", path, strerror(-r));
        }
        m->listen_fd = fd;
        m->listen_bound = true;
        return 0;
}

int listener_open(Manager *m, const Gpumemd__HandoverState *handed, HandoverFds *passed)
{
        take_handed(m, handed, passed);
        if (m->listen_fd < 0)
                return listen_bind(m);
        (void)fcntl(m->listen_fd, F_SETFD, FD_CLOEXEC);
        (void)fcntl(m->listen_fd, F_SETFL, fcntl(m->listen_fd, F_GETFL) | O_NONBLOCK);
        return 0;
}

int listener_start(Manager *m)
{
        m->listen_ev = event_new(m->base, m->listen_fd, EV_READ | EV_PERSIST, on_accept, m);
        m->accept_retry_ev = evtimer_new(m->base, on_accept_retry, m);
        if (!m->listen_ev || !m->accept_retry_ev || event_add(m->listen_ev, NULL) < 0)
                return -ENOMEM;
        return 0;
}

void listener_pause(Manager *m)
{
        event_del(m->listen_ev);
        event_del(m->accept_retry_ev);
}

void listener_close(Manager *m)
{
        if (m->listen_ev)
                event_free(m->listen_ev);
        if (m->accept_retry_ev)
                event_free(m->accept_retry_ev);
        m->listen_ev = m->accept_retry_ev = NULL;
        if (m->listen_fd >= 0) {
                /* handed over, the socket file stays for the next daemon */
                if (m->listen_bound && !m->carried)
                        unlink(m->opts.socket_path);
                m->listen_fd = safe_close(m->listen_fd);
        }
}
