/* Event ops: KFD events of the client's context; waits are answered when they end, never on the loop's time.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "server/conn.h"
#include "server/core.h"
#include "base/log.h"
#include "request.h"

/* A wait the broker could not answer at once: its reply goes out when the event comes or the time is up. */
typedef struct PendingWait {
        struct PendingWait *prev, *next; /* the connection's (Conn.event_waits) */
        Conn *c;
        Manager *m;
        uint32_t id;
        uint32_t field;
        size_t n_ids; /* the events it names, for the faults its reply carries */
        uint32_t ids[EVENTS_WAIT_MAX_IDS];
        EventWait *wait;
        LoopTimer timer; /* not set up: no timeout */
} PendingWait;

static void pending_unlink(PendingWait *p)
{
        if (p->prev)
                p->prev->next = p->next;
        else
                p->c->event_waits = p->next;
        if (p->next)
                p->next->prev = p->prev;
}

static void pending_free(PendingWait *p)
{
        pending_unlink(p);
        loop_timer_done(&p->timer);
        free(p);
}

/* A wait's reply: its result, and the GPU VM fault each memory event it names holds (as KFD's WAIT_EVENTS
 * copies them out). Under the client's lock. */
static int wait_reply(ReqCtx *r, BrokerClient *bc, const uint32_t *ids, size_t n, unsigned result)
{
        Gpumem__EventWaitReply wr = GPUMEM__EVENT_WAIT_REPLY__INIT;
        Gpumem__MemoryException exc[8], *pexc[8];
        size_t k = 0;

        wr.has_result = true;
        wr.result = result;
        for (size_t i = 0; bc && i < n && k < 8; i++) {
                EventsMemoryFault f;
                if (!broker_event_memory_fault(bc, ids[i], &f))
                        continue;
                gpumem__memory_exception__init(&exc[k]);
                exc[k].has_event_id = exc[k].has_gpu_id = exc[k].has_va = true;
                exc[k].has_not_present = exc[k].has_read_only = exc[k].has_no_execute = true;
                exc[k].event_id = ids[i];
                exc[k].gpu_id = f.gpu_id;
                exc[k].va = f.va;
                exc[k].not_present = f.not_present;
                exc[k].read_only = f.read_only;
                exc[k].no_execute = f.no_execute;
                pexc[k] = &exc[k];
                k++;
        }
        wr.n_memory_exceptions = k;
        wr.memory_exceptions = pexc;
        return reply_result(r, &wr);
}

/* The reply of a wait that ended, out of the connection's order (the client matches replies by id). */
static void pending_reply(PendingWait *p, unsigned result)
{
        ReqCtx r = {.c = p->c,
                    .m = p->m,
                    .id = p->id,
                    .field = p->field,
                    .reply_case = GPUMEM__REPLY__RESULT_EVENT_WAIT};

        (void)wait_reply(&r, p->c->broker, p->ids, p->n_ids, result);
}

/* From the broker, inside the request that set or destroyed an event (under the client's lock). */
static void wait_done(EventWait *w, unsigned result, void *ctx)
{
        PendingWait *p = ctx;

        (void)w; /* the broker frees it */
        pending_reply(p, result);
        pending_free(p);
}

/* On the connection's loop, outside any request: its own lock, as a request on its books takes. */
static void wait_timeout(void *userdata)
{
        PendingWait *p = userdata;
        Conn *c = p->c;

        conn_lock(c);
        broker_event_wait_cancel(c->broker, p->wait);
        pending_reply(p, 1 /* KFD_IOC_WAIT_RESULT_TIMEOUT */);
        pending_free(p);
        conn_unlock(c);
}

void events_conn_gone(Conn *c)
{
        while (c->event_waits) {
                PendingWait *p = c->event_waits;
                if (c->broker)
                        broker_event_wait_cancel(c->broker, p->wait);
                pending_free(p);
        }
}

int op_event_create(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__EventCreate *a = req->event_create;
        uint32_t id = 0, slot = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_event_create(bc, a->type, a->auto_reset, a->page_va, &id, &slot, &w);
        Gpumem__EventCreateReply cr = {MSG_INIT(gpumem__event_create_reply), OPT(event_id, id),
                                       OPT(slot_index, slot)};
        return reply_result_or_why(r, err, &w, &cr);
}

int op_event_destroy(ReqCtx *r, const Gpumem__Request *req)
{
        return req_call_id(r, req->event_destroy->event_id, broker_event_destroy);
}

int op_event_set(ReqCtx *r, const Gpumem__Request *req)
{
        return req_call_id(r, req->event_set->event_id, broker_event_set);
}

int op_event_reset(ReqCtx *r, const Gpumem__Request *req)
{
        return req_call_id(r, req->event_reset->event_id, broker_event_reset);
}

int op_event_wait(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__EventWait *a = req->event_wait;
        Gpumem__EventWaitReply wr = GPUMEM__EVENT_WAIT_REPLY__INIT;
        uint32_t timeout = a->has_timeout_ms ? a->timeout_ms : UINT32_MAX;
        PendingWait *p;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        /* what the GPU signalled, whether or not the news of its interrupt came yet */
        (void)broker_event_interrupt(bc);
        p = timeout ? calloc(1, sizeof(*p)) : NULL;
        if (timeout && !p)
                return reply_fail(r, -ENOMEM, "out of memory");
        if (p && timeout != UINT32_MAX) {
                if (loop_timer_init(&p->timer, r->c->sh->loop, wait_timeout, p) < 0) {
                        free(p);
                        return reply_fail(r, -ENOMEM, "cannot time the wait");
                }
                loop_timer_arm(&p->timer, (uint64_t)timeout * 1000u);
        }
        err = broker_event_wait(bc, a->event_ids, a->n_event_ids, a->wait_all, timeout != 0, wait_done, p,
                                p ? &p->wait : NULL, &w);
        if (err != 0) {
                if (p) {
                        loop_timer_done(&p->timer);
                        free(p);
                }
                if (err < 0)
                        return reply_fail_why(r, err, &w);
                return wait_reply(r, bc, a->event_ids, a->n_event_ids, 0 /* KFD_IOC_WAIT_RESULT_COMPLETE */);
        }
        if (!p) { /* a look that found nothing */
                wr.has_result = true;
                wr.result = 1; /* KFD_IOC_WAIT_RESULT_TIMEOUT */
                return reply_result(r, &wr);
        }
        /* answered later, from wait_done() or wait_timeout() on this connection's loop */
        p->n_ids = a->n_event_ids < EVENTS_WAIT_MAX_IDS ? a->n_event_ids : EVENTS_WAIT_MAX_IDS;
        memcpy(p->ids, a->event_ids, p->n_ids * sizeof(p->ids[0]));
        p->c = r->c;
        p->m = r->m;
        p->id = r->id;
        p->field = r->field;
        p->next = r->c->event_waits;
        if (p->next)
                p->next->prev = p;
        r->c->event_waits = p;
        return REQ_DEFERRED;
}
