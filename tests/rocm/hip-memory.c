/* HIP device and memory calls on the KFD model; the numbers must agree with the preset (argv). */
#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip-check.h"
#include "model-stats.h"

int main(int argc, char **argv)
{
        int count = -1;
        hipDeviceProp_t prop;
        size_t free0, total0, free1, total1, free2, total2;
        void *p = NULL;
        ModelCounts c0, c1, c2;
        const size_t size = 256ULL << 20;

        if (argc != 4) {
                fprintf(stderr, "usage: %s GCN_ARCH_NAME VRAM_BYTES CU_COUNT\n", argv[0]);
                return 2;
        }
        REQUIRE_HIP(hipGetDeviceCount(&count));
        REQUIRE(count == 1);
        REQUIRE_HIP(hipGetDeviceProperties(&prop, 0));
        printf("device 0: %s arch %s mem %zu cus %d\n", prop.name, prop.gcnArchName, prop.totalGlobalMem,
               prop.multiProcessorCount);
        REQUIRE(strncmp(prop.gcnArchName, argv[1], strlen(argv[1])) == 0);
        REQUIRE(prop.totalGlobalMem == strtoull(argv[2], NULL, 0));
        REQUIRE(prop.multiProcessorCount == atoi(argv[3]));
        REQUIRE_HIP(hipMemGetInfo(&free0, &total0));
        printf("before: free %zu total %zu\n", free0, total0);
        REQUIRE(total0 == prop.totalGlobalMem);
        REQUIRE(free0 <= total0 && free0 > size);
        /* the first allocation may also set up the runtime's own buffers: measure from the second one */
        REQUIRE_HIP(hipMalloc(&p, 1 << 20));
        REQUIRE_HIP(hipFree(p));
        REQUIRE(model_counts(&c0) == 0);
        REQUIRE_HIP(hipMalloc(&p, size));
        REQUIRE(p != NULL);
        /* the model saw the VRAM allocation, and nothing else changed in system memory */
        REQUIRE(model_counts(&c1) == 0);
        REQUIRE(c1.vram_used >= c0.vram_used + size && c1.mems > c0.mems);
        REQUIRE_HIP(hipMemGetInfo(&free1, &total1));
        printf("allocated: free %zu total %zu\n", free1, total1);
        REQUIRE(total1 == total0);
        REQUIRE(free1 + size <= free0);
        REQUIRE_HIP(hipFree(p));
        REQUIRE_HIP(hipMemGetInfo(&free2, &total2));
        printf("freed: free %zu total %zu\n", free2, total2);
        REQUIRE(total2 == total0 && free2 == free0);
        /* and the model's accounting is back where it started */
        REQUIRE(model_counts(&c2) == 0);
        printf("model: handles %llu -> %llu -> %llu, vram %llu -> %llu -> %llu\n", c0.mems, c1.mems, c2.mems,
               c0.vram_used, c1.vram_used, c2.vram_used);
        REQUIRE(c2.vram_used == c0.vram_used && c2.mems == c0.mems && c2.bufs == c0.bufs &&
                c2.mappings == c0.mappings && c2.system_used == c0.system_used && c2.ttm_used == c0.ttm_used);
        printf("ok\n");
        return 0;
}
