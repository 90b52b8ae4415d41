/* HIP copies on the KFD model: bytes go host -> device -> host through the model's SDMA engines. With the
 * argument "broker" (under libgpumem-kfd.so) the queues are gpumemd's, and the in-process model's counters,
 * which do not exist then, are not read. */
#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip-check.h"
#include "model-stats.h"

static void pattern(uint8_t *p, size_t n, unsigned int seed)
{
        for (size_t i = 0; i < n; i++)
                p[i] = (uint8_t)(i * 131 + seed + (i >> 12));
}

/* hipMemcpy host -> device -> host of @n bytes at byte offset @off of each buffer, pageable host memory. */
static int round_trip(size_t n, size_t off, unsigned int seed)
{
        uint8_t *src = malloc(n + off), *dst = malloc(n + off);
        void *dev = NULL;

        REQUIRE(src && dst);
        pattern(src + off, n, seed);
        memset(dst, 0, n + off);
        REQUIRE_HIP(hipMalloc(&dev, n + off));
        REQUIRE_HIP(hipMemcpy((uint8_t *)dev + off, src + off, n, hipMemcpyHostToDevice));
        REQUIRE_HIP(hipMemcpy(dst + off, (uint8_t *)dev + off, n, hipMemcpyDeviceToHost));
        REQUIRE(memcmp(src + off, dst + off, n) == 0);
        REQUIRE_HIP(hipFree(dev));
        free(src);
        free(dst);
        return 0;
}

/* @host (@n bytes that hold @want) to a new device buffer and back with hipMemcpyAsync on a stream of its
 * own, each way synchronized: the bytes come back. */
static int async_round_trip(uint8_t *host, const uint8_t *want, size_t n)
{
        hipStream_t s;
        void *dev = NULL;

        REQUIRE_HIP(hipStreamCreate(&s));
        REQUIRE_HIP(hipMalloc(&dev, n));
        REQUIRE_HIP(hipMemcpyAsync(dev, host, n, hipMemcpyHostToDevice, s));
        REQUIRE_HIP(hipStreamSynchronize(s));
        memset(host, 0, n);
        REQUIRE_HIP(hipMemcpyAsync(host, dev, n, hipMemcpyDeviceToHost, s));
        REQUIRE_HIP(hipStreamSynchronize(s));
        REQUIRE(memcmp(host, want, n) == 0);
        REQUIRE_HIP(hipFree(dev));
        REQUIRE_HIP(hipStreamDestroy(s));
        return 0;
}

int main(int argc, char **argv)
{
        const bool broker = argc > 1 && strcmp(argv[1], "broker") == 0;
        const size_t big = 64ULL << 20;
        ModelCounts c0, c1;
        uint8_t *pinned = NULL, *ref;
        void *dev = NULL;

        /* the runtime's own buffers come with the first allocation: count from after it */
        REQUIRE_HIP(hipMalloc(&dev, 1 << 20));
        REQUIRE_HIP(hipFree(dev));
        REQUIRE(broker || model_counts(&c0) == 0);

        REQUIRE(round_trip(1 << 20, 0, 1) == 0);
        REQUIRE(round_trip(1, 0, 5) == 0);
        REQUIRE(round_trip(4097, 3, 2) == 0); /* odd size and offsets */
        REQUIRE(round_trip(big, 0, 3) == 0);  /* more than one SDMA copy packet */
        printf("hipMemcpy host -> device -> host: ok\n");

        /* hipMemcpyAsync into pinned host memory, then hipStreamSynchronize */
        ref = malloc(big);
        REQUIRE(ref);
        pattern(ref, big, 4);
        REQUIRE_HIP(hipHostMalloc((void **)&pinned, big, 0));
        memcpy(pinned, ref, big);
        REQUIRE(async_round_trip(pinned, ref, big) == 0);
        printf("hipMemcpyAsync to and from pinned memory: ok\n");
        REQUIRE_HIP(hipHostFree(pinned));
        free(ref);

        /* the program's own pages, registered (hipHostRegister), copied to and from the device; they
         * hold their bytes after hipHostUnregister */
        {
                const size_t n = 3 << 20;
                uint8_t *own = aligned_alloc(4096, n), *want = malloc(n);
                REQUIRE(own && want);
                pattern(own, n, 6);
                memcpy(want, own, n);
                REQUIRE_HIP(hipHostRegister(own, n, hipHostRegisterDefault));
                REQUIRE(memcmp(own, want, n) == 0);
                REQUIRE(async_round_trip(own, want, n) == 0);
                REQUIRE_HIP(hipHostUnregister(own));
                REQUIRE(memcmp(own, want, n) == 0);
                own[0] ^= 1; /* its own pages again, writable */
                free(own);
                free(want);
                printf("hipHostRegister'd pages to and from the device: ok\n");
        }
        if (broker) {
                printf("ok\n");
                return 0;
        }
        /* and the model holds what it held before */
        REQUIRE(model_counts(&c1) == 0);
        printf("model: handles %llu -> %llu, vram %llu -> %llu\n", c0.mems, c1.mems, c0.vram_used,
               c1.vram_used);
        REQUIRE(c1.vram_used == c0.vram_used);
        printf("ok\n");
        return 0;
}
