/* Clients carried across a restart: their sockets and books out of a stopping daemon, into the next one. */
#include "carry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "broker/broker.h"
#include "server/class-state.h"
#include "server/classes.h"
#include "config.h"
#include "server/conn.h"
#include "server/core.h"
#include "drivers/driver.h"
#include "frame.h"
#include "hashmap.h"
#include "base/log.h"
#include "config/policy.h"
#include "server/window.h"
#include "ops/request.h"

/* What this build writes: the format's revision (a test build stands for a later one with a higher one). */
#ifndef CARRY_REVISION
#define CARRY_REVISION HANDOVER_REVISION
#endif

/*
 * What cannot be carried yet: KFD events and queues live in the daemon's KFD context, which dies with the
 * daemon; of memory, host, device, managed and VMM memory and imports are carried today
 * (docs/reliability.md). A client holding anything else is not carried: the next daemon never sees its
 * socket, so the client gets -ECONNRESET (with the reason) as at a plain restart.
 */
static const char *not_carried_why(Conn *c, Reason *w)
{
        if (c->dead)
                return "closing";
        if (c->deferred || !transport_idle(&c->t))
                return "a request was still being answered";
        if (c->event_waits)
                return "it waits for KFD events";
        if (c->broker && broker_client_carry_check(c->broker, w) < 0)
                return w->msg;
        return NULL;
}

static int add_dup(HandoverFds *s, const char *name, int fd)
{
        int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);

        if (copy < 0)
                return -errno;
        return handover_fds_add(s, name, copy);
}

/*
 * The fds on their way into the channel, a message at a time: those it owns (copies made for the hand-over)
 * are closed once queued, so that collecting needs a batch of fds at most, not one per object.
 */
typedef struct FdVec {
        HandoverChannel *ch;
        int fd[HANDOVER_CHANNEL_BATCH];
        bool owned[HANDOVER_CHANNEL_BATCH];
        size_t n;
        int err;     /* the first failure to queue: nothing is queued after it */
        int fd_high; /* a copy numbered this high says the fd table is nearly full: queue at once */
} FdVec;

static int fdvec_flush(FdVec *v)
{
        int r = v->err ? v->err : handover_channel_send(v->ch, v->fd, v->n);

        for (size_t i = 0; i < v->n; i++)
                if (v->owned[i])
                        safe_close(v->fd[i]);
        v->n = 0;
        if (r < 0)
                v->err = r;
        return r;
}

/* Append @fd (taken when @owned, also on failure): its index in the channel, or a negative errno. */
static int fdvec_add(FdVec *v, int fd, bool owned)
{
        size_t index = v->ch->n + v->n;

        if (v->err || index > INT32_MAX) {
                if (owned)
                        safe_close(fd);
                return v->err ? v->err : -EMFILE;
        }
        v->fd[v->n] = fd;
        v->owned[v->n++] = owned;
        /* the kernel gives the lowest free number: a high one means few are left, and the next copy needs
         * one of them */
        if (v->n == HANDOVER_CHANNEL_BATCH || (owned && fd >= v->fd_high)) {
                int r = fdvec_flush(v);
                if (r < 0)
                        return r;
        }
        return (int)index;
}

/* What was not queued is closed. */
static void fdvec_done(FdVec *v)
{
        for (size_t i = 0; i < v->n; i++)
                if (v->owned[i])
                        safe_close(v->fd[i]);
        v->n = 0;
}

/* A managed allocation's SVM calls into its record. */
static int collect_svm(Gpumemd__HandoverObject *o, const BrokerCarry *k)
{
        if (!k->n_svm)
                return 0;
        o->svm = calloc(k->n_svm, sizeof(*o->svm));
        if (!o->svm)
                return -ENOMEM;
        for (size_t i = 0; i < k->n_svm; i++) {
                Gpumemd__HandoverSvmCall *c = calloc(1, sizeof(*c));
                if (!c)
                        return -ENOMEM;
                gpumemd__handover_svm_call__init(c);
                o->svm[o->n_svm++] = c;
                c->has_va = c->has_size = true;
                c->va = k->svm[i].va;
                c->size = k->svm[i].size;
                c->attrs = malloc(2 * k->svm[i].n * sizeof(uint32_t));
                if (!c->attrs)
                        return -ENOMEM;
                for (uint32_t j = 0; j < k->svm[i].n; j++) {
                        c->attrs[c->n_attrs++] = k->svm[i].a[j].type;
                        c->attrs[c->n_attrs++] = k->svm[i].a[j].value;
                }
        }
        return 0;
}

/* What collect_objects() fills. */
typedef struct Collect {
        Gpumemd__HandoverClient *h;
        FdVec *fds;
} Collect;

static int collect_object(void *arg, const BrokerCarry *k)
{
        Collect *col = arg;
        Gpumemd__HandoverClient *h = col->h;
        Gpumemd__HandoverObject *o, **v;
        int fd = k->fd, r;

        v = realloc(h->objects, (h->n_objects + 1) * sizeof(*v));
        o = v ? calloc(1, sizeof(*o)) : NULL;
        if (v)
                h->objects = v;
        if (!o) {
                safe_close(fd);
                return -ENOMEM;
        }
        h->objects[h->n_objects++] = o;
        /* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
        // clang-format off
        *o = (Gpumemd__HandoverObject){
                MSG_INIT(gpumemd__handover_object), OPT(handle, k->handle), OPT(kind, (uint32_t)k->kind),
                OPT(va, k->va), OPT(size, k->size), OPT(gpu_id, k->gpu_id), OPT(flags, k->flags),
                OPT(numa_node, k->numa_node), OPT(exports, k->exports), OPT(handed_out, k->handed_out),
                .mapped = malloc((k->n_mapped ? k->n_mapped : 1) * sizeof(uint32_t))
        };
        // clang-format on
        if (!o->mapped) {
                safe_close(fd);
                return -ENOMEM;
        }
        o->n_mapped = k->n_mapped;
        memcpy(o->mapped, k->mapped, k->n_mapped * sizeof(uint32_t));
        if (k->kind == BROKER_KIND_VMM || k->kind == BROKER_KIND_IMPORT) {
                o->has_client_refs = true;
                o->client_refs = k->client_refs;
        }
        if (k->kind == BROKER_KIND_IMPORT) {
                o->has_foreign = o->has_read_only = true;
                o->foreign = k->foreign;
                o->read_only = k->read_only;
        }
        if (k->kind == BROKER_KIND_SHARE) {
                o->share_name = (char *)k->share_name; /* the broker's, alive until the state is sealed */
                o->has_read_only = true;
                o->read_only = k->read_only;
        }
        r = collect_svm(o, k);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        if (fd < 0)
                return 0; /* a reservation: no memory of its own */
        r = fdvec_add(col->fds, fd, true);
        if (r < 0)
                return r;
        o->has_fd_index = true;
        o->fd_index = (uint32_t)r;
        return 0;
}

static int collect_map(void *arg, const BrokerCarryMap *k)
{
        Gpumemd__HandoverClient *h = ((Collect *)arg)->h;
        Gpumemd__HandoverVmmMap *m, **v;

        v = realloc(h->vmm_maps, (h->n_vmm_maps + 1) * sizeof(*v));
        m = v ? calloc(1, sizeof(*m)) : NULL;
        if (v)
                h->vmm_maps = v;
        if (!m)
                return -ENOMEM;
        gpumemd__handover_vmm_map__init(m);
        h->vmm_maps[h->n_vmm_maps++] = m;
        m->has_va = m->has_size = m->has_offset = m->has_handle = m->has_cpu_access = true;
        m->va = k->va;
        m->size = k->size;
        m->offset = k->offset;
        m->handle = k->handle;
        m->cpu_access = (uint32_t)k->cpu_access;
        if (k->n_grants) {
                m->grants = malloc(2 * k->n_grants * sizeof(uint32_t));
                if (!m->grants)
                        return -ENOMEM;
                for (size_t i = 0; i < k->n_grants; i++) {
                        m->grants[m->n_grants++] = k->grants[i].gpu_id;
                        m->grants[m->n_grants++] = (uint32_t)k->grants[i].access;
                }
        }
        return 0;
}

/* The client's objects and VMM mappings into @h, their files into @fds. */
static int collect_objects(Conn *c, Gpumemd__HandoverClient *h, FdVec *fds)
{
        Collect col = {h, fds};

        return c->broker ? broker_client_carry_each(c->broker, collect_object, collect_map, &col) : 0;
}

static void free_objects(Gpumemd__HandoverClient *h)
{
        for (size_t i = 0; i < h->n_objects; i++) {
                for (size_t j = 0; j < h->objects[i]->n_svm; j++) {
                        free(h->objects[i]->svm[j]->attrs);
                        free(h->objects[i]->svm[j]);
                }
                free(h->objects[i]->svm);
                free(h->objects[i]->mapped);
                free(h->objects[i]);
        }
        free(h->objects);
        for (size_t i = 0; i < h->n_vmm_maps; i++) {
                free(h->vmm_maps[i]->grants);
                free(h->vmm_maps[i]);
        }
        free(h->vmm_maps);
}

/* What collect_share() fills. */
typedef struct CollectShares {
        Gpumemd__HandoverShare **v;
        size_t n;
        FdVec *fds;
} CollectShares;

static int collect_share(void *arg, const BrokerCarryShare *k)
{
        CollectShares *col = arg;
        Gpumemd__HandoverShare *h, **v;
        int r;

        v = realloc(col->v, (col->n + 1) * sizeof(*v));
        h = v ? calloc(1, sizeof(*h)) : NULL;
        if (v)
                col->v = v;
        if (!h) {
                safe_close(k->fd);
                return -ENOMEM;
        }
        gpumemd__handover_share__init(h);
        col->v[col->n++] = h;
        /* the strings are the broker's, alive until the state is sealed */
        h->name = (char *)k->name;
        h->class_name = (char *)k->class_name;
        h->has_kind = h->has_gpu_id = h->has_va = h->has_size = h->has_read_only = h->has_persistent = true;
        h->has_owner_id = h->has_src_handle = h->has_published_real_usec = h->has_opens = true;
        h->kind = (uint32_t)k->kind;
        h->gpu_id = k->gpu_id;
        h->va = k->va;
        h->size = k->size;
        h->read_only = k->read_only;
        h->persistent = k->persistent;
        h->owner_id = k->owner_tag;
        h->src_handle = k->src_handle;
        h->published_real_usec = k->published_usec;
        h->opens = k->opens;
        r = fdvec_add(col->fds, k->fd, true);
        if (r < 0)
                return r;
        h->has_fd_index = true;
        h->fd_index = (uint32_t)r;
        return 0;
}

bool carry_conn_settled(Conn *c)
{
        return c->dead || (!c->deferred && transport_idle(&c->t));
}

/* The clients in the order they go: fewest objects first, so that a client holding many files is the one
 * whose files do not fit at the next daemon, or whose books are cut for size, and not those after it. */
typedef struct Leaving {
        Conn *c;
        size_t objects;
} Leaving;

static int leaving_cmp(const void *a, const void *b)
{
        const Leaving *x = a, *y = b;

        if (x->objects != y->objects)
                return x->objects < y->objects ? -1 : 1;
        return x->c->id < y->c->id ? -1 : x->c->id > y->c->id;
}

/* The books of all carried clients together stay under this (the shares' and the state's own come on top; a
 * test build sets a small one). */
#ifndef CARRY_CLIENTS_STATE_MAX
#define CARRY_CLIENTS_STATE_MAX (HANDOVER_STATE_MAX - (16u << 20))
#endif

/* Tell @c it is not carried: a connection-level error frame with @why (one closing reads nothing more). */
static void tell_not_carried(const CarryHost *host, Conn *c, const char *why)
{
        char told[320];

        conn_log(c, LOG_NOTICE, GM_MESSAGE_HANDOVER, NULL, "not carried over to the next gpumemd: %s", why);
        if (c->dead)
                return;
        snprintf(told, sizeof(told),
                 "gpumemd restarted and could not carry this connection over (%s): connect again", why);
        host->refuse_send(c->t.fd, -ECONNRESET, told);
}

/*
 * @c's record into @h and its files into the channel: NULL, or why it cannot be carried (@buf may hold the
 * words). Its books count into *@state_bytes, which they may not take over CARRY_CLIENTS_STATE_MAX.
 */
static const char *collect_client(Conn *c, Gpumemd__HandoverClient *h, FdVec *fds, size_t *state_bytes,
                                  char *buf, size_t len)
{
        size_t bytes;
        int r;

        gpumemd__handover_client__init(h);
        h->has_fd_index = h->has_pidfd_index = true;
        h->pidfd_index = -1;
        /* the socket and pidfd are queued as they are (the kernel takes its own reference) */
        r = fdvec_add(fds, c->t.fd, false);
        h->fd_index = r;
        if (r >= 0 && c->ident.pidfd >= 0)
                h->pidfd_index = r = fdvec_add(fds, c->ident.pidfd, false);
        if (r >= 0)
                r = collect_objects(c, h, fds);
        if (r < 0) {
                snprintf(buf, len, "%s", strerror(-r));
                return buf;
        }
        h->has_id = h->has_protocol_version = h->has_low_window = h->has_window_base = true;
        h->has_window_size = h->has_connected_real_usec = h->has_requests = true;
        h->id = c->id;
        h->name = c->name;
        h->protocol_version = c->proto_version;
        h->low_window = c->low_window;
        h->window_base = c->window ? c->window_base : 0;
        h->window_size = c->window ? c->window_size : 0;
        h->class_name = c->cls ? c->cls->name : NULL;
        h->cgroup = c->ident.cgroup;
        h->connected_real_usec = c->connected_real_usec;
        h->requests = c->requests;
        bytes = gpumemd__handover_client__get_packed_size(h);
        if (*state_bytes + bytes > CARRY_CLIENTS_STATE_MAX) {
                snprintf(buf, len, "its books (%zu bytes) do not fit in the state with the others'", bytes);
                return buf;
        }
        *state_bytes += bytes;
        return NULL;
}

/*
 * The named shares into @shares, their files into the channel. Where the channel is full the clients that
 * went in go on without the shares (their readers' opens are not taken back): 0 then; else as
 * broker_carry_shares_each().
 */
static int collect_shares(Manager *m, FdVec *fds, CollectShares *shares)
{
        int r;

        shares->fds = fds;
        r = broker_carry_shares_each(m->broker, collect_share, shares);
        if (r < 0 && fds->err) {
                log_full(LOG_WARNING, r, GM_MESSAGE_HANDOVER, NULL,
                         "the named shares are not carried: the hand-over's channel is full (%s)",
                         strerror(-r));
                for (size_t i = 0; i < shares->n; i++)
                        free(shares->v[i]);
                free(shares->v);
                *shares = (CollectShares){0};
                r = 0;
        }
        return r;
}

/*
 * One try at the hand-over: the listening socket, then (@clients) the clients in @order and the shares.
 * A client that cannot be carried is told why and left out, the others go on; an error returned means no
 * state could be made at all. @told marks whom this told already.
 */
static int collect_once(Manager *m, const CarryHost *host, HandoverFds *ret, const Leaving *order,
                        size_t n_order, bool clients, bool *told)
{
        Gpumemd__HandoverState st = GPUMEMD__HANDOVER_STATE__INIT;
        Gpumemd__HandoverClient *cv = NULL, **cp = NULL;
        size_t n = 0, dropped = 0, state_bytes = 0;
        int r = 0, state_fd = -1, channel = -1;
        CollectShares shares = {0};
        HandoverChannel ch = {-1, -1, 0};
        FdVec fds = {.ch = &ch, .fd_high = INT32_MAX};
        struct rlimit rl;

        *ret = (HandoverFds){0};
        if (n_order) {
                cv = calloc(n_order, sizeof(*cv));
                cp = calloc(n_order, sizeof(*cp));
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
        r = handover_channel_open(&ch);
        if (r < 0)
                goto out;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < INT32_MAX)
                fds.fd_high = (int)rl.rlim_cur - MANAGER_FD_RESERVE / 2;
        for (size_t i = 0; i < n_order; i++) {
                Conn *c = order[i].c;
                Gpumemd__HandoverClient *h = &cv[n];
                Reason w = {""};
                const char *why = clients ? not_carried_why(c, &w) : "the hand-over could not be made";
                char big[128];

                if (!why && fds.err)
                        why = "the hand-over's channel is full";
                if (why) {
                        if (!told[i])
                                tell_not_carried(host, c, why);
                        told[i] = true;
                        dropped++;
                        continue;
                }
                why = collect_client(c, h, &fds, &state_bytes, big, sizeof(big));
                if (why) {
                        /* what it queued stays unclaimed in the channel; the next daemon closes it */
                        free_objects(h);
                        tell_not_carried(host, c, why);
                        told[i] = true;
                        dropped++;
                        continue;
                }
                cp[n++] = h;
        }
        /* the named shares (their publishers' and readers' parts are the clients') */
        if (clients) {
                r = collect_shares(m, &fds, &shares);
                if (r < 0)
                        goto out;
                st.n_shares = shares.n;
                st.shares = shares.v;
        }
        {
                uint64_t base = 0, size = 0;
                broker_share_region_get(m->broker, &base, &size);
                st.has_share_region_base = st.has_share_region_size = true;
                st.share_region_base = base;
                st.share_region_size = size;
        }
        /* every fd of the clients through one socket: three names in the store, whatever their number; the
         * clients whose files did not go in are closed by the next daemon, with the reason */
        if (fdvec_flush(&fds) < 0)
                log_full(LOG_WARNING, fds.err, GM_MESSAGE_HANDOVER, NULL,
                         "the hand-over's channel took %zu fds and no more (%s): the clients whose files did "
                         "not go in are not carried",
                         ch.n, strerror(-fds.err));
        channel = handover_channel_finish(&ch);
        /* its other end is closed: it hangs up while stored, which systemd must not take for its end */
        r = handover_fds_add_no_poll(ret, HANDOVER_NAME_FDS, channel);
        if (r < 0)
                goto out;
        st.channel_name = (char *)HANDOVER_NAME_FDS;
        st.has_channel_fds = true;
        st.channel_fds = (uint32_t)ch.n;
        st.has_format = st.has_revision = st.has_written_real_usec = st.has_next_client_id = true;
        st.format = HANDOVER_FORMAT;
        st.revision = CARRY_REVISION;
#ifdef CARRY_FUTURE_FIELD
        /* the build that stands for a later gpumemd in the tests (gpumemd-next): its state has a field no
         * daemon of today knows, which an older reader must skip */
        /* protobuf-c writes an unknown field's bytes after its tag as they are: the length comes first */
        ProtobufCMessageUnknownField future = {
                .tag = 100,
                .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
                .len = 12,
                .data = (uint8_t *)"\x0b"
                                   "from-future",
        };
        st.base.n_unknown_fields = 1;
        st.base.unknown_fields = &future;
#endif
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
        for (size_t i = 0; i < shares.n; i++)
                free(shares.v[i]);
        free(shares.v);
        for (size_t i = 0; i < n; i++)
                free_objects(cp[i]);
        fdvec_done(&fds);
        handover_channel_abort(&ch);
        free(cv);
        free(cp);
        if (r < 0)
                handover_fds_done(ret);
        return r;
}

int carry_collect(Manager *m, const CarryHost *host, HandoverFds *ret)
{
        Leaving *order = NULL;
        bool *told = NULL;
        size_t n = 0;
        int r;

        for (Conn *c = m->conns; c; c = c->next)
                n++;
        order = n ? calloc(n, sizeof(*order)) : NULL;
        told = n ? calloc(n, sizeof(*told)) : NULL;
        if (n && (!order || !told)) {
                /* out of memory: none carried, none told, each sees its connection close */
                free(order);
                free(told);
                order = NULL;
                told = NULL;
        }
        n = 0;
        for (Conn *c = m->conns; c && order; c = c->next)
                order[n++] = (Leaving){c, c->broker ? broker_client_objects(c->broker) : 0};
        if (n)
                qsort(order, n, sizeof(*order), leaving_cmp);
        r = collect_once(m, host, ret, order, n, true, told);
        if (r < 0) {
                log_full(LOG_ERR, r, GM_MESSAGE_HANDOVER, NULL,
                         "cannot hand the clients over (%s): they are closed, the listening socket goes on",
                         strerror(-r));
                r = collect_once(m, host, ret, order, n, false, told);
        }
        if (r < 0 && m->listen_fd >= 0 && (m->listen_bound || m->handover == MANAGER_HANDOVER_EXEC)) {
                /* the socket alone, with no state: the next daemon listens on it */
                log_full(LOG_ERR, r, GM_MESSAGE_HANDOVER, NULL,
                         "cannot make a state to hand over (%s): only the listening socket goes on",
                         strerror(-r));
                r = add_dup(ret, HANDOVER_NAME_LISTEN, m->listen_fd);
        }
        free(order);
        free(told);
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

/* The fds that came through the channel; each is taken once. */
typedef struct Passed {
        int *fd;
        size_t n;
} Passed;

/* Take fd @index of the channel (-ENOENT when it did not come, or was taken). */
static int passed_take(Passed *p, int64_t index)
{
        int fd;

        if (index < 0 || (uint64_t)index >= p->n || p->fd[index] < 0)
                return -ENOENT;
        fd = p->fd[index];
        p->fd[index] = -1;
        return fd;
}

/* A record's SVM calls for the broker (the caller frees them); NULL without any, or out of memory. A call
 * with an odd or too long list of attributes keeps none, which the broker refuses. */
static BrokerSvmCall *restore_svm(const Gpumemd__HandoverObject *ho, BrokerCarry *k)
{
        BrokerSvmCall *v;

        if (!ho->n_svm)
                return NULL;
        v = calloc(ho->n_svm, sizeof(*v));
        if (!v)
                return NULL;
        for (size_t i = 0; i < ho->n_svm; i++) {
                const Gpumemd__HandoverSvmCall *c = ho->svm[i];
                v[i].va = c->va;
                v[i].size = c->size;
                if (c->n_attrs % 2 || c->n_attrs / 2 > BROKER_SVM_MAX_ATTRS)
                        continue;
                v[i].n = (uint32_t)(c->n_attrs / 2);
                for (uint32_t j = 0; j < v[i].n; j++)
                        v[i].a[j] = (BrokerSvmAttr){c->attrs[2 * j], c->attrs[2 * j + 1]};
        }
        k->svm = v;
        k->n_svm = ho->n_svm;
        return v;
}

/* The client's objects set up again (@imports: its imports and open shares, else all the others); a failure
 * drops it. */
static int restore_objects(const CarryHost *host, Conn *c, const Gpumemd__HandoverClient *h, Passed *passed,
                           bool imports)
{
        char reason[256];
        int r;

        for (size_t i = 0; i < h->n_objects; i++) {
                const Gpumemd__HandoverObject *ho = h->objects[i];
                if ((ho->kind == BROKER_KIND_IMPORT || ho->kind == BROKER_KIND_SHARE) != imports)
                        continue;
                /* Bin-packed by hand: clang-format puts a designated initializer one member to a line. */
                // clang-format off
                BrokerCarry k = {
                        .handle = ho->handle, .kind = (BrokerKind)ho->kind, .va = ho->va, .size = ho->size,
                        .gpu_id = ho->gpu_id, .flags = ho->flags,
                        .numa_node = ho->has_numa_node ? ho->numa_node : -1, .exports = ho->exports,
                        .handed_out = ho->handed_out, .client_refs = ho->has_client_refs ? ho->client_refs : 1,
                        .foreign = ho->foreign, .read_only = ho->read_only, .n_mapped = ho->n_mapped,
                        .fd = ho->has_fd_index ? passed_take(passed, ho->fd_index) : -ENOENT,
                };
                // clang-format on
                Reason w = {""};
                BrokerSvmCall *svm;
                k.share_name = ho->share_name;
                if ((k.kind == BROKER_KIND_RESERVATION || k.kind == BROKER_KIND_SHARE) && !ho->has_fd_index)
                        k.fd = -1; /* VA only, or a share's, whose memory comes with the share */
                else if (k.fd < 0) {
                        snprintf(reason, sizeof(reason), "the memory of handle 0x%llx was not handed over",
                                 (unsigned long long)ho->handle);
                        drop_conn(host, c, -EBADF, reason);
                        return -1;
                }
                if (ho->n_mapped > BROKER_MAX_GPUS)
                        k.n_mapped = BROKER_MAX_GPUS + 1; /* refused as such */
                else if (ho->n_mapped)                    /* mapped is NULL when empty */
                        memcpy(k.mapped, ho->mapped, ho->n_mapped * sizeof(uint32_t));
                svm = restore_svm(ho, &k);
                if (ho->n_svm && !svm) {
                        safe_close(k.fd);
                        drop_conn(host, c, -ENOMEM, "out of memory");
                        return -1;
                }
                r = broker_carry_restore(c->broker, &k, &w);
                free(svm);
                if (r < 0) {
                        snprintf(reason, sizeof(reason), "handle 0x%llx at 0x%llx cannot be set up again: %s",
                                 (unsigned long long)ho->handle, (unsigned long long)ho->va,
                                 reason_or_errno(&w, r));
                        drop_conn(host, c, r, reason);
                        return -1;
                }
        }
        return 0;
}

/* One client of the state, the first half: its connection, identity, class, window and objects but its
 * imports; NULL when it is dropped. Under the lock. */
static Conn *restore_begin(Manager *m, const CarryHost *host, const Gpumemd__HandoverClient *h,
                           bool named_twice, HandoverFds *fds, Passed *passed)
{
        char reason[256];
        Conn *c = NULL;
        int fd, pidfd, r;

        /* revision 1 named them as fds of their own; from 2 they come through the channel */
        fd = h->fd_name        ? handover_fds_take(fds, h->fd_name)
             : h->has_fd_index ? passed_take(passed, h->fd_index)
                               : -ENOENT;
        pidfd = h->pidfd_name        ? handover_fds_take(fds, h->pidfd_name)
                : h->has_pidfd_index ? passed_take(passed, h->pidfd_index)
                                     : -ENOENT;
        if (fd < 0) {
                log_warning("client %llu: its socket was not handed over", (unsigned long long)h->id);
                safe_close(pidfd);
                return NULL;
        }
        if (!h->has_id || h->id == 0 || h->id == UINT64_MAX || named_twice || manager_find_conn(m, h->id)) {
                safe_close(pidfd);
                drop(host, fd, h->id, -EINVAL, "the hand-over named it twice, or without an id");
                return NULL;
        }
        if (host->conn_new(m, fd, &c) < 0) {
                safe_close(pidfd);
                log_warning("client %llu: cannot set its connection up again", (unsigned long long)h->id);
                return NULL;
        }
        c->id = h->id; /* for its log lines from here (placing it gives it an id of its own again) */
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
                return NULL;
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
                        return NULL;
                }
        }
        if (h->n_objects || h->n_vmm_maps) {
                r = host->books(c);
                if (r < 0) {
                        drop_conn(host, c, r, "out of memory");
                        return NULL;
                }
        }
        if (restore_objects(host, c, h, passed, false) < 0)
                return NULL;
        if (c->broker)
                broker_carry_claim_shares(c->broker);
        return c;
}

/*
 * The second half, once every client's other objects are back: its imports (on the model an import of
 * another client's export finds that memory only once it is back), its VMM mappings, and its connection
 * going on where it was.
 */
static void restore_end(Manager *m, const CarryHost *host, const Gpumemd__HandoverClient *h, Conn *c,
                        Passed *passed)
{
        char reason[256];
        int r;

        if (restore_objects(host, c, h, passed, true) < 0)
                return;
        for (size_t i = 0; i < h->n_vmm_maps; i++) {
                const Gpumemd__HandoverVmmMap *hm = h->vmm_maps[i];
                BrokerCarryMap k = {.va = hm->va,
                                    .size = hm->size,
                                    .offset = hm->offset,
                                    .handle = hm->handle,
                                    .cpu_access = (int)hm->cpu_access,
                                    .n_grants = hm->n_grants / 2};
                Reason w = {""};
                if (hm->n_grants % 2 || k.n_grants > BROKER_MAX_GPUS) {
                        k.n_grants = BROKER_MAX_GPUS + 1; /* refused as such */
                } else {
                        for (size_t g = 0; g < k.n_grants; g++)
                                k.grants[g] = (BrokerAccess){hm->grants[2 * g], (int)hm->grants[2 * g + 1]};
                }
                r = broker_carry_restore_map(c->broker, &k, &w);
                if (r < 0) {
                        snprintf(reason, sizeof(reason), "its VMM mapping at 0x%llx cannot be made again: %s",
                                 (unsigned long long)hm->va, reason_or_errno(&w, r));
                        drop_conn(host, c, r, reason);
                        return;
                }
        }
        if (c->broker) {
                Reason w = {""};
                r = broker_carry_finish(c->broker, &w);
                if (r < 0) {
                        snprintf(reason, sizeof(reason), "%s", reason_or_errno(&w, r));
                        drop_conn(host, c, r, reason);
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

/* The named shares of the state, back in the shared region before their publishers and readers are. */
static void restore_shares(Manager *m, const Gpumemd__HandoverState *st, Passed *passed)
{
        uint64_t base = 0, size = 0;

        broker_share_region_get(m->broker, &base, &size);
        if (st->share_region_base != base || st->share_region_size != size) {
                log_full(
                        LOG_WARNING, -EXDEV, GM_MESSAGE_HANDOVER, NULL,
                        "the shared region was 0x%llx+0x%llx and is 0x%llx+0x%llx now: %zu share%s not taken "
                        "back, their readers and publishers are closed",
                        (unsigned long long)st->share_region_base, (unsigned long long)st->share_region_size,
                        (unsigned long long)base, (unsigned long long)size, st->n_shares,
                        st->n_shares == 1 ? "" : "s");
                return;
        }
        for (size_t i = 0; i < st->n_shares; i++) {
                const Gpumemd__HandoverShare *h = st->shares[i];
                /* Bin-packed by hand: clang-format puts a designated initializer one member to a line. */
                // clang-format off
                BrokerCarryShare k = {
                        .name = h->name, .kind = (BrokerKind)h->kind, .gpu_id = h->gpu_id, .va = h->va,
                        .size = h->size, .read_only = h->read_only, .persistent = h->persistent,
                        .owner_tag = h->owner_id, .src_handle = h->src_handle, .class_name = h->class_name,
                        .published_usec = h->published_real_usec, .opens = h->opens,
                        .fd = h->has_fd_index ? passed_take(passed, h->fd_index) : -ENOENT,
                };
                // clang-format on
                Reason w = {""};
                int r = broker_carry_share_restore(m->broker, &k, &w);
                if (r < 0)
                        log_full(LOG_WARNING, r, GM_MESSAGE_HANDOVER, NULL, "share '%s' not taken back: %s",
                                 h->name ? h->name : "", reason_or_errno(&w, r));
        }
}

static BrokerAccount *class_account(void *arg, const char *name)
{
        ClassState *cls = name && *name ? classes_find(arg, name) : NULL;
        return cls ? &cls->acct : NULL;
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
        HashMap ids = {0}; /* the clients begun, by id */
        Conn **begun = NULL;
        Passed passed = {0};
        unsigned taken = 0;
        int r;

        if (!st) {
                for (size_t i = 0; i < fds->n; i++)
                        log_full(LOG_WARNING, -ENOENT, GM_MESSAGE_HANDOVER, NULL,
                                 "'%s' was handed over without the state that names it (the service manager "
                                 "dropped or refused '%s'): closed",
                                 fds->v[i].name, HANDOVER_NAME_STATE);
                goto out;
        }
        if (st->backend && strcmp(st->backend, driver_name(m->drv)) != 0) {
                log_full(LOG_WARNING, -EXDEV, GM_MESSAGE_HANDOVER, NULL,
                         "the state handed over was written on the %s backend, this daemon runs %s: starting "
                         "clean",
                         st->backend, driver_name(m->drv));
                goto out;
        }
        if (st->channel_name) {
                int ch = handover_fds_take(fds, st->channel_name);
                if (st->has_channel_fds)
                        handover_fd_room(st->channel_fds);
                size_t lost = 0;
                r = ch < 0 ? ch : handover_channel_unpack(ch, &passed.fd, &passed.n, &lost);
                safe_close(ch);
                if (ch == -ENOENT)
                        log_full(
                                LOG_ERR, ch, GM_MESSAGE_HANDOVER, NULL,
                                "the fd store gave back no '%s' (the service manager dropped or refused it): "
                                "the %zu client%s handed over are closed",
                                st->channel_name, st->n_clients, st->n_clients == 1 ? "" : "s");
                else if (r == 0 && lost)
                        log_full(LOG_WARNING, -EMFILE, GM_MESSAGE_HANDOVER, NULL,
                                 "%zu of the %zu fds handed over did not fit in this daemon's fd table: the "
                                 "clients they belong to are closed",
                                 lost, passed.n);
                else if (r == 0 && st->has_channel_fds && passed.n != st->channel_fds)
                        log_full(LOG_WARNING, -EPROTO, GM_MESSAGE_HANDOVER, NULL,
                                 "%zu of the %u fds handed over came through: the clients that miss some are "
                                 "closed",
                                 passed.n, st->channel_fds);
                else if (r < 0)
                        log_full(LOG_WARNING, r, GM_MESSAGE_HANDOVER, NULL,
                                 "the fds handed over cannot be read (%s): their clients are closed",
                                 strerror(-r));
        }
        begun = st->n_clients ? calloc(st->n_clients, sizeof(*begun)) : NULL;
        if (st->n_clients && !begun) {
                log_full(LOG_WARNING, -ENOMEM, GM_MESSAGE_HANDOVER, NULL,
                         "out of memory taking the clients back: they are closed");
                goto out;
        }
        manager_lock(m);
        if (st->has_next_client_id && st->next_client_id > m->next_client_id)
                m->next_client_id = st->next_client_id;
        if (st->n_shares)
                restore_shares(m, st, &passed);
        /* two passes: every client's imports and open shares come once every client's other memory is back
         * (on the model an import finds the memory of another client's export only then) */
        for (size_t i = 0; i < st->n_clients; i++) {
                const Gpumemd__HandoverClient *h = st->clients[i];
                bool twice = h->has_id && hashmap_get(&ids, h->id) != NULL;
                begun[i] = restore_begin(m, host, h, twice, fds, &passed);
                if (begun[i] && hashmap_put(&ids, h->id, begun[i]) < 0) {
                        drop_conn(host, begun[i], -ENOMEM, "out of memory");
                        begun[i] = NULL;
                }
                if (h->has_id && h->id > m->next_client_id)
                        m->next_client_id = h->id;
        }
        if (st->n_shares)
                broker_carry_shares_unclaimed(m->broker, class_account, m);
        for (size_t i = 0; i < st->n_clients; i++) {
                unsigned before = m->n_conns;
                if (begun[i])
                        restore_end(m, host, st->clients[i], begun[i], &passed);
                taken += m->n_conns > before;
        }
        if (st->n_shares) {
                size_t ended = broker_carry_shares_settle(m->broker);
                if (ended)
                        log_full(LOG_NOTICE, 0, GM_MESSAGE_HANDOVER, NULL,
                                 "%zu share%s ended: their publishers did not come back", ended,
                                 ended == 1 ? "" : "s");
        }
        manager_unlock(m);
        log_full(LOG_INFO, 0, GM_MESSAGE_HANDOVER, NULL,
                 "took %u of %zu client%s back from gpumemd %s (state format %u revision %u)", taken,
                 st->n_clients, st->n_clients == 1 ? "" : "s", st->writer_version ? st->writer_version : "?",
                 st->format, st->revision);
out:
        free(begun);
        hashmap_done(&ids);
        for (size_t i = 0; i < passed.n; i++)
                safe_close(passed.fd[i]);
        free(passed.fd);
        if (st)
                gpumemd__handover_state__free_unpacked(st, NULL);
        /* what no client of the state claimed (or all of it, without a state): closed, so that no peer waits
         * on a socket nobody reads */
        handover_fds_done(fds);
}
