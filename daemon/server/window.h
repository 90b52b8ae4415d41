/* Client VA windows: a slice of the SVM aperture per client, reserved in the daemon and in the client. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "base/vaman.h"

#define WINDOW_ALIGN (2ull << 20)
#define WINDOW_GUARD 4096ull
/* A low window's client is a client-side KFD: libhsakmt places every object itself, with guard pages of its
 * own where it wants them, and may place objects back to back as KFD lets it (scratch slices): no guard. */
#define WINDOW_GUARD_OF(c) ((c)->low_window ? 0 : WINDOW_GUARD)
#define WINDOW_MAX_RETRIES 4
/* Windows start at 1 TiB: low addresses hold non-PIE executables and brk heaps in many clients. */
#define WINDOW_SPACE_START (1ull << 40)
/*
 * Clients that need their window below 1 TiB (libhsakmt 5.2 refuses an SVM aperture above it: ROCm through
 * gpumemd) get one from 64 GiB up, above where executables and their heaps live, in a space of its own.
 */
#define WINDOW_LOW_START (64ull << 30)

/* VA windows @c holds: its current one and the refused ones it keeps until it leaves. */
static inline unsigned window_count(const Conn *c)
{
        return (c->window ? 1u : 0u) + c->n_window_rejected;
}
typedef struct ClassState ClassState;

/* VA windows the connections of class @s hold now: each one's current window and those it could not
 * reserve. */
unsigned window_count_of_class(const Manager *m, const ClassState *s);
/* Bytes of VA windows the connections of @uid hold (current and refused ones). */
uint64_t window_bytes_of_uid(const Manager *m, uid_t uid);

/* Mark what the daemon already maps inside the space as taken (at start-up). */
int window_space_init(ThunkVaSpace *va);
/*
 * Give @c a window of @size bytes (reserved PROT_NONE in the daemon at the same address). -EDQUOT, with
 * @reason, when its uid would hold more than max-window-bytes-per-uid or its class more than its `windows`.
 */
int window_assign(Conn *c, uint64_t size, char *reason, size_t len);
/* The client could not reserve its window at @failed_base: assign another, different one (the refused one
 * stays held and counted). -EINVAL, -ENOSPC after WINDOW_MAX_RETRIES, -EDQUOT as window_assign. */
int window_retry(Conn *c, uint64_t failed_base, char *reason, size_t len);
/*
 * Give @c the window it held under the daemon that handed it over: [@base, @base + @size) exactly, in the
 * low space when c->low_window. The quotas are not asked again (the window was granted and lives in the
 * client). -EADDRINUSE when the range is taken here (in the books, or by the daemon's own mappings).
 */
int window_restore(Conn *c, uint64_t base, uint64_t size);
/* Release the window and every range kept back for this client. */
void window_release(Conn *c);

/* A connection's windows taken out of it, to be released later (after a teardown in slices). */
typedef struct WindowSet {
        ThunkVaSpace *window;
        uint64_t base, size, tail;
        ThunkVaSpace *rejected[WINDOW_MAX_RETRIES];
        uint64_t rejected_tail[WINDOW_MAX_RETRIES];
        unsigned n_rejected;
} WindowSet;

/* Move @c's windows into @ret; @c holds none after. */
void window_take(Conn *c, WindowSet *ret);
void window_set_release(WindowSet *ws);
