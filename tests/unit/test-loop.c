/* Unit test of the daemon's event loops: timers in deadline order, fd watchers, the inbox, a hosted loop. */
#include <event2/event.h>
#include <semaphore.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "base/loop.h"
#include "base/util.h"

/* Run @fn(@arg) on @l's thread and wait until it ran (at most five seconds). */
typedef struct Call {
        LoopFn fn;
        void *arg;
        sem_t done;
} Call;

static void call_trampoline(void *arg)
{
        Call *c = arg;

        c->fn(c->arg);
        sem_post(&c->done);
}

static int wait_sem(sem_t *s)
{
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        return sem_timedwait(s, &ts) == 0 ? 0 : -ETIMEDOUT;
}

static int on_loop(Loop *l, LoopFn fn, void *arg)
{
        Call c = {fn, arg};
        int r;

        sem_init(&c.done, 0, 0);
        loop_post(l, call_trampoline, &c);
        r = wait_sem(&c.done);
        sem_destroy(&c.done);
        return r;
}

/* ---- timers ---- */

#define N_TIMERS 40

typedef struct Timers {
        Loop *l;
        LoopTimer t[N_TIMERS];
        int order[N_TIMERS];
        int n_fired;
        sem_t all;
        int expect;
} Timers;

typedef struct TimerArg {
        Timers *ts;
        int i;
} TimerArg;

static TimerArg timer_args[N_TIMERS];

static void on_timer(void *arg)
{
        TimerArg *a = arg;
        Timers *ts = a->ts;

        ts->order[ts->n_fired++] = a->i;
        if (ts->n_fired == ts->expect)
                sem_post(&ts->all);
}

/* Timers armed out of order, some moved and some cancelled: the others fire by deadline. */
static void timers_arm(void *arg)
{
        Timers *ts = arg;

        for (int i = 0; i < N_TIMERS; i++) {
                timer_args[i] = (TimerArg){ts, i};
                CHECK_EQ(loop_timer_init(&ts->t[i], ts->l, on_timer, &timer_args[i]), 0);
        }
        /* timer i due at (i * 7 % N_TIMERS) ms + 20, i.e. a permutation */
        for (int i = 0; i < N_TIMERS; i++)
                loop_timer_arm(&ts->t[i], (uint64_t)((i * 7) % N_TIMERS) * 1000 + 20000);
        /* moved: the last one first of all, the first one to the end */
        loop_timer_arm(&ts->t[N_TIMERS - 1], 0);
        loop_timer_arm(&ts->t[0], 200000);
        /* cancelled: every fifth, except those two */
        for (int i = 5; i < N_TIMERS - 1; i += 5)
                loop_timer_cancel(&ts->t[i]);
        CHECK(!loop_timer_armed(&ts->t[5]));
        CHECK(loop_timer_armed(&ts->t[1]));
}

static void timers_done(void *arg)
{
        Timers *ts = arg;

        for (int i = 0; i < N_TIMERS; i++) {
                CHECK(!loop_timer_armed(&ts->t[i]));
                loop_timer_done(&ts->t[i]);
                loop_timer_done(&ts->t[i]); /* twice is harmless */
        }
}

static void test_timers(void)
{
        Timers ts = {0};
        uint64_t prev = 0;
        int cancelled = 0;

        ASSERT_RC(loop_new(NULL, &ts.l), 0);
        ASSERT_RC(loop_start(ts.l), 0);
        sem_init(&ts.all, 0, 0);
        for (int i = 5; i < N_TIMERS - 1; i += 5)
                cancelled++;
        ts.expect = N_TIMERS - cancelled;
        CHECK_EQ(on_loop(ts.l, timers_arm, &ts), 0);
        CHECK_EQ(wait_sem(&ts.all), 0);
        CHECK_EQ(ts.n_fired, ts.expect);
        CHECK_EQ(ts.order[0], N_TIMERS - 1);
        CHECK_EQ(ts.order[ts.n_fired - 1], 0);
        for (int k = 1; k < ts.n_fired - 1; k++) {
                int i = ts.order[k];
                uint64_t due = (uint64_t)((i * 7) % N_TIMERS);
                CHECK(i % 5 != 0);
                CHECK(due >= prev);
                prev = due;
        }
        CHECK_EQ(on_loop(ts.l, timers_done, &ts), 0);
        loop_free(ts.l);
        sem_destroy(&ts.all);
}

/* A timer whose callback frees the next one due in the same round: that one does not fire. */
typedef struct Pair {
        LoopTimer a, b;
        int fired_a, fired_b;
        sem_t done;
        LoopTimer end;
} Pair;

static void pair_a(void *arg)
{
        Pair *p = arg;

        p->fired_a++;
        loop_timer_done(&p->b);
}

static void pair_b(void *arg)
{
        ((Pair *)arg)->fired_b++;
}

static void pair_end(void *arg)
{
        sem_post(&((Pair *)arg)->done);
}

static Loop *pair_loop;

static void pair_arm(void *arg)
{
        Pair *p = arg;

        CHECK_EQ(loop_timer_init(&p->a, pair_loop, pair_a, p), 0);
        CHECK_EQ(loop_timer_init(&p->b, pair_loop, pair_b, p), 0);
        CHECK_EQ(loop_timer_init(&p->end, pair_loop, pair_end, p), 0);
        loop_timer_arm(&p->a, 10000);
        loop_timer_arm(&p->b, 10001);
        loop_timer_arm(&p->end, 30000);
}

static void pair_done(void *arg)
{
        Pair *p = arg;

        loop_timer_done(&p->a);
        loop_timer_done(&p->end);
}

static void test_timer_ends_another(void)
{
        Pair p = {0};

        ASSERT_RC(loop_new(NULL, &pair_loop), 0);
        ASSERT_RC(loop_start(pair_loop), 0);
        sem_init(&p.done, 0, 0);
        CHECK_EQ(on_loop(pair_loop, pair_arm, &p), 0);
        CHECK_EQ(wait_sem(&p.done), 0);
        CHECK_EQ(p.fired_a, 1);
        CHECK_EQ(p.fired_b, 0);
        CHECK_EQ(on_loop(pair_loop, pair_done, &p), 0);
        pair_loop = loop_free(pair_loop);
        sem_destroy(&p.done);
}

/* ---- watchers ---- */

typedef struct Watch {
        Loop *l;
        int sv[2][2];
        LoopIo io[2];
        int calls[2];
        unsigned what[2];
        sem_t called;
} Watch;

typedef struct WatchArg {
        Watch *w;
        int i;
} WatchArg;

static WatchArg watch_args[2];

/* Each watcher's callback ends the other: of two ready in one round, one is called. */
static void on_watch_end_other(void *arg, unsigned what)
{
        WatchArg *a = arg;
        Watch *w = a->w;
        char buf[16];

        w->calls[a->i]++;
        w->what[a->i] = what;
        (void)!read(w->sv[a->i][0], buf, sizeof(buf));
        loop_io_done(&w->io[1 - a->i]);
        sem_post(&w->called);
}

static void watch_setup(void *arg)
{
        Watch *w = arg;

        for (int i = 0; i < 2; i++) {
                watch_args[i] = (WatchArg){w, i};
                loop_io_init(&w->io[i], w->l, w->sv[i][0], on_watch_end_other, &watch_args[i]);
        }
        /* both readable before they are watched: the next round reports both */
        for (int i = 0; i < 2; i++)
                CHECK_EQ(loop_io_want(&w->io[i], LOOP_READ), 0);
}

static void watch_done(void *arg)
{
        Watch *w = arg;

        loop_io_done(&w->io[0]);
        loop_io_done(&w->io[1]);
}

static void test_watcher_ends_another(void)
{
        Watch w = {0};

        for (int i = 0; i < 2; i++)
                ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, w.sv[i]) == 0);
        for (int i = 0; i < 2; i++)
                ASSERT(write(w.sv[i][1], "x", 1) == 1);
        ASSERT_RC(loop_new(NULL, &w.l), 0);
        ASSERT_RC(loop_start(w.l), 0);
        sem_init(&w.called, 0, 0);
        CHECK_EQ(on_loop(w.l, watch_setup, &w), 0);
        CHECK_EQ(wait_sem(&w.called), 0);
        /* a second call would have come in the same round: a round trip through the inbox comes after it */
        CHECK_EQ(on_loop(w.l, watch_done, &w), 0);
        CHECK_EQ(w.calls[0] + w.calls[1], 1);
        CHECK_EQ(w.what[0] | w.what[1], LOOP_READ);
        loop_free(w.l);
        for (int i = 0; i < 2; i++) {
                close(w.sv[i][0]);
                close(w.sv[i][1]);
        }
        sem_destroy(&w.called);
}

/* Interest changes: writable only when asked; a hung-up peer reported as both; nothing once nothing is
 * wanted, though the fd stays hung up. */
typedef struct Hup {
        Loop *l;
        int sv[2];
        LoopIo io;
        int calls;
        unsigned what;
        sem_t called;
} Hup;

static void on_hup(void *arg, unsigned what)
{
        Hup *h = arg;

        h->calls++;
        h->what = what;
        CHECK_EQ(loop_io_want(&h->io, 0), 0); /* level-triggered: it would come every round */
        sem_post(&h->called);
}

static void hup_want(void *arg)
{
        Hup *h = arg;

        CHECK_EQ(loop_io_want(&h->io, LOOP_READ | LOOP_WRITE), 0);
}

static void hup_setup(void *arg)
{
        Hup *h = arg;

        loop_io_init(&h->io, h->l, h->sv[0], on_hup, h);
        CHECK_EQ(loop_io_want(&h->io, LOOP_WRITE), 0);
}

static void hup_done(void *arg)
{
        loop_io_done(&((Hup *)arg)->io);
}

static void nothing(void *arg)
{
        (void)arg;
}

static void test_interest(void)
{
        Hup h = {0};

        ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, h.sv) == 0);
        ASSERT_RC(loop_new(NULL, &h.l), 0);
        ASSERT_RC(loop_start(h.l), 0);
        sem_init(&h.called, 0, 0);
        CHECK_EQ(on_loop(h.l, hup_setup, &h), 0);
        CHECK_EQ(wait_sem(&h.called), 0);
        CHECK_EQ(h.what, LOOP_WRITE); /* an empty socket is writable, not readable */
        close(h.sv[1]);
        usleep(20000);
        CHECK_EQ(on_loop(h.l, nothing, NULL), 0);
        CHECK_EQ(h.calls, 1); /* hung up, but nothing is wanted */
        CHECK_EQ(on_loop(h.l, hup_want, &h), 0);
        CHECK_EQ(wait_sem(&h.called), 0);
        CHECK_EQ(h.what, LOOP_READ | LOOP_WRITE);
        usleep(20000);
        CHECK_EQ(on_loop(h.l, nothing, NULL), 0);
        CHECK_EQ(h.calls, 2);
        CHECK_EQ(on_loop(h.l, hup_done, &h), 0);
        loop_free(h.l);
        close(h.sv[0]);
        sem_destroy(&h.called);
}

/* ---- the inbox, and a loop hosted by a libevent base ---- */

static void count(void *arg)
{
        (*(int *)arg)++;
}

/* What was posted before loop_stop runs before the thread ends; loop_run_pending runs what came after. */
static void test_stop_runs_posted(void)
{
        Loop *l;
        int n = 0;

        ASSERT_RC(loop_new(NULL, &l), 0);
        ASSERT_RC(loop_start(l), 0);
        for (int i = 0; i < 100; i++)
                CHECK_EQ(loop_post(l, count, &n), 0);
        loop_stop(l);
        CHECK_EQ(n, 100);
        CHECK_EQ(loop_post(l, count, &n), 0);
        CHECK(loop_run_pending(l));
        CHECK(!loop_run_pending(l));
        CHECK_EQ(n, 101);
        loop_free(l);
}

typedef struct Hosted {
        Loop *l;
        LoopTimer t;
        int fired;
} Hosted;

static void hosted_fire(void *arg)
{
        ((Hosted *)arg)->fired++;
}

static void test_hosted(void)
{
        struct event_base *base = event_base_new();
        Hosted h = {0};
        int n = 0;

        ASSERT(base != NULL);
        ASSERT_RC(loop_new(base, &h.l), 0);
        CHECK(loop_is_current(h.l));
        CHECK_EQ(loop_start(h.l), 0); /* nothing to start */
        CHECK_EQ(loop_post(h.l, count, &n), 0);
        CHECK_EQ(loop_timer_init(&h.t, h.l, hosted_fire, &h), 0);
        loop_timer_arm(&h.t, 5000);
        for (int i = 0; i < 1000 && (n == 0 || h.fired == 0); i++)
                event_base_loop(base, EVLOOP_ONCE);
        CHECK_EQ(n, 1);
        CHECK_EQ(h.fired, 1);
        loop_timer_done(&h.t);
        loop_free(h.l);
        event_base_free(base);
}

int main(void)
{
        static const TestCase cases[] = {
                {"timers fire by deadline, moved and cancelled ones too", test_timers},
                {"a timer ended by one due before it in the same round does not fire",
                 test_timer_ends_another},
                {"a watcher ended by another called in the same round is not called",
                 test_watcher_ends_another},
                {"a watcher is called for what it wants, a hang-up as both", test_interest},
                {"what was posted runs before the loop stops, or by loop_run_pending", test_stop_runs_posted},
                {"a loop hosted by a libevent base runs its inbox and timers there", test_hosted},
        };
        return run_tests(cases, ARRAY_SIZE(cases));
}
