/* The fuzzers' reader of their input: bytes taken from the front, zeros once it is used up. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct Reader {
        const uint8_t *p;
        size_t n;
} Reader;

static inline uint8_t rd8(Reader *r)
{
        if (!r->n)
                return 0;
        r->n--;
        return *r->p++;
}

/* @bytes bytes (at most 8), little-endian. */
static inline uint64_t rdn(Reader *r, int bytes)
{
        uint64_t v = 0;
        for (int i = 0; i < bytes; i++)
                v |= (uint64_t)rd8(r) << (8 * i);
        return v;
}
