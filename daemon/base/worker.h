/* Worker threads: slow work off the event loops, each job finished back on the loop that submitted it. */
#pragma once

#include <stddef.h>

#include "loop.h"

/*
 * A job is embedded in its owner's struct. run() executes on a worker thread and must touch only what the
 * job owns (no broker, connection or manager state); done() then runs on the thread of the loop whose home
 * submitted it, where the owner finishes the work and frees the job.
 *
 * Fairness: every job names its tenant (@flow, the submitter's choice: the daemon uses the client's uid).
 * The jobs of one flow start in the order they were submitted; flows with jobs waiting take turns, one job
 * each per round. So a job waits for at most one job of every other flow that has jobs waiting (and for the
 * jobs running), however many jobs another flow queued: a tenant with many connections and slow jobs delays
 * another tenant's job by one of its own jobs per worker at most, not by its whole queue. Jobs of one flow
 * may run at the same time on different workers; a caller that needs one job to end before the next starts
 * submits the next from the first one's done().
 */
typedef struct WorkerJob WorkerJob;
typedef struct WorkerHome WorkerHome;
struct WorkerJob {
        void (*run)(WorkerJob *job);
        void (*done)(WorkerJob *job);
        uint64_t flow;    /* the tenant, set by the submitter: flows take turns */
        uint64_t round;   /* the pool's: the turn it waits for */
        WorkerJob *next;  /* the pool's, then the home's */
        WorkerHome *home; /* where done() runs */
};

typedef struct WorkerPool WorkerPool;

/* @n_threads workers shared by every loop; 0 threads is -EINVAL. */
int worker_pool_new(unsigned n_threads, WorkerPool **ret);
/*
 * Wait for every job submitted (queued ones run too), run their done() callbacks on the calling thread
 * (every loop must have stopped), stop the threads, free the homes. NULL-safe; returns NULL.
 */
WorkerPool *worker_pool_free(WorkerPool *p);
/*
 * The place on @loop where finished jobs come back (an eventfd that loop watches); freed with the pool.
 * -ENOMEM, or the errno of eventfd() or epoll_ctl().
 */
int worker_home_new(WorkerPool *p, Loop *loop, WorkerHome **ret);
/* Queue @job (its run, done and flow set) from the loop of @h; it cannot fail once the pool exists. */
void worker_submit(WorkerPool *p, WorkerHome *h, WorkerJob *job);
/* Jobs submitted from @h whose done() has not run yet. */
size_t worker_pending(const WorkerHome *h);
/* Run the done() of every job of @h finished so far (its loop does this itself when woken). */
void worker_reap(WorkerHome *h);
