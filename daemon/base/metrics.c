/* Metrics: the counters each loop keeps on the request path, and their sum (exposition.c renders them). */
#include "metrics.h"

#include "macro.h"

/* Upper bounds of the latency buckets, in nanoseconds (10 µs to 1 s). */
const uint64_t metrics_bucket_ns[METRICS_N_BUCKETS] = {
        10000,   25000,    50000,    100000,   250000,    500000,    1000000,    2500000,
        5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 1000000000,
};

const char *const metrics_deny_names[_DENY_MAX] = {
        [DENY_ADMIN] = "admin",       [DENY_PERMISSION] = "permission",   [DENY_QUOTA] = "quota",
        [DENY_NO_CLASS] = "no_class", [DENY_CONNECTIONS] = "connections", [DENY_INFLIGHT] = "inflight",
};

/* Each loop writes only its own Metrics (single writer: COUNTER_ADD); the rendering reads them all. */
void metrics_record(Metrics *mt, unsigned op, const char *name, int result, uint64_t ns)
{
        OpStats *s;

        if (op >= METRICS_MAX_OPS)
                return;
        s = &mt->ops[op];
        if (!READ_ONCE(mt->op_names[op]))
                WRITE_ONCE(mt->op_names[op], name);
        if (result >= 0)
                COUNTER_ADD(s->ok, 1);
        else if (-result < METRICS_MAX_ERRNO)
                COUNTER_ADD(s->by_errno[-result], 1);
        for (int i = 0; i < METRICS_N_BUCKETS; i++)
                if (ns <= metrics_bucket_ns[i]) {
                        COUNTER_ADD(s->buckets[i], 1);
                        break;
                }
        COUNTER_ADD(s->count, 1);
        COUNTER_ADD(s->sum_ns, ns);
}

void metrics_deny(Metrics *mt, DenyReason why)
{
        if (why < _DENY_MAX)
                COUNTER_ADD(mt->denials[why], 1);
}

void metrics_add(Metrics *dst, const Metrics *src)
{
        for (int op = 0; op < METRICS_MAX_OPS; op++) {
                const OpStats *s = &src->ops[op];
                OpStats *d = &dst->ops[op];
                const char *name = READ_ONCE(src->op_names[op]);
                if (name)
                        dst->op_names[op] = name;
                d->ok += READ_ONCE(s->ok);
                for (int e = 0; e < METRICS_MAX_ERRNO; e++)
                        d->by_errno[e] += READ_ONCE(s->by_errno[e]);
                for (int i = 0; i < METRICS_N_BUCKETS; i++)
                        d->buckets[i] += READ_ONCE(s->buckets[i]);
                d->count += READ_ONCE(s->count);
                d->sum_ns += READ_ONCE(s->sum_ns);
        }
        for (int i = 0; i < _DENY_MAX; i++)
                dst->denials[i] += READ_ONCE(src->denials[i]);
}
