/* The SVM attribute book of the client-side KFD: runs of pages, split where a call begins or ends. */
#include "svm-book.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_GRANULARITY 9 /* 2 MiB, as KFD starts every range */

static SvmRun fresh(const SvmBook *b, uint64_t first, uint64_t last)
{
        return (SvmRun){.first = first,
                        .last = last,
                        .at = {.preferred = KFD_IOCTL_SVM_LOCATION_UNDEFINED,
                               .prefetch = KFD_IOCTL_SVM_LOCATION_UNDEFINED,
                               .flags = KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT,
                               .granularity = DEFAULT_GRANULARITY,
                               .access = b->default_access}};
}

/* The caller's GPU index, through the shared rule's context argument. */
typedef struct IndexCtx {
        SvmGpuIndex fn;
} IndexCtx;

static int index_of(void *ctx, uint32_t gpu_id)
{
        return ((IndexCtx *)ctx)->fn(gpu_id);
}

/* SET's attributes by the shared rule; a GET names a GPU with ACCESS alone, and asks for known types. */
static int check(const struct kfd_ioctl_svm_attribute *at, uint32_t n, SvmGpuIndex gpu_index, bool set)
{
        IndexCtx ix = {gpu_index};

        if (set)
                return svm_attrs_check(at, n, index_of, &ix);
        for (uint32_t i = 0; i < n; i++) {
                if (at[i].type > KFD_IOCTL_SVM_ATTR_GRANULARITY ||
                    at[i].type == KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE ||
                    at[i].type == KFD_IOCTL_SVM_ATTR_NO_ACCESS)
                        return -EINVAL;
                if (at[i].type == KFD_IOCTL_SVM_ATTR_ACCESS && gpu_index(at[i].value) < 0)
                        return -EINVAL;
        }
        return 0;
}

static void apply(SvmRun *r, const struct kfd_ioctl_svm_attribute *at, uint32_t n, SvmGpuIndex gpu_index)
{
        IndexCtx ix = {gpu_index};

        svm_attrs_apply(&r->at, at, n, index_of, &ix);
}

/*
 * The book as it is outside [first, last], with what is inside replaced by @fill(...) for each page run of
 * it (old runs clipped, gaps fresh); @keep_inside false drops it instead. Built aside, installed whole.
 */
static int rebuild(SvmBook *b, uint64_t first, uint64_t last, bool keep_inside,
                   const struct kfd_ioctl_svm_attribute *at, uint32_t n, SvmGpuIndex gpu_index)
{
        size_t cap = b->n * 2 + 3, k = 0;
        SvmRun *out = malloc(cap * sizeof(*out));
        uint64_t next = first; /* the first page inside not yet covered */

        if (!out)
                return -ENOMEM;
        for (size_t i = 0; i < b->n; i++) {
                SvmRun r = b->runs[i];
                if (r.last < first || r.first > last) {
                        if (r.first > last && keep_inside && next <= last) {
                                SvmRun g = fresh(b, next, last);
                                apply(&g, at, n, gpu_index);
                                out[k++] = g;
                                next = last + 1;
                        }
                        out[k++] = r;
                        continue;
                }
                if (r.first < first) { /* the part before stays as it was */
                        SvmRun head = r;
                        head.last = first - 1;
                        out[k++] = head;
                }
                if (keep_inside) {
                        uint64_t lo = r.first > first ? r.first : first, hi = r.last < last ? r.last : last;
                        if (next < lo) { /* a gap before it: fresh */
                                SvmRun g = fresh(b, next, lo - 1);
                                apply(&g, at, n, gpu_index);
                                out[k++] = g;
                        }
                        SvmRun mid = r;
                        mid.first = lo;
                        mid.last = hi;
                        apply(&mid, at, n, gpu_index);
                        out[k++] = mid;
                        next = hi + 1;
                }
                if (r.last > last) { /* the part after stays as it was */
                        SvmRun tail = r;
                        tail.first = last + 1;
                        out[k++] = tail;
                }
        }
        if (keep_inside && next <= last) {
                SvmRun g = fresh(b, next, last);
                apply(&g, at, n, gpu_index);
                out[k++] = g;
        }
        free(b->runs);
        b->runs = out;
        b->n = k;
        b->cap = cap;
        return 0;
}

int svm_book_set(SvmBook *b, uint64_t first, uint64_t last, const struct kfd_ioctl_svm_attribute *at,
                 uint32_t n, SvmGpuIndex gpu_index)
{
        int r = check(at, n, gpu_index, true);

        return r < 0 ? r : rebuild(b, first, last, true, at, n, gpu_index);
}

int svm_book_drop(SvmBook *b, uint64_t first, uint64_t last)
{
        return rebuild(b, first, last, false, NULL, 0, NULL);
}

int svm_book_get(const SvmBook *b, uint64_t first, uint64_t last, struct kfd_ioctl_svm_attribute *at,
                 uint32_t n, SvmGpuIndex gpu_index)
{
        SvmRun d = fresh(b, first, last);
        IndexCtx ix = {gpu_index};
        SvmMerge m = {0};
        int r = check(at, n, gpu_index, false);

        if (r < 0)
                return r;
        for (size_t i = 0; i < b->n; i++)
                if (b->runs[i].last >= first && b->runs[i].first <= last)
                        svm_merge_add(&m, &b->runs[i].at);
        svm_merge_answer(&m, &d.at, at, n, index_of, &ix);
        return 0;
}

void svm_book_free(SvmBook *b)
{
        free(b->runs);
        memset(b, 0, sizeof(*b));
}
