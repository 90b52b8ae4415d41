/* KFD events and user-mode queues of the client's context in gpumemd (protocol 2). */
#include <errno.h>
#include <stdlib.h>

#include "client-private.h"

/* Where a new event's or queue's numbers go: its id, and its slot or doorbell offset (if asked). */
typedef struct NewId {
        uint32_t *id;
        void *more;
} NewId;

static int event_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__EventCreateReply *e = result;
        const NewId *o = ctx;

        (void)c;
        *o->id = e->event_id;
        if (o->more)
                *(uint32_t *)o->more = e->slot_index;
        return 0;
}

int gm_event_create(gm_client *c, uint32_t type, bool auto_reset, const void *page, uint32_t *ret_id,
                    uint32_t *ret_slot)
{
        Gpumem__EventCreate ec = GPUMEM__EVENT_CREATE__INIT;
        NewId out = {ret_id, ret_slot};

        if (!c || !ret_id)
                return BAD_ARGS(c);
        ec.has_type = ec.has_auto_reset = ec.has_page_va = true;
        ec.type = type;
        ec.auto_reset = auto_reset;
        ec.page_va = (uint64_t)(uintptr_t)page;
        return gm_request_take(c, GPUMEM__REQUEST__OP_EVENT_CREATE, &ec, GPUMEM__REPLY__RESULT_EVENT_CREATE,
                               event_take, &out);
}

/* destroy, set, reset */
static int event_call(gm_client *c, Gpumem__Request__OpCase op, uint32_t id)
{
        if (!c)
                return BAD_ARGS(c);
        /* the three ops carry the same message */
        return gm_request_num(c, op, id, GPUMEM__REPLY__RESULT_EMPTY, NULL, NULL);
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

/* Where a wait's faults go: room for @cap, how many were written (if asked). */
typedef struct FaultsOut {
        gm_memory_exception *ret;
        size_t cap;
        size_t *ret_n;
} FaultsOut;

/* The wait's result (which event fired, or a timeout), and the faults it reports. */
static int wait_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__EventWaitReply *wr = result;
        const FaultsOut *o = ctx;
        size_t k = 0;

        (void)c;
        for (size_t i = 0; i < wr->n_memory_exceptions && k < o->cap; i++) {
                const Gpumem__MemoryException *e = wr->memory_exceptions[i];
                o->ret[k++] = (gm_memory_exception){.event_id = e->event_id,
                                                    .gpu_id = e->gpu_id,
                                                    .va = e->va,
                                                    .not_present = e->not_present,
                                                    .read_only = e->read_only,
                                                    .no_execute = e->no_execute};
        }
        if (o->ret_n)
                *o->ret_n = k;
        return (int)wr->result;
}

int gm_event_wait_faults(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms,
                         gm_memory_exception *ret, size_t cap, size_t *ret_n)
{
        Gpumem__EventWait ew = GPUMEM__EVENT_WAIT__INIT;
        FaultsOut out = {ret, cap, ret_n};

        if (!c || !ids || n == 0 || (cap && !ret))
                return BAD_ARGS(c);
        ew.n_event_ids = n;
        ew.event_ids = (uint32_t *)ids;
        ew.has_wait_all = ew.has_timeout_ms = true;
        ew.wait_all = all;
        ew.timeout_ms = timeout_ms;
        return gm_request_take(c, GPUMEM__REQUEST__OP_EVENT_WAIT, &ew, GPUMEM__REPLY__RESULT_EVENT_WAIT,
                               wait_take, &out);
}

int gm_event_wait(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms)
{
        return gm_event_wait_faults(c, ids, n, all, timeout_ms, NULL, 0, NULL);
}

static int queue_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__QueueCreateReply *q = result;
        const NewId *o = ctx;

        (void)c;
        *o->id = q->queue_id;
        *(uint64_t *)o->more = q->doorbell_offset;
        return 0;
}

int gm_queue_create(gm_client *c, const gm_queue_desc *d, uint32_t *ret_id, uint64_t *ret_doorbell_offset)
{
        Gpumem__QueueCreate q = GPUMEM__QUEUE_CREATE__INIT;
        NewId out = {ret_id, ret_doorbell_offset};

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
        return gm_request_take(c, GPUMEM__REQUEST__OP_QUEUE_CREATE, &q, GPUMEM__REPLY__RESULT_QUEUE_CREATE,
                               queue_take, &out);
}

int gm_queue_destroy(gm_client *c, uint32_t id)
{
        if (!c)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_QUEUE_DESTROY, id, GPUMEM__REPLY__RESULT_EMPTY, NULL,
                              NULL);
}

int gm_queue_update(gm_client *c, uint32_t id, uint64_t ring_va, uint64_t ring_size, uint32_t percentage,
                    uint32_t priority)
{
        Gpumem__QueueUpdate q = GPUMEM__QUEUE_UPDATE__INIT;

        if (!c)
                return BAD_ARGS(c);
        q.has_queue_id = q.has_ring_va = q.has_ring_size = q.has_percentage = q.has_priority = true;
        q.queue_id = id;
        q.ring_va = ring_va;
        q.ring_size = ring_size;
        q.percentage = percentage;
        q.priority = priority;
        return gm_request(c, GPUMEM__REQUEST__OP_QUEUE_UPDATE, &q, GPUMEM__REPLY__RESULT_EMPTY, NULL);
}
