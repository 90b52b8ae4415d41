/* The daemon's event loops: an epoll set, a timer heap, an eventfd-woken inbox. */
#include "loop.h"

#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "macro.h"

/* Events taken from the kernel per epoll_wait. */
#define LOOP_BATCH 64

struct Loop {
        int epfd;
        bool threaded, running, quit;
        pthread_t thread;
        struct event *host_ev;    /* not threaded: the epoll fd, watched from the host's base */
        struct event *host_timer; /* not threaded: the earliest deadline, timed by the host's base */

        pthread_mutex_t lock; /* the inbox */
        LoopWork *head, *tail;
        bool stop; /* posted by loop_stop: break once the inbox was read */
        LoopIo inbox_io;

        /* the armed timers, a binary min-heap by deadline; room for every initialised one */
        LoopTimer **heap;
        uint32_t n_armed, n_timers, cap;
        uint64_t host_due; /* not threaded: what host_timer is set to (0: not set) */

        /* the round being run, so that a watcher dropped during it is not called after */
        struct epoll_event *batch;
        int batch_n, batch_i;
};

static uint64_t now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

static void on_inbox(void *arg, unsigned what)
{
        Loop *l = arg;
        uint64_t n;
        bool stop;

        (void)what;
        (void)!read(l->inbox_io.fd, &n, sizeof(n));
        (void)run_inbox(l, &stop);
        if (stop)
                l->quit = true;
}

bool loop_run_pending(Loop *l)
{
        return run_inbox(l, NULL);
}

/* ---- timers ---- */

static void heap_put(Loop *l, uint32_t i, LoopTimer *t)
{
        l->heap[i] = t;
        t->pos = i + 1;
}

static void sift_up(Loop *l, uint32_t i)
{
        LoopTimer *t = l->heap[i];

        while (i > 0) {
                uint32_t parent = (i - 1) / 2;
                if (l->heap[parent]->due_ns <= t->due_ns)
                        break;
                heap_put(l, i, l->heap[parent]);
                i = parent;
        }
        heap_put(l, i, t);
}

static void sift_down(Loop *l, uint32_t i)
{
        LoopTimer *t = l->heap[i];

        for (;;) {
                uint32_t child = 2 * i + 1;
                if (child >= l->n_armed)
                        break;
                if (child + 1 < l->n_armed && l->heap[child + 1]->due_ns < l->heap[child]->due_ns)
                        child++;
                if (l->heap[child]->due_ns >= t->due_ns)
                        break;
                heap_put(l, i, l->heap[child]);
                i = child;
        }
        heap_put(l, i, t);
}

static void heap_remove(Loop *l, LoopTimer *t)
{
        uint32_t i = t->pos - 1;
        LoopTimer *last = l->heap[--l->n_armed];

        t->pos = 0;
        if (last == t)
                return;
        heap_put(l, i, last);
        sift_up(l, i);
        sift_down(l, last->pos - 1);
}

/* Run the timers due now, each once: one that its callback arms again at once waits for the next round. */
static void run_timers(Loop *l)
{
        uint64_t now = now_ns();
        uint32_t budget = l->n_armed;

        while (budget-- && l->n_armed && l->heap[0]->due_ns <= now) {
                LoopTimer *t = l->heap[0];
                heap_remove(l, t);
                t->fn(t->arg); /* may free its owner, and arm or end other timers */
        }
}

/*
 * A hosted loop has the host's base time its earliest deadline, set again only when that moves earlier
 * than what it is set to; one that fires early (its timer was cancelled or moved) is set again then. A
 * threaded loop needs nothing: each round waits until its earliest deadline at most.
 */
static void host_timer_follow(Loop *l)
{
        uint64_t due, now;
        struct timeval tv;

        if (!l->host_timer || !l->n_armed)
                return;
        due = l->heap[0]->due_ns;
        if (l->host_due && l->host_due <= due)
                return;
        now = now_ns();
        due = due > now ? due - now : 0;
        tv.tv_sec = (time_t)(due / 1000000000ull);
        tv.tv_usec = (suseconds_t)((due % 1000000000ull + 999) / 1000);
        /* libevent fails only when out of memory for its heap: the next arm or round tries again */
        if (evtimer_add(l->host_timer, &tv) == 0)
                l->host_due = l->heap[0]->due_ns;
}

static void on_host_timer(evutil_socket_t fd, short what, void *userdata)
{
        Loop *l = userdata;

        (void)fd;
        (void)what;
        l->host_due = 0;
        run_timers(l);
        host_timer_follow(l);
}

int loop_timer_init(LoopTimer *t, Loop *l, LoopFn fn, void *arg)
{
        if (l->n_timers == l->cap) {
                uint32_t cap = l->cap ? 2 * l->cap : 16;
                LoopTimer **heap = reallocarray(l->heap, cap, sizeof(*heap));
                if (!heap)
                        return -ENOMEM;
                l->heap = heap;
                l->cap = cap;
        }
        l->n_timers++;
        t->loop = l;
        t->fn = fn;
        t->arg = arg;
        t->due_ns = 0;
        t->pos = 0;
        return 0;
}

void loop_timer_arm(LoopTimer *t, uint64_t usec)
{
        Loop *l = t->loop;

        t->due_ns = now_ns() + usec * 1000;
        if (t->pos) {
                uint32_t i = t->pos - 1;
                sift_up(l, i);
                sift_down(l, t->pos - 1);
        } else {
                heap_put(l, l->n_armed++, t); /* room was reserved by loop_timer_init */
                sift_up(l, l->n_armed - 1);
        }
        host_timer_follow(l);
}

void loop_timer_cancel(LoopTimer *t)
{
        if (t->loop && t->pos)
                heap_remove(t->loop, t);
}

void loop_timer_done(LoopTimer *t)
{
        if (!t->loop)
                return;
        loop_timer_cancel(t);
        t->loop->n_timers--;
        t->loop = NULL;
}

/* ---- watchers ---- */

void loop_io_init(LoopIo *io, Loop *l, int fd, LoopIoFn fn, void *arg)
{
        io->loop = l;
        io->fd = fd;
        io->fn = fn;
        io->arg = arg;
        io->want = 0;
}

/* Not to be called later in the round being run. */
static void batch_forget(Loop *l, const LoopIo *io)
{
        for (int i = l->batch_i + 1; i < l->batch_n; i++)
                if (l->batch[i].data.ptr == io)
                        l->batch[i].data.ptr = NULL;
}

int loop_io_want(LoopIo *io, unsigned want)
{
        struct epoll_event ev = {0};
        int op;

        if (want == io->want)
                return 0;
        ev.events = (want & LOOP_READ ? EPOLLIN : 0u) | (want & LOOP_WRITE ? EPOLLOUT : 0u);
        ev.data.ptr = io;
        op = !io->want ? EPOLL_CTL_ADD : !want ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
        if (epoll_ctl(io->loop->epfd, op, io->fd, &ev) < 0) {
                int r = -errno;
                if (op != EPOLL_CTL_ADD)
                        (void)epoll_ctl(io->loop->epfd, EPOLL_CTL_DEL, io->fd, NULL);
                io->want = 0;
                batch_forget(io->loop, io);
                return r;
        }
        io->want = want;
        if (!want)
                batch_forget(io->loop, io);
        return 0;
}

void loop_io_done(LoopIo *io)
{
        if (!io->loop)
                return;
        (void)loop_io_want(io, 0);
        io->loop = NULL;
}

/* ---- running ---- */

/* The wait of a threaded loop's round: until its earliest deadline (in whole milliseconds, rounded up so
 * that it does not wake before it), or for ever without one. */
static int round_timeout_ms(const Loop *l)
{
        uint64_t now, due;

        if (!l->n_armed)
                return -1;
        now = now_ns();
        due = l->heap[0]->due_ns;
        if (due <= now)
                return 0;
        due = (due - now + 999999) / 1000000;
        return due > INT32_MAX ? INT32_MAX : (int)due;
}

/*
 * One round: what epoll has ready (waiting up to @timeout_ms for it), each watcher called with it; then,
 * on a threaded loop, the timers due.
 */
static void loop_round(Loop *l, int timeout_ms)
{
        struct epoll_event evs[LOOP_BATCH];
        /* the system call itself: libc's wrapper would make it a cancellation point, at two calls' cost (and
         * epoll_pwait with no mask, which every architecture has: the newer ones lack epoll_wait) */
        int n = (int)syscall(SYS_epoll_pwait, l->epfd, evs, LOOP_BATCH, timeout_ms, NULL, sizeof(uint64_t));

        if (n <= 0)
                n = 0; /* EINTR, or nothing ready before the deadline */
        l->batch = evs;
        l->batch_n = n;
        for (l->batch_i = 0; l->batch_i < n; l->batch_i++) {
                LoopIo *io = evs[l->batch_i].data.ptr;
                uint32_t e = evs[l->batch_i].events;
                unsigned what = 0;
                if (!io)
                        continue; /* dropped earlier in this round */
                if (e & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
                        what |= LOOP_READ;
                if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR))
                        what |= LOOP_WRITE;
                what &= io->want;
                if (what)
                        io->fn(io->arg, what);
        }
        l->batch = NULL;
        l->batch_n = l->batch_i = 0;
        if (l->threaded && l->n_armed)
                run_timers(l);
}

static void on_host(evutil_socket_t fd, short what, void *userdata)
{
        (void)fd;
        (void)what;
        loop_round(userdata, 0);
}

static void *loop_main(void *arg)
{
        Loop *l = arg;

        (void)pthread_setname_np(pthread_self(), "gpumemd-loop"); /* for top -H, perf and pinning */
        while (!l->quit)
                loop_round(l, round_timeout_ms(l));
        return NULL;
}

int loop_new(struct event_base *host, Loop **ret)
{
        Loop *l = calloc(1, sizeof(*l));
        int r, fd;

        if (!l)
                return -ENOMEM;
        l->threaded = !host;
        l->inbox_io.fd = -1;
        pthread_mutex_init(&l->lock, NULL);
        l->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (l->epfd < 0)
                goto fail_errno;
        fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0)
                goto fail_errno;
        loop_io_init(&l->inbox_io, l, fd, on_inbox, l);
        r = loop_io_want(&l->inbox_io, LOOP_READ);
        if (r < 0)
                goto fail;
        if (host) {
                l->host_ev = event_new(host, l->epfd, EV_READ | EV_PERSIST, on_host, l);
                l->host_timer = evtimer_new(host, on_host_timer, l);
                if (!l->host_ev || !l->host_timer || event_add(l->host_ev, NULL) < 0) {
                        r = -ENOMEM;
                        goto fail;
                }
                l->thread = pthread_self();
        }
        *ret = l;
        return 0;
fail_errno:
        r = -errno;
fail:
        loop_free(l);
        return r;
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
        (void)!write(l->inbox_io.fd, &(uint64_t){1}, sizeof(uint64_t));
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
        if (l->host_ev)
                event_free(l->host_ev);
        if (l->host_timer)
                event_free(l->host_timer);
        loop_io_done(&l->inbox_io);
        if (l->inbox_io.fd >= 0)
                close(l->inbox_io.fd);
        if (l->epfd >= 0)
                close(l->epfd);
        free(l->heap);
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
        LIST_APPEND(l->head, l->tail, w);
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

bool loop_is_current(const Loop *l)
{
        return pthread_equal(l->thread, pthread_self());
}
