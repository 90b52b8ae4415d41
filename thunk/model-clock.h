/* The model's GPU reference clock: what its engines write as timestamps and GET_CLOCK_COUNTERS reports. */
#pragma once

#include <stdint.h>
#include <time.h>

/* The counter runs at 100 MHz, as the reference clock of the GFX9 GPUs the presets describe. It is taken
 * from the host's raw monotonic clock, so that every process on the host (a gpumemd client and the daemon
 * running its queues) reads one counter. */
#define MODEL_GPU_CLOCK_HZ 100000000ULL

static inline uint64_t model_gpu_clock_now(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
        return ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) /
               (1000000000ULL / MODEL_GPU_CLOCK_HZ);
}
