/* Class state: per-class accounts bound to connections, rebuilt by name when the policy is reloaded. */
#include "classes.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conn.h"
#include "base/log.h"
#include "core.h"
#include "window.h"

ClassState *classes_find(Manager *m, const char *name)
{
        for (ClassState *s = m->classes; s; s = s->next)
                if (strcmp(s->name, name) == 0)
                        return s;
        return NULL;
}

static ClassState *state_get(Manager *m, const char *name)
{
        ClassState *s = classes_find(m, name);

        if (s)
                return s;
        s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        s->name = strdup(name);
        if (!s->name) {
                free(s);
                return NULL;
        }
        broker_account_init(&s->acct, s->name);
        {
                ClassState **pp = &m->classes; /* at the tail: listings follow the file's order */
                while (*pp)
                        pp = &(*pp)->next;
                *pp = s;
        }
        return s;
}

_Static_assert(POLICY_MAX_SHARES < BROKER_MAX_SHARES, "one class can never fill the table of shares");

/* A class's mapping limit: its own, or half of what all clients may cost, so no class takes it all. */
static uint64_t class_mappings(Manager *m, const PolicyClass *k)
{
        uint64_t total, per_uid;

        if (k->limit[POLICY_RES_MAPPINGS] != POLICY_UNLIMITED)
                return k->limit[POLICY_RES_MAPPINGS];
        broker_mapping_limits(m->broker, &total, &per_uid);
        return total == UINT64_MAX ? UINT64_MAX : total / 2;
}

/* Limits of the state from its class (a reload resets runtime changes to the file's values). The account is
 * read by its clients' loops under its lock, the rules without any lock. */
static void state_configure(Manager *m, ClassState *s, const PolicyClass *k)
{
        BrokerAccount *a = &s->acct;
        /* read before the account's lock: the broker's lock is taken before an account's, never after */
        const uint64_t max_mappings = class_mappings(m, k);
        uint64_t allowed;

        s->klass = k;
        broker_account_lock(a);
        a->max_vram = k->limit[POLICY_RES_VRAM];
        a->max_host = k->limit[POLICY_RES_HOST];
        a->max_managed = k->limit[POLICY_RES_MANAGED];
        a->max_handles = k->limit[POLICY_RES_HANDLES];
        a->max_fds = k->limit[POLICY_RES_FDS];
        a->max_queues = k->limit[POLICY_RES_QUEUES];
        a->max_mappings = max_mappings;
        a->max_shares = k->limit[POLICY_RES_SHARES];
        s->max_connections = k->limit[POLICY_RES_CONNECTIONS];
        s->max_inflight = k->limit[POLICY_RES_INFLIGHT];
        s->max_windows = k->limit[POLICY_RES_WINDOWS];
        WRITE_ONCE(s->deny_ops, k->deny_ops);
        s->admin = k->admin;
        a->import_foreign = k->import_foreign;
        __atomic_store_n(&a->shared_ctx, k->shared_gpu_context, __ATOMIC_RELAXED);
        if (k->shared_gpu_context && !driver_has(m->drv, DRIVER_CAP_PRIVATE_VM))
                log_warning(
                        "class '%s' has shared-gpu-context = yes and the kernel gives no GPU context per "
                        "client: its clients' queues run in one context with every such class's, can read "
                        "and write each other's memory, and a fault of one stops them all",
                        k->name);
        a->max_foreign = k->foreign_imports;
        a->max_foreign_one = k->foreign_import_max;
        a->max_host_one = k->host_alloc_max;
        for (size_t i = 0; i < BROKER_MAX_GPUS; i++)
                a->max_vram_gpu[i] = UINT64_MAX;
        for (size_t i = 0; i < k->n_vram_gpu; i++) {
                int gi = broker_gpu_index(m->broker, k->vram_gpu_ids[i]);
                if (gi < 0)
                        log_warning("class '%s' limits VRAM on GPU %u, which this node does not have",
                                    k->name, k->vram_gpu_ids[i]);
                else
                        a->max_vram_gpu[gi] = k->vram_gpu_limit[i];
        }
        allowed = k->n_gpus == 0 ? UINT64_MAX : 0;
        for (size_t i = 0; i < k->n_gpus; i++) {
                int gi = broker_gpu_index(m->broker, k->gpus[i]);
                if (gi < 0)
                        log_warning("class '%s' lists GPU %u, which this node does not have", k->name,
                                    k->gpus[i]);
                else
                        allowed |= 1ull << gi;
        }
        /* whole, in one store: the broker reads it without the lock */
        __atomic_store_n(&a->allowed_gpus, allowed, __ATOMIC_RELAXED);
        broker_account_unlock(a);
}

static const PolicyClass *match_conn(const Manager *m, const Conn *c)
{
        PolicyIdentity id = {
                .uid = c->ident.uid,
                .gid = c->ident.gid,
                .groups = c->ident.groups,
                .n_groups = c->ident.n_groups,
                .cgroup = c->ident.cgroup,
        };
        return policy_match(m->policy, &id);
}

/* The in-flight limit of @s (every class when NULL) into its connections, which read it without the lock. */
static void refresh_inflight(Manager *m, const ClassState *s)
{
        for (Conn *c = m->conns; c; c = c->next)
                if (c->cls && (!s || c->cls == s))
                        WRITE_ONCE(c->max_inflight, c->cls->max_inflight);
}

/* Under the manager's lock, from any thread: the client's lock keeps its running requests out meanwhile. */
static void class_bind(Conn *c, ClassState *s)
{
        if (c->cls == s)
                return;
        conn_lock(c);
        if (c->cls)
                c->cls->connections--;
        c->cls = s;
        /* its loop reads the limit without the lock; the class itself may go at a reload */
        WRITE_ONCE(c->max_inflight, s ? s->max_inflight : POLICY_DEFAULT_INFLIGHT);
        if (s)
                s->connections++;
        if (c->broker)
                broker_client_set_account(c->broker, s ? &s->acct : NULL);
        conn_unlock(c);
}

bool classes_is_admin(const Manager *m, const Conn *c)
{
        if (c->ident.uid == 0 || c->ident.uid == geteuid())
                return true;
        if (c->cls && c->cls->admin)
                return true;
        for (size_t i = 0; i < m->opts.n_admin_gids; i++)
                if (conn_in_group(c, m->opts.admin_gids[i]))
                        return true;
        return false;
}

void classes_apply(Manager *m, Policy *p)
{
        Policy *old = m->policy;

        m->policy = p;
        for (ClassState *s = m->classes; s; s = s->next)
                s->klass = NULL;
        for (size_t i = 0; i < p->n_classes; i++) {
                ClassState *s = state_get(m, p->classes[i].name);
                if (!s) {
                        log_error("out of memory applying class '%s'", p->classes[i].name);
                        continue;
                }
                state_configure(m, s, &p->classes[i]);
        }
        /* every client again: a class it no longer matches lets it go to the one it matches now; one that no
         * class admits any more keeps its old class (and its limits) until it disconnects */
        for (Conn *c = m->conns; c; c = c->next) {
                const PolicyClass *k = match_conn(m, c);
                ClassState *s = k ? classes_find(m, k->name) : NULL;
                if (s && s != c->cls) {
                        conn_log(c, LOG_INFO, GM_MESSAGE_CONFIG_RELOAD, NULL, "moves from class '%s' to '%s'",
                                 c->cls ? c->cls->name : "-", s->name);
                        class_bind(c, s);
                }
                /* rights follow the new policy (and admin-groups) at once */
                if (c->proto_version)
                        c->admin = classes_is_admin(m, c);
        }
        /* states of removed classes go once empty */
        for (ClassState **pp = &m->classes; *pp;) {
                ClassState *s = *pp;
                bool held;
                broker_account_lock(&s->acct);
                held = s->acct.lingering > 0 || s->acct.clients > 0;
                broker_account_unlock(&s->acct);
                if (!s->klass && s->connections == 0 && !held) {
                        *pp = s->next;
                        broker_account_done(&s->acct);
                        free(s->name);
                        free(s);
                } else {
                        pp = &s->next;
                }
        }
        refresh_inflight(m, NULL); /* a limit may have changed in a class its clients stay in */
        policy_free(old);
}

int classes_admit(Manager *m, Conn *c, char *reason, size_t len)
{
        const PolicyClass *k = match_conn(m, c);
        ClassState *s = k ? classes_find(m, k->name) : NULL;

        if (!s) {
                snprintf(reason, len, "no policy class admits uid %u (cgroup %s)", (unsigned)c->ident.uid,
                         c->ident.cgroup ? c->ident.cgroup : "unknown");
                return -EACCES;
        }
        if (s->connections >= s->max_connections) {
                __atomic_fetch_add(&s->denials, 1, __ATOMIC_RELAXED);
                snprintf(reason, len, "class '%s' is at its limit of %llu connections", s->name,
                         (unsigned long long)s->max_connections);
                return -EUSERS;
        }
        class_bind(c, s);
        return 0;
}

void classes_leave(Conn *c)
{
        if (c->cls) {
                c->cls->connections--;
                c->cls = NULL;
        }
}

void classes_free_all(Manager *m)
{
        while (m->classes) {
                ClassState *s = m->classes;
                m->classes = s->next;
                broker_account_done(&s->acct);
                free(s->name);
                free(s);
        }
        m->policy = policy_free(m->policy);
}

/* Where a class keeps its limit on each resource (VRAM's on all GPUs): offsets in its ClassState. */
static const size_t limit_at[_POLICY_RES_MAX] = {
        [POLICY_RES_VRAM] = offsetof(ClassState, acct.max_vram),
        [POLICY_RES_HOST] = offsetof(ClassState, acct.max_host),
        [POLICY_RES_MANAGED] = offsetof(ClassState, acct.max_managed),
        [POLICY_RES_HANDLES] = offsetof(ClassState, acct.max_handles),
        [POLICY_RES_FDS] = offsetof(ClassState, acct.max_fds),
        [POLICY_RES_CONNECTIONS] = offsetof(ClassState, max_connections),
        [POLICY_RES_INFLIGHT] = offsetof(ClassState, max_inflight),
        [POLICY_RES_WINDOWS] = offsetof(ClassState, max_windows),
        [POLICY_RES_QUEUES] = offsetof(ClassState, acct.max_queues),
        [POLICY_RES_MAPPINGS] = offsetof(ClassState, acct.max_mappings),
        [POLICY_RES_SHARES] = offsetof(ClassState, acct.max_shares),
};

/* Where a class keeps its limit on @r: for VRAM, on the GPU of index @gi, or on all of them (-1). */
static uint64_t *limit_of(ClassState *s, PolicyResource r, int gi)
{
        if (r == POLICY_RES_VRAM && gi >= 0)
                return &s->acct.max_vram_gpu[gi];
        if ((unsigned)r >= _POLICY_RES_MAX)
                return NULL;
        return (uint64_t *)((char *)s + limit_at[r]);
}

/* What a class uses of @r. Under the account's lock. */
static uint64_t used_locked(const Manager *m, ClassState *s, PolicyResource r, int gi)
{
        const BrokerAccount *a = &s->acct;
        uint64_t n = 0;

        switch (r) {
        case POLICY_RES_VRAM:
                return gi >= 0 ? a->used.vram_bytes[gi] : a->used.device_bytes + a->used.vmm_bytes;
        case POLICY_RES_HOST:
                return a->used.host_bytes;
        case POLICY_RES_MANAGED:
                return a->used.managed_bytes;
        case POLICY_RES_HANDLES:
                return a->used.objects;
        case POLICY_RES_FDS:
                return a->used.held_fds;
        case POLICY_RES_CONNECTIONS:
                return s->connections;
        case POLICY_RES_INFLIGHT:
                for (const Conn *c = m->conns; c; c = c->next)
                        if (c->cls == s)
                                n += (uint64_t)READ_ONCE(c->inflight);
                return n;
        case POLICY_RES_WINDOWS:
                return window_count_of_class(m, s);
        case POLICY_RES_QUEUES:
                return a->used.queues;
        case POLICY_RES_MAPPINGS:
                return a->used.mappings;
        case POLICY_RES_SHARES:
                return a->used.shares;
        default:
                return 0;
        }
}

/* Under the account's lock. */
static void get_locked(const Manager *m, ClassState *s, PolicyResource r, uint32_t gpu_id, uint64_t *ret_used,
                       uint64_t *ret_limit)
{
        int gi = gpu_id ? broker_gpu_index(m->broker, gpu_id) : -1;
        const uint64_t *limit = limit_of(s, r, gi);

        *ret_used = limit ? used_locked(m, s, r, gi) : 0;
        *ret_limit = limit ? *limit : 0;
}

void classes_get(const Manager *m, ClassState *s, PolicyResource r, uint32_t gpu_id, uint64_t *ret_used,
                 uint64_t *ret_limit)
{
        broker_account_lock(&s->acct);
        get_locked(m, s, r, gpu_id, ret_used, ret_limit);
        broker_account_unlock(&s->acct);
}

int classes_set_limit(Manager *m, ClassState *s, PolicyResource r, uint32_t gpu_id, uint64_t limit,
                      bool force, char *reason, size_t len)
{
        uint64_t used, old, *field;
        int gi = -1;

        if (gpu_id) {
                if (r != POLICY_RES_VRAM) {
                        snprintf(reason, len, "only VRAM has per-GPU limits");
                        return -EINVAL;
                }
                gi = broker_gpu_index(m->broker, gpu_id);
                if (gi < 0) {
                        snprintf(reason, len, "no GPU with id %u", gpu_id);
                        return -ENODEV;
                }
        }
        if (r == POLICY_RES_INFLIGHT && limit == 0) {
                snprintf(reason, len, "inflight must be at least 1: a class with none could never be read");
                return -EINVAL;
        }
        if (r >= _POLICY_RES_MAX) {
                snprintf(reason, len, "unknown resource %d", (int)r);
                return -EINVAL;
        }
        if (r == POLICY_RES_SHARES && limit > POLICY_MAX_SHARES) {
                snprintf(reason, len, "shares: at most %d, half the daemon's table of shares",
                         POLICY_MAX_SHARES);
                return -EINVAL;
        }
        /* checked and set in one step: its clients' allocations on other loops wait meanwhile */
        broker_account_lock(&s->acct);
        get_locked(m, s, r, gpu_id, &used, &old);
        if (used > limit && !force) {
                broker_account_unlock(&s->acct);
                snprintf(reason, len,
                         "class '%s' uses %llu of %s, more than the new limit %llu (force to override)",
                         s->name, (unsigned long long)used, policy_resource_name(r),
                         (unsigned long long)limit);
                return -EBUSY;
        }
        field = limit_of(s, r, gi);
        if (field)
                *field = limit;
        if (r == POLICY_RES_INFLIGHT)
                refresh_inflight(m, s);
        broker_account_unlock(&s->acct);
        /* the old limit, for the log */
        if (old == UINT64_MAX)
                snprintf(reason, len, "unlimited");
        else
                snprintf(reason, len, "%llu", (unsigned long long)old);
        return 0;
}
