/* Request dispatch: frame check → op lookup → version and permission gate → decode → handler → reply. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "server/conn.h"
#include "frame.h"
#include "gpumem.pb-c.h"
#include "reason.h"

/* What a handler gets: the connection, the request id, and room for the reason and reply fds. */
typedef struct ReqCtx {
        Conn *c;
        Manager *m;
        uint32_t id;
        const int *in_fds; /* borrowed fds that came with the request */
        size_t n_in_fds;
        bool in_fd_taken[GM_FRAME_MAX_FDS];
        int out_fds[GM_FRAME_MAX_FDS]; /* owned fds to send with the reply */
        size_t n_out_fds;
        bool replied;
        uint32_t field;                       /* the op */
        const char *name;                     /* its name (NULL: looked up when needed) */
        Gpumem__Reply__ResultCase reply_case; /* what its successful reply carries (its table row) */
        TransportPacket *slot;                /* a deferred request's place in the reply queue */
        uint64_t t0;                          /* when it began, for the op's latency */
        Reason reason; /* why it failed, for the reply; last: req_ctx_init() clears only its first byte */
} ReqCtx;

/* @r cleared for a new request but its reason's buffer, which only a failure writes (a string). */
static inline void req_ctx_init(ReqCtx *r)
{
        memset(r, 0, offsetof(ReqCtx, reason));
        r->reason.msg[0] = '\0';
}

/*
 * A handler returns 0 after reply_ok(), or a negative errno after reply_fail() set the reason, or
 * REQ_DEFERRED after req_defer(): then the request finishes later (req_end).
 */
#define REQ_DEFERRED 1
typedef int (*OpHandler)(ReqCtx *r, const Gpumem__Request *req);
/*
 * A small op's message read in place (view.h) when it is the request's one field: the handler decodes it
 * and answers as above, or returns REQ_NOT_VIEWED having done nothing, for a form it leaves to the general
 * way (protobuf-c's decoding and the op's OpHandler).
 */
#define REQ_NOT_VIEWED 2
typedef int (*OpView)(ReqCtx *r, const uint8_t *msg, size_t len);
/* For an OpView: a message whose one field is an optional uint64 (Ping, PointerInfoGet) read in place and
 * handed to @answer (absent: 0), or REQ_NOT_VIEWED. */
int req_view_u64(ReqCtx *r, const uint8_t *msg, size_t len, int (*answer)(ReqCtx *r, uint64_t v));

enum {
        OP_PERM_ANY = 0,   /* any connected client */
        OP_PERM_ADMIN = 1, /* administrator identities only */
};

/* Every row of the op table names a Request op, a Reply result, a protocol version and a frame's fds. */
int request_table_check(char *errbuf, size_t errlen);
size_t request_op_count(void);

/* Handle one received packet; takes ownership of @fds. */
void request_handle(Conn *c, const uint8_t *buf, size_t len, int *fds, size_t n_fds);
/* A protocol violation: log it (rate-limited), send one error reply, close the connection. */
void request_violation(Conn *c, uint32_t request_id, int code, const char *reason);
/*
 * Send the successful reply with @result, a message of the type the op's table row names (checked);
 * takes the fds added with reply_add_fd. reply_empty() is the same for ops whose result is Empty.
 */
int reply_result(ReqCtx *r, void *result);
int reply_empty(ReqCtx *r);
/* Send a reply the handler built whole (the envelope included). */
int reply_ok(ReqCtx *r, Gpumem__Reply *reply);
/* Send a successful reply packed earlier (a Reply with its status, no fds; not for a deferred request). */
int reply_ok_packed(ReqCtx *r, const uint8_t *body, size_t len);
/*
 * The same for a result the handler packed itself (view.h's writers: the small ops, where building and
 * walking protobuf-c's messages costs more than the rest of the reply): @len bytes at @buf +
 * GM_REPLY_HEAD_MAX, of the type the op's table row names; the Reply's head goes in the room before them.
 */
int reply_result_packed(ReqCtx *r, uint8_t *buf, size_t len);
/* Record why the request failed; returns @code (negative errno) for "return reply_fail(...)". */
int reply_fail(ReqCtx *r, int code, const char *fmt, ...) _printf_(3, 4);
/* Attach an owned fd to the reply; returns its index, or a negative errno (and closes @fd). */
int reply_add_fd(ReqCtx *r, int fd);
/* Take the request's fd at @index (bounds-checked against the header's count): -EBADF when out of range. */
int req_take_fd(ReqCtx *r, int32_t index, int *ret_fd);

/*
 * Finish the request later, for work that must leave the event loop. The request keeps its place among the
 * connection's replies (later replies wait behind it) and its in-flight count; the connection stays
 * allocated until it ends. Fds it needs must have been taken first (req_take_fd). The handler then returns
 * REQ_DEFERRED and uses @r no more; on failure it answers as usual.
 */
typedef struct Req Req;
int req_defer(ReqCtx *r, Req **ret);
/* The deferred request's context, for reply_result(), reply_add_fd() and reply_fail(). */
ReqCtx *req_ctx(Req *q);
/* End it: @err >= 0 after a reply was made on req_ctx(q), or a negative errno after reply_fail(). Frees @q.
 */
void req_end(Req *q, int err);

/* The client's books, created at its first memory or event operation (its window is final by then);
 * answers the request itself when that fails. */
typedef struct BrokerClient BrokerClient;
int req_books(ReqCtx *r, BrokerClient **ret);
/* The client's books in the broker, made as its first memory op makes them: 0 or -ENOMEM. */
int conn_books_new(Conn *c);
/* In a handler: @bc, the client's books (req_books), or the handler returns the failure answered. */
#define WITH_CLIENT(r, bc)                                                                                   \
        BrokerClient *bc;                                                                                    \
        do {                                                                                                 \
                int _e = req_books(r, &bc);                                                                  \
                if (_e < 0)                                                                                  \
                        return _e;                                                                           \
        } while (0)
/*
 * The head of a message's initializer, for the fields then set by name: MSG_INIT(gpumem__x_reply), .has_a =
 * true, .a = ... What is not named is zero, as in its __INIT: no field of gpumem.proto has a default.
 */
#define MSG_INIT(type) .base = PROTOBUF_C_MESSAGE_INIT(&type##__descriptor)
/* An optional field set in such an initializer: its value and its has_ flag. */
#define OPT(field, value) .has_##field = true, .field = (value)
/*
 * A reply's repeated field of @n messages (at least room for one): the zeroed messages at @items and, after
 * them, the pointers to them that the field holds at @ptrs, in one allocation that free(@items) releases
 * (messages align as pointers: they begin with one). False when out of memory.
 */
#define REPLY_ITEMS_NEW(items, ptrs, n)                                                                      \
        (((items) = calloc((n) > 0 ? (n) : 1, sizeof(*(items)) + sizeof(*(ptrs)))) != NULL &&                \
         ((ptrs) = (void *)((items) + ((n) > 0 ? (n) : 1))) != NULL)
/*
 * The handler and the in-place reader (OpView) of an op whose message is one optional uint64 @field (see
 * req_view_u64), both answered by @answer(r, its value).
 */
#define REQ_U64_HANDLERS(handler, msg, field, answer)                                                        \
        int handler(ReqCtx *r, const Gpumem__Request *req)                                                   \
        {                                                                                                    \
                return answer(r, req->msg->field);                                                           \
        }                                                                                                    \
        int handler##_view(ReqCtx *r, const uint8_t *m, size_t len)                                          \
        {                                                                                                    \
                return req_view_u64(r, m, len, answer);                                                      \
        }
/* Fail with the broker's reason @w for @err (strerror's when it gave none): "return reply_fail_why(...)". */
int reply_fail_why(ReqCtx *r, int err, const Reason *w);
/* The answer to a broker call that returned @err: Empty, or its reason @w. */
int reply_empty_or_why(ReqCtx *r, int err, const Reason *w);
struct BrokerDrop;
/* The same once the memory of @drops (a list the broker held back, taken) was released on a worker: the
 * request is deferred until then, and the refunds of what nothing else holds come before its reply. */
int reply_after_drops(ReqCtx *r, int err, const Reason *w, struct BrokerDrop *drops);
/* The same with the reply @result the call's outputs filled (only read when @err >= 0). */
int reply_result_or_why(ReqCtx *r, int err, const Reason *w, void *result);
/* An op on one object of the client's books named by @id (an event, a queue): @fn, answered Empty. */
int req_call_id(ReqCtx *r, uint32_t id, int (*fn)(BrokerClient *bc, uint32_t id, Reason *w));

/*
 * The ops, in the order of their wire numbers: X(kind, field, handler, result, ...). field is the Request
 * oneof field (the op's number and name), handler the ops-*.c function that answers it with the Reply
 * result case; kind and the rest of the row say how request.c's op table gates it: since which protocol
 * version, who may call (ANY, ADMIN), the fds it takes, the policy family a class can be denied and what
 * it runs under (see there). The handlers' prototypes below come from the same list.
 */
#define REQUEST_OPS(X)                                                                                       \
        /* kind, request, handler, result, since, who may call, fds, policy family */                        \
        X(ROW, HELLO, op_hello, HELLO, 1, ANY, 0, 0)                                                         \
        X(ROW_UNLOCKED_VIEW, PING, op_ping, PING, 1)                                                         \
        X(ROW, WINDOW_RETRY, op_window_retry, HELLO, 1, ANY, 0, 0)                                           \
        X(ROW_UNLOCKED, TOPOLOGY, op_topology, TOPOLOGY, 1)                                                  \
        X(ROW_CLIENT, TOPOLOGY_FILES, op_topology_files, TOPOLOGY_FILES, 2, 0, 0)                            \
        X(ROW_CLIENT, TILE_CONFIG, op_tile_config, TILE_CONFIG, 2, 0, 0)                                     \
        X(ROW, QUOTA, op_quota, QUOTA, 4, ANY, 0, 0)                                                         \
        X(ROW_CLIENT, MEM_INFO, op_mem_info, MEM_INFO, 1, 0, 0)                                              \
        X(ROW_CLIENT_VIEW, POINTER_INFO, op_pointer_info, POINTER_INFO, 1, 0)                                \
        X(ROW_CLIENT, ALLOC, op_alloc, ALLOC, 1, 0, 0)                                                       \
        X(ROW_CLIENT, FREE, op_free, EMPTY, 1, 0, 0)                                                         \
        X(ROW_CLIENT, MAP, op_map, EMPTY, 1, 0, 0)                                                           \
        X(ROW_CLIENT, UNMAP, op_unmap, EMPTY, 1, 0, 0)                                                       \
        X(ROW_CLIENT, VMM_RESERVE, op_vmm_reserve, VMM_RESERVE, 1, 0, POLICY_OP_VMM)                         \
        X(ROW_CLIENT, VMM_FREE, op_vmm_free, EMPTY, 1, 0, POLICY_OP_VMM)                                     \
        X(ROW_CLIENT, VMM_CREATE, op_vmm_create, VMM_CREATE, 1, 0, POLICY_OP_VMM)                            \
        X(ROW_CLIENT, VMM_RELEASE, op_vmm_release, EMPTY, 1, 0, POLICY_OP_VMM)                               \
        X(ROW_CLIENT, VMM_MAP, op_vmm_map, EMPTY, 1, 0, POLICY_OP_VMM)                                       \
        X(ROW_CLIENT, VMM_UNMAP, op_vmm_unmap, EMPTY, 1, 0, POLICY_OP_VMM)                                   \
        X(ROW_CLIENT, VMM_SET_ACCESS, op_vmm_set_access, VMM_SET_ACCESS, 1, 0, POLICY_OP_VMM)                \
        X(ROW_CLIENT, VMM_GET_ACCESS, op_vmm_get_access, VMM_GET_ACCESS, 1, 0, POLICY_OP_VMM)                \
        X(ROW_CLIENT, VMM_GRANULARITY, op_vmm_granularity, VMM_GRANULARITY, 1, 0, 0)                         \
        X(ROW_CLIENT, VMM_RETAIN, op_vmm_retain, VMM_RETAIN, 1, 0, POLICY_OP_VMM)                            \
        X(ROW_CLIENT, VMM_PROPERTIES, op_vmm_properties, VMM_PROPERTIES, 1, 0, POLICY_OP_VMM)                \
        X(ROW_CLIENT, DMABUF_EXPORT, op_dmabuf_export, DMABUF_EXPORT, 1, 0, POLICY_OP_EXPORT)                \
        X(ROW_CLIENT, DMABUF_IMPORT, op_dmabuf_import, DMABUF_IMPORT, 1, 1, POLICY_OP_IMPORT)                \
        X(ROW_CLIENT_VIEW, SVM_SET_ATTR, op_svm_set_attr, EMPTY, 1, POLICY_OP_SVM)                           \
        X(ROW_CLIENT_VIEW, SVM_GET_ATTR, op_svm_get_attr, SVM_GET_ATTR, 1, POLICY_OP_SVM)                    \
        X(ROW_CLIENT, SVM_PREFETCH, op_svm_prefetch, EMPTY, 1, 0, POLICY_OP_SVM)                             \
        X(ROW_CLIENT, EVENT_CREATE, op_event_create, EVENT_CREATE, 2, 0, 0)                                  \
        X(ROW_CLIENT, EVENT_DESTROY, op_event_destroy, EMPTY, 2, 0, 0)                                       \
        X(ROW_CLIENT, EVENT_SET, op_event_set, EMPTY, 2, 0, 0)                                               \
        X(ROW_CLIENT, EVENT_RESET, op_event_reset, EMPTY, 2, 0, 0)                                           \
        X(ROW_CLIENT, EVENT_WAIT, op_event_wait, EVENT_WAIT, 2, 0, 0)                                        \
        X(ROW_CLIENT, QUEUE_CREATE, op_queue_create, QUEUE_CREATE, 2, 0, 0)                                  \
        X(ROW_CLIENT, QUEUE_DESTROY, op_queue_destroy, EMPTY, 2, 0, 0)                                       \
        X(ROW_CLIENT, QUEUE_UPDATE, op_queue_update, EMPTY, 2, 0, 0)                                         \
        /* under the manager's lock: they read the class's rights, which a reload changes, and revoking      \
         * touches the publisher's books */                                                                  \
        X(ROW, SHARE_PUBLISH, op_share_publish, SHARE_PUBLISH, 3, ANY, 0, POLICY_OP_EXPORT)                  \
        X(ROW, SHARE_OPEN, op_share_open, SHARE_OPEN, 3, ANY, 0, POLICY_OP_IMPORT)                           \
        X(ROW, SHARE_REVOKE, op_share_revoke, EMPTY, 3, ANY, 0, 0)                                           \
        X(ROW, ADMIN_STATUS, op_admin_status, ADMIN_STATUS, 1, ADMIN, 0, 0)                                  \
        X(ROW, ADMIN_CLIENTS, op_admin_clients, ADMIN_CLIENTS, 1, ADMIN, 0, 0)                               \
        X(ROW, ADMIN_ALLOCATIONS, op_admin_allocations, ADMIN_ALLOCATIONS, 1, ADMIN, 0, 0)                   \
        X(ROW, ADMIN_QUOTA_GET, op_admin_quota_get, ADMIN_QUOTA_GET, 1, ADMIN, 0, 0)                         \
        X(ROW, ADMIN_QUOTA_SET, op_admin_quota_set, EMPTY, 1, ADMIN, 0, 0)                                   \
        X(ROW, ADMIN_DISCONNECT, op_admin_disconnect, EMPTY, 1, ADMIN, 0, 0)                                 \
        X(ROW, ADMIN_METRICS, op_admin_metrics, ADMIN_METRICS, 1, ADMIN, 0, 0)                               \
        X(ROW, ADMIN_SET_LOG_LEVEL, op_admin_set_log_level, EMPTY, 1, ADMIN, 0, 0)                           \
        X(ROW, ADMIN_SHARES, op_admin_shares, ADMIN_SHARES, 3, ADMIN, 0, 0)

/* Each handler's prototype; the kinds ending _VIEW have an OpView too, handler##_view. */
#define REQ_HANDLER_(handler) int handler(ReqCtx *r, const Gpumem__Request *req);
#define REQ_VIEWED_(handler)                                                                                 \
        REQ_HANDLER_(handler) int handler##_view(ReqCtx *r, const uint8_t *msg, size_t len);
#define REQ_PROTO_ROW                         REQ_HANDLER_
#define REQ_PROTO_ROW_CLIENT                  REQ_HANDLER_
#define REQ_PROTO_ROW_UNLOCKED                REQ_HANDLER_
#define REQ_PROTO_ROW_CLIENT_VIEW             REQ_VIEWED_
#define REQ_PROTO_ROW_UNLOCKED_VIEW           REQ_VIEWED_
#define REQ_PROTO_(kind, field, handler, ...) REQ_PROTO_##kind(handler)
REQUEST_OPS(REQ_PROTO_)

/* The connection goes: its pending event waits end unanswered (before its books go). */
void events_conn_gone(Conn *c);
/* Pack the topology replies once, at start: the topology op reads them from any loop without the lock. */
int op_topology_prepare(Manager *m);
/* The broker's interrupt callback for a client (@arg: its Conn): called on the driver's thread. */
void queues_interrupt(void *arg);
