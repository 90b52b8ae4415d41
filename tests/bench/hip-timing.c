/* Times HIP memory calls under whichever KFD the process has (the model's preload, or gpumemd's). */
#include <hip/hip_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

/* One line per op: "op NAME N P50_NS P99_NS MEAN_NS" (the bench reads them). */
static void report(const char *name, uint64_t *s, size_t n)
{
        uint64_t sum = 0;

        for (size_t i = 0; i < n; i++)
                sum += s[i];
        qsort(s, n, sizeof(*s), bench_cmp_u64);
        printf("op %s %zu %llu %llu %llu\n", name, n, (unsigned long long)s[n / 2],
               (unsigned long long)s[(n * 99) / 100], (unsigned long long)(sum / n));
}

int main(int argc, char **argv)
{
        size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
        uint64_t *s = calloc(n ? n : 1, sizeof(*s));
        size_t free_b, total;
        void *p;

        if (!s || n == 0)
                return 2;
        /* sizes above what ROCr keeps in its own blocks, so every call reaches the KFD */
        const size_t dev = 8ull << 20, host = 4ull << 20;
        if (hipSetDevice(0) != hipSuccess || hipMalloc(&p, dev) != hipSuccess || hipFree(p) != hipSuccess)
                return fprintf(stderr, "hip-timing: HIP has no device\n"), 1;
        for (size_t i = 0; i < n; i++) {
                uint64_t t = bench_now_ns();
                if (hipMalloc(&p, dev) != hipSuccess || hipFree(p) != hipSuccess)
                        return 1;
                s[i] = bench_now_ns() - t;
        }
        report("hipMalloc+hipFree", s, n);
        for (size_t i = 0; i < n; i++) {
                uint64_t t = bench_now_ns();
                if (hipHostMalloc(&p, host, 0) != hipSuccess || hipHostFree(p) != hipSuccess)
                        return 1;
                s[i] = bench_now_ns() - t;
        }
        report("hipHostMalloc+hipHostFree", s, n);
        for (size_t i = 0; i < n; i++) {
                uint64_t t = bench_now_ns();
                if (hipMemGetInfo(&free_b, &total) != hipSuccess)
                        return 1;
                s[i] = bench_now_ns() - t;
        }
        report("hipMemGetInfo", s, n);
        /* managed memory that HIP maps itself and the KFD gives attributes and a prefetch */
        for (size_t i = 0; i < n; i++) {
                uint64_t t = bench_now_ns();
                if (hipMallocManaged(&p, 2ull << 20, hipMemAttachGlobal) != hipSuccess ||
                    hipMemPrefetchAsync(p, 2ull << 20, 0, NULL) != hipSuccess ||
                    hipDeviceSynchronize() != hipSuccess || hipFree(p) != hipSuccess)
                        return 1;
                s[i] = bench_now_ns() - t;
        }
        report("hipMallocManaged+prefetch+free", s, n);
        /* 64 MiB copies to the device: from malloc'ed memory (HIP pins its pages for the copy) and from
         * pinned memory; fewer rounds, each moves 64 MiB */
        const size_t big = 64ull << 20;
        size_t nb = n < 20 ? n : 20;
        void *d = NULL, *pinned = NULL;
        char *pageable = malloc(big);
        if (!pageable || hipMalloc(&d, big) != hipSuccess || hipHostMalloc(&pinned, big, 0) != hipSuccess)
                return 1;
        memset(pageable, 1, big);
        memset(pinned, 2, big);
        for (size_t i = 0; i < nb; i++) {
                uint64_t t = bench_now_ns();
                if (hipMemcpy(d, pageable, big, hipMemcpyHostToDevice) != hipSuccess)
                        return 1;
                s[i] = bench_now_ns() - t;
        }
        report("hipMemcpy-pageable-64MiB", s, nb);
        for (size_t i = 0; i < nb; i++) {
                uint64_t t = bench_now_ns();
                if (hipMemcpy(d, pinned, big, hipMemcpyHostToDevice) != hipSuccess)
                        return 1;
                s[i] = bench_now_ns() - t;
        }
        report("hipMemcpy-pinned-64MiB", s, nb);
        hipFree(d);
        hipHostFree(pinned);
        free(pageable);
        /* one registration of 4 GiB of written heap memory, and its end (more than process_vm_readv or
         * one read moves at once) */
        const size_t huge = 4ull << 30;
        char *h = malloc(huge);
        if (!h)
                return 1;
        memset(h, 3, huge);
        uint64_t t = bench_now_ns();
        if (hipHostRegister(h, huge, hipHostRegisterDefault) != hipSuccess ||
            hipHostUnregister(h) != hipSuccess)
                return fprintf(stderr, "hip-timing: a 4 GiB registration failed\n"), 1;
        s[0] = bench_now_ns() - t;
        for (size_t i = 0; i < huge; i += 4096)
                if (h[i] != 3)
                        return fprintf(stderr, "hip-timing: the 4 GiB registration changed byte %zu\n", i), 1;
        report("hipHostRegister-4GiB", s, 1);
        free(h);
        free(s);
        return 0;
}
