/* Client VA windows: a slice of the SVM aperture per client, reserved in the daemon and in the client. */
#pragma once

#include <stdint.h>

#include "conn.h"
#include "vaman.h"

#define WINDOW_ALIGN       (2ull << 20)
#define WINDOW_GUARD       4096ull
#define WINDOW_MAX_RETRIES 4
/* Windows start at 1 TiB: low addresses hold non-PIE executables and brk heaps in many clients. */
#define WINDOW_SPACE_START (1ull << 40)

/* Mark what the daemon already maps inside the space as taken (at start-up). */
int window_space_init(ThunkVaSpace *va);
/* Give @c a window of @size bytes (reserved PROT_NONE in the daemon at the same address). */
int window_assign(Conn *c, uint64_t size);
/* The client could not reserve its window at @failed_base: assign another, different one. */
int window_retry(Conn *c, uint64_t failed_base);
/* Release the window and every range kept back for this client. */
void window_release(Conn *c);
