/* An event loop on its own thread (or the caller's), with an inbox through which other threads hand it work.
 */
#pragma once

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * Each thread touches only the events of its own loop: another thread that needs something done there
 * posts it (loop_post), and the loop runs the posted functions in the order they came. This is the only way
 * work crosses loops, so libevent needs no locking of its own.
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

/*
 * A loop over @base (taken over: freed with the loop). With @threaded, loop_start() runs it on a thread of
 * its own; otherwise the caller runs the base itself (the daemon's main loop).
 */
int loop_new(struct event_base *base, bool threaded, Loop **ret);
/* Start the thread of a threaded loop (no-op otherwise). */
int loop_start(Loop *l);
/* Break a threaded loop from any thread and wait for its thread (what it had been posted runs first).
 * NULL-safe. */
void loop_stop(Loop *l);
/* Once the loops stopped: run on the calling thread what was posted since; true if something ran. */
bool loop_run_pending(Loop *l);
/* Free the loop (stopped first) and its base; what is still posted is not run. NULL-safe; returns NULL. */
Loop *loop_free(Loop *l);
/* Run @fn(@arg) on the loop's thread, after what was posted before. Any thread; -ENOMEM. */
int loop_post(Loop *l, LoopFn fn, void *arg);
/* The same with work the caller owns (and may reuse once its function ran): cannot fail. */
void loop_post_work(Loop *l, LoopWork *w, LoopFn fn, void *arg);
struct event_base *loop_base(const Loop *l);
/* The calling thread is the loop's. */
bool loop_is_current(const Loop *l);
