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

#include "classes.h"
#include "policy.h"
#include "frame.h"
#include "metrics.h"
#include "log.h"
#include "manager.h"
#include "request.h"
#include "wire.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/*
 * Frames handled per wakeup before yielding to other clients. One: the loop is level-triggered, so a
 * client with more queued comes round again, others get their turn in between, and a client waiting for
 * its reply costs no extra recvmsg that would only say EAGAIN.
 */
#define CONN_FRAMES_PER_WAKEUP 1
/* Queued reply bytes beyond which a client that does not read is dropped. */
#define CONN_OUT_MAX (1024u * 1024u)

/*
 * A reply waiting for the socket, or (hole) the place of one that a request finishing later will fill:
 * replies leave in the order their requests came, so nothing behind a hole is sent before it.
 */
struct OutPacket {
        OutPacket *next;
        bool hole;
        size_t len;
        size_t n_fds;
        int fds[GM_FRAME_MAX_FDS];
        uint8_t *data;
};

static void out_packet_free(OutPacket *p)
{
        gm_wire_close_fds(p->fds, p->n_fds);
        free(p->data);
        free(p);
}

static void out_dequeued(Conn *c)
{
        c->out_count--;
        if (c->cls)
                c->cls->inflight--;
}

uint64_t conn_inflight_limit(const Conn *c)
{
        return c->cls ? c->cls->max_inflight : POLICY_DEFAULT_INFLIGHT;
}

/* A reply has waited since the queue last moved: a client that does not read is dropped, so it cannot hold
 * its connection slot, its class's counts and its memory for ever. */
static void conn_on_send_timeout(evutil_socket_t fd, short what, void *userdata)
{
        Conn *c = userdata;

        /* a reply the daemon has not made yet is no fault of the client's */
        if (c->dead || !c->out_head || c->out_head->hole)
                return;
        c->m->stats.stalled_drops++;
        conn_log(c, LOG_NOTICE, GM_MESSAGE_PROTOCOL_VIOLATION, &c->log_rl,
                 "does not read its replies: %u waiting for %u s, closing", c->out_count,
                 c->m->opts.send_timeout_sec);
        conn_kill(c);
}

/* The queue moved (or began): the client has send-timeout seconds until it moves again. */
static void send_timer_restart(Conn *c)
{
        struct timeval tv = {(time_t)c->m->opts.send_timeout_sec, 0};

        if (c->send_ev && c->m->opts.send_timeout_sec)
                evtimer_add(c->send_ev, &tv);
}

bool conn_in_group(const Conn *c, gid_t gid)
{
        if (c->ident.gid == gid)
                return true;
        for (size_t i = 0; i < c->ident.n_groups; i++)
                if (c->ident.groups[i] == gid)
                        return true;
        return false;
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
        snprintf(f_class, sizeof(f_class), "GPUMEM_CLIENT_CLASS=%s", c->cls ? c->cls->name : "");
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

static void conn_on_read(evutil_socket_t fd, short what, void *userdata);
static void conn_on_write(evutil_socket_t fd, short what, void *userdata);

/* A connection that never says hello holds a slot under the connection caps: it gets a deadline. */
static void conn_on_hello_timeout(evutil_socket_t fd, short what, void *userdata)
{
        Conn *c = userdata;

        if (c->proto_version || c->dead)
                return;
        conn_log(c, LOG_NOTICE, GM_MESSAGE_PROTOCOL_VIOLATION, &c->log_rl, "no hello within %u s, closing",
                 c->m->opts.hello_timeout_sec);
        (void)conn_send_error(c, 0, -ETIMEDOUT, "no hello in time");
        conn_kill(c);
}

void conn_hello_done(Conn *c)
{
        if (c->hello_ev)
                event_del(c->hello_ev);
}

int conn_new(Manager *m, int fd, Conn **ret)
{
        Conn *c;
        int r;

        c = calloc(1, sizeof(*c));
        if (!c) {
                safe_close(fd);
                return -ENOMEM;
        }
        c->m = m;
        c->fd = fd;
        c->ident.pidfd = -1;
        c->log_rl = (LogRatelimit)LOG_RATELIMIT_INIT(10, 1);
        c->connected_real_usec = now_usec(CLOCK_REALTIME);

        r = capture_identity(fd, &c->ident);
        if (r < 0)
                goto fail;
        policy_container_of(c->ident.cgroup, c->container, sizeof(c->container), c->pod, sizeof(c->pod));

        c->rd_ev = event_new(m->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
        c->wr_ev = event_new(m->base, fd, EV_WRITE | EV_PERSIST, conn_on_write, c);
        c->send_ev = evtimer_new(m->base, conn_on_send_timeout, c);
        if (!c->rd_ev || !c->wr_ev || !c->send_ev || event_add(c->rd_ev, NULL) < 0) {
                r = -ENOMEM;
                goto fail;
        }
        if (m->opts.hello_timeout_sec) {
                struct timeval tv = {(time_t)m->opts.hello_timeout_sec, 0};
                c->hello_ev = evtimer_new(m->base, conn_on_hello_timeout, c);
                if (!c->hello_ev || evtimer_add(c->hello_ev, &tv) < 0) {
                        r = -ENOMEM;
                        goto fail;
                }
        }
        c->id = ++m->next_client_id;
        c->next = m->conns;
        if (m->conns)
                m->conns->prev = c;
        m->conns = c;
        m->n_conns++;
        *ret = c;
        return 0;
fail:
        conn_free(c);
        return r;
}

static void conn_unlink(Conn *c)
{
        Manager *m = c->m;

        if (c->prev)
                c->prev->next = c->next;
        else if (m->conns == c)
                m->conns = c->next;
        else
                return; /* not linked */
        if (c->next)
                c->next->prev = c->prev;
        c->prev = c->next = NULL;
        m->n_conns--;
}

/* Dead: nothing more is read, written or timed for it. */
static void conn_stop(Conn *c)
{
        c->dead = true;
        event_del(c->rd_ev);
        event_del(c->wr_ev);
        if (c->hello_ev)
                event_del(c->hello_ev);
        event_del(c->send_ev);
}

Conn *conn_free(Conn *c)
{
        if (!c)
                return NULL;
        conn_unlink(c);
        if (c->deferred) {
                /* requests of it are still being worked on: freed when the last one ends
                 * (conn_deferred_end), its objects and window staying until then */
                c->free_when_idle = true;
                conn_stop(c);
                return NULL;
        }
        request_conn_teardown(c);
        if (c->rd_ev)
                event_free(c->rd_ev);
        if (c->wr_ev)
                event_free(c->wr_ev);
        if (c->hello_ev)
                event_free(c->hello_ev);
        if (c->send_ev)
                event_free(c->send_ev);
        while (c->out_head) {
                OutPacket *p = c->out_head;
                c->out_head = p->next;
                out_packet_free(p);
                out_dequeued(c);
        }
        classes_leave(c);
        safe_close(c->fd);
        safe_close(c->ident.pidfd);
        free(c->ident.groups);
        free(c->ident.cgroup);
        free(c->name);
        free(c);
        return NULL;
}

static void conn_forget_dying(Conn *c)
{
        for (Conn **p = &c->m->dying; *p; p = &(*p)->dying_next)
                if (*p == c) {
                        *p = c->dying_next;
                        c->dying_next = NULL;
                        return;
                }
}

static void conn_free_cb(evutil_socket_t fd, short what, void *userdata)
{
        Conn *c = userdata;

        conn_forget_dying(c);
        conn_free(c);
}

void conn_kill(Conn *c)
{
        if (c->dead)
                return;
        /* Consume what the client sent and we will never read: closing over unread data makes the kernel
         * report a reset to the client before it has read our last (error) frame. */
        for (int i = 0; i < 64; i++) {
                /* a small buffer: the packet is consumed whole anyway (-EMSGSIZE), and the frame being
                 * handled may still sit in the manager's receive buffer */
                uint8_t scratch[64];
                int fds[GM_FRAME_MAX_FDS];
                size_t n_fds = 0;
                ssize_t n = gm_wire_recv(c->fd, scratch, sizeof(scratch), fds, &n_fds, MSG_DONTWAIT);
                if (n > 0)
                        gm_wire_close_fds(fds, n_fds);
                else if (n != -EMSGSIZE && n != -EPROTO)
                        break;
        }
        conn_stop(c);
        /* Out of the list now, so counts and admin views no longer see it; freed after this callback. */
        conn_unlink(c);
        if (c->proto_version)
                conn_log(c, LOG_INFO, GM_MESSAGE_CLIENT_DISCONNECT, &c->m->conn_log_rl,
                         "disconnected after %llu requests", (unsigned long long)c->requests);
        manager_notify_status(c->m);
        /* Remembered until freed: when the loop stops first (the drain at SIGTERM breaks it as soon as the
         * last connection is unlinked), manager_free() frees what is left. */
        c->dying_next = c->m->dying;
        c->m->dying = c;
        if (event_base_once(c->m->base, -1, EV_TIMEOUT, conn_free_cb, c, NULL) < 0) {
                conn_forget_dying(c);
                conn_free(c); /* cannot defer: no callback of this conn is on the stack at the callers that
                                 reach here without one, and libevent only fails on allocation */
        }
}

static void packet_fill(OutPacket *p, const uint8_t *buf, size_t len, const int *fds, size_t n_fds)
{
        p->len = len;
        p->n_fds = n_fds;
        if (n_fds) /* fds is NULL when there are none */
                memcpy(p->fds, fds, n_fds * sizeof(int));
        memcpy(p->data, buf, len);
}

/* Queue @p; it counts in the connection's in-flight replies until it is sent. */
static void out_append(Conn *c, OutPacket *p)
{
        p->next = NULL;
        if (c->out_tail)
                c->out_tail->next = p;
        else
                c->out_head = p;
        c->out_tail = p;
        c->out_count++;
        if (c->cls)
                c->cls->inflight++;
        /* At its in-flight limit the connection is not read until the client takes replies; the others
         * are served meanwhile, whatever its class does. */
        if (c->out_count >= conn_inflight_limit(c)) {
                metrics_deny(c->m->metrics, DENY_INFLIGHT);
                event_del(c->rd_ev);
        }
}

static int conn_flush(Conn *c)
{
        while (c->out_head && !c->out_head->hole) {
                OutPacket *p = c->out_head;
                int r = gm_wire_send(c->fd, p->data, p->len, NULL, 0, p->fds, p->n_fds, MSG_DONTWAIT);
                if (r == -EAGAIN)
                        return 0;
                if (r < 0)
                        return r;
                c->out_head = p->next;
                if (!c->out_head)
                        c->out_tail = NULL;
                c->out_bytes -= p->len;
                out_packet_free(p);
                out_dequeued(c);
                send_timer_restart(c);
                /* below its in-flight limit again: read it (replies keep their order in the queue) */
                if (!c->m->stopping && c->out_count < conn_inflight_limit(c))
                        event_add(c->rd_ev, NULL);
        }
        /* empty, or waiting for a reply still being made: nothing to write, and no stall of the client's */
        event_del(c->wr_ev);
        event_del(c->send_ev);
        return 0;
}

static void conn_on_write(evutil_socket_t fd, short what, void *userdata)
{
        Conn *c = userdata;

        if (conn_flush(c) < 0)
                conn_kill(c);
}

/* The frame header for @body_len bytes of body, in the transmit buffer. */
static int conn_frame_hdr(Conn *c, uint32_t request_id, size_t body_len, size_t n_fds)
{
        int r = gm_frame_hdr_encode(c->m->tx_buf, c->proto_version ? c->proto_version : GM_PROTOCOL_VERSION,
                                    request_id, (uint32_t)body_len, (unsigned)n_fds);
        if (r < 0)
                return r;
        return body_len > GM_FRAME_BODY_MAX ? -EMSGSIZE : 0;
}

/* Send the frame in the manager's transmit buffer (header and body, @len bytes), or queue it. */
static int conn_send_frame(Conn *c, size_t len, int *fds, size_t n_fds)
{
        uint8_t *buf = c->m->tx_buf;
        OutPacket *p;
        int r;

        if (!c->out_head) {
                r = gm_wire_send(c->fd, buf, len, NULL, 0, fds, n_fds, MSG_DONTWAIT);
                if (r != -EAGAIN) {
                        gm_wire_close_fds(fds, n_fds);
                        if (r < 0)
                                conn_kill(c);
                        return r;
                }
        }

        if (c->out_bytes + len > CONN_OUT_MAX) {
                gm_wire_close_fds(fds, n_fds);
                conn_kill(c);
                return -ENOBUFS;
        }
        p = calloc(1, sizeof(*p));
        if (p)
                p->data = malloc(len);
        if (!p || !p->data) {
                free(p);
                gm_wire_close_fds(fds, n_fds);
                conn_kill(c);
                return -ENOMEM;
        }
        packet_fill(p, buf, len, fds, n_fds);
        c->out_bytes += len;
        out_append(c, p);
        if (!c->out_head->hole) {
                if (c->out_head == p)
                        send_timer_restart(c);
                event_add(c->wr_ev, NULL);
        }
        return 0;
}

int conn_slot_reserve(Conn *c, OutPacket **ret)
{
        OutPacket *p;

        if (c->dead)
                return -ECONNRESET;
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->hole = true;
        out_append(c, p);
        c->deferred++;
        *ret = p;
        return 0;
}

int conn_slot_fill(Conn *c, OutPacket *slot, uint32_t request_id, const Gpumem__Reply *reply, int *fds,
                   size_t n_fds)
{
        size_t body_len = gpumem__reply__get_packed_size(reply);
        int r;

        if (c->dead) {
                gm_wire_close_fds(fds, n_fds);
                return -ECONNRESET;
        }
        r = conn_frame_hdr(c, request_id, body_len, n_fds);
        if (r < 0) {
                gm_wire_close_fds(fds, n_fds);
                return r;
        }
        slot->data = malloc(GM_FRAME_HDR_SIZE + body_len);
        if (!slot->data) {
                gm_wire_close_fds(fds, n_fds);
                conn_kill(c);
                return -ENOMEM;
        }
        gpumem__reply__pack(reply, c->m->tx_buf + GM_FRAME_HDR_SIZE);
        packet_fill(slot, c->m->tx_buf, GM_FRAME_HDR_SIZE + body_len, fds, n_fds);
        slot->hole = false;
        c->out_bytes += slot->len;
        if (c->out_head == slot) {
                send_timer_restart(c);
                if (conn_flush(c) < 0)
                        conn_kill(c);
                else if (c->out_head && !c->out_head->hole)
                        event_add(c->wr_ev, NULL);
        }
        return 0;
}

void conn_deferred_end(Conn *c)
{
        if (--c->deferred == 0 && c->free_when_idle) {
                c->free_when_idle = false;
                conn_free(c);
        }
}

int conn_send(Conn *c, uint32_t request_id, const Gpumem__Reply *reply, int *fds, size_t n_fds)
{
        size_t body_len;
        int r;

        if (c->dead) {
                gm_wire_close_fds(fds, n_fds);
                return -ECONNRESET;
        }
        body_len = gpumem__reply__get_packed_size(reply);
        r = conn_frame_hdr(c, request_id, body_len, n_fds);
        if (r < 0) {
                gm_wire_close_fds(fds, n_fds);
                return r;
        }
        gpumem__reply__pack(reply, c->m->tx_buf + GM_FRAME_HDR_SIZE);
        return conn_send_frame(c, GM_FRAME_HDR_SIZE + body_len, fds, n_fds);
}

int conn_send_packed(Conn *c, uint32_t request_id, const uint8_t *body, size_t body_len)
{
        int r;

        if (c->dead)
                return -ECONNRESET;
        r = conn_frame_hdr(c, request_id, body_len, 0);
        if (r < 0)
                return r;
        memcpy(c->m->tx_buf + GM_FRAME_HDR_SIZE, body, body_len);
        return conn_send_frame(c, GM_FRAME_HDR_SIZE + body_len, NULL, 0);
}

int conn_send_error(Conn *c, uint32_t request_id, int code, const char *reason)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status st = GPUMEM__STATUS__INIT;

        st.has_code = true;
        st.code = code;
        st.reason = (char *)(reason ? reason : "");
        reply.status = &st;
        return conn_send(c, request_id, &reply, NULL, 0);
}

static void conn_on_read(evutil_socket_t fd, short what, void *userdata)
{
        Conn *c = userdata;
        Manager *m = c->m;

        for (int i = 0; i < CONN_FRAMES_PER_WAKEUP && !c->dead; i++) {
                int fds[GM_FRAME_MAX_FDS];
                size_t n_fds = 0;
                ssize_t n;

                if (m->stopping)
                        return;
                if (c->out_count >= conn_inflight_limit(c)) {
                        /* as many replies wait as this connection may have in flight: it waits, alone */
                        metrics_deny(m->metrics, DENY_INFLIGHT);
                        event_del(c->rd_ev);
                        return;
                }
                /* The buffer is shared by all connections: a short packet refused for its control data must
                 * not have its request id read from the previous packet's bytes. */
                memset(m->rx_buf, 0, GM_FRAME_HDR_SIZE);
                n = gm_wire_recv(c->fd, m->rx_buf, GM_FRAME_MAX, fds, &n_fds, MSG_DONTWAIT);
                if (n == -EAGAIN)
                        return;
                if (n == 0 || n == -ECONNRESET) {
                        conn_kill(c);
                        return;
                }
                if (n == -EMSGSIZE || n == -EPROTO) {
                        GmFrameHdr hdr;
                        (void)gm_frame_parse(m->rx_buf, GM_FRAME_HDR_SIZE, 0, GM_PROTOCOL_VERSION, &hdr,
                                             NULL);
                        request_violation(c, hdr.request_id, (int)n,
                                          n == -EMSGSIZE ? "frame larger than the maximum frame size"
                                                         : "ancillary data truncated or not SCM_RIGHTS");
                        return;
                }
                if (n < 0) {
                        conn_kill(c);
                        return;
                }
                request_handle(c, m->rx_buf, (size_t)n, fds, n_fds);
        }
}
