/* libhsakmt (ROCm's thunk, unmodified) on the KFD model: open, topology, VRAM/GTT/userptr, events, close. */
#include <errno.h>
#include <hsakmt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "model-stats.h"

#define SIZE (2ULL << 20)

#define CHECK(cond)                                                                                          \
        do {                                                                                                 \
                if (!(cond)) {                                                                               \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);             \
                        return 1;                                                                            \
                }                                                                                            \
        } while (0)
#define CHECK_KMT(expr)                                                                                      \
        do {                                                                                                 \
                HSAKMT_STATUS s_ = (expr);                                                                   \
                if (s_ != HSAKMT_STATUS_SUCCESS) {                                                           \
                        fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #expr, (int)s_);             \
                        return 1;                                                                            \
                }                                                                                            \
        } while (0)

static double now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Writes a pattern through @p and reads it back. */
static int pattern(volatile uint64_t *p, uint64_t n, uint64_t seed)
{
        for (uint64_t i = 0; i < n; i++)
                p[i] = seed ^ (i * 0x9E3779B97F4A7C15ULL);
        for (uint64_t i = 0; i < n; i++)
                CHECK(p[i] == (seed ^ (i * 0x9E3779B97F4A7C15ULL)));
        return 0;
}

static int test_memory(uint32_t gpu_node)
{
        HsaMemFlags f;
        ModelCounts c0, c1;
        void *vram = NULL, *gtt = NULL, *user;
        uint64_t va = 0;

        CHECK(model_counts(&c0) == 0);

        /* host-visible VRAM on the GPU node */
        memset(&f, 0, sizeof(f));
        f.ui32.NonPaged = 1;
        f.ui32.HostAccess = 1;
        f.ui32.CoarseGrain = 1;
        f.ui32.PageSize = HSA_PAGE_SIZE_4KB;
        CHECK_KMT(hsaKmtAllocMemory(gpu_node, SIZE, f, &vram));
        CHECK(vram != NULL);
        CHECK(model_counts(&c1) == 0);
        CHECK(c1.vram_used == c0.vram_used + SIZE && c1.mems == c0.mems + 1);
        CHECK_KMT(hsaKmtMapMemoryToGPU(vram, SIZE, &va));
        /* the GPU address is the CPU address (libhsakmt reports 0 for "no alternate address") */
        CHECK(va == 0 || va == (uintptr_t)vram);
        CHECK(pattern(vram, SIZE / 8, 0x1111) == 0);
        CHECK(model_counts(&c1) == 0 && c1.mappings == c0.mappings + 1);
        CHECK_KMT(hsaKmtUnmapMemoryToGPU(vram));
        CHECK_KMT(hsaKmtFreeMemory(vram, SIZE));

        /* system memory the GPU reaches (GTT) */
        memset(&f, 0, sizeof(f));
        f.ui32.NonPaged = 1;
        f.ui32.HostAccess = 1;
        f.ui32.PageSize = HSA_PAGE_SIZE_4KB;
        CHECK_KMT(hsaKmtAllocMemory(0, SIZE, f, &gtt));
        CHECK(model_counts(&c1) == 0 && c1.ttm_used == c0.ttm_used + SIZE);
        CHECK_KMT(hsaKmtMapMemoryToGPU(gtt, SIZE, &va));
        CHECK(pattern(gtt, SIZE / 8, 0x2222) == 0);
        CHECK_KMT(hsaKmtUnmapMemoryToGPU(gtt));
        CHECK_KMT(hsaKmtFreeMemory(gtt, SIZE));

        /* the process's own pages, registered (userptr) */
        user = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(user != MAP_FAILED);
        CHECK(pattern(user, SIZE / 8, 0x3333) == 0);
        CHECK_KMT(hsaKmtRegisterMemory(user, SIZE));
        CHECK_KMT(hsaKmtMapMemoryToGPU(user, SIZE, &va));
        CHECK(model_counts(&c1) == 0 && c1.system_used == c0.system_used + SIZE);
        CHECK_KMT(hsaKmtUnmapMemoryToGPU(user));
        CHECK_KMT(hsaKmtDeregisterMemory(user));
        munmap(user, SIZE);

        CHECK(model_counts(&c1) == 0);
        CHECK(c1.mems == c0.mems && c1.bufs == c0.bufs && c1.mappings == c0.mappings);
        CHECK(c1.vram_used == c0.vram_used && c1.ttm_used == c0.ttm_used && c1.system_used == c0.system_used);
        return 0;
}

static int test_events(uint32_t gpu_node)
{
        HsaEventDescriptor d = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu_node};
        HsaEvent *ev = NULL;
        double t;

        CHECK_KMT(hsaKmtCreateEvent(&d, false, false, &ev));
        /* unsignalled: the wait really blocks until its timeout */
        t = now_ms();
        CHECK(hsaKmtWaitOnEvent(ev, 100) == HSAKMT_STATUS_WAIT_TIMEOUT);
        CHECK(now_ms() - t >= 95);
        CHECK_KMT(hsaKmtSetEvent(ev));
        CHECK_KMT(hsaKmtWaitOnEvent(ev, 1000));
        /* auto-reset: the wait consumed it */
        CHECK(hsaKmtWaitOnEvent(ev, 10) == HSAKMT_STATUS_WAIT_TIMEOUT);
        CHECK_KMT(hsaKmtDestroyEvent(ev));
        return 0;
}

int main(void)
{
        HsaVersionInfo v;
        HsaSystemProperties sp;
        HsaNodeProperties np;
        ModelCounts c;
        uint32_t gpu_node = 0;
        int gpus = 0;

        CHECK_KMT(hsaKmtOpenKFD());
        CHECK_KMT(hsaKmtGetVersion(&v));
        CHECK(v.KernelInterfaceMajorVersion == 1);
        CHECK_KMT(hsaKmtAcquireSystemProperties(&sp));
        CHECK(sp.NumNodes == 2);
        for (uint32_t n = 0; n < sp.NumNodes; n++) {
                CHECK_KMT(hsaKmtGetNodeProperties(n, &np));
                if (np.NumFComputeCores == 0) {
                        CHECK(np.NumCPUCores > 0);
                        continue;
                }
                gpus++;
                gpu_node = n;
                /* the gfx908 preset: GFX 9.0.8, 120 CUs of 4 SIMDs, 32 GiB of VRAM */
                CHECK(np.EngineId.ui32.Major == 9 && np.EngineId.ui32.Minor == 0 &&
                      np.EngineId.ui32.Stepping == 8);
                CHECK(np.NumFComputeCores == 480 && np.NumSIMDPerCU == 4);
                CHECK(np.LocalMemSize == 32ULL << 30);
                CHECK(np.DeviceId == 0x738c);
                {
                        HsaMemoryProperties mp[8];

                        CHECK(np.NumMemoryBanks >= 1 && np.NumMemoryBanks <= 8);
                        CHECK_KMT(hsaKmtGetNodeMemoryProperties(n, np.NumMemoryBanks, mp));
                        CHECK(mp[0].HeapType == HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC);
                        CHECK(mp[0].SizeInBytes == 32ULL << 30);
                }
        }
        CHECK(gpus == 1);
        if (test_memory(gpu_node) != 0 || test_events(gpu_node) != 0)
                return 1;
        CHECK_KMT(hsaKmtReleaseSystemProperties());
        CHECK_KMT(hsaKmtCloseKFD());
        /* closing the KFD ends the process's context: everything it held is gone */
        CHECK(model_counts(&c) == 0);
        printf("after close: contexts %llu kfd fds %llu handles %llu buffers %llu mappings %llu system %llu "
               "ttm %llu vram %llu queues %llu events %llu\n",
               c.contexts, c.kfd_fds, c.mems, c.bufs, c.mappings, c.system_used, c.ttm_used, c.vram_used,
               c.queues, c.events);
        CHECK(c.contexts == 0 && c.kfd_fds == 0 && c.mems == 0 && c.bufs == 0 && c.mappings == 0);
        CHECK(c.system_used == 0 && c.ttm_used == 0 && c.vram_used == 0 && c.queues == 0 && c.events == 0);
        printf("ok\n");
        return 0;
}
