/* The SVM attributes of a client-side KFD's ranges, kept as KFD keeps them (split on set, merged on get). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "svm-attrs.h"

/* One run of pages with the same attributes. */
typedef struct SvmRun {
        uint64_t first, last; /* pages, inclusive */
        SvmAttrs at;
} SvmRun;

typedef struct SvmBook {
        SvmRun *runs; /* sorted, never overlapping */
        size_t n, cap;
        uint64_t default_access; /* what a fresh run may reach (every SVM GPU with XNACK on; none off) */
} SvmBook;

/* @gpu_index: the index of a gpu_id, or -1 for one the caller does not know. */
typedef int (*SvmGpuIndex)(uint32_t gpu_id);

/*
 * SET_ATTR over pages [first, last]: every attribute checked before anything changes (-EINVAL: an unknown
 * type, location or GPU); then the runs there are split at its ends, the gaps filled with the defaults,
 * and the attributes applied. -ENOMEM changes nothing.
 */
int svm_book_set(SvmBook *b, uint64_t first, uint64_t last, const struct kfd_ioctl_svm_attribute *at,
                 uint32_t n, SvmGpuIndex gpu_index);
/* GET_ATTR over pages [first, last], KFD's answers in place (-EINVAL: an unknown type or GPU). */
int svm_book_get(const SvmBook *b, uint64_t first, uint64_t last, struct kfd_ioctl_svm_attribute *at,
                 uint32_t n, SvmGpuIndex gpu_index);
/* The pages [first, last] are gone (unmapped): their attributes go with them. -ENOMEM: kept. */
int svm_book_drop(SvmBook *b, uint64_t first, uint64_t last);
void svm_book_free(SvmBook *b);
