/* KFD events of one client, kept as KFD keeps them: the books only, no memory of the client is touched. */
#include "events.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "macro.h"

typedef struct Event {
        uint32_t id;
        uint32_t type;
        bool auto_reset;
        bool signaled;
        bool faulted; /* a memory event: fault holds the last GPU VM fault */
        EventsMemoryFault fault;
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
        uint64_t signal_used[EVENTS_SIGNAL_LIMIT / 64]; /* a bit per signal id (slot) in use */
        size_t n_signal;
        uint32_t next_other;         /* where the next id of another type is looked for */
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
        return ARRAY_FIND(e->events, e->n, id, id);
}

static bool is_signal(uint32_t type)
{
        return type == EVENTS_TYPE_SIGNAL; /* (the debug event is the debugger's, which gpumemd has not) */
}

/* The lowest free signal id below @limit, or -1. */
static int64_t free_signal_id(const ClientEvents *e, uint32_t limit)
{
        for (uint32_t word = 0; word * 64 < limit; word++) {
                uint64_t free_bits = ~e->signal_used[word];
                if (free_bits) {
                        uint32_t id = word * 64 + (uint32_t)__builtin_ctzll(free_bits);
                        return id < limit ? (int64_t)id : -1;
                }
        }
        return -1;
}

int client_event_create(ClientEvents *e, uint32_t type, bool auto_reset, uint64_t page_va, uint64_t page_size,
                        uint32_t *ret_id, uint32_t *ret_slot, Reason *w)
{
        bool signal = is_signal(type);
        uint32_t id;

        if (type > EVENTS_TYPE_MAX || type == 5)
                return reason_set(w, -EINVAL, "event type %u is not one gpumemd keeps", type);
        if (page_va) {
                if (e->page_va)
                        return reason_set(w, -EINVAL, "the event page is set already");
                /* as KFD, which makes a page of its own at the first signal event without one */
                if (e->n_signal)
                        return reason_set(w, -EINVAL, "signal events exist already without an event page");
                if (page_size < 8)
                        return reason_set(w, -EINVAL, "an event page of %llu bytes holds no slot",
                                          (unsigned long long)page_size);
        }
        if (signal) {
                uint64_t size = page_va ? page_size : e->page_va ? e->page_size : 8ull * EVENTS_SIGNAL_LIMIT;
                uint64_t slots = size / 8 < EVENTS_SIGNAL_LIMIT ? size / 8 : EVENTS_SIGNAL_LIMIT;
                int64_t free_id = free_signal_id(e, (uint32_t)slots);
                if (free_id < 0)
                        return reason_set(w, -ENOSPC, "every signal slot is taken");
                id = (uint32_t)free_id;
        } else {
                if (e->n - e->n_signal >= EVENTS_MAX_OTHER)
                        return reason_set(w, -ENOSPC, "%u events other than signal events are held already",
                                          EVENTS_MAX_OTHER);
                /* ids go up from the first non-signal id; with at most EVENTS_MAX_OTHER in use a free one
                 * is found within as many steps */
                if (e->next_other < EVENTS_FIRST_NONSIGNAL || e->next_other == UINT32_MAX)
                        e->next_other = EVENTS_FIRST_NONSIGNAL;
                while (find(e, e->next_other))
                        e->next_other =
                                e->next_other == UINT32_MAX - 1 ? EVENTS_FIRST_NONSIGNAL : e->next_other + 1;
                id = e->next_other;
        }
        if (ARRAY_RESERVE(e->events, e->cap, e->n + 1, 16) < 0)
                return reason_set(w, -ENOMEM, "out of memory");
        e->events[e->n++] = (Event){.id = id, .type = type, .auto_reset = auto_reset};
        if (signal) {
                e->signal_used[id / 64] |= 1ull << (id % 64);
                e->n_signal++;
        } else {
                e->next_other = id + 1;
        }
        if (page_va) {
                e->page_va = page_va;
                e->page_size = page_size;
        }
        *ret_id = id;
        *ret_slot = signal ? id : 0;
        return 0;
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
        if (is_signal(ev->type)) {
                e->signal_used[id / 64] &= ~(1ull << (id % 64));
                e->n_signal--;
        }
        *ev = e->events[--e->n];
        finish_waits(e, &id);
        return 0;
}

/* Signal @ev as KFD's set_event() does: waits on it are activated; an auto-reset one with waiters stays
 * unsignalled (they took it). */
static void signal_event(ClientEvents *e, Event *ev)
{
        bool waited = false;

        for (EventWait *wt = e->waits; wt; wt = wt->next)
                for (size_t i = 0; i < wt->n; i++)
                        if (wt->ids[i] == ev->id) {
                                wt->activated[i] = true;
                                waited = true;
                        }
        ev->signaled = !ev->auto_reset || !waited;
}

int client_events_memory_fault(ClientEvents *e, const EventsMemoryFault *f)
{
        int n = 0;

        for (size_t i = 0; i < e->n; i++) {
                Event *ev = &e->events[i];
                if (ev->type != EVENTS_TYPE_MEMORY)
                        continue;
                ev->fault = *f;
                ev->faulted = true;
                signal_event(e, ev);
                n++;
        }
        if (n)
                finish_waits(e, NULL);
        return n;
}

bool client_event_memory_fault(const ClientEvents *e, uint32_t id, EventsMemoryFault *ret)
{
        for (size_t i = 0; i < e->n; i++)
                if (e->events[i].id == id && e->events[i].faulted) {
                        *ret = e->events[i].fault;
                        return true;
                }
        return false;
}

bool client_events_page(const ClientEvents *e, uint64_t *ret_va, uint64_t *ret_size)
{
        if (!e->page_va)
                return false;
        *ret_va = e->page_va;
        *ret_size = e->page_size;
        return true;
}

int64_t client_events_next_signal(const ClientEvents *e, uint32_t from)
{
        for (uint32_t word = from / 64; word < EVENTS_SIGNAL_LIMIT / 64; word++) {
                uint64_t bits = e->signal_used[word];
                if (word == from / 64)
                        bits &= ~0ull << (from % 64);
                if (bits)
                        return (int64_t)word * 64 + __builtin_ctzll(bits);
        }
        return -1;
}

int client_event_set(ClientEvents *e, uint32_t id, Reason *w)
{
        Event *ev = find(e, id);

        if (!ev || !is_signal(ev->type))
                return reason_set(w, -EINVAL, "no signal event %u", id);
        signal_event(e, ev);
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
        wt = calloc(1, sizeof(*wt));
        if (!wt)
                return reason_set(w, -ENOMEM, "out of memory");
        wt->all = all;
        wt->n = n;
        memcpy(wt->ids, ids, n * sizeof(*ids));
        /* what is signalled now activates the wait */
        for (size_t i = 0; i < n; i++)
                wt->activated[i] = find(e, ids[i])->signaled;
        /* only a wait that must pend is held to the limit, before it takes anything */
        if (!complete(wt) && pend && e->n_waits >= EVENTS_MAX_PENDING_WAITS) {
                free(wt);
                return reason_set(w, -EAGAIN, "%u waits are pending already", EVENTS_MAX_PENDING_WAITS);
        }
        /* an auto-reset event it saw is taken by it */
        for (size_t i = 0; i < n; i++) {
                Event *ev = find(e, ids[i]);
                if (wt->activated[i] && ev->auto_reset)
                        ev->signaled = false;
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
