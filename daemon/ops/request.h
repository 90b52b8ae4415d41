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

/* Handlers, by family (ops-*.c). */
int op_hello(ReqCtx *r, const Gpumem__Request *req);
int op_ping(ReqCtx *r, const Gpumem__Request *req);
int op_ping_view(ReqCtx *r, const uint8_t *msg, size_t len);
int op_window_retry(ReqCtx *r, const Gpumem__Request *req);
int op_topology(ReqCtx *r, const Gpumem__Request *req);
int op_topology_files(ReqCtx *r, const Gpumem__Request *req);
int op_tile_config(ReqCtx *r, const Gpumem__Request *req);
int op_event_create(ReqCtx *r, const Gpumem__Request *req);
int op_event_destroy(ReqCtx *r, const Gpumem__Request *req);
int op_event_set(ReqCtx *r, const Gpumem__Request *req);
int op_event_reset(ReqCtx *r, const Gpumem__Request *req);
int op_event_wait(ReqCtx *r, const Gpumem__Request *req);
/* The connection goes: its pending event waits end unanswered (before its books go). */
void events_conn_gone(Conn *c);
/* Pack the topology replies once, at start: the topology op reads them from any loop without the lock. */
int op_topology_prepare(Manager *m);
int op_admin_status(ReqCtx *r, const Gpumem__Request *req);
int op_admin_clients(ReqCtx *r, const Gpumem__Request *req);
int op_admin_disconnect(ReqCtx *r, const Gpumem__Request *req);
int op_admin_metrics(ReqCtx *r, const Gpumem__Request *req);
int op_admin_allocations(ReqCtx *r, const Gpumem__Request *req);
int op_admin_quota_get(ReqCtx *r, const Gpumem__Request *req);
int op_admin_quota_set(ReqCtx *r, const Gpumem__Request *req);
int op_admin_set_log_level(ReqCtx *r, const Gpumem__Request *req);
int op_alloc(ReqCtx *r, const Gpumem__Request *req);
int op_free(ReqCtx *r, const Gpumem__Request *req);
int op_map(ReqCtx *r, const Gpumem__Request *req);
int op_unmap(ReqCtx *r, const Gpumem__Request *req);
int op_pointer_info(ReqCtx *r, const Gpumem__Request *req);
int op_pointer_info_view(ReqCtx *r, const uint8_t *msg, size_t len);
int op_mem_info(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_reserve(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_free(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_create(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_release(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_map(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_unmap(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_set_access(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_get_access(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_granularity(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_retain(ReqCtx *r, const Gpumem__Request *req);
int op_vmm_properties(ReqCtx *r, const Gpumem__Request *req);
int op_dmabuf_export(ReqCtx *r, const Gpumem__Request *req);
int op_dmabuf_import(ReqCtx *r, const Gpumem__Request *req);
int op_svm_set_attr(ReqCtx *r, const Gpumem__Request *req);
int op_svm_set_attr_view(ReqCtx *r, const uint8_t *msg, size_t len);
int op_svm_get_attr(ReqCtx *r, const Gpumem__Request *req);
int op_svm_get_attr_view(ReqCtx *r, const uint8_t *msg, size_t len);
int op_svm_prefetch(ReqCtx *r, const Gpumem__Request *req);
int op_queue_create(ReqCtx *r, const Gpumem__Request *req);
int op_queue_destroy(ReqCtx *r, const Gpumem__Request *req);
int op_queue_update(ReqCtx *r, const Gpumem__Request *req);
int op_share_publish(ReqCtx *r, const Gpumem__Request *req);
int op_share_open(ReqCtx *r, const Gpumem__Request *req);
int op_share_revoke(ReqCtx *r, const Gpumem__Request *req);
int op_admin_shares(ReqCtx *r, const Gpumem__Request *req);
/* The broker's interrupt callback for a client (@arg: its Conn): called on the driver's thread. */
void queues_interrupt(void *arg);
