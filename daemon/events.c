/* KFD events of one client, kept as KFD keeps them: the books only, no memory of the client is touched. */
#include "events.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct Event {
        uint32_t id;
        uint32_t type;
        bool auto_reset;
        bool signaled;
} Event;

struct EventWait {
        EventWait *next;
        EventWaitDone done;
        void *ctx;
        bool all;
        size_t n;
        uint32_t ids[EVENTS_WAIT_MAX_IDS];
        bool activated[EVENTS_WAIT_MAX_IDS];
};

struct ClientEvents {
        Event *events;
        size_t n, cap;
        uint64_t page_va, page_size; /* the event page the client named (0: none) */
        EventWait *waits;
        size_t n_waits;
};

ClientEvents *client_events_new(void)
{
        return calloc(1, sizeof(ClientEvents));
}

ClientEvents *client_events_free(ClientEvents *e)
{
        if (!e)
                return NULL;
        while (e->waits) {
                EventWait *w = e->waits;
                e->waits = w->next;
                free(w);
        }
        free(e->events);
        free(e);
        return NULL;
}

size_t client_events_count(const ClientEvents *e)
{
        return e ? e->n : 0;
}

static Event *find(ClientEvents *e, uint32_t id)
{
        for (size_t i = 0; i < e->n; i++)
                if (e->events[i].id == id)
                        return &e->events[i];
        return NULL;
}

static bool is_signal(uint32_t type)
{
        return type == EVENTS_TYPE_SIGNAL; /* (the debug event is the debugger's, which gpumemd has not) */
}

int client_event_create(ClientEvents *e, uint32_t type, bool auto_reset, uint64_t page_va, uint64_t page_size,
                        uint32_t *ret_id, uint32_t *ret_slot, Reason *w)
{
        uint32_t first, last;

        if (type > EVENTS_TYPE_MAX || type == 5)
                return reason_set(w, -EINVAL, "event type %u is not one gpumemd keeps", type);
        if (page_va) {
                if (e->page_va)
                        return reason_set(w, -EINVAL, "the event page is set already");
                if (page_size < 8)
                        return reason_set(w, -EINVAL, "an event page of %llu bytes holds no slot",
                                          (unsigned long long)page_size);
        }
        if (is_signal(type)) {
                uint64_t slots = (page_va      ? page_size
                                  : e->page_va ? e->page_size
                                               : 8ull * EVENTS_SIGNAL_LIMIT) /
                                 8;
                first = 0;
                last = (uint32_t)(slots < EVENTS_SIGNAL_LIMIT ? slots : EVENTS_SIGNAL_LIMIT) - 1;
        } else {
                first = EVENTS_FIRST_NONSIGNAL;
                last = UINT32_MAX - 1;
        }
        for (uint32_t id = first;; id++) {
                if (!find(e, id)) {
                        if (e->n == e->cap) {
                                size_t cap = e->cap ? e->cap * 2 : 16;
                                Event *more = realloc(e->events, cap * sizeof(*more));
                                if (!more)
                                        return reason_set(w, -ENOMEM, "out of memory");
                                e->events = more;
                                e->cap = cap;
                        }
                        e->events[e->n++] = (Event){.id = id, .type = type, .auto_reset = auto_reset};
                        if (page_va) {
                                e->page_va = page_va;
                                e->page_size = page_size;
                        }
                        *ret_id = id;
                        *ret_slot = is_signal(type) ? id : 0;
                        return 0;
                }
                if (id == last)
                        return reason_set(w, -ENOSPC, "no event id is free");
        }
}

static void wait_unlink(ClientEvents *e, EventWait *w)
{
        for (EventWait **pp = &e->waits; *pp; pp = &(*pp)->next)
                if (*pp == w) {
                        *pp = w->next;
                        e->n_waits--;
                        return;
                }
}

static bool complete(const EventWait *w)
{
        size_t got = 0;

        for (size_t i = 0; i < w->n; i++)
                got += w->activated[i];
        return w->all ? got == w->n : got > 0;
}

/* End the pending waits that are complete (or name @gone), in the order they began. */
static void finish_waits(ClientEvents *e, const uint32_t *gone)
{
        for (EventWait *w = e->waits, *next; w; w = next) {
                bool failed = false;
                next = w->next;
                for (size_t i = 0; gone && i < w->n; i++)
                        failed |= w->ids[i] == *gone;
                if (!failed && !complete(w))
                        continue;
                wait_unlink(e, w);
                w->done(w, failed ? EVENTS_WAIT_FAIL : EVENTS_WAIT_COMPLETE, w->ctx);
                free(w);
                /* the callback may not touch the books, so @next is still there */
        }
}

int client_event_destroy(ClientEvents *e, uint32_t id, Reason *w)
{
        Event *ev = find(e, id);

        if (!ev)
                return reason_set(w, -EINVAL, "no event %u", id);
        *ev = e->events[--e->n];
        finish_waits(e, &id);
        return 0;
}

int client_event_set(ClientEvents *e, uint32_t id, Reason *w)
{
        Event *ev = find(e, id);
        bool waited = false;

        if (!ev || !is_signal(ev->type))
                return reason_set(w, -EINVAL, "no signal event %u", id);
        for (EventWait *wt = e->waits; wt; wt = wt->next)
                for (size_t i = 0; i < wt->n; i++)
                        if (wt->ids[i] == id) {
                                wt->activated[i] = true;
                                waited = true;
                        }
        ev->signaled = !ev->auto_reset || !waited;
        finish_waits(e, NULL);
        return 0;
}

int client_event_reset(ClientEvents *e, uint32_t id, Reason *w)
{
        Event *ev = find(e, id);

        if (!ev)
                return reason_set(w, -EINVAL, "no event %u", id);
        ev->signaled = false;
        return 0;
}

int client_event_wait(ClientEvents *e, const uint32_t *ids, size_t n, bool all, bool pend, EventWaitDone done,
                      void *ctx, EventWait **ret, Reason *w)
{
        EventWait *wt;

        if (n == 0 || n > EVENTS_WAIT_MAX_IDS)
                return reason_set(w, -EINVAL, "a wait names 1 to %u events, not %zu", EVENTS_WAIT_MAX_IDS, n);
        for (size_t i = 0; i < n; i++)
                if (!find(e, ids[i]))
                        return reason_set(w, -EINVAL, "no event %u", ids[i]);
        if (pend && e->n_waits >= EVENTS_MAX_PENDING_WAITS)
                return reason_set(w, -EAGAIN, "%u waits are pending already", EVENTS_MAX_PENDING_WAITS);
        wt = calloc(1, sizeof(*wt));
        if (!wt)
                return reason_set(w, -ENOMEM, "out of memory");
        wt->all = all;
        wt->n = n;
        memcpy(wt->ids, ids, n * sizeof(*ids));
        /* what is signalled now activates the wait; an auto-reset event is taken by it */
        for (size_t i = 0; i < n; i++) {
                Event *ev = find(e, ids[i]);
                if (ev->signaled) {
                        wt->activated[i] = true;
                        if (ev->auto_reset)
                                ev->signaled = false;
                }
        }
        if (complete(wt) || !pend) {
                int r = complete(wt) ? 1 : 0;
                free(wt);
                return r;
        }
        wt->done = done;
        wt->ctx = ctx;
        wt->next = NULL;
        /* at the end of the list: waits end in the order they began */
        EventWait **pp = &e->waits;
        while (*pp)
                pp = &(*pp)->next;
        *pp = wt;
        e->n_waits++;
        *ret = wt;
        return 0;
}

void client_event_wait_cancel(ClientEvents *e, EventWait *w)
{
        wait_unlink(e, w);
        free(w);
}
