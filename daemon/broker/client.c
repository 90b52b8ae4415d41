/* A broker client: its books, its GPU VM, and its teardown in dependency order, at once or in slices. */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"

int broker_client_new(Broker *b, ThunkVaSpace *window, BrokerClient **ret)
{
        BrokerClient *c = calloc(1, sizeof(*c));

        if (!c)
                return -ENOMEM;
        c->b = b;
        c->window = window;
        c->usage.n_gpus = (uint32_t)b->n_gpus;
        memcpy(c->usage.gpu_ids, b->gpu_ids, sizeof(b->gpu_ids));
        pthread_mutex_init(&c->fault_lock, NULL);
        pthread_mutex_lock(&b->lock);
        b->clients++;
        pthread_mutex_unlock(&b->lock);
        *ret = c;
        return 0;
}

void broker_client_usage(const BrokerClient *c, BrokerUsage *ret)
{
        *ret = c->usage;
}

bool broker_client_private_vm(const BrokerClient *c)
{
        return c->own_ctx;
}

size_t broker_client_objects(const BrokerClient *c)
{
        return c->objs.n + client_events_count(c->events);
}

uint64_t broker_client_records(const BrokerClient *c)
{
        return c->usage.objects;
}

/* The GPU VM device memory lives in: the client's own where the driver has one per client. */
int broker_client_ctx(BrokerClient *c, DriverCtx **ret, Reason *w)
{
        int r;

        if (!c->ctx) {
                if (driver_has(c->b->drv, DRIVER_CAP_PRIVATE_VM)) {
                        r = driver_ctx_new(c->b->drv, &c->ctx);
                        if (r < 0)
                                return reason_set(w, r, "cannot create a GPU VM for this client: %s",
                                                  strerror(-r));
                        c->own_ctx = true;
                        /* its queues' interrupts, where the driver hands them out (the model) */
                        (void)driver_ctx_set_interrupt(c->b->drv, c->ctx, broker_client_interrupt, c);
                } else {
                        c->ctx = c->b->primary;
                }
        }
        *ret = c->ctx;
        return 0;
}

/* The client's GPU VM outside its window (SVM ranges, the shares it opens), made when first needed. */
int broker_client_outer(BrokerClient *c, Reason *w)
{
        int r;

        if (!c->outer &&
            (r = thunk_va_space_new(BROKER_PAGE_SIZE, BROKER_SVM_LIMIT - BROKER_PAGE_SIZE, 0, &c->outer)) < 0)
                return reason_set(w, r, "out of memory");
        return 0;
}

/* Where a teardown in slices stands: every VMM mapping goes before any object, so that a handle nothing maps
 * any more can go with its object. */
enum { TEARDOWN_MAPPINGS, TEARDOWN_OBJECTS };

/* Drop up to *@budget mappings of reservation @res, GPU access first. */
static void teardown_mappings(BrokerClient *c, Obj *res, size_t *budget)
{
        ThunkVaObject vo;

        while (*budget > 0 && thunk_va_next(res->maps, res->va, &vo) == 0) {
                VmmMap *m = vo.data;
                (void)broker_map_revoke_all(c->b,
                                            m); /* what the driver refused goes with the context below */
                (void)broker_map_destroy(c, m, true, NULL);
                (*budget)--;
        }
}

static void teardown_object(BrokerClient *c, Obj *o)
{
        switch (o->kind) {
        case BROKER_KIND_DEVICE:
        case BROKER_KIND_HOST:
        case BROKER_KIND_MANAGED:
                (void)broker_destroy_alloc(c, o, true, NULL);
                broker_charge_obj_give(c, o);
                break;
        case BROKER_KIND_VMM:
        case BROKER_KIND_IMPORT:
                /* every mapping went first, so nothing else refers to it */
                o->client_refs = 0;
                o->map_refs = 0;
                (void)broker_phys_maybe_destroy(c, o, true, NULL);
                return;
        case BROKER_KIND_RESERVATION:
                thunk_va_space_free(o->maps);
                broker_charge_obj_give(c, o);
                break;
        case BROKER_KIND_SHARE:
                broker_share_ref_drop(c, o);
                break;
        }
        broker_svm_log_free(c, o);
        free(o);
}

bool broker_client_teardown_step(BrokerClient *c, size_t budget)
{
        Obj *o;

        /* the queues first: their engines read the memory that goes next */
        while (c->n_queues) {
                BrokerQueue *q = &c->queues[--c->n_queues];
                (void)driver_queue_destroy(c->b->drv, c->ctx, q->id);
                broker_charge_give(c, &BROKER_QUEUE_CHARGE);
        }

        if (c->teardown_phase == TEARDOWN_MAPPINGS) {
                while (budget > 0) {
                        size_t at = c->teardown_iter;
                        if (!hashmap_next(&c->objs, &c->teardown_iter, NULL, (void **)&o)) {
                                c->teardown_phase = TEARDOWN_OBJECTS;
                                c->teardown_iter = 0;
                                break;
                        }
                        if (o->kind != BROKER_KIND_RESERVATION)
                                continue;
                        teardown_mappings(c, o, &budget);
                        if (thunk_va_space_count(o->maps) > 0)
                                c->teardown_iter = at; /* out of budget inside it: back here next time */
                }
        }
        if (c->teardown_phase == TEARDOWN_OBJECTS) {
                /* removing the entry just read leaves a tombstone: the walk goes on where it was */
                while (budget > 0 && hashmap_next(&c->objs, &c->teardown_iter, NULL, (void **)&o)) {
                        hashmap_remove(&c->objs, o->handle);
                        teardown_object(c, o);
                        budget--;
                }
        }
        /* the inotify queue holds 16384 events by default: take them slice by slice */
        broker_process_events(c->b);
        return c->teardown_phase == TEARDOWN_OBJECTS && c->objs.n == 0;
}

BrokerClient *broker_client_free(BrokerClient *c)
{
        if (!c)
                return NULL;
        broker_primary_leave(c);
        while (!broker_client_teardown_step(c, 4096))
                ;
        /* drops held for a free that did not take them: released here */
        for (BrokerDrop *d = broker_client_take_drops(c), *next; d; d = next) {
                next = d->next;
                broker_drop_run(d);
                free(d);
        }
        if (c->events) {
                broker_charge_give(c, &(Charge){.objects = client_events_count(c->events)});
                c->events = client_events_free(c->events);
        }
        hashmap_done(&c->objs);
        thunk_va_space_free(c->outer);
        free(c->queues);
        pthread_mutex_destroy(&c->fault_lock);
        free(c->fired);
        broker_client_set_account(c, NULL);
        broker_client_drop_uid(c);
        /* the client's own GPU VM: closing it releases anything the driver still holds for it */
        if (c->own_ctx)
                driver_ctx_free(c->b->drv, c->ctx);
        pthread_mutex_lock(&c->b->lock);
        c->b->clients--;
        pthread_mutex_unlock(&c->b->lock);
        free(c);
        return NULL;
}
