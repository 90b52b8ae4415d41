/* Carried across a restart: a client's objects and the named shares, handed over and set up again. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "broker-private.h"

/* Can the driver hand VRAM to the next daemon (export it here, take the dmabuf back there)? */
static bool driver_carries_vram(const Broker *b)
{
        return driver_has(b->drv, DRIVER_CAP_EXPORT) && b->drv->ops->mem_adopt_vram;
}

static const char *obj_not_carriable(const Broker *b, const Obj *o);

/* A reservation can be carried when the memory each of its mappings maps can. */
static const char *reservation_not_carriable(const Broker *b, const Obj *res)
{
        ThunkVaObject vo;

        for (uint64_t at = res->va; thunk_va_next(res->maps, at, &vo) == 0; at = vo.start + vo.size) {
                const VmmMap *m = vo.data;
                const char *why = obj_not_carriable(b, m->phys);
                if (why)
                        return why;
        }
        return NULL;
}

/* Why @o cannot be carried to the next daemon yet, or NULL. */
static const char *obj_not_carriable(const Broker *b, const Obj *o)
{
        if (o->pending)
                return "an allocation is still being made";
        if (o->ref && !o->ref->mem)
                return "the handle of a revoked share";
        switch (o->kind) {
        case BROKER_KIND_HOST:
                /* GTT host memory's file is its dmabuf, which the next daemon's driver takes back */
                if ((o->flags & BROKER_FLAG_GTT) && !b->drv->ops->mem_adopt_gtt)
                        return "GTT host memory (the driver cannot take it back)";
                return o->memfd >= 0 && o->mem ? NULL : "host memory without its file";
        case BROKER_KIND_DEVICE:
                if (!driver_carries_vram(b))
                        return "device memory (the driver cannot export it)";
                return o->mem && !o->outer ? NULL : "device memory outside the window";
        case BROKER_KIND_MANAGED:
                if (o->memfd < 0)
                        return "managed memory without its file";
                /* none made yet is fine; a log that could not be kept is not */
                return o->svm_unlogged || (o->svm_log && o->svm_log->overflowed)
                               ? "managed memory with more SVM attribute calls than are kept to replay"
                               : NULL;
        case BROKER_KIND_VMM:
                if (!driver_carries_vram(b))
                        return "VMM memory (the driver cannot export it)";
                return o->mem ? NULL : "VMM memory without its buffer";
        case BROKER_KIND_RESERVATION:
                return reservation_not_carriable(b, o);
        case BROKER_KIND_SHARE:
                return o->ref ? NULL : "a share without its reader's part";
        case BROKER_KIND_IMPORT:
                /* its file for the next daemon is the dmabuf exported again (KFD hands back the one imported)
                 */
                if (!driver_has(b->drv, DRIVER_CAP_EXPORT))
                        return "imported dmabufs (the driver cannot export them again)";
                return o->mem ? NULL : "an import without its buffer";
        default:
                return "objects of its kind";
        }
}

int broker_client_carry_check(const BrokerClient *c, Reason *w)
{
        size_t it = 0;
        Obj *o;

        if (client_events_count(c->events))
                return reason_set(w, -EOPNOTSUPP, "KFD events live in the daemon's KFD context");
        if (c->n_queues)
                return reason_set(w, -EOPNOTSUPP, "user-mode queues live in the daemon's KFD context");
        while (hashmap_next(&c->objs, &it, NULL, (void **)&o)) {
                const char *why = obj_not_carriable(c->b, o);
                if (why)
                        return reason_set(w, -EOPNOTSUPP, "%s cannot be carried yet", why);
        }
        return 0;
}

static void carry_record(const BrokerClient *c, const Obj *o, BrokerCarry *k)
{
        /* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
        // clang-format off
        *k = (BrokerCarry){
                .handle = o->handle, .kind = o->kind, .va = o->va, .size = o->size, .gpu_id = o->gpu_id,
                .flags = o->flags, .numa_node = o->numa_node, .exports = o->exports, .handed_out = o->handed_out,
                .has_file = o->kind != BROKER_KIND_RESERVATION && o->kind != BROKER_KIND_SHARE,
                .client_refs = o->client_refs, .foreign = o->foreign, .read_only = o->read_only, .fd = -1,
                .svm = o->svm_log ? o->svm_log->e : NULL, .n_svm = o->svm_log ? o->svm_log->n : 0
        };
        // clang-format on
        if (o->kind == BROKER_KIND_SHARE) {
                /* the reader's part: the share it opened, its role, the GPUs it was granted */
                k->share_name = o->ref->share->name;
                k->read_only = o->ref->read_only;
                for (size_t g = 0; g < o->ref->n_grants; g++)
                        k->mapped[k->n_mapped++] = o->ref->grant_gpus[g];
                return;
        }
        /* VMM memory and imports reach GPUs through their mappings' grants, not as a whole */
        if (o->kind != BROKER_KIND_VMM && o->kind != BROKER_KIND_IMPORT)
                broker_mapped_gpus_into(c->b, o, k->mapped, &k->n_mapped);
}

/* A file of @o's memory for the next daemon (the caller's): a copy of the memfd of host or managed memory,
 * or an export of device or VMM memory or of an import. */
static int carry_file(BrokerClient *c, const Obj *o, int *ret_fd)
{
        if (o->kind == BROKER_KIND_DEVICE || o->kind == BROKER_KIND_VMM || o->kind == BROKER_KIND_IMPORT)
                return driver_mem_export(c->b->drv, o->mem, ret_fd);
        if (o->memfd < 0)
                return -EBADF;
        return fd_dup_into(o->memfd, ret_fd);
}

/* @o's record with its file, to @fn. */
static int carry_emit(BrokerClient *c, const Obj *o, BrokerCarryObjFn fn, void *arg)
{
        BrokerCarry k;
        int r;

        if (obj_not_carriable(c->b, o))
                return -EOPNOTSUPP; /* broker_client_carry_check() says why */
        carry_record(c, o, &k);
        if (k.has_file && (r = carry_file(c, o, &k.fd)) < 0)
                return r;
        return fn(arg, &k);
}

int broker_client_carry_each(BrokerClient *c, BrokerCarryObjFn obj, BrokerCarryMapFn map, void *arg)
{
        unsigned pass = ++c->carry_pass;
        size_t it = 0;
        Obj *o;
        int r;

        while (hashmap_next(&c->objs, &it, NULL, (void **)&o)) {
                o->carry_pass = pass;
                if ((r = carry_emit(c, o, obj, arg)) < 0)
                        return r;
        }
        /* handles released while mapped are named by nothing but their mappings: each listed once */
        for (int phase = 0; phase < 2; phase++) {
                it = 0;
                while (hashmap_next(&c->objs, &it, NULL, (void **)&o)) {
                        ThunkVaObject vo;
                        if (o->kind != BROKER_KIND_RESERVATION)
                                continue;
                        for (uint64_t at = o->va; thunk_va_next(o->maps, at, &vo) == 0;
                             at = vo.start + vo.size) {
                                const VmmMap *m = vo.data;
                                if (phase == 0 && m->phys->carry_pass != pass) {
                                        m->phys->carry_pass = pass;
                                        r = carry_emit(c, m->phys, obj, arg);
                                } else if (phase == 1) {
                                        BrokerCarryMap km = {.va = m->va,
                                                             .size = m->size,
                                                             .offset = m->offset,
                                                             .handle = m->phys->handle,
                                                             .cpu_access = m->cpu_access,
                                                             .n_grants = m->n_gem};
                                        for (size_t g = 0; g < m->n_gem; g++)
                                                km.grants[g] =
                                                        (BrokerAccess){m->gem[g].gpu_id, m->gem[g].access};
                                        r = map(arg, &km);
                                } else {
                                        r = 0;
                                }
                                if (r < 0)
                                        return r;
                        }
                }
        }
        return 0;
}

/* Device memory: its dmabuf placed at its VA in the client's GPU VM again, and mapped on its GPUs. */
static int carry_device(BrokerClient *c, Obj *o, const BrokerCarry *k, int fd, Reason *w)
{
        Broker *b = c->b;
        DriverCtx *ctx;
        int r;

        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        r = driver_mem_adopt_vram(b->drv, ctx, fd, o->gpu_id, o->va, o->size, o->flags, &o->mem);
        if (r < 0)
                return reason_set(w, r, "the driver cannot take its memory back: %s", strerror(-r));
        r = k->n_mapped ? driver_mem_map(b->drv, o->mem, k->mapped, k->n_mapped) : 0;
        if (r < 0) {
                (void)driver_mem_free(b->drv, o->mem);
                o->mem = NULL;
                return reason_set(w, r, "cannot map it on its GPUs again: %s", strerror(-r));
        }
        /* the driver keeps a file for it now, as after a first export (the model; the kernel needs none) */
        o->backing_fd = broker_driver_holds_fd(b);
        return 0;
}

/* A carried memfd (host or managed memory) mapped at the object's VA in the daemon again, over its window's
 * reservation: read-only if it was handed out read-only (sealed: no one maps it writable again, this
 * daemon neither), so that GPUs reach it through this mapping only to read it. */
static int carry_map_here(const Obj *o, Reason *w)
{
        struct stat st;
        void *p;
        int r;

        if (fstat(o->memfd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < o->size)
                return reason_set(w, -EBADF, "its memory file is not %llu bytes of shared memory",
                                  (unsigned long long)o->size);
        p = mmap((void *)(uintptr_t)o->va, o->size,
                 broker_file_sealed(o->memfd) ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 o->memfd, 0);
        if (p == MAP_FAILED) {
                r = -errno;
                broker_reserve_again(o->va, o->size);
                return reason_set(w, r, "cannot map its memory here: %s", strerror(-r));
        }
        return 0;
}

/* The driver's flags for carried pages of the daemon's: read-only where this daemon maps them so. */
static uint32_t carried_flags(const Obj *o)
{
        return broker_file_sealed(o->memfd) ? o->flags | BROKER_FLAG_READ_ONLY : o->flags;
}

/*
 * Managed memory: its memfd mapped at its VA here again, an SVM range of the daemon's GPU VM again, and
 * the SVM calls made on it replayed in order. A prefetch that cannot be made now leaves the pages where they
 * are (it is a move, not a lasting right); any other call that fails fails the restore.
 */
static int carry_managed(BrokerClient *c, Obj *o, const BrokerCarry *k, Reason *w)
{
        Broker *b = c->b;
        int r;

        if (!driver_has(b->drv, DRIVER_CAP_MANAGED))
                return reason_set(w, -EOPNOTSUPP, "this driver has no managed memory");
        r = carry_map_here(o, w);
        if (r < 0)
                return r;
        r = driver_managed_register(b->drv, o->va, o->size, carried_flags(o));
        if (r < 0) {
                broker_unmap_shared(b, o->va, o->size);
                return reason_set(w, r, "the driver refused the managed range again: %s", strerror(-r));
        }
        for (size_t i = 0; i < k->n_svm; i++) {
                const BrokerSvmCall *call = &k->svm[i];
                bool prefetch_only = true;
                if (call->n == 0 || call->n > BROKER_SVM_MAX_ATTRS || call->va < o->va ||
                    call->size > o->size || call->va - o->va > o->size - call->size ||
                    broker_check_svm_attrs(b, call->a, call->n, false, w) < 0) {
                        broker_unmap_shared(b, o->va, o->size);
                        return reason_set(w, -EINVAL, "SVM call %zu of its record is not one for it", i);
                }
                for (uint32_t j = 0; j < call->n; j++)
                        prefetch_only &= call->a[j].type == DRIVER_SVM_ATTR_PREFETCH_LOC;
                r = broker_svm_driver_set(b->drv, call->va, call->size, call->a, call->n);
                if (r < 0 && !prefetch_only) {
                        broker_unmap_shared(b, o->va, o->size);
                        return reason_set(w, r, "SVM call %zu cannot be made again: %s", i, strerror(-r));
                }
                if (r >= 0)
                        broker_svm_log_add(c, o, call->va, call->size, call->a, call->n);
        }
        return 0;
}

/*
 * GTT host memory: its dmabuf (the memfd the old daemon kept) taken back by the driver at its VA in the
 * client's GPU VM, mapped on its GPUs, and mapped here again unless it is an SVM range's (outside the
 * window).
 */
static int carry_host_gtt(BrokerClient *c, Obj *o, const BrokerCarry *k, Reason *w)
{
        Broker *b = c->b;
        uint32_t gpu = k->gpu_id ? k->gpu_id : b->gpu_ids[0];
        DriverCtx *ctx;
        int r;

        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        r = driver_mem_adopt_gtt(b->drv, ctx, o->memfd, gpu, o->va, o->size,
                                 o->flags & ~(uint32_t)(BROKER_FLAG_GTT | BROKER_FLAG_SVM_RANGE), &o->mem);
        if (r < 0)
                return reason_set(w, r, "the driver cannot take its GTT buffer back: %s", strerror(-r));
        o->backing_fd =
                broker_driver_holds_fd(b); /* the driver's own file behind the dmabuf, as at allocation */
        r = k->n_mapped ? driver_mem_map(b->drv, o->mem, k->mapped, k->n_mapped) : 0;
        if (r < 0)
                reason_set(w, r, "cannot map it on its GPUs again: %s", strerror(-r));
        if (r == 0 && !o->outer)
                r = carry_map_here(o, w);
        if (r < 0)
                broker_obj_mem_free(b, o);
        return r;
}

/* Host memory: its memfd mapped at its VA here again, registered with the driver and mapped on its GPUs. */
static int carry_host(BrokerClient *c, Obj *o, const BrokerCarry *k, Reason *w)
{
        Broker *b = c->b;
        uint32_t gpu = k->gpu_id ? k->gpu_id : b->gpu_ids[0];
        int r;

        r = carry_map_here(o, w);
        if (r < 0)
                return r;
        r = driver_mem_register_host(b->drv, gpu, o->va, o->size, carried_flags(o), &o->mem);
        if (r < 0) {
                broker_unmap_shared(b, o->va, o->size);
                return reason_set(w, r, "the driver refused to register it again: %s", strerror(-r));
        }
        r = k->n_mapped ? driver_mem_map(b->drv, o->mem, k->mapped, k->n_mapped) : 0;
        if (r < 0) {
                (void)driver_mem_free(b->drv, o->mem);
                o->mem = NULL;
                broker_unmap_shared(b, o->va, o->size);
                return reason_set(w, r, "cannot map it on its GPUs again: %s", strerror(-r));
        }
        return 0;
}

/* A VMM reservation: its VA in the window again, with an empty map of its mappings (they come next). */
static int carry_reservation(BrokerClient *c, Obj *o, Reason *w)
{
        int r = thunk_va_space_new(o->va, o->size, 0, &o->maps);
        return r < 0 ? reason_set(w, r, "out of memory") : 0;
}

/* What the old daemon charged, whatever the limits say now: the memory exists. */
static void charge_carried(BrokerClient *c, const Charge *ch)
{
        if (c->acct) {
                pthread_mutex_lock(&c->acct->lock);
                broker_usage_apply(&c->acct->used, c->b, ch, +1);
                pthread_mutex_unlock(&c->acct->lock);
        }
        broker_usage_apply(&c->usage, c->b, ch, +1);
        broker_totals_charge(c, ch);
}

static bool carry_kind_ok(BrokerKind kind)
{
        return kind == BROKER_KIND_HOST || kind == BROKER_KIND_DEVICE || kind == BROKER_KIND_MANAGED ||
               kind == BROKER_KIND_VMM || kind == BROKER_KIND_IMPORT || kind == BROKER_KIND_RESERVATION ||
               kind == BROKER_KIND_SHARE;
}

/*
 * A reader's open share: the share (back already, broker_carry_share_restore) imported into its GPU VM
 * again and granted to the same GPUs, with the same role, at the share's VA. The reader keeps the file and
 * CPU mapping it was given.
 */
static int carry_share_ref(BrokerClient *c, Obj *o, const BrokerCarry *k, Reason *w)
{
        Broker *b = c->b;
        DriverCtx *ctx;
        ShareRef *ref;
        Share *sh = NULL;
        bool placed = false;
        int fd = -1, r;

        if (!k->share_name || !broker_share_name_ok(k->share_name) || !b->share_space)
                return reason_set(w, -EINVAL, "its share has no name this daemon knows");
        r = broker_share_reader_vm(c, &ctx, w);
        if (r < 0)
                return r;
        ref = calloc(1, sizeof(*ref));
        if (!ref)
                return reason_set(w, -ENOMEM, "out of memory");
        pthread_mutex_lock(&b->share_lock);
        sh = broker_share_by_name(b, k->share_name);
        if (!sh) {
                r = reason_set(w, -ENOENT, "share '%s' did not come back", k->share_name);
                goto fail;
        }
        if (sh->size != k->size) {
                r = reason_set(w, -EINVAL, "share '%s' is not the size it was", k->share_name);
                goto fail;
        }
        /* a read-write reader of memory sealed read-only since imports it read-only now (as new opens are) */
        ref->read_only = k->read_only || sh->read_only || broker_file_sealed(sh->fd);
        r = thunk_va_alloc_fixed(c->outer, sh->va, sh->size, o);
        if (r < 0) {
                r = reason_set(w, r, "share '%s' cannot be placed in its GPU VM again: %s", k->share_name,
                               strerror(-r));
                goto fail;
        }
        placed = true;
        r = broker_share_ref_map(b, ctx, sh, ref, k->mapped, k->n_mapped, &fd, w);
        if (r < 0)
                goto fail;
        safe_close(fd); /* the reader has its own, and its CPU mapping */
        broker_share_obj_fill(o, sh, ref);
        broker_share_ref_link(sh, ref, c);
        pthread_mutex_unlock(&b->share_lock);
        return 0;

fail:
        broker_share_ref_undo(c, sh, ref, placed, fd);
        pthread_mutex_unlock(&b->share_lock);
        return r;
}

/* An import: the dmabuf imported again on the same GPU; it must be the size it was. */
static int carry_import(BrokerClient *c, Obj *o, const BrokerCarry *k, int fd, Reason *w)
{
        DriverCtx *ctx;
        int r;

        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        r = driver_mem_import(c->b->drv, ctx, fd, o->gpu_id, &o->mem);
        if (r < 0)
                return reason_set(w, r, "the driver cannot import its dmabuf again: %s", strerror(-r));
        if (driver_mem_size(c->b->drv, o->mem) != o->size) {
                (void)driver_mem_free(c->b->drv, o->mem);
                o->mem = NULL;
                return reason_set(w, -EINVAL, "its dmabuf is not the %llu bytes it was",
                                  (unsigned long long)o->size);
        }
        /* memory sealed read-only since it was imported read-write: read-only now, as a new import of it */
        o->sealed_ro = !k->read_only && broker_file_sealed(fd);
        o->read_only = k->read_only || o->sealed_ro;
        o->foreign = k->foreign;
        o->backing_fd = o->foreign && broker_driver_holds_fd(c->b);
        return 0;
}

int broker_carry_restore(BrokerClient *c, BrokerCarry *k, Reason *w)
{
        bool has_va =
                k->kind != BROKER_KIND_VMM && k->kind != BROKER_KIND_IMPORT && k->kind != BROKER_KIND_SHARE;
        bool has_file = k->kind != BROKER_KIND_RESERVATION && k->kind != BROKER_KIND_SHARE;
        Charge ch;
        Obj *o;
        int r;

        if (!carry_kind_ok(k->kind) || (k->kind != BROKER_KIND_HOST && (k->flags & BROKER_FLAG_GTT)) ||
            ((k->flags & BROKER_FLAG_SVM_RANGE) && !(k->flags & BROKER_FLAG_GTT))) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -EOPNOTSUPP, "objects of kind %d cannot be carried", (int)k->kind);
        }
        if (k->handle == 0 || k->handle == UINT64_MAX || broker_obj_lookup(c, k->handle)) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -EEXIST, "handle 0x%llx is taken or invalid",
                                  (unsigned long long)k->handle);
        }
        if (k->n_mapped > BROKER_MAX_GPUS || broker_check_gpus(c->b, k->mapped, k->n_mapped, w) < 0 ||
            (k->gpu_id && broker_gpu_index(c->b, k->gpu_id) < 0) ||
            ((k->kind == BROKER_KIND_DEVICE || k->kind == BROKER_KIND_VMM || k->kind == BROKER_KIND_IMPORT) &&
             broker_gpu_index(c->b, k->gpu_id) < 0) ||
            k->size == 0 || k->size % BROKER_PAGE_SIZE || broker_check_flags(k->flags, w) < 0 ||
            (!has_va && k->kind != BROKER_KIND_SHARE && (k->va || k->n_mapped)) ||
            (k->kind == BROKER_KIND_RESERVATION && k->n_mapped) || has_file != (k->fd >= 0)) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -EINVAL, "its record is not one of memory this daemon can place");
        }
        o = broker_obj_new(k->kind);
        if (!o) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -ENOMEM, "out of memory");
        }
        if (k->kind == BROKER_KIND_HOST || k->kind == BROKER_KIND_MANAGED)
                o->memfd = TAKE_FD(k->fd);
        o->handle = k->handle;
        o->size = k->size;
        o->gpu_id = k->gpu_id;
        o->flags = k->flags;
        o->numa_node = k->numa_node;
        o->exports = k->exports;
        if (k->kind == BROKER_KIND_VMM || k->kind == BROKER_KIND_IMPORT) {
                /* one that only mappings named is held until they are back (broker_carry_finish) */
                o->client_refs = k->client_refs ? k->client_refs : 1;
                o->carry_hold = k->client_refs == 0;
        }
        if (k->flags & BROKER_FLAG_SVM_RANGE) {
                /* an SVM range's memory lies where the process has the range, outside the window */
                o->outer = true;
                r = broker_client_outer(c, w);
                if (r == 0 && (r = thunk_va_alloc_fixed(c->outer, k->va, o->size, o)) < 0)
                        reason_set(w, r, "its SVM range 0x%llx+0x%llx cannot be placed again: %s",
                                   (unsigned long long)k->va, (unsigned long long)o->size, strerror(-r));
                if (r == 0)
                        o->va = k->va;
        } else {
                r = has_va ? broker_take_va(c, o->size, BROKER_PAGE_SIZE, k->va, o, &o->va, w) : 0;
        }
        if (r == 0) {
                switch (o->kind) {
                case BROKER_KIND_HOST:
                        r = o->flags & BROKER_FLAG_GTT ? carry_host_gtt(c, o, k, w) : carry_host(c, o, k, w);
                        break;
                case BROKER_KIND_MANAGED:
                        r = carry_managed(c, o, k, w);
                        break;
                case BROKER_KIND_RESERVATION:
                        r = carry_reservation(c, o, w);
                        break;
                case BROKER_KIND_IMPORT:
                        r = carry_import(c, o, k, k->fd, w);
                        break;
                case BROKER_KIND_SHARE:
                        r = carry_share_ref(c, o, k, w);
                        break;
                default: /* device and VMM memory */
                        r = carry_device(c, o, k, k->fd, w);
                        break;
                }
        }
        if (r == 0) {
                ch = broker_obj_charge(o);
                charge_carried(c, &ch);
                r = broker_obj_publish(c, o);
                if (r < 0 && o->ref) {
                        broker_share_ref_drop(c, o); /* which gives its charge back */
                        free(o);
                        k->fd = safe_close(k->fd);
                        return reason_set(w, r, "out of memory");
                }
                if (r < 0) {
                        broker_charge_give(c, &ch);
                        if (o->mem)
                                broker_obj_mem_free(c->b, o);
                        if (o->memfd >= 0 && !o->outer)
                                broker_unmap_shared(c->b, o->va, o->size);
                        reason_set(w, r, "out of memory");
                }
        }
        if (r < 0) {
                if (o->va)
                        (void)thunk_va_free(broker_obj_space(c, o), o->va);
                thunk_va_space_free(o->maps);
                safe_close(o->memfd);
                k->fd = safe_close(k->fd);
                broker_svm_log_free(c, o);
                free(o);
                return r;
        }
        /* the files the client holds are this memory's: known again, so that it stays charged while they
         * live after a free */
        if (k->handed_out)
                broker_note_file(c->b, o, o->memfd >= 0 ? o->memfd : k->fd);
        k->fd = safe_close(k->fd);
        return 0;
}

int broker_carry_restore_map(BrokerClient *c, const BrokerCarryMap *k, Reason *w)
{
        Obj *phys = broker_obj_lookup(c, k->handle), *res;
        DriverCtx *ctx = NULL;
        VmmMap *m;
        int r;

        if (!phys || (phys->kind != BROKER_KIND_VMM && phys->kind != BROKER_KIND_IMPORT))
                return reason_set(w, -ENOENT,
                                  "a mapping at 0x%llx maps handle 0x%llx, which did not come back",
                                  (unsigned long long)k->va, (unsigned long long)k->handle);
        if (k->size == 0 || k->size % BROKER_PAGE_SIZE || k->offset % BROKER_PAGE_SIZE ||
            k->va % BROKER_PAGE_SIZE || k->offset > phys->size || k->size > phys->size - k->offset ||
            !broker_in_window(c, k->va, k->size) || k->n_grants > BROKER_MAX_GPUS ||
            (k->cpu_access != BROKER_ACCESS_NONE && k->cpu_access != BROKER_ACCESS_READ &&
             k->cpu_access != BROKER_ACCESS_READ_WRITE))
                return reason_set(w, -EINVAL,
                                  "the record of the mapping at 0x%llx is not one this daemon can make",
                                  (unsigned long long)k->va);
        res = broker_reservation_at(c, k->va);
        if (!res || k->va + k->size > res->va + res->size)
                return reason_set(w, -EINVAL, "the mapping at 0x%llx is not inside one VA reservation",
                                  (unsigned long long)k->va);
        for (size_t i = 0; i < k->n_grants; i++) {
                const BrokerAccess *g = &k->grants[i];
                bool twice = false;
                for (size_t j = 0; j < i; j++)
                        twice |= k->grants[j].gpu_id == g->gpu_id;
                if (broker_gpu_index(c->b, g->gpu_id) < 0 || twice ||
                    (g->access != BROKER_ACCESS_READ && g->access != BROKER_ACCESS_READ_WRITE))
                        return reason_set(w, -EINVAL,
                                          "the mapping at 0x%llx names a grant this daemon cannot make",
                                          (unsigned long long)k->va);
        }
        if (broker_obj_read_only(phys) && !phys->sealed_ro && k->cpu_access == BROKER_ACCESS_READ_WRITE)
                return reason_set(w, -EACCES, "the mapping at 0x%llx writes read-only memory",
                                  (unsigned long long)k->va);
        if (k->n_grants && (r = broker_client_ctx(c, &ctx, w)) < 0)
                return r;
        m = calloc(1, sizeof(*m));
        if (!m)
                return reason_set(w, -ENOMEM, "out of memory");
        *m = (VmmMap){.res = res, .phys = phys, .va = k->va, .size = k->size, .offset = k->offset};
        r = thunk_va_alloc_fixed(res->maps, m->va, m->size, m);
        if (r < 0) {
                free(m);
                return reason_set(w, r, "the mapping at 0x%llx cannot be recorded: %s",
                                  (unsigned long long)k->va, strerror(-r));
        }
        charge_carried(c, &(Charge){.objects = 1});
        phys->map_refs++;
        for (size_t i = 0; i < k->n_grants; i++) {
                int access = k->grants[i].access;
                /* memory sealed read-only since it was granted: what wrote it may read it now */
                if (phys->sealed_ro && access == BROKER_ACCESS_READ_WRITE)
                        access = BROKER_ACCESS_READ;
                if (broker_obj_read_only(phys) && access == BROKER_ACCESS_READ_WRITE) {
                        r = reason_set(w, -EACCES, "the mapping at 0x%llx writes read-only memory",
                                       (unsigned long long)k->va);
                        break;
                }
                r = broker_set_gpu_access(c, ctx, m, k->grants[i].gpu_id, access, w);
                if (r < 0)
                        break;
        }
        if (r < 0) {
                (void)broker_map_revoke_all(c->b, m);
                /* the handle is held (client_refs ≥ 1) until broker_carry_finish(): nothing to refuse */
                (void)broker_map_destroy(c, m, false, NULL);
                return r;
        }
        m->cpu_access = phys->sealed_ro && k->cpu_access == BROKER_ACCESS_READ_WRITE ? BROKER_ACCESS_READ
                                                                                     : k->cpu_access;
        return 0;
}

void broker_carry_claim_shares(BrokerClient *c)
{
        Broker *b = c->b;

        pthread_mutex_lock(&b->share_lock);
        for (Share *sh = b->shares; sh; sh = sh->next) {
                Obj *o;
                if (!sh->carry_pending || !sh->carry_owner_tag || sh->carry_owner_tag != c->tag)
                        continue;
                o = broker_obj_lookup(c, sh->carry_src);
                if (!o || o->share || o->kind != sh->kind || o->size != sh->size)
                        continue; /* settled as a share whose publisher did not come back */
                sh->carry_pending = false;
                sh->src = o;
                sh->owner = c;
                sh->owner_tag = c->tag;
                sh->acct = c->acct;
                snprintf(sh->class_name, sizeof(sh->class_name), "%s", c->acct ? c->acct->name : "");
                o->share = sh;
                charge_carried(c, &broker_share_charge);
        }
        pthread_mutex_unlock(&b->share_lock);
}

int broker_carry_finish(BrokerClient *c, Reason *w)
{
        size_t it = 0;
        Obj *o;
        int r = 0;

        /* removing the entry just read leaves a tombstone: the walk goes on where it was */
        while (hashmap_next(&c->objs, &it, NULL, (void **)&o)) {
                if (!o->carry_hold)
                        continue;
                o->carry_hold = false;
                if (o->map_refs == 0 && r == 0)
                        r = reason_set(w, -EINVAL,
                                       "VMM handle 0x%llx was kept only by mappings, none came back",
                                       (unsigned long long)o->handle);
                if (--o->client_refs > 0)
                        continue;
                if (o->map_refs > 0)
                        hashmap_remove(&c->objs, o->handle);
                else if (broker_phys_maybe_destroy(c, o, false, NULL) < 0)
                        o->client_refs = 1; /* the driver keeps its memory: the handle stays */
        }
        broker_process_events(c->b);
        return r;
}

int broker_carry_shares_each(Broker *b, int (*fn)(void *arg, const BrokerCarryShare *s), void *arg)
{
        int r = 0;

        pthread_mutex_lock(&b->share_lock);
        for (Share *sh = b->shares; sh && r == 0; sh = sh->next) {
                BrokerCarryShare k;
                /* the class that pays: the publisher's now, while it holds the share (a reload may have
                 * moved it) */
                if (sh->owner && sh->owner->acct)
                        snprintf(sh->class_name, sizeof(sh->class_name), "%s", sh->owner->acct->name);
                k = (BrokerCarryShare){.name = sh->name,
                                       .kind = sh->kind,
                                       .gpu_id = sh->gpu_id,
                                       .va = sh->va,
                                       .size = sh->size,
                                       .read_only = sh->read_only,
                                       .persistent = sh->persistent,
                                       .owner_tag = sh->owner && sh->src ? sh->owner_tag : 0,
                                       .src_handle = sh->src ? sh->src->handle : 0,
                                       .class_name = sh->class_name,
                                       .published_usec = sh->published_usec,
                                       .opens = sh->opens,
                                       .fd = fcntl(sh->fd, F_DUPFD_CLOEXEC, 3)};
                r = k.fd < 0 ? -errno : fn(arg, &k);
        }
        pthread_mutex_unlock(&b->share_lock);
        return r;
}

int broker_carry_share_restore(Broker *b, BrokerCarryShare *k, Reason *w)
{
        Share *sh;
        struct stat st;
        int r;

        if (!b->share_space) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -EOPNOTSUPP, "this daemon has no shared region for named shares");
        }
        if (!broker_share_name_ok(k->name) ||
            (k->kind != BROKER_KIND_DEVICE && k->kind != BROKER_KIND_HOST && k->kind != BROKER_KIND_VMM) ||
            (k->gpu_id && broker_gpu_index(b, k->gpu_id) < 0) || k->size == 0 || k->size % BROKER_PAGE_SIZE ||
            k->fd < 0 || fstat(k->fd, &st) < 0 || (uint64_t)st.st_size < k->size) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -EINVAL, "its record is not one of a share this daemon can hold");
        }
        sh = calloc(1, sizeof(*sh));
        if (!sh) {
                k->fd = safe_close(k->fd);
                return reason_set(w, -ENOMEM, "out of memory");
        }
        *sh = (Share){.kind = k->kind,
                      .gpu_id = k->gpu_id,
                      .va = k->va,
                      .size = k->size,
                      .fd = -1,
                      .read_only = k->read_only,
                      .persistent = k->persistent,
                      .published_usec = k->published_usec,
                      .opens = k->opens,
                      .carry_pending = true,
                      .carry_owner_tag = k->owner_tag,
                      .carry_src = k->src_handle};
        sh->fd = TAKE_FD(k->fd);
        memcpy(sh->name, k->name, strlen(k->name) + 1);
        snprintf(sh->class_name, sizeof(sh->class_name), "%s", k->class_name ? k->class_name : "");
        pthread_mutex_lock(&b->share_lock);
        if (broker_share_by_name(b, sh->name))
                r = reason_set(w, -EEXIST, "a share named '%s' is back already", sh->name);
        else if (b->n_shares >= BROKER_MAX_SHARES)
                r = reason_set(w, -ENOSPC, "the daemon holds %d shares, its most", BROKER_MAX_SHARES);
        else if ((r = thunk_va_alloc_fixed(b->share_space, sh->va, sh->size, sh)) < 0)
                r = reason_set(w, r, "its place 0x%llx+0x%llx in the shared region is not free",
                               (unsigned long long)sh->va, (unsigned long long)sh->size);
        if (r >= 0) {
                sh->next = b->shares;
                b->shares = sh;
                b->n_shares++;
        }
        pthread_mutex_unlock(&b->share_lock);
        if (r < 0) {
                safe_close(sh->fd);
                free(sh);
        }
        return r;
}

void broker_carry_shares_unclaimed(Broker *b, BrokerAccount *(*acct_of)(void *arg, const char *class_name),
                                   void *arg)
{
        pthread_mutex_lock(&b->share_lock);
        for (Share *sh = b->shares; sh; sh = sh->next) {
                if (!sh->carry_pending)
                        continue;
                sh->carry_pending = false;
                if (!sh->persistent) {
                        sh->carry_ending = true; /* as when its publisher went, once its readers are back */
                        continue;
                }
                /* a persistent share keeps the memory, and its class goes on paying for it; VRAM is taken
                 * back by the driver for the share (on the model its readers' imports find it then) */
                if ((sh->kind == BROKER_KIND_DEVICE || sh->kind == BROKER_KIND_VMM) && driver_carries_vram(b))
                        (void)driver_mem_adopt_vram(b->drv, b->primary, sh->fd, sh->gpu_id, 0, sh->size,
                                                    sh->read_only ? BROKER_FLAG_READ_ONLY : 0,
                                                    &sh->carry_mem);
                sh->acct = acct_of ? acct_of(arg, sh->class_name) : NULL;
                sh->held_mem = (Charge){.kind = sh->kind, .gpu_id = sh->gpu_id, .bytes = sh->size};
                broker_share_held_apply(b, sh, +1);
                sh->holds = true;
        }
        pthread_mutex_unlock(&b->share_lock);
}

size_t broker_carry_shares_settle(Broker *b)
{
        size_t ended = 0;
        Share *next;

        pthread_mutex_lock(&b->share_lock);
        for (Share *sh = b->shares; sh; sh = next) {
                next = sh->next;
                if (sh->carry_ending) {
                        sh->carry_ending = false;
                        broker_share_end(b, sh, NULL);
                        ended++;
                }
        }
        pthread_mutex_unlock(&b->share_lock);
        return ended;
}
