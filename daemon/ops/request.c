/* Request dispatch: the op table (handler, permission, since, fds) and the gate every request passes. */
#include "request.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "server/classes.h"
#include "envelope.h"
#include "base/metrics.h"
#include "view.h"
#include "base/log.h"
#include "server/core.h"
#include "server/window.h"
#include "wire.h"

/*
 * One row per op: its request is the Request oneof field (whose number is the op's wire number and whose
 * name is the op's name), its result the Reply oneof case the handler fills, the protocol version that
 * introduced it, who may call it, how many fds it takes and the policy family a class can be denied.
 */
typedef struct OpDesc {
        OpHandler fn;
        OpView view;                     /* the message read in place first, for the small ops (or NULL) */
        Gpumem__Reply__ResultCase reply; /* what a successful reply carries */
        uint8_t since;
        uint8_t perm;
        uint8_t max_fds;
        uint8_t family; /* POLICY_OP_* (alloc is checked by kind once decoded) */
        uint8_t lock;   /* OP_LOCK_*: what the handler runs under */
} OpDesc;

/*
 * What a handler runs under. Most ops touch only the calling client's own books and the broker, which
 * locks what clients share: they take the client's lock alone, so clients on other loops go on at the
 * same time. Ops that touch other connections, the classes, windows or the daemon's settings take the
 * manager's lock (and the client's inside it). Some touch nothing that changes.
 */
enum { OP_LOCK_MANAGER, OP_LOCK_CLIENT, OP_LOCK_NONE };

#define ROW_(field, handler, result, since_, perm_, fds, fam, lock_)                                         \
        ROW_V_(field, handler, NULL, result, since_, perm_, fds, fam, lock_)
#define ROW_V_(field, handler, view_, result, since_, perm_, fds, fam, lock_)                                \
        [GPUMEM__REQUEST__OP_##field] = {.fn = handler,                                                      \
                                         .view = view_,                                                      \
                                         .reply = GPUMEM__REPLY__RESULT_##result,                            \
                                         .since = since_,                                                    \
                                         .perm = perm_,                                                      \
                                         .max_fds = fds,                                                     \
                                         .family = fam,                                                      \
                                         .lock = lock_}
#define ROW(field, handler, result, since_, perm_, fds, fam)                                                 \
        ROW_(field, handler, result, since_, perm_, fds, fam, OP_LOCK_MANAGER)
/* An op on the client's own books (and the broker's shared ones, which lock themselves). */
#define ROW_CLIENT(field, handler, result, since_, fds, fam)                                                 \
        ROW_(field, handler, result, since_, OP_PERM_ANY, fds, fam, OP_LOCK_CLIENT)
/* An op whose handler reads only what never changes, or what its own connection's loop owns. */
#define ROW_UNLOCKED(field, handler, result, since_)                                                         \
        ROW_(field, handler, result, since_, OP_PERM_ANY, 0, 0, OP_LOCK_NONE)
/* The same for the small ops that read their message in place too (handler##_view). */
#define ROW_CLIENT_VIEW(field, handler, result, since_, fam)                                                 \
        ROW_V_(field, handler, handler##_view, result, since_, OP_PERM_ANY, 0, fam, OP_LOCK_CLIENT)
#define ROW_UNLOCKED_VIEW(field, handler, result, since_)                                                    \
        ROW_V_(field, handler, handler##_view, result, since_, OP_PERM_ANY, 0, 0, OP_LOCK_NONE)
#define ANY   OP_PERM_ANY
#define ADMIN OP_PERM_ADMIN

/* Indexed by the Request oneof field number: request.h's list of ops, a row each. */
#define OP_ROW_(kind, ...) kind(__VA_ARGS__),
static const OpDesc op_table[] = {REQUEST_OPS(OP_ROW_)};

/*
 * Each row's Request and Reply fields, found once: every request names its op and every reply its result,
 * and a search of the descriptors for them is a good part of a small op's way through the daemon. Filled
 * once for the process (pthread_once), read-only after.
 */
static struct {
        const ProtobufCFieldDescriptor *request, *reply;
} op_fields[ARRAY_SIZE(op_table)];
static pthread_once_t op_fields_once = PTHREAD_ONCE_INIT;

static void op_fields_find(void)
{
        for (uint32_t i = 0; i < ARRAY_SIZE(op_table); i++) {
                op_fields[i].request = gm_proto_field(&gpumem__request__descriptor, i);
                if (op_table[i].fn)
                        op_fields[i].reply =
                                gm_proto_field(&gpumem__reply__descriptor, (uint32_t)op_table[i].reply);
        }
}

/* Op @field's Request field, or NULL (no op of the table). */
static const ProtobufCFieldDescriptor *op_field(uint32_t field)
{
        (void)pthread_once(&op_fields_once, op_fields_find);
        return field < ARRAY_SIZE(op_table) ? op_fields[field].request
                                            : gm_proto_field(&gpumem__request__descriptor, field);
}

/* The Reply field of @r's result: its row's, found once. */
static const ProtobufCFieldDescriptor *reply_field(const ReqCtx *r)
{
        (void)pthread_once(&op_fields_once, op_fields_find);
        if (r->field < ARRAY_SIZE(op_table) && op_table[r->field].fn &&
            op_table[r->field].reply == r->reply_case)
                return op_fields[r->field].reply;
        return gm_proto_field(&gpumem__reply__descriptor, (uint32_t)r->reply_case);
}

/* The op's name: its Request field's, so there is no second list of names to keep. */
static const char *op_name(uint32_t field)
{
        const ProtobufCFieldDescriptor *f = op_field(field);
        return f ? f->name : "unknown";
}

int request_table_check(char *errbuf, size_t errlen)
{
        for (uint32_t i = 0; i < ARRAY_SIZE(op_table); i++) {
                const OpDesc *op = &op_table[i];
                const ProtobufCFieldDescriptor *rq, *rp;

                if (!op->fn)
                        continue;
                rq = protobuf_c_message_descriptor_get_field(&gpumem__request__descriptor, i);
                rp = protobuf_c_message_descriptor_get_field(&gpumem__reply__descriptor, (unsigned)op->reply);
                if (!rq || rq->type != PROTOBUF_C_TYPE_MESSAGE) {
                        snprintf(errbuf, errlen, "row %u is no op of Request", i);
                        return -EINVAL;
                }
                if (!rp || rp->type != PROTOBUF_C_TYPE_MESSAGE ||
                    !(rp->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) {
                        snprintf(errbuf, errlen, "op %s: result %d is no case of Reply's result", rq->name,
                                 (int)op->reply);
                        return -EINVAL;
                }
                if (op->since < 1 || op->since > GM_PROTOCOL_VERSION) {
                        snprintf(errbuf, errlen, "op %s: since %u is not a protocol version (1..%u)",
                                 rq->name, op->since, GM_PROTOCOL_VERSION);
                        return -EINVAL;
                }
                if (op->max_fds > GM_FRAME_MAX_FDS) {
                        snprintf(errbuf, errlen, "op %s: takes more fds than a frame carries", rq->name);
                        return -EINVAL;
                }
                /* the gate of an unlocked op must read nothing a reload changes */
                if (op->lock == OP_LOCK_NONE && (op->perm != OP_PERM_ANY || op->family || op->max_fds)) {
                        snprintf(errbuf, errlen, "op %s: unlocked, but gated by rights, policy or fds",
                                 rq->name);
                        return -EINVAL;
                }
        }
        return 0;
}

size_t request_op_count(void)
{
        size_t n = 0;
        for (size_t i = 0; i < ARRAY_SIZE(op_table); i++)
                n += op_table[i].fn != NULL;
        return n;
}

int reply_fail(ReqCtx *r, int code, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(r->reason.msg, sizeof(r->reason.msg), fmt, ap);
        va_end(ap);
        return code;
}

int reply_add_fd(ReqCtx *r, int fd)
{
        if (r->n_out_fds >= GM_FRAME_MAX_FDS) {
                safe_close(fd);
                return -E2BIG;
        }
        r->out_fds[r->n_out_fds] = fd;
        return (int)r->n_out_fds++;
}

int req_take_fd(ReqCtx *r, int32_t index, int *ret_fd)
{
        if (index < 0 || (size_t)index >= r->n_in_fds || r->in_fd_taken[index])
                return -EBADF;
        r->in_fd_taken[index] = true;
        *ret_fd = r->in_fds[index];
        return 0;
}

/* An error reply, in the request's slot when it was deferred. */
static void send_error(ReqCtx *r, int code, const char *reason)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status st = GPUMEM__STATUS__INIT;

        if (!r->slot) {
                (void)conn_send_error(r->c, r->id, code, reason);
                return;
        }
        st.has_code = true;
        st.code = code;
        st.reason = (char *)reason;
        reply.status = &st;
        (void)conn_slot_fill(r->c, r->slot, r->id, &reply, NULL, 0);
}

int reply_result(ReqCtx *r, void *result)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        const ProtobufCFieldDescriptor *f = reply_field(r);
        const ProtobufCMessage *msg = result;

        /* the row names the result; a handler that filled another is a bug, answered as one */
        if (!f || !msg || msg->descriptor != f->descriptor) {
                log_error("op %u: the handler's result is not the %s its table row names", r->field,
                          f ? f->name : "result");
                gm_wire_close_fds(r->out_fds, r->n_out_fds);
                r->n_out_fds = 0;
                return reply_fail(r, -EPROTO, "internal error: reply of the wrong type");
        }
        reply.result_case = r->reply_case;
        memcpy((char *)&reply + f->offset, &result, sizeof(result));
        return reply_ok(r, &reply);
}

int reply_empty(ReqCtx *r)
{
        Gpumem__Empty empty = GPUMEM__EMPTY__INIT;
        return reply_result(r, &empty);
}

int reply_ok(ReqCtx *r, Gpumem__Reply *reply)
{
        Gpumem__Status st = GPUMEM__STATUS__INIT;
        int n = (int)r->n_out_fds;
        int err;

        st.has_code = true;
        st.code = 0; /* no reason: absent, it reads as empty, and the status is two bytes */
        /* the caller's reply is packed below and not used after this call */
        reply->status = &st; // cppcheck-suppress autoVariables
        r->n_out_fds = 0;
        r->replied = true;
        err = r->slot ? conn_slot_fill(r->c, r->slot, r->id, reply, r->out_fds, (size_t)n)
                      : conn_send(r->c, r->id, reply, r->out_fds, (size_t)n);
        if (err == -EMSGSIZE) {
                /* The result does not fit in a frame: tell the client rather than leave it waiting. */
                send_error(r, -EMSGSIZE, "reply larger than the maximum frame size");
        }
        return 0;
}

int reply_ok_packed(ReqCtx *r, const uint8_t *body, size_t len)
{
        r->replied = true;
        if (conn_send_packed(r->c, r->id, body, len) == -EMSGSIZE)
                (void)conn_send_error(r->c, r->id, -EMSGSIZE, "reply larger than the maximum frame size");
        return 0;
}

int req_view_u64(ReqCtx *r, const uint8_t *msg, size_t len, int (*answer)(ReqCtx *r, uint64_t v))
{
        uint64_t v;
        bool has;

        return gm_u64_view(msg, len, &has, &v) < 0 ? REQ_NOT_VIEWED : answer(r, v);
}

int reply_result_packed(ReqCtx *r, uint8_t *buf, size_t len)
{
        uint8_t head[GM_REPLY_HEAD_MAX];
        size_t n = gm_reply_ok_head(head, (uint32_t)r->reply_case, len);
        uint8_t *at = buf + (GM_REPLY_HEAD_MAX - n); /* the head right before the result */

        /* a packed reply has no slot among deferred replies and carries no fds: a handler that needs either
         * is a bug, answered as one */
        if (r->slot || r->n_out_fds) {
                log_error("op %u: a packed reply for a deferred request or one with fds", r->field);
                gm_wire_close_fds(r->out_fds, r->n_out_fds);
                r->n_out_fds = 0;
                return reply_fail(r, -EPROTO, "internal error: reply of the wrong kind");
        }
        memcpy(at, head, n);
        return reply_ok_packed(r, at, n + len);
}

void request_violation(Conn *c, uint32_t request_id, int code, const char *reason)
{
        COUNTER_ADD(c->sh->stats.protocol_errors, 1);
        conn_log(c, LOG_WARNING, GM_MESSAGE_PROTOCOL_VIOLATION, &c->log_rl,
                 "protocol violation: %s (%s), closing", reason, strerror(-code));
        (void)conn_send_error(c, request_id, code, reason);
        conn_kill(c);
}

/* The op's number is the Request's first (and only) field: read its tag without decoding anything else. */
static int peek_op(const uint8_t *body, size_t len, uint32_t *ret_field)
{
        uint64_t tag = 0;

        for (size_t i = 0; i < len && i < 5; i++) {
                tag |= (uint64_t)(body[i] & 0x7f) << (7 * i);
                if (!(body[i] & 0x80)) {
                        if ((tag & 7) != 2) /* every op is a message: length-delimited */
                                return -EBADMSG;
                        *ret_field = (uint32_t)(tag >> 3);
                        return 0;
                }
        }
        return -EBADMSG;
}

/* What follows a handler's answer: the op's latency and outcome, and the denials it logs. */
static void request_account(ReqCtx *r, int err)
{
        Conn *c = r->c;
        Metrics *mt = c->sh->metrics;
        const char *name = r->name ? r->name : op_name(r->field);

        metrics_record(mt, r->field, name, err, (now_usec(CLOCK_MONOTONIC) - r->t0) * 1000);
        if (err == -EDQUOT) {
                metrics_deny(mt, DENY_QUOTA);
                if (c->cls)
                        __atomic_fetch_add(&c->cls->denials, 1, __ATOMIC_RELAXED);
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s over quota: %s", name,
                         r->reason.msg);
        } else if (err == -EACCES) {
                metrics_deny(mt, DENY_PERMISSION);
                if (c->cls)
                        __atomic_fetch_add(&c->cls->denials, 1, __ATOMIC_RELAXED);
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s denied: %s", name, r->reason.msg);
        }
}

static void *arena_alloc_cb(void *arena, size_t size)
{
        return arena_alloc(arena, size);
}

static void arena_free_cb(void *arena, void *p)
{
        arena_free(arena, p);
}

void request_handle(Conn *c, const uint8_t *buf, size_t len, int *fds, size_t n_fds)
{
        Manager *m = c->m;
        Shard *sh = c->sh;
        ReqCtx r;
        /* decoded into the loop's arena: no malloc per message on the way in */
        ProtobufCAllocator alloc = {arena_alloc_cb, arena_free_cb, &sh->req_arena};
        Gpumem__Request *req = NULL;
        const OpDesc *op = NULL;
        const char *name = NULL;
        const char *why = NULL;
        bool locked = false, client_locked = false;
        GmFrameHdr hdr;
        uint32_t field = 0;
        int err;

        req_ctx_init(&r);
        r.c = c;
        r.m = m;
        r.in_fds = fds;
        r.n_in_fds = n_fds;
        err = gm_frame_parse(buf, len, n_fds, GM_PROTOCOL_VERSION, &hdr, &why);
        r.id = hdr.request_id;
        if (err == 0 && hdr.request_id != 0 && hdr.body_len != 0 &&
            peek_op(buf + GM_FRAME_HDR_SIZE, hdr.body_len, &field) == 0 && field < ARRAY_SIZE(op_table) &&
            op_table[field].fn) {
                op = &op_table[field];
                name = r.name = op_name(field);
                r.field = field;
                r.reply_case = op->reply;
        }
        /* a well-formed request after hello runs under what its op needs; anything else under the manager's
         * lock, which ending the connection takes */
        if (op && c->proto_version && op->lock == OP_LOCK_CLIENT && n_fds <= op->max_fds) {
                conn_lock(c);
                client_locked = true;
        } else if (!(op && op->lock == OP_LOCK_NONE && c->proto_version && n_fds == 0)) {
                /* its loop is the only writer of the client's books besides it: no client lock needed */
                manager_lock(m);
                locked = true;
        }
        if (err < 0) {
                request_violation(c, hdr.request_id, err, why);
                goto out;
        }
        if (hdr.request_id == 0) {
                request_violation(c, 0, -EPROTO, "request id 0 is reserved for connection errors");
                goto out;
        }
        if (hdr.body_len == 0 || (!op && peek_op(buf + GM_FRAME_HDR_SIZE, hdr.body_len, &field) < 0)) {
                request_violation(c, hdr.request_id, -EBADMSG, "request body does not start with an op");
                goto out;
        }

        if (c->proto_version == 0 && field != GPUMEM__REQUEST__OP_HELLO) {
                request_violation(c, hdr.request_id, -EPROTO, "the first request must be hello");
                goto out;
        }
        if (n_fds > (op ? op->max_fds : 0)) {
                request_violation(c, hdr.request_id, -EPROTO, "fds sent with an op that takes fewer");
                goto out;
        }
        COUNTER_ADD(sh->stats.requests, 1);
        COUNTER_ADD(c->requests, 1);
        if (!op) {
                err = reply_fail(&r, -EOPNOTSUPP, "unknown op %u", field);
                goto fail;
        }
        if (op->since > c->proto_version && field != GPUMEM__REQUEST__OP_HELLO) {
                err = reply_fail(&r, -EOPNOTSUPP, "op %s needs protocol version %u", name, op->since);
                goto fail;
        }
        if (op->perm == OP_PERM_ADMIN && !c->admin) {
                COUNTER_ADD(sh->stats.denials, 1);
                metrics_deny(sh->metrics, DENY_ADMIN);
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s denied: not an administrator",
                         name);
                err = reply_fail(&r, -EACCES, "%s is for administrators only", name);
                goto fail;
        }
        if (op->family && c->cls && (READ_ONCE(c->cls->deny_ops) & op->family)) {
                COUNTER_ADD(sh->stats.denials, 1);
                metrics_deny(sh->metrics, DENY_PERMISSION);
                __atomic_fetch_add(&c->cls->denials, 1, __ATOMIC_RELAXED);
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s denied by class '%s'", name,
                         c->cls->name);
                err = reply_fail(&r, -EACCES, "class '%s' may not call %s", c->cls->name, name);
                goto fail;
        }

        /* Gate passed: only now decode. A small op reads its message in place when that is the body's one
         * field; any other form, and every other op, is decoded the general way. */
        if (op->view) {
                const uint8_t *msg;
                uint32_t id;
                size_t n;
                if (gm_request_op_view(buf + GM_FRAME_HDR_SIZE, hdr.body_len, &id, &msg, &n) == 0 &&
                    id == field) {
                        r.t0 = now_usec(CLOCK_MONOTONIC);
                        err = op->view(&r, msg, n);
                        if (err != REQ_NOT_VIEWED)
                                goto handled;
                }
        }
        /* The body is bounded by GM_FRAME_BODY_MAX, and so is what unpacking can allocate. */
        err = gm_request_unpack_op(&alloc, buf + GM_FRAME_HDR_SIZE, hdr.body_len, &req);
        if (err == 0)
                req = gpumem__request__unpack(&alloc, hdr.body_len, buf + GM_FRAME_HDR_SIZE);
        if (!req || (uint32_t)req->op_case != field) {
                if (!locked) {
                        /* the manager's lock comes before the client's, which is not needed under it */
                        if (client_locked)
                                conn_unlock(c);
                        client_locked = false;
                        manager_lock(m);
                }
                locked = true;
                request_violation(c, hdr.request_id, -EBADMSG,
                                  !req ? "request body is not a valid Request message"
                                       : "request carries more than one op");
                goto out;
        }

        r.t0 = now_usec(CLOCK_MONOTONIC);
        err = op->fn(&r, req);
handled:
        if (err == REQ_DEFERRED)
                goto out;
        request_account(&r, err);
        if (err >= 0 || r.replied)
                goto out;
fail:
        if (!r.reason.msg[0])
                snprintf(r.reason.msg, sizeof(r.reason.msg), "%s", strerror(-err));
        gm_wire_close_fds(r.out_fds, r.n_out_fds);
        (void)conn_send_error(c, r.id, err, r.reason.msg);
out:
        if (client_locked)
                conn_unlock(c);
        if (locked)
                manager_unlock(m);
        for (size_t i = 0; i < n_fds; i++)
                if (!r.in_fd_taken[i])
                        safe_close(fds[i]);
        /* what the arena gave goes with its reset; only what spilled over to malloc is freed one by one */
        if (req && sh->req_arena.spilled)
                gpumem__request__free_unpacked(req, &alloc);
        arena_reset(&sh->req_arena);
}

struct Req {
        ReqCtx ctx;
};

int req_defer(ReqCtx *r, Req **ret)
{
        Req *q = calloc(1, sizeof(*q));
        int err;

        if (!q)
                return -ENOMEM;
        q->ctx = *r;
        /* the received fds belong to the frame being handled, not to the request */
        q->ctx.in_fds = NULL;
        q->ctx.n_in_fds = 0;
        err = conn_slot_reserve(r->c, &q->ctx.slot);
        if (err < 0) {
                free(q);
                return err;
        }
        /* the reply fds attached so far go with it */
        r->n_out_fds = 0;
        *ret = q;
        return 0;
}

ReqCtx *req_ctx(Req *q)
{
        return &q->ctx;
}

void req_end(Req *q, int err)
{
        ReqCtx *r = &q->ctx;
        Conn *c = r->c;

        request_account(r, err);
        if (err < 0 && !r->replied) {
                if (!r->reason.msg[0])
                        snprintf(r->reason.msg, sizeof(r->reason.msg), "%s", strerror(-err));
                gm_wire_close_fds(r->out_fds, r->n_out_fds);
                r->n_out_fds = 0;
                send_error(r, err, r->reason.msg);
        }
        gm_wire_close_fds(r->out_fds, r->n_out_fds);
        free(q);
        conn_deferred_end(c);
}
