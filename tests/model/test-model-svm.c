/* Tests of the KFD model's SVM: ranges and their attributes, the limits they are charged to, XNACK. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "model-fixture.h"

static int svm_get1(Fx *f, uint64_t start, uint64_t size, uint32_t type, uint32_t value, uint32_t *ret_type,
                    uint32_t *ret_value)
{
        struct kfd_ioctl_svm_attribute at = {type, value};
        int r = svm_call(f, f->kfd, KFD_IOCTL_SVM_OP_GET_ATTR, start, size, &at, 1);

        if (ret_type)
                *ret_type = at.type;
        if (ret_value)
                *ret_value = at.value;
        return r;
}

/* The model holds no SVM range any more, nor system memory charged for one. */
static bool svm_gone(Fx *f)
{
        ThunkModelStats s;

        thunk_model_get_stats(f->m, &s);
        return s.svm_ranges == 0 && s.system_used == 0;
}

int test_svm(void)
{
        Fx f;
        const size_t len = 64 * PAGE;
        unsigned char *p;
        uint64_t base;
        uint32_t t, v;
        ThunkModelStats s;
        struct kfd_ioctl_svm_attribute at[4];

        REQUIRE_RC(fx_setup(&f, 19), 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        base = (uintptr_t)p;

        /* defaults before any range exists (XNACK off: no access) */
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, &v), 0);
        REQUIRE(v == KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0, NULL, &v), 0);
        REQUIRE(v == (KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT));
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, &v), 0);
        REQUIRE(v == 9);
        REQUIRE_RC(svm_get1(&f, base, len, KFD_IOCTL_SVM_ATTR_ACCESS, G0, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_NO_ACCESS);

        /* one range over 16 pages; XNACK off charges the system limit */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, G0};
        at[1] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_ACCESS, G1};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base + 8 * PAGE, 16 * PAGE, at, 2), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 1 && s.system_used == 16 * PAGE);
        /* a second set from page 12 to 30: [8,12) keeps the old attributes, [12,24) changes, [24,30) is new
         */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, G1};
        at[1] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_SET_FLAGS, KFD_IOCTL_SVM_FLAG_GPU_RO};
        at[2] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_GRANULARITY, 2};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base + 12 * PAGE, 18 * PAGE, at, 3), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 3 && s.system_used == 22 * PAGE);
        REQUIRE_RC(svm_get1(&f, base + 12 * PAGE, 8 * PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE);
        REQUIRE_RC(svm_get1(&f, base + 8 * PAGE, 4 * PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS);
        REQUIRE_RC(svm_get1(&f, base + 20 * PAGE, 4 * PAGE, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, &v),
                   0);
        REQUIRE(v == G0);
        /* GET over mixed ranges: locations differ -> UNDEFINED, flags AND / NOT-OR, granularity min */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0};
        at[1] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
        at[2] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_CLR_FLAGS, 0};
        at[3] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_GRANULARITY, 0};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_GET_ATTR, base + 8 * PAGE, 22 * PAGE, at, 4), 0);
        REQUIRE(at[0].value == KFD_IOCTL_SVM_LOCATION_UNDEFINED);
        REQUIRE(at[1].value == (KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT));
        REQUIRE(at[2].value == ~(uint32_t)(KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT |
                                           KFD_IOCTL_SVM_FLAG_GPU_RO));
        REQUIRE(at[3].value == 2);
        REQUIRE_RC(svm_get1(&f, base + 8 * PAGE, 22 * PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_NO_ACCESS); /* neither bit set on every range */

        /* attribute validation */
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_ACCESS, 0x7777};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base, PAGE, at, 1), -EINVAL);
        at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFETCH_LOC,
                                                 KFD_IOCTL_SVM_LOCATION_UNDEFINED};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base, PAGE, at, 1), -EINVAL);
        at[0] = (struct kfd_ioctl_svm_attribute){99, 0};
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base, PAGE, at, 1), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, G0, NULL, NULL), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, PAGE, KFD_IOCTL_SVM_ATTR_NO_ACCESS, G0, NULL, NULL), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, 0x7777, NULL, NULL), -EINVAL);
        /* range validation */
        REQUIRE_RC(svm_get1(&f, base + 1, PAGE, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, NULL), -EINVAL);
        REQUIRE_RC(svm_get1(&f, base, 0, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, NULL), -EINVAL);
        REQUIRE_RC(
                svm_get1(&f, base, len + 1024 * PAGE * 1024, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL, NULL),
                -EFAULT);
        /* GET checks the range before its attributes (SET the other way round) */
        REQUIRE_RC(svm_get1(&f, base, len + 1024 * PAGE * 1024, KFD_IOCTL_SVM_ATTR_NO_ACCESS, G0, NULL, NULL),
                   -EFAULT);
        {
                struct kfd_ioctl_svm_args a = {.start_addr = base, .size = PAGE, .op = 7};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SVM, &a), -EINVAL);
                a.op = KFD_IOCTL_SVM_OP_GET_ATTR;
                a.nattr = 1; /* claims an attribute the size field does not carry */
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SVM, &a), -EINVAL);
        }
        /* SVM and KFD BOs exclude each other */
        {
                uint64_t h = 0;
                uint32_t ids[] = {G0};

                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, base + 10 * PAGE, PAGE, VRAM_RW, &h, NULL), -EADDRINUSE);
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, base + 40 * PAGE, PAGE, VRAM_RW, &h, NULL), 0);
                REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 1, NULL), 0);
                at[0] = (struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, base + 36 * PAGE, 8 * PAGE, at, 1),
                           -EADDRINUSE);
                /* and GET refuses the range as SET does */
                REQUIRE_RC(svm_get1(&f, base + 36 * PAGE, 8 * PAGE, KFD_IOCTL_SVM_ATTR_GRANULARITY, 0, NULL,
                                    NULL),
                           -EADDRINUSE);
                REQUIRE_RC(svm_get1(&f, base + 36 * PAGE, 8 * PAGE, KFD_IOCTL_SVM_ATTR_NO_ACCESS, G0, NULL,
                                    NULL),
                           -EADDRINUSE);
                REQUIRE_RC(map_bo(&f, f.kfd, false, h, ids, 1, NULL), 0);
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        }
        /* munmap of part of a range splits it and refunds the charge */
        REQUIRE(munmap(p + 14 * PAGE, 2 * PAGE) == 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == 4 && s.system_used == 20 * PAGE);
        REQUIRE(munmap(p, len) == 0);
        REQUIRE(svm_gone(&f));
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_svm_limits(void)
{
        Fx f;
        const size_t len = 8 * PAGE;
        unsigned char *p;
        struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};

        /* the system-memory option: 2 GiB of RAM leave (2 GiB - 32 MiB) / 2 for KFD */
        {
                ThunkTopology *t = topo_make(1, std_gpus, 64 * GiB);
                ThunkModelOptions o = {.system_memory_bytes = 2 * GiB};
                ThunkModel *m = NULL;
                ThunkSeam seam;
                int kfd, render;
                struct kfd_ioctl_acquire_vm_args acq = {.gpu_id = G0};
                struct kfd_ioctl_alloc_memory_of_gpu_args al = {
                        .va_addr = 0x100000, .gpu_id = G0, .flags = GTT_RW};

                REQUIRE_RC(thunk_model_new(t, &o, &m), 0);
                topo_free(t);
                thunk_model_seam(m, &seam);
                REQUIRE_RC(seam.ops->open_kfd(seam.impl, &kfd), 0);
                REQUIRE_RC(seam.ops->open_render(seam.impl, 128, &render), 0);
                acq.drm_fd = (uint32_t)render;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ACQUIRE_VM, &acq), 0);
                al.size = (2 * GiB - (2 * GiB >> 6)) / 2 + PAGE;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), -ENOMEM);
                al.size -= PAGE;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), 0);
                thunk_model_free(m);
        }
        REQUIRE_RC(fx_setup(&f, 19), 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        REQUIRE(p != MAP_FAILED);
        {
                uint64_t big = 63 * GiB;
                void *q = mmap(NULL, big, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

                REQUIRE(q != MAP_FAILED);
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)q, big, &at, 1),
                           -ENOMEM);
                REQUIRE(svm_gone(&f));
                REQUIRE(munmap(q, big) == 0);
        }
        REQUIRE(munmap(p, len) == 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/*
 * A process that unmaps through the seam (ThunkModelOptions.unmap_notices): the munmap cuts the pages out of
 * the ranges and refunds them, as the kernel's MMU notifier does, and SVM calls trust the ranges rather
 * than probing each one's mapping. A plain munmap is then not seen until the process says so, which is
 * what shows that nothing was probed.
 */
int test_svm_unmap_notices(void)
{
        ThunkModelOptions o = {.kfd_minor = 19, .unmap_notices = true};
        enum { N = 64 };
        const size_t len = 32 * PAGE;
        struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, G0};
        unsigned char *p, *q[N];
        ThunkModelStats s;
        uint32_t v;
        Fx f;

        REQUIRE_RC(fx_setup_opts(&f, topo_make(3, std_gpus, 64 * GiB), &o, true), 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        /* a range over mapped pages is made after a probe, as without notices */
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)p, len, &at, 1), 0);
        for (int i = 0; i < N; i++) {
                q[i] = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                REQUIRE(q[i] != MAP_FAILED);
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)q[i], 2 * PAGE, &at, 1),
                           0);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == N + 1 && s.system_used == len + N * 2 * PAGE);

        /* an unmap through the seam splits the range and refunds its pages */
        REQUIRE_RC(f.seam.ops->munmap(f.seam.impl, p + 4 * PAGE, 2 * PAGE), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == N + 2 && s.system_used == len - 2 * PAGE + N * 2 * PAGE);
        /* the hole is not mapped: a call over it probes and fails as the kernel's does */
        REQUIRE_RC(svm_get1(&f, (uintptr_t)p, len, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, NULL), -EFAULT);
        REQUIRE_RC(svm_get1(&f, (uintptr_t)p, 4 * PAGE, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, &v), 0);
        REQUIRE(v == G0);

        /* a plain munmap of a range is not seen: the calls trusted the ranges and probed none */
        REQUIRE(munmap(q[0], 2 * PAGE) == 0);
        REQUIRE_RC(svm_get1(&f, (uintptr_t)q[0], 2 * PAGE, KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0, NULL, &v), 0);
        REQUIRE(v == G0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == N + 2);
        /* told now (the pages are gone already: munmap of nothing succeeds), the range goes */
        REQUIRE_RC(f.seam.ops->munmap(f.seam.impl, q[0], 2 * PAGE), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == N + 1);

        /* bad input changes nothing */
        REQUIRE_RC(f.seam.ops->munmap(f.seam.impl, p + 1, PAGE), -EINVAL);
        REQUIRE_RC(f.seam.ops->munmap(f.seam.impl, p, 0), -EINVAL);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.svm_ranges == N + 1);

        for (int i = 1; i < N; i++)
                REQUIRE_RC(f.seam.ops->munmap(f.seam.impl, q[i], 2 * PAGE), 0);
        REQUIRE_RC(f.seam.ops->munmap(f.seam.impl, p, len), 0);
        REQUIRE(svm_gone(&f));
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_xnack(void)
{
        Fx f;
        struct kfd_ioctl_set_xnack_mode_args x = {-1};
        const size_t len = 4 * PAGE;
        unsigned char *p;
        ThunkModelStats s;
        struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
        uint32_t t;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        REQUIRE(x.xnack_enabled == 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)p, len, &at, 1), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == len);
        /* XNACK on: charges go away, new defaults grant access */
        x.xnack_enabled = 1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == 0);
        REQUIRE_RC(svm_get1(&f, PAGE, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G0, &t, NULL), -EFAULT);
        REQUIRE_RC(svm_get1(&f, (uintptr_t)p, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G0, &t, NULL), 0);
        REQUIRE(t == KFD_IOCTL_SVM_ATTR_NO_ACCESS); /* an existing range keeps what it had */
        {
                void *q = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

                REQUIRE(q != MAP_FAILED);
                REQUIRE_RC(svm_get1(&f, (uintptr_t)q, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G2, &t, NULL), 0);
                REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS); /* defaults under XNACK: every SVM GPU */
                REQUIRE_RC(svm_call(&f, f.kfd, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)q, PAGE, &at, 1), 0);
                REQUIRE_RC(svm_get1(&f, (uintptr_t)q, PAGE, KFD_IOCTL_SVM_ATTR_ACCESS, G1, &t, NULL), 0);
                REQUIRE(t == KFD_IOCTL_SVM_ATTR_ACCESS);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.system_used == 0 && s.svm_ranges == 2);
                REQUIRE(munmap(q, PAGE) == 0);
        }
        x.xnack_enabled = -1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        REQUIRE(x.xnack_enabled == 1);
        x.xnack_enabled = 0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.system_used == len);
        REQUIRE(munmap(p, len) == 0);
        REQUIRE_RC(fx_teardown(&f), 0);

        /* an RDNA GPU cannot do XNACK: -EPERM */
        {
                GpuSpec navi[] = {{G0, 8 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0, 110000, true}};

                REQUIRE_RC(fx_setup_topo(&f, topo_make(1, navi, 16 * GiB), 19, true), 0);
                x.xnack_enabled = 1;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), -EPERM);
                x.xnack_enabled = 0;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        /* without any SVM GPU a change is -EPERM, but asking for the mode it has is answered first */
        {
                GpuSpec nosvm[] = {{G0, 8 * GiB, HSA_MEM_HEAP_TYPE_FB_PUBLIC, 0, 90010, false}};

                REQUIRE_RC(fx_setup_topo(&f, topo_make(1, nosvm, 16 * GiB), 19, true), 0);
                x.xnack_enabled = 0;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), 0);
                x.xnack_enabled = 1;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &x), -EPERM);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        return 0;
}
