/* HIP managed memory (hipMallocManaged) on the KFD model: advice, prefetch, range and pointer attributes, and
 * copies whose engine reaches the range through the SVM attributes HIP set. With the argument "hold": it
 * prints "holding" twice, while it holds the memory and after it freed it, each time waiting for a line on
 * stdin (for a test that looks at the daemon meanwhile). */
#include <hip/hip_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip-check.h"

#define SIZE (8u << 20)

static int hold(bool wanted)
{
        char line[16];

        if (!wanted)
                return 0;
        printf("holding\n");
        fflush(stdout);
        return fgets(line, sizeof(line), stdin) ? 0 : 1;
}

int main(int argc, char **argv)
{
        const bool holding = argc > 1 && strcmp(argv[1], "hold") == 0;
        uint8_t *m = NULL, *back = NULL;
        void *dev = NULL;
        hipPointerAttribute_t pa;
        int loc = -2, managed = 0;
        hipStream_t s;

        REQUIRE_HIP(hipDeviceGetAttribute(&managed, hipDeviceAttributeManagedMemory, 0));
        printf("managed memory: %d\n", managed);
        REQUIRE_HIP(hipMallocManaged((void **)&m, SIZE, hipMemAttachGlobal));
        REQUIRE_HIP(hipMallocManaged((void **)&back, SIZE, hipMemAttachGlobal));
        for (size_t i = 0; i < SIZE; i++)
                m[i] = (uint8_t)(i * 7 + (i >> 12));
        memset(back, 0, SIZE);

        REQUIRE_HIP(hipPointerGetAttributes(&pa, m));
        REQUIRE(pa.isManaged);
        printf("pointer attributes: managed\n");

        /* advice and its attributes */
        REQUIRE_HIP(hipMemAdvise(m, SIZE, hipMemAdviseSetPreferredLocation, 0));
        REQUIRE_HIP(hipMemAdvise(m, SIZE, hipMemAdviseSetAccessedBy, 0));
        REQUIRE_HIP(
                hipMemRangeGetAttribute(&loc, sizeof(loc), hipMemRangeAttributePreferredLocation, m, SIZE));
        REQUIRE(loc == 0);
        {
                int by[4] = {-5, -5, -5, -5};
                REQUIRE_HIP(hipMemRangeGetAttribute(by, sizeof(by), hipMemRangeAttributeAccessedBy, m, SIZE));
                REQUIRE(by[0] == 0);
        }
        printf("advice: preferred location and accessed-by: ok\n");

        /* prefetch to the device and back to the host: the last prefetch location follows, the bytes stay */
        REQUIRE_HIP(hipStreamCreate(&s));
        REQUIRE_HIP(hipMemPrefetchAsync(m, SIZE, 0, s));
        REQUIRE_HIP(hipStreamSynchronize(s));
        REQUIRE_HIP(hipMemRangeGetAttribute(&loc, sizeof(loc), hipMemRangeAttributeLastPrefetchLocation, m,
                                            SIZE));
        REQUIRE(loc == 0);
        REQUIRE_HIP(hipMemPrefetchAsync(m, SIZE, hipCpuDeviceId, s));
        REQUIRE_HIP(hipStreamSynchronize(s));
        REQUIRE_HIP(hipMemRangeGetAttribute(&loc, sizeof(loc), hipMemRangeAttributeLastPrefetchLocation, m,
                                            SIZE));
        REQUIRE(loc == hipCpuDeviceId);
        for (size_t i = 0; i < SIZE; i += 4093)
                REQUIRE(m[i] == (uint8_t)(i * 7 + (i >> 12)));
        printf("prefetch to the device and back: ok\n");

        /* the GPU's engines read and write managed memory: managed -> device -> managed */
        REQUIRE_HIP(hipMalloc(&dev, SIZE));
        REQUIRE_HIP(hipMemcpy(dev, m, SIZE, hipMemcpyDefault));
        REQUIRE_HIP(hipMemcpy(back, dev, SIZE, hipMemcpyDefault));
        REQUIRE(memcmp(m, back, SIZE) == 0);
        REQUIRE_HIP(hipMemcpyAsync(back + 4096, m, 3 * 4096 + 5, hipMemcpyDefault, s));
        REQUIRE_HIP(hipStreamSynchronize(s));
        REQUIRE(memcmp(back + 4096, m, 3 * 4096 + 5) == 0);
        printf("copies to and from managed memory: ok\n");
        REQUIRE(hold(holding) == 0);

        REQUIRE_HIP(hipFree(dev));
        REQUIRE_HIP(hipStreamDestroy(s));
        REQUIRE_HIP(hipFree(m));
        REQUIRE_HIP(hipFree(back));
        REQUIRE(hold(holding) == 0);
        printf("ok\n");
        return 0;
}
