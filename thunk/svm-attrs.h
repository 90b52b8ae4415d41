/* SVM attributes as KFD keeps them for a run of pages, and as it answers them over several runs: the one
 * rule for the model's SVM and the client-side KFD's. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kfd-compat.h"

/* A run's attributes; access bits are indices into the caller's GPUs. */
typedef struct SvmAttrs {
        uint32_t preferred, prefetch; /* a gpu_id, KFD_IOCTL_SVM_LOCATION_SYSMEM or _UNDEFINED */
        uint32_t flags;               /* KFD_IOCTL_SVM_FLAG_* */
        uint32_t granularity;         /* log2 of pages, at most 0x3f */
        uint64_t access, in_place;    /* one kind of access per GPU (neither: no access) */
} SvmAttrs;

/* The index of @gpu_id among the caller's GPUs; called only for ids the caller's checks let through. */
typedef int (*SvmGpuIndexFn)(void *ctx, uint32_t gpu_id);

/* SET_ATTR's attributes, checked before any is applied: -EINVAL for an unknown type, a location that is no
 * GPU @gpu_index knows (but SYSMEM, and UNDEFINED for the preferred one), or such a GPU in an access
 * attribute. @gpu_index answers -1 for a GPU that may not be named. */
int svm_attrs_check(const struct kfd_ioctl_svm_attribute *a, uint32_t n, SvmGpuIndexFn gpu_index, void *ctx);

/* SET_ATTR's attributes onto one run (already checked). */
void svm_attrs_apply(SvmAttrs *r, const struct kfd_ioctl_svm_attribute *a, uint32_t n,
                     SvmGpuIndexFn gpu_index, void *ctx);

/* GET_ATTR over several runs: add each run that intersects, then answer. */
typedef struct SvmMerge {
        bool any;
        uint32_t preferred, prefetch, granularity, flags_and, flags_or;
        uint64_t access, in_place;
} SvmMerge;

void svm_merge_add(SvmMerge *m, const SvmAttrs *r);
/* The answers in place: locations that differ are undefined, SET_FLAGS those all hold, CLR_FLAGS those none
 * holds, the finest granularity, ACCESS's type the kind of access all give the GPU named; no run added:
 * @defaults (with no in-place access). */
void svm_merge_answer(const SvmMerge *m, const SvmAttrs *defaults, struct kfd_ioctl_svm_attribute *a,
                      uint32_t n, SvmGpuIndexFn gpu_index, void *ctx);
