/* A small open-addressing hash map from non-zero 64-bit keys to pointers, shared by the daemon and the
 * library. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct HashMap {
        uint64_t *keys; /* 0 = empty, UINT64_MAX = deleted */
        void **values;
        size_t cap;  /* a power of two, or 0 */
        size_t n;    /* live entries */
        size_t used; /* live + deleted slots */
} HashMap;

#define HASHMAP_INIT                                                                                         \
        {                                                                                                    \
                0                                                                                            \
        }

/* Insert @key (non-zero, not UINT64_MAX, not present). 0, -EEXIST, -EINVAL or -ENOMEM. */
int hashmap_put(HashMap *h, uint64_t key, void *value);
void *hashmap_get(const HashMap *h, uint64_t key);
/* Give present @key the value @value, in place (never allocates); returns the old value, or NULL if absent.
 */
void *hashmap_replace(HashMap *h, uint64_t key, void *value);
/* Remove and return the value, or NULL. */
void *hashmap_remove(HashMap *h, uint64_t key);
/* Iterate: start with *iter = 0; returns false at the end. The map must not change while iterating. */
bool hashmap_next(const HashMap *h, size_t *iter, uint64_t *ret_key, void **ret_value);
void hashmap_done(HashMap *h);
