/* HIP copies on the KFD model: bytes go host -> device -> host through the model's SDMA engines. */
#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model-stats.h"

#define CHECK(cond)                                                                                          \
        do {                                                                                                 \
                if (!(cond)) {                                                                               \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);             \
                        return 1;                                                                            \
                }                                                                                            \
        } while (0)
#define CHECK_HIP(expr)                                                                                      \
        do {                                                                                                 \
                hipError_t e_ = (expr);                                                                      \
                if (e_ != hipSuccess) {                                                                      \
                        fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #expr, (int)e_,         \
                                hipGetErrorString(e_));                                                      \
                        return 1;                                                                            \
                }                                                                                            \
        } while (0)

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

        CHECK(src && dst);
        pattern(src + off, n, seed);
        memset(dst, 0, n + off);
        CHECK_HIP(hipMalloc(&dev, n + off));
        CHECK_HIP(hipMemcpy((uint8_t *)dev + off, src + off, n, hipMemcpyHostToDevice));
        CHECK_HIP(hipMemcpy(dst + off, (uint8_t *)dev + off, n, hipMemcpyDeviceToHost));
        CHECK(memcmp(src + off, dst + off, n) == 0);
        CHECK_HIP(hipFree(dev));
        free(src);
        free(dst);
        return 0;
}

int main(void)
{
        const size_t big = 64ULL << 20;
        ModelCounts c0, c1;
        hipStream_t s;
        uint8_t *pinned = NULL, *ref;
        void *dev = NULL;

        /* the runtime's own buffers come with the first allocation: count from after it */
        CHECK_HIP(hipMalloc(&dev, 1 << 20));
        CHECK_HIP(hipFree(dev));
        CHECK(model_counts(&c0) == 0);

        CHECK(round_trip(1 << 20, 0, 1) == 0);
        CHECK(round_trip(1, 0, 5) == 0);
        CHECK(round_trip(4097, 3, 2) == 0); /* odd size and offsets */
        CHECK(round_trip(big, 0, 3) == 0);  /* more than one SDMA copy packet */
        printf("hipMemcpy host -> device -> host: ok\n");

        /* hipMemcpyAsync into pinned host memory, then hipStreamSynchronize */
        ref = malloc(big);
        CHECK(ref);
        pattern(ref, big, 4);
        CHECK_HIP(hipStreamCreate(&s));
        CHECK_HIP(hipMalloc(&dev, big));
        CHECK_HIP(hipHostMalloc((void **)&pinned, big, 0));
        memcpy(pinned, ref, big);
        CHECK_HIP(hipMemcpyAsync(dev, pinned, big, hipMemcpyHostToDevice, s));
        CHECK_HIP(hipStreamSynchronize(s));
        memset(pinned, 0, big);
        CHECK_HIP(hipMemcpyAsync(pinned, dev, big, hipMemcpyDeviceToHost, s));
        CHECK_HIP(hipStreamSynchronize(s));
        CHECK(memcmp(pinned, ref, big) == 0);
        printf("hipMemcpyAsync to and from pinned memory: ok\n");
        CHECK_HIP(hipHostFree(pinned));
        CHECK_HIP(hipFree(dev));
        CHECK_HIP(hipStreamDestroy(s));
        free(ref);

        /* and the model holds what it held before */
        CHECK(model_counts(&c1) == 0);
        printf("model: handles %llu -> %llu, vram %llu -> %llu\n", c0.mems, c1.mems, c0.vram_used,
               c1.vram_used);
        CHECK(c1.vram_used == c0.vram_used);
        printf("ok\n");
        return 0;
}
