/* The libhsakmt tests' shared pieces: the check of a thunk call, memory flags, and a signal event's waits. */
#pragma once

#include <hsakmt.h>
#include <string.h>
#include <time.h>

#include "../common/check.h"

/* an HSAKMT_STATUS that must be HSAKMT_STATUS_SUCCESS */
#define REQUIRE_KMT(expr) REQUIRE_EQ(expr, HSAKMT_STATUS_SUCCESS)

static inline double now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Open the KFD and find its GPU (the last node with compute units) into *@ret_node. 0, or 1 when a check
 * failed. */
static inline int kmt_open_gpu(uint32_t *ret_node)
{
        HsaSystemProperties sp;
        HsaNodeProperties np;

        REQUIRE_KMT(hsaKmtOpenKFD());
        REQUIRE_KMT(hsaKmtAcquireSystemProperties(&sp));
        for (uint32_t n = 0; n < sp.NumNodes; n++) {
                REQUIRE_KMT(hsaKmtGetNodeProperties(n, &np));
                if (np.NumFComputeCores)
                        *ret_node = n;
        }
        return 0;
}

/* Unmap @p (@size bytes) from the GPUs and free it. 0, or 1 when a check failed. */
static inline int kmt_unmap_free(void *p, HSAuint64 size)
{
        REQUIRE_KMT(hsaKmtUnmapMemoryToGPU(p));
        REQUIRE_KMT(hsaKmtFreeMemory(p, size));
        return 0;
}

/* The HsaMemFlags bits the tests ask for; every allocation is of 4 KiB pages. */
enum {
        KMT_NON_PAGED = 1 << 0,
        KMT_HOST_ACCESS = 1 << 1,
        KMT_COARSE_GRAIN = 1 << 2,
        KMT_READ_ONLY = 1 << 3,
};

static inline HsaMemFlags kmt_flags(unsigned bits)
{
        HsaMemFlags f;

        memset(&f, 0, sizeof(f));
        f.ui32.NonPaged = !!(bits & KMT_NON_PAGED);
        f.ui32.HostAccess = !!(bits & KMT_HOST_ACCESS);
        f.ui32.CoarseGrain = !!(bits & KMT_COARSE_GRAIN);
        f.ui32.ReadOnly = !!(bits & KMT_READ_ONLY);
        f.ui32.PageSize = HSA_PAGE_SIZE_4KB;
        return f;
}

/* A new auto-reset signal event @ev: unsignalled, a wait really lasts until its timeout; once set a wait
 * returns, and takes it. 0, or 1 when a check failed. */
static inline int check_signal_event(HsaEvent *ev)
{
        double t = now_ms();

        REQUIRE(hsaKmtWaitOnEvent(ev, 100) == HSAKMT_STATUS_WAIT_TIMEOUT);
        REQUIRE(now_ms() - t >= 95);
        REQUIRE_KMT(hsaKmtSetEvent(ev));
        REQUIRE_KMT(hsaKmtWaitOnEvent(ev, 1000));
        REQUIRE(hsaKmtWaitOnEvent(ev, 10) == HSAKMT_STATUS_WAIT_TIMEOUT);
        return 0;
}
