/* A bump allocator over one buffer, reset between uses: decoding without a malloc per message. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Allocations come from the buffer while it has room, from malloc after that; arena_free() frees only
 * the latter, arena_reset() forgets the former at once. Under AddressSanitizer the unused part of the buffer
 * is poisoned, so a pointer kept past a reset is still caught.
 */
typedef struct Arena {
        uint8_t *buf;
        size_t cap;
        size_t used;
        size_t spilled; /* allocations that went to malloc since the last reset */
} Arena;

/* A buffer of @cap bytes; -ENOMEM. */
int arena_init(Arena *a, size_t cap);
void arena_done(Arena *a);
void *arena_alloc(Arena *a, size_t size);
void arena_free(Arena *a, void *p);
void arena_reset(Arena *a);
