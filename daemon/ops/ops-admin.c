/* Administration ops: status, clients, disconnect, metrics, log level (administrators only). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/broker.h"
#include "server/classes.h"
#include "exposition.h"
#include "base/metrics.h"
#include "config.h"
#include "base/log.h"
#include "server/core.h"
#include "request.h"

int op_admin_status(ReqCtx *r, const Gpumem__Request *req)
{
        Manager *m = r->m;
        Gpumem__AdminStatusReply s = GPUMEM__ADMIN_STATUS_REPLY__INIT;
        uint32_t major = 0, minor = 0;

        driver_version(m->drv, &major, &minor);
        s.server_version = GPUMEMD_VERSION;
        s.backend = (char *)driver_name(m->drv);
        s.has_kfd_major = s.has_kfd_minor = s.has_private_gpu_vm = true;
        s.kfd_major = major;
        s.kfd_minor = minor;
        /* the isolation path: KFD secondary contexts, or one context for all */
        s.private_gpu_vm = driver_has(m->drv, DRIVER_CAP_PRIVATE_VM);
        s.has_uptime_usec = s.has_started_usec = true;
        s.uptime_usec = now_usec(CLOCK_MONOTONIC) - m->started_mono_usec;
        s.started_usec = m->started_real_usec;
        s.has_clients = s.has_gpus = true;
        s.clients = m->n_conns;
        s.gpus = (uint32_t)driver_gpu_count(m->drv);
        BrokerUsage u;
        broker_totals(m->broker, &u);
        s.has_allocations = s.has_bytes_device = s.has_bytes_host = s.has_bytes_managed = true;
        s.allocations = u.objects;
        s.bytes_device = u.device_bytes + u.vmm_bytes;
        s.bytes_host = u.host_bytes;
        s.bytes_managed = u.managed_bytes;
        s.has_requests = s.has_protocol_errors = s.has_pid = s.has_protocol_version = true;
        ManagerStats st;
        manager_stats(m, &st);
        s.requests = st.requests;
        s.protocol_errors = st.protocol_errors;
        s.pid = (uint32_t)getpid();
        s.protocol_version = GM_PROTOCOL_VERSION;
        s.preset = m->preset_name;
        s.has_va_windows = true;
        s.va_windows = (uint32_t)(thunk_va_space_count(m->va) - m->va_blocked);
        if (m->va_low)
                s.va_windows += (uint32_t)(thunk_va_space_count(m->va_low) - m->va_low_blocked);
        DriverStats ds;
        Gpumem__BackendStats ms;
        if (driver_stats(m->drv, &ds) == 0) {
                /* Bin-packed by hand: clang-format puts a designated initializer one member to a line. */
                // clang-format off
                ms = (Gpumem__BackendStats){
                        MSG_INIT(gpumem__backend_stats), OPT(contexts, ds.contexts), OPT(buffers, ds.buffers),
                        OPT(handles, ds.handles), OPT(imports, ds.imports), OPT(mappings, ds.mappings),
                        OPT(gem_handles, ds.gem_handles), OPT(svm_ranges, ds.svm_ranges),
                        OPT(system_bytes, ds.system_bytes), OPT(vram_bytes, ds.vram_bytes), OPT(queues, ds.queues)
                };
                // clang-format on
                s.model = &ms;
        }
        return reply_result(r, &s);
}

/*
 * What the items of a paged reply may take of a frame: its body less the reply's head (status, the result's
 * tag and length, `next`) with room to spare. A ClientInfo packs to 16 bytes at least, a GpuUsage to 4.
 */
#define PAGE_BYTES       (GM_FRAME_BODY_MAX - 1024)
#define PAGE_MAX_CLIENTS (PAGE_BYTES / 16)
#define PAGE_MAX_USAGE   (PAGE_BYTES / 4)

/* One client as admin_clients lists it, the usage of the GPUs it holds VRAM on in @usage (room for
 * BROKER_MAX_GPUS, pointed at by @usage_ptrs); how many of those it took. */
static size_t client_info(Conn *c, Gpumem__ClientInfo *i, Gpumem__GpuUsage *usage,
                          Gpumem__GpuUsage **usage_ptrs)
{
        BrokerUsage u;
        bool has_books;

        gpumem__client_info__init(i);
        i->has_client_id = i->has_pid = i->has_uid = i->has_gid = true;
        i->client_id = c->id;
        i->pid = (uint32_t)c->ident.pid;
        i->uid = c->ident.uid;
        i->gid = c->ident.gid;
        i->cgroup = c->ident.cgroup ? c->ident.cgroup : "";
        i->container = c->container;
        i->pod = c->pod;
        i->name = c->name ? c->name : "";
        i->class_name = c->cls ? c->cls->name : "";
        i->has_connected_usec = i->has_requests = i->has_admin = true;
        i->connected_usec = c->connected_real_usec;
        i->requests = READ_ONCE(c->requests);
        i->admin = c->admin;
        i->has_handles = i->has_fds = i->has_host_bytes = i->has_managed_bytes = true;
        /* its loop may be changing its books meanwhile */
        conn_lock(c);
        has_books = c->broker != NULL;
        if (has_books)
                broker_client_usage(c->broker, &u);
        conn_unlock(c);
        if (!has_books)
                return 0;
        i->handles = (uint32_t)u.objects;
        i->fds = u.held_fds;
        i->host_bytes = u.host_bytes;
        i->managed_bytes = u.managed_bytes;
        i->usage = usage_ptrs;
        for (uint32_t k = 0; k < u.n_gpus; k++) {
                Gpumem__GpuUsage *g = &usage[i->n_usage];
                if (!u.vram_bytes[k])
                        continue;
                gpumem__gpu_usage__init(g);
                g->has_gpu_id = g->has_vram_bytes = true;
                g->gpu_id = u.gpu_ids[k];
                g->vram_bytes = u.vram_bytes[k];
                usage_ptrs[i->n_usage++] = g;
        }
        return i->n_usage;
}

static int conn_id_cmp(const void *a, const void *b)
{
        uint64_t x = (*(Conn *const *)a)->id, y = (*(Conn *const *)b)->id;
        return x < y ? -1 : x > y;
}

int op_admin_clients(ReqCtx *r, const Gpumem__Request *req)
{
        Manager *m = r->m;
        const Gpumem__AdminClients *a = req->admin_clients;
        Gpumem__AdminClientsReply cr = GPUMEM__ADMIN_CLIENTS_REPLY__INIT;
        Gpumem__ClientInfo *infos = NULL, **ptrs;
        Gpumem__GpuUsage *usage = NULL, **usage_ptrs;
        Conn **list = calloc(m->n_conns ? m->n_conns : 1, sizeof(*list));
        size_t n_list = 0, n = 0, n_usage = 0, bytes = 0, max_items, max_usage;
        int err = -ENOMEM;

        if (!list)
                return reply_fail(r, -ENOMEM, "out of memory listing clients");
        for (Conn *c = m->conns; c && n_list < m->n_conns; c = c->next)
                if (!a->has_from || c->id >= a->from)
                        list[n_list++] = c;
        /* paged: in id order, so that `next` is where the next page starts whatever comes and goes */
        if (a->has_from)
                qsort(list, n_list, sizeof(*list), conn_id_cmp);
        max_items = a->has_from && n_list > PAGE_MAX_CLIENTS ? PAGE_MAX_CLIENTS : n_list;
        max_usage = (max_items ? max_items : 1) * BROKER_MAX_GPUS;
        if (a->has_from && max_usage > PAGE_MAX_USAGE)
                max_usage = PAGE_MAX_USAGE;
        if (!REPLY_ITEMS_NEW(infos, ptrs, max_items) || !REPLY_ITEMS_NEW(usage, usage_ptrs, max_usage))
                goto out;
        for (size_t k = 0; k < n_list; k++) {
                Gpumem__ClientInfo *i = &infos[n];
                if (n == max_items || n_usage + BROKER_MAX_GPUS > max_usage) {
                        cr.has_next = true;
                        cr.next = list[k]->id;
                        break;
                }
                n_usage += client_info(list[k], i, &usage[n_usage], &usage_ptrs[n_usage]);
                if (a->has_from) {
                        /* the item, its tag and its length */
                        bytes += gpumem__client_info__get_packed_size(i) + 4;
                        if (n > 0 && bytes > PAGE_BYTES) {
                                cr.has_next = true;
                                cr.next = list[k]->id;
                                break;
                        }
                }
                ptrs[n++] = i;
        }
        cr.n_clients = n;
        cr.clients = ptrs;
        err = 0;
out:
        err = err < 0 ? reply_fail(r, err, "out of memory listing clients") : reply_result(r, &cr);
        free(list);
        free(infos);
        free(usage);
        return err;
}

/* A disconnect of a client on another loop: done there, and answered here once it is. */
typedef struct Disconnect {
        Manager *m;
        Shard *from;
        Req *req;
        uint64_t id;
        bool found;
        LoopWork there, back; /* embedded: neither way can fail */
} Disconnect;

static void disconnect_reply(Disconnect *d)
{
        ReqCtx *r = req_ctx(d->req);

        req_end(d->req, d->found
                                ? reply_empty(r)
                                : reply_fail(r, -ESRCH, "no client with id %llu", (unsigned long long)d->id));
        free(d);
}

static void disconnect_answered(void *arg)
{
        Disconnect *d = arg;
        Manager *m = d->m;

        manager_lock(m);
        disconnect_reply(d);
        manager_unlock(m);
}

static void disconnect_target(Conn *target)
{
        (void)conn_send_error(target, 0, -ECONNABORTED, "disconnected by an administrator");
        conn_kill(target);
}

static void disconnect_there(void *arg)
{
        Disconnect *d = arg;
        Manager *m = d->m;
        Conn *target;

        manager_lock(m);
        target = manager_find_conn(m, d->id);
        d->found = target != NULL;
        if (target)
                disconnect_target(target);
        manager_unlock(m);
        loop_post_work(d->from->loop, &d->back, disconnect_answered, d);
}

int op_admin_disconnect(ReqCtx *r, const Gpumem__Request *req)
{
        uint64_t id = req->admin_disconnect->client_id;
        Conn *target = manager_find_conn(r->m, id);
        Disconnect *d;
        int err;

        if (!target)
                return reply_fail(r, -ESRCH, "no client with id %llu", (unsigned long long)id);
        if (target == r->c)
                return reply_fail(r, -EINVAL, "a client cannot disconnect itself this way");
        conn_log(r->c, LOG_NOTICE, GM_MESSAGE_ADMIN_ACTION, NULL, "disconnected client %llu",
                 (unsigned long long)id);
        if (target->sh == r->c->sh && target->started) {
                disconnect_target(target);
                return reply_empty(r);
        }
        /* its socket belongs to its own loop: the kill goes there, behind its start if that is still to
         * come, and the reply waits for it, so that the client's next call already fails */
        d = calloc(1, sizeof(*d));
        if (!d)
                return reply_fail(r, -ENOMEM, "out of memory");
        d->m = r->m;
        d->from = r->c->sh;
        d->id = id;
        err = req_defer(r, &d->req);
        if (err < 0) {
                free(d);
                return reply_fail(r, err, "cannot wait for the disconnect: %s", strerror(-err));
        }
        loop_post_work(target->sh->loop, &d->there, disconnect_there, d);
        return REQ_DEFERRED;
}

/* The part of the text @t (@len bytes) from @off on that fits a page: whole lines, unless one is longer than
 * a page. */
static size_t page_of_text(const char *t, size_t len, size_t off)
{
        size_t n = len - off;

        if (n <= PAGE_BYTES)
                return n;
        for (n = PAGE_BYTES; n > 0 && t[off + n - 1] != '\n'; n--)
                ;
        return n ? n : PAGE_BYTES;
}

/* A paged text's cursor: its token above the byte offset of the part. */
#define CURSOR_OFFSET_BITS 40
#define CURSOR_OFFSET_MASK ((1ull << CURSOR_OFFSET_BITS) - 1)
/* Texts a connection may be reading at once (its threads share it): the oldest goes beyond. */
#define PAGED_KEPT 4

/* A new text of @c to read part by part (it takes @text), or NULL when out of memory. */
static PagedText *paged_new(Conn *c, char *text, size_t len)
{
        PagedText *t = calloc(1, sizeof(*t)), **at = &c->paged;

        if (!t)
                return NULL;
        /* from a count of the connection's own, so that no cursor of a text it finished or dropped ever
         * reads a newer one; never 0, which asks for a new text */
        t->token = c->paged_seq = c->paged_seq % 0xffffff + 1;
        t->text = text;
        t->len = len;
        t->next = c->paged;
        c->paged = t;
        for (unsigned i = 0; *at && i < PAGED_KEPT; i++)
                at = &(*at)->next;
        while (*at) {
                PagedText *old = *at;
                *at = old->next;
                free(old->text);
                free(old);
        }
        return t;
}

static void paged_done(Conn *c, PagedText *t)
{
        for (PagedText **at = &c->paged; *at; at = &(*at)->next)
                if (*at == t) {
                        *at = t->next;
                        break;
                }
        free(t->text);
        free(t);
}

static PagedText *paged_find(Conn *c, uint32_t token)
{
        PagedText *t = c->paged;

        while (t && t->token != token)
                t = t->next;
        return t;
}

int op_admin_metrics(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__AdminMetrics *a = req->admin_metrics;
        Gpumem__AdminMetricsReply mr = GPUMEM__ADMIN_METRICS_REPLY__INIT;
        Conn *c = r->c;
        PagedText *t;
        char *text = NULL, save;
        size_t len = 0, off = 0, n;
        int err;

        if (!a->has_cursor || a->cursor == 0) {
                if (metrics_render(r->m, &text, &len) < 0)
                        return reply_fail(r, -ENOMEM, "out of memory building metrics");
                if (!a->has_cursor) {
                        mr.text = text;
                        err = reply_result(r, &mr);
                        free(text);
                        return err;
                }
                /* paged: the text stays with the connection until its last part went */
                t = paged_new(c, text, len);
                if (!t) {
                        free(text);
                        return reply_fail(r, -ENOMEM, "out of memory building metrics");
                }
        } else {
                off = a->cursor & CURSOR_OFFSET_MASK;
                t = paged_find(c, (uint32_t)(a->cursor >> CURSOR_OFFSET_BITS));
                if (!t || off >= t->len)
                        return reply_fail(r, -ESTALE,
                                          "cursor 0x%llx is in no metrics text being read: start at 0",
                                          (unsigned long long)a->cursor);
        }
        n = page_of_text(t->text, t->len, off);
        mr.text = t->text + off;
        mr.has_next = true;
        mr.next = off + n < t->len ? (uint64_t)t->token << CURSOR_OFFSET_BITS | (off + n) : 0;
        /* the text is a string on the wire: cut it there for the packing */
        save = mr.text[n];
        mr.text[n] = '\0';
        err = reply_result(r, &mr);
        mr.text[n] = save;
        if (!mr.next)
                paged_done(c, t);
        return err;
}

int op_admin_set_log_level(ReqCtx *r, const Gpumem__Request *req)
{
        const char *s = req->admin_set_log_level->level;
        int level = s ? log_level_from_string(s) : -EINVAL;

        if (level < 0)
                return reply_fail(r, -EINVAL, "unknown log level '%s'", s ? s : "");
        log_set_level(level);
        conn_log(r->c, LOG_NOTICE, GM_MESSAGE_ADMIN_ACTION, NULL, "set the log level to %s",
                 log_level_to_string(level));
        return reply_empty(r);
}

/* ---- allocations, quotas --------------------------------------------------------------------------- */

#define ALLOC_PAGE_MAX 1000

static Conn *conn_at_or_after(Manager *m, uint64_t id)
{
        Conn *best = NULL;
        for (Conn *c = m->conns; c; c = c->next)
                if (c->id >= id && (!best || c->id < best->id))
                        best = c;
        return best;
}

int op_admin_allocations(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__AdminAllocations *a = req->admin_allocations;
        Manager *m = r->m;
        Gpumem__AdminAllocationsReply ar;
        size_t limit = a->limit && a->limit < ALLOC_PAGE_MAX ? a->limit : ALLOC_PAGE_MAX;
        /* cursor: client id in the high 32 bits, the position in its table in the low 32 */
        uint64_t cid = a->cursor >> 32, next = 0;
        size_t pos = a->cursor & 0xffffffffu, n = 0;
        BrokerObjInfo *objs = calloc(limit, sizeof(*objs));
        Gpumem__AllocationInfo *infos = NULL, **ptrs;
        uint64_t *client_of = calloc(limit, sizeof(*client_of));
        int err;

        if (!objs || !client_of || !REPLY_ITEMS_NEW(infos, ptrs, limit)) {
                err = reply_fail(r, -ENOMEM, "out of memory listing allocations");
                goto out;
        }
        if (a->client_id && !manager_find_conn(m, a->client_id)) {
                err = reply_fail(r, -ESRCH, "no client with id %llu", (unsigned long long)a->client_id);
                goto out;
        }
        if (a->client_id && cid < a->client_id) {
                cid = a->client_id;
                pos = 0;
        }
        for (Conn *c = conn_at_or_after(m, cid ? cid : 1); c && n < limit;
             c = conn_at_or_after(m, c->id + 1)) {
                if (a->client_id && c->id != a->client_id)
                        break;
                if (c->id != cid)
                        pos = 0;
                size_t cursor = pos, got = 0;
                conn_lock(c);
                if (c->broker)
                        got = broker_client_list(c->broker, &cursor, objs + n, limit - n);
                conn_unlock(c);
                for (size_t k = 0; k < got; k++)
                        client_of[n + k] = c->id;
                n += got;
                if (n == limit && cursor) {
                        next = c->id << 32 | (uint64_t)cursor;
                        break;
                }
                if (n == limit) {
                        Conn *after = conn_at_or_after(m, c->id + 1);
                        if (after && (!a->client_id || after->id == a->client_id))
                                next = after->id << 32;
                }
        }
        for (size_t i = 0; i < n; i++) {
                BrokerObjInfo *b = &objs[i];
                Gpumem__MemKind kind = b->kind == BROKER_KIND_RESERVATION
                                               ? GPUMEM__MEM_KIND__MEM_KIND_UNSPECIFIED
                                               : (Gpumem__MemKind)b->kind;
                /* Bin-packed by hand: clang-format puts a designated initializer one member to a line. */
                // clang-format off
                infos[i] = (Gpumem__AllocationInfo){
                        MSG_INIT(gpumem__allocation_info), OPT(client_id, client_of[i]), OPT(id, b->handle),
                        OPT(kind, kind), OPT(size, b->size), OPT(gpu_id, b->gpu_id), OPT(va, b->va),
                        .n_mapped_gpus = b->n_mapped, .mapped_gpus = b->mapped, OPT(exports, b->exports)
                };
                // clang-format on
                ptrs[i] = &infos[i];
        }
        ar = (Gpumem__AdminAllocationsReply){MSG_INIT(gpumem__admin_allocations_reply), .n_allocations = n,
                                             .allocations = ptrs, OPT(next_cursor, next)};
        err = reply_result(r, &ar);
out:
        free(objs);
        free(infos);
        free(client_of);
        return err;
}

static int fill_class(const Manager *m, ClassState *s, Gpumem__ClassQuota *q, Gpumem__QuotaEntry *e,
                      Gpumem__QuotaEntry **ep)
{
        size_t n = 0, ngpu = broker_gpu_count(m->broker);

        gpumem__class_quota__init(q);
        q->class_name = s->name;
        for (int res = 0; res < _POLICY_RES_MAX; res++) {
                gpumem__quota_entry__init(&e[n]);
                e[n].has_resource = e[n].has_gpu_id = e[n].has_limit = e[n].has_used = true;
                e[n].resource = (Gpumem__Resource)(res + 1);
                classes_get(m, s, (PolicyResource)res, 0, &e[n].used, &e[n].limit);
                ep[n] = &e[n];
                n++;
        }
        for (size_t g = 0; g < ngpu; g++) {
                gpumem__quota_entry__init(&e[n]);
                e[n].has_resource = e[n].has_gpu_id = e[n].has_limit = e[n].has_used = true;
                e[n].resource = GPUMEM__RESOURCE__RESOURCE_VRAM_BYTES;
                e[n].gpu_id = broker_gpu_id(m->broker, g);
                classes_get(m, s, POLICY_RES_VRAM, e[n].gpu_id, &e[n].used, &e[n].limit);
                ep[n] = &e[n];
                n++;
        }
        q->n_entries = n;
        q->entries = ep;
        return 0;
}

int op_admin_quota_get(ReqCtx *r, const Gpumem__Request *req)
{
        const char *want = req->admin_quota_get->class_name;
        Manager *m = r->m;
        Gpumem__AdminQuotaGetReply qr = GPUMEM__ADMIN_QUOTA_GET_REPLY__INIT;
        size_t n_classes = 0, per = _POLICY_RES_MAX + BROKER_MAX_GPUS, i = 0;
        Gpumem__ClassQuota *qs = NULL, **qp;
        Gpumem__QuotaEntry *es = NULL, **ep;
        int err;

        for (ClassState *s = m->classes; s; s = s->next)
                n_classes++;
        if (want && *want && !classes_find(m, want))
                return reply_fail(r, -ENOENT, "no class named '%s'", want);
        if (!REPLY_ITEMS_NEW(qs, qp, n_classes) ||
            !REPLY_ITEMS_NEW(es, ep, (n_classes ? n_classes : 1) * per)) {
                err = reply_fail(r, -ENOMEM, "out of memory");
                goto out;
        }
        for (ClassState *s = m->classes; s; s = s->next) {
                if (want && *want && strcmp(want, s->name) != 0)
                        continue;
                fill_class(m, s, &qs[i], es + i * per, ep + i * per);
                qp[i] = &qs[i];
                i++;
        }
        qr.n_classes = i;
        qr.classes = qp;
        err = reply_result(r, &qr);
out:
        free(qs);
        free(es);
        return err;
}

/* A client's own class, as an administrator's admin_quota_get answers for it: any client may ask. */
int op_quota(ReqCtx *r, const Gpumem__Request *req)
{
        Gpumem__AdminQuotaGetReply qr = GPUMEM__ADMIN_QUOTA_GET_REPLY__INIT;
        Gpumem__QuotaEntry es[_POLICY_RES_MAX + BROKER_MAX_GPUS], *ep[_POLICY_RES_MAX + BROKER_MAX_GPUS];
        Gpumem__ClassQuota q, *qp = &q;

        (void)req;
        if (!r->c->cls)
                return reply_fail(r, -ENOENT, "this connection has no class");
        fill_class(r->m, r->c->cls, &q, es, ep);
        qr.n_classes = 1;
        qr.classes = &qp;
        return reply_result(r, &qr);
}

int op_admin_quota_set(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__AdminQuotaSet *a = req->admin_quota_set;
        ClassState *s = a->class_name ? classes_find(r->m, a->class_name) : NULL;
        char why[256];
        int err;

        if (!s)
                return reply_fail(r, -ENOENT, "no class named '%s'", a->class_name ? a->class_name : "");
        if (!a->has_resource || a->resource == GPUMEM__RESOURCE__RESOURCE_UNSPECIFIED ||
            (int)a->resource > _POLICY_RES_MAX)
                return reply_fail(r, -EINVAL, "unknown resource %d", (int)a->resource);
        if (!a->has_limit)
                return reply_fail(r, -EINVAL, "no limit given");
        err = classes_set_limit(r->m, s, (PolicyResource)(a->resource - 1), a->gpu_id, a->limit, a->force,
                                why, sizeof(why));
        if (err < 0)
                return reply_fail(r, err, "%s", why);
        {
                char f_cls[96], f_res[64], f_lim[64], f_old[300], f_gpu[48], lim[24];
                const char *fields[] = {f_cls, f_res, f_lim, f_old, f_gpu, NULL};
                snprintf(f_cls, sizeof(f_cls), "GPUMEM_CLASS=%s", s->name);
                snprintf(f_res, sizeof(f_res), "GPUMEM_RESOURCE=%s",
                         policy_resource_name((PolicyResource)(a->resource - 1)));
                /* UINT64_MAX is no limit: said so, not as 18446744073709551615 */
                if (a->limit == UINT64_MAX)
                        snprintf(lim, sizeof(lim), "unlimited");
                else
                        snprintf(lim, sizeof(lim), "%llu", (unsigned long long)a->limit);
                snprintf(f_lim, sizeof(f_lim), "GPUMEM_LIMIT=%s", lim);
                snprintf(f_old, sizeof(f_old), "GPUMEM_OLD_LIMIT=%s", why);
                snprintf(f_gpu, sizeof(f_gpu), "GPUMEM_GPU=%u", a->gpu_id);
                log_full(LOG_NOTICE, 0, GM_MESSAGE_QUOTA_CHANGE, fields,
                         "client %llu (uid %u) set class '%s' %s%s limit to %s (was %s)%s",
                         (unsigned long long)r->c->id, (unsigned)r->c->ident.uid, s->name,
                         policy_resource_name((PolicyResource)(a->resource - 1)), a->gpu_id ? " per-GPU" : "",
                         lim, why, a->force ? ", forced" : "");
        }
        return reply_empty(r);
}
