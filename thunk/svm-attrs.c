/* SVM attributes of runs of pages: applying SET_ATTR's to one, answering GET_ATTR over several. */
#include "svm-attrs.h"

#include <errno.h>

int svm_attrs_check(const struct kfd_ioctl_svm_attribute *a, uint32_t n, SvmGpuIndexFn gpu_index, void *ctx)
{
        for (uint32_t i = 0; i < n; i++) {
                uint32_t v = a[i].value;

                switch (a[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                        /* a GPU, system memory, or (the preferred one only) no location */
                        if (v == KFD_IOCTL_SVM_LOCATION_UNDEFINED &&
                            a[i].type == KFD_IOCTL_SVM_ATTR_PREFERRED_LOC)
                                break;
                        if (v != KFD_IOCTL_SVM_LOCATION_SYSMEM && gpu_index(ctx, v) < 0)
                                return -EINVAL;
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                case KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE:
                case KFD_IOCTL_SVM_ATTR_NO_ACCESS:
                        if (gpu_index(ctx, v) < 0)
                                return -EINVAL;
                        break;
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        break;
                default:
                        return -EINVAL;
                }
        }
        return 0;
}

void svm_attrs_apply(SvmAttrs *r, const struct kfd_ioctl_svm_attribute *a, uint32_t n,
                     SvmGpuIndexFn gpu_index, void *ctx)
{
        for (uint32_t i = 0; i < n; i++) {
                uint32_t v = a[i].value;
                uint64_t bit;

                switch (a[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                        r->preferred = v;
                        break;
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                        r->prefetch = v;
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                case KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE:
                case KFD_IOCTL_SVM_ATTR_NO_ACCESS:
                        bit = 1ULL << gpu_index(ctx, v);
                        r->access = (r->access & ~bit) | (a[i].type == KFD_IOCTL_SVM_ATTR_ACCESS ? bit : 0);
                        r->in_place = (r->in_place & ~bit) |
                                      (a[i].type == KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE ? bit : 0);
                        break;
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                        r->flags |= v;
                        break;
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                        r->flags &= ~v;
                        break;
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        r->granularity = v < 0x3F ? v : 0x3F;
                        break;
                default:
                        break;
                }
        }
}

void svm_merge_add(SvmMerge *m, const SvmAttrs *r)
{
        if (!m->any) {
                *m = (SvmMerge){.any = true,
                                .preferred = r->preferred,
                                .prefetch = r->prefetch,
                                .granularity = r->granularity,
                                .flags_and = r->flags,
                                .flags_or = r->flags,
                                .access = r->access,
                                .in_place = r->in_place};
                return;
        }
        if (m->preferred != r->preferred)
                m->preferred = KFD_IOCTL_SVM_LOCATION_UNDEFINED;
        if (m->prefetch != r->prefetch)
                m->prefetch = KFD_IOCTL_SVM_LOCATION_UNDEFINED;
        if (r->granularity < m->granularity)
                m->granularity = r->granularity;
        m->flags_and &= r->flags;
        m->flags_or |= r->flags;
        m->access &= r->access;
        m->in_place &= r->in_place;
}

void svm_merge_answer(const SvmMerge *m, const SvmAttrs *defaults, struct kfd_ioctl_svm_attribute *a,
                      uint32_t n, SvmGpuIndexFn gpu_index, void *ctx)
{
        SvmMerge d = *m;

        if (!d.any) {
                svm_merge_add(&d, defaults);
                d.in_place = 0;
        }
        for (uint32_t i = 0; i < n; i++) {
                uint64_t bit;

                switch (a[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                        a[i].value = d.preferred;
                        break;
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                        a[i].value = d.prefetch;
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                        bit = 1ULL << gpu_index(ctx, a[i].value);
                        a[i].type = (d.access & bit)     ? KFD_IOCTL_SVM_ATTR_ACCESS
                                    : (d.in_place & bit) ? KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE
                                                         : KFD_IOCTL_SVM_ATTR_NO_ACCESS;
                        break;
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                        a[i].value = d.flags_and;
                        break;
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                        a[i].value = ~d.flags_or;
                        break;
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        a[i].value = d.granularity;
                        break;
                default:
                        break;
                }
        }
}
