/* Queue ops: user-mode queues in the client's own GPU context, and its GPU interrupts back to its events. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "broker/broker.h"
#include "server/conn.h"
#include "server/core.h"
#include "request.h"
#include "server/shard.h"

static int fail_why(ReqCtx *r, int err, const Reason *w)
{
        return reply_fail(r, err, "%s", reason_or_errno(w, err));
}

int op_queue_create(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__QueueCreate *a = req->queue_create;
        Gpumem__QueueCreateReply qr = GPUMEM__QUEUE_CREATE_REPLY__INIT;
        DriverQueueArgs q = {.gpu_id = a->gpu_id,
                             .type = a->type,
                             .percentage = a->percentage,
                             .priority = a->priority,
                             .ring_va = a->ring_va,
                             .ring_size = a->ring_size,
                             .rptr_va = a->rptr_va,
                             .wptr_va = a->wptr_va,
                             .eop_va = a->eop_va,
                             .eop_size = a->eop_size,
                             .ctx_save_va = a->ctx_save_va,
                             .ctx_save_size = a->ctx_save_size,
                             .ctl_stack_size = a->ctl_stack_size};
        BrokerClient *bc;
        Reason w = {""};
        uint32_t id = 0;
        uint64_t db = 0;
        int err = req_books(r, &bc);

        if (err < 0)
                return err;
        err = broker_queue_create(bc, &q, &id, &db, &w);
        if (err < 0)
                return fail_why(r, err, &w);
        qr.has_queue_id = qr.has_doorbell_offset = true;
        qr.queue_id = id;
        qr.doorbell_offset = db;
        return reply_result(r, &qr);
}

int op_queue_destroy(ReqCtx *r, const Gpumem__Request *req)
{
        BrokerClient *bc;
        Reason w = {""};
        int err = req_books(r, &bc);

        if (err < 0)
                return err;
        err = broker_queue_destroy(bc, req->queue_destroy->queue_id, &w);
        return err < 0 ? fail_why(r, err, &w) : reply_empty(r);
}

int op_queue_update(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__QueueUpdate *a = req->queue_update;
        BrokerClient *bc;
        Reason w = {""};
        int err = req_books(r, &bc);

        if (err < 0)
                return err;
        err = broker_queue_update(bc, a->queue_id, a->ring_va, a->ring_size, a->percentage, a->priority, &w);
        return err < 0 ? fail_why(r, err, &w) : reply_empty(r);
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
