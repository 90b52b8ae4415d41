/* Clients carried across a restart: their sockets and books out of a stopping daemon, into the next one. */
#include "carry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "class-state.h"
#include "classes.h"
#include "config.h"
#include "conn.h"
#include "core.h"
#include "driver.h"
#include "frame.h"
#include "log.h"
#include "policy.h"
#include "window.h"

/*
 * What cannot be carried yet: memory objects, KFD events and queues live in the daemon's KFD context, which
 * dies with the daemon (docs/reliability.md). A client holding any is not carried: the next daemon never
 * sees its socket, so the client gets -ECONNRESET as at a plain restart.
 */
static const char *not_carried_why(Conn *c)
{
        BrokerUsage u;

        if (c->dead)
                return "closing";
        if (c->deferred || !transport_idle(&c->t))
                return "a request was still being answered";
        if (c->event_waits)
                return "it waits for KFD events";
        if (!c->broker)
                return NULL;
        broker_client_usage(c->broker, &u);
        if (broker_client_objects(c->broker) || u.objects || u.queues || u.held_fds)
                return "it holds memory, events or queues, which do not survive the KFD context yet";
        if (broker_client_private_vm(c->broker))
                return "it has a GPU VM of its own";
        return NULL;
}

bool carry_conn_settled(Conn *c)
{
        return c->dead || (!c->deferred && transport_idle(&c->t));
}

static int add_dup(HandoverFds *s, const char *name, int fd)
{
        int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);

        if (copy < 0)
                return -errno;
        return handover_fds_add(s, name, copy);
}

int carry_collect(Manager *m, HandoverFds *ret)
{
        Gpumemd__HandoverState st = GPUMEMD__HANDOVER_STATE__INIT;
        Gpumemd__HandoverClient *cv = NULL, **cp = NULL;
        char fd_names[2][HANDOVER_NAME_MAX];
        size_t n = 0, cap = 0, dropped = 0;
        int r = 0, state_fd = -1;

        *ret = (HandoverFds){0};
        for (Conn *c = m->conns; c; c = c->next)
                cap++;
        if (cap) {
                cv = calloc(cap, sizeof(*cv));
                cp = calloc(cap, sizeof(*cp));
                if (!cv || !cp) {
                        r = -ENOMEM;
                        goto out;
                }
        }
        /* the listening socket, so that clients that connect meanwhile wait in its backlog: one the daemon
         * bound, or any across an exec (socket activation's stays with systemd for the next start) */
        if (m->listen_fd >= 0 && (m->listen_bound || m->handover == MANAGER_HANDOVER_EXEC)) {
                r = add_dup(ret, HANDOVER_NAME_LISTEN, m->listen_fd);
                if (r < 0)
                        goto out;
                st.listen_name = (char *)HANDOVER_NAME_LISTEN;
                st.has_listen_bound = true;
                st.listen_bound = m->listen_bound;
        }
        for (Conn *c = m->conns; c && n < cap; c = c->next) {
                Gpumemd__HandoverClient *h = &cv[n];
                const char *why = not_carried_why(c);
                if (why) {
                        conn_log(c, LOG_NOTICE, GM_MESSAGE_HANDOVER, NULL,
                                 "not carried over to the next gpumemd: %s", why);
                        dropped++;
                        continue;
                }
                snprintf(fd_names[0], sizeof(fd_names[0]), "gm-client-%llu", (unsigned long long)c->id);
                snprintf(fd_names[1], sizeof(fd_names[1]), "gm-pidfd-%llu", (unsigned long long)c->id);
                r = add_dup(ret, fd_names[0], c->t.fd);
                if (r == 0 && c->ident.pidfd >= 0)
                        r = add_dup(ret, fd_names[1], c->ident.pidfd);
                if (r < 0)
                        goto out;
                gpumemd__handover_client__init(h);
                h->has_id = h->has_protocol_version = h->has_low_window = h->has_window_base = true;
                h->has_window_size = h->has_connected_real_usec = h->has_requests = true;
                h->id = c->id;
                h->fd_name = strdup(fd_names[0]);
                h->pidfd_name = c->ident.pidfd >= 0 ? strdup(fd_names[1]) : NULL;
                h->name = c->name;
                h->protocol_version = c->proto_version;
                h->low_window = c->low_window;
                h->window_base = c->window ? c->window_base : 0;
                h->window_size = c->window ? c->window_size : 0;
                h->class_name = c->cls ? c->cls->name : NULL;
                h->cgroup = c->ident.cgroup;
                h->connected_real_usec = c->connected_real_usec;
                h->requests = c->requests;
                cp[n++] = h;
                if (!h->fd_name || (c->ident.pidfd >= 0 && !h->pidfd_name)) {
                        r = -ENOMEM;
                        goto out;
                }
        }
        st.has_format = st.has_revision = st.has_written_real_usec = st.has_next_client_id = true;
        st.format = HANDOVER_FORMAT;
        st.revision = HANDOVER_REVISION;
        st.writer_version = (char *)GPUMEMD_VERSION;
        st.written_real_usec = now_usec(CLOCK_REALTIME);
        st.next_client_id = m->next_client_id;
        st.socket_path = m->opts.socket_path;
        st.backend = (char *)driver_name(m->drv);
        st.n_clients = n;
        st.clients = cp;
        r = handover_state_seal(&st, &state_fd);
        if (r == 0)
                r = handover_fds_add(ret, HANDOVER_NAME_STATE, state_fd);
        if (r == 0)
                log_full(LOG_INFO, 0, GM_MESSAGE_HANDOVER, NULL,
                         "handing %zu client%s over to the next gpumemd (%zu not carried)", n,
                         n == 1 ? "" : "s", dropped);
out:
        for (size_t i = 0; i < n; i++) {
                free(cv[i].fd_name);
                free(cv[i].pidfd_name);
        }
        free(cv);
        free(cp);
        if (r < 0)
                handover_fds_done(ret);
        return r;
}

static void start_cb(void *arg)
{
        conn_start(arg);
}

/* Refuse a carried socket: a connection-level error frame (request id 0), then close. */
static void drop(const CarryHost *host, int fd, uint64_t id, int code, const char *why)
{
        log_full(LOG_NOTICE, code, GM_MESSAGE_HANDOVER, NULL,
                 "client %llu handed over but not taken back: %s", (unsigned long long)id, why);
        host->refuse_send(fd, code, why);
        safe_close(fd);
}

/* The same for a connection set up already (not placed): freed. */
static void drop_conn(const CarryHost *host, Conn *c, int code, const char *why)
{
        conn_log(c, LOG_NOTICE, GM_MESSAGE_HANDOVER, NULL, "not taken back: %s", why);
        host->refuse_send(c->t.fd, code, why);
        conn_free(c);
}

/* One client of the state: its connection set up again as it was. Under the lock. */
static void restore_one(Manager *m, const CarryHost *host, const Gpumemd__HandoverClient *h, HandoverFds *fds)
{
        char reason[256];
        Conn *c = NULL;
        int fd, pidfd, r;

        fd = h->fd_name ? handover_fds_take(fds, h->fd_name) : -ENOENT;
        pidfd = h->pidfd_name ? handover_fds_take(fds, h->pidfd_name) : -ENOENT;
        if (fd < 0) {
                log_warning("client %llu: its socket was not handed over", (unsigned long long)h->id);
                safe_close(pidfd);
                return;
        }
        if (!h->has_id || h->id == 0 || manager_find_conn(m, h->id)) {
                safe_close(pidfd);
                drop(host, fd, h->id, -EINVAL, "the hand-over named it twice, or without an id");
                return;
        }
        if (host->conn_new(m, fd, &c) < 0) {
                safe_close(pidfd);
                log_warning("client %llu: cannot set its connection up again", (unsigned long long)h->id);
                return;
        }
        /* the identity stays the one frozen at accept: the pidfd and cgroup the old daemon took then */
        if (pidfd >= 0) {
                safe_close(c->ident.pidfd);
                c->ident.pidfd = pidfd;
        }
        if (h->cgroup) {
                char *cg = strdup(h->cgroup);
                if (cg) {
                        free(c->ident.cgroup);
                        c->ident.cgroup = cg;
                        policy_container_of(cg, c->container, sizeof(c->container), c->pod, sizeof(c->pod));
                }
        }
        r = classes_admit(m, c, reason, sizeof(reason));
        if (r < 0) {
                drop_conn(host, c, r, reason);
                return;
        }
        if (h->class_name && strcmp(h->class_name, c->cls->name) != 0)
                conn_log(c, LOG_NOTICE, GM_MESSAGE_HANDOVER, NULL,
                         "was in class '%s', the policy now puts it in '%s'", h->class_name, c->cls->name);
        c->low_window = h->low_window;
        if (h->window_size) {
                r = window_restore(c, h->window_base, h->window_size);
                if (r < 0) {
                        snprintf(reason, sizeof(reason),
                                 "its VA window 0x%llx+0x%llx cannot be taken here: %s",
                                 (unsigned long long)h->window_base, (unsigned long long)h->window_size,
                                 strerror(-r));
                        drop_conn(host, c, -EADDRINUSE, reason);
                        return;
                }
        }
        if (h->name) {
                free(c->name);
                c->name = strdup(h->name);
        }
        if (h->protocol_version) {
                c->proto_version =
                        (uint16_t)(h->protocol_version < GM_PROTOCOL_VERSION ? h->protocol_version
                                                                             : GM_PROTOCOL_VERSION);
                c->t.version = c->proto_version;
                c->admin = classes_is_admin(m, c);
        }
        if (h->connected_real_usec)
                c->connected_real_usec = h->connected_real_usec;
        c->requests = h->requests;
        {
                uint64_t next = m->next_client_id; /* placing takes a new id: it keeps its own */
                host->place(m, c, host->pick_shard(m));
                m->next_client_id = next;
                c->id = h->id;
        }
        if (c->sh->index == 0)
                conn_start(c);
        else
                loop_post_work(c->sh->loop, &c->start_work, start_cb, c);
        conn_log(c, LOG_INFO, GM_MESSAGE_HANDOVER, NULL,
                 "taken back from the previous gpumemd, window 0x%llx+0x%llx",
                 (unsigned long long)c->window_base, (unsigned long long)c->window_size);
}

Gpumemd__HandoverState *carry_read_state(HandoverFds *fds)
{
        Gpumemd__HandoverState *st = NULL;
        char why[256] = "";
        int fd, r;

        fd = handover_fds_take(fds, HANDOVER_NAME_STATE);
        if (fd < 0)
                return NULL;
        r = handover_state_open(fd, &st, why, sizeof(why));
        safe_close(fd);
        if (r < 0) {
                log_full(LOG_WARNING, r, GM_MESSAGE_HANDOVER, NULL,
                         "the state handed over cannot be read, starting clean: %s", why);
                return NULL;
        }
        return st;
}

void carry_restore(Manager *m, const CarryHost *host, Gpumemd__HandoverState *st, HandoverFds *fds)
{
        unsigned taken = 0;

        if (!st) {
                if (fds->n)
                        log_warning("%zu fds were handed over without a state to name them: closed", fds->n);
                goto out;
        }
        if (st->backend && strcmp(st->backend, driver_name(m->drv)) != 0) {
                log_full(LOG_WARNING, -EXDEV, GM_MESSAGE_HANDOVER, NULL,
                         "the state handed over was written on the %s backend, this daemon runs %s: starting "
                         "clean",
                         st->backend, driver_name(m->drv));
                goto out;
        }
        manager_lock(m);
        if (st->has_next_client_id && st->next_client_id > m->next_client_id)
                m->next_client_id = st->next_client_id;
        for (size_t i = 0; i < st->n_clients; i++) {
                unsigned before = m->n_conns;
                restore_one(m, host, st->clients[i], fds);
                taken += m->n_conns > before;
                if (st->clients[i]->has_id && st->clients[i]->id > m->next_client_id)
                        m->next_client_id = st->clients[i]->id;
        }
        manager_unlock(m);
        log_full(LOG_INFO, 0, GM_MESSAGE_HANDOVER, NULL,
                 "took %u of %zu client%s back from gpumemd %s (state format %u revision %u)", taken,
                 st->n_clients, st->n_clients == 1 ? "" : "s", st->writer_version ? st->writer_version : "?",
                 st->format, st->revision);
out:
        if (st)
                gpumemd__handover_state__free_unpacked(st, NULL);
        /* what no client of the state claimed (or all of it, without a state): closed, so that no peer waits
         * on a socket nobody reads */
        handover_fds_done(fds);
}
