/* libhsakmt (ROCm 5.2.3) through gpumemd across fork(): the child's KFD is its own, as on the kernel. */
#include <errno.h>
#include <fcntl.h>
#include <hsakmt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hsakmt-check.h"

#define SIZE (2ULL << 20)
/* KFD's GET_VERSION (kfd_ioctl.h): _IOR('K', 0x01, two u32) */
#define KFD_GET_VERSION 0x80084B01ul
struct kfd_version {
        uint32_t major_version, minor_version;
};

static uint32_t gpu_node;
/* registered pages outside the window: .bss, the heap and the main thread's stack (set in main) */
static uint64_t bss_pages[2 * 4096 / 8] __attribute__((aligned(4096)));
static volatile uint64_t *heap_pages, *stack_pages;

static void fill(volatile uint64_t *p, uint64_t n, uint64_t seed)
{
        for (uint64_t i = 0; i < n; i++)
                p[i] = seed * 0x9e3779b97f4a7c15ULL + i;
}

static int holds(volatile uint64_t *p, uint64_t n, uint64_t seed)
{
        for (uint64_t i = 0; i < n; i++)
                if (p[i] != seed * 0x9e3779b97f4a7c15ULL + i)
                        return 0;
        return 1;
}

/* Can this process read @p? (write() into a pipe from it answers EFAULT where nothing readable is
 * mapped.) */
static int readable(const void *p)
{
        int fds[2];
        ssize_t n;

        if (pipe(fds) < 0)
                return -1;
        n = write(fds[1], p, 1);
        close(fds[0]);
        close(fds[1]);
        return n == 1;
}

/* The libhsakmt calls a forked child makes to have a KFD of its own (as AMD's kfdtest does). */
static int reopen(void)
{
        HsaSystemProperties sp;

        REQUIRE_KMT(hsaKmtReleaseSystemProperties());
        REQUIRE_KMT(hsaKmtOpenKFD());
        REQUIRE_KMT(hsaKmtAcquireSystemProperties(&sp));
        REQUIRE(sp.NumNodes > gpu_node);
        return 0;
}

/* A 2 MiB VRAM BO of the child's own, mapped, written and read back. */
static int child_alloc(void **ret)
{
        HsaMemFlags f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS | KMT_COARSE_GRAIN);
        uint64_t va = 0;

        REQUIRE_KMT(hsaKmtAllocMemory(gpu_node, SIZE, f, ret));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(*ret, SIZE, &va));
        fill(*ret, SIZE / 8, 7);
        REQUIRE(holds(*ret, SIZE / 8, 7));
        return 0;
}

/*
 * The first child: the parent's KFD is not its own (EBADF on the inherited fd, the parent's BOs not
 * mapped), registered pages are its own copies, and it opens a KFD of its own and holds memory there until
 * a line comes on stdin.
 */
static int child(int kfd, void *vram, void *gtt, void *paged)
{
        struct kfd_version v = {0};
        void *mine = NULL;
        char line[16];

        REQUIRE(ioctl(kfd, KFD_GET_VERSION, &v) == -1 && errno == EBADF);
        close(kfd);
        CHECK(readable(vram) == 0);
        CHECK(readable(gtt) == 0);
        /* libhsakmt's paged memory: registered at its own address, in the window */
        CHECK(readable(paged) == 0);
        /* what the registered pages held at the fork, then written: the parent's stay as they are */
        REQUIRE(holds(bss_pages, sizeof(bss_pages) / 8, 4));
        REQUIRE(holds(heap_pages, SIZE / 8, 5));
        REQUIRE(holds(stack_pages, 1024, 6));
        fill(bss_pages, sizeof(bss_pages) / 8, 14);
        fill(heap_pages, SIZE / 8, 15);
        fill(stack_pages, 1024, 16);
        /* libhsakmt's own calls: it sees the fork, closes what it inherited and opens the KFD again */
        if (reopen() != 0 || child_alloc(&mine) != 0)
                return 1;
        printf("child holding %d vram=%p\n", (int)getpid(), mine);
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
                return 1;
        REQUIRE(holds(mine, SIZE / 8, 7));
        REQUIRE_KMT(hsaKmtUnmapMemoryToGPU(mine));
        REQUIRE_KMT(hsaKmtFreeMemory(mine, SIZE));
        REQUIRE(holds(heap_pages, SIZE / 8, 15));
        REQUIRE_KMT(hsaKmtReleaseSystemProperties());
        REQUIRE_KMT(hsaKmtCloseKFD());
        return 0;
}

/* The parent after a child: its KFD, its memory and its registered pages as they were, and it allocates. */
static int parent_goes_on(int kfd, void *vram, void *gtt, void *paged)
{
        struct kfd_version v = {0};
        HsaMemFlags f = kmt_flags(KMT_NON_PAGED | KMT_COARSE_GRAIN);
        void *p = NULL;

        REQUIRE(ioctl(kfd, KFD_GET_VERSION, &v) == 0 && v.major_version == 1);
        REQUIRE(holds(vram, SIZE / 8, 1));
        REQUIRE(holds(gtt, SIZE / 8, 2));
        REQUIRE(holds(paged, SIZE / 8, 3));
        REQUIRE(holds(bss_pages, sizeof(bss_pages) / 8, 4));
        REQUIRE(holds(heap_pages, SIZE / 8, 5));
        REQUIRE(holds(stack_pages, 1024, 6));
        REQUIRE_KMT(hsaKmtAllocMemory(gpu_node, SIZE, f, &p));
        REQUIRE_KMT(hsaKmtFreeMemory(p, SIZE));
        return 0;
}

static int register_pages(volatile void *p, uint64_t n);
static int deregister(volatile void *p);

/*
 * A fork from a function whose stack pages (those below it, where fork() and what it calls run) are
 * registered, as a program that registers a local array may do: parent and child each return from fork()
 * on their own frames.
 */
static __attribute__((noinline)) int fork_on_registered_stack(void)
{
        volatile char here = 0;
        uint64_t top = ((uint64_t)(uintptr_t)&here & ~4095ull) + 4096, size = 4 * 4096;
        pid_t self = getpid(), pid;
        int st = 0;

        if (register_pages((volatile void *)(uintptr_t)(top - size), size) != 0)
                return 1;
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0)
                _exit(getpid() != self && getppid() == self && here == 0 ? 0 : 1);
        REQUIRE(getpid() == self && here == 0);
        REQUIRE(waitpid(pid, &st, 0) == pid);
        REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        return deregister((volatile void *)(uintptr_t)(top - size));
}

/* Register @n bytes at @p (page-aligned, outside the window) and map them on the GPU. */
static int register_pages(volatile void *p, uint64_t n)
{
        uint64_t va = 0;

        REQUIRE_KMT(hsaKmtRegisterMemory((void *)p, n));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU((void *)p, n, &va));
        return 0;
}

static int deregister(volatile void *p)
{
        REQUIRE_KMT(hsaKmtUnmapMemoryToGPU((void *)p));
        REQUIRE_KMT(hsaKmtDeregisterMemory((void *)p));
        return 0;
}

/*
 * Usage: hsakmt-fork
 * Opens the KFD, allocates VRAM, GTT and paged memory and registers .bss, heap and stack pages, then forks:
 * the first child checks what it inherited, opens its own KFD, says "child holding PID" and holds memory
 * until a line comes on stdin; the parent waits for it, goes on, forks a second child that opens its own KFD
 * and kills it with SIGKILL while it holds memory, goes on again, says "parent holding", and frees it all
 * after a line on stdin.
 */
int main(void)
{
        uint64_t stack_area[3 * 4096 / 8];
        HsaMemFlags f;
        void *vram = NULL, *gtt = NULL, *paged = NULL;
        uint64_t va = 0;
        char line[16];
        int kfd, st = 0, r, pipefd[2];
        pid_t pid;

        if (kmt_open_gpu(&gpu_node))
                return 1;
        REQUIRE(gpu_node > 0);
        /* a raw fd of its own, for the child's ioctl on what it inherited (libhsakmt's is O_CLOEXEC too) */
        kfd = open("/dev/kfd", O_RDWR);
        REQUIRE(kfd >= 0);

        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS | KMT_COARSE_GRAIN);
        REQUIRE_KMT(hsaKmtAllocMemory(gpu_node, SIZE, f, &vram));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(vram, SIZE, &va));
        fill(vram, SIZE / 8, 1);
        f = kmt_flags(KMT_NON_PAGED | KMT_HOST_ACCESS);
        REQUIRE_KMT(hsaKmtAllocMemory(0, SIZE, f, &gtt));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(gtt, SIZE, &va));
        fill(gtt, SIZE / 8, 2);
        /* libhsakmt maps its BOs MADV_DONTFORK; this one not, as a program's own mapping might be: the child
         * still does not reach it */
        REQUIRE(madvise(gtt, SIZE, MADV_DOFORK) == 0);
        f = kmt_flags(KMT_HOST_ACCESS);
        REQUIRE_KMT(hsaKmtAllocMemory(0, SIZE, f, &paged));
        REQUIRE_KMT(hsaKmtMapMemoryToGPU(paged, SIZE, &va));
        fill(paged, SIZE / 8, 3);

        fill(bss_pages, sizeof(bss_pages) / 8, 4);
        heap_pages = aligned_alloc(4096, SIZE);
        REQUIRE(heap_pages != NULL);
        fill(heap_pages, SIZE / 8, 5);
        /* a whole page of this stack frame's, which the fork's own calls run on as well */
        stack_pages = (volatile uint64_t *)(((uintptr_t)stack_area + 4095) & ~(uintptr_t)4095);
        fill(stack_pages, 1024, 6);
        if (register_pages(bss_pages, sizeof(bss_pages)) || register_pages(heap_pages, SIZE) ||
            register_pages(stack_pages, 4096))
                return 1;

        /* a child that exits */
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0)
                _exit(child(kfd, vram, gtt, paged));
        REQUIRE(waitpid(pid, &st, 0) == pid);
        /* the parent's pages first: what the child wrote did not reach them, whatever else it found */
        r = parent_goes_on(kfd, vram, gtt, paged);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        if (r != 0 || check_failures)
                return 1;

        /* a child killed while it holds memory of its own */
        REQUIRE(pipe(pipefd) == 0);
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
                void *mine = NULL;

                r = reopen() != 0 || child_alloc(&mine) != 0;

                if (write(pipefd[1], &r, sizeof(r)) != sizeof(r))
                        _exit(1);
                for (;;)
                        pause();
        }
        REQUIRE(read(pipefd[0], &st, sizeof(st)) == sizeof(st) && st == 0);
        REQUIRE(kill(pid, SIGKILL) == 0);
        REQUIRE(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st));
        printf("killed child %d\n", (int)pid);
        if (parent_goes_on(kfd, vram, gtt, paged) != 0)
                return 1;

        if (fork_on_registered_stack() != 0)
                return 1;
        printf("forked on registered stack pages\n");
        printf("parent holding\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
                return 1;
        if (parent_goes_on(kfd, vram, gtt, paged) != 0)
                return 1;
        if (deregister(bss_pages) || deregister(heap_pages) || deregister(stack_pages))
                return 1;
        REQUIRE(holds(heap_pages, SIZE / 8, 5));
        if (kmt_unmap_free(vram, SIZE) || kmt_unmap_free(gtt, SIZE) || kmt_unmap_free(paged, SIZE))
                return 1;
        close(kfd);
        REQUIRE_KMT(hsaKmtReleaseSystemProperties());
        REQUIRE_KMT(hsaKmtCloseKFD());
        printf("passed\n");
        return 0;
}
