/* Pages of the process swapped for other pages at the same address, with no moment where a write is lost. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * Put the shared mapping at @shared (@size bytes, writable) in place of the process's pages at @va, with
 * what those pages hold: every page that was written or that holds file data, at the moment of the swap
 * (the range is write-protected meanwhile; another thread's write waits and then lands on the new pages).
 * The mapping stays at @shared too. The old pages are kept aside, read-only, at *@ret_kept when the range
 * was one mapping (else 0: dropped). 0 or a negative errno, the pages at @va unchanged then.
 */
int swap_in_shared(uint64_t va, uint64_t size, uint64_t shared, uint64_t *ret_kept);

/* Put private pages in place of the mapping at @va, with what it holds: the pages kept at the swap in
 * (@kept), of which only those that differ are written, or new ones. 0 or a negative errno (@kept is
 * still the caller's then). */
int swap_out_private(uint64_t va, uint64_t size, uint64_t kept);

typedef struct SwapRange {
        uint64_t va, size;
} SwapRange;

/*
 * The parts of [va, va + size) where the buffer mapped at @shared is still mapped, each at its own place
 * (the process may have unmapped or remapped what was swapped in: free() of a large block does, without
 * a call the layer sees). Into @ret (at most @cap, merged where adjacent). -ENOENT: nothing at @shared.
 */
int swap_parts_mapped(uint64_t va, uint64_t size, uint64_t shared, SwapRange *ret, size_t cap, size_t *ret_n);

/* Let go of pages kept at a swap in that will not be swapped back. */
void swap_drop_kept(uint64_t kept, uint64_t size);

/* *@ret_any: a page of [va, va + size) was ever written (present, or swapped out). */
int swap_touched(uint64_t va, uint64_t size, bool *ret_any);

/*
 * SIGSEGV's handler as the program sets and reads it, once the swap's is installed: the program's becomes
 * the one the swap's handler calls for the faults that are not a swap's, and the swap's stays in place
 * (runtimes such as LLVM's set a handler and later restore the default). 1 when done so, 0 when the call
 * goes on to libc.
 */
int swap_sigaction(int sig, const struct sigaction *act, struct sigaction *old);

/* In a child after fork(): the swap's lock as new (a thread that held it is not in the child), and its view
 * of the pages the child's own. swap_out_private() works in the child then (its only thread). */
void swap_after_fork_in_child(void);
