/* The bump allocator: 16-byte aligned pieces of one buffer, malloc when it is full. */
#include "arena.h"

#include <errno.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif

#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define ARENA_ALIGN 16u

int arena_init(Arena *a, size_t cap)
{
        a->buf = malloc(cap);
        if (!a->buf)
                return -ENOMEM;
        a->cap = cap;
        a->used = a->spilled = 0;
        POISON(a->buf, a->cap);
        return 0;
}

void arena_done(Arena *a)
{
        if (a->buf)
                UNPOISON(a->buf, a->cap);
        free(a->buf);
        a->buf = NULL;
        a->cap = a->used = 0;
}

static bool owns(const Arena *a, const void *p)
{
        return a->buf && (const uint8_t *)p >= a->buf && (const uint8_t *)p < a->buf + a->cap;
}

void *arena_alloc(Arena *a, size_t size)
{
        size_t at = (a->used + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);

        if (a->buf && size <= a->cap && at <= a->cap - size) {
                void *p = a->buf + at;
                a->used = at + size;
                UNPOISON(p, size);
                return p;
        }
        a->spilled++;
        return malloc(size ? size : 1);
}

void arena_free(Arena *a, void *p)
{
        if (p && !owns(a, p))
                free(p);
}

void arena_reset(Arena *a)
{
        if (a->buf && a->used)
                POISON(a->buf, a->used);
        a->used = a->spilled = 0;
}
