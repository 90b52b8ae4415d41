/* Worker threads: slow work off the event loop, each job finished back on the loop thread. */
#pragma once

#include <stddef.h>

struct event_base;

/*
 * A job is embedded in its owner's struct. run() executes on a worker thread and must touch only what the
 * job owns (no broker, connection or manager state); done() then runs on the loop thread, where the owner
 * finishes the work and frees the job. Jobs run in no particular order relative to each other.
 */
typedef struct WorkerJob WorkerJob;
struct WorkerJob {
        void (*run)(WorkerJob *job);
        void (*done)(WorkerJob *job);
        WorkerJob *next; /* the pool's */
};

typedef struct WorkerPool WorkerPool;

/* @n_threads workers whose finished jobs are reported to the loop of @base; 0 threads is -EINVAL. */
int worker_pool_new(struct event_base *base, unsigned n_threads, WorkerPool **ret);
/*
 * Wait for every job submitted (queued ones run too), run their done() callbacks, stop the threads.
 * NULL-safe; returns NULL.
 */
WorkerPool *worker_pool_free(WorkerPool *p);
/* Queue @job; it cannot fail once the pool exists. */
void worker_submit(WorkerPool *p, WorkerJob *job);
/* Jobs submitted whose done() has not run yet. */
size_t worker_pending(const WorkerPool *p);
/* Run the done() of every job finished so far (the loop does this itself when woken). */
void worker_reap(WorkerPool *p);
