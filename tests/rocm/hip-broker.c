/* HIP (ROCm 5.2.3) through gpumemd under libgpumem-kfd.so: devices, memory info, device and pinned memory. */
#include <hip/hip_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip-check.h"

/*
 * Usage: hip-broker ARCH VRAM_BYTES CU_COUNT [over BYTES | fill LIMIT]
 * Checks the device against the daemon's preset, then hipMemGetInfo around a hipMalloc and its hipFree
 * (the daemon's accounting is what HIP sees), pinned host memory written and read, and says "holding"
 * while it holds both, waiting for a line on stdin. With "over BYTES": a hipMalloc of BYTES must fail with
 * hipErrorOutOfMemory, and one of 2 MiB must succeed after it. With "fill LIMIT": hipMemGetInfo's total is
 * at most LIMIT, a hipMalloc of what it calls free (in 2 MiB) succeeds (it says "holding" and waits for a
 * line while it holds that), and after its hipFree one of free + 64 MiB fails.
 */
static int fill(size_t limit)
{
        const size_t block = 2ULL << 20, over = 64ULL << 20;
        size_t free0, total0, free1, total1;
        hipError_t e;
        void *d = NULL;
        char line[16];

        REQUIRE_HIP(hipMemGetInfo(&free0, &total0));
        printf("fill: free %zu total %zu\n", free0, total0);
        REQUIRE(total0 <= limit && free0 <= total0 && free0 >= block);
        REQUIRE_HIP(hipMalloc(&d, free0 / block * block));
        REQUIRE_HIP(hipMemGetInfo(&free1, &total1));
        printf("holding %zu, free %zu\n", free0 / block * block, free1);
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
                return 1;
        REQUIRE_HIP(hipFree(d));
        REQUIRE_HIP(hipMemGetInfo(&free1, &total1));
        REQUIRE(free1 == free0 && total1 == total0);
        e = hipMalloc(&d, free0 + over);
        printf("fill: %zu refused: %d\n", free0 + over, (int)e);
        REQUIRE(e == hipErrorOutOfMemory);
        (void)hipGetLastError();
        /* the refusal left nothing behind: all of it again */
        REQUIRE_HIP(hipMalloc(&d, free0 / block * block));
        REQUIRE_HIP(hipFree(d));
        printf("filled\n");
        return 0;
}

int main(int argc, char **argv)
{
        const size_t size = 64ULL << 20, host = 8ULL << 20;
        size_t free0, total0, free1, total1, free2, total2;
        hipDeviceProp_t prop;
        void *d = NULL, *h = NULL;
        char line[16];
        int count = -1;

        if (argc < 4) {
                fprintf(stderr, "usage: %s ARCH VRAM_BYTES CU_COUNT [over BYTES | fill LIMIT]\n", argv[0]);
                return 2;
        }
        REQUIRE_HIP(hipGetDeviceCount(&count));
        REQUIRE(count == 1);
        REQUIRE_HIP(hipGetDeviceProperties(&prop, 0));
        printf("device 0: arch %s mem %zu cus %d\n", prop.gcnArchName, prop.totalGlobalMem,
               prop.multiProcessorCount);
        REQUIRE(strncmp(prop.gcnArchName, argv[1], strlen(argv[1])) == 0);
        REQUIRE(prop.totalGlobalMem == strtoull(argv[2], NULL, 0));
        REQUIRE(prop.multiProcessorCount == atoi(argv[3]));

        if (argc > 5 && strcmp(argv[4], "over") == 0) {
                size_t over = strtoull(argv[5], NULL, 0);
                REQUIRE(hipMalloc(&d, over) == hipErrorOutOfMemory);
                (void)hipGetLastError();
                REQUIRE_HIP(hipMalloc(&d, 2 << 20));
                REQUIRE_HIP(hipFree(d));
                printf("over quota refused\n");
                return 0;
        }

        if (argc > 5 && strcmp(argv[4], "fill") == 0)
                return fill(strtoull(argv[5], NULL, 0));

        REQUIRE_HIP(hipMemGetInfo(&free0, &total0));
        printf("before: free %zu total %zu\n", free0, total0);
        REQUIRE(total0 == prop.totalGlobalMem && free0 <= total0 && free0 > size);
        REQUIRE_HIP(hipMalloc(&d, size));
        REQUIRE(d != NULL);
        REQUIRE_HIP(hipMemGetInfo(&free1, &total1));
        printf("allocated: free %zu total %zu\n", free1, total1);
        REQUIRE(total1 == total0 && free1 + size <= free0);

        {
                /* HIP knows its own allocations: what they are and where, device and host */
                hipPointerAttribute_t pa;
                REQUIRE_HIP(hipPointerGetAttributes(&pa, d));
                REQUIRE(pa.memoryType == hipMemoryTypeDevice && pa.device == 0 && pa.devicePointer == d);
        }
        REQUIRE_HIP(hipHostMalloc(&h, host, 0));
        {
                hipPointerAttribute_t pa;
                REQUIRE_HIP(hipPointerGetAttributes(&pa, h));
                REQUIRE(pa.memoryType == hipMemoryTypeHost && pa.hostPointer == h);
        }
        for (size_t i = 0; i < host / 8; i++)
                ((volatile uint64_t *)h)[i] = i * 0x9e3779b97f4a7c15ULL;
        printf("holding %p %p\n", d, h);
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
                return 1;
        for (size_t i = 0; i < host / 8; i++)
                REQUIRE(((volatile uint64_t *)h)[i] == i * 0x9e3779b97f4a7c15ULL);
        REQUIRE_HIP(hipHostFree(h));
        REQUIRE_HIP(hipFree(d));
        REQUIRE_HIP(hipMemGetInfo(&free2, &total2));
        printf("freed: free %zu total %zu\n", free2, total2);
        REQUIRE(total2 == total0 && free2 == free0);
        printf("ok\n");
        return 0;
}
