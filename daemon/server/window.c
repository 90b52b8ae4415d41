/* Client VA windows: carved from the manager's VA space, backed by a PROT_NONE reservation in the daemon. */
#include "window.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "class-state.h"
#include "core.h"
#include "base/vaman.h"
#include "base/util.h"
#include "map.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static int reserve_range(uint64_t base, uint64_t size)
{
        return map_at(base, size, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
}

/*
 * A window's place in the daemon: reserved, never mapped over (0, or -EEXIST where something lies there).
 * The space's guard after the window is reserved with it when it is free (*@ret_tail: its bytes, else 0):
 * windows handed out one after the other then touch, and the kernel merges their reservations into one
 * mapping, so that a thousand clients cost the daemon one entry of vm.max_map_count, not a thousand.
 */
static int reserve_here(const ThunkVaSpace *space, uint64_t base, uint64_t size, uint64_t *ret_tail)
{
        uint64_t guard = thunk_va_space_guard(space);

        *ret_tail = 0;
        if (guard && base + size + guard <= thunk_va_space_limit(space) &&
            reserve_range(base, size + guard) == 0) {
                *ret_tail = guard;
                return 0;
        }
        return reserve_range(base, size);
}

typedef struct Range {
        uint64_t start, end;
} Range;

static int range_cmp(const void *a, const void *b)
{
        const Range *x = a, *y = b;
        return x->start < y->start ? -1 : x->start > y->start;
}

int window_space_init(ThunkVaSpace *va)
{
        uint64_t lo = thunk_va_space_base(va), hi = thunk_va_space_limit(va),
                 guard = thunk_va_space_guard(va);
        _cleanup_fclose_ FILE *f = fopen("/proc/self/maps", "re");
        _cleanup_free_ Range *ranges = NULL;
        size_t n = 0, cap = 0;
        char line[512];

        if (!f)
                return -errno;
        /* What the daemon itself already maps inside the space (a sanitizer's shadow, a large early mapping)
         * can never be a client window here: keep it out of the books from the start. */
        while (fgets(line, sizeof(line), f)) {
                unsigned long long a, b;
                if (sscanf(line, "%llx-%llx", &a, &b) != 2 || b <= lo || a >= hi)
                        continue;
                if (ARRAY_RESERVE(ranges, cap, n + 1, 64) < 0)
                        return -ENOMEM;
                a = a < lo ? lo : a & ~(WINDOW_ALIGN - 1);
                b = (b + WINDOW_ALIGN - 1) & ~(WINDOW_ALIGN - 1);
                ranges[n++] = (Range){a, b > hi ? hi : b};
        }
        if (n) /* ranges is NULL when nothing is mapped there */
                qsort(ranges, n, sizeof(*ranges), range_cmp);
        for (size_t i = 0; i < n;) {
                Range r = ranges[i++];
                /* merge neighbours closer than a guard apart: their books would collide */
                while (i < n && ranges[i].start <= r.end + 2 * guard) {
                        if (ranges[i].end > r.end)
                                r.end = ranges[i].end;
                        i++;
                }
                if (r.end + guard > hi)
                        r.end = hi - guard;
                if (r.end <= r.start)
                        continue;
                int err = thunk_va_alloc_fixed(va, r.start, r.end - r.start, NULL);
                if (err < 0)
                        return err;
        }
        return 0;
}

static int window_new(Conn *c, uint64_t size, ThunkVaSpace **ret, uint64_t *ret_tail)
{
        Manager *m = c->m;
        ThunkVaSpace *blocked[32];
        size_t n_blocked = 0;
        int r;

        ThunkVaSpace *space = c->low_window ? m->va_low : m->va;

        if (!space)
                return -ENOSPC; /* no low space on this machine */
        for (;;) {
                ThunkVaSpace *w = NULL;
                r = thunk_va_space_new_window(space, size, WINDOW_ALIGN, WINDOW_GUARD_OF(c), &w);
                if (r < 0)
                        break;
                reserve_here(space, thunk_va_space_base(w), size, ret_tail);
                if (r == 0) {
                        *ret = w;
                        break;
                }
                /* The daemon itself uses part of that range: keep it out of reach while we look further. */
                if (n_blocked == sizeof(blocked) / sizeof(blocked[0])) {
                        thunk_va_space_free(w);
                        r = -ENOSPC;
                        break;
                }
                blocked[n_blocked++] = w;
        }
        while (n_blocked > 0)
                thunk_va_space_free(blocked[--n_blocked]);
        return r;
}

static const char *human(uint64_t v, char *buf, size_t len)
{
        if (v >= (1ull << 40) && v % (1ull << 40) == 0)
                snprintf(buf, len, "%llu TiB", (unsigned long long)(v >> 40));
        else if (v >= (1ull << 30) && v % (1ull << 30) == 0)
                snprintf(buf, len, "%llu GiB", (unsigned long long)(v >> 30));
        else if (v % (1ull << 20) == 0)
                snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
        else
                snprintf(buf, len, "%llu bytes", (unsigned long long)v);
        return buf;
}

unsigned window_count_of_class(const Manager *m, const ClassState *s)
{
        unsigned n = 0;

        /* counted where they are, so no path that gives a window back can forget the class's count */
        for (const Conn *c = m->conns; c; c = c->next)
                if (c->cls == s)
                        n += window_count(c);
        return n;
}

uint64_t window_bytes_of_uid(const Manager *m, uid_t uid)
{
        uint64_t n = 0;

        /* counted where they are (a connection leaves the list when it is killed, its windows go when it is
         * freed, one loop round later), so no path that gives a window back can forget the count */
        for (const Conn *c = m->conns; c; c = c->next)
                if (c->ident.uid == uid)
                        n += window_count(c) * c->window_size;
        return n;
}

/* May @c hold one more window of @size bytes? Checked before anything is allocated: a refusal changes
 * nothing. */
static int window_quota(const Conn *c, uint64_t size, char *reason, size_t len)
{
        const Manager *m = c->m;
        uint64_t held = window_bytes_of_uid(m, c->ident.uid), cap = m->opts.max_window_bytes_per_uid;
        char b1[32], b2[32], b3[32];

        if (held > cap || size > cap - held) {
                snprintf(reason, len, "uid %u holds %s of VA windows, its limit is %s: %s more is refused",
                         (unsigned)c->ident.uid, human(held, b1, sizeof(b1)), human(cap, b2, sizeof(b2)),
                         human(size, b3, sizeof(b3)));
                return -EDQUOT;
        }
        if (c->cls) {
                unsigned used = window_count_of_class(m, c->cls);
                if (used >= c->cls->max_windows) {
                        snprintf(reason, len, "class '%s' window limit: %u in use of %llu", c->cls->name,
                                 used, (unsigned long long)c->cls->max_windows);
                        return -EDQUOT;
                }
        }
        return 0;
}

int window_assign(Conn *c, uint64_t size, char *reason, size_t len)
{
        ThunkVaSpace *w = NULL;
        int r;

        if (c->window)
                return -EALREADY;
        r = window_quota(c, size, reason, len);
        if (r < 0)
                return r;
        r = window_new(c, size, &w, &c->window_tail);
        if (r < 0)
                return r;
        c->window = w;
        c->window_base = thunk_va_space_base(w);
        c->window_size = size;
        return 0;
}

int window_restore(Conn *c, uint64_t base, uint64_t size)
{
        ThunkVaSpace *space = c->low_window ? c->m->va_low : c->m->va, *w = NULL;
        int r;

        if (c->window)
                return -EALREADY;
        if (!space)
                return -ENOSPC;
        if (size == 0 || size % WINDOW_ALIGN || base % WINDOW_ALIGN)
                return -EINVAL;
        r = thunk_va_space_new_window_at(space, base, size, WINDOW_GUARD_OF(c), &w);
        if (r < 0)
                return r;
        r = reserve_here(space, base, size, &c->window_tail);
        if (r < 0) {
                thunk_va_space_free(w);
                return r == -EEXIST ? -EADDRINUSE : r;
        }
        c->window = w;
        c->window_base = base;
        c->window_size = size;
        return 0;
}

int window_retry(Conn *c, uint64_t failed_base, char *reason, size_t len)
{
        ThunkVaSpace *old = c->window, *w = NULL;
        uint64_t tail = 0;
        int r;

        if (!old || failed_base != c->window_base)
                return -EINVAL;
        if (c->n_window_rejected >= WINDOW_MAX_RETRIES)
                return -ENOSPC;
        r = window_quota(c, c->window_size, reason, len);
        if (r < 0)
                return r;
        /* Allocate the new window while the old one is still held, so it cannot come back. */
        r = window_new(c, c->window_size, &w, &tail);
        if (r < 0)
                return r;
        /* Keep the rejected range (books and reservation) for this client's lifetime: its address space is
         * busy there, and handing it to the next client is fine but to this one pointless. */
        c->window_rejected_tail[c->n_window_rejected] = c->window_tail;
        c->window_rejected[c->n_window_rejected++] = old;
        c->window_tail = tail;
        c->window = w;
        c->window_base = thunk_va_space_base(w);
        return 0;
}

void window_take(Conn *c, WindowSet *ret)
{
        *ret = (WindowSet){
                .window = c->window, .base = c->window_base, .size = c->window_size, .tail = c->window_tail};
        while (c->n_window_rejected > 0 && ret->n_rejected < WINDOW_MAX_RETRIES) {
                c->n_window_rejected--;
                ret->rejected_tail[ret->n_rejected] = c->window_rejected_tail[c->n_window_rejected];
                ret->rejected[ret->n_rejected++] = c->window_rejected[c->n_window_rejected];
        }
        c->window = NULL;
}

void window_set_release(WindowSet *ws)
{
        if (ws->window) {
                munmap((void *)(uintptr_t)ws->base, ws->size + ws->tail);
                ws->window = thunk_va_space_free(ws->window);
        }
        while (ws->n_rejected > 0) {
                ThunkVaSpace *w = ws->rejected[--ws->n_rejected];
                munmap((void *)(uintptr_t)thunk_va_space_base(w),
                       ws->size + ws->rejected_tail[ws->n_rejected]);
                thunk_va_space_free(w);
        }
}

void window_release(Conn *c)
{
        WindowSet ws;

        window_take(c, &ws);
        window_set_release(&ws);
}
