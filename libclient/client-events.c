/* KFD events and user-mode queues of the client's context in gpumemd (protocol 2). */
#include <errno.h>
#include <stdlib.h>

#include "client-private.h"

int gm_event_create(gm_client *c, uint32_t type, bool auto_reset, const void *page, uint32_t *ret_id,
                    uint32_t *ret_slot)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__EventCreate ec = GPUMEM__EVENT_CREATE__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !ret_id)
                return BAD_ARGS(c);
        ec.has_type = ec.has_auto_reset = ec.has_page_va = true;
        ec.type = type;
        ec.auto_reset = auto_reset;
        ec.page_va = (uint64_t)(uintptr_t)page;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_CREATE;
        req.event_create = &ec;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_EVENT_CREATE, &reply);
        if (r < 0)
                return r;
        *ret_id = reply->event_create->event_id;
        if (ret_slot)
                *ret_slot = reply->event_create->slot_index;
        gm_reply_free(c, reply);
        return 0;
}

/* destroy, set, reset */
static int event_call(gm_client *c, Gpumem__Request__OpCase op, uint32_t id)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__EventId e = GPUMEM__EVENT_ID__INIT;

        if (!c)
                return BAD_ARGS(c);
        e.has_event_id = true;
        e.event_id = id;
        req.op_case = op;
        /* the three ops carry the same message */
        if (op == GPUMEM__REQUEST__OP_EVENT_DESTROY)
                req.event_destroy = &e;
        else if (op == GPUMEM__REQUEST__OP_EVENT_SET)
                req.event_set = &e;
        else
                req.event_reset = &e;
        return gm_call_empty(c, &req);
}

int gm_event_destroy(gm_client *c, uint32_t id)
{
        return event_call(c, GPUMEM__REQUEST__OP_EVENT_DESTROY, id);
}

int gm_event_set(gm_client *c, uint32_t id)
{
        return event_call(c, GPUMEM__REQUEST__OP_EVENT_SET, id);
}

int gm_event_reset(gm_client *c, uint32_t id)
{
        return event_call(c, GPUMEM__REQUEST__OP_EVENT_RESET, id);
}

int gm_event_wait_faults(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms,
                         gm_memory_exception *ret, size_t cap, size_t *ret_n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__EventWait ew = GPUMEM__EVENT_WAIT__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__EventWaitReply *wr;
        size_t k = 0;
        int r;

        if (!c || !ids || n == 0 || (cap && !ret))
                return BAD_ARGS(c);
        ew.n_event_ids = n;
        ew.event_ids = (uint32_t *)ids;
        ew.has_wait_all = ew.has_timeout_ms = true;
        ew.wait_all = all;
        ew.timeout_ms = timeout_ms;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_WAIT;
        req.event_wait = &ew;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_EVENT_WAIT, &reply);
        if (r < 0)
                return r;
        wr = reply->event_wait;
        r = (int)wr->result;
        for (size_t i = 0; i < wr->n_memory_exceptions && k < cap; i++) {
                const Gpumem__MemoryException *e = wr->memory_exceptions[i];
                ret[k++] = (gm_memory_exception){.event_id = e->event_id,
                                                 .gpu_id = e->gpu_id,
                                                 .va = e->va,
                                                 .not_present = e->not_present,
                                                 .read_only = e->read_only,
                                                 .no_execute = e->no_execute};
        }
        if (ret_n)
                *ret_n = k;
        gm_reply_free(c, reply);
        return r;
}

int gm_event_wait(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms)
{
        return gm_event_wait_faults(c, ids, n, all, timeout_ms, NULL, 0, NULL);
}

int gm_queue_create(gm_client *c, const gm_queue_desc *d, uint32_t *ret_id, uint64_t *ret_doorbell_offset)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__QueueCreate q = GPUMEM__QUEUE_CREATE__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !d || !ret_id || !ret_doorbell_offset)
                return BAD_ARGS(c);
        q.has_gpu_id = q.has_type = q.has_percentage = q.has_priority = true;
        q.gpu_id = d->gpu_id;
        q.type = d->type;
        q.percentage = d->percentage;
        q.priority = d->priority;
        q.has_ring_va = q.has_ring_size = q.has_rptr_va = q.has_wptr_va = true;
        q.ring_va = d->ring_va;
        q.ring_size = d->ring_size;
        q.rptr_va = d->rptr_va;
        q.wptr_va = d->wptr_va;
        q.has_eop_va = q.has_eop_size = q.has_ctx_save_va = q.has_ctx_save_size = q.has_ctl_stack_size = true;
        q.eop_va = d->eop_va;
        q.eop_size = d->eop_size;
        q.ctx_save_va = d->ctx_save_va;
        q.ctx_save_size = d->ctx_save_size;
        q.ctl_stack_size = d->ctl_stack_size;
        req.op_case = GPUMEM__REQUEST__OP_QUEUE_CREATE;
        req.queue_create = &q;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_QUEUE_CREATE, &reply);
        if (r < 0)
                return r;
        *ret_id = reply->queue_create->queue_id;
        *ret_doorbell_offset = reply->queue_create->doorbell_offset;
        gm_reply_free(c, reply);
        return 0;
}

int gm_queue_destroy(gm_client *c, uint32_t id)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__QueueId q = GPUMEM__QUEUE_ID__INIT;

        if (!c)
                return BAD_ARGS(c);
        q.has_queue_id = true;
        q.queue_id = id;
        req.op_case = GPUMEM__REQUEST__OP_QUEUE_DESTROY;
        req.queue_destroy = &q;
        return gm_call_empty(c, &req);
}

int gm_queue_update(gm_client *c, uint32_t id, uint64_t ring_va, uint64_t ring_size, uint32_t percentage,
                    uint32_t priority)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__QueueUpdate q = GPUMEM__QUEUE_UPDATE__INIT;

        if (!c)
                return BAD_ARGS(c);
        q.has_queue_id = q.has_ring_va = q.has_ring_size = q.has_percentage = q.has_priority = true;
        q.queue_id = id;
        q.ring_va = ring_va;
        q.ring_size = ring_size;
        q.percentage = percentage;
        q.priority = priority;
        req.op_case = GPUMEM__REQUEST__OP_QUEUE_UPDATE;
        req.queue_update = &q;
        return gm_call_empty(c, &req);
}
