/* gpumem-bench, section inproc: the broker ops in-process on the thunk and the model, for comparison. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "thunk.h"
#include "base/vaman.h"
#include "bench.h"

/* SVM attribute and location values of the KFD ABI (kfd_ioctl.h), used for the in-process calls. */
#define SVM_ATTR_PREFERRED_LOC 0
#define SVM_ATTR_ACCESS        2
#define SVM_ATTR_SET_FLAGS     5
#define SVM_FLAG_HOST_ACCESS   0x1

typedef struct InProc {
        ThunkDevice *dev;
        ThunkContext *ctx;
        ThunkVaSpace *va;
        uint32_t gpu[2];
        ThunkBo *bo; /* mapped device BO for map/unmap, export and queries */
        uint64_t svm_va, svm_size;
        unsigned flip;
} InProc;

typedef int (*InFn)(InProc *p);

/* What the ops allocate: writable VRAM of @size on the first GPU, never another kind in its place. */
static ThunkAllocArgs vram_args(const InProc *p, uint64_t size)
{
        return (ThunkAllocArgs){.kind = THUNK_MEM_VRAM,
                                .gpu_id = p->gpu[0],
                                .flags = THUNK_MEM_WRITABLE | THUNK_MEM_NO_SUBSTITUTE,
                                .size = size};
}

static int in_alloc_free(InProc *p)
{
        ThunkAllocArgs a = vram_args(p, 4 * KIB);
        ThunkBo *bo = NULL;
        int r = thunk_va_alloc(p->va, a.size, 4 * KIB, NULL, &a.va);

        if (r < 0)
                return r;
        if ((r = thunk_bo_alloc(p->ctx, &a, &bo)) < 0 || (r = thunk_bo_map(bo, &p->gpu[0], 1)) < 0)
                return r;
        if ((r = thunk_bo_unmap_all(bo)) < 0 || (r = thunk_bo_free(bo)) < 0)
                return r;
        return thunk_va_free(p->va, a.va);
}

static int in_map_unmap(InProc *p)
{
        int r = thunk_bo_map(p->bo, &p->gpu[1], 1);
        return r < 0 ? r : thunk_bo_unmap(p->bo, &p->gpu[1], 1);
}

static int in_vmm(InProc *p)
{
        ThunkAllocArgs a = vram_args(p, 2 * MIB);
        ThunkGemMapping *m = NULL;
        ThunkBo *bo = NULL;
        uint64_t va = 0;
        int r = thunk_va_alloc(p->va, 2 * MIB, 2 * MIB, NULL, &va);

        if (r < 0)
                return r;
        if ((r = thunk_bo_alloc(p->ctx, &a, &bo)) < 0 ||
            (r = thunk_gem_map_bo(p->ctx, bo, p->gpu[0], va, 0, 2 * MIB,
                                  THUNK_GEM_VA_READABLE | THUNK_GEM_VA_WRITEABLE, &m)) < 0 ||
            (r = thunk_gem_unmap(m)) < 0 || (r = thunk_bo_free(bo)) < 0)
                return r;
        return thunk_va_free(p->va, va);
}

static int in_export(InProc *p)
{
        int fd = -1, r = thunk_bo_export_dmabuf(p->bo, &fd);
        if (r < 0)
                return r;
        close(fd);
        return 0;
}

static int in_svm_set(InProc *p)
{
        ThunkSvmAttr a = {SVM_ATTR_PREFERRED_LOC, p->gpu[p->flip++ & 1]};
        return thunk_svm_set(thunk_device_primary_context(p->dev), p->svm_va, p->svm_size, &a, 1);
}

static int in_svm_get(InProc *p)
{
        ThunkSvmAttr a[2] = {{SVM_ATTR_PREFERRED_LOC, 0}, {SVM_ATTR_ACCESS, p->gpu[0]}};
        return thunk_svm_get(thunk_device_primary_context(p->dev), p->svm_va, p->svm_size, a, 2);
}

static int in_pointer(InProc *p)
{
        ThunkVaObject vo;
        int r = thunk_va_lookup(p->va, thunk_bo_info(p->bo)->va + 100, &vo);
        return r < 0 ? r : (vo.data == p->bo && thunk_bo_is_mapped(p->bo, p->gpu[0]) ? 0 : -EPROTO);
}

static Lat measure_in(InFn fn, InProc *p, size_t iters, const char *name)
{
        uint64_t *s = calloc(iters, sizeof(*s));
        size_t warm = iters / 10 + 1;
        Lat l;

        if (!s)
                die("out of memory");
        for (size_t i = 0; i < warm + iters; i++) {
                uint64_t t0 = now_ns();
                int r = fn(p);
                uint64_t t1 = now_ns();
                if (r < 0)
                        die("in-process %s failed: %s", name, strerror(-r));
                if (i >= warm)
                        s[i - warm] = t1 - t0;
        }
        l = lat_of(s, iters);
        free(s);
        return l;
}

void run_inproc(const Settings *st, Report *rep)
{
        static const struct {
                const char *name;
                InFn fn;
        } ops[] = {
                {"alloc+free (4 KiB device)", in_alloc_free},
                {"map+unmap (second GPU)", in_map_unmap},
                {"vmm sequence (7 ops)", in_vmm},
                {"dmabuf export (+fd)", in_export},
                {"svm set attributes", in_svm_set},
                {"svm get attributes", in_svm_get},
                {"pointer query", in_pointer},
        };
        ThunkOptions to = {.backend = THUNK_BACKEND_MODEL, .topology_root = st->preset};
        ThunkAllocArgs a = {.kind = THUNK_MEM_VRAM,
                            .flags = THUNK_MEM_WRITABLE | THUNK_MEM_NO_SUBSTITUTE,
                            .size = 2 * MIB};
        ThunkSvmAttr sa = {SVM_ATTR_SET_FLAGS, SVM_FLAG_HOST_ACCESS};
        uint64_t base, limit, start;
        char err[256] = "";
        InProc p = {0};
        void *mem;
        int r;

        r = thunk_device_open(&to, &p.dev, err, sizeof(err));
        if (r < 0)
                die("in-process: cannot open the model: %s", err[0] ? err : strerror(-r));
        p.ctx = thunk_device_primary_context(p.dev);
        for (size_t i = 0, n = 0; i < thunk_device_gpu_count(p.dev) && n < 2; i++)
                p.gpu[n++] = thunk_device_gpu(p.dev, i)->gpu_id;
        if (thunk_device_gpu_count(p.dev) < 2)
                p.gpu[1] = p.gpu[0];
        /* the address books a client with its own KFD keeps too (libhsakmt has its own VA manager) */
        thunk_device_svm_aperture(p.dev, &base, &limit);
        start = ((base > (1ull << 40) ? base : (1ull << 40)) + 2 * MIB - 1) & ~(2 * MIB - 1);
        if ((r = thunk_va_space_new(start, 64 * GIB, 4 * KIB, &p.va)) < 0)
                die("in-process: VA space: %s", strerror(-r));
        a.gpu_id = p.gpu[0];
        if ((r = thunk_va_alloc(p.va, a.size, 2 * MIB, NULL, &a.va)) < 0 ||
            (r = thunk_bo_alloc(p.ctx, &a, &p.bo)) < 0 || (r = thunk_bo_map(p.bo, &p.gpu[0], 1)) < 0)
                die("in-process: device BO: %s", strerror(-r));
        (void)thunk_va_free(p.va, a.va);
        (void)thunk_va_alloc(p.va, a.size, 2 * MIB, p.bo, &a.va); /* same address, now naming the BO */
        /* managed memory: pages at an SVM address of this process */
        p.svm_size = 2 * MIB;
        if ((r = thunk_va_alloc(p.va, p.svm_size, 2 * MIB, NULL, &p.svm_va)) < 0)
                die("in-process: SVM VA: %s", strerror(-r));
        mem = mmap((void *)(uintptr_t)p.svm_va, p.svm_size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (mem != (void *)(uintptr_t)p.svm_va)
                die("in-process: cannot map SVM memory at 0x%llx", (unsigned long long)p.svm_va);
        if ((r = thunk_svm_set(thunk_device_primary_context(p.dev), p.svm_va, p.svm_size, &sa, 1)) < 0)
                die("in-process: SVM range: %s", strerror(-r));

        pin_self(st->cpu_a);
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                Row *w = add_row(rep, "in-process", ops[i].name, 0, false);
                size_t iters = strstr(ops[i].name, "sequence") || strstr(ops[i].name, "+") ? st->seq_iters
                                                                                           : st->op_iters;
                w->pinned = measure_in(ops[i].fn, &p, iters, ops[i].name);
        }
        unpin_self(st);
        munmap(mem, p.svm_size);
        (void)thunk_bo_unmap_all(p.bo);
        (void)thunk_bo_free(p.bo);
        thunk_va_space_free(p.va);
        thunk_device_close(p.dev);
}
