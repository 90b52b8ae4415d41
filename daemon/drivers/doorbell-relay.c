/* The doorbell relay (doorbell-relay.h): write pointers polled, doorbells rung from the daemon. */
#include "doorbell-relay.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"

enum {
        RELAY_BUSY_US = 20,   /* between looks right after a doorbell was rung */
        RELAY_IDLE_US = 1000, /* the longest wait between looks while nothing moves */
        /* a queue whose write pointer has not moved for a second is dormant: looked at every 8 ms, so that
         * thousands of idle queues cost the relay an eighth of what they would at every look */
        RELAY_DORMANT_AFTER_US = 1000000,
        RELAY_DORMANT_US = 8000,
};

typedef struct RelayQueue {
        const void *owner;
        uint32_t id;
        bool aql;
        void *map; /* the relay's own mapping of the write pointer's page(s) */
        size_t map_len;
        const volatile uint64_t *wptr;
        volatile uint64_t *doorbell;
        uint64_t rung;      /* the value last written to the doorbell */
        uint64_t moved_us;  /* when it was added or last rung (CLOCK_MONOTONIC) */
        uint64_t next_look; /* dormant: not looked at before then */
} RelayQueue;

struct DoorbellRelay {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        pthread_t thread;
        bool started, stop;
        RelayQueue *q;
        size_t n, cap;
        uint64_t rings;
        void (*notify)(void *arg);
        void *notify_arg;
};

/* What the doorbell would hold for write pointer @wptr: an AQL doorbell names the last packet written. */
static uint64_t doorbell_value(const RelayQueue *q, uint64_t wptr)
{
        return q->aql ? wptr - 1 : wptr;
}

/* One look at the queues due: the number of doorbells rung; *@ret_dormant whether every queue is dormant. */
static unsigned relay_round(DoorbellRelay *r, bool *ret_dormant)
{
        uint64_t now = now_usec(CLOCK_MONOTONIC);
        unsigned rung = 0;

        *ret_dormant = true;
        for (size_t i = 0; i < r->n; i++) {
                RelayQueue *q = &r->q[i];
                bool dormant = now - q->moved_us >= RELAY_DORMANT_AFTER_US;
                uint64_t v;

                *ret_dormant &= dormant;
                if (dormant && now < q->next_look)
                        continue;
                v = doorbell_value(q, __atomic_load_n(q->wptr, __ATOMIC_ACQUIRE));
                if (v == q->rung) {
                        if (dormant)
                                q->next_look = now + RELAY_DORMANT_US;
                        continue;
                }
                q->moved_us = now;
                /* the ring's packets were written before the write pointer moved; they stay before this */
                __atomic_store_n(q->doorbell, v, __ATOMIC_RELEASE);
                q->rung = v;
                rung++;
        }
        r->rings += rung;
        return rung;
}

static void *relay_main(void *arg)
{
        DoorbellRelay *r = arg;
        unsigned wait_us = RELAY_BUSY_US;
        bool dormant;

        pthread_mutex_lock(&r->lock);
        while (!r->stop) {
                if (r->n == 0) {
                        pthread_cond_wait(&r->cond, &r->lock);
                        wait_us = RELAY_BUSY_US;
                        continue;
                }
                if (relay_round(r, &dormant)) {
                        wait_us = RELAY_BUSY_US;
                        if (r->notify) {
                                pthread_mutex_unlock(&r->lock);
                                r->notify(r->notify_arg);
                                pthread_mutex_lock(&r->lock);
                        }
                } else if (dormant)
                        wait_us = RELAY_DORMANT_US;
                else if (wait_us < RELAY_IDLE_US)
                        wait_us = wait_us * 2 > RELAY_IDLE_US ? RELAY_IDLE_US : wait_us * 2;
                struct timespec t = timespec_after_usec(CLOCK_MONOTONIC, wait_us);
                pthread_cond_timedwait(&r->cond, &r->lock, &t);
        }
        pthread_mutex_unlock(&r->lock);
        return NULL;
}

int doorbell_relay_new(DoorbellRelay **ret)
{
        DoorbellRelay *r = calloc(1, sizeof(*r));
        pthread_condattr_t ca;

        if (!r)
                return -ENOMEM;
        pthread_mutex_init(&r->lock, NULL);
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&r->cond, &ca);
        pthread_condattr_destroy(&ca);
        *ret = r;
        return 0;
}

static void queue_unmap(RelayQueue *q)
{
        munmap(q->map, q->map_len);
}

void doorbell_relay_free(DoorbellRelay *r)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        r->stop = true;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
        if (r->started)
                pthread_join(r->thread, NULL);
        for (size_t i = 0; i < r->n; i++)
                queue_unmap(&r->q[i]);
        free(r->q);
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        free(r);
}

int doorbell_relay_add(DoorbellRelay *r, const void *owner, uint32_t id, int wptr_fd, uint64_t wptr_offset,
                       volatile uint64_t *doorbell, bool aql)
{
        uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), base = wptr_offset & ~(page - 1);
        RelayQueue q = {.owner = owner, .id = id, .aql = aql, .doorbell = doorbell, .map_len = page};
        int err = 0;

        if (!r || wptr_fd < 0 || !doorbell || (wptr_offset & 7))
                return -EINVAL;
        q.map = mmap(NULL, q.map_len, PROT_READ, MAP_SHARED, wptr_fd, (off_t)base);
        if (q.map == MAP_FAILED)
                return -errno;
        q.wptr = (const volatile uint64_t *)((const char *)q.map + (wptr_offset - base));
        /* what the doorbell holds before anything was written: nothing announced */
        q.rung = doorbell_value(&q, 0);
        q.moved_us = now_usec(CLOCK_MONOTONIC);
        pthread_mutex_lock(&r->lock);
        if (ARRAY_RESERVE(r->q, r->cap, r->n + 1, 16) < 0) {
                err = -ENOMEM;
                goto out;
        }
        if (!r->started) {
                err = -pthread_create(&r->thread, NULL, relay_main, r);
                if (err < 0)
                        goto out;
                (void)pthread_setname_np(r->thread, "gpumemd-relay");
                r->started = true;
        }
        r->q[r->n++] = q;
        pthread_cond_broadcast(&r->cond);
out:
        pthread_mutex_unlock(&r->lock);
        if (err < 0)
                queue_unmap(&q);
        return err;
}

/* Under the lock: drops entry @i (its mapping goes once the lock is released). */
static RelayQueue take(DoorbellRelay *r, size_t i)
{
        RelayQueue q = r->q[i];

        r->q[i] = r->q[--r->n];
        return q;
}

void doorbell_relay_remove(DoorbellRelay *r, const void *owner, uint32_t id)
{
        RelayQueue q = {0};
        bool found = false;

        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        for (size_t i = 0; i < r->n && !found; i++)
                if (r->q[i].owner == owner && r->q[i].id == id) {
                        q = take(r, i);
                        found = true;
                }
        pthread_mutex_unlock(&r->lock);
        if (found)
                queue_unmap(&q);
}

void doorbell_relay_remove_owner(DoorbellRelay *r, const void *owner)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        for (size_t i = 0; i < r->n;) {
                if (r->q[i].owner != owner) {
                        i++;
                        continue;
                }
                RelayQueue q = take(r, i);
                queue_unmap(&q); /* the thread is not in a round: it waits for the lock */
        }
        pthread_mutex_unlock(&r->lock);
}

void doorbell_relay_set_notify(DoorbellRelay *r, void (*fn)(void *arg), void *arg)
{
        pthread_mutex_lock(&r->lock);
        r->notify = fn;
        r->notify_arg = arg;
        pthread_mutex_unlock(&r->lock);
}

void doorbell_relay_stats(DoorbellRelay *r, uint32_t *ret_queues, uint64_t *ret_rings)
{
        pthread_mutex_lock(&r->lock);
        *ret_queues = (uint32_t)r->n;
        *ret_rings = r->rings;
        pthread_mutex_unlock(&r->lock);
}
