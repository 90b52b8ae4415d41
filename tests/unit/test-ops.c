/* Unit test of the daemon's op table: every op of the protocol has a row, and every row is consistent. */
#include <stdint.h>

#include "../common/check.h"
#include "gpumem.pb-c.h"
#include "ops/request.h"
#include "base/util.h"

static void test_rows(void)
{
        char err[256] = "";

        CHECK_EQ(request_table_check(err, sizeof(err)), 0);
        if (err[0])
                fprintf(stderr, "  %s\n", err);
}

/* An op added to the protocol without a row (or a row for no op) is caught here, not by a client. */
static void test_every_op_has_a_row(void)
{
        CHECK_EQ(request_op_count(), gpumem__request__descriptor.n_fields);
}

int main(void)
{
        static const TestCase cases[] = {
                {"rows name a request, a result, a version and fds", test_rows},
                {"every op of Request has a row", test_every_op_has_a_row},
        };
        return run_tests(cases, ARRAY_SIZE(cases));
}
