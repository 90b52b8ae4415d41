/* A client's user-mode queues: their memory checked as the client's own GPU memory, each one paid for. */
#include "broker.h"

#include <errno.h>
#include <string.h>

#include "broker-private.h"
#include "macro.h"

/* Is [va, va+size) inside one object of this client's that the GPU reaches from the client's context? (Host
 * memory that is not GTT is registered in the daemon's own context, which a client context does not see.) */
static bool queue_memory(const BrokerClient *c, uint64_t va, uint64_t size)
{
        const Obj *o = broker_obj_at(c, va);

        if (!o || !o->mem || !size || size > o->size || va - o->va > o->size - size)
                return false;
        return !(c->own_ctx && o->kind == BROKER_KIND_HOST && !(o->flags & BROKER_FLAG_GTT));
}

static int check_queue_memory(const BrokerClient *c, const char *what, uint64_t va, uint64_t size,
                              bool optional, Reason *w)
{
        if (optional && !va)
                return 0;
        if (!queue_memory(c, va, size))
                return reason_set(w, -EFAULT,
                                  "the queue's %s 0x%llx+0x%llx is no GPU memory of this client's", what,
                                  (unsigned long long)va, (unsigned long long)size);
        return 0;
}

/*
 * A queue runs in the client's GPU context and reaches whatever that context maps. Without a context per
 * client that is the daemon's own, where every client's memory is mapped: a queue there reads and writes the
 * other clients' memory, and a fault of it stops every queue there. Only a class that accepts that may.
 */
static int check_own_ctx(const BrokerClient *c, Reason *w)
{
        if (driver_has(c->b->drv, DRIVER_CAP_PRIVATE_VM) ||
            (c->acct && __atomic_load_n(&c->acct->shared_ctx, __ATOMIC_RELAXED)))
                return 0;
        return reason_set(
                w, -EOPNOTSUPP,
                "the kernel gives no GPU context per client (KFD secondary contexts, ABI 1.19: "
                "AMDKFD_IOC_CREATE_PROCESS): a queue would run in the one every client shares, which "
                "only a class with shared-gpu-context = yes accepts");
}

/*
 * On the driver's thread: an interrupt of the primary context, which every client with queues there shares.
 * A GPU VM fault there stopped every queue in it for good (the kernel evicts every queue of the process and
 * nothing restores them): each such client hears of it as of a fault of its own context, so that its waits
 * end with it, and no queue is made there any more.
 */
static void primary_interrupt(void *arg, const DriverInterrupt *irq)
{
        Broker *b = arg;

        pthread_mutex_lock(&b->sharers_lock);
        if (irq->type == DRIVER_IRQ_VM_FAULT && !b->primary_faulted) {
                b->primary_faulted = true;
                b->primary_fault = *irq;
        }
        for (BrokerClient *c = b->sharers; c; c = c->next_sharer)
                broker_client_interrupt(c, irq);
        pthread_mutex_unlock(&b->sharers_lock);
}

/* The client runs queues in the primary context from now on: it hears that context's interrupts. */
static int primary_join(BrokerClient *c, Reason *w)
{
        Broker *b = c->b;
        DriverInterrupt f;
        bool heard;
        int r = 0;

        pthread_mutex_lock(&b->sharers_lock);
        heard = b->primary_heard;
        pthread_mutex_unlock(&b->sharers_lock);
        if (!heard) {
                /* the first one: the broker listens to the context (its memory event hears the faults).
                 * Another client's first queue waits here until that is done, so that no queue runs in
                 * the context while nobody listens; the driver's thread never takes this lock, and
                 * primary_heard is set only under it. */
                pthread_mutex_lock(&b->primary_listen_lock);
                if (!b->primary_heard) {
                        r = driver_ctx_set_interrupt(b->drv, b->primary, primary_interrupt, b);
                        if (r >= 0)
                                r = driver_ctx_listen(b->drv, b->primary);
                        if (r >= 0) {
                                pthread_mutex_lock(&b->sharers_lock);
                                b->primary_heard = true;
                                pthread_mutex_unlock(&b->sharers_lock);
                        }
                }
                pthread_mutex_unlock(&b->primary_listen_lock);
                if (r < 0)
                        return reason_set(w, r, "cannot listen to the shared GPU context: %s", strerror(-r));
        }
        /* the fault is looked at where the client joins: one that came meanwhile refuses it too */
        pthread_mutex_lock(&b->sharers_lock);
        f = b->primary_fault;
        if (b->primary_faulted) {
                pthread_mutex_unlock(&b->sharers_lock);
                return reason_set(
                        w, -EIO,
                        "a GPU VM fault at 0x%llx on GPU %u stopped every queue of the shared GPU "
                        "context for good, as the kernel does: none runs there until gpumemd restarts",
                        (unsigned long long)f.va, f.gpu_id);
        }
        if (!c->sharer) {
                c->sharer = true;
                c->next_sharer = b->sharers;
                b->sharers = c;
        }
        pthread_mutex_unlock(&b->sharers_lock);
        return 0;
}

void broker_primary_leave(BrokerClient *c)
{
        Broker *b = c->b;

        if (!c->sharer)
                return;
        /* no call of the primary context's for it is in flight once the lock is taken */
        pthread_mutex_lock(&b->sharers_lock);
        for (BrokerClient **pp = &b->sharers; *pp; pp = &(*pp)->next_sharer)
                if (*pp == c) {
                        *pp = c->next_sharer;
                        break;
                }
        c->sharer = false;
        pthread_mutex_unlock(&b->sharers_lock);
}

/* A context whose queues a fault stopped makes none that would run: none is made there. */
static int check_ctx_alive(BrokerClient *c, Reason *w)
{
        DriverInterrupt f;
        bool faulted;

        pthread_mutex_lock(&c->fault_lock);
        faulted = c->ctx_faulted;
        f = c->fault;
        pthread_mutex_unlock(&c->fault_lock);
        if (!faulted)
                return 0;
        return reason_set(
                w, -EIO,
                "a GPU VM fault at 0x%llx on GPU %u stopped every queue of this client's GPU context "
                "for good, as the kernel does: none runs there again (a new connection has a new one)",
                (unsigned long long)f.va, f.gpu_id);
}

int broker_queue_create(BrokerClient *c, const DriverQueueArgs *q, uint32_t *ret_id, uint64_t *ret_doorbell,
                        Reason *w)
{
        DriverQueueArgs qa;
        DriverCtx *ctx;
        uint32_t id;
        uint64_t db;
        int r;

        if (q->type > DRIVER_QUEUE_SDMA_XGMI)
                return reason_set(w, -EINVAL, "queue type %u: 0 PM4, 1 SDMA, 2 AQL or 3 SDMA over XGMI",
                                  q->type);
        if (broker_gpu_index(c->b, q->gpu_id) < 0)
                return reason_set(w, -ENODEV, "no GPU with id %u", q->gpu_id);
        if ((r = broker_gpu_allowed(c, q->gpu_id, w)) < 0)
                return r;
        if (driver_runs_queues(c->b->drv) && (r = check_own_ctx(c, w)) < 0)
                return r;
        if (!q->ring_size || (q->ring_size & (q->ring_size - 1)))
                return reason_set(w, -EINVAL, "a ring of %llu bytes: a power of two",
                                  (unsigned long long)q->ring_size);
        if ((r = check_queue_memory(c, "ring", q->ring_va, q->ring_size, false, w)) < 0 ||
            (r = check_queue_memory(c, "read pointer", q->rptr_va, 8, false, w)) < 0 ||
            (r = check_queue_memory(c, "write pointer", q->wptr_va, 8, false, w)) < 0 ||
            (r = check_queue_memory(c, "EOP buffer", q->eop_va, q->eop_size ? q->eop_size : 4, true, w)) <
                    0 ||
            (r = check_queue_memory(c, "CWSR area", q->ctx_save_va, q->ctx_save_size ? q->ctx_save_size : 4,
                                    true, w)) < 0)
                return r;
        qa = *q;
        qa.wptr_fd = -1;
        if (driver_has(c->b->drv, DRIVER_CAP_DOORBELL_RELAY)) {
                /* the daemon rings the doorbell from the write pointer: it must be able to read it */
                const Obj *o = broker_obj_at(c, q->wptr_va);
                if (!o || o->memfd < 0 || (q->wptr_va & 7))
                        return reason_set(
                                w, -EFAULT,
                                "the queue's write pointer 0x%llx is no aligned host memory of this "
                                "client's: the daemon reads it to ring the queue's doorbell",
                                (unsigned long long)q->wptr_va);
                qa.wptr_fd = o->memfd;
                qa.wptr_fd_offset = q->wptr_va - o->va;
        }
        if (ARRAY_RESERVE(c->queues, c->cap_queues, c->n_queues + 1, 8) < 0)
                return reason_set(w, -ENOMEM, "out of memory");
        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        if (!c->own_ctx && driver_runs_queues(c->b->drv) && (r = primary_join(c, w)) < 0)
                return r;
        if (c->own_ctx && (r = check_ctx_alive(c, w)) < 0)
                return r;
        r = broker_charge_take(c, &BROKER_QUEUE_CHARGE, w);
        if (r < 0)
                return r;
        r = driver_queue_create(c->b->drv, ctx, &qa, &id, &db);
        if (r < 0) {
                broker_charge_give(c, &BROKER_QUEUE_CHARGE);
                return reason_set(w, r,
                                  r == -EOPNOTSUPP ? "the driver runs no queues on this GPU"
                                  : r == -ENOMEM   ? "the GPU has no queue left for this client"
                                                   : "the driver refused the queue: %s",
                                  strerror(-r));
        }
        c->queues[c->n_queues++] = (BrokerQueue){.id = id, .gpu_id = q->gpu_id, .type = q->type};
        *ret_id = id;
        *ret_doorbell = db;
        return 0;
}

static BrokerQueue *queue_find(BrokerClient *c, uint32_t id)
{
        return ARRAY_FIND(c->queues, c->n_queues, id, id);
}

int broker_queue_destroy(BrokerClient *c, uint32_t id, Reason *w)
{
        BrokerQueue *q = queue_find(c, id);
        int r;

        if (!q)
                return reason_set(w, -EINVAL, "no queue %u", id);
        r = driver_queue_destroy(c->b->drv, c->ctx, id);
        if (r < 0)
                return reason_set(w, r, "the driver refused to destroy queue %u: %s", id, strerror(-r));
        *q = c->queues[--c->n_queues];
        broker_charge_give(c, &BROKER_QUEUE_CHARGE);
        return 0;
}

int broker_queue_update(BrokerClient *c, uint32_t id, uint64_t ring_va, uint64_t ring_size,
                        uint32_t percentage, uint32_t priority, Reason *w)
{
        int r;

        if (!queue_find(c, id))
                return reason_set(w, -EINVAL, "no queue %u", id);
        if (ring_size && (ring_size & (ring_size - 1)))
                return reason_set(w, -EINVAL, "a ring of %llu bytes: a power of two",
                                  (unsigned long long)ring_size);
        if (ring_va && (r = check_queue_memory(c, "ring", ring_va, ring_size, false, w)) < 0)
                return r;
        r = driver_queue_update(c->b->drv, c->ctx, id, ring_va, ring_size, percentage, priority);
        if (r < 0)
                return reason_set(w, r, "the driver refused to update queue %u: %s", id, strerror(-r));
        return 0;
}

size_t broker_client_queues(const BrokerClient *c)
{
        return c ? c->n_queues : 0;
}
