/* Event loops on threads: an eventfd-woken inbox of functions to run, posted from any thread. */
#include "loop.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct Loop {
        struct event_base *base;
        bool threaded, running;
        pthread_t thread;
        pthread_mutex_t lock; /* the inbox */
        LoopWork *head, *tail;
        bool stop; /* posted by loop_stop: break once the inbox was read */
        int efd;
        struct event *inbox_ev;
};

/* Take the whole inbox at once and run it in order: a function may post again (it runs next time). */
static bool run_inbox(Loop *l, bool *ret_stop)
{
        LoopWork *list;
        bool ran;

        pthread_mutex_lock(&l->lock);
        list = l->head;
        l->head = l->tail = NULL;
        if (ret_stop)
                *ret_stop = l->stop;
        pthread_mutex_unlock(&l->lock);
        ran = list != NULL;
        while (list) {
                LoopWork *next = list->next;
                bool owned = list->owned;
                LoopFn fn = list->fn;
                void *arg = list->arg;
                if (owned)
                        free(list);
                fn(arg); /* an embedded work may be freed or reused by its function */
                list = next;
        }
        return ran;
}

static void on_inbox(evutil_socket_t fd, short what, void *userdata)
{
        Loop *l = userdata;
        uint64_t n;
        bool stop;

        (void)!read(l->efd, &n, sizeof(n));
        (void)run_inbox(l, &stop);
        if (stop)
                event_base_loopbreak(l->base);
}

bool loop_run_pending(Loop *l)
{
        return run_inbox(l, NULL);
}

static void *loop_main(void *arg)
{
        Loop *l = arg;

        (void)pthread_setname_np(pthread_self(), "gpumemd-loop"); /* for top -H, perf and pinning */
        (void)event_base_loop(l->base, EVLOOP_NO_EXIT_ON_EMPTY);
        return NULL;
}

int loop_new(struct event_base *base, bool threaded, Loop **ret)
{
        Loop *l = calloc(1, sizeof(*l));

        if (!l) {
                event_base_free(base);
                return -ENOMEM;
        }
        l->base = base;
        l->threaded = threaded;
        pthread_mutex_init(&l->lock, NULL);
        l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l->efd < 0) {
                int r = -errno;
                loop_free(l);
                return r;
        }
        l->inbox_ev = event_new(base, l->efd, EV_READ | EV_PERSIST, on_inbox, l);
        if (!l->inbox_ev || event_add(l->inbox_ev, NULL) < 0) {
                loop_free(l);
                return -ENOMEM;
        }
        if (!threaded)
                l->thread = pthread_self();
        *ret = l;
        return 0;
}

int loop_start(Loop *l)
{
        int r;

        if (!l->threaded || l->running)
                return 0;
        r = -pthread_create(&l->thread, NULL, loop_main, l);
        if (r < 0)
                return r;
        l->running = true;
        return 0;
}

static void wake(Loop *l)
{
        /* an eventfd write fails only when the counter would overflow: it is read at every wakeup */
        (void)!write(l->efd, &(uint64_t){1}, sizeof(uint64_t));
}

void loop_stop(Loop *l)
{
        if (!l || !l->running)
                return;
        pthread_mutex_lock(&l->lock);
        l->stop = true;
        pthread_mutex_unlock(&l->lock);
        wake(l);
        pthread_join(l->thread, NULL);
        l->running = false;
}

Loop *loop_free(Loop *l)
{
        if (!l)
                return NULL;
        loop_stop(l);
        while (l->head) {
                LoopWork *w = l->head;
                l->head = w->next;
                if (w->owned)
                        free(w);
        }
        if (l->inbox_ev)
                event_free(l->inbox_ev);
        if (l->efd >= 0)
                close(l->efd);
        if (l->base)
                event_base_free(l->base);
        pthread_mutex_destroy(&l->lock);
        free(l);
        return NULL;
}

static void enqueue(Loop *l, LoopWork *w, LoopFn fn, void *arg)
{
        bool first;

        w->next = NULL;
        w->fn = fn;
        w->arg = arg;
        pthread_mutex_lock(&l->lock);
        first = !l->head;
        if (l->tail)
                l->tail->next = w;
        else
                l->head = w;
        l->tail = w;
        pthread_mutex_unlock(&l->lock);
        /* one wakeup per batch: the loop takes the whole inbox when it wakes */
        if (first)
                wake(l);
}

void loop_post_work(Loop *l, LoopWork *w, LoopFn fn, void *arg)
{
        w->owned = false;
        enqueue(l, w, fn, arg);
}

int loop_post(Loop *l, LoopFn fn, void *arg)
{
        LoopWork *w = malloc(sizeof(*w));

        if (!w)
                return -ENOMEM;
        w->owned = true;
        enqueue(l, w, fn, arg);
        return 0;
}

struct event_base *loop_base(const Loop *l)
{
        return l->base;
}

bool loop_is_current(const Loop *l)
{
        return pthread_equal(l->thread, pthread_self());
}
