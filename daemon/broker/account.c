/* What objects cost: the class's limits checked and charged in one step, refunds, a client's account. */
#include "broker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"

void broker_account_init(BrokerAccount *a, const char *name)
{
        memset(a, 0, sizeof(*a));
        a->name = name;
        a->max_vram = a->max_host = a->max_managed = a->max_handles = a->max_fds = a->max_queues = UINT64_MAX;
        a->max_mappings = a->max_shares = UINT64_MAX;
        a->max_foreign = a->max_foreign_one = a->max_host_one = UINT64_MAX;
        for (size_t i = 0; i < BROKER_MAX_GPUS; i++)
                a->max_vram_gpu[i] = UINT64_MAX;
        a->allowed_gpus = UINT64_MAX;
        a->import_foreign = true;
        pthread_mutex_init(&a->lock, NULL);
}

void broker_account_done(BrokerAccount *a)
{
        pthread_mutex_destroy(&a->lock);
}

void broker_account_lock(BrokerAccount *a)
{
        pthread_mutex_lock(&a->lock);
}

void broker_account_unlock(BrokerAccount *a)
{
        pthread_mutex_unlock(&a->lock);
}

void broker_account_usage(BrokerAccount *a, BrokerUsage *ret)
{
        pthread_mutex_lock(&a->lock);
        *ret = a->used;
        pthread_mutex_unlock(&a->lock);
}

/* A driver that keeps a buffer's memory in a file of the daemon's once it can be shared (the model) costs
 * an fd per such buffer, which the client's class pays for like the daemon's own memfds of host and
 * managed memory. */
bool broker_driver_holds_fd(const Broker *b)
{
        return driver_has(b->drv, DRIVER_CAP_FD_PER_SHARED_BUFFER);
}

/* Does device memory allocated with @flags cost a file from its allocation? Host-visible memory does, and
 * all of it where the client maps it from its export. */
bool broker_driver_file_at_alloc(const Broker *b, uint32_t flags)
{
        return broker_driver_holds_fd(b) &&
               ((flags & BROKER_FLAG_HOST_VISIBLE) || driver_has(b->drv, DRIVER_CAP_CLIENT_MAPS));
}

/* Device or VMM memory of @o that the driver gives a file only when it is first exported or granted. */
static bool file_on_export(const Broker *b, const Obj *o)
{
        return broker_driver_holds_fd(b) && !o->backing_fd && o->memfd < 0 &&
               (o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_VMM);
}

/* Does an object of @kind live mapped in the daemon? Host and managed memory, but an SVM range's (@outer). */
static bool mapped_here(BrokerKind kind, bool outer)
{
        return (kind == BROKER_KIND_HOST || kind == BROKER_KIND_MANAGED) && !outer;
}

Charge broker_obj_charge(const Obj *o)
{
        return (Charge){.objects = 1,
                        .held_fds = (o->memfd >= 0) + o->backing_fd,
                        .mappings = mapped_here(o->kind, o->outer) ? BROKER_OBJ_MAPPINGS : 0,
                        .kind = o->kind,
                        .gpu_id = o->gpu_id,
                        .bytes = o->size,
                        .foreign = o->foreign};
}

void broker_usage_apply(BrokerUsage *u, const Broker *b, const Charge *ch, int sign)
{
        int64_t d = sign * (int64_t)ch->bytes;
        int gi = broker_gpu_index(b, ch->gpu_id);

        u->objects += (uint64_t)(sign * (int64_t)ch->objects);
        u->held_fds += (uint32_t)(sign * (int32_t)ch->held_fds);
        u->queues += (uint32_t)(sign * (int32_t)ch->queues);
        u->mappings += (uint64_t)(sign * (int64_t)ch->mappings);
        u->shares += (uint32_t)(sign * (int32_t)ch->shares);
        switch (ch->kind) {
        case BROKER_KIND_DEVICE:
                u->device_bytes += (uint64_t)d;
                if (gi >= 0)
                        u->vram_bytes[gi] += (uint64_t)d;
                break;
        case BROKER_KIND_VMM:
                u->vmm_bytes += (uint64_t)d;
                if (gi >= 0)
                        u->vram_bytes[gi] += (uint64_t)d;
                break;
        case BROKER_KIND_HOST:
                u->host_bytes += (uint64_t)d;
                break;
        case BROKER_KIND_MANAGED:
                u->managed_bytes += (uint64_t)d;
                break;
        case BROKER_KIND_IMPORT:
                if (ch->foreign)
                        u->foreign_bytes += (uint64_t)d;
                break;
        default:
                break;
        }
        if (ch->lingering)
                u->lingering_bytes += (uint64_t)d;
}

static int over(Reason *w, const BrokerAccount *a, const char *what, uint64_t limit, uint64_t used,
                uint64_t asked, bool bytes)
{
        char b1[32], b2[32], b3[32];

        if (!bytes)
                return reason_set(w, -EDQUOT, "class '%s' %s limit: %llu in use of %llu", a->name, what,
                                  (unsigned long long)used, (unsigned long long)limit);
        return reason_set(w, -EDQUOT, "class '%s' %s limit: %s in use of %s, %s asked", a->name, what,
                          broker_human(used, b1, sizeof(b1)), broker_human(limit, b2, sizeof(b2)),
                          broker_human(asked, b3, sizeof(b3)));
}

/* One request larger than the class allows for a single one. */
static int over_one(Reason *w, const BrokerAccount *a, const char *what, uint64_t limit, uint64_t asked)
{
        char b1[32], b2[32];

        return reason_set(w, -EDQUOT, "class '%s' %s limit: at most %s, %s asked", a->name, what,
                          broker_human(limit, b1, sizeof(b1)), broker_human(asked, b2, sizeof(b2)));
}

/* Would @ch stay within @a's limits? Under the account's lock. */
static int fits(const Broker *b, const BrokerAccount *a, const Charge *ch, Reason *w)
{
        const BrokerUsage *u = &a->used;
        char what[64];

        if (ch->objects && u->objects + ch->objects > a->max_handles)
                return over(w, a, "handle", a->max_handles, u->objects, ch->objects, false);
        if (ch->held_fds && (uint64_t)u->held_fds + ch->held_fds > a->max_fds)
                return over(w, a, "fd", a->max_fds, u->held_fds, ch->held_fds, false);
        if (ch->queues && (uint64_t)u->queues + ch->queues > a->max_queues)
                return over(w, a, "queue", a->max_queues, u->queues, ch->queues, false);
        if (ch->mappings && u->mappings + ch->mappings > a->max_mappings)
                return over(w, a, "daemon mapping", a->max_mappings, u->mappings, ch->mappings, false);
        if (ch->shares && (uint64_t)u->shares + ch->shares > a->max_shares)
                return over(w, a, "named share", a->max_shares, u->shares, ch->shares, false);
        switch (ch->kind) {
        case BROKER_KIND_DEVICE:
        case BROKER_KIND_VMM: {
                uint64_t vram = u->device_bytes + u->vmm_bytes, bytes = ch->bytes;
                int gi = broker_gpu_index(b, ch->gpu_id);
                /* the more specific limit first, so the reason names it */
                if (gi >= 0 &&
                    (bytes > a->max_vram_gpu[gi] || u->vram_bytes[gi] > a->max_vram_gpu[gi] - bytes)) {
                        snprintf(what, sizeof(what), "VRAM on GPU %u", ch->gpu_id);
                        return over(w, a, what, a->max_vram_gpu[gi], u->vram_bytes[gi], bytes, true);
                }
                if (bytes > a->max_vram || vram > a->max_vram - bytes)
                        return over(w, a, "VRAM", a->max_vram, vram, bytes, true);
                break;
        }
        case BROKER_KIND_HOST:
                if (ch->bytes > a->max_host_one)
                        return over_one(w, a, "single host allocation", a->max_host_one, ch->bytes);
                if (ch->bytes > a->max_host || u->host_bytes > a->max_host - ch->bytes)
                        return over(w, a, "host memory", a->max_host, u->host_bytes, ch->bytes, true);
                break;
        case BROKER_KIND_MANAGED:
                if (ch->bytes > a->max_managed || u->managed_bytes > a->max_managed - ch->bytes)
                        return over(w, a, "managed memory", a->max_managed, u->managed_bytes, ch->bytes,
                                    true);
                break;
        case BROKER_KIND_IMPORT:
                if (!ch->foreign)
                        break;
                if (ch->bytes > a->max_foreign_one)
                        return over_one(w, a, "single foreign import", a->max_foreign_one, ch->bytes);
                if (ch->bytes > a->max_foreign || u->foreign_bytes > a->max_foreign - ch->bytes)
                        return over(w, a, "foreign import", a->max_foreign, u->foreign_bytes, ch->bytes,
                                    true);
                break;
        default:
                break;
        }
        return 0;
}

/* The broker's totals, under its lock. */
void broker_totals_apply(Broker *b, const Charge *ch, int sign)
{
        pthread_mutex_lock(&b->lock);
        broker_usage_apply(&b->totals, b, ch, sign);
        pthread_mutex_unlock(&b->lock);
}

/* Does @ch count against its uid's host memory? Live host memory (GTT included) does. */
static uint64_t uid_host_bytes(const Charge *ch)
{
        return ch->kind == BROKER_KIND_HOST && !ch->lingering ? ch->bytes : 0;
}

/*
 * Would @ch keep the client's uid within its limits (host memory, mappings) and the daemon's mappings
 * within theirs? Under b->lock.
 */
static int daemon_fits(const BrokerClient *c, const Charge *ch, Reason *w)
{
        const Broker *b = c->b;
        uint64_t host = uid_host_bytes(ch);
        char b1[32], b2[32], b3[32];

        if (c->uid && host && (host > b->max_host_uid || c->uid->host_bytes > b->max_host_uid - host))
                return reason_set(w, -EDQUOT, "uid %u host memory limit: %s in use of %s, %s asked",
                                  (unsigned)c->uid->uid, broker_human(c->uid->host_bytes, b1, sizeof(b1)),
                                  broker_human(b->max_host_uid, b2, sizeof(b2)),
                                  broker_human(host, b3, sizeof(b3)));
        if (!ch->mappings)
                return 0;
        if (c->uid && c->uid->mappings + ch->mappings > b->max_mappings_uid)
                return reason_set(w, -EDQUOT, "uid %u daemon mapping limit: %llu in use of %llu",
                                  (unsigned)c->uid->uid, (unsigned long long)c->uid->mappings,
                                  (unsigned long long)b->max_mappings_uid);
        if (b->totals.mappings + ch->mappings > b->max_mappings)
                return reason_set(
                        w, -ENOSPC,
                        "the daemon's mappings for clients are all in use (%llu of %llu): the rest of "
                        "vm.max_map_count is kept for the daemon itself",
                        (unsigned long long)b->totals.mappings, (unsigned long long)b->max_mappings);
        return 0;
}

/* @ch into (@sign 1) or out of (-1) the totals and the client's uid. Under b->lock. */
static void totals_apply_locked(BrokerClient *c, const Charge *ch, int sign)
{
        broker_usage_apply(&c->b->totals, c->b, ch, sign);
        if (c->uid) {
                c->uid->mappings += (uint64_t)(sign * (int64_t)ch->mappings);
                c->uid->host_bytes += (uint64_t)(sign * (int64_t)uid_host_bytes(ch));
        }
}

/* The totals and the uid's counts: checked and charged in one step. */
static int totals_take(BrokerClient *c, const Charge *ch, Reason *w)
{
        Broker *b = c->b;
        int r;

        pthread_mutex_lock(&b->lock);
        r = daemon_fits(c, ch, w);
        if (r == 0)
                totals_apply_locked(c, ch, +1);
        pthread_mutex_unlock(&b->lock);
        return r;
}

void broker_totals_charge(BrokerClient *c, const Charge *ch)
{
        pthread_mutex_lock(&c->b->lock);
        totals_apply_locked(c, ch, +1);
        pthread_mutex_unlock(&c->b->lock);
}

static void totals_give(BrokerClient *c, const Charge *ch)
{
        pthread_mutex_lock(&c->b->lock);
        totals_apply_locked(c, ch, -1);
        pthread_mutex_unlock(&c->b->lock);
}

void broker_set_mapping_limits(Broker *b, uint64_t total, uint64_t per_uid)
{
        pthread_mutex_lock(&b->lock);
        b->max_mappings = total;
        b->max_mappings_uid = per_uid;
        pthread_mutex_unlock(&b->lock);
}

void broker_set_host_per_uid(Broker *b, uint64_t bytes)
{
        pthread_mutex_lock(&b->lock);
        b->max_host_uid = bytes;
        pthread_mutex_unlock(&b->lock);
}

void broker_set_listeners_per_uid(Broker *b, unsigned n)
{
        pthread_mutex_lock(&b->lock);
        b->max_listeners_uid = n;
        pthread_mutex_unlock(&b->lock);
}

void broker_mapping_limits(Broker *b, uint64_t *ret_total, uint64_t *ret_per_uid)
{
        pthread_mutex_lock(&b->lock);
        *ret_total = b->max_mappings;
        *ret_per_uid = b->max_mappings_uid;
        pthread_mutex_unlock(&b->lock);
}

int broker_client_set_uid(BrokerClient *c, uid_t uid)
{
        Broker *b = c->b;
        BrokerUid *u;
        int r = 0;

        if (c->uid)
                return c->uid->uid == uid ? 0 : -EBUSY;
        pthread_mutex_lock(&b->lock);
        for (u = b->uids; u && u->uid != uid; u = u->next)
                ;
        if (!u && (u = calloc(1, sizeof(*u)))) {
                u->uid = uid;
                u->next = b->uids;
                b->uids = u;
        }
        if (u) {
                u->clients++;
                c->uid = u;
        } else {
                r = -ENOMEM;
        }
        pthread_mutex_unlock(&b->lock);
        return r;
}

/* The client leaves its uid's count (empty by now: its objects are gone); the last one frees it. */
void broker_client_drop_uid(BrokerClient *c)
{
        Broker *b = c->b;

        if (!c->uid)
                return;
        pthread_mutex_lock(&b->lock);
        /* its context's thread goes with its context, a moment later (the driver's own bound holds) */
        if (c->listener_charged)
                c->uid->listeners--;
        c->listener_charged = false;
        if (--c->uid->clients == 0)
                for (BrokerUid **pp = &b->uids; *pp; pp = &(*pp)->next)
                        if (*pp == c->uid) {
                                *pp = c->uid->next;
                                free(c->uid);
                                break;
                        }
        pthread_mutex_unlock(&b->lock);
        c->uid = NULL;
}

/*
 * Charge @ch to the client, its class and the totals if the class's limits allow it: checking and charging
 * are one step under the account's lock, so clients of one class on several threads cannot together pass
 * a limit that each of them checked alone.
 */
int broker_charge_take(BrokerClient *c, const Charge *ch, Reason *w)
{
        BrokerAccount *a = c->acct;
        int r;

        if (a) {
                pthread_mutex_lock(&a->lock);
                r = fits(c->b, a, ch, w);
                if (r == 0)
                        broker_usage_apply(&a->used, c->b, ch, +1);
                pthread_mutex_unlock(&a->lock);
                if (r < 0)
                        return r;
        }
        r = totals_take(c, ch, w);
        if (r < 0) {
                if (a) {
                        pthread_mutex_lock(&a->lock);
                        broker_usage_apply(&a->used, c->b, ch, -1);
                        pthread_mutex_unlock(&a->lock);
                }
                return r;
        }
        broker_usage_apply(&c->usage, c->b, ch, +1);
        return 0;
}

void broker_charge_give(BrokerClient *c, const Charge *ch)
{
        BrokerAccount *a = c->acct;

        if (a) {
                pthread_mutex_lock(&a->lock);
                broker_usage_apply(&a->used, c->b, ch, -1);
                pthread_mutex_unlock(&a->lock);
        }
        broker_usage_apply(&c->usage, c->b, ch, -1);
        totals_give(c, ch);
}

void broker_charge_obj_give(BrokerClient *c, const Obj *o)
{
        Charge ch = broker_obj_charge(o);
        broker_charge_give(c, &ch);
}

/*
 * Would one more object of @kind with @bytes (on @gpu_id for VRAM) stay within the class's limits? A check
 * before the driver is asked, so that work it cannot keep is not done; broker_charge_take() decides.
 */
int broker_quota_check(const BrokerClient *c, BrokerKind kind, uint32_t gpu_id, uint64_t bytes, bool holds_fd,
                       Reason *w)
{
        Charge ch = {.objects = 1,
                     .held_fds = holds_fd,
                     .mappings = mapped_here(kind, false) ? BROKER_OBJ_MAPPINGS : 0,
                     .kind = kind,
                     .gpu_id = gpu_id,
                     .bytes = bytes,
                     .foreign = kind == BROKER_KIND_IMPORT};
        BrokerAccount *a = c->acct;
        int r = 0;

        if (a) {
                pthread_mutex_lock(&a->lock);
                r = fits(c->b, a, &ch, w);
                pthread_mutex_unlock(&a->lock);
        }
        if (r == 0 && (ch.mappings || uid_host_bytes(&ch))) {
                pthread_mutex_lock(&c->b->lock);
                r = daemon_fits(c, &ch, w);
                pthread_mutex_unlock(&c->b->lock);
        }
        return r;
}

/*
 * Before @o's memory is exported or granted: the file the driver makes for it then is one more fd of the
 * class's, taken now. 1: taken, 0: none needed, or the refusal.
 */
int broker_export_fd_take(BrokerClient *c, const Obj *o, Reason *w)
{
        int r;

        if (!file_on_export(c->b, o))
                return 0;
        r = broker_charge_take(c, &(Charge){.held_fds = 1}, w);
        return r < 0 ? r : 1;
}

/* After: when the driver made its file (@made), the object pays for it until it dies (its charge refunds
 * it then); when it did not, the fd taken goes back now. */
void broker_export_fd_end(BrokerClient *c, Obj *o, int taken, bool made)
{
        if (taken <= 0)
                return;
        if (made)
                o->backing_fd = true;
        else
                broker_charge_give(c, &(Charge){.held_fds = 1});
}

/* Add (@sign 1) or remove (-1) one usage record to another. */
static void usage_move(BrokerUsage *dst, const BrokerUsage *src, int sign)
{
        dst->device_bytes += (uint64_t)(sign * (int64_t)src->device_bytes);
        dst->host_bytes += (uint64_t)(sign * (int64_t)src->host_bytes);
        dst->managed_bytes += (uint64_t)(sign * (int64_t)src->managed_bytes);
        dst->vmm_bytes += (uint64_t)(sign * (int64_t)src->vmm_bytes);
        dst->foreign_bytes += (uint64_t)(sign * (int64_t)src->foreign_bytes);
        dst->objects += (uint64_t)(sign * (int64_t)src->objects);
        dst->held_fds += (uint32_t)(sign * (int32_t)src->held_fds);
        dst->queues += (uint32_t)(sign * (int32_t)src->queues);
        dst->mappings += (uint64_t)(sign * (int64_t)src->mappings);
        dst->shares += (uint32_t)(sign * (int32_t)src->shares);
        for (size_t i = 0; i < BROKER_MAX_GPUS; i++)
                dst->vram_bytes[i] += (uint64_t)(sign * (int64_t)src->vram_bytes[i]);
}

void broker_client_set_account(BrokerClient *c, BrokerAccount *a)
{
        if (c->acct == a)
                return;
        if (c->acct) {
                pthread_mutex_lock(&c->acct->lock);
                usage_move(&c->acct->used, &c->usage, -1);
                c->acct->clients--;
                pthread_mutex_unlock(&c->acct->lock);
        }
        c->acct = a;
        if (a) {
                pthread_mutex_lock(&a->lock);
                a->clients++;
                a->used.n_gpus = (uint32_t)c->b->n_gpus;
                memcpy(a->used.gpu_ids, c->b->gpu_ids, sizeof(c->b->gpu_ids));
                usage_move(&a->used, &c->usage, +1);
                pthread_mutex_unlock(&a->lock);
        }
}

/* The broker GPUs (a bit per index) the client's class may use. */
static uint64_t allowed_gpus(const BrokerClient *c)
{
        /* one word, stored whole: no lock for it (every GPU check of every client of the class reads it) */
        return c->acct ? __atomic_load_n(&c->acct->allowed_gpus, __ATOMIC_RELAXED) : UINT64_MAX;
}

/* May this client's class use @gpu_id? */
int broker_gpu_allowed(const BrokerClient *c, uint32_t gpu_id, Reason *w)
{
        int gi = broker_gpu_index(c->b, gpu_id);

        if (gi < 0)
                return reason_set(w, -ENODEV, "no GPU with id %u", gpu_id);
        if (!(allowed_gpus(c) & (1ull << gi)))
                return reason_set(w, -EACCES, "class '%s' may not use GPU %u", c->acct->name, gpu_id);
        return 0;
}

/* Are @ids GPUs, none named twice, that this client's class may use? */
int broker_gpus_allowed(const BrokerClient *c, const uint32_t *ids, size_t n, Reason *w)
{
        int r = broker_check_gpus(c->b, ids, n, w);

        for (size_t i = 0; r >= 0 && i < n; i++)
                r = broker_gpu_allowed(c, ids[i], w);
        return r;
}

/* The GPUs this client's class may use, in the broker's order, into @ids (room for BROKER_MAX_GPUS): how
 * many. */
size_t broker_allowed_gpu_ids(const BrokerClient *c, uint32_t *ids)
{
        uint64_t allowed = allowed_gpus(c);
        size_t n = 0;

        for (size_t i = 0; i < c->b->n_gpus; i++)
                if (allowed & (1ull << i))
                        ids[n++] = c->b->gpu_ids[i];
        return n;
}
