/* Named shares: memory published under a name, opened by other clients at one VA of a shared region. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker-private.h"

const Charge broker_share_charge = {.objects = 1, .held_fds = 1, .shares = 1};

void broker_client_set_tag(BrokerClient *c, uint64_t tag)
{
        c->tag = tag;
}

int broker_share_region(Broker *b, uint64_t base, uint64_t size)
{
        ThunkVaSpace *space = NULL;
        int r = thunk_va_space_new(base, size, BROKER_GRANULARITY_RECOMM, &space);

        if (r < 0)
                return r;
        pthread_mutex_lock(&b->share_lock);
        thunk_va_space_free(b->share_space);
        b->share_space = space;
        pthread_mutex_unlock(&b->share_lock);
        return 0;
}

void broker_share_region_get(const Broker *b, uint64_t *ret_base, uint64_t *ret_size)
{
        *ret_base = b->share_space ? thunk_va_space_base(b->share_space) : 0;
        *ret_size = b->share_space ? thunk_va_space_limit(b->share_space) - *ret_base : 0;
}

/* What every share call needs: the region, a GPU VM per client and VA grants, and a name that can be one. */
static int share_check(const Broker *b, const char *name, Reason *w)
{
        size_t n = name ? strnlen(name, BROKER_SHARE_NAME_MAX + 1) : 0;

        if (!b->share_space)
                return reason_set(w, -EOPNOTSUPP, "this daemon has no shared region for named shares");
        /* a reader would get a place in the shared region but nothing it can map there: its own GPU context
         * takes no address from the daemon (docs/nvidia.md) */
        if (driver_has(b->drv, DRIVER_CAP_CLIENT_MAPS))
                return reason_set(
                        w, -EOPNOTSUPP,
                        "named shares are not served on the %s backend: hand the memory over with an "
                        "export (gm_mem_export, gm_mem_import)",
                        driver_name(b->drv));
        /* every reader maps a share at the same VA in a GPU VM of its own */
        if (!driver_has(b->drv, DRIVER_CAP_PRIVATE_VM | DRIVER_CAP_VA_GRANTS))
                return reason_set(w, -EOPNOTSUPP,
                                  "named shares need a GPU VM per client and VA grants (KFD: ABI 1.19)");
        if (n == 0 || n > BROKER_SHARE_NAME_MAX)
                return reason_set(w, -EINVAL, "a share's name has 1 to %d characters", BROKER_SHARE_NAME_MAX);
        return 0;
}

bool broker_share_name_ok(const char *name)
{
        size_t n = name ? strnlen(name, BROKER_SHARE_NAME_MAX + 1) : 0;
        return n > 0 && n <= BROKER_SHARE_NAME_MAX;
}

/* A live share by name; under the share lock. */
Share *broker_share_by_name(Broker *b, const char *name)
{
        for (Share *s = b->shares; s; s = s->next)
                if (strcmp(s->name, name) == 0)
                        return s;
        return NULL;
}

/* Is @st the file of memory a persistent share took over when its object went? Under the share lock. */
bool broker_share_holds_file(Broker *b, const struct stat *st)
{
        struct stat hs;

        for (const Share *s = b->shares; s; s = s->next)
                if (s->holds && fstat(s->fd, &hs) == 0 && hs.st_ino == st->st_ino && hs.st_dev == st->st_dev)
                        return true;
        return false;
}

static void share_info(const Share *s, BrokerShareInfo *ret)
{
        memset(ret, 0, sizeof(*ret));
        memcpy(ret->name, s->name, sizeof(ret->name));
        /* while the publisher holds it, its class pays (a reload may have moved it) */
        if (s->owner && s->owner->acct)
                snprintf(ret->class_name, sizeof(ret->class_name), "%s", s->owner->acct->name);
        else
                memcpy(ret->class_name, s->class_name, sizeof(ret->class_name));
        ret->owner_tag = s->owner ? s->owner_tag : 0;
        ret->kind = s->kind;
        ret->gpu_id = s->gpu_id;
        ret->size = s->size;
        ret->va = s->va;
        ret->read_only = s->read_only;
        ret->persistent = s->persistent;
        ret->readers = s->readers;
        ret->published_usec = s->published_usec;
        ret->opens = s->opens;
}

/* The share's own charges, to its account and the totals alone (no client has them). */
void broker_share_held_apply(Broker *b, Share *s, int sign)
{
        broker_totals_apply(b, &broker_share_charge, sign);
        broker_totals_apply(b, &s->held_mem, sign);
        if (s->acct) {
                pthread_mutex_lock(&s->acct->lock);
                broker_usage_apply(&s->acct->used, b, &broker_share_charge, sign);
                broker_usage_apply(&s->acct->used, b, &s->held_mem, sign);
                s->acct->lingering += (unsigned)sign;
                pthread_mutex_unlock(&s->acct->lock);
        }
}

/* Take the reader's GPU access and its import away. What the driver refuses to drop goes with the reader's
 * GPU VM when it ends. Under the share lock. */
static void ref_unmap(Broker *b, ShareRef *ref)
{
        for (size_t i = 0; i < ref->n_grants; i++)
                (void)driver_revoke(b->drv, ref->grants[i]);
        ref->n_grants = 0;
        if (ref->mem)
                (void)driver_mem_free(b->drv, ref->mem);
        ref->mem = NULL;
}

static void share_free(Broker *b, Share *s)
{
        if (s->carry_mem)
                (void)driver_mem_free(b->drv, s->carry_mem);
        if (b->share_space)
                (void)thunk_va_free(b->share_space, s->va);
        safe_close(s->fd);
        free(s);
}

/* At the broker's end: shares left are persistent ones whose publishers went, and no reader is left. */
void broker_shares_done(Broker *b)
{
        while (b->shares) {
                Share *s = b->shares;
                b->shares = s->next;
                share_free(b, s);
        }
        thunk_va_space_free(b->share_space);
        pthread_mutex_destroy(&b->share_lock);
}

/*
 * End @s: out of the names, every reader's GPU access and import gone, its charges back. The publisher's
 * books are the caller's (serialised) while its object lives. The memory stays charged as long as files
 * handed out hold it (a reader's CPU mapping): its object's linger does that while the object lives, the
 * share's own after it. The share itself goes once no reader names it. Under the share lock.
 */
void broker_share_end(Broker *b, Share *s, BrokerDrop **drops)
{
        for (Share **p = &b->shares; *p; p = &(*p)->next)
                if (*p == s) {
                        *p = s->next;
                        b->n_shares--;
                        break;
                }
        s->revoked = true;
        for (ShareRef *ref = s->refs; ref; ref = ref->next)
                ref_unmap(b, ref);
        s->readers = 0;
        if (s->src) {
                s->src->share = NULL;
                broker_charge_give(s->owner, &broker_share_charge);
        } else if (s->holds) {
                broker_linger_watch(b, s->acct, s->held_mem.kind, s->held_mem.gpu_id, s->held_mem.bytes,
                                    s->fd);
                broker_share_held_apply(b, s, -1);
                s->holds = false;
        }
        s->src = NULL;
        s->owner = NULL;
        /* a persistent share's file may be the last of its memory: released off the loop */
        broker_drop_file(b, TAKE_FD(s->fd), s->size, BROKER_FLOW_SHARED, drops);
        if (s->carry_mem)
                (void)driver_mem_free(b->drv, s->carry_mem);
        s->carry_mem = NULL;
        if (!s->refs)
                share_free(b, s);
}

/*
 * The publisher's object @o goes (freed or torn down). A share that lives only as long as its object ends;
 * a persistent one keeps the memory and takes over what the client paid for it, so the class goes on
 * paying the same. Once the driver freed the object's memory: a free it refuses leaves the share as it was.
 */
void broker_share_obj_gone(BrokerClient *c, Obj *o)
{
        Broker *b = c->b;
        Share *s = o->share;

        if (!s)
                return;
        pthread_mutex_lock(&b->share_lock);
        if (!s->persistent) {
                broker_share_end(b, s, NULL);
        } else {
                s->held_mem = (Charge){.kind = o->kind, .gpu_id = o->gpu_id, .bytes = o->size};
                /* the class that pays now: a reload may have moved the client (and its charges) since */
                s->acct = c->acct;
                snprintf(s->class_name, sizeof(s->class_name), "%s", c->acct ? c->acct->name : "");
                /* out of the client's usage; its object's refund then takes the memory off the account,
                 * which the share puts back */
                broker_usage_apply(&c->usage, b, &broker_share_charge, -1);
                broker_totals_apply(b, &broker_share_charge, -1);
                if (c->acct) {
                        pthread_mutex_lock(&c->acct->lock);
                        broker_usage_apply(&c->acct->used, b, &broker_share_charge, -1);
                        pthread_mutex_unlock(&c->acct->lock);
                }
                broker_share_held_apply(b, s, +1);
                s->holds = true;
                s->src = NULL;
                s->owner = NULL;
                o->share = NULL;
                o->share_kept = true;
        }
        pthread_mutex_unlock(&b->share_lock);
}

int broker_share_publish(BrokerClient *c, uint64_t handle, const char *name, bool read_only, bool persistent,
                         BrokerShareInfo *ret, Reason *w)
{
        Broker *b = c->b;
        Obj *o = broker_obj_lookup(c, handle);
        struct timespec ts;
        Share *s = NULL;
        int fd = -1, r;

        r = share_check(b, name, w);
        if (r < 0)
                return r;
        if (!o || o->pending)
                return reason_set(w, -ENOENT, "no handle 0x%llx", (unsigned long long)handle);
        if (o->kind != BROKER_KIND_DEVICE && o->kind != BROKER_KIND_HOST && o->kind != BROKER_KIND_VMM)
                return reason_set(w, -EINVAL, "only device, host and VMM memory is published by name");
        if (o->flags & BROKER_FLAG_SVM_RANGE)
                return reason_set(w, -EINVAL, "the memory behind an SVM range is not published");
        if (o->share)
                return reason_set(w, -EBUSY, "0x%llx is published already, as '%s'",
                                  (unsigned long long)handle, o->share->name);
        r = broker_charge_take(c, &broker_share_charge, w);
        if (r < 0)
                return r;
        r = broker_obj_file(c, o, &fd, w);
        /* memory sealed read-only before is published read-only only */
        if (r >= 0 && !read_only && !broker_obj_read_only(o))
                r = broker_check_writable(fd, w);
        s = r < 0 ? NULL : calloc(1, sizeof(*s));
        if (r >= 0 && !s)
                r = reason_set(w, -ENOMEM, "out of memory");
        if (r < 0)
                goto fail;
        clock_gettime(CLOCK_REALTIME, &ts);
        *s = (Share){.kind = o->kind,
                     .gpu_id = o->gpu_id,
                     .size = o->size,
                     .fd = fd,
                     .read_only = read_only || broker_obj_read_only(o),
                     .persistent = persistent,
                     .src = o,
                     .owner = c,
                     .owner_tag = c->tag,
                     .acct = c->acct,
                     .published_usec = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u};
        memcpy(s->name, name, strlen(name) + 1);
        if (c->acct)
                snprintf(s->class_name, sizeof(s->class_name), "%s", c->acct->name);

        pthread_mutex_lock(&b->share_lock);
        if (broker_share_by_name(b, name))
                r = reason_set(w, -EEXIST, "a share named '%s' exists already", name);
        else if (b->n_shares >= BROKER_MAX_SHARES)
                r = reason_set(w, -ENOSPC, "the daemon holds %d shares, its most", BROKER_MAX_SHARES);
        else if ((r = thunk_va_alloc(b->share_space, o->size, BROKER_GRANULARITY_RECOMM, s, &s->va)) < 0)
                r = reason_set(w, r == -ENOMEM ? -ENOSPC : r, "the shared region has no room for %llu bytes",
                               (unsigned long long)o->size);
        /* published read-only: sealed once nothing else can refuse the publish (a seal cannot be undone),
         * and before any reader can open it */
        else if (s->read_only && (r = broker_seal_read_only(b, fd, w)) < 0)
                (void)thunk_va_free(b->share_space, s->va);
        if (r >= 0) {
                s->next = b->shares;
                b->shares = s;
                b->n_shares++;
                share_info(s, ret);
        }
        pthread_mutex_unlock(&b->share_lock);
        if (r < 0)
                goto fail;
        broker_note_file(b, o, fd);
        o->exports++;
        o->share = s;
        return 0;

fail:
        free(s);
        safe_close(fd);
        broker_charge_give(c, &broker_share_charge);
        return r;
}

/* The GPUs a reader maps a share on: those asked for, or every one its class allows. */
static int reader_gpus(BrokerClient *c, const uint32_t *ids, size_t n, uint32_t *out, size_t *ret_n,
                       Reason *w)
{
        size_t k;
        int r;

        if (n > 0) {
                r = broker_gpus_allowed(c, ids, n, w);
                if (r < 0)
                        return r;
                memcpy(out, ids, n * sizeof(*ids));
                *ret_n = n;
                return 0;
        }
        k = broker_allowed_gpu_ids(c, out);
        if (k == 0)
                return reason_set(w, -EACCES, "this client may use no GPU");
        *ret_n = k;
        return 0;
}

/* What a reader of shares needs: its own GPU VM, and the VA space outside its window where shares lie. */
int broker_share_reader_vm(BrokerClient *c, DriverCtx **ret_ctx, Reason *w)
{
        int r = broker_client_ctx(c, ret_ctx, w);

        return r < 0 ? r : broker_client_outer(c, w);
}

/* A reader's object @o of share @s: where it lies, in its role. */
void broker_share_obj_fill(Obj *o, const Share *s, ShareRef *ref)
{
        o->va = s->va;
        o->size = s->size;
        o->gpu_id = s->gpu_id;
        o->outer = true;
        o->read_only = ref->read_only;
        o->flags = ref->read_only ? BROKER_FLAG_READ_ONLY : 0;
        o->ref = ref;
        o->client_refs = 1;
}

/* @ref becomes one of @s's readers, @c's. Under the share lock. */
void broker_share_ref_link(Share *s, ShareRef *ref, BrokerClient *c)
{
        ref->share = s;
        ref->reader = c;
        ref->next = s->refs;
        s->refs = ref;
        s->readers++;
}

/*
 * A reader's import of share @s and its grants on @gpus, in its role (@ref->read_only); the file it was
 * imported from in *@ret_fd (the caller's; a read-only reader's is opened read-only, so its import and CPU
 * mapping keep to it). On failure what was made stays in @ref for broker_share_ref_undo(). Under the share
 * lock.
 */
int broker_share_ref_map(Broker *b, DriverCtx *ctx, const Share *s, ShareRef *ref, const uint32_t *gpus,
                         size_t n_gpus, int *ret_fd, Reason *w)
{
        int fd, r;

        fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return reason_set(w, -errno, "cannot duplicate the share's fd: %s", strerror(errno));
        if (ref->read_only && (r = broker_hand_out_read_only(b, &fd, w)) < 0)
                return r;
        r = driver_mem_import(b->drv, ctx, fd, n_gpus ? gpus[0] : b->gpu_ids[0], &ref->mem);
        if (r < 0) {
                safe_close(fd);
                return reason_set(w, r, "the driver refused to import share '%s': %s", s->name, strerror(-r));
        }
        for (size_t i = 0; i < n_gpus; i++) {
                r = driver_grant(b->drv, ctx, ref->mem, gpus[i], s->va, 0, s->size,
                                 ref->read_only ? DRIVER_ACCESS_READ : DRIVER_ACCESS_READ_WRITE, false,
                                 &ref->grants[ref->n_grants]);
                if (r < 0) {
                        safe_close(fd);
                        return reason_set(w, r, "the driver refused GPU %u access to share '%s': %s", gpus[i],
                                          s->name, strerror(-r));
                }
                ref->grant_gpus[ref->n_grants++] = gpus[i];
        }
        *ret_fd = fd;
        return 0;
}

/* A reader's part of @s that failed half-way, given up: @ref's import and grants, its place at the share's
 * VA in the reader's GPU VM (@placed), the file @fd, and @ref. Under the share lock. */
void broker_share_ref_undo(BrokerClient *c, const Share *s, ShareRef *ref, bool placed, int fd)
{
        ref_unmap(c->b, ref);
        if (placed)
                (void)thunk_va_free(c->outer, s->va);
        safe_close(fd);
        free(ref);
}

int broker_share_open(BrokerClient *c, const char *name, bool write, const uint32_t *gpu_ids, size_t n,
                      uint64_t *ret_handle, BrokerShareInfo *ret_info, int *ret_fd, Reason *w)
{
        Broker *b = c->b;
        uint32_t gpus[BROKER_MAX_GPUS];
        size_t n_gpus = 0;
        const Charge ch = {.objects = 1};
        DriverCtx *ctx;
        ShareRef *ref = NULL;
        bool placed = false;
        Obj *o = NULL;
        Share *s;
        int fd = -1, r;

        r = share_check(b, name, w);
        if (r < 0)
                return r;
        if (n > BROKER_MAX_GPUS)
                return reason_set(w, -E2BIG, "more than %d GPUs", BROKER_MAX_GPUS);
        r = reader_gpus(c, gpu_ids, n, gpus, &n_gpus, w);
        if (r < 0)
                return r;
        r = broker_share_reader_vm(c, &ctx, w);
        if (r < 0)
                return r;
        r = broker_charge_take(c, &ch, w);
        if (r < 0)
                return r;
        o = broker_obj_new(BROKER_KIND_SHARE);
        ref = calloc(1, sizeof(*ref));
        if (!o || !ref) {
                free(o);
                free(ref);
                broker_charge_give(c, &ch);
                return reason_set(w, -ENOMEM, "out of memory");
        }

        pthread_mutex_lock(&b->share_lock);
        s = broker_share_by_name(b, name);
        if (!s) {
                r = reason_set(w, -ENOENT, "no share named '%s'", name);
                goto fail;
        }
        for (const ShareRef *x = s->refs; x; x = x->next)
                if (x->reader == c) {
                        r = reason_set(w, -EBUSY, "this client has '%s' open already", name);
                        goto fail;
                }
        if (write && s->read_only) {
                r = reason_set(w, -EACCES, "share '%s' is read-only", name);
                goto fail;
        }
        if (write && broker_file_sealed(s->fd)) {
                r = reason_set(
                        w, -EPERM,
                        "share '%s' was opened read-only before: no new writable mapping of its memory "
                        "can be made, by anyone (open it read-only)",
                        name);
                goto fail;
        }
        ref->read_only = !write || s->read_only;
        r = thunk_va_alloc_fixed(c->outer, s->va, s->size, o);
        if (r == -EADDRINUSE) {
                reason_set(w, r, "this client has an SVM range where share '%s' lives (0x%llx+0x%llx)", name,
                           (unsigned long long)s->va, (unsigned long long)s->size);
                goto fail;
        }
        if (r < 0) {
                r = reason_set(w, -ENOMEM, "cannot place share '%s' in this client's GPU VM: %s", name,
                               strerror(-r));
                goto fail;
        }
        placed = true;
        r = broker_share_ref_map(b, ctx, s, ref, gpus, n_gpus, &fd, w);
        if (r < 0)
                goto fail;
        broker_share_obj_fill(o, s, ref);
        r = broker_obj_publish(c, o);
        if (r < 0) {
                reason_set(w, r, "out of memory");
                goto fail;
        }
        broker_share_ref_link(s, ref, c);
        s->opens++;
        share_info(s, ret_info);
        pthread_mutex_unlock(&b->share_lock);
        *ret_handle = o->handle;
        *ret_fd = fd;
        return 0;

fail:
        broker_share_ref_undo(c, s, ref, placed, fd);
        pthread_mutex_unlock(&b->share_lock);
        free(o);
        broker_charge_give(c, &ch);
        return r;
}

/* The reader frees its handle of a share, or goes. */
void broker_share_ref_drop(BrokerClient *c, Obj *o)
{
        Broker *b = c->b;
        ShareRef *ref = o->ref;
        Share *s = ref->share;

        pthread_mutex_lock(&b->share_lock);
        if (ref->mem)
                s->readers--;
        ref_unmap(b, ref);
        for (ShareRef **p = &s->refs; *p; p = &(*p)->next)
                if (*p == ref) {
                        *p = ref->next;
                        break;
                }
        if (s->revoked && !s->refs)
                share_free(b, s);
        pthread_mutex_unlock(&b->share_lock);
        free(ref);
        o->ref = NULL;
        (void)thunk_va_free(c->outer, o->va);
        broker_charge_obj_give(c, o);
}

/* The reader's open share at @va (outside its window), or NULL. */
Obj *broker_share_at(const BrokerClient *c, uint64_t va)
{
        ThunkVaObject vo;
        Obj *o = c->outer && thunk_va_lookup(c->outer, va, &vo) == 0 ? vo.data : NULL;
        return o && o->kind == BROKER_KIND_SHARE ? o : NULL;
}

/* A reader's share: where it is mapped, read-only or not; -ESTALE once revoked. */
int broker_share_pointer_info(BrokerClient *c, const Obj *o, BrokerPtrInfo *ret, Reason *w)
{
        const ShareRef *ref = o->ref;
        int r = 0;

        memset(ret, 0, sizeof(*ret));
        pthread_mutex_lock(&c->b->share_lock);
        if (!ref->mem) {
                r = reason_set(w, -ESTALE, "share '%s' was revoked: free its handle", ref->share->name);
        } else {
                ret->handle = o->handle;
                ret->kind = BROKER_KIND_SHARE;
                ret->gpu_id = o->gpu_id;
                ret->base = o->va;
                ret->size = o->size;
                ret->flags = o->flags;
                ret->cpu_accessible = true;
                for (size_t i = 0; i < ref->n_grants; i++)
                        ret->mapped[ret->n_mapped++] = ref->grant_gpus[i];
        }
        pthread_mutex_unlock(&c->b->share_lock);
        return r;
}

/* Access to an open share is its reader's role, given when it was opened: read-write is refused to a
 * read-only reader, and nothing else can be changed. */
int broker_share_set_access(BrokerClient *c, const Obj *o, const BrokerAccess *d, size_t n, Reason *w)
{
        int r = broker_share_pointer_info(c, o, &(BrokerPtrInfo){0}, w);

        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                if (d[i].access == BROKER_ACCESS_READ_WRITE && o->read_only)
                        return reason_set(w, -EACCES, "share '%s' is open read-only here",
                                          o->ref->share->name);
        return reason_set(w, -EINVAL, "a share's access is its reader's role, set when it was opened");
}

int broker_share_get_access(BrokerClient *c, const Obj *o, uint32_t gpu_id, int *ret_access, Reason *w)
{
        const ShareRef *ref = o->ref;
        int r = 0;

        pthread_mutex_lock(&c->b->share_lock);
        *ret_access = BROKER_ACCESS_NONE;
        if (!ref->mem)
                r = reason_set(w, -ESTALE, "share '%s' was revoked: free its handle", ref->share->name);
        for (size_t i = 0; r == 0 && i <= ref->n_grants; i++)
                /* the CPU (0) has the role too: the reader maps the share's file */
                if (i == ref->n_grants ? gpu_id == 0 : ref->grant_gpus[i] == gpu_id)
                        *ret_access = ref->read_only ? BROKER_ACCESS_READ : BROKER_ACCESS_READ_WRITE;
        pthread_mutex_unlock(&c->b->share_lock);
        return r;
}

int broker_share_find(Broker *b, const char *name, BrokerShareInfo *ret)
{
        Share *s;

        if (!broker_share_name_ok(name))
                return -ENOENT;
        pthread_mutex_lock(&b->share_lock);
        s = broker_share_by_name(b, name);
        if (s)
                share_info(s, ret);
        pthread_mutex_unlock(&b->share_lock);
        return s ? 0 : -ENOENT;
}

int broker_share_revoke(Broker *b, const char *name, BrokerDrop **ret_drops, Reason *w)
{
        if (ret_drops)
                *ret_drops = NULL;
        Share *s;
        int r = 0;

        if (!broker_share_name_ok(name))
                return reason_set(w, -ENOENT, "no share named '%.*s'", BROKER_SHARE_NAME_MAX,
                                  name ? name : "");
        pthread_mutex_lock(&b->share_lock);
        s = broker_share_by_name(b, name);
        if (!s)
                r = reason_set(w, -ENOENT, "no share named '%s'", name);
        else
                broker_share_end(b, s, ret_drops);
        pthread_mutex_unlock(&b->share_lock);
        broker_process_events(b);
        return r;
}

size_t broker_share_list(Broker *b, size_t *cursor, BrokerShareInfo *out, size_t cap)
{
        size_t i = 0, n = 0;

        pthread_mutex_lock(&b->share_lock);
        for (const Share *s = b->shares; s && n < cap; s = s->next, i++)
                if (i >= *cursor)
                        share_info(s, &out[n++]);
        *cursor = n == cap && i < b->n_shares ? i : 0;
        pthread_mutex_unlock(&b->share_lock);
        return n;
}
