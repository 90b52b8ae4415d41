/* libhsakmt (ROCm 5.2.3) through gpumemd: run under libgpumem-kfd.so with no /dev/kfd of its own. */
#include <errno.h>
#include <fcntl.h>
#include <hsakmt.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <time.h>

#include "hsakmt-check.h"

#define SIZE (2ULL << 20)

/* Fill @p with a pattern, or (@check) verify it. */
static int pattern(volatile uint64_t *p, uint64_t n, uint64_t seed, int check)
{
        for (uint64_t i = 0; i < n; i++) {
                if (!check)
                        p[i] = seed * 0x9e3779b97f4a7c15ULL + i;
                else if (p[i] != seed * 0x9e3779b97f4a7c15ULL + i)
                        return -1;
        }
        return 0;
}

static void *waiter(void *arg)
{
        HsaEvent *ev = arg;
        return (void *)(uintptr_t)hsaKmtWaitOnEvent(ev, 5000);
}

/* Signal events kept by the daemon: timeouts, set and auto-reset, and a wait that holds up nothing else. */
static int test_events(uint32_t gpu_node)
{
        HsaEventDescriptor d = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu_node};
        HsaEvent *ev = NULL;
        pthread_t th;
        void *res = NULL, *p = NULL;
        HsaMemFlags f;
        double t;

        REQUIRE_KMT(hsaKmtCreateEvent(&d, false, false, &ev));
        REQUIRE(check_signal_event(ev) == 0);

        /* another thread waits; this one allocates meanwhile over the same connection, then wakes it */
        REQUIRE(pthread_create(&th, NULL, waiter, ev) == 0);
        usleep(50 * 1000);
        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS);
        t = now_ms();
        REQUIRE_KMT(hsaKmtAllocMemory(0, SIZE, f, &p));
        REQUIRE_KMT(hsaKmtFreeMemory(p, SIZE));
        REQUIRE(now_ms() - t < 1000); /* not held up behind the wait */
        REQUIRE_KMT(hsaKmtSetEvent(ev));
        REQUIRE(pthread_join(th, &res) == 0);
        REQUIRE((uintptr_t)res == HSAKMT_STATUS_SUCCESS);
        REQUIRE_KMT(hsaKmtDestroyEvent(ev));
        printf("events passed\n");
        return 0;
}

/* KFD's GET_VERSION (kfd_ioctl.h): _IOR('K', 0x01, two u32) */
#define KFD_GET_VERSION 0x80084B01ul
struct kfd_version {
        uint32_t major_version, minor_version;
};

/*
 * A forked child does not inherit the KFD, as on the kernel: its ioctls on the inherited fd fail with
 * EBADF, and its exit disturbs nothing of its parent's (connection, topology).
 */
static int test_fork(void)
{
        struct kfd_version v = {0};
        int fd = open("/dev/kfd", O_RDWR | O_CLOEXEC), st = -1;
        pid_t pid;

        REQUIRE(fd >= 0);
        REQUIRE(ioctl(fd, KFD_GET_VERSION, &v) == 0 && v.major_version == 1);
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0)
                _exit(ioctl(fd, KFD_GET_VERSION, &v) == -1 && errno == EBADF ? 0 : 1);
        REQUIRE(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        REQUIRE(ioctl(fd, KFD_GET_VERSION, &v) == 0);
        close(fd);
        /* the topology the library serves is still there for the parent */
        fd = open("/sys/devices/virtual/kfd/kfd/topology/generation_id", O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        close(fd);
        return 0;
}

/* "fill": 2 MiB VRAM BOs until the daemon refuses one (the class's limit); says how many, frees them. */
static int fill(uint32_t gpu_node)
{
        void *bo[64];
        HsaMemFlags f;
        int n = 0;

        f = kmt_flags(KMT_NON_PAGED | KMT_COARSE_GRAIN);
        while (n < 64 && hsaKmtAllocMemory(gpu_node, SIZE, f, &bo[n]) == HSAKMT_STATUS_SUCCESS)
                n++;
        printf("got %d\n", n);
        fflush(stdout);
        while (n > 0)
                REQUIRE_KMT(hsaKmtFreeMemory(bo[--n], SIZE));
        REQUIRE_KMT(hsaKmtCloseKFD());
        printf("closed\n");
        return 0;
}

/*
 * Usage: hsakmt-broker VRAM_BYTES [fill]
 * Opens the KFD, checks the GPU node against the daemon's preset, makes host-visible VRAM, GTT and
 * registered (paged) system memory, maps each on the GPU and writes a pattern, says "holding" and waits
 * for a line on stdin (the test looks at the daemon meanwhile), then checks the patterns, frees it all and
 * closes the KFD.
 */
int main(int argc, char **argv)
{
        uint64_t vram_bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 0;
        HsaVersionInfo v;
        HsaSystemProperties sp;
        HsaNodeProperties np;
        HsaMemFlags f;
        uint32_t gpu_node = 0;
        void *vram = NULL, *gtt = NULL, *paged = NULL;
        uint64_t va = 0;
        char line[16];
        int gpus = 0;

        REQUIRE_KMT(hsaKmtOpenKFD());
        REQUIRE_KMT(hsaKmtGetVersion(&v));
        REQUIRE(v.KernelInterfaceMajorVersion == 1);
        REQUIRE_KMT(hsaKmtAcquireSystemProperties(&sp));
        for (uint32_t n = 0; n < sp.NumNodes; n++) {
                REQUIRE_KMT(hsaKmtGetNodeProperties(n, &np));
                if (np.NumFComputeCores == 0)
                        continue;
                gpus++;
                gpu_node = n;
                REQUIRE(np.LocalMemSize == vram_bytes);
        }
        REQUIRE(gpus >= 1);
        if (test_fork() != 0)
                return 1;
        if (argc > 2 && strcmp(argv[2], "fill") == 0)
                return fill(gpu_node);

        /* host-visible VRAM on the GPU node */
        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS | KMT_COARSE_GRAIN);
        REQUIRE_KMT(hsaKmtAllocMemory(gpu_node, SIZE, f, &vram));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(vram, SIZE, &va));
        REQUIRE(pattern(vram, SIZE / 8, 1, 0) == 0);

        /* system memory the GPU reaches (GTT) */
        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS);
        REQUIRE_KMT(hsaKmtAllocMemory(0, SIZE, f, &gtt));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(gtt, SIZE, &va));
        REQUIRE(pattern(gtt, SIZE / 8, 2, 0) == 0);

        /* paged system memory: libhsakmt's own pages in its aperture, registered (userptr) */
        f = kmt_flags(KMT_HOST_ACCESS);
        REQUIRE_KMT(hsaKmtAllocMemory(0, SIZE, f, &paged));
        REQUIRE(pattern(paged, SIZE / 8, 3, 0) == 0);
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(paged, SIZE, &va));
        /* what it held before the registration is still there */
        REQUIRE(pattern(paged, SIZE / 8, 3, 1) == 0);

        printf("holding vram=%p gtt=%p paged=%p\n", vram, gtt, paged);
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
                return 1;

        REQUIRE(pattern(vram, SIZE / 8, 1, 1) == 0);
        REQUIRE(pattern(gtt, SIZE / 8, 2, 1) == 0);
        REQUIRE(pattern(paged, SIZE / 8, 3, 1) == 0);
        if (kmt_unmap_free(vram, SIZE) || kmt_unmap_free(gtt, SIZE) || kmt_unmap_free(paged, SIZE))
                return 1;
        if (test_events(gpu_node) != 0)
                return 1;
        REQUIRE_KMT(hsaKmtReleaseSystemProperties());
        REQUIRE_KMT(hsaKmtCloseKFD());
        printf("closed\n");
        return 0;
}
