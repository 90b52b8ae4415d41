/* VA aperture manager: bookkeeping of GPU virtual address ranges (SVM aperture, client windows, handle ids).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A ThunkVaSpace manages the half-open range [base, limit). It only keeps books: it never maps or reserves
 * memory (the caller reserves the aperture itself, e.g. with mmap(PROT_NONE)).
 *
 * Every object occupies [start, start + size) and, right after it, a guard of `guard` bytes (0 allowed)
 * that no other object may use. Object and guard must lie inside the space. Automatic placement is
 * first-fit: the lowest suitably aligned address whose object and guard fit in a free gap.
 *
 * Live objects are kept in an AVL tree keyed by start address; each node also records the free gap in
 * front of it and the largest such gap in its subtree, so that allocation, fixed placement, free and
 * look-up cost O(log n) in the number of live objects (an aligned search may additionally step over
 * gaps that are large enough but not at the requested alignment).
 *
 * Errors (negative errno): size 0, size/address/base/limit/guard not a multiple of THUNK_VA_PAGE_SIZE, or
 * an alignment that is not a power of two >= THUNK_VA_PAGE_SIZE -> -EINVAL; start + size (+ guard)
 * beyond 2^64 -> -EOVERFLOW; a fixed request outside the space -> -ERANGE; a fixed request overlapping
 * another object or its guard -> -EADDRINUSE; no room -> -ENOMEM; a free or look-up that names no
 * object -> -ENOENT. Results are written only on success.
 *
 * Not thread-safe: the owner serialises access.
 */

#define THUNK_VA_PAGE_SIZE 4096ULL

/* Handle apertures are windows of this size at multiples of it (2^47: the first non-canonical address). */
#define THUNK_VA_HANDLE_STEP (1ULL << 47)

typedef struct ThunkVaSpace ThunkVaSpace;

/* One live object, as reported by look-ups and iteration. */
typedef struct ThunkVaObject {
        uint64_t start;
        uint64_t size; /* without the guard */
        void *data;    /* borrowed pointer given at allocation time */
} ThunkVaObject;

/* A range to keep clear of, [start, start + size). */
typedef struct ThunkVaInterval {
        uint64_t start;
        uint64_t size;
} ThunkVaInterval;

/* A space over [base, base + size) with @guard bytes after every object. */
int thunk_va_space_new(uint64_t base, uint64_t size, uint64_t guard, ThunkVaSpace **ret);

/*
 * Carve a window of @size bytes aligned to @align out of @parent (an ordinary object of the parent, so the
 * parent's guard follows it) and return a new space over it whose objects get @guard bytes of guard.
 * The window's data pointer in the parent is the child space. Freeing the child releases the window; the
 * parent must outlive its windows.
 */
int thunk_va_space_new_window(ThunkVaSpace *parent, uint64_t size, uint64_t align, uint64_t guard,
                              ThunkVaSpace **ret);
/* The same at @base exactly (a window carried over from an earlier daemon): -EADDRINUSE, -ERANGE. */
int thunk_va_space_new_window_at(ThunkVaSpace *parent, uint64_t base, uint64_t size, uint64_t guard,
                                 ThunkVaSpace **ret);

/*
 * A space for VA-less objects whose addresses serve only as unique ids: the first window
 * [k * 2^47, (k + 1) * 2^47), k >= 1, that intersects none of @avoid. No guard. -ENOSPC when every
 * window is taken.
 */
int thunk_va_space_new_handles(const ThunkVaInterval *avoid, size_t n_avoid, ThunkVaSpace **ret);

/* Frees the books (not the objects' backing) and, for a window, gives the window back. NULL-safe. */
ThunkVaSpace *thunk_va_space_free(ThunkVaSpace *s);

uint64_t thunk_va_space_base(const ThunkVaSpace *s);
uint64_t thunk_va_space_limit(const ThunkVaSpace *s); /* one past the last address */
uint64_t thunk_va_space_guard(const ThunkVaSpace *s);
size_t thunk_va_space_count(const ThunkVaSpace *s);  /* live objects */
uint64_t thunk_va_space_used(const ThunkVaSpace *s); /* sum of object sizes, guards excluded */
/* The largest free gap in bytes (an object of up to this size minus the guard fits at page alignment). */
uint64_t thunk_va_space_largest_free(const ThunkVaSpace *s);

/* First-fit placement of @size bytes at a multiple of @align; @data is kept with the object. */
int thunk_va_alloc(ThunkVaSpace *s, uint64_t size, uint64_t align, void *data, uint64_t *ret_addr);

/* Place an object exactly at @addr. */
int thunk_va_alloc_fixed(ThunkVaSpace *s, uint64_t addr, uint64_t size, void *data);

/* Free the object that starts exactly at @addr (an address inside an object is -ENOENT). */
int thunk_va_free(ThunkVaSpace *s, uint64_t addr);

/* The object containing @addr (guards do not count as part of an object). */
int thunk_va_lookup(const ThunkVaSpace *s, uint64_t addr, ThunkVaObject *ret);

/* The object with the lowest start >= @addr; iterate with addr = previous start + 1. */
int thunk_va_next(const ThunkVaSpace *s, uint64_t addr, ThunkVaObject *ret);

/*
 * Call @fn for every object in address order; a non-zero return stops the walk and is returned.
 * @fn must not change the space (use thunk_va_next to free while iterating).
 */
int thunk_va_foreach(const ThunkVaSpace *s, int (*fn)(const ThunkVaObject *obj, void *userdata),
                     void *userdata);

/* Check the tree's order, balance and gap books; 0 or -EUCLEAN. O(n), meant for tests. */
int thunk_va_space_verify(const ThunkVaSpace *s);
