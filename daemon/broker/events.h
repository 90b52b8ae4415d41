/* KFD events of one client: ids, types, signalled state, the event page it named, and waits on them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reason.h"

/* KFD's numbers (kfd_ioctl.h): event types, wait results, and the ids of signal and other events. */
#define EVENTS_TYPE_SIGNAL     0u
#define EVENTS_TYPE_MEMORY     8u
#define EVENTS_TYPE_MAX        8u
#define EVENTS_SIGNAL_LIMIT    4096u
#define EVENTS_FIRST_NONSIGNAL 0x40000000u
#define EVENTS_WAIT_COMPLETE   0u
#define EVENTS_WAIT_TIMEOUT    1u
#define EVENTS_WAIT_FAIL       2u
/* Events one wait may name, waits one client may have pending at once, and events of other types than
 * signal events a client may hold (signal events are bounded by their 4096 slots). */
#define EVENTS_WAIT_MAX_IDS      256u
#define EVENTS_MAX_PENDING_WAITS 256u
#define EVENTS_MAX_OTHER         256u

typedef struct ClientEvents ClientEvents;
typedef struct EventWait EventWait;

/* A pending wait's end: @result is EVENTS_WAIT_COMPLETE or EVENTS_WAIT_FAIL (an event it named went). The
 * wait is out of the books by then; the callee frees what it attached. */
typedef void (*EventWaitDone)(EventWait *w, unsigned result, void *ctx);

ClientEvents *client_events_new(void);
/* Every pending wait is dropped without its callback (the caller ended them already). */
ClientEvents *client_events_free(ClientEvents *e);
size_t client_events_count(const ClientEvents *e);

/*
 * A new event of KFD @type. The first event may name the event page (@page_va, @page_size: memory of the
 * client's that libhsakmt allocated for it); a signal event takes the lowest free id below the page's slot
 * count (4096 without a page) and that id is its slot. -EINVAL: unknown type, or a page when one is set
 * or after signal events were made without one; -ENOSPC: no id left (or EVENTS_MAX_OTHER other events).
 */
int client_event_create(ClientEvents *e, uint32_t type, bool auto_reset, uint64_t page_va, uint64_t page_size,
                        uint32_t *ret_id, uint32_t *ret_slot, Reason *w);
/* A GPU VM fault as a memory event holds it (KFD's kfd_hsa_memory_exception_data). */
typedef struct EventsMemoryFault {
        uint32_t gpu_id;
        uint64_t va; /* the faulting page */
        bool not_present, read_only, no_execute;
} EventsMemoryFault;

/* A GPU VM fault of the client's context: every memory event takes it and is set, as KFD's
 * kfd_signal_vm_fault_event() does. Returns how many there were. */
int client_events_memory_fault(ClientEvents *e, const EventsMemoryFault *f);
/* The fault memory event @id holds: true and it, or false (no such event, or none came). */
bool client_event_memory_fault(const ClientEvents *e, uint32_t id, EventsMemoryFault *ret);

/* The event page the client named: true and its range, or false (none). */
bool client_events_page(const ClientEvents *e, uint64_t *ret_va, uint64_t *ret_size);
/* The lowest signal event id at or above @from, or -1: for walking the slots of the event page. */
int64_t client_events_next_signal(const ClientEvents *e, uint32_t from);
/* Pending waits that name it end with EVENTS_WAIT_FAIL. -EINVAL: no such event. */
int client_event_destroy(ClientEvents *e, uint32_t id, Reason *w);
/*
 * Set a signal event as KFD does: every pending wait on it is activated; an auto-reset event with such
 * waits stays unsignalled (they took it), any other becomes signalled. Waits that are complete end.
 */
int client_event_set(ClientEvents *e, uint32_t id, Reason *w);
int client_event_reset(ClientEvents *e, uint32_t id, Reason *w);

/*
 * Wait for any (or with @all, all) of @ids: 1 when that holds now (signalled auto-reset events are
 * consumed), 0 when the wait is pending (*@ret is it; @done is called when it completes), -EINVAL for an
 * unknown id or more than EVENTS_WAIT_MAX_IDS, -EAGAIN when it would be pending and
 * EVENTS_MAX_PENDING_WAITS are. @pend false: never pending (a timeout of 0), 0 means not yet.
 */
int client_event_wait(ClientEvents *e, const uint32_t *ids, size_t n, bool all, bool pend, EventWaitDone done,
                      void *ctx, EventWait **ret, Reason *w);
/* A pending wait ends without its callback (its timeout, its connection going). */
void client_event_wait_cancel(ClientEvents *e, EventWait *w);
