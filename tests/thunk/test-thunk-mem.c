/* Thunk memory tests on the KFD model: alloc/map/free, rollback, dmabuf, SVM, XNACK, GEM_VA and contexts. */
#include <fcntl.h>
#include <linux/kfd_sysfs.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kfd-compat.h"
#include "thunk-test.h"

#define MiB (1ull << 20)

static const char *presets_root;

static uint32_t gpu_id_at(ThunkDevice *d, size_t i)
{
        const ThunkGpu *g = thunk_device_gpu(d, i);

        ASSERT(g);
        return g->gpu_id;
}

/*
 * Whether VRAM owned by @owner can be KFD-mapped on @target, from the topology as the kernel decides it:
 * peers in one XGMI hive, or a large BAR (no private VRAM banks), or a target without VRAM of its own.
 */
static bool vram_peer_ok(ThunkDevice *d, uint32_t owner, uint32_t target)
{
        const ThunkTopology *t = thunk_device_topology(d);
        const ThunkNode *o = thunk_topology_gpu_by_id(t, owner), *g = thunk_topology_gpu_by_id(t, target);
        uint64_t priv = 0, vram = 0;

        ASSERT(o && g);
        if (owner == target)
                return true;
        for (size_t i = 0; i < g->n_mem_banks; i++)
                if (g->mem_banks[i].heap_type == HSA_MEM_HEAP_TYPE_FB_PUBLIC ||
                    g->mem_banks[i].heap_type == HSA_MEM_HEAP_TYPE_FB_PRIVATE)
                        vram += g->mem_banks[i].size_in_bytes;
        if (vram == 0 && g->local_mem_size == 0)
                return true;
        if (o->hive_id && o->hive_id == g->hive_id)
                return true;
        for (size_t i = 0; i < o->n_mem_banks; i++)
                if (o->mem_banks[i].heap_type == HSA_MEM_HEAP_TYPE_FB_PRIVATE)
                        priv += o->mem_banks[i].size_in_bytes;
        return priv == 0;
}

static bool has_vram(ThunkDevice *d, uint32_t gpu_id)
{
        const ThunkNode *g = thunk_topology_gpu_by_id(thunk_device_topology(d), gpu_id);

        for (size_t i = 0; i < g->n_mem_banks; i++)
                if (g->mem_banks[i].heap_type == HSA_MEM_HEAP_TYPE_FB_PUBLIC ||
                    g->mem_banks[i].heap_type == HSA_MEM_HEAP_TYPE_FB_PRIVATE)
                        return true;
        return g->local_mem_size > 0;
}

/* The GPUs (owner first) on which a BO of @kind owned by @owner can be mapped. */
static size_t map_set(ThunkDevice *d, ThunkMemKind kind, uint32_t owner, uint32_t *ret_ids)
{
        size_t k = 0;

        ret_ids[k++] = owner;
        for (size_t i = 0; i < thunk_device_gpu_count(d); i++) {
                uint32_t g = thunk_device_gpu(d, i)->gpu_id;

                if (g != owner && (kind != THUNK_MEM_VRAM || vram_peer_ok(d, owner, g)))
                        ret_ids[k++] = g;
        }
        return k;
}

static ThunkBo *alloc_bo(ThunkContext *c, ThunkMemKind kind, uint32_t gpu_id, uint32_t flags, uint64_t va,
                         uint64_t size)
{
        ThunkAllocArgs a = {.kind = kind, .gpu_id = gpu_id, .flags = flags, .va = va, .size = size};
        ThunkBo *bo = NULL;

        ASSERT_RC(thunk_bo_alloc(c, &a, &bo), 0);
        ASSERT(bo);
        return bo;
}

/* Invalid requests are refused before the driver sees them: a fault armed for the next ALLOC survives them.
 */
static void test_alloc_validation(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d);
        ThunkModelStats s0 = model_stats(d);
        uint32_t g = gpu_id_at(d, 0);
        uint64_t va = test_va(d, 2);
        const ThunkAllocArgs bad[] = {
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 0, .va = va},
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 100, .va = va},
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 4096 * 3 + 1, .va = va},
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 2 * MiB, .va = va + 8},
                {.kind = THUNK_MEM_VRAM, .gpu_id = 0, .size = 2 * MiB, .va = va},
                {.kind = THUNK_MEM_VRAM, .gpu_id = 0xfffe, .size = 2 * MiB, .va = va},
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 2 * MiB, .va = va, .flags = 1u << 20},
                {.kind = (ThunkMemKind)7, .gpu_id = g, .size = 2 * MiB, .va = va},
                {.kind = THUNK_MEM_USERPTR, .gpu_id = g, .size = 2 * MiB, .va = va, .userptr = 0},
                {.kind = THUNK_MEM_USERPTR, .gpu_id = g, .size = 2 * MiB, .va = va, .userptr = 0x10001},
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 2 * MiB, .va = va, .userptr = 0x10000},
                {.kind = THUNK_MEM_GTT,
                 .gpu_id = g,
                 .size = 2 * MiB,
                 .va = va,
                 .flags = THUNK_MEM_CONTIGUOUS},
                {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 2 * MiB, .va = UINT64_MAX - 4095},
        };
        ThunkAllocArgs good = {.kind = THUNK_MEM_VRAM, .gpu_id = g, .size = 2 * MiB, .va = va};
        ThunkBo *bo = NULL;

        ASSERT_RC(thunk_model_inject_fault(thunk_device_model(d), AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 1, E2BIG),
                  0);
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                int r = thunk_bo_alloc(pc, &bad[i], &bo);

                if (r != -EINVAL) {
                        fprintf(stderr, "bad alloc %zu: %d\n", i, r);
                        exit(1);
                }
                ASSERT(bo == NULL);
        }
        ASSERT_RC(thunk_bo_alloc(NULL, &good, &bo), -EINVAL);
        ASSERT_RC(thunk_bo_alloc(pc, NULL, &bo), -EINVAL);
        ASSERT_RC(thunk_bo_alloc(pc, &good, NULL), -EINVAL);
        /* The driver's own errno comes back unchanged. */
        ASSERT_RC(thunk_bo_alloc(pc, &good, &bo), -E2BIG);
        ASSERT(bo == NULL);
        ASSERT_RC(thunk_bo_alloc(pc, &good, &bo), 0);
        ASSERT(thunk_bo_info(bo)->handle >> 32 == g);
        ASSERT_RC(thunk_bo_free(bo), 0);
        ASSERT_RC(thunk_bo_free(NULL), -EINVAL);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

static void test_alloc_map_free(ThunkDevice *d)
{
        static const struct {
                ThunkMemKind kind;
                uint32_t flags;
        } variants[] = {
                {THUNK_MEM_VRAM, THUNK_MEM_WRITABLE | THUNK_MEM_EXECUTABLE | THUNK_MEM_NO_SUBSTITUTE},
                {THUNK_MEM_VRAM, THUNK_MEM_WRITABLE | THUNK_MEM_COHERENT | THUNK_MEM_EXT_COHERENT},
                {THUNK_MEM_VRAM, THUNK_MEM_UNCACHED | THUNK_MEM_CONTIGUOUS},
                {THUNK_MEM_VRAM, 0},
                {THUNK_MEM_GTT, THUNK_MEM_WRITABLE | THUNK_MEM_PUBLIC | THUNK_MEM_COHERENT},
                {THUNK_MEM_GTT, THUNK_MEM_WRITABLE | THUNK_MEM_UNCACHED | THUNK_MEM_NO_SUBSTITUTE},
        };
        ThunkContext *pc = thunk_device_primary_context(d);
        size_t n = thunk_device_gpu_count(d);
        uint32_t *ids = calloc(n, sizeof(*ids));
        ThunkModelStats s0 = model_stats(d);

        ASSERT(ids);
        for (size_t i = 0; i < n; i++)
                ids[i] = gpu_id_at(d, i);

        for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
                uint32_t owner = ids[v % n];
                uint64_t avail0 = 0, avail1 = 0, size = 4 * MiB;
                uint32_t set[THUNK_MODEL_MAX_GPUS];
                size_t n_set = map_set(d, variants[v].kind, owner, set);
                ThunkBo *bo;
                const ThunkBoInfo *info;

                ASSERT_RC(thunk_context_available_memory(pc, owner, &avail0), 0);
                bo = alloc_bo(pc, variants[v].kind, owner, variants[v].flags, test_va(d, 3), size);
                info = thunk_bo_info(bo);
                ASSERT(info->gpu_id == owner && info->size == size && info->va == test_va(d, 3));
                ASSERT(info->kind == variants[v].kind && info->flags == variants[v].flags && !info->imported);
                ASSERT(thunk_bo_context(bo) == pc);
                ASSERT(model_stats(d).mems == s0.mems + 1);
                ASSERT_RC(thunk_context_available_memory(pc, owner, &avail1), 0);
                ASSERT(avail1 <= avail0);
                if (variants[v].kind == THUNK_MEM_VRAM && has_vram(d, owner))
                        ASSERT(avail0 - avail1 >= size);

                ASSERT_RC(thunk_bo_map(bo, set, n_set), 0);
                ASSERT(thunk_bo_mapped_count(bo) == n_set);
                for (size_t i = 0; i < n_set; i++)
                        ASSERT(thunk_bo_is_mapped(bo, set[i]));
                ASSERT(model_stats(d).mappings == s0.mappings + n_set);
                /* Mapping again where it is mapped is a no-op. */
                ASSERT_RC(thunk_bo_map(bo, set, 1), 0);
                ASSERT(model_stats(d).mappings == s0.mappings + n_set);

                /* Mapped BOs cannot be freed. */
                ASSERT_RC(thunk_bo_free(bo), -EBUSY);
                ASSERT(model_stats(d).mems == s0.mems + 1);

                ASSERT_RC(thunk_bo_unmap(bo, set, 1), 0);
                ASSERT(!thunk_bo_is_mapped(bo, set[0]));
                ASSERT(thunk_bo_mapped_count(bo) == n_set - 1);
                ASSERT_RC(thunk_bo_unmap(bo, set, 1), -EINVAL); /* not mapped there any more */
                ASSERT(model_stats(d).mappings == s0.mappings + n_set - 1);
                ASSERT_RC(thunk_bo_unmap_all(bo), 0);
                ASSERT(thunk_bo_mapped_count(bo) == 0);
                ASSERT_RC(thunk_bo_unmap_all(bo), 0);
                ASSERT_RC(thunk_bo_free(bo), 0);
        }

        /* Argument checks of map/unmap. */
        {
                ThunkBo *bo =
                        alloc_bo(pc, THUNK_MEM_VRAM, ids[0], THUNK_MEM_WRITABLE, test_va(d, 3), 2 * MiB);
                uint32_t dup[2] = {ids[0], ids[0]}, unknown = 0xfffe;

                ASSERT_RC(thunk_bo_map(bo, NULL, 1), -EINVAL);
                ASSERT_RC(thunk_bo_map(bo, ids, 0), -EINVAL);
                ASSERT_RC(thunk_bo_map(bo, &unknown, 1), -EINVAL);
                if (n >= 2)
                        ASSERT_RC(thunk_bo_map(bo, dup, 2), -EINVAL);
                ASSERT_RC(thunk_bo_unmap(bo, ids, 1), -EINVAL);
                ASSERT(model_stats(d).mappings == s0.mappings);
                ASSERT_RC(thunk_bo_free(bo), 0);
        }

        /* A VA-less handle exists but can only be bound through GEM_VA. */
        {
                ThunkBo *bo = alloc_bo(pc, THUNK_MEM_VRAM, ids[0], THUNK_MEM_WRITABLE, 0, 2 * MiB);

                ASSERT_RC(thunk_bo_map(bo, ids, 1), -EINVAL);
                ASSERT_RC(thunk_bo_free(bo), 0);
        }

        /* USERPTR over our own pages, GPU VA = CPU VA as libhsakmt lays it out. */
        {
                void *p = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                ThunkAllocArgs a = {.kind = THUNK_MEM_USERPTR,
                                    .gpu_id = ids[0],
                                    .flags = THUNK_MEM_WRITABLE,
                                    .size = 2 * MiB};
                ThunkBo *bo = NULL;
                void *cpu = NULL;

                ASSERT(p != MAP_FAILED);
                memset(p, 0x5a, 2 * MiB);
                a.va = a.userptr = (uint64_t)(uintptr_t)p;
                ASSERT_RC(thunk_bo_alloc(pc, &a, &bo), 0);
                ASSERT(thunk_bo_info(bo)->kind == THUNK_MEM_USERPTR);
                ASSERT_RC(thunk_bo_mmap(bo, NULL, PROT_READ, MAP_SHARED, &cpu), -EINVAL);
                ASSERT_RC(thunk_bo_map(bo, ids, 1), 0);
                ASSERT_RC(thunk_bo_unmap(bo, ids, 1), 0);
                ASSERT_RC(thunk_bo_free(bo), 0);
                munmap(p, 2 * MiB);
        }

        free(ids);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

/*
 * A map of a set that fails part-way leaves the BO mapped exactly where it was. The failure is real: GPU
 * `last` already holds another BO at the same VA, which its VM refuses at MAP time.
 */
static void test_map_rollback(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d);
        size_t n = thunk_device_gpu_count(d);
        ThunkModelStats s0 = model_stats(d);
        uint64_t va = test_va(d, 4);
        uint32_t last, *ids;
        ThunkBo *blocker, *bo;
        int r;

        if (n < 2)
                return;
        ids = calloc(n, sizeof(*ids));
        ASSERT(ids);
        for (size_t i = 0; i < n; i++)
                ids[i] = gpu_id_at(d, i);
        last = ids[n - 1];

        /* GTT, so that every GPU may map it and only the VA conflict stands in the way. */
        blocker = alloc_bo(pc, THUNK_MEM_GTT, last, THUNK_MEM_WRITABLE, va, 2 * MiB);
        ASSERT_RC(thunk_bo_map(blocker, &last, 1), 0);
        bo = alloc_bo(pc, THUNK_MEM_GTT, ids[0], THUNK_MEM_WRITABLE, va, 2 * MiB);

        /* With three or more GPUs, one is mapped beforehand and must stay mapped. */
        if (n >= 3)
                ASSERT_RC(thunk_bo_map(bo, &ids[1], 1), 0);
        {
                ThunkModelStats before = model_stats(d);

                r = thunk_bo_map(bo, ids, n);
                ASSERT(r < 0);
                ASSERT(r != -EINTR);
                ThunkModelStats after = model_stats(d);
                ASSERT_STATS_EQUAL(&before, &after);
        }
        ASSERT(thunk_bo_mapped_count(bo) == (n >= 3 ? 1u : 0u));
        for (size_t i = 0; i < n; i++)
                ASSERT(thunk_bo_is_mapped(bo, ids[i]) == (n >= 3 && i == 1));

        /* If the rollback itself fails, the BO records what is still mapped, and a later unmap clears it. */
        ASSERT_RC(thunk_model_inject_fault(thunk_device_model(d), AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, 1, EIO),
                  0);
        r = thunk_bo_map(bo, ids, n);
        ASSERT(r < 0 && r != -EIO);
        ASSERT(thunk_bo_mapped_count(bo) == n - 1);
        for (size_t i = 0; i + 1 < n; i++)
                ASSERT(thunk_bo_is_mapped(bo, ids[i]));
        ASSERT(model_stats(d).mappings == s0.mappings + 1 + (n - 1));
        ASSERT_RC(thunk_bo_unmap_all(bo), 0);
        ASSERT(model_stats(d).mappings == s0.mappings + 1);

        /* Small-BAR VRAM cannot be mapped on a PCIe peer: the driver refuses the second GPU of the set. */
        for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++) {
                        uint32_t pair[2] = {ids[i], ids[j]};
                        ThunkBo *vb;

                        if (i == j || vram_peer_ok(d, ids[i], ids[j]))
                                continue;
                        vb = alloc_bo(pc, THUNK_MEM_VRAM, ids[i], THUNK_MEM_WRITABLE, test_va(d, 10),
                                      2 * MiB);
                        {
                                ThunkModelStats before = model_stats(d), after;

                                ASSERT_RC(thunk_bo_map(vb, pair, 2), -EINVAL);
                                after = model_stats(d);
                                ASSERT_STATS_EQUAL(&before, &after);
                        }
                        ASSERT(thunk_bo_mapped_count(vb) == 0);
                        ASSERT_RC(thunk_bo_map(vb, pair, 1), 0);
                        ASSERT_RC(thunk_bo_unmap_all(vb), 0);
                        ASSERT_RC(thunk_bo_free(vb), 0);
                        i = j = n; /* one pair is enough */
                }

        /* Once the blocker is gone the same set maps whole. */
        ASSERT_RC(thunk_bo_unmap(blocker, &last, 1), 0);
        ASSERT_RC(thunk_bo_free(blocker), 0);
        ASSERT_RC(thunk_bo_map(bo, ids, n), 0);
        ASSERT(thunk_bo_mapped_count(bo) == n);
        ASSERT_RC(thunk_bo_unmap_all(bo), 0);
        ASSERT_RC(thunk_bo_free(bo), 0);
        free(ids);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

/* EINTR is resumed; any other driver error is returned as is and leaves nothing behind. */
static void test_map_faults(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d);
        ThunkModel *m = thunk_device_model(d);
        size_t n = thunk_device_gpu_count(d);
        ThunkModelStats s0 = model_stats(d);
        uint32_t *ids = calloc(n, sizeof(*ids));
        ThunkBo *bo;

        ASSERT(ids);
        for (size_t i = 0; i < n; i++)
                ids[i] = gpu_id_at(d, i);
        bo = alloc_bo(pc, THUNK_MEM_GTT, ids[0], THUNK_MEM_WRITABLE, test_va(d, 5), 2 * MiB);

        ASSERT_RC(thunk_model_inject_fault(m, AMDKFD_IOC_MAP_MEMORY_TO_GPU, 1, EINTR), 0);
        ASSERT_RC(thunk_model_inject_fault(m, AMDKFD_IOC_MAP_MEMORY_TO_GPU, 2, EINTR), 0);
        ASSERT_RC(thunk_bo_map(bo, ids, n), 0);
        ASSERT(thunk_bo_mapped_count(bo) == n);
        ASSERT(model_stats(d).mappings == s0.mappings + n);

        ASSERT_RC(thunk_model_inject_fault(m, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, 1, EINTR), 0);
        ASSERT_RC(thunk_bo_unmap_all(bo), 0);
        ASSERT(thunk_bo_mapped_count(bo) == 0);
        ASSERT(model_stats(d).mappings == s0.mappings);

        ASSERT_RC(thunk_model_inject_fault(m, AMDKFD_IOC_MAP_MEMORY_TO_GPU, 1, ENOMEM), 0);
        ASSERT_RC(thunk_bo_map(bo, ids, n), -ENOMEM);
        ASSERT(thunk_bo_mapped_count(bo) == 0);
        ASSERT(model_stats(d).mappings == s0.mappings);

        ASSERT_RC(thunk_model_inject_fault(m, AMDKFD_IOC_FREE_MEMORY_OF_GPU, 1, EIO), 0);
        ASSERT_RC(thunk_bo_free(bo), -EIO);
        ASSERT(thunk_bo_info(bo)->size == 2 * MiB); /* still ours */
        ASSERT_RC(thunk_bo_free(bo), 0);
        thunk_model_clear_faults(m);
        free(ids);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

static void fill(uint8_t *p, size_t len, uint8_t seed)
{
        for (size_t i = 0; i < len; i++)
                p[i] = (uint8_t)(seed + i * 7);
}

static bool same(const uint8_t *p, size_t len, uint8_t seed)
{
        for (size_t i = 0; i < len; i++)
                if (p[i] != (uint8_t)(seed + i * 7))
                        return false;
        return true;
}

static void test_dmabuf(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d), *sc = NULL;
        size_t n = thunk_device_gpu_count(d);
        ThunkModelStats s0 = model_stats(d);
        uint32_t owner = gpu_id_at(d, 0), other = gpu_id_at(d, n - 1);
        const size_t size = 2 * MiB;
        ThunkBo *bo, *imp, *imp2 = NULL;
        ThunkDmabufInfo info;
        uint8_t *cpu = NULL, *viafd = NULL, *viaimp = NULL;
        int fd = -1;

        bo = alloc_bo(pc, THUNK_MEM_GTT, owner, THUNK_MEM_WRITABLE | THUNK_MEM_PUBLIC, test_va(d, 6), size);
        ASSERT_RC(thunk_bo_mmap(bo, NULL, PROT_READ | PROT_WRITE, MAP_PRIVATE, (void **)&cpu), -EINVAL);
        ASSERT_RC(thunk_bo_mmap(bo, NULL, PROT_READ | PROT_WRITE, MAP_SHARED, (void **)&cpu), 0);
        fill(cpu, size, 3);

        ASSERT_RC(thunk_bo_export_dmabuf(bo, &fd), 0);
        ASSERT(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
        ASSERT_RC(thunk_dmabuf_info(pc, fd, NULL, 0, &info), 0);
        ASSERT(info.size == size && info.gpu_id == owner && info.kind == THUNK_MEM_GTT);

        /* The exported memory is the BO's memory. */
        ASSERT_RC(thunk_dmabuf_mmap(d, fd, NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, (void **)&viafd),
                  0);
        ASSERT(same(viafd, size, 3));
        fill(viafd, 4096, 9);
        ASSERT(same(cpu, 4096, 9));

        /* Import on another GPU at another VA, map it there. */
        ASSERT_RC(thunk_bo_import_dmabuf(pc, fd, other, test_va(d, 7), &imp), 0);
        ASSERT(thunk_bo_info(imp)->imported && thunk_bo_info(imp)->size == size);
        ASSERT(thunk_bo_info(imp)->gpu_id == other && thunk_bo_info(imp)->kind == THUNK_MEM_GTT);
        ASSERT(thunk_bo_info(imp)->handle >> 32 == other);
        ASSERT(model_stats(d).imports == s0.imports + 1);
        ASSERT_RC(thunk_bo_map(imp, &other, 1), 0);
        ASSERT_RC(thunk_bo_mmap(imp, NULL, PROT_READ, MAP_SHARED, (void **)&viaimp), -EINVAL);

        /* A second context imports the same memory into its own VM. */
        if (thunk_device_has(d, THUNK_FEATURE_CREATE_PROCESS)) {
                ASSERT_RC(thunk_context_new(d, &sc), 0);
                ASSERT_RC(thunk_bo_import_dmabuf(sc, fd, owner, test_va(d, 6), &imp2), 0);
                ASSERT_RC(thunk_bo_map(imp2, &owner, 1), 0);
                ASSERT(model_stats(d).imports == s0.imports + 2);
        }

        /* Argument checks, then the driver's verdict on something that is not a dmabuf. */
        ASSERT_RC(thunk_bo_import_dmabuf(pc, fd, 0xfffe, 0, &imp2), -EINVAL);
        ASSERT_RC(thunk_bo_import_dmabuf(pc, fd, other, 12, &imp2), -EINVAL);
        ASSERT_RC(thunk_bo_import_dmabuf(pc, -1, other, 0, &imp2), -EINVAL);
        {
                int nfd = open("/dev/null", O_RDONLY | O_CLOEXEC);

                ASSERT(nfd >= 0);
                ASSERT(thunk_dmabuf_info(pc, nfd, NULL, 0, &info) < 0);
                close(nfd);
        }

        /* A foreign dmabuf (memfd-backed) is the driver's call: accepted as GTT from ABI 1.15 on. */
        {
                int mfd = memfd_create("thunk-test", MFD_CLOEXEC);
                ThunkBo *fb = NULL;

                ASSERT(mfd >= 0 && ftruncate(mfd, (off_t)size) == 0);
                ASSERT(thunk_dmabuf_info(pc, mfd, NULL, 0, &info) == -EINVAL);
                ASSERT_RC(thunk_bo_import_dmabuf(pc, mfd, other, test_va(d, 11), &fb), 0);
                ASSERT(thunk_bo_info(fb)->size == size && thunk_bo_info(fb)->kind == THUNK_MEM_GTT);
                ASSERT_RC(thunk_bo_map(fb, &other, 1), 0);
                ASSERT_RC(thunk_bo_unmap_all(fb), 0);
                ASSERT_RC(thunk_bo_free(fb), 0);
                close(mfd);
        }

        ASSERT(munmap(viafd, size) == 0);
        ASSERT(munmap(cpu, size) == 0);
        close(fd);
        if (sc) {
                ASSERT_RC(thunk_bo_unmap_all(imp2), 0);
                ASSERT_RC(thunk_bo_free(imp2), 0);
                thunk_context_free(sc);
        }
        ASSERT_RC(thunk_bo_unmap_all(imp), 0);
        ASSERT_RC(thunk_bo_free(imp), 0);
        ASSERT_RC(thunk_bo_free(bo), 0);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

static void test_svm_xnack(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d);
        uint32_t g0 = gpu_id_at(d, 0);
        ThunkModelStats s0 = model_stats(d);
        const size_t size = 4 * MiB;
        bool xnack = false, xnack2 = true;
        uint8_t *p;
        uint64_t start;

        ASSERT_RC(thunk_context_get_xnack(pc, &xnack), 0);
        ASSERT_RC(thunk_context_set_xnack(pc, xnack), 0);
        ASSERT_RC(thunk_context_get_xnack(pc, &xnack2), 0);
        ASSERT(xnack == xnack2);

        /* SVM ranges must be backed by our own CPU mappings. */
        p = mmap(NULL, size + 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT(p != MAP_FAILED);
        start = align_up((uint64_t)(uintptr_t)p, 2 * MiB);
        {
                ThunkSvmAttr set[] = {
                        {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, g0},
                        {KFD_IOCTL_SVM_ATTR_SET_FLAGS, KFD_IOCTL_SVM_FLAG_GPU_RO},
                        {KFD_IOCTL_SVM_ATTR_GRANULARITY, 4},
                        {KFD_IOCTL_SVM_ATTR_ACCESS, g0},
                };
                ThunkSvmAttr get[] = {
                        {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0},
                        {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0},
                        {KFD_IOCTL_SVM_ATTR_GRANULARITY, 0},
                        {KFD_IOCTL_SVM_ATTR_ACCESS, g0},
                };
                ThunkSvmAttr too_many[THUNK_SVM_MAX_ATTRS + 1];

                ASSERT_RC(thunk_svm_set(pc, start, size, set, 4), 0);
                ASSERT_RC(thunk_svm_get(pc, start, size, get, 4), 0);
                ASSERT(get[0].type == KFD_IOCTL_SVM_ATTR_PREFERRED_LOC && get[0].value == g0);
                ASSERT(get[1].value & KFD_IOCTL_SVM_FLAG_GPU_RO);
                ASSERT(get[2].value == 4);
                ASSERT(get[3].type == KFD_IOCTL_SVM_ATTR_ACCESS && get[3].value == g0);
                ASSERT(model_stats(d).svm_ranges > s0.svm_ranges);

                /* A sub-range reads back the same; the caller's SET array is left alone. */
                get[0].value = 0;
                ASSERT_RC(thunk_svm_get(pc, start + MiB, MiB, get, 1), 0);
                ASSERT(get[0].value == g0);
                ASSERT(set[0].value == g0 && set[3].type == KFD_IOCTL_SVM_ATTR_ACCESS);

                /* Validation before the driver. */
                memset(too_many, 0, sizeof(too_many));
                ASSERT_RC(thunk_svm_set(pc, start, 0, set, 1), -EINVAL);
                ASSERT_RC(thunk_svm_set(pc, start + 1, size, set, 1), -EINVAL);
                ASSERT_RC(thunk_svm_set(pc, start, size - 1, set, 1), -EINVAL);
                ASSERT_RC(thunk_svm_set(pc, start, size, NULL, 1), -EINVAL);
                ASSERT_RC(thunk_svm_set(pc, start, size, too_many, THUNK_SVM_MAX_ATTRS + 1), -EINVAL);
                ASSERT_RC(thunk_svm_get(pc, start, size, get, 0), -EINVAL);
                /* The driver's validation: ACCESS_IN_PLACE is not a GET input. */
                get[0] = (ThunkSvmAttr){KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, g0};
                ASSERT_RC(thunk_svm_get(pc, start, size, get, 1), -EINVAL);
        }
        /* Unmapping the CPU pages ends the ranges, as the kernel's MMU notifier does. */
        munmap(p, size + 2 * MiB);
        {
                ThunkSvmAttr get = {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0};

                ASSERT(thunk_svm_get(pc, start, size, &get, 1) < 0);
        }
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

static void test_gem_va(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d);
        size_t n = thunk_device_gpu_count(d);
        uint32_t g0 = gpu_id_at(d, 0), g1 = gpu_id_at(d, n - 1);
        ThunkModelStats s0 = model_stats(d);
        const uint32_t rw = THUNK_GEM_VA_READABLE | THUNK_GEM_VA_WRITEABLE;
        uint64_t va = test_va(d, 8);
        ThunkGemMapping *m1, *m2, *m3, *m4, *bad = NULL;
        ThunkBo *bo;
        int fd;

        /* A physical handle with no VA, as hipMemCreate makes. */
        bo = alloc_bo(pc, THUNK_MEM_VRAM, g0, THUNK_MEM_WRITABLE, 0, 4 * MiB);
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va, 0, 4 * MiB, rw, &m1), 0);
        ASSERT(model_stats(d).mappings == s0.mappings + 1);
        ASSERT(model_stats(d).gem_handles == s0.gem_handles + 1);
        /* Part of it again elsewhere: the same GEM handle (PRIME dedups per DRM file) serves both. */
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va + 8 * MiB, 2 * MiB, 2 * MiB, THUNK_GEM_VA_READABLE, &m2),
                  0);
        ASSERT(model_stats(d).mappings == s0.mappings + 2);
        ASSERT(model_stats(d).gem_handles == s0.gem_handles + 1);
        /* Another GPU's VM gets a handle of its own. */
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g1, va + 16 * MiB, 0, 4 * MiB, rw | THUNK_GEM_VA_EXECUTABLE, &m3),
                  0);
        ASSERT(model_stats(d).mappings == s0.mappings + 3);
        ASSERT(model_stats(d).gem_handles == s0.gem_handles + (g1 == g0 ? 1 : 2));

        /* From a dmabuf fd the caller holds. */
        ASSERT_RC(thunk_bo_export_dmabuf(bo, &fd), 0);
        ASSERT_RC(thunk_gem_map_dmabuf(pc, fd, g0, va + 24 * MiB, 0, 2 * MiB, rw, &m4), 0);
        close(fd);

        /* Validation. */
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va + 32 * MiB, 0, 4 * MiB, 0, &bad), -EINVAL);
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va + 32 * MiB, 0, 4 * MiB, 1u << 7, &bad), -EINVAL);
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va + 32 * MiB + 8, 0, 4 * MiB, rw, &bad), -EINVAL);
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va + 32 * MiB, 4096, 4 * MiB, rw, &bad), -EINVAL);
        ASSERT_RC(thunk_gem_map_bo(pc, bo, g0, va + 32 * MiB, 0, 0, rw, &bad), -EINVAL);
        ASSERT_RC(thunk_gem_map_bo(pc, bo, 0xfffe, va + 32 * MiB, 0, 4 * MiB, rw, &bad), -EINVAL);
        ASSERT(bad == NULL);
        ASSERT(model_stats(d).mappings == s0.mappings + 4);

        /* The driver refuses an overlapping VA in the same VM; no handle is left over. */
        ASSERT(thunk_gem_map_bo(pc, bo, g0, va, 0, 2 * MiB, rw, &bad) < 0);
        ASSERT(bad == NULL);
        ASSERT(model_stats(d).gem_handles == s0.gem_handles + (g1 == g0 ? 1 : 2));

        ASSERT_RC(thunk_gem_unmap(m1), 0);
        ASSERT(model_stats(d).gem_handles == s0.gem_handles + (g1 == g0 ? 1 : 2));
        ASSERT_RC(thunk_gem_unmap(m2), 0);
        ASSERT_RC(thunk_gem_unmap(m4), 0);
        ASSERT_RC(thunk_gem_unmap(m3), 0);
        ASSERT_RC(thunk_gem_unmap(NULL), -EINVAL);
        ASSERT_RC(thunk_bo_free(bo), 0);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

static void test_contexts(ThunkDevice *d)
{
        ThunkContext *pc = thunk_device_primary_context(d), *a = NULL, *b = NULL;
        size_t n = thunk_device_gpu_count(d);
        uint32_t g0 = gpu_id_at(d, 0);
        ThunkModelStats s0 = model_stats(d);
        uint64_t va = test_va(d, 9);
        ThunkBo *p_bo, *a_bo, *b_bo;

        ASSERT_RC(thunk_context_new(d, &a), 0);
        ASSERT_RC(thunk_context_new(d, &b), 0);
        ASSERT(a != b && !thunk_context_is_primary(a));
        ASSERT(model_stats(d).contexts == s0.contexts + 2);
        ASSERT(model_stats(d).render_fds == s0.render_fds + 2 * n);
        ASSERT(thunk_context_kfd_fd(a) != thunk_context_kfd_fd(pc));
        ASSERT(thunk_context_render_fd(a, g0) != thunk_context_render_fd(pc, g0));

        /* Each context has its own GPU VM: one VA holds a different BO in each. */
        p_bo = alloc_bo(pc, THUNK_MEM_VRAM, g0, THUNK_MEM_WRITABLE, va, 2 * MiB);
        a_bo = alloc_bo(a, THUNK_MEM_VRAM, g0, THUNK_MEM_WRITABLE, va, 2 * MiB);
        b_bo = alloc_bo(b, THUNK_MEM_GTT, g0, THUNK_MEM_WRITABLE, va, 2 * MiB);
        ASSERT_RC(thunk_bo_map(p_bo, &g0, 1), 0);
        ASSERT_RC(thunk_bo_map(a_bo, &g0, 1), 0);
        ASSERT_RC(thunk_bo_map(b_bo, &g0, 1), 0);
        ASSERT(thunk_bo_context(a_bo) == a);

        /* SVM and USERPTR stay with the primary context. */
        {
                void *p = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                ThunkAllocArgs u = {.kind = THUNK_MEM_USERPTR, .gpu_id = g0, .size = 2 * MiB};
                ThunkSvmAttr attr = {KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, g0};
                ThunkBo *ubo = NULL;

                ASSERT(p != MAP_FAILED);
                u.va = u.userptr = (uint64_t)(uintptr_t)p & ~(uint64_t)4095;
                ASSERT(thunk_bo_alloc(a, &u, &ubo) < 0);
                ASSERT(ubo == NULL);
                ASSERT(thunk_svm_set(a, u.userptr, 2 * MiB, &attr, 1) < 0);
                munmap(p, 2 * MiB);
        }

        /* Freeing a context with live, mapped BOs releases them all in the driver. */
        thunk_context_free(a);
        ASSERT(model_stats(d).contexts == s0.contexts + 1);
        ASSERT(model_stats(d).mems == s0.mems + 2);
        ASSERT_RC(thunk_bo_unmap_all(b_bo), 0);
        ASSERT_RC(thunk_bo_free(b_bo), 0);
        thunk_context_free(b);
        ASSERT_RC(thunk_bo_unmap_all(p_bo), 0);
        ASSERT_RC(thunk_bo_free(p_bo), 0);
        ASSERT(thunk_context_free(NULL) == NULL);
        {
                ThunkModelStats s1 = model_stats(d);

                ASSERT_STATS_EQUAL(&s0, &s1);
        }
}

int main(int argc, char **argv)
{
        ThunkDevice *d;
        int fds0;

        if (argc != 3) {
                fprintf(stderr, "usage: %s PRESETS_DIR PRESET\n", argv[0]);
                return 2;
        }
        presets_root = argv[1];

        fds0 = count_fds(0);
        d = open_model(presets_root, argv[2], 0);
        RUN(test_alloc_validation, d);
        RUN(test_alloc_map_free, d);
        RUN(test_map_rollback, d);
        RUN(test_map_faults, d);
        RUN(test_dmabuf, d);
        RUN(test_svm_xnack, d);
        RUN(test_gem_va, d);
        RUN(test_contexts, d);
        thunk_device_close(d);
        ASSERT(count_fds(0) == fds0);
        return 0;
}
