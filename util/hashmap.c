/* A small open-addressing hash map (linear probing, tombstones) from 64-bit handles to objects. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "hashmap.h"

#define TOMBSTONE UINT64_MAX

static size_t slot_of(uint64_t key, size_t cap)
{
        /* keys are random handles already; a multiplicative mix keeps sequential test keys spread too */
        return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

static int grow(HashMap *h, size_t new_cap)
{
        uint64_t *keys = calloc(new_cap, sizeof(*keys));
        void **values = calloc(new_cap, sizeof(*values));

        if (!keys || !values) {
                free(keys);
                free(values);
                return -ENOMEM;
        }
        for (size_t i = 0; i < h->cap; i++) {
                if (h->keys[i] == 0 || h->keys[i] == TOMBSTONE)
                        continue;
                size_t s = slot_of(h->keys[i], new_cap);
                while (keys[s])
                        s = (s + 1) & (new_cap - 1);
                keys[s] = h->keys[i];
                values[s] = h->values[i];
        }
        free(h->keys);
        free(h->values);
        h->keys = keys;
        h->values = values;
        h->cap = new_cap;
        h->used = h->n;
        return 0;
}

int hashmap_put(HashMap *h, uint64_t key, void *value)
{
        size_t s, tomb = SIZE_MAX;

        if (key == 0 || key == TOMBSTONE)
                return -EINVAL;
        if ((h->used + 1) * 4 >= h->cap * 3) {
                /* rebuild at the same size when tombstones fill it, else double */
                size_t cap = h->cap == 0 ? 16 : (h->n + 1) * 2 >= h->cap ? h->cap * 2 : h->cap;
                int r = grow(h, cap);
                if (r < 0)
                        return r;
        }
        for (s = slot_of(key, h->cap);; s = (s + 1) & (h->cap - 1)) {
                if (h->keys[s] == key)
                        return -EEXIST;
                if (h->keys[s] == TOMBSTONE && tomb == SIZE_MAX)
                        tomb = s;
                if (h->keys[s] == 0)
                        break;
        }
        if (tomb != SIZE_MAX)
                s = tomb;
        else
                h->used++;
        h->keys[s] = key;
        h->values[s] = value;
        h->n++;
        return 0;
}

static size_t find(const HashMap *h, uint64_t key)
{
        if (h->cap == 0 || key == 0 || key == TOMBSTONE)
                return SIZE_MAX;
        for (size_t s = slot_of(key, h->cap), probes = 0; probes < h->cap;
             s = (s + 1) & (h->cap - 1), probes++) {
                if (h->keys[s] == key)
                        return s;
                if (h->keys[s] == 0)
                        return SIZE_MAX;
        }
        return SIZE_MAX;
}

void *hashmap_get(const HashMap *h, uint64_t key)
{
        size_t s = find(h, key);
        return s == SIZE_MAX ? NULL : h->values[s];
}

void *hashmap_replace(HashMap *h, uint64_t key, void *value)
{
        size_t s = find(h, key);
        void *v;

        if (s == SIZE_MAX)
                return NULL;
        v = h->values[s];
        h->values[s] = value;
        return v;
}

void *hashmap_remove(HashMap *h, uint64_t key)
{
        size_t s = find(h, key);
        void *v;

        if (s == SIZE_MAX)
                return NULL;
        v = h->values[s];
        h->keys[s] = TOMBSTONE;
        h->values[s] = NULL;
        h->n--;
        return v;
}

bool hashmap_next(const HashMap *h, size_t *iter, uint64_t *ret_key, void **ret_value)
{
        for (size_t i = *iter; i < h->cap; i++) {
                if (h->keys[i] == 0 || h->keys[i] == TOMBSTONE)
                        continue;
                *iter = i + 1;
                if (ret_key)
                        *ret_key = h->keys[i];
                if (ret_value)
                        *ret_value = h->values[i];
                return true;
        }
        *iter = h->cap;
        return false;
}

void hashmap_done(HashMap *h)
{
        free(h->keys);
        free(h->values);
        *h = (HashMap)HASHMAP_INIT;
}
