/* The daemon's event loops: epoll, a timer heap and an inbox through which other threads hand them work. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct event_base;

/*
 * Each thread touches only the watchers of its own loop: another thread that needs something done there
 * posts it (loop_post), and the loop runs the posted functions in the order they came. This is the only way
 * work crosses loops, so a loop needs no locking beyond its inbox.
 *
 * A loop is an epoll set of its own. A threaded one waits on it on a thread of its own; the main thread's
 * (shard 0) is watched from the daemon's libevent base, which keeps the signals, the listener and the HTTP
 * exposition: its epoll fd turns readable there when one of its watchers is ready. Timers sit in a binary
 * heap: a threaded loop waits until the earliest deadline at most, a hosted one has the host time it. So
 * a request costs one epoll_wait and the calls of its watchers, nothing else; a loop costs two fds (its
 * epoll set and the inbox's eventfd).
 */
typedef struct Loop Loop;
typedef void (*LoopFn)(void *arg);

/* Work to post that its owner embeds, so that posting it cannot fail. */
typedef struct LoopWork {
        struct LoopWork *next;
        LoopFn fn;
        void *arg;
        bool owned; /* the loop's allocation (loop_post): freed after it ran */
} LoopWork;

/* A loop on a thread of its own (@host NULL: loop_start() runs it), or one whose events run from @host, the
 * caller's libevent base (which must outlive it). */
int loop_new(struct event_base *host, Loop **ret);
/* Start the thread of a threaded loop (no-op otherwise). */
int loop_start(Loop *l);
/* Break a threaded loop from any thread and wait for its thread (what it had been posted runs first).
 * NULL-safe. */
void loop_stop(Loop *l);
/* Once the loops stopped: run on the calling thread what was posted since; true if something ran. */
bool loop_run_pending(Loop *l);
/* Free the loop (stopped first); what is still posted is not run. Its watchers and timers are done
 * already. NULL-safe; returns NULL. */
Loop *loop_free(Loop *l);
/* Run @fn(@arg) on the loop's thread, after what was posted before. Any thread; -ENOMEM. */
int loop_post(Loop *l, LoopFn fn, void *arg);
/* The same with work the caller owns (and may reuse once its function ran): cannot fail. */
void loop_post_work(Loop *l, LoopWork *w, LoopFn fn, void *arg);
/* The calling thread is the loop's. */
bool loop_is_current(const Loop *l);

/*
 * A file descriptor watched for reading and writing (level-triggered), embedded by its owner. @fn gets what
 * is ready of what is wanted (a hang-up or an error counts as both). A watcher whose interest is dropped, or
 * that is done, during a round is not called later in that round, so a callback may end other watchers.
 */
enum { LOOP_READ = 1, LOOP_WRITE = 2 };
typedef void (*LoopIoFn)(void *arg, unsigned what);
typedef struct LoopIo {
        Loop *loop; /* NULL: not initialised, or done */
        LoopIoFn fn;
        void *arg;
        int fd;
        unsigned want;
} LoopIo;
void loop_io_init(LoopIo *io, Loop *l, int fd, LoopIoFn fn, void *arg);
/* Watch for @want (LOOP_READ | LOOP_WRITE, 0: nothing); -errno of epoll_ctl (then nothing is watched). A
 * watcher that wants nothing is out of the epoll set, so a hung-up peer does not wake the loop for it. */
int loop_io_want(LoopIo *io, unsigned want);
/* Out of the loop for good (before its fd is closed). Safe on one never initialised (zeroed) or done. */
void loop_io_done(LoopIo *io);

/* A one-shot timer, embedded by its owner. Its place in the heap is reserved when it is initialised, so
 * arming it cannot fail; @fn runs on the loop's thread once the delay passed. */
typedef struct LoopTimer {
        Loop *loop; /* NULL: not initialised, or done */
        LoopFn fn;
        void *arg;
        uint64_t due_ns; /* CLOCK_MONOTONIC */
        uint32_t pos;    /* its index in the heap + 1; 0: not armed */
} LoopTimer;
int loop_timer_init(LoopTimer *t, Loop *l, LoopFn fn, void *arg); /* -ENOMEM */
/* Arm (or move) it @usec from now. With 0 it runs once the watchers of this round were called (from a
 * timer's callback: in the next round), never inside the caller. */
void loop_timer_arm(LoopTimer *t, uint64_t usec);
void loop_timer_cancel(LoopTimer *t);
static inline bool loop_timer_armed(const LoopTimer *t)
{
        return t->pos != 0;
}
/* Cancelled and its place given back. Safe on one never initialised (zeroed) or done. */
void loop_timer_done(LoopTimer *t);
