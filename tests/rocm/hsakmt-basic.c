/* libhsakmt (ROCm's thunk, unmodified) on the KFD model: open, topology, VRAM/GTT/userptr, events, close. */
#include <errno.h>
#include <hsakmt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "hsakmt-check.h"
#include "model-stats.h"

#define SIZE (2ULL << 20)

/* Writes a pattern through @p and reads it back. */
static int pattern(volatile uint64_t *p, uint64_t n, uint64_t seed)
{
        for (uint64_t i = 0; i < n; i++)
                p[i] = seed ^ (i * 0x9E3779B97F4A7C15ULL);
        for (uint64_t i = 0; i < n; i++)
                REQUIRE(p[i] == (seed ^ (i * 0x9E3779B97F4A7C15ULL)));
        return 0;
}

static int test_memory(uint32_t gpu_node)
{
        HsaMemFlags f;
        ModelCounts c0, c1;
        void *vram = NULL, *gtt = NULL, *user;
        uint64_t va = 0;

        REQUIRE(model_counts(&c0) == 0);

        /* host-visible VRAM on the GPU node */
        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS | KMT_COARSE_GRAIN);
        REQUIRE_KMT(hsaKmtAllocMemory(gpu_node, SIZE, f, &vram));
        REQUIRE(vram != NULL);
        REQUIRE(model_counts(&c1) == 0);
        REQUIRE(c1.vram_used == c0.vram_used + SIZE && c1.mems == c0.mems + 1);
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(vram, SIZE, &va));
        /* the GPU address is the CPU address (libhsakmt reports 0 for "no alternate address") */
        REQUIRE(va == 0 || va == (uintptr_t)vram);
        REQUIRE(pattern(vram, SIZE / 8, 0x1111) == 0);
        REQUIRE(model_counts(&c1) == 0 && c1.mappings == c0.mappings + 1);
        REQUIRE_KMT(hsaKmtUnmapMemoryToGPU(vram));
        REQUIRE_KMT(hsaKmtFreeMemory(vram, SIZE));

        /* system memory the GPU reaches (GTT) */
        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS);
        REQUIRE_KMT(hsaKmtAllocMemory(0, SIZE, f, &gtt));
        REQUIRE(model_counts(&c1) == 0 && c1.ttm_used == c0.ttm_used + SIZE);
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(gtt, SIZE, &va));
        REQUIRE(pattern(gtt, SIZE / 8, 0x2222) == 0);
        REQUIRE_KMT(hsaKmtUnmapMemoryToGPU(gtt));
        REQUIRE_KMT(hsaKmtFreeMemory(gtt, SIZE));

        /* the process's own pages, registered (userptr) */
        user = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(user != MAP_FAILED);
        REQUIRE(pattern(user, SIZE / 8, 0x3333) == 0);
        REQUIRE_KMT(hsaKmtRegisterMemory(user, SIZE));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(user, SIZE, &va));
        REQUIRE(model_counts(&c1) == 0 && c1.system_used == c0.system_used + SIZE);
        REQUIRE_KMT(hsaKmtUnmapMemoryToGPU(user));
        REQUIRE_KMT(hsaKmtDeregisterMemory(user));
        munmap(user, SIZE);

        REQUIRE(model_counts(&c1) == 0);
        REQUIRE(c1.mems == c0.mems && c1.bufs == c0.bufs && c1.mappings == c0.mappings);
        REQUIRE(c1.vram_used == c0.vram_used && c1.ttm_used == c0.ttm_used &&
                c1.system_used == c0.system_used);
        return 0;
}

static int test_events(uint32_t gpu_node)
{
        HsaEventDescriptor d = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu_node};
        HsaEvent *ev = NULL;

        REQUIRE_KMT(hsaKmtCreateEvent(&d, false, false, &ev));
        REQUIRE(check_signal_event(ev) == 0);
        REQUIRE_KMT(hsaKmtDestroyEvent(ev));
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

        REQUIRE_KMT(hsaKmtOpenKFD());
        REQUIRE_KMT(hsaKmtGetVersion(&v));
        REQUIRE(v.KernelInterfaceMajorVersion == 1);
        REQUIRE_KMT(hsaKmtAcquireSystemProperties(&sp));
        REQUIRE(sp.NumNodes == 2);
        for (uint32_t n = 0; n < sp.NumNodes; n++) {
                REQUIRE_KMT(hsaKmtGetNodeProperties(n, &np));
                if (np.NumFComputeCores == 0) {
                        REQUIRE(np.NumCPUCores > 0);
                        continue;
                }
                gpus++;
                gpu_node = n;
                /* the gfx908 preset: GFX 9.0.8, 120 CUs of 4 SIMDs, 32 GiB of VRAM */
                REQUIRE(np.EngineId.ui32.Major == 9 && np.EngineId.ui32.Minor == 0 &&
                        np.EngineId.ui32.Stepping == 8);
                REQUIRE(np.NumFComputeCores == 480 && np.NumSIMDPerCU == 4);
                REQUIRE(np.LocalMemSize == 32ULL << 30);
                REQUIRE(np.DeviceId == 0x738c);
                {
                        HsaMemoryProperties mp[8];

                        REQUIRE(np.NumMemoryBanks >= 1 && np.NumMemoryBanks <= 8);
                        REQUIRE_KMT(hsaKmtGetNodeMemoryProperties(n, np.NumMemoryBanks, mp));
                        REQUIRE(mp[0].HeapType == HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC);
                        REQUIRE(mp[0].SizeInBytes == 32ULL << 30);
                }
        }
        REQUIRE(gpus == 1);
        if (test_memory(gpu_node) != 0 || test_events(gpu_node) != 0)
                return 1;
        REQUIRE_KMT(hsaKmtReleaseSystemProperties());
        REQUIRE_KMT(hsaKmtCloseKFD());
        /* closing the KFD ends the process's context: everything it held is gone */
        REQUIRE(model_counts(&c) == 0);
        printf("after close: contexts %llu kfd fds %llu handles %llu buffers %llu mappings %llu system %llu "
               "ttm %llu vram %llu queues %llu events %llu\n",
               c.contexts, c.kfd_fds, c.mems, c.bufs, c.mappings, c.system_used, c.ttm_used, c.vram_used,
               c.queues, c.events);
        REQUIRE(c.contexts == 0 && c.kfd_fds == 0 && c.mems == 0 && c.bufs == 0 && c.mappings == 0);
        REQUIRE(c.system_used == 0 && c.ttm_used == 0 && c.vram_used == 0 && c.queues == 0 && c.events == 0);
        printf("ok\n");
        return 0;
}
