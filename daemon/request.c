/* Request dispatch: the op table (handler, permission, since, fds) and the gate every request passes. */
#include "request.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "broker.h"
#include "classes.h"
#include "metrics.h"
#include "log.h"
#include "manager.h"
#include "window.h"
#include "wire.h"

typedef struct OpDesc {
        const char *name;
        OpHandler fn;
        uint8_t since;
        uint8_t perm;
        uint8_t max_fds; /* fds a request of this op may carry */
        uint8_t family;  /* POLICY_OP_* a class can be denied (alloc is checked by kind once decoded) */
} OpDesc;

#define OPF(field, n, handler, perm_, fds, fam)                                                              \
        [GPUMEM__REQUEST__OP_##field] = {                                                                    \
                .name = n, .fn = handler, .since = 1, .perm = perm_, .max_fds = fds, .family = fam}
#define OP(field, n, handler, perm_, fds) OPF(field, n, handler, perm_, fds, 0)

/* Indexed by the Request oneof field number, which is also the op's wire number. */
static const OpDesc op_table[] = {
        OP(HELLO, "hello", op_hello, OP_PERM_ANY, 0),
        OP(PING, "ping", op_ping, OP_PERM_ANY, 0),
        OP(WINDOW_RETRY, "window_retry", op_window_retry, OP_PERM_ANY, 0),
        OP(TOPOLOGY, "topology", op_topology, OP_PERM_ANY, 0),
        OP(MEM_INFO, "mem_info", op_mem_info, OP_PERM_ANY, 0),
        OP(POINTER_INFO, "pointer_info", op_pointer_info, OP_PERM_ANY, 0),
        OP(ALLOC, "alloc", op_alloc, OP_PERM_ANY, 0),
        OP(FREE, "free", op_free, OP_PERM_ANY, 0),
        OP(MAP, "map", op_map, OP_PERM_ANY, 0),
        OP(UNMAP, "unmap", op_unmap, OP_PERM_ANY, 0),
        OPF(VMM_RESERVE, "vmm_reserve", op_vmm_reserve, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_FREE, "vmm_free", op_vmm_free, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_CREATE, "vmm_create", op_vmm_create, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_RELEASE, "vmm_release", op_vmm_release, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_MAP, "vmm_map", op_vmm_map, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_UNMAP, "vmm_unmap", op_vmm_unmap, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_SET_ACCESS, "vmm_set_access", op_vmm_set_access, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_GET_ACCESS, "vmm_get_access", op_vmm_get_access, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OP(VMM_GRANULARITY, "vmm_granularity", op_vmm_granularity, OP_PERM_ANY, 0),
        OPF(VMM_RETAIN, "vmm_retain", op_vmm_retain, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(VMM_PROPERTIES, "vmm_properties", op_vmm_properties, OP_PERM_ANY, 0, POLICY_OP_VMM),
        OPF(DMABUF_EXPORT, "dmabuf_export", op_dmabuf_export, OP_PERM_ANY, 0, POLICY_OP_EXPORT),
        OPF(DMABUF_IMPORT, "dmabuf_import", op_dmabuf_import, OP_PERM_ANY, 1, POLICY_OP_IMPORT),
        OPF(SVM_SET_ATTR, "svm_set_attr", op_svm_set_attr, OP_PERM_ANY, 0, POLICY_OP_SVM),
        OPF(SVM_GET_ATTR, "svm_get_attr", op_svm_get_attr, OP_PERM_ANY, 0, POLICY_OP_SVM),
        OPF(SVM_PREFETCH, "svm_prefetch", op_svm_prefetch, OP_PERM_ANY, 0, POLICY_OP_SVM),
        OP(ADMIN_STATUS, "admin_status", op_admin_status, OP_PERM_ADMIN, 0),
        OP(ADMIN_CLIENTS, "admin_clients", op_admin_clients, OP_PERM_ADMIN, 0),
        OP(ADMIN_ALLOCATIONS, "admin_allocations", op_admin_allocations, OP_PERM_ADMIN, 0),
        OP(ADMIN_QUOTA_GET, "admin_quota_get", op_admin_quota_get, OP_PERM_ADMIN, 0),
        OP(ADMIN_QUOTA_SET, "admin_quota_set", op_admin_quota_set, OP_PERM_ADMIN, 0),
        OP(ADMIN_DISCONNECT, "admin_disconnect", op_admin_disconnect, OP_PERM_ADMIN, 0),
        OP(ADMIN_METRICS, "admin_metrics", op_admin_metrics, OP_PERM_ADMIN, 0),
        OP(ADMIN_SET_LOG_LEVEL, "admin_set_log_level", op_admin_set_log_level, OP_PERM_ADMIN, 0),
};

int reply_fail(ReqCtx *r, int code, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
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

int reply_ok(ReqCtx *r, Gpumem__Reply *reply)
{
        Gpumem__Status st = GPUMEM__STATUS__INIT;
        int n = (int)r->n_out_fds;
        int err;

        st.has_code = true;
        st.code = 0;
        st.reason = "";
        reply->status = &st;
        r->n_out_fds = 0;
        r->replied = true;
        err = conn_send(r->c, r->id, reply, r->out_fds, (size_t)n);
        if (err == -EMSGSIZE) {
                /* The result does not fit in a frame: tell the client rather than leave it waiting. */
                (void)conn_send_error(r->c, r->id, -EMSGSIZE, "reply larger than the maximum frame size");
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

void request_violation(Conn *c, uint32_t request_id, int code, const char *reason)
{
        Manager *m = c->m;

        m->stats.protocol_errors++;
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

void request_handle(Conn *c, const uint8_t *buf, size_t len, int *fds, size_t n_fds)
{
        Manager *m = c->m;
        ReqCtx r = {.c = c, .m = m, .in_fds = fds, .n_in_fds = n_fds};
        Gpumem__Request *req = NULL;
        const OpDesc *op = NULL;
        const char *why = NULL;
        GmFrameHdr hdr;
        uint32_t field = 0;
        int err;

        err = gm_frame_parse(buf, len, n_fds, GM_PROTOCOL_VERSION, &hdr, &why);
        r.id = hdr.request_id;
        if (err < 0) {
                request_violation(c, hdr.request_id, err, why);
                goto out;
        }
        if (hdr.request_id == 0) {
                request_violation(c, 0, -EPROTO, "request id 0 is reserved for connection errors");
                goto out;
        }
        if (hdr.body_len == 0 || peek_op(buf + GM_FRAME_HDR_SIZE, hdr.body_len, &field) < 0) {
                request_violation(c, hdr.request_id, -EBADMSG, "request body does not start with an op");
                goto out;
        }
        if (field < ARRAY_SIZE(op_table) && op_table[field].fn)
                op = &op_table[field];

        if (c->proto_version == 0 && field != GPUMEM__REQUEST__OP_HELLO) {
                request_violation(c, hdr.request_id, -EPROTO, "the first request must be hello");
                goto out;
        }
        if (n_fds > (op ? op->max_fds : 0)) {
                request_violation(c, hdr.request_id, -EPROTO, "fds sent with an op that takes fewer");
                goto out;
        }
        m->stats.requests++;
        c->requests++;
        if (!op) {
                err = reply_fail(&r, -EOPNOTSUPP, "unknown op %u", field);
                goto fail;
        }
        if (op->since > c->proto_version && field != GPUMEM__REQUEST__OP_HELLO) {
                err = reply_fail(&r, -EOPNOTSUPP, "op %s needs protocol version %u", op->name, op->since);
                goto fail;
        }
        if (op->perm == OP_PERM_ADMIN && !c->admin) {
                m->stats.denials++;
                metrics_deny(m->metrics, DENY_ADMIN);
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s denied: not an administrator",
                         op->name);
                err = reply_fail(&r, -EACCES, "%s is for administrators only", op->name);
                goto fail;
        }
        if (op->family && c->cls && (c->cls->deny_ops & op->family)) {
                m->stats.denials++;
                metrics_deny(m->metrics, DENY_PERMISSION);
                c->cls->denials++;
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s denied by class '%s'", op->name,
                         c->cls->name);
                err = reply_fail(&r, -EACCES, "class '%s' may not call %s", c->cls->name, op->name);
                goto fail;
        }

        /* Gate passed: only now decode. The body is bounded by GM_FRAME_BODY_MAX, and so is what unpacking
         * can allocate. */
        req = gpumem__request__unpack(NULL, hdr.body_len, buf + GM_FRAME_HDR_SIZE);
        if (!req) {
                request_violation(c, hdr.request_id, -EBADMSG, "request body is not a valid Request message");
                goto out;
        }
        if ((uint32_t)req->op_case != field) {
                request_violation(c, hdr.request_id, -EBADMSG, "request carries more than one op");
                goto out;
        }

        {
                uint64_t t0 = now_usec(CLOCK_MONOTONIC);
                err = op->fn(&r, req);
                metrics_record(m->metrics, field, op->name, err, (now_usec(CLOCK_MONOTONIC) - t0) * 1000);
        }
        if (err == -EDQUOT) {
                metrics_deny(m->metrics, DENY_QUOTA);
                if (c->cls)
                        c->cls->denials++;
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s over quota: %s", op->name,
                         r.reason);
        } else if (err == -EACCES) {
                metrics_deny(m->metrics, DENY_PERMISSION);
                if (c->cls)
                        c->cls->denials++;
                conn_log(c, LOG_NOTICE, GM_MESSAGE_DENIED, &c->log_rl, "%s denied: %s", op->name, r.reason);
        }
        if (err >= 0 || r.replied)
                goto out;
fail:
        if (!r.reason[0])
                snprintf(r.reason, sizeof(r.reason), "%s", strerror(-err));
        gm_wire_close_fds(r.out_fds, r.n_out_fds);
        (void)conn_send_error(c, r.id, err, r.reason);
out:
        for (size_t i = 0; i < n_fds; i++)
                if (!r.in_fd_taken[i])
                        safe_close(fds[i]);
        if (req)
                gpumem__request__free_unpacked(req, NULL);
}

void request_conn_teardown(Conn *c)
{
        /* objects first (they live in the window), then the window itself; a client with many objects goes
         * in slices between other clients' requests */
        if (c->broker && broker_client_records(c->broker) > MANAGER_TEARDOWN_SLICE &&
            manager_reap(c->m, c->broker, c) == 0) {
                c->broker = NULL;
                return;
        }
        c->broker = broker_client_free(c->broker);
        window_release(c);
}
