/* Pages of the process swapped for other pages at the same address, with no moment where a write is lost. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/*
 * Put the shared mapping at @shared (@size bytes, writable) in place of the process's pages at @va, with
 * what those pages hold: every page that was written or that holds file data, at the moment of the swap
 * (the range is write-protected meanwhile; another thread's write waits and then lands on the new pages).
 * The mapping stays at @shared too. 0 or a negative errno, the pages at @va unchanged then.
 */
int swap_in_shared(uint64_t va, uint64_t size, uint64_t shared);

/* Put private pages in place of the mapping at @va, with what it holds. 0 or a negative errno. */
int swap_out_private(uint64_t va, uint64_t size);

/* *@ret_any: a page of [va, va + size) was ever written (present, or swapped out). */
int swap_touched(uint64_t va, uint64_t size, bool *ret_any);

/* In a child after fork(): the swap's lock as new (a thread that held it is not in the child). */
void swap_after_fork_in_child(void);
