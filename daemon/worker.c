/* Worker threads: a job queue under one mutex, finished jobs handed back to the loop through an eventfd. */
#include "worker.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct WorkerPool {
        pthread_mutex_t lock;
        pthread_cond_t wake;
        WorkerJob *queue, *queue_tail; /* to run, in submission order */
        WorkerJob *finished;           /* run, done() not called yet */
        bool stopping;
        unsigned n_threads;
        pthread_t *threads;
        int efd;          /* readable when jobs finished */
        struct event *ev; /* on the loop: efd */
        size_t pending;   /* submitted, done() not run; touched on the loop thread only */
};

static void *worker_main(void *arg)
{
        WorkerPool *p = arg;

        pthread_mutex_lock(&p->lock);
        for (;;) {
                WorkerJob *j;
                while (!p->queue && !p->stopping)
                        pthread_cond_wait(&p->wake, &p->lock);
                j = p->queue;
                if (!j)
                        break; /* stopping, and nothing is left to run */
                p->queue = j->next;
                if (!p->queue)
                        p->queue_tail = NULL;
                pthread_mutex_unlock(&p->lock);

                j->run(j);

                pthread_mutex_lock(&p->lock);
                j->next = p->finished;
                p->finished = j;
                /* an eventfd write only fails when the counter would overflow: it is read at every wakeup */
                (void)!write(p->efd, &(uint64_t){1}, sizeof(uint64_t));
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

void worker_reap(WorkerPool *p)
{
        WorkerJob *list, *rev = NULL;
        uint64_t n;

        (void)!read(p->efd, &n, sizeof(n));
        pthread_mutex_lock(&p->lock);
        list = p->finished;
        p->finished = NULL;
        pthread_mutex_unlock(&p->lock);
        /* finished last-first on the list: call done() in the order the jobs finished */
        while (list) {
                WorkerJob *next = list->next;
                list->next = rev;
                rev = list;
                list = next;
        }
        while (rev) {
                WorkerJob *next = rev->next;
                p->pending--;
                rev->done(rev); /* may free the job, and may submit new ones */
                rev = next;
        }
}

static void on_finished(evutil_socket_t fd, short what, void *userdata)
{
        worker_reap(userdata);
}

int worker_pool_new(struct event_base *base, unsigned n_threads, WorkerPool **ret)
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
        p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        p->threads = calloc(n_threads, sizeof(*p->threads));
        if (p->efd < 0 || !p->threads) {
                r = p->efd < 0 ? -errno : -ENOMEM;
                goto fail;
        }
        p->ev = event_new(base, p->efd, EV_READ | EV_PERSIST, on_finished, p);
        if (!p->ev || event_add(p->ev, NULL) < 0) {
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
        /* every job has run: let the owners finish (and free) them; one that a done() submitted now runs
         * here */
        while (p->efd >= 0) {
                worker_reap(p);
                if (!p->queue)
                        break;
                while (p->queue) {
                        WorkerJob *j = p->queue;
                        p->queue = j->next;
                        j->run(j);
                        j->next = p->finished;
                        p->finished = j;
                }
                p->queue_tail = NULL;
        }
        if (p->ev)
                event_free(p->ev);
        if (p->efd >= 0)
                close(p->efd);
        free(p->threads);
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
}

void worker_submit(WorkerPool *p, WorkerJob *job)
{
        job->next = NULL;
        p->pending++;
        pthread_mutex_lock(&p->lock);
        if (p->queue_tail)
                p->queue_tail->next = job;
        else
                p->queue = job;
        p->queue_tail = job;
        pthread_cond_signal(&p->wake);
        pthread_mutex_unlock(&p->lock);
}

size_t worker_pending(const WorkerPool *p)
{
        return p->pending;
}
