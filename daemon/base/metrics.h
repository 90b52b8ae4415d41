/* Metrics: per-op counts and latency histograms and denials, kept by each loop for itself. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_OPS   128
#define METRICS_MAX_ERRNO 134
#define METRICS_N_BUCKETS 15

typedef enum DenyReason {
        DENY_ADMIN,       /* an admin op from a non-administrator */
        DENY_PERMISSION,  /* the class may not call it, use that GPU, or import that fd */
        DENY_QUOTA,       /* over a class limit (-EDQUOT) */
        DENY_NO_CLASS,    /* no class admits the client */
        DENY_CONNECTIONS, /* the class or the daemon is at its connection limit */
        DENY_INFLIGHT,    /* the class had as many requests in flight as it may (reading paused) */
        _DENY_MAX,
} DenyReason;

typedef struct OpStats {
        uint64_t ok;
        uint32_t by_errno[METRICS_MAX_ERRNO]; /* failures by errno */
        uint64_t buckets[METRICS_N_BUCKETS];  /* cumulative counts are computed when rendering */
        uint64_t count;
        uint64_t sum_ns;
} OpStats;

typedef struct Metrics {
        OpStats ops[METRICS_MAX_OPS];
        const char *op_names[METRICS_MAX_OPS];
        uint64_t denials[_DENY_MAX];
} Metrics;

void metrics_record(Metrics *mt, unsigned op, const char *name, int result, uint64_t ns);
void metrics_deny(Metrics *mt, DenyReason why);
/* Add @src (a loop's, being written meanwhile) to @dst (the caller's). */
void metrics_add(Metrics *dst, const Metrics *src);

/* Upper bounds of the latency buckets (ns), and the denial reasons' names, for the exposition. */
extern const uint64_t metrics_bucket_ns[METRICS_N_BUCKETS];
extern const char *const metrics_deny_names[_DENY_MAX];
