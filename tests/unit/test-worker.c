/* Unit tests of the worker pool: flows take turns, a flow's jobs start in its order, every done() runs. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "base/loop.h"
#include "base/worker.h"

typedef struct Job {
        WorkerJob job; /* first: the pool hands it back */
        char name[4];
        bool gate; /* waits in run() until the test opens the gate */
        bool done;
} Job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static bool gate_open, gate_reached;
static char started[64]; /* the jobs' names in the order they started */

static void job_run(WorkerJob *j)
{
        Job *x = (Job *)j;

        pthread_mutex_lock(&lock);
        strcat(started, x->name);
        if (x->gate) {
                gate_reached = true;
                pthread_cond_broadcast(&cond);
                while (!gate_open)
                        pthread_cond_wait(&cond, &lock);
        }
        pthread_mutex_unlock(&lock);
}

static void job_done(WorkerJob *j)
{
        ((Job *)j)->done = true;
}

static void job_init(Job *x, const char *name, uint64_t flow)
{
        *x = (Job){.job = {.run = job_run, .done = job_done, .flow = flow}};
        snprintf(x->name, sizeof(x->name), "%s", name);
}

/*
 * One worker, held by a job of flow A; meanwhile A queues six more and B two: B's jobs start after one of A's
 * each, not behind A's whole queue; A's start in the order A sent them.
 */
static void test_flows_take_turns(void)
{
        Loop *l = NULL;
        WorkerPool *p = NULL;
        WorkerHome *h = NULL;
        Job jobs[9];
        static const char *names[] = {"a0", "a1", "a2", "a3", "a4", "a5", "a6", "b1", "b2"};

        for (size_t i = 0; i < ARRAY_SIZE(jobs); i++)
                job_init(&jobs[i], names[i], names[i][0] == 'a' ? 1000 : 2000);
        jobs[0].gate = true;
        CHECK_EQ(loop_new(NULL, &l), 0);
        CHECK_EQ(worker_pool_new(1, &p), 0);
        if (!l || !p)
                goto out;
        CHECK_EQ(worker_home_new(p, l, &h), 0);
        if (!h)
                goto out;
        worker_submit(p, h, &jobs[0].job);
        pthread_mutex_lock(&lock);
        while (!gate_reached)
                pthread_cond_wait(&cond, &lock);
        pthread_mutex_unlock(&lock);
        for (size_t i = 1; i < ARRAY_SIZE(jobs); i++)
                worker_submit(p, h, &jobs[i].job);
        CHECK_EQ(worker_pending(h), ARRAY_SIZE(jobs));
        pthread_mutex_lock(&lock);
        gate_open = true;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
out:
        /* every job runs, and its done() with it, before the pool is gone */
        p = worker_pool_free(p);
        CHECK_STR_CONTAINS(started, "a0a1b1a2b2a3a4a5a6");
        for (size_t i = 0; i < ARRAY_SIZE(jobs); i++)
                CHECK(jobs[i].done);
        loop_free(l);
}

int main(void)
{
        static const TestCase cases[] = {
                {"flows take turns on the workers", test_flows_take_turns},
        };

        return run_tests(cases, ARRAY_SIZE(cases));
}
