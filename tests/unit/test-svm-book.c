/* The client-side KFD's SVM attribute book: KFD's splitting on set, merging on get, dropping on unmap. */
#include <errno.h>
#include <stdlib.h>

#include "../common/check.h"
#include "svm-book.h"

#define GPU_A 0x1111
#define GPU_B 0x2222

static int gpu_index(uint32_t gpu_id)
{
        return gpu_id == GPU_A ? 0 : gpu_id == GPU_B ? 1 : -1;
}

static uint32_t get1(const SvmBook *b, uint64_t first, uint64_t last, uint32_t type, uint32_t value)
{
        struct kfd_ioctl_svm_attribute a = {type, value};
        CHECK_EQ(svm_book_get(b, first, last, &a, 1, gpu_index), 0);
        return type == KFD_IOCTL_SVM_ATTR_ACCESS ? a.type : a.value;
}

static void test_defaults_and_split(void)
{
        SvmBook b = {0};
        struct kfd_ioctl_svm_attribute pref_a = {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, GPU_A},
                                       pref_b = {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, GPU_B};

        /* nothing set: KFD's defaults */
        CHECK_EQ(get1(&b, 0, 9, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        CHECK_EQ(get1(&b, 0, 9, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0), 9);
        CHECK_EQ(get1(&b, 0, 9, KFD_IOCTL_SVM_ATTR_ACCESS, GPU_A), KFD_IOCTL_SVM_ATTR_NO_ACCESS);
        CHECK_EQ(svm_book_set(&b, 0, 9, &pref_a, 1, gpu_index), 0);
        CHECK_EQ(svm_book_set(&b, 3, 5, &pref_b, 1, gpu_index), 0);
        CHECK_EQ(b.n, 3);
        /* a location that differs over the range is undefined; each part keeps its own */
        CHECK_EQ(get1(&b, 0, 9, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        CHECK_EQ(get1(&b, 3, 5, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), GPU_B);
        CHECK_EQ(get1(&b, 6, 9, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), GPU_A);
        /* a set over a gap and a run: the gap starts from the defaults */
        CHECK_EQ(svm_book_set(&b, 8, 14, &(struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_GRANULARITY, 4},
                              1, gpu_index),
                 0);
        CHECK_EQ(get1(&b, 12, 14, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        CHECK_EQ(get1(&b, 8, 9, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), GPU_A);
        CHECK_EQ(get1(&b, 0, 14, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0), 4); /* the finest */
        svm_book_free(&b);
}

static void test_flags_and_access(void)
{
        SvmBook b = {0};
        const struct kfd_ioctl_svm_attribute set[] = {
                {KFD_IOCTL_SVM_ATTR_ACCESS, GPU_A},
                {KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, GPU_B},
                {KFD_IOCTL_SVM_ATTR_SET_FLAGS, KFD_IOCTL_SVM_FLAG_GPU_RO}};

        CHECK_EQ(svm_book_set(&b, 0, 3, set, 3, gpu_index), 0);
        CHECK_EQ(get1(&b, 0, 3, KFD_IOCTL_SVM_ATTR_ACCESS, GPU_A), KFD_IOCTL_SVM_ATTR_ACCESS);
        CHECK_EQ(get1(&b, 0, 3, KFD_IOCTL_SVM_ATTR_ACCESS, GPU_B), KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE);
        /* one kind of access per GPU: NO_ACCESS takes the in-place one away */
        CHECK_EQ(svm_book_set(&b, 2, 3,
                              &(struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_NO_ACCESS, GPU_B}, 1,
                              gpu_index),
                 0);
        CHECK_EQ(get1(&b, 2, 3, KFD_IOCTL_SVM_ATTR_ACCESS, GPU_B), KFD_IOCTL_SVM_ATTR_NO_ACCESS);
        CHECK_EQ(get1(&b, 0, 3, KFD_IOCTL_SVM_ATTR_ACCESS, GPU_B), KFD_IOCTL_SVM_ATTR_NO_ACCESS);
        /* flags: SET_FLAGS answers those every part holds, CLR_FLAGS those none does */
        CHECK_EQ(svm_book_set(&b, 0, 1,
                              &(struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_CLR_FLAGS,
                                                                KFD_IOCTL_SVM_FLAG_GPU_RO},
                              1, gpu_index),
                 0);
        uint32_t all = get1(&b, 0, 3, KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0),
                 none = get1(&b, 0, 3, KFD_IOCTL_SVM_ATTR_CLR_FLAGS, 0);
        CHECK(!(all & KFD_IOCTL_SVM_FLAG_GPU_RO) && (all & KFD_IOCTL_SVM_FLAG_HOST_ACCESS));
        CHECK(!(none & KFD_IOCTL_SVM_FLAG_GPU_RO) && !(none & KFD_IOCTL_SVM_FLAG_COHERENT));
        svm_book_free(&b);
}

static void test_refusals_and_drop(void)
{
        SvmBook b = {0};
        struct kfd_ioctl_svm_attribute pref = {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, GPU_A};
        const struct kfd_ioctl_svm_attribute bad[] = {{KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, GPU_B},
                                                      {KFD_IOCTL_SVM_ATTR_ACCESS, 0x9999}};
        struct kfd_ioctl_svm_attribute q = {KFD_IOCTL_SVM_ATTR_NO_ACCESS, GPU_A};

        CHECK_EQ(svm_book_set(&b, 0, 7, &pref, 1, gpu_index), 0);
        /* one bad attribute: nothing of the call is applied */
        CHECK_EQ(svm_book_set(&b, 0, 7, bad, 2, gpu_index), -EINVAL);
        CHECK_EQ(get1(&b, 0, 7, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), GPU_A);
        CHECK_EQ(svm_book_set(&b, 0, 7, &(struct kfd_ioctl_svm_attribute){99, 0}, 1, gpu_index), -EINVAL);
        /* a query names a GPU with ACCESS */
        CHECK_EQ(svm_book_get(&b, 0, 7, &q, 1, gpu_index), -EINVAL);
        /* unmapped pages lose their attributes; the rest keep theirs */
        CHECK_EQ(svm_book_drop(&b, 2, 4), 0);
        CHECK_EQ(get1(&b, 2, 4, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        CHECK_EQ(get1(&b, 5, 7, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), GPU_A);
        CHECK_EQ(get1(&b, 0, 1, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0), GPU_A);
        CHECK_EQ(b.n, 2);
        CHECK_EQ(svm_book_drop(&b, 0, 100), 0);
        CHECK_EQ(b.n, 0);
        svm_book_free(&b);
}

int main(void)
{
        static const TestCase cases[] = {
                {"defaults, and runs split where a set begins or ends", test_defaults_and_split},
                {"access per GPU and flags, merged as KFD answers them", test_flags_and_access},
                {"a bad attribute changes nothing; unmapped pages lose theirs", test_refusals_and_drop},
        };
        return run_tests(cases, sizeof(cases) / sizeof(cases[0]));
}
