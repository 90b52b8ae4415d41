/* Managed memory: SVM attributes and prefetches, and the log of attribute calls a restart replays. */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"

void broker_svm_log_free(BrokerClient *c, Obj *o)
{
        if (o->svm_log) {
                c->svm_log_entries -= o->svm_log->n;
                free(o->svm_log->e);
                free(o->svm_log);
                o->svm_log = NULL;
        }
}

/* Does attribute @b, set later, leave nothing of what @a set? */
static bool svm_attr_overrides(const BrokerSvmAttr *b, const BrokerSvmAttr *a)
{
        switch (a->type) {
        case DRIVER_SVM_ATTR_ACCESS:
        case DRIVER_SVM_ATTR_ACCESS_IN_PLACE:
        case DRIVER_SVM_ATTR_NO_ACCESS:
                /* one GPU's access, whichever of the three sets it */
                return (b->type == DRIVER_SVM_ATTR_ACCESS || b->type == DRIVER_SVM_ATTR_ACCESS_IN_PLACE ||
                        b->type == DRIVER_SVM_ATTR_NO_ACCESS) &&
                       b->value == a->value;
        case DRIVER_SVM_ATTR_SET_FLAGS:
        case DRIVER_SVM_ATTR_CLR_FLAGS:
                /* flags bit by bit: every bit @a set or cleared is set or cleared again */
                return (b->type == DRIVER_SVM_ATTR_SET_FLAGS || b->type == DRIVER_SVM_ATTR_CLR_FLAGS) &&
                       (b->value & a->value) == a->value;
        default: /* one value per page */
                return b->type == a->type;
        }
}

/* Does the call on [@va, @va+@size) with @a take every effect of the earlier @e away? */
static bool svm_call_shadows(uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n,
                             const SvmLogEntry *e)
{
        if (e->va < va || e->size > size || e->va - va > size - e->size)
                return false;
        for (uint32_t i = 0; i < e->n; i++) {
                bool over = false;
                for (size_t j = 0; j < n && !over; j++)
                        over = svm_attr_overrides(&a[j], &e->a[i]);
                if (!over)
                        return false;
        }
        return true;
}

/*
 * Keep one SVM call made on @o (the driver took it). The earlier calls it shadows go (replayed without
 * them, the calls give the same attributes page for page), so a call made again and again is kept once.
 * Out of room or memory: the log is marked overflowed.
 */
void broker_svm_log_add(BrokerClient *c, Obj *o, uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n)
{
        SvmLog *l = o->svm_log;
        SvmLogEntry *e;
        size_t kept = 0;

        if (!l && !(l = o->svm_log = calloc(1, sizeof(*l)))) {
                o->svm_unlogged = true;
                return;
        }
        if (l->overflowed)
                return;
        for (size_t i = 0; i < l->n; i++)
                if (!svm_call_shadows(va, size, a, n, &l->e[i]))
                        l->e[kept++] = l->e[i];
        c->svm_log_entries -= l->n - kept;
        l->n = kept;
        /* the daemon's memory a client's calls can take is bounded too, not only each allocation's log */
        if (c->svm_log_entries >= SVM_LOG_CLIENT_MAX) {
                l->overflowed = true;
                return;
        }
        if (l->n == SVM_LOG_MAX || ARRAY_RESERVE(l->e, l->cap, l->n + 1, 4) < 0) {
                l->overflowed = true;
                return;
        }
        /* field by field: a compound literal would clear all BROKER_SVM_MAX_ATTRS attributes first, and
         * only the first n are ever read */
        e = &l->e[l->n++];
        e->va = va;
        e->size = size;
        e->n = (uint32_t)n;
        memcpy(e->a, a, n * sizeof(*a));
        c->svm_log_entries++;
}

/* [va, va+size) must lie in one managed allocation of this client: that one in *@ret_o. */
static int managed_range(BrokerClient *c, uint64_t va, uint64_t size, Obj **ret_o, Reason *w)
{
        Obj *o;

        if (size == 0)
                return reason_set(w, -EINVAL, "size 0");
        if (va % BROKER_PAGE_SIZE || size % BROKER_PAGE_SIZE)
                return reason_set(w, -EINVAL, "0x%llx+0x%llx is not page aligned", (unsigned long long)va,
                                  (unsigned long long)size);
        if (va + size < va)
                return reason_set(w, -EOVERFLOW, "0x%llx+0x%llx wraps around", (unsigned long long)va,
                                  (unsigned long long)size);
        if (!broker_in_window(c, va, size))
                return reason_set(w, -EFAULT, "0x%llx+0x%llx is outside this client's VA window",
                                  (unsigned long long)va, (unsigned long long)size);
        o = broker_obj_at(c, va);
        if (!o || o->kind != BROKER_KIND_MANAGED || va + size > o->va + o->size)
                return reason_set(w, -EINVAL, "0x%llx+0x%llx is not inside one managed allocation",
                                  (unsigned long long)va, (unsigned long long)size);
        *ret_o = o;
        return 0;
}

static bool is_location(const Broker *b, uint32_t v, bool undefined_ok)
{
        return v == DRIVER_SVM_LOCATION_SYSMEM || (undefined_ok && v == DRIVER_SVM_LOCATION_UNDEFINED) ||
               broker_gpu_index(b, v) >= 0;
}

#define SVM_FLAGS_ALL 0xffu

int broker_check_svm_attrs(const Broker *b, const BrokerSvmAttr *a, size_t n, bool get, Reason *w)
{
        if (n == 0)
                return reason_set(w, -EINVAL, "no attribute");
        if (n > BROKER_SVM_MAX_ATTRS)
                return reason_set(w, -E2BIG, "more than %d attributes", BROKER_SVM_MAX_ATTRS);
        for (size_t i = 0; i < n; i++) {
                uint32_t t = a[i].type, v = a[i].value;
                switch (t) {
                case DRIVER_SVM_ATTR_PREFERRED_LOC:
                case DRIVER_SVM_ATTR_PREFETCH_LOC:
                        if (!get && !is_location(b, v, t == DRIVER_SVM_ATTR_PREFERRED_LOC))
                                return reason_set(w, -EINVAL,
                                                  "location %u is neither system memory nor a GPU", v);
                        break;
                case DRIVER_SVM_ATTR_ACCESS:
                case DRIVER_SVM_ATTR_ACCESS_IN_PLACE:
                case DRIVER_SVM_ATTR_NO_ACCESS:
                        if (get && t != DRIVER_SVM_ATTR_ACCESS)
                                return reason_set(w, -EINVAL, "query access with the ACCESS type");
                        if (broker_gpu_index(b, v) < 0)
                                return reason_set(w, -EINVAL,
                                                  "access attribute names GPU %u, which does not exist", v);
                        break;
                case DRIVER_SVM_ATTR_SET_FLAGS:
                case DRIVER_SVM_ATTR_CLR_FLAGS:
                        if (!get && (v & ~SVM_FLAGS_ALL))
                                return reason_set(w, -EINVAL, "unknown SVM flags 0x%x", v & ~SVM_FLAGS_ALL);
                        break;
                case DRIVER_SVM_ATTR_GRANULARITY:
                        if (!get && v > 0x3f)
                                return reason_set(w, -EINVAL, "granularity 2^%u pages is out of range", v);
                        break;
                default:
                        return reason_set(w, -EINVAL, "unknown SVM attribute type %u", t);
                }
                /* one value per attribute (per GPU for the access kinds) */
                for (size_t k = 0; k < i; k++) {
                        bool per_gpu = t == DRIVER_SVM_ATTR_ACCESS || t == DRIVER_SVM_ATTR_ACCESS_IN_PLACE ||
                                       t == DRIVER_SVM_ATTR_NO_ACCESS;
                        bool k_per_gpu = a[k].type == DRIVER_SVM_ATTR_ACCESS ||
                                         a[k].type == DRIVER_SVM_ATTR_ACCESS_IN_PLACE ||
                                         a[k].type == DRIVER_SVM_ATTR_NO_ACCESS;
                        if (per_gpu && k_per_gpu ? a[k].value == v : a[k].type == t)
                                return reason_set(w, -EINVAL, "attribute %u%s given twice", t,
                                                  per_gpu ? " for one GPU" : "");
                }
        }
        return 0;
}

/* The attributes may be set on [va, va+size): one managed allocation of the client's, GPUs it may use. */
static int svm_set_check(BrokerClient *c, uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n,
                         Obj **ret_o, Reason *w)
{
        int r;

        if ((r = managed_range(c, va, size, ret_o, w)) < 0 ||
            (r = broker_check_svm_attrs(c->b, a, n, false, w)) < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                bool names_gpu = a[i].type == DRIVER_SVM_ATTR_ACCESS ||
                                 a[i].type == DRIVER_SVM_ATTR_ACCESS_IN_PLACE ||
                                 ((a[i].type == DRIVER_SVM_ATTR_PREFERRED_LOC ||
                                   a[i].type == DRIVER_SVM_ATTR_PREFETCH_LOC) &&
                                  broker_gpu_index(c->b, a[i].value) >= 0);
                if (names_gpu && (r = broker_gpu_allowed(c, a[i].value, w)) < 0)
                        return r;
        }
        return 0;
}

/* The attributes @a set on [va, va+size) by the driver: 0, or its refusal. */
int broker_svm_driver_set(Driver *drv, uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n)
{
        DriverSvmAttr t[BROKER_SVM_MAX_ATTRS];

        for (size_t i = 0; i < n; i++)
                t[i] = (DriverSvmAttr){a[i].type, a[i].value};
        return driver_svm_set(drv, va, size, t, n);
}

int broker_svm_set(BrokerClient *c, uint64_t va, uint64_t size, const BrokerSvmAttr *a, size_t n, Reason *w)
{
        Obj *o;
        int r = svm_set_check(c, va, size, a, n, &o, w);

        if (r < 0)
                return r;
        r = broker_svm_driver_set(c->b->drv, va, size, a, n);
        if (r < 0)
                return reason_set(w, r, "the driver refused the attributes: %s", strerror(-r));
        broker_svm_log_add(c, o, va, size, a, n);
        return 0;
}

int broker_svm_get(BrokerClient *c, uint64_t va, uint64_t size, BrokerSvmAttr *a, size_t n, Reason *w)
{
        DriverSvmAttr t[BROKER_SVM_MAX_ATTRS];
        Obj *o;
        int r;

        if ((r = managed_range(c, va, size, &o, w)) < 0 ||
            (r = broker_check_svm_attrs(c->b, a, n, true, w)) < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                t[i] = (DriverSvmAttr){a[i].type, a[i].value};
        r = driver_svm_get(c->b->drv, va, size, t, n);
        if (r < 0)
                return reason_set(w, r, "the driver refused the query: %s", strerror(-r));
        for (size_t i = 0; i < n; i++)
                a[i] = (BrokerSvmAttr){t[i].type, t[i].value};
        return 0;
}

int broker_svm_prefetch(BrokerClient *c, uint64_t va, uint64_t size, uint32_t location, Reason *w)
{
        BrokerSvmAttr a = {DRIVER_SVM_ATTR_PREFETCH_LOC, location};
        return broker_svm_set(c, va, size, &a, 1, w);
}

bool broker_prefetch_is_slow(const BrokerClient *c, uint64_t size)
{
        return size >= BROKER_SLOW_PREFETCH_BYTES && driver_has(c->b->drv, DRIVER_CAP_THREADED_SVM);
}

int broker_prefetch_begin(BrokerClient *c, uint64_t va, uint64_t size, uint32_t location, BrokerPrefetch *p,
                          Reason *w)
{
        BrokerSvmAttr a = {DRIVER_SVM_ATTR_PREFETCH_LOC, location};
        Obj *o;
        int r = svm_set_check(c, va, size, &a, 1, &o, w);

        if (r < 0)
                return r;
        p->drv = c->b->drv;
        p->va = va;
        p->size = size;
        p->location = location;
        p->result = 0;
        /* kept for a restart now, on the loop: a replayed prefetch that fails changes nothing */
        broker_svm_log_add(c, o, va, size, &a, 1);
        return 0;
}

void broker_prefetch_run(BrokerPrefetch *p)
{
        DriverSvmAttr a = {DRIVER_SVM_ATTR_PREFETCH_LOC, p->location};
        p->result = driver_svm_set(p->drv, p->va, p->size, &a, 1);
}

int broker_prefetch_end(const BrokerPrefetch *p, Reason *w)
{
        if (p->result < 0)
                return reason_set(w, p->result, "the driver refused the attributes: %s",
                                  strerror(-p->result));
        return 0;
}
