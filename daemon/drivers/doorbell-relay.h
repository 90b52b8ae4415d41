/* The doorbell relay: a thread that rings queues' doorbells from their write pointers, for a driver whose
 * queues belong to contexts of the daemon's while their producers are other processes. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/*
 * Only the process that owns a KFD context may map its doorbells (kfd_doorbell_mmap() maps the caller's
 * own), so a client's stores to what it took for its doorbell reach nobody. What it does write where the
 * daemon can read it is the queue's write pointer: the relay looks at each queue's write pointer and,
 * when it moved, writes the value to the queue's doorbell in the daemon's mapping, as the client's ROCr
 * would have (for an AQL queue the id of the last packet written, that is the write pointer minus one;
 * for SDMA and PM4 the write pointer itself).
 *
 * The write pointer is read through a read-only mapping of the relay's own of the memory's file, so the
 * memory stays readable for as long as the queue is known here even if the client frees it. It polls
 * (a store to memory is nothing the daemon can wait for): every 20 us after a ring, backing off to every
 * 1 ms while nothing moves, and not at all while no queue is registered. A look is one load per queue. A
 * queue whose write pointer has not moved for a second is dormant and looked at every 8 ms only, and while
 * every queue is dormant the relay wakes every 8 ms: the first ring of a queue idle that long may wait up
 * to 8 ms, and idle queues cost an eighth of a 1 ms look each.
 */
typedef struct DoorbellRelay DoorbellRelay;

int doorbell_relay_new(DoorbellRelay **ret);
/* Stops the thread and unmaps every write pointer. NULL-safe. */
void doorbell_relay_free(DoorbellRelay *r);
/*
 * Registers queue @id of @owner (any key; the driver's context): its write pointer at @wptr_offset (8-byte
 * aligned) of file @wptr_fd, which the relay maps itself (the fd may be closed after), and its doorbell.
 * -EINVAL for a misaligned offset, mmap's errno, -ENOMEM.
 */
int doorbell_relay_add(DoorbellRelay *r, const void *owner, uint32_t id, int wptr_fd, uint64_t wptr_offset,
                       volatile uint64_t *doorbell, bool aql);
/* After each look that rang doorbells, @fn(@arg) is called on the relay's thread, without its lock (the
 * model's engines sleep until then). Set before the first queue is added. */
void doorbell_relay_set_notify(DoorbellRelay *r, void (*fn)(void *arg), void *arg);
/* Forgets queue @id of @owner (nothing if unknown); once it returns, the relay touches neither pointer. */
void doorbell_relay_remove(DoorbellRelay *r, const void *owner, uint32_t id);
/* Forgets every queue of @owner. */
void doorbell_relay_remove_owner(DoorbellRelay *r, const void *owner);
/* Queues registered, and doorbell writes made since the relay started. */
void doorbell_relay_stats(DoorbellRelay *r, uint32_t *ret_queues, uint64_t *ret_rings);
