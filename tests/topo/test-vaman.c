/* Tests of the VA aperture manager: unit cases, windows, handle apertures, and a randomized reference check.
 */
#include "../common/check.h"
#include "base/vaman.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PG   THUNK_VA_PAGE_SIZE
#define MIB  (1ULL << 20)
#define GIB  (1ULL << 30)
#define BASE (1ULL << 40)

static void test_params(void)
{
        ThunkVaSpace *s = NULL;
        uint64_t a = 0;

        CHECK_EQ(thunk_va_space_new(BASE, 0, 0, &s), -EINVAL);
        CHECK_EQ(thunk_va_space_new(BASE + 1, GIB, 0, &s), -EINVAL);
        CHECK_EQ(thunk_va_space_new(BASE, GIB + 1, 0, &s), -EINVAL);
        CHECK_EQ(thunk_va_space_new(BASE, GIB, 100, &s), -EINVAL);
        CHECK_EQ(thunk_va_space_new(UINT64_MAX - PG + 1, 2 * PG, 0, &s), -EOVERFLOW);
        CHECK(s == NULL);
        CHECK_EQ(thunk_va_space_new(BASE, GIB, PG, &s), 0);
        CHECK_EQ(thunk_va_space_base(s), BASE);
        CHECK_EQ(thunk_va_space_limit(s), BASE + GIB);
        CHECK_EQ(thunk_va_space_guard(s), PG);

        CHECK_EQ(thunk_va_alloc(s, 0, PG, NULL, &a), -EINVAL);
        CHECK_EQ(thunk_va_alloc(s, 100, PG, NULL, &a), -EINVAL);
        CHECK_EQ(thunk_va_alloc(s, PG, 0, NULL, &a), -EINVAL);
        CHECK_EQ(thunk_va_alloc(s, PG, 2048, NULL, &a), -EINVAL);
        CHECK_EQ(thunk_va_alloc(s, PG, 3 * PG, NULL, &a), -EINVAL);
        CHECK_EQ(thunk_va_alloc(s, UINT64_MAX & ~(PG - 1), PG, NULL, &a), -EOVERFLOW);
        CHECK_EQ(thunk_va_alloc(s, 2 * GIB, PG, NULL, &a), -ENOMEM);
        CHECK_EQ(thunk_va_alloc(s, GIB, PG, NULL, &a), -ENOMEM); /* the guard does not fit */
        CHECK_EQ(a, 0);
        CHECK_EQ(thunk_va_alloc_fixed(s, BASE + 1, PG, NULL), -EINVAL);
        CHECK_EQ(thunk_va_alloc_fixed(s, BASE, 0, NULL), -EINVAL);
        CHECK_EQ(thunk_va_alloc_fixed(s, BASE - PG, PG, NULL), -ERANGE);
        CHECK_EQ(thunk_va_alloc_fixed(s, BASE + GIB - PG, PG, NULL), -ERANGE); /* guard past the limit */
        CHECK_EQ(thunk_va_alloc_fixed(s, UINT64_MAX - PG + 1, PG, NULL), -EOVERFLOW);
        CHECK_EQ(thunk_va_space_count(s), 0);
        CHECK_EQ(thunk_va_alloc_fixed(s, BASE + GIB - 2 * PG, PG, NULL), 0);
        s = thunk_va_space_free(s);
        CHECK(s == NULL);
        CHECK(thunk_va_space_free(NULL) == NULL);

        /* A space ending at the top of the address range. */
        CHECK_EQ(thunk_va_space_new(0ULL - MIB, MIB - PG, 0, &s), 0);
        CHECK_EQ(thunk_va_alloc_fixed(s, 0ULL - 2 * PG, 2 * PG, NULL), -EOVERFLOW);
        CHECK_EQ(thunk_va_alloc_fixed(s, 0ULL - MIB - PG, PG, NULL), -ERANGE);
        CHECK_EQ(thunk_va_alloc_fixed(s, 0ULL - 3 * PG, 2 * PG, NULL), 0); /* ends at the limit */
        CHECK_EQ(thunk_va_alloc(s, MIB - 2 * PG, PG, NULL, &a), -ENOMEM);
        CHECK_EQ(thunk_va_alloc(s, MIB - 3 * PG, PG, NULL, &a), 0);
        CHECK_EQ(a, 0ULL - MIB);
        CHECK_EQ(thunk_va_space_verify(s), 0);
        thunk_va_space_free(s);
}

static int collect(const ThunkVaObject *o, void *userdata)
{
        uint64_t *v = userdata;
        v[++v[0]] = o->start;
        return v[0] == 3 ? 42 : 0;
}

static void test_basic(void)
{
        ThunkVaSpace *s = NULL;
        uint64_t a, b, c, d;
        ThunkVaObject o;
        int tag1, tag2;

        CHECK_EQ(thunk_va_space_new(BASE, 64 * MIB, PG, &s), 0);
        CHECK_EQ(thunk_va_space_largest_free(s), 64 * MIB);
        CHECK_EQ(thunk_va_alloc(s, 2 * PG, PG, &tag1, &a), 0);
        CHECK_EQ(a, BASE);
        CHECK_EQ(thunk_va_alloc(s, PG, PG, &tag2, &b), 0);
        CHECK_EQ(b, BASE + 3 * PG); /* one guard page after the first object */
        CHECK_EQ(thunk_va_alloc(s, PG, 2 * MIB, NULL, &c), 0);
        CHECK_EQ(c, BASE + 2 * MIB);
        CHECK_EQ(thunk_va_alloc(s, PG, PG, NULL, &d), 0);
        CHECK_EQ(d, BASE + 5 * PG); /* first fit goes back to the hole before c */
        CHECK_EQ(thunk_va_space_count(s), 4);
        CHECK_EQ(thunk_va_space_used(s), 5 * PG);

        /* Look-ups: inside an object yes, in its guard no. */
        CHECK_EQ(thunk_va_lookup(s, a + PG + 17, &o), 0);
        CHECK(o.start == a && o.size == 2 * PG && o.data == &tag1);
        CHECK_EQ(thunk_va_lookup(s, a + 2 * PG, &o), -ENOENT);
        CHECK_EQ(thunk_va_lookup(s, BASE - 1, &o), -ENOENT);
        CHECK_EQ(thunk_va_lookup(s, b, &o), 0);
        CHECK(o.data == &tag2);

        /* Fixed placements. */
        CHECK_EQ(thunk_va_alloc_fixed(s, a + PG, PG, NULL), -EADDRINUSE);     /* inside a */
        CHECK_EQ(thunk_va_alloc_fixed(s, a + 2 * PG, PG, NULL), -EADDRINUSE); /* a's guard */
        CHECK_EQ(thunk_va_alloc_fixed(s, d + 2 * PG, PG, NULL), 0);           /* right after d's guard */
        CHECK_EQ(thunk_va_alloc_fixed(s, c - PG, PG, NULL), -EADDRINUSE);     /* its guard would hit c */
        CHECK_EQ(thunk_va_alloc_fixed(s, c - 2 * PG, PG, NULL), 0);           /* its guard ends at c */
        CHECK_EQ(thunk_va_space_count(s), 6);

        /* Frees name an exact start. */
        CHECK_EQ(thunk_va_free(s, a + PG), -ENOENT);
        CHECK_EQ(thunk_va_free(s, BASE + 60 * MIB), -ENOENT);
        CHECK_EQ(thunk_va_free(s, a), 0);
        CHECK_EQ(thunk_va_free(s, a), -ENOENT);
        CHECK_EQ(thunk_va_lookup(s, a, &o), -ENOENT);
        CHECK_EQ(thunk_va_alloc(s, PG, PG, NULL, &a), 0);
        CHECK_EQ(a, BASE);

        /* Iteration. */
        uint64_t seen[8] = {0};
        CHECK_EQ(thunk_va_foreach(s, collect, seen), 42);
        CHECK_EQ(seen[0], 3);
        CHECK(seen[1] == BASE && seen[2] == b && seen[3] == d);
        CHECK_EQ(thunk_va_next(s, b + 1, &o), 0);
        CHECK_EQ(o.start, d);
        CHECK_EQ(thunk_va_next(s, c + 1, &o), -ENOENT);
        CHECK_EQ(thunk_va_space_verify(s), 0);

        /* Exhaustion and recovery. */
        uint64_t big;
        CHECK_EQ(thunk_va_alloc(s, 62 * MIB - 2 * PG, PG, NULL, &big), -ENOMEM);
        CHECK_EQ(thunk_va_alloc(s, 62 * MIB - 3 * PG, PG, NULL, &big), 0);
        CHECK_EQ(big, c + 2 * PG);
        CHECK_EQ(thunk_va_space_largest_free(s), 2 * MIB - 11 * PG); /* the gap between d's neighbours */
        CHECK_EQ(thunk_va_alloc(s, 4 * MIB, PG, NULL, &a), -ENOMEM);
        CHECK_EQ(thunk_va_free(s, big), 0);
        CHECK_EQ(thunk_va_alloc(s, 4 * MIB, PG, NULL, &a), 0);
        CHECK_EQ(thunk_va_space_verify(s), 0);
        thunk_va_space_free(s);

        /* Guard 0 packs objects tightly. */
        CHECK_EQ(thunk_va_space_new(BASE, MIB, 0, &s), 0);
        for (int i = 0; i < 256; i++) {
                CHECK_EQ(thunk_va_alloc(s, PG, PG, NULL, &a), 0);
                CHECK_EQ(a, BASE + (uint64_t)i * PG);
        }
        CHECK_EQ(thunk_va_alloc(s, PG, PG, NULL, &a), -ENOMEM);
        CHECK_EQ(thunk_va_space_largest_free(s), 0);
        CHECK_EQ(thunk_va_space_verify(s), 0);
        thunk_va_space_free(s);
}

static void test_windows(void)
{
        ThunkVaSpace *ap = NULL, *w1 = NULL, *w2 = NULL, *w3 = NULL;
        ThunkVaObject o;
        uint64_t a;

        CHECK_EQ(thunk_va_space_new(64 * 1024, (1ULL << 47) - 64 * 1024, PG, &ap), 0);
        CHECK_EQ(thunk_va_space_new_window(ap, 16 * GIB, GIB, PG, &w1), 0);
        CHECK_EQ(thunk_va_space_new_window(ap, 16 * GIB, GIB, 0, &w2), 0);
        CHECK_EQ(thunk_va_space_base(w1), GIB);
        CHECK_EQ(thunk_va_space_base(w2), 18 * GIB);
        CHECK_EQ(thunk_va_space_limit(w1), 17 * GIB);
        CHECK_EQ(thunk_va_space_new_window(ap, 3 * PG, 3 * PG, 0, &w3), -EINVAL);
        CHECK_EQ(thunk_va_space_new_window(ap, 1ULL << 47, PG, 0, &w3), -ENOMEM);
        CHECK(w3 == NULL);
        CHECK_EQ(thunk_va_space_count(ap), 2);
        CHECK_EQ(thunk_va_lookup(ap, 20 * GIB, &o), 0);
        CHECK(o.data == w2 && o.start == 18 * GIB && o.size == 16 * GIB);

        CHECK_EQ(thunk_va_alloc(w1, 2 * MIB, 2 * MIB, NULL, &a), 0);
        CHECK_EQ(a, GIB);
        CHECK_EQ(thunk_va_alloc(w1, 2 * MIB, 2 * MIB, NULL, &a), 0);
        CHECK_EQ(a, GIB + 4 * MIB);
        CHECK_EQ(thunk_va_alloc_fixed(w1, 17 * GIB, PG, NULL), -ERANGE);
        CHECK_EQ(thunk_va_alloc_fixed(w2, 17 * GIB, PG, NULL), -ERANGE);
        CHECK_EQ(thunk_va_alloc_fixed(w2, 18 * GIB, PG, NULL), 0);

        /* Freeing a window gives its range back to the aperture. */
        w1 = thunk_va_space_free(w1);
        CHECK_EQ(thunk_va_space_count(ap), 1);
        CHECK_EQ(thunk_va_lookup(ap, 2 * GIB, &o), -ENOENT);
        CHECK_EQ(thunk_va_space_new_window(ap, 8 * GIB, GIB, PG, &w1), 0);
        CHECK_EQ(thunk_va_space_base(w1), GIB);
        thunk_va_space_free(w1);
        thunk_va_space_free(w2);
        CHECK_EQ(thunk_va_space_count(ap), 0);
        CHECK_EQ(thunk_va_space_verify(ap), 0);
        thunk_va_space_free(ap);
}

static void test_handles(void)
{
        ThunkVaSpace *h = NULL;
        uint64_t a, b;

        /* The kernel's LDS, scratch and GPUVM apertures of a GFX9+ dGPU. */
        const ThunkVaInterval apertures[] = {
                {1ULL << 48, 1ULL << 32},
                {2ULL << 48, 1ULL << 32},
                {64 * 1024, (1ULL << 47) - 64 * 1024},
        };
        CHECK_EQ(thunk_va_space_new_handles(apertures, 3, &h), 0);
        CHECK_EQ(thunk_va_space_base(h), 1ULL << 47);
        CHECK_EQ(thunk_va_space_limit(h), 1ULL << 48);
        CHECK_EQ(thunk_va_space_guard(h), 0);
        CHECK_EQ(thunk_va_alloc(h, 2 * MIB, PG, NULL, &a), 0);
        CHECK_EQ(thunk_va_alloc(h, 64 * GIB, PG, NULL, &b), 0);
        CHECK(a >= (1ULL << 47) && b >= a + 2 * MIB);
        CHECK_EQ(thunk_va_free(h, a), 0);
        thunk_va_space_free(h);

        /* Apertures that cover the first windows push the handle window further up. */
        const ThunkVaInterval busy[] = {
                {(1ULL << 47) + GIB, PG},
                {1ULL << 48, PG},
        };
        CHECK_EQ(thunk_va_space_new_handles(busy, 2, &h), 0);
        CHECK_EQ(thunk_va_space_base(h), 3ULL << 47);
        thunk_va_space_free(h);
        /* An interval running to the top of the address range blocks everything above it. */
        const ThunkVaInterval all[] = {{1ULL << 47, UINT64_MAX}};
        h = NULL;
        CHECK_EQ(thunk_va_space_new_handles(all, 1, &h), -ENOSPC);
        CHECK(h == NULL);
        CHECK_EQ(thunk_va_space_new_handles(NULL, 0, &h), 0);
        CHECK_EQ(thunk_va_space_base(h), 1ULL << 47);
        thunk_va_space_free(h);
        CHECK_EQ(thunk_va_space_new_handles(NULL, 1, &h), -EINVAL);
}

/* ---- randomized comparison with a sorted-array reference ---- */

typedef struct RefObj {
        uint64_t start, size;
        void *data;
} RefObj;

typedef struct Ref {
        uint64_t base, limit, guard;
        RefObj *v;
        size_t n;
} Ref;

static uint64_t rng_state;

static uint64_t rnd(void)
{
        /* xorshift64*: deterministic for a seed. */
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t rnd_below(uint64_t n)
{
        return rnd() % n;
}

static void ref_insert(Ref *r, size_t at, uint64_t start, uint64_t size, void *data)
{
        memmove(&r->v[at + 1], &r->v[at], (r->n - at) * sizeof(*r->v));
        r->v[at] = (RefObj){start, size, data};
        r->n++;
}

static int ref_alloc(Ref *r, uint64_t size, uint64_t align, void *data, uint64_t *ret)
{
        uint64_t need = size + r->guard, prev = r->base;
        for (size_t i = 0; i <= r->n; i++) {
                uint64_t end = i < r->n ? r->v[i].start : r->limit;
                uint64_t a = (prev + align - 1) & ~(align - 1);
                if (a >= prev && a <= end && end - a >= need) {
                        ref_insert(r, i, a, size, data);
                        *ret = a;
                        return 0;
                }
                if (i < r->n)
                        prev = r->v[i].start + r->v[i].size + r->guard;
        }
        return -ENOMEM;
}

static int ref_fixed(Ref *r, uint64_t addr, uint64_t size, void *data)
{
        uint64_t need = size + r->guard;
        if (addr < r->base || addr + need > r->limit)
                return -ERANGE;
        size_t i = 0;
        while (i < r->n && r->v[i].start < addr)
                i++;
        if (i > 0 && r->v[i - 1].start + r->v[i - 1].size + r->guard > addr)
                return -EADDRINUSE;
        if (i < r->n && r->v[i].start < addr + need)
                return -EADDRINUSE;
        ref_insert(r, i, addr, size, data);
        return 0;
}

static int ref_free(Ref *r, uint64_t addr)
{
        for (size_t i = 0; i < r->n; i++) {
                if (r->v[i].start == addr) {
                        memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof(*r->v));
                        r->n--;
                        return 0;
                }
        }
        return -ENOENT;
}

static const RefObj *ref_lookup(const Ref *r, uint64_t addr)
{
        for (size_t i = 0; i < r->n; i++)
                if (addr >= r->v[i].start && addr - r->v[i].start < r->v[i].size)
                        return &r->v[i];
        return NULL;
}

static void compare_all(ThunkVaSpace *s, const Ref *r)
{
        CHECK_EQ(thunk_va_space_verify(s), 0);
        CHECK_EQ(thunk_va_space_count(s), r->n);
        uint64_t used = 0, at = 0;
        for (size_t i = 0; i < r->n; i++) {
                ThunkVaObject o;
                used += r->v[i].size;
                if (thunk_va_next(s, at, &o) != 0 || o.start != r->v[i].start || o.size != r->v[i].size ||
                    o.data != r->v[i].data) {
                        fprintf(stderr, "object %zu differs: expected 0x%llx\n", i,
                                (unsigned long long)r->v[i].start);
                        check_failures++;
                        return;
                }
                at = o.start + 1;
        }
        ThunkVaObject o;
        CHECK_EQ(thunk_va_next(s, at, &o), -ENOENT);
        CHECK_EQ(thunk_va_space_used(s), used);
}

static void random_run(uint64_t seed, uint64_t guard, const uint64_t *aligns, size_t n_aligns, int ops)
{
        const uint64_t base = BASE, span = 256 * MIB;
        ThunkVaSpace *s = NULL;
        Ref r = {base, base + span, guard, calloc(span / PG, sizeof(RefObj)), 0};
        int before = check_failures;
        /* Outcome tallies: the run must have reached every interesting path. */
        int alloc_ok = 0, nomem = 0, fixed_ok = 0, inuse = 0, range = 0, free_ok = 0, noent = 0;

        rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
        CHECK_EQ(thunk_va_space_new(base, span, guard, &s), 0);
        for (int op = 0; op < ops && check_failures == before; op++) {
                /* Mostly small objects, now and then a large one, so the space fills and fragments. */
                uint64_t pages = rnd_below(8) == 0 ? 1 + rnd_below(4096) : 1 + rnd_below(16);
                uint64_t size = pages * PG, align = aligns[rnd_below(n_aligns)];
                void *data = (void *)(uintptr_t)(op + 1);
                uint64_t kind = rnd_below(100), got = 0, want = 0;
                int rs, rr;

                if (kind < 45) {
                        rs = thunk_va_alloc(s, size, align, data, &got);
                        rr = ref_alloc(&r, size, align, data, &want);
                        alloc_ok += rs == 0;
                        nomem += rs == -ENOMEM;
                        if (rs != rr || (rs == 0 && got != want)) {
                                fprintf(stderr,
                                        "seed %llu op %d alloc(0x%llx, 0x%llx): %d 0x%llx, reference %d "
                                        "0x%llx\n",
                                        (unsigned long long)seed, op, (unsigned long long)size,
                                        (unsigned long long)align, rs, (unsigned long long)got, rr,
                                        (unsigned long long)want);
                                check_failures++;
                        }
                } else if (kind < 60) {
                        uint64_t addr = base - MIB + rnd_below((span + 2 * MIB) / PG) * PG;
                        rs = thunk_va_alloc_fixed(s, addr, size, data);
                        rr = ref_fixed(&r, addr, size, data);
                        fixed_ok += rs == 0;
                        inuse += rs == -EADDRINUSE;
                        range += rs == -ERANGE;
                        if (rs != rr) {
                                fprintf(stderr, "seed %llu op %d fixed(0x%llx): %d, reference %d\n",
                                        (unsigned long long)seed, op, (unsigned long long)addr, rs, rr);
                                check_failures++;
                        }
                } else if (kind < 95) {
                        uint64_t addr;
                        if (r.n && rnd_below(10) < 7)
                                addr = r.v[rnd_below(r.n)].start + (rnd_below(10) == 0 ? PG : 0);
                        else
                                addr = base + rnd_below(span / PG) * PG;
                        rs = thunk_va_free(s, addr);
                        rr = ref_free(&r, addr);
                        free_ok += rs == 0;
                        noent += rs == -ENOENT;
                        if (rs != rr) {
                                fprintf(stderr, "seed %llu op %d free(0x%llx): %d, reference %d\n",
                                        (unsigned long long)seed, op, (unsigned long long)addr, rs, rr);
                                check_failures++;
                        }
                }
                /* A look-up after every operation. */
                uint64_t probe = base - PG + rnd_below(span + 2 * PG);
                ThunkVaObject o;
                const RefObj *ro = ref_lookup(&r, probe);
                rs = thunk_va_lookup(s, probe, &o);
                if ((rs == 0) != (ro != NULL) || (ro && (o.start != ro->start || o.size != ro->size))) {
                        fprintf(stderr, "seed %llu op %d lookup(0x%llx) differs\n", (unsigned long long)seed,
                                op, (unsigned long long)probe);
                        check_failures++;
                }
                if (op % 500 == 0)
                        compare_all(s, &r);
        }
        compare_all(s, &r);
        if (getenv("VAMAN_TEST_VERBOSE"))
                printf("seed %llu guard %llu: alloc %d/%d fixed %d/%d/%d free %d/%d, %zu live\n",
                       (unsigned long long)seed, (unsigned long long)guard, alloc_ok, nomem, fixed_ok, inuse,
                       range, free_ok, noent, r.n);
        CHECK(alloc_ok > 100 && nomem > 10 && fixed_ok > 10 && inuse > 10 && range > 0 && free_ok > 100 &&
              noent > 10);
        thunk_va_space_free(s);
        free(r.v);
}

static void test_random(void)
{
        static const uint64_t page_only[] = {PG};
        static const uint64_t mixed[] = {PG, 2 * PG, 16 * PG, 64 * 1024, 2 * MIB};
        static const uint64_t large[] = {64 * 1024, 2 * MIB};
        static const uint64_t guards[] = {0, PG, 4 * PG};

        for (size_t g = 0; g < 3; g++) {
                for (uint64_t seed = 1; seed <= 3; seed++) {
                        random_run(seed, guards[g], page_only, 1, 6000);
                        random_run(seed + 10, guards[g], mixed, 5, 6000);
                        random_run(seed + 20, guards[g], large, 2, 4000);
                }
        }
}

/* Many live objects: the tree must stay balanced and its books right. */
static void test_many(void)
{
        enum { N = 200000 };
        ThunkVaSpace *s = NULL;
        uint64_t *addrs = malloc(N * sizeof(*addrs));
        CHECK_EQ(thunk_va_space_new(BASE, 4ULL << 40, PG, &s), 0);
        for (int i = 0; i < N; i++)
                CHECK_EQ(thunk_va_alloc(s, PG, PG, NULL, &addrs[i]), 0);
        CHECK_EQ(addrs[N - 1], BASE + (uint64_t)(N - 1) * 2 * PG);
        for (int i = 0; i < N; i += 2)
                CHECK_EQ(thunk_va_free(s, addrs[i]), 0);
        CHECK_EQ(thunk_va_space_verify(s), 0);
        /* The holes are refilled in address order. */
        uint64_t a;
        CHECK_EQ(thunk_va_alloc(s, PG, PG, NULL, &a), 0);
        CHECK_EQ(a, BASE);
        CHECK_EQ(thunk_va_alloc(s, 2 * PG, PG, NULL, &a), 0);
        CHECK_EQ(a, addrs[N - 1] + 2 * PG); /* no 2-page hole fits between the survivors */
        CHECK_EQ(thunk_va_space_count(s), N / 2 + 2);
        CHECK_EQ(thunk_va_space_verify(s), 0);
        thunk_va_space_free(s);
        free(addrs);
}

int main(void)
{
        test_params();
        test_basic();
        test_windows();
        test_handles();
        test_random();
        test_many();
        if (check_failures) {
                fprintf(stderr, "%d check(s) failed\n", check_failures);
                return 1;
        }
        printf("vaman: all checks passed\n");
        return 0;
}
