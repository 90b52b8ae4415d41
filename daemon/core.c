/* The shared state's helpers: the manager's lock, the shards' counters, the connection list, STATUS= updates.
 */
#include "core.h"

#include "conn.h"

void manager_lock(Manager *m)
{
        pthread_mutex_lock(&m->lock);
}

void manager_unlock(Manager *m)
{
        pthread_mutex_unlock(&m->lock);
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
