/* A client's KFD events in the broker: their cost, the event page's slots, and its GPU interrupts. */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"

/* On the driver's thread, under its locks: only the news goes on. */
void broker_client_interrupt(void *arg, const DriverInterrupt *irq)
{
        BrokerClient *c = arg;

        /* a signal: every signalled slot is looked at, as KFD does for a partial id; a fault: kept for the
         * client's thread, which hands it to the memory events */
        if (irq->type == DRIVER_IRQ_VM_FAULT) {
                pthread_mutex_lock(&c->fault_lock);
                c->fault = *irq;
                c->fault_pending = true;
                c->ctx_faulted = true;
                pthread_mutex_unlock(&c->fault_lock);
        } else if (irq->valid_bits >= 32 && irq->partial_id < EVENTS_SIGNAL_LIMIT) {
                /* a mirrored event by its id: its slot was acknowledged already */
                pthread_mutex_lock(&c->fault_lock);
                if (c->fired)
                        c->fired[irq->partial_id / 64] |= 1ull << (irq->partial_id % 64);
                pthread_mutex_unlock(&c->fault_lock);
        }
        if (c->irq_fn)
                c->irq_fn(c->irq_arg);
}

void broker_client_set_interrupt(BrokerClient *c, void (*fn)(void *arg), void *arg)
{
        /* no more calls to the old target: the driver is told first, under its own lock, so that none is
         * in flight once this returns */
        if (!fn && c->own_ctx && c->ctx)
                (void)driver_ctx_set_interrupt(c->b->drv, c->ctx, NULL, NULL);
        if (!fn)
                broker_primary_leave(c);
        c->irq_fn = fn;
        c->irq_arg = arg;
}

/* The slot of signal event @id in the client's event page, where the daemon maps it; NULL: no page (any
 * more: the memory may have been freed since it was named). */
static volatile uint64_t *event_slot(const BrokerClient *c, uint32_t id)
{
        uint64_t va = 0, size = 0;
        const Obj *o;

        if (!c->events || !client_events_page(c->events, &va, &size) || (uint64_t)id >= size / 8)
                return NULL;
        o = broker_obj_at(c, va);
        if (!o || o->va != va || o->memfd < 0 || size > o->size)
                return NULL;
        return (volatile uint64_t *)(uintptr_t)(va + 8 * (uint64_t)id);
}

/*
 * DRIVER_CAP_EVENT_MIRROR: signal event @id also in the client's own context, where the GPU's interrupts
 * reach it; the driver reports it by id when it fires. Nothing to do where the client has no context of its
 * own (the daemon's is shared) or the driver hands every interrupt out.
 */
static int listeners_full(Reason *w)
{
        return reason_set(
                w, -EUSERS,
                "the daemon waits on the events of as many clients' GPU contexts as max-event-threads "
                "allows: try again when one has gone");
}

/*
 * The client's context to be waited on by a thread of the driver's: counted in its uid's share, so that one
 * tenant's clients cannot take every thread (the driver bounds them all). 1: counted now (give it back if
 * the driver refuses), 0: counted already, or a negative errno with the reason.
 */
static int listener_charge(BrokerClient *c, Reason *w)
{
        Broker *b = c->b;
        int r = 1;

        pthread_mutex_lock(&b->lock);
        if (c->listener_charged || !c->uid)
                r = 0;
        else if (c->uid->listeners >= b->max_listeners_uid)
                r = reason_set(
                        w, -EUSERS,
                        "the daemon waits on the events of as many GPU contexts of uid %u's clients as "
                        "max-event-threads-per-uid (%u) allows: try again when one has gone",
                        (unsigned)c->uid->uid, b->max_listeners_uid);
        else
                c->uid->listeners++, c->listener_charged = true;
        pthread_mutex_unlock(&b->lock);
        return r;
}

static void listener_uncharge(BrokerClient *c)
{
        pthread_mutex_lock(&c->b->lock);
        if (c->listener_charged) {
                c->uid->listeners--;
                c->listener_charged = false;
        }
        pthread_mutex_unlock(&c->b->lock);
}

static int event_mirror(BrokerClient *c, uint32_t type, uint32_t id, Reason *w)
{
        int charged;
        uint64_t va = 0, size = 0;
        DriverMem *page = NULL;
        DriverCtx *ctx;
        int r;

        if (!driver_has(c->b->drv, DRIVER_CAP_EVENT_MIRROR) || !driver_has(c->b->drv, DRIVER_CAP_PRIVATE_VM))
                return 0;
        if (type != EVENTS_TYPE_SIGNAL && type != EVENTS_TYPE_MEMORY)
                return 0;
        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        charged = listener_charge(c, w);
        if (charged < 0)
                return charged;
        if (type == EVENTS_TYPE_MEMORY) { /* the driver's own memory event hears the faults */
                r = driver_ctx_listen(c->b->drv, ctx);
                if (r < 0 && charged)
                        listener_uncharge(c);
                return r == -EUSERS ? listeners_full(w)
                       : r < 0 ? reason_set(w, r, "cannot listen to the client's context: %s", strerror(-r))
                               : 0;
        }
        if (!c->fired) {
                uint64_t *f = calloc(EVENTS_SIGNAL_LIMIT / 64, sizeof(*f));
                if (!f)
                        return reason_set(w, -ENOMEM, "out of memory");
                pthread_mutex_lock(&c->fault_lock);
                c->fired = f;
                pthread_mutex_unlock(&c->fault_lock);
        }
        /* the page counts for the kernel when it is GTT memory of the client's context */
        if (client_events_page(c->events, &va, &size)) {
                const Obj *o = broker_obj_at(c, va);
                if (o && o->va == va && o->mem && (o->flags & BROKER_FLAG_GTT))
                        page = o->mem;
        }
        r = driver_event_mirror_add(c->b->drv, ctx, page, id);
        if (r < 0 && charged)
                listener_uncharge(c);
        if (r == -EUSERS)
                return listeners_full(w);
        if (r < 0)
                return reason_set(w, r,
                                  r == -EBUSY
                                          ? "the driver numbered the event in the client's context otherwise"
                                          : "cannot make the event in the client's context: %s",
                                  strerror(-r));
        return 0;
}

int broker_event_create(BrokerClient *c, uint32_t type, bool auto_reset, uint64_t page_va, uint32_t *ret_id,
                        uint32_t *ret_slot, Reason *w)
{
        uint64_t page_size = 0;
        int r;

        if (page_va) {
                /* memory of this client's that the CPU reaches: the host memory libhsakmt made for it */
                const Obj *o = broker_obj_at(c, page_va);
                if (!o || o->va != page_va || o->memfd < 0)
                        return reason_set(w, -EINVAL,
                                          "the event page 0x%llx is no host memory of this client",
                                          (unsigned long long)page_va);
                page_size = o->size;
        }
        if (!c->events && !(c->events = client_events_new()))
                return reason_set(w, -ENOMEM, "out of memory");
        r = broker_charge_take(c, &(Charge){.objects = 1}, w);
        if (r < 0)
                return r;
        r = client_event_create(c->events, type, auto_reset, page_va, page_size, ret_id, ret_slot, w);
        if (r < 0) {
                broker_charge_give(c, &(Charge){.objects = 1});
                return r;
        }
        if ((r = event_mirror(c, type, *ret_id, w)) < 0) {
                (void)client_event_destroy(c->events, *ret_id, NULL);
                broker_charge_give(c, &(Charge){.objects = 1});
                return r;
        }
        /* a signal event's slot starts unsignalled: KFD writes it so, into a page of the process's too */
        if (type == EVENTS_TYPE_SIGNAL) {
                volatile uint64_t *slot = event_slot(c, *ret_slot);
                if (slot)
                        *slot = UINT64_MAX;
        }
        return r;
}

int broker_event_destroy(BrokerClient *c, uint32_t id, Reason *w)
{
        int r;

        if (!c->events)
                return reason_set(w, -EINVAL, "no event %u", id);
        r = client_event_destroy(c->events, id, w);
        if (r < 0)
                return r;
        broker_charge_give(c, &(Charge){.objects = 1});
        if (id < EVENTS_SIGNAL_LIMIT && c->own_ctx && c->ctx)
                driver_event_mirror_remove(c->b->drv, c->ctx, id);
        return 0;
}

int broker_event_set(BrokerClient *c, uint32_t id, Reason *w)
{
        return c->events ? client_event_set(c->events, id, w) : reason_set(w, -EINVAL, "no event %u", id);
}

int broker_event_reset(BrokerClient *c, uint32_t id, Reason *w)
{
        return c->events ? client_event_reset(c->events, id, w) : reason_set(w, -EINVAL, "no event %u", id);
}

int broker_event_wait(BrokerClient *c, const uint32_t *ids, size_t n, bool all, bool pend, EventWaitDone done,
                      void *ctx, EventWait **ret, Reason *w)
{
        if (!c->events)
                return reason_set(w, -EINVAL, "no event %u", n ? ids[0] : 0);
        return client_event_wait(c->events, ids, n, all, pend, done, ctx, ret, w);
}

void broker_event_wait_cancel(BrokerClient *c, EventWait *wt)
{
        if (c->events)
                client_event_wait_cancel(c->events, wt);
}

bool broker_event_memory_fault(const BrokerClient *c, uint32_t id, EventsMemoryFault *ret)
{
        return c->events && client_event_memory_fault(c->events, id, ret);
}

int broker_event_interrupt(BrokerClient *c)
{
        DriverInterrupt fault;
        bool faulted;
        int n = 0;

        uint64_t fired[EVENTS_SIGNAL_LIMIT / 64];
        bool any_fired = false;

        pthread_mutex_lock(&c->fault_lock);
        faulted = c->fault_pending;
        fault = c->fault;
        c->fault_pending = false;
        if (c->fired) {
                memcpy(fired, c->fired, sizeof(fired));
                memset(c->fired, 0, sizeof(fired));
                any_fired = true;
        }
        pthread_mutex_unlock(&c->fault_lock);
        /* the events the driver saw fire in the client's context, by id */
        for (size_t wd = 0; any_fired && c->events && wd < EVENTS_SIGNAL_LIMIT / 64; wd++)
                for (uint64_t bits = fired[wd]; bits; bits &= bits - 1)
                        if (client_event_set(c->events, (uint32_t)(wd * 64 + (unsigned)__builtin_ctzll(bits)),
                                             NULL) == 0)
                                n++;
        if (faulted && c->events)
                n += client_events_memory_fault(c->events,
                                                &(EventsMemoryFault){.gpu_id = fault.gpu_id,
                                                                     .va = fault.va,
                                                                     .not_present = fault.not_present,
                                                                     .read_only = fault.read_only,
                                                                     .no_execute = fault.no_execute});

        /* the page must still be memory of this client's that the daemon maps (event_slot) */
        if (!event_slot(c, 0))
                return 0;
        for (int64_t id = client_events_next_signal(c->events, 0); id >= 0;
             id = client_events_next_signal(c->events, (uint32_t)id + 1)) {
                volatile uint64_t *slot = event_slot(c, (uint32_t)id);
                if (!slot)
                        break;
                if (*slot == UINT64_MAX)
                        continue;
                *slot = UINT64_MAX; /* acknowledged, as KFD does before it sets the event */
                if (client_event_set(c->events, (uint32_t)id, NULL) == 0)
                        n++;
        }
        return n;
}
