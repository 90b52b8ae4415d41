/* A client connection: identity at accept, non-blocking frame I/O with fds, backpressure, deferred free. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "frame.h"
#include "base/log.h"
#include "config/policy.h"
#include "shard.h"
#include "transport.h"
#include "wire.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

uint64_t conn_inflight_limit(const Conn *c)
{
        return c->host->inflight_limit(c);
}

static void conn_free_cb(void *userdata);

/* ---- what the transport tells the connection ---------------------------------------------------------- */

static void on_packet(void *owner, const uint8_t *buf, size_t len, int *fds, size_t n_fds)
{
        Conn *c = owner;

        c->host->packet(c, buf, len, fds, n_fds);
}

static void on_refused(void *owner, int err, uint32_t request_id)
{
        Conn *c = owner;

        c->host->lock(c->m);
        c->host->violation(c, request_id, err,
                           err == -EMSGSIZE ? "frame larger than the maximum frame size"
                                            : "ancillary data truncated or not SCM_RIGHTS");
        c->host->unlock(c->m);
}

static void conn_end(Conn *c, bool unlink);

/*
 * Also reported from inside a send, which a handler may make holding the client's lock alone: the
 * manager's lock cannot be taken after it, so the connection stops now and leaves the daemon's list from
 * a fresh loop iteration, under the manager's lock.
 */
static void on_closed(void *owner)
{
        conn_end(owner, false);
}

static void on_stalled(void *owner)
{
        Conn *c = owner;

        COUNTER_ADD(c->sh->stats.stalled_drops, 1);
        c->host->lock(c->m);
        conn_log(c, LOG_NOTICE, GM_MESSAGE_PROTOCOL_VIOLATION, &c->log_rl,
                 "does not read its replies: %u waiting for %u s, closing", c->t.out_count,
                 READ_ONCE(*c->send_timeout_sec));
        conn_kill(c);
        c->host->unlock(c->m);
}

/* Replies in flight are summed per class when asked; a connection held at its limit is a denial in the
 * metrics. */
static void on_inflight(void *owner, int delta, bool limited)
{
        Conn *c = owner;

        COUNTER_ADD(c->inflight, (int64_t)delta);
        if (limited)
                c->host->limited(c);
}

static uint64_t on_inflight_limit(void *owner)
{
        return conn_inflight_limit(owner);
}

/* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
// clang-format off
static const TransportOps conn_transport_ops = {
        .packet = on_packet, .refused = on_refused, .closed = on_closed, .stalled = on_stalled,
        .inflight = on_inflight, .inflight_limit = on_inflight_limit
};
// clang-format on

bool conn_in_group(const Conn *c, gid_t gid)
{
        if (c->ident.gid == gid)
                return true;
        for (size_t i = 0; i < c->ident.n_groups; i++)
                if (c->ident.groups[i] == gid)
                        return true;
        return false;
}

int conn_session_log_level(const Conn *c)
{
        return c->admin && c->name && strcmp(c->name, "gpumemctl") == 0 ? LOG_DEBUG : LOG_INFO;
}

void conn_log(Conn *c, int prio, const char *message_id, LogRatelimit *rl, const char *fmt, ...)
{
        char f_uid[48], f_pid[48], f_client[48], f_cgroup[512], f_class[96], msg[768];
        const char *fields[] = {f_uid, f_pid, f_client, f_cgroup, f_class, NULL};
        va_list ap;

        if (prio > log_get_level() || (rl && !log_ratelimit_ok(rl)))
                return;
        snprintf(f_uid, sizeof(f_uid), "GPUMEM_CLIENT_UID=%u", (unsigned)c->ident.uid);
        snprintf(f_pid, sizeof(f_pid), "GPUMEM_CLIENT_PID=%d", (int)c->ident.pid);
        snprintf(f_client, sizeof(f_client), "GPUMEM_CLIENT_ID=%llu", (unsigned long long)c->id);
        snprintf(f_cgroup, sizeof(f_cgroup), "GPUMEM_CLIENT_CGROUP=%s",
                 c->ident.cgroup ? c->ident.cgroup : "");
        snprintf(f_class, sizeof(f_class), "GPUMEM_CLIENT_CLASS=%s", c->host->class_name(c));
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        log_full(prio, 0, message_id, fields, "client %llu (pid %d uid %u): %s", (unsigned long long)c->id,
                 (int)c->ident.pid, (unsigned)c->ident.uid, msg);
}

static int read_cgroup(pid_t pid, char **ret)
{
        char path[64], line[4096];
        _cleanup_fclose_ FILE *f = NULL;

        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f)) {
                if (strncmp(line, "0::", 3) == 0) {
                        line[strcspn(line, "\n")] = '\0';
                        char *s = strdup(line + 3);
                        if (!s)
                                return -ENOMEM;
                        *ret = s;
                        return 0;
                }
        }
        return -ENODATA;
}

static int capture_identity(int fd, ConnIdentity *id)
{
        struct ucred cred;
        socklen_t len = sizeof(cred);
        int r;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                return -errno;
        id->pid = cred.pid;
        id->uid = cred.uid;
        id->gid = cred.gid;

        len = 0;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) < 0 && errno != ERANGE)
                return -errno;
        if (len > 0) {
                id->groups = malloc(len);
                if (!id->groups)
                        return -ENOMEM;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, id->groups, &len) < 0)
                        return -errno;
                id->n_groups = len / sizeof(gid_t);
        }

        /* The kernel's own pidfd of the peer (6.5+) cannot race with pid reuse; pidfd_open is the fallback.
         */
        len = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &id->pidfd, &len) < 0) {
                id->pidfd = -1;
                if (id->pid > 0) {
                        r = (int)syscall(SYS_pidfd_open, id->pid, 0);
                        id->pidfd = r >= 0 ? r : -1;
                }
        }
        if (id->pidfd >= 0)
                (void)fcntl(id->pidfd, F_SETFD, FD_CLOEXEC);
        if (id->pid > 0 && read_cgroup(id->pid, &id->cgroup) == 0 && id->pidfd >= 0) {
                /* Still the same process (the pidfd pins it): the cgroup we read belongs to the peer. */
                /* EPERM: alive, only not ours to signal (another uid, and we hold no CAP_KILL); ENOSYS: the
                 * check itself is not there, and the pidfd still pins the peer */
                if (syscall(SYS_pidfd_send_signal, id->pidfd, 0, NULL, 0) < 0 && errno != EPERM &&
                    errno != ENOSYS) {
                        free(id->cgroup);
                        id->cgroup = NULL;
                }
        }
        return 0;
}

/* A connection that never says hello holds a slot under the connection caps: it gets a deadline. */
static void conn_on_hello_timeout(void *userdata)
{
        Conn *c = userdata;

        if (c->proto_version || c->dead)
                return;
        c->host->lock(c->m);
        conn_log(c, LOG_NOTICE, GM_MESSAGE_PROTOCOL_VIOLATION, &c->log_rl, "no hello within %u s, closing",
                 READ_ONCE(*c->hello_timeout_sec));
        (void)conn_send_error(c, 0, -ETIMEDOUT, "no hello in time");
        conn_kill(c);
        c->host->unlock(c->m);
}

void conn_hello_done(Conn *c)
{
        loop_timer_cancel(&c->hello_timer);
}

int conn_new(Manager *m, const ConnHost *host, const uint32_t *send_timeout_sec,
             const uint32_t *hello_timeout_sec, int fd, Conn **ret)
{
        Conn *c;
        int r;

        c = calloc(1, sizeof(*c));
        if (!c) {
                safe_close(fd);
                return -ENOMEM;
        }
        c->m = m;
        c->host = host;
        c->send_timeout_sec = send_timeout_sec;
        c->hello_timeout_sec = hello_timeout_sec;
        c->ident.pidfd = -1;
        c->max_inflight = 1; /* until its class is bound */
        c->log_rl = (LogRatelimit)LOG_RATELIMIT_INIT(10, 1);
        c->connected_real_usec = now_usec(CLOCK_REALTIME);
        pthread_mutex_init(&c->lock, NULL);

        /* the transport owns the fd from here, on failure too; it watches it once started on its loop */
        transport_adopt(&c->t, fd, &conn_transport_ops, c);
        r = capture_identity(fd, &c->ident);
        if (r < 0) {
                conn_free(c);
                return r;
        }
        policy_container_of(c->ident.cgroup, c->container, sizeof(c->container), c->pod, sizeof(c->pod));
        *ret = c;
        return 0;
}

void conn_start(Conn *c)
{
        Shard *sh = c->sh;
        uint32_t hello_timeout = READ_ONCE(*c->hello_timeout_sec);
        int r;

        r = transport_start(&c->t, sh->loop, sh->rx_buf, sh->tx_buf, c->send_timeout_sec);
        c->started = true;
        if (loop_timer_init(&c->free_timer, sh->loop, conn_free_cb, c) < 0)
                r = -ENOMEM;
        if (r == 0 && hello_timeout && !c->dead && !c->proto_version) {
                r = loop_timer_init(&c->hello_timer, sh->loop, conn_on_hello_timeout, c);
                if (r == 0)
                        loop_timer_arm(&c->hello_timer, (uint64_t)hello_timeout * 1000000u);
        }
        if (r < 0) {
                c->host->lock(c->m);
                conn_log(c, LOG_WARNING, GM_MESSAGE_PROTOCOL_VIOLATION, NULL,
                         "cannot watch the connection: %s", strerror(-r));
                conn_kill(c);
                c->host->unlock(c->m);
        }
}

/* Dead: nothing more is read, written or timed for it. */
static void conn_stop(Conn *c)
{
        c->dead = true;
        transport_stop(&c->t);
        loop_timer_cancel(&c->hello_timer);
}

Conn *conn_free(Conn *c)
{
        if (!c)
                return NULL;
        if (c->host)
                c->host->gone(c, false);
        if (c->deferred) {
                /* requests of it are still being worked on: freed when the last one ends
                 * (conn_deferred_end), its objects and window staying until then */
                c->free_when_idle = true;
                conn_stop(c);
                return NULL;
        }
        if (c->host)
                c->host->teardown(c); /* its objects, its window, its class */
        loop_timer_done(&c->hello_timer);
        loop_timer_done(&c->free_timer); /* also from its own callback: a fired timer is no longer armed */
        transport_done(&c->t);
        safe_close(c->ident.pidfd);
        free(c->ident.groups);
        free(c->ident.cgroup);
        free(c->name);
        free(c->vram_told);
        while (c->paged) {
                PagedText *t = c->paged;
                c->paged = t->next;
                free(t->text);
                free(t);
        }
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
}

static void conn_forget_dying(Conn *c)
{
        for (Conn **p = &c->sh->dying; *p; p = &(*p)->dying_next)
                if (*p == c) {
                        *p = c->dying_next;
                        c->dying_next = NULL;
                        return;
                }
}

static void conn_free_cb(void *userdata)
{
        Conn *c = userdata;
        const ConnHost *host = c->host;
        Manager *m = c->m;

        host->lock(m);
        conn_forget_dying(c);
        host->gone(c, true); /* a no-op when conn_kill() took it out already */
        conn_free(c);
        host->unlock(m);
}

/* Stop it and free it from a fresh loop iteration; @unlink: out of the daemon's list now (under the
 * manager's lock), or only then. */
static void conn_end(Conn *c, bool unlink)
{
        if (c->dead)
                return;
        conn_stop(c);
        /* Out of the list now, so counts and admin views no longer see it; freed after this callback. */
        if (unlink)
                c->host->gone(c, true);
        /* Remembered until freed: when the loop stops first (the drain at SIGTERM breaks it as soon as the
         * last connection is unlinked), manager_free() frees what is left. */
        c->dying_next = c->sh->dying;
        c->sh->dying = c;
        if (c->free_timer.loop) {
                loop_timer_arm(&c->free_timer, 0);
                return;
        }
        /* not started (its free timer is set up at its start): its loop's inbox runs the free */
        loop_post_work(c->sh->loop, &c->free_work, conn_free_cb, c);
}

void conn_kill(Conn *c)
{
        conn_end(c, true);
}

int conn_send(Conn *c, uint32_t request_id, const Gpumem__Reply *reply, int *fds, size_t n_fds)
{
        return transport_send(&c->t, request_id, reply, fds, n_fds);
}

int conn_send_packed(Conn *c, uint32_t request_id, const uint8_t *body, size_t body_len)
{
        return transport_send_packed(&c->t, request_id, body, body_len);
}

int conn_send_error(Conn *c, uint32_t request_id, int code, const char *reason)
{
        return transport_send_error(&c->t, request_id, code, reason);
}

int conn_slot_reserve(Conn *c, TransportPacket **ret)
{
        int r = transport_slot_reserve(&c->t, ret);

        /* the client's next request waits for this one: its requests run in the order it sent them */
        if (r == 0) {
                c->deferred++;
                transport_hold(&c->t);
        }
        return r;
}

int conn_slot_fill(Conn *c, TransportPacket *slot, uint32_t request_id, const Gpumem__Reply *reply, int *fds,
                   size_t n_fds)
{
        return transport_slot_fill(&c->t, slot, request_id, reply, fds, n_fds);
}

void conn_deferred_end(Conn *c)
{
        transport_release(&c->t);
        if (--c->deferred == 0 && c->free_when_idle) {
                c->free_when_idle = false;
                conn_free(c);
        }
}
