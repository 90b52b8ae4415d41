/* util/array.c: growing by doubling, and refusing what cannot be had without changing the array. */
#include <stdint.h>
#include <stdlib.h>

#include "../common/check.h"
#include "array.h"

static void test_grows(void)
{
        int *v = NULL;
        size_t cap = 0;

        CHECK_RC(ARRAY_RESERVE(v, cap, 1, 4), 0);
        CHECK_EQ(cap, 4);
        v[0] = 7;
        CHECK_RC(ARRAY_RESERVE(v, cap, 4, 4), 0); /* fits: nothing moves */
        CHECK_EQ(cap, 4);
        CHECK_RC(ARRAY_RESERVE(v, cap, 9, 4), 0);
        CHECK_EQ(cap, 16);
        CHECK_EQ(v[0], 7);
        free(v);
        v = NULL;
        cap = 0;
        CHECK_RC(ARRAY_RESERVE(v, cap, 3, 0), 0); /* no first size: from one */
        CHECK_EQ(cap, 4);
        free(v);
}

static void test_overflow_refused(void)
{
        int *v = NULL;
        size_t cap = 0;

        CHECK_RC(ARRAY_RESERVE(v, cap, 2, 2), 0);
        int *before = v;
        /* a count whose doubling wraps, and one whose bytes overflow: -ENOMEM, the array as it was */
        CHECK_RC(ARRAY_RESERVE(v, cap, SIZE_MAX / 2 + 2, 2), -ENOMEM);
        CHECK(v == before);
        CHECK_EQ(cap, 2);
        CHECK_RC(ARRAY_RESERVE(v, cap, SIZE_MAX / sizeof(*v) + 1, 2), -ENOMEM);
        CHECK(v == before);
        CHECK_EQ(cap, 2);
        free(v);
}

int main(void)
{
        static const TestCase cases[] = {
                {"an array grows by doubling and keeps its elements", test_grows},
                {"a size that overflows is refused and changes nothing", test_overflow_refused},
        };
        return run_tests(cases, sizeof(cases) / sizeof(cases[0]));
}
