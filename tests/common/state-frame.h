/* The frame around a hand-over state, written here from its definition (daemon/base/handover.c's comment)
 * rather than with the daemon's code, so that the tests check the format, not the code against itself. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* FNV-1a, 64 bits. */
static inline uint64_t state_fnv1a(const uint8_t *p, size_t n)
{
        uint64_t h = 0xcbf29ce484222325ull;

        for (size_t i = 0; i < n; i++) {
                h ^= p[i];
                h *= 0x100000001b3ull;
        }
        return h;
}

/* "GMDSTATE", the body's length and its hash (little-endian), then @body: into @out (room for len + 24). */
static inline size_t state_frame(const uint8_t *body, size_t len, uint8_t *out)
{
        uint64_t h = state_fnv1a(body, len);

        memcpy(out, "GMDSTATE", 8);
        for (int i = 0; i < 8; i++) {
                out[8 + i] = (uint8_t)((uint64_t)len >> (8 * i));
                out[16 + i] = (uint8_t)(h >> (8 * i));
        }
        if (len)
                memcpy(out + 24, body, len);
        return len + 24;
}
