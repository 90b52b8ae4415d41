/* The software KFD's SVM: the process's CPU mappings, SVM ranges and their attributes, XNACK mode. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kfd-compat.h"
#include "model-private.h"

/* ------------------------------------------------------------------ SVM (kfd-abi.md §4) */

/* Mapped CPU address intervals of this process, from /proc/self/maps (what the kernel sees as VMAs). */
typedef struct CpuMaps {
        uint64_t (*iv)[2];
        size_t n;
        size_t cap;
} CpuMaps;

static int cpu_maps_load(CpuMaps *cm)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        int r = 0;

        if (!f)
                return -errno;
        cm->n = 0;
        while (fgets(line, sizeof(line), f)) {
                unsigned long long s, e;
                size_t len = strlen(line);

                if (sscanf(line, "%llx-%llx", &s, &e) == 2) {
                        if (cm->n && cm->iv[cm->n - 1][1] == s) {
                                cm->iv[cm->n - 1][1] = e;
                        } else {
                                if (ARRAY_RESERVE(cm->iv, cm->cap, cm->n + 1, 8) < 0) {
                                        r = -ENOMEM;
                                        break;
                                }
                                cm->iv[cm->n][0] = s;
                                cm->iv[cm->n][1] = e;
                                cm->n++;
                        }
                }
                /* skip the rest of an overlong line */
                while (len && line[len - 1] != '\n' && fgets(line, sizeof(line), f))
                        len = strlen(line);
        }
        fclose(f);
        return r;
}

/* The first unmapped stretch of [start, end), if any. */
static bool cpu_maps_gap(const CpuMaps *cm, uint64_t start, uint64_t end, uint64_t *gs, uint64_t *ge)
{
        uint64_t cur = start;

        for (size_t i = 0; i < cm->n && cur < end; i++) {
                if (cm->iv[i][1] <= cur)
                        continue;
                if (cm->iv[i][0] > cur) {
                        *gs = cur;
                        *ge = cm->iv[i][0] < end ? cm->iv[i][0] : end;
                        return true;
                }
                cur = cm->iv[i][1];
        }
        if (cur < end) {
                *gs = cur;
                *ge = end;
                return true;
        }
        return false;
}

static bool cpu_maps_cover(const CpuMaps *cm, uint64_t start, uint64_t end)
{
        uint64_t gs, ge;

        return !cpu_maps_gap(cm, start, end, &gs, &ge);
}

/*
 * Is [start, end) mapped throughout in this process? msync(MS_ASYNC) writes nothing back (a no-op since
 * Linux 2.6.19) but still walks the VMAs of the range and fails with ENOMEM at the first hole: an O(log n)
 * check where reading /proc/self/maps costs O(mappings) and a formatted read of each.
 */
bool model_cpu_range_mapped(uint64_t start, uint64_t end)
{
        return end > start && msync((void *)(uintptr_t)start, end - start, MS_ASYNC) == 0;
}

/* Every SVM range of @c still fully mapped: nothing for the deferred-unmap flush to do. With unmap notices
 * the ranges are kept by thunk_model_munmap(), as the kernel's MMU notifier keeps them, and need no probe. */
static bool svm_all_mapped(const ThunkModel *m, const ModelCtx *c)
{
        if (m->unmap_notices && !m->svm_unnoticed)
                return true;
        for (size_t i = 0; c && i < c->n_svm; i++)
                if (!model_cpu_range_mapped(c->svm[i].start * MODEL_PAGE, (c->svm[i].last + 1) * MODEL_PAGE))
                        return false;
        return true;
}

static void svm_set_defaults(const ThunkModel *m, const ModelCtx *c, SvmRange *r)
{
        r->at = (SvmAttrs){.preferred = KFD_IOCTL_SVM_LOCATION_UNDEFINED,
                           .prefetch = KFD_IOCTL_SVM_LOCATION_UNDEFINED,
                           .granularity = MODEL_SVM_DEFAULT_GRANULARITY,
                           .flags = KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT,
                           .access = c->xnack ? m->svm_supported : 0};
}

static void svm_range_drop_charge(ThunkModel *m, SvmRange *r)
{
        if (r->charged) {
                model_uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, (r->last - r->start + 1) * MODEL_PAGE);
                r->charged = false;
        }
}

/* The primary context's count of ranges, for readers without the lock (thunk_model_peek_stats). */
static void svm_publish(ThunkModel *m, const ModelCtx *c)
{
        if (c->primary)
                __atomic_store_n(&m->cnt.svm_ranges, (uint64_t)c->n_svm, __ATOMIC_RELAXED);
}

void model_svm_release(ThunkModel *m, ModelCtx *c)
{
        for (size_t i = 0; i < c->n_svm; i++)
                svm_range_drop_charge(m, &c->svm[i]);
        c->n_svm = 0;
        svm_publish(m, c);
}

static int svm_insert_at(ModelCtx *c, size_t i, const SvmRange *r)
{
        if (ARRAY_RESERVE(c->svm, c->cap_svm, c->n_svm + 1, 8) < 0)
                return -ENOMEM;
        memmove(&c->svm[i + 1], &c->svm[i], (c->n_svm - i) * sizeof(*c->svm));
        c->svm[i] = *r;
        c->n_svm++;
        return 0;
}

/* Removes the pages [s, l] from every range (what the MMU notifier does on munmap), refunding charges. */
static int svm_remove_pages_of(ThunkModel *m, ModelCtx *c, uint64_t s, uint64_t l)
{
        for (size_t i = 0; i < c->n_svm;) {
                SvmRange *r = &c->svm[i];

                if (r->last < s || r->start > l) {
                        i++;
                        continue;
                }
                if (r->start < s && r->last > l) {
                        SvmRange tail = *r;

                        if (svm_insert_at(c, i + 1, &tail) < 0)
                                return -ENOMEM;
                        r = &c->svm[i];
                        c->svm[i + 1].start = l + 1;
                        r->last = s - 1;
                        if (r->charged)
                                model_uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
                                               (l - s + 1) * MODEL_PAGE);
                        return 0;
                }
                if (r->start >= s && r->last <= l) {
                        svm_range_drop_charge(m, r);
                        memmove(&c->svm[i], &c->svm[i + 1], (c->n_svm - i - 1) * sizeof(*c->svm));
                        c->n_svm--;
                        continue;
                }
                if (r->start < s) {
                        if (r->charged)
                                model_uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
                                               (r->last - s + 1) * MODEL_PAGE);
                        r->last = s - 1;
                } else {
                        if (r->charged)
                                model_uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
                                               (l - r->start + 1) * MODEL_PAGE);
                        r->start = l + 1;
                }
                i++;
        }
        return 0;
}

static int svm_remove_pages(ThunkModel *m, ModelCtx *c, uint64_t s, uint64_t l)
{
        int r = svm_remove_pages_of(m, c, s, l);

        svm_publish(m, c);
        return r;
}

/* The deferred munmap work the kernel flushes before SVM and allocation ioctls: pages no longer mapped
 * in this process leave their ranges. */
static int svm_flush_unmapped(ThunkModel *m, ModelCtx *c, CpuMaps *cm)
{
        if (!c)
                return 0;
        for (size_t i = 0; i < c->n_svm;) {
                SvmRange *r = &c->svm[i];
                uint64_t gs, ge;

                if (!cpu_maps_gap(cm, r->start * MODEL_PAGE, (r->last + 1) * MODEL_PAGE, &gs, &ge)) {
                        i++;
                        continue;
                }
                /* cut the gap out; the array may change, so look at index i again */
                if (svm_remove_pages(m, c, gs / MODEL_PAGE, (ge - 1) / MODEL_PAGE) < 0)
                        return -ENOMEM;
        }
        return 0;
}

int model_svm_flush(ThunkModel *m, ModelCtx *c)
{
        CpuMaps cm = {0};
        int r;

        if (!c || c->n_svm == 0 || svm_all_mapped(m, c))
                return 0;
        r = cpu_maps_load(&cm);
        if (r == 0)
                r = svm_flush_unmapped(m, c, &cm);
        if (r == 0)
                m->svm_unnoticed = false;
        free(cm.iv);
        return r;
}

/* Pages [s, l] lie in @c's SVM ranges throughout (the ranges are sorted and do not overlap). */
static bool svm_covers(const ModelCtx *c, uint64_t s, uint64_t l)
{
        size_t lo = 0, hi = c->n_svm;

        while (lo < hi) { /* the first range that ends at or after s */
                size_t mid = lo + (hi - lo) / 2;
                if (c->svm[mid].last < s)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        for (size_t i = lo; i < c->n_svm && c->svm[i].start <= s; i++) {
                if (c->svm[i].last >= l)
                        return true;
                s = c->svm[i].last + 1;
        }
        return false;
}

int thunk_model_munmap(ThunkModel *m, void *addr, size_t len)
{
        uint64_t va = (uintptr_t)addr;
        ModelCtx **all = NULL;
        size_t n = 0;
        int r = 0;

        model_lock(m);
        /* every context's engines stay out while the pages go: any of them may be reading them (an SVM
         * range, a userptr BO), and a page unmapped under an engine's copy would fault the process. Taken
         * in the list's order, which no call changes for contexts already in it. */
        for (ModelCtx *c = m->ctxs; c; c = c->next)
                n++;
        all = n ? calloc(n, sizeof(*all)) : NULL;
        if (n && !all) {
                model_unlock(m);
                return -ENOMEM;
        }
        n = 0;
        for (ModelCtx *c = m->ctxs; c; c = c->next) {
                all[n++] = c;
                c->refs++;
        }
        model_unlock(m);
        for (size_t i = 0; i < n; i++)
                model_ctx_eng_lock(all[i]);
        model_lock(m);
        if (munmap(addr, len) < 0) {
                r = -errno;
        } else if (len > 0) {
                for (size_t i = 0; i < n; i++)
                        if (all[i]->primary &&
                            svm_remove_pages(m, all[i], va / MODEL_PAGE, (va + len - 1) / MODEL_PAGE) < 0)
                                m->svm_unnoticed = true; /* no room to split a range: the next call probes */
        }
        for (size_t i = n; i-- > 0;)
                model_ctx_leave(m, all[i]);
        model_unlock(m);
        free(all);
        return r;
}

bool model_svm_overlaps(const ModelCtx *c, uint64_t start, uint64_t end)
{
        uint64_t s, l;

        if (!c || end <= start)
                return false;
        s = start / MODEL_PAGE;
        l = (end - 1) / MODEL_PAGE;
        for (size_t i = 0; i < c->n_svm; i++)
                if (c->svm[i].start <= l && c->svm[i].last >= s)
                        return true;
        return false;
}

static int svm_gpuidx(const ThunkModel *m, uint32_t gpu_id)
{
        return model_gpu_index(m, gpu_id);
}

/* A GPU SET_ATTR may name: one of the model's, with the SVM capability. */
static int svm_settable_gpu(void *ctx, uint32_t gpu_id)
{
        const ThunkModel *m = ctx;
        int idx = svm_gpuidx(m, gpu_id);

        return idx >= 0 && (m->svm_supported & (1ULL << idx)) ? idx : -1;
}

static int svm_check_attr(const ThunkModel *m, uint32_t nattr, const struct kfd_ioctl_svm_attribute *a)
{
        return svm_attrs_check(a, nattr, svm_settable_gpu, (void *)m);
}

static int svm_gpuidx_of(void *m, uint32_t gpu_id)
{
        return svm_gpuidx(m, gpu_id);
}

static void svm_apply(const ThunkModel *m, SvmRange *r, uint32_t nattr,
                      const struct kfd_ioctl_svm_attribute *a)
{
        svm_attrs_apply(&r->at, a, nattr, svm_gpuidx_of, (void *)m);
}

/* True if [start, end) overlaps a mapping in any GPU VM of @c (a VM with no mapping is not searched: most
 * of a context's GPUs map nothing of it). */
static bool ctx_vm_overlaps(const ThunkModel *m, const ModelCtx *c, uint64_t start, uint64_t end)
{
        for (size_t g = 0; g < m->n_gpus; g++) {
                const ModelFile *f = c->pdd[g].file;
                if (f && f->vm.n && model_vm_overlaps(&f->vm, start, end))
                        return true;
        }
        return false;
}

/* A new range [@p, @l] with the defaults and then @a's attributes, charged (its pages added to
 * *@charge_pages) unless XNACK is on. */
static SvmRange svm_fresh(const ThunkModel *m, const ModelCtx *c, uint64_t p, uint64_t l, uint32_t nattr,
                          const struct kfd_ioctl_svm_attribute *a, uint64_t *charge_pages)
{
        SvmRange fresh;

        svm_set_defaults(m, c, &fresh);
        fresh.start = p;
        fresh.last = l;
        fresh.charged = !c->xnack;
        *charge_pages += fresh.charged ? l - p + 1 : 0;
        svm_apply(m, &fresh, nattr, a);
        return fresh;
}

static int svm_set(ThunkModel *m, ModelCtx *c, uint64_t s, uint64_t l, uint32_t nattr,
                   const struct kfd_ioctl_svm_attribute *a)
{
        SvmRange *nv;
        size_t n = 0, cap, gaps = 0;
        uint64_t charge_pages = 0;
        uint64_t p = s;

        /* Build the new range list off to the side so that a failure changes nothing: in the spare list,
         * the one the last call replaced (no allocation once it is large enough; every entry used is
         * written whole). */
        for (size_t i = 0; i < c->n_svm; i++)
                if (c->svm[i].start <= l && c->svm[i].last >= s)
                        gaps++;
        cap = c->n_svm + 2 * gaps + 4;
        if (c->cap_svm_spare < cap) {
                nv = malloc(cap * sizeof(*nv));
                if (!nv)
                        return -ENOMEM;
                free(c->svm_spare);
                c->svm_spare = nv;
                c->cap_svm_spare = cap;
        }
        nv = c->svm_spare;
        cap = c->cap_svm_spare;
        for (size_t i = 0; i < c->n_svm; i++) {
                SvmRange r = c->svm[i];

                if (r.last < s || r.start > l) {
                        if (r.start > l && p <= l) {
                                nv[n++] = svm_fresh(m, c, p, l, nattr, a, &charge_pages);
                                p = l + 1;
                        }
                        nv[n++] = r;
                        continue;
                }
                if (r.start < s) { /* head piece keeps its old attributes */
                        SvmRange head = r;

                        head.last = s - 1;
                        nv[n++] = head;
                        r.start = s;
                }
                if (r.start > p) { /* gap before this range */
                        SvmRange fresh;

                        svm_set_defaults(m, c, &fresh);
                        fresh.start = p;
                        fresh.last = r.start - 1;
                        fresh.charged = !c->xnack;
                        charge_pages += fresh.charged ? fresh.last - p + 1 : 0;
                        svm_apply(m, &fresh, nattr, a);
                        nv[n++] = fresh;
                }
                {
                        SvmRange mid = r;
                        SvmRange tail = r;
                        bool has_tail = r.last > l;

                        if (has_tail)
                                mid.last = l;
                        svm_apply(m, &mid, nattr, a);
                        nv[n++] = mid;
                        p = mid.last + 1;
                        if (has_tail) {
                                tail.start = l + 1;
                                nv[n++] = tail;
                        }
                }
        }
        if (p <= l && p >= s)
                nv[n++] = svm_fresh(m, c, p, l, nattr, a, &charge_pages);
        if (charge_pages &&
            model_charge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, charge_pages * MODEL_PAGE) < 0)
                return -ENOMEM; /* the spare holds what was built; the ranges are as they were */
        c->svm_spare = c->svm;
        c->cap_svm_spare = c->cap_svm;
        c->svm = nv;
        c->n_svm = n;
        c->cap_svm = cap;
        svm_publish(m, c);
        return 0;
}

static void svm_get(const ThunkModel *m, const ModelCtx *c, uint64_t s, uint64_t l, uint32_t nattr,
                    struct kfd_ioctl_svm_attribute *a)
{
        SvmMerge mg = {0};
        SvmRange d;

        for (size_t i = 0; i < c->n_svm; i++)
                if (c->svm[i].last >= s && c->svm[i].start <= l)
                        svm_merge_add(&mg, &c->svm[i].at);
        svm_set_defaults(m, c, &d);
        svm_merge_answer(&mg, &d.at, a, nattr, svm_gpuidx_of, (void *)m);
}

/* ------------------------------------------------------------------ SVM ioctls */

int model_kfd_svm(Call *c)
{
        struct kfd_ioctl_svm_args *a = c->arg;
        ThunkModel *m = c->m;
        uint64_t s, l;
        CpuMaps cm = {0};
        int r;

        if (!c->ctx->primary)
                return -EOPNOTSUPP;
        if (c->usize < sizeof(*a) + (size_t)a->nattr * sizeof(a->attrs[0]))
                return -EINVAL;
        if (!a->start_addr || !a->size || (a->start_addr & (MODEL_PAGE - 1)) || (a->size & (MODEL_PAGE - 1)))
                return -EINVAL;
        if (a->start_addr + a->size < a->start_addr)
                return -EOVERFLOW;
        if (a->op != KFD_IOCTL_SVM_OP_SET_ATTR && a->op != KFD_IOCTL_SVM_OP_GET_ATTR)
                return -EINVAL;
        s = a->start_addr / MODEL_PAGE;
        l = s + a->size / MODEL_PAGE - 1;
        if (a->op == KFD_IOCTL_SVM_OP_SET_ATTR) {
                r = svm_check_attr(m, a->nattr, a->attrs);
                if (r < 0)
                        return r;
        }
        /*
         * The common case, everything still mapped, needs no walk of /proc/self/maps. With unmap notices a
         * range the SVM ranges cover is mapped (an unmap would have cut it out of them): no probe at all.
         */
        if (!(m->unmap_notices && !m->svm_unnoticed && svm_covers(c->ctx, s, l)) &&
            (!model_cpu_range_mapped(a->start_addr, a->start_addr + a->size) || !svm_all_mapped(m, c->ctx))) {
                r = cpu_maps_load(&cm);
                if (r == 0)
                        r = svm_flush_unmapped(m, c->ctx, &cm);
                if (r == 0)
                        m->svm_unnoticed = false;
                if (r == 0 && !cpu_maps_cover(&cm, a->start_addr, a->start_addr + a->size))
                        r = -EFAULT;
                free(cm.iv);
                if (r < 0)
                        return r;
        }
        /* svm_range_is_valid(), for GET as for SET: no BO may be mapped in the range */
        if (ctx_vm_overlaps(m, c->ctx, a->start_addr, a->start_addr + a->size))
                return -EADDRINUSE;
        if (a->op == KFD_IOCTL_SVM_OP_SET_ATTR)
                return svm_set(m, c->ctx, s, l, a->nattr, a->attrs);
        /* GET checks its attributes only once the range is known valid (svm_range_get_attr) */
        for (uint32_t i = 0; i < a->nattr; i++) {
                switch (a->attrs[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                        if (svm_gpuidx(m, a->attrs[i].value) < 0)
                                return -EINVAL;
                        break;
                default:
                        return -EINVAL;
                }
        }
        svm_get(m, c->ctx, s, l, a->nattr, a->attrs);
        return 0;
}

int model_kfd_set_xnack_mode(Call *c)
{
        struct kfd_ioctl_set_xnack_mode_args *a = c->arg;
        ThunkModel *m = c->m;
        ModelCtx *ctx = c->ctx;
        bool on = a->xnack_enabled > 0;

        if (a->xnack_enabled < 0) {
                a->xnack_enabled = ctx->xnack;
                return 0;
        }
        /* kfd_ioctl_set_xnack_mode(): queues first, then "already so", and only then "cannot" */
        if (ctx->n_queues)
                return -EBUSY;
        if (on == ctx->xnack)
                return 0;
        if (!m->svm_supported)
                return -EPERM;
        if (on) {
                for (size_t g = 0; g < m->n_gpus; g++)
                        if (!m->gpus[g].xnack_capable)
                                return -EPERM;
                for (size_t i = 0; i < ctx->n_svm; i++)
                        svm_range_drop_charge(m, &ctx->svm[i]);
        } else {
                uint64_t pages = 0;

                for (size_t i = 0; i < ctx->n_svm; i++)
                        pages += ctx->svm[i].last - ctx->svm[i].start + 1;
                if (pages && model_charge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, pages * MODEL_PAGE) < 0)
                        return -ENOMEM;
                for (size_t i = 0; i < ctx->n_svm; i++)
                        ctx->svm[i].charged = true;
        }
        ctx->xnack = on;
        return 0;
}
