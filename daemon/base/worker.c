/* Worker threads: one queue of jobs in turns of their flows, under one mutex; finished jobs go back to their
 * loop's home via an eventfd. */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "macro.h"

struct WorkerHome {
        WorkerHome *next; /* the pool's list */
        pthread_mutex_t lock;
        WorkerJob *finished; /* run, done() not called yet */
        int efd;             /* readable when jobs finished */
        LoopIo io;           /* on the home's loop: efd */
        size_t pending;      /* submitted, done() not run; touched on the home's loop thread only */
};

struct WorkerPool {
        pthread_mutex_t lock;
        pthread_cond_t wake;
        WorkerJob *queue; /* to run: by turn (round), in submission order within one */
        bool stopping;
        unsigned n_threads;
        pthread_t *threads;
        WorkerHome *homes;
};

static void finish(WorkerJob *j)
{
        WorkerHome *h = j->home;

        pthread_mutex_lock(&h->lock);
        j->next = h->finished;
        h->finished = j;
        pthread_mutex_unlock(&h->lock);
        /* an eventfd write only fails when the counter would overflow: it is read at every wakeup */
        (void)!write(h->efd, &(uint64_t){1}, sizeof(uint64_t));
}

static void *worker_main(void *arg)
{
        WorkerPool *p = arg;

        (void)pthread_setname_np(pthread_self(), "gpumemd-work"); /* for top -H, perf and pinning */
        pthread_mutex_lock(&p->lock);
        for (;;) {
                WorkerJob *j;
                while (!p->queue && !p->stopping)
                        pthread_cond_wait(&p->wake, &p->lock);
                j = p->queue;
                if (!j)
                        break; /* stopping, and nothing is left to run */
                p->queue = j->next;
                pthread_mutex_unlock(&p->lock);

                j->run(j);
                finish(j);

                pthread_mutex_lock(&p->lock);
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

void worker_reap(WorkerHome *h)
{
        WorkerJob *list, *rev = NULL;
        uint64_t n;

        (void)!read(h->efd, &n, sizeof(n));
        pthread_mutex_lock(&h->lock);
        list = h->finished;
        h->finished = NULL;
        pthread_mutex_unlock(&h->lock);
        /* finished last-first on the list: call done() in the order the jobs finished */
        while (list) {
                WorkerJob *next = list->next;
                list->next = rev;
                rev = list;
                list = next;
        }
        while (rev) {
                WorkerJob *next = rev->next;
                h->pending--;
                rev->done(rev); /* may free the job, and may submit new ones */
                rev = next;
        }
}

static void on_finished(void *userdata, unsigned what)
{
        (void)what;
        worker_reap(userdata);
}

int worker_pool_new(unsigned n_threads, WorkerPool **ret)
{
        WorkerPool *p;
        int r;

        if (n_threads == 0)
                return -EINVAL;
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->wake, NULL);
        p->threads = calloc(n_threads, sizeof(*p->threads));
        if (!p->threads) {
                r = -ENOMEM;
                goto fail;
        }
        for (; p->n_threads < n_threads; p->n_threads++) {
                r = -pthread_create(&p->threads[p->n_threads], NULL, worker_main, p);
                if (r < 0)
                        goto fail;
        }
        *ret = p;
        return 0;
fail:
        worker_pool_free(p);
        return r;
}

int worker_home_new(WorkerPool *p, Loop *loop, WorkerHome **ret)
{
        WorkerHome *h = calloc(1, sizeof(*h));
        int r;

        if (!h)
                return -ENOMEM;
        pthread_mutex_init(&h->lock, NULL);
        h->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (h->efd < 0) {
                r = -errno;
                goto fail;
        }
        loop_io_init(&h->io, loop, h->efd, on_finished, h);
        r = loop_io_want(&h->io, LOOP_READ);
        if (r < 0)
                goto fail;
        /* homes are made while the daemon starts, before any loop thread runs */
        h->next = p->homes;
        p->homes = h;
        *ret = h;
        return 0;
fail:
        loop_io_done(&h->io);
        if (h->efd >= 0)
                close(h->efd);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return r;
}

static bool reap_all(WorkerPool *p)
{
        bool any = false;

        for (WorkerHome *h = p->homes; h; h = h->next)
                if (h->pending) {
                        any = true;
                        worker_reap(h);
                }
        return any;
}

WorkerPool *worker_pool_free(WorkerPool *p)
{
        if (!p)
                return NULL;
        pthread_mutex_lock(&p->lock);
        p->stopping = true;
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < p->n_threads; i++)
                pthread_join(p->threads[i], NULL);
        /* every job has run: let the owners finish (and free) them; one that a done() submitted runs here */
        for (;;) {
                bool any = reap_all(p);
                if (!p->queue && !any)
                        break;
                while (p->queue) {
                        WorkerJob *j = p->queue;
                        p->queue = j->next;
                        j->run(j);
                        finish(j);
                }
        }
        while (p->homes) {
                WorkerHome *h = p->homes;
                p->homes = h->next;
                loop_io_done(&h->io);
                close(h->efd);
                pthread_mutex_destroy(&h->lock);
                free(h);
        }
        free(p->threads);
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
}

/*
 * Put @job in its turn: right after its flow's last waiting job's turn, or, when its flow has none waiting,
 * in the first turn waiting; behind the jobs already in that turn. Turns only grow along the queue, so the
 * queue's head is the next job of the turn being served. A walk of the queue, which holds a job per request
 * in progress at most (a connection is not read while one is).
 */
static void enqueue(WorkerPool *p, WorkerJob *job)
{
        uint64_t round = p->queue ? p->queue->round : 0;
        WorkerJob **at = &p->queue;

        for (const WorkerJob *j = p->queue; j; j = j->next)
                if (j->flow == job->flow)
                        round = j->round + 1; /* the last one found is its flow's latest turn */
        job->round = round;
        while (*at && (*at)->round <= round)
                at = &(*at)->next;
        job->next = *at;
        *at = job;
}

void worker_submit(WorkerPool *p, WorkerHome *h, WorkerJob *job)
{
        job->home = h;
        h->pending++;
        pthread_mutex_lock(&p->lock);
        enqueue(p, job);
        pthread_cond_signal(&p->wake);
        pthread_mutex_unlock(&p->lock);
}

size_t worker_pending(const WorkerHome *h)
{
        return h->pending;
}
