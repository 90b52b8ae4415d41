/* Queue ops: user-mode queues in the client's own GPU context, and its GPU interrupts back to its events. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "broker/broker.h"
#include "server/conn.h"
#include "server/core.h"
#include "request.h"
#include "server/shard.h"

/* A field of the request @a, named as the driver's. */
#define SAME(field) .field = a->field

int op_queue_create(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__QueueCreate *a = req->queue_create;
        DriverQueueArgs q = {SAME(gpu_id),        SAME(type),      SAME(percentage),  SAME(priority),
                             SAME(ring_va),       SAME(ring_size), SAME(rptr_va),     SAME(wptr_va),
                             SAME(eop_va),        SAME(eop_size),  SAME(ctx_save_va), SAME(ctx_save_size),
                             SAME(ctl_stack_size)};
        uint32_t id = 0;
        uint64_t db = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_queue_create(bc, &q, &id, &db, &w);
        Gpumem__QueueCreateReply qr = {MSG_INIT(gpumem__queue_create_reply), OPT(queue_id, id),
                                       OPT(doorbell_offset, db)};
        return reply_result_or_why(r, err, &w, &qr);
}

int op_queue_destroy(ReqCtx *r, const Gpumem__Request *req)
{
        return req_call_id(r, req->queue_destroy->queue_id, broker_queue_destroy);
}

int op_queue_update(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__QueueUpdate *a = req->queue_update;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_queue_update(bc, a->queue_id, a->ring_va, a->ring_size, a->percentage, a->priority, &w);
        return reply_empty_or_why(r, err, &w);
}

/* ---- interrupts ---------------------------------------------------------------------------------------- */

typedef struct IrqNote {
        Manager *m;
        uint64_t client_id;
} IrqNote;

/*
 * On the client's loop: the event page is looked at under the client's lock, as a request on its books
 * would. The client is found again by id, since it may have gone since the news was posted.
 */
static void irq_run(void *arg)
{
        IrqNote *n = arg;
        Conn *c;

        manager_lock(n->m);
        c = manager_find_conn(n->m, n->client_id);
        if (c && !c->dead) {
                conn_lock(c);
                atomic_store(&c->irq_posted, false);
                if (c->broker)
                        (void)broker_event_interrupt(c->broker);
                conn_unlock(c);
        }
        manager_unlock(n->m);
        free(n);
}

void queues_interrupt(void *arg)
{
        Conn *c = arg; /* alive: the driver calls only while the client's GPU context lives */
        IrqNote *n;

        if (atomic_exchange(&c->irq_posted, true))
                return; /* a look is posted already, and sees this one too */
        n = malloc(sizeof(*n));
        if (n) {
                n->m = c->m;
                n->client_id = c->id;
                if (loop_post(c->sh->loop, irq_run, n) == 0)
                        return;
                free(n);
        }
        /* no memory: the client's next wait looks at the page itself */
        atomic_store(&c->irq_posted, false);
}
