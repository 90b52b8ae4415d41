/* KFD events of the client's context in gpumemd: create, destroy, set, reset, wait (protocol 2). */
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
                return -EINVAL;
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
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c)
                return -EINVAL;
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
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_EMPTY, &reply);
        if (r == 0)
                gm_reply_free(c, reply);
        return r;
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

int gm_event_wait(gm_client *c, const uint32_t *ids, size_t n, bool all, uint32_t timeout_ms)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__EventWait ew = GPUMEM__EVENT_WAIT__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !ids || n == 0)
                return -EINVAL;
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
        r = (int)reply->event_wait->result;
        gm_reply_free(c, reply);
        return r;
}
