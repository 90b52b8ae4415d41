/* The shared state's helpers: the manager's lock, the shards' counters, the connection list, STATUS= updates.
 */
#include "core.h"

#include "conn.h"

void manager_lock(Manager *m)
{
        if (pthread_mutex_trylock(&m->lock) == 0)
                return;
        /* counted while blocked: a teardown in slices lets the lock go to them before its next slice */
        __atomic_fetch_add(&m->lock_waiters, 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&m->lock);
        __atomic_fetch_sub(&m->lock_waiters, 1, __ATOMIC_RELAXED);
}

/* On the main loop: the next teardown slice runs among this round's timers. */
static void reap_arm(void *arg)
{
        static const struct timeval now = {0, 0};
        Manager *m = arg;

        evtimer_add(m->reap_ev, &now);
}

void manager_unlock(Manager *m)
{
        /* the last thread that waited while a slice ran lets the teardown go on */
        if (m->reap_parked && __atomic_load_n(&m->lock_waiters, __ATOMIC_RELAXED) == 0 && !m->freeing) {
                m->reap_parked = false;
                loop_post_work(m->shards[0].loop, &m->reap_work, reap_arm, m);
        }
        pthread_mutex_unlock(&m->lock);
}

void manager_reap_post(Manager *m)
{
        if (m->reap_posted)
                return;
        m->reap_posted = true;
        loop_post_work(m->shards[0].loop, &m->reap_work, reap_arm, m);
}

Shard *manager_current_shard(Manager *m)
{
        for (unsigned i = 0; i < m->n_shards; i++)
                if (loop_is_current(m->shards[i].loop))
                        return &m->shards[i];
        return NULL;
}

void manager_stats(const Manager *m, ManagerStats *ret)
{
        *ret = (ManagerStats){0};
        for (unsigned i = 0; i < m->n_shards; i++) {
                const ManagerStats *s = &m->shards[i].stats;
                ret->requests += READ_ONCE(s->requests);
                ret->protocol_errors += READ_ONCE(s->protocol_errors);
                ret->denials += READ_ONCE(s->denials);
                ret->connections_total += READ_ONCE(s->connections_total);
                ret->connections_refused += READ_ONCE(s->connections_refused);
                ret->stalled_drops += READ_ONCE(s->stalled_drops);
        }
}

/* On the main loop: timers of the whole daemon are armed there, whichever loop asked. */
static void status_arm(void *arg)
{
        static const struct timeval delay = {1, 0};
        Manager *m = arg;

        if (evtimer_add(m->status_ev, &delay) < 0) {
                manager_lock(m);
                m->status_pending = false;
                manager_unlock(m);
        }
}

/* Coalesce STATUS= updates to one a second: a notify socket that is slow to read must not stall clients. */
void manager_notify_status(Manager *m)
{
        if (m->status_pending || !m->status_ev || m->freeing)
                return;
        m->status_pending = true;
        loop_post_work(m->shards[0].loop, &m->status_work, status_arm, m);
}

unsigned manager_conns_of_uid(const Manager *m, uid_t uid)
{
        unsigned n = 0;
        for (const Conn *c = m->conns; c; c = c->next)
                if (c->ident.uid == uid)
                        n++;
        return n;
}

Conn *manager_find_conn(Manager *m, uint64_t client_id)
{
        for (Conn *c = m->conns; c; c = c->next)
                if (c->id == client_id)
                        return c;
        return NULL;
}
