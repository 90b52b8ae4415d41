/* libhsakmt (ROCm's thunk, unmodified) on the KFD model: PM4 and SDMA queues that run, interrupt and fault.
 * With the argument "broker" (under libgpumem-kfd.so): the queues gpumemd runs in the process's context,
 * their interrupts relayed to its events; the in-process model's counters and the faults are not looked at
 * then. "broker-fault": an SDMA write to a page no longer mapped stops the queue, and the fault reaches the
 * memory event through the daemon (a process's context there is its connection's, so one fault per
 * process). "broker-limit N": the first N queues are made, the next is refused with KFD's no-queue error.
 */
#include <hsakmt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "hsakmt-check.h"
#include "model-stats.h"

#define RING_SIZE 4096
#define BUF_SIZE  (1ULL << 20)

/* PM4 (soc15d.h) and SDMA v4 (vega10_sdma_pkt_open.h) encodings the test writes. */
#define PACKET3(op, n)         ((3u << 30) | (((op)&0xffu) << 8) | (((n)&0x3fffu) << 16))
#define PM4_NOP                0x10
#define PM4_WRITE_DATA         0x37
#define PM4_RELEASE_MEM        0x49
#define SDMA_OP_COPY           1
#define SDMA_OP_WRITE          2
#define SDMA_OP_FENCE          5
#define SDMA_OP_TRAP           6
#define CACHE_FLUSH_AND_INV_TS 0x14
#define EOP                    5

typedef struct Queue {
        HsaQueueResource res;
        uint32_t *ring;
        uint64_t wptr; /* PM4: dwords; SDMA: bytes */
        bool sdma;
} Queue;

static uint32_t gpu_node;

static void *gpu_mem(uint64_t size, bool vram, bool read_only)
{
        HsaMemFlags f;
        void *p = NULL;
        HSAuint64 va;

        f = kmt_flags(KMT_HOST_ACCESS | KMT_NON_PAGED | (read_only ? KMT_READ_ONLY : 0) |
                      (vram ? KMT_COARSE_GRAIN : 0));
        if (hsaKmtAllocMemory(vram ? gpu_node : 0, size, f, &p) != HSAKMT_STATUS_SUCCESS)
                return NULL;
        if (hsaKmtMapMemoryToGPU(p, size, &va) != HSAKMT_STATUS_SUCCESS) {
                hsaKmtFreeMemory(p, size);
                return NULL;
        }
        return p;
}

static void gpu_free(void *p, uint64_t size)
{
        hsaKmtUnmapMemoryToGPU(p);
        hsaKmtFreeMemory(p, size);
}

static int queue_new(Queue *q, bool sdma)
{
        memset(q, 0, sizeof(*q));
        q->sdma = sdma;
        q->ring = gpu_mem(RING_SIZE, false, false);
        REQUIRE(q->ring != NULL);
        memset(q->ring, 0, RING_SIZE);
        REQUIRE_KMT(hsaKmtCreateQueue(gpu_node, sdma ? HSA_QUEUE_SDMA : HSA_QUEUE_COMPUTE, 100,
                                      HSA_QUEUE_PRIORITY_NORMAL, q->ring, RING_SIZE, NULL, &q->res));
        return 0;
}

static void queue_free(Queue *q)
{
        hsaKmtDestroyQueue(q->res.QueueId);
        gpu_free(q->ring, RING_SIZE);
}

/* Appends dwords to the ring and rings the doorbell, as kfdtest's queues do on SOC15: the write pointer is
 * a 64-bit count that only grows (dwords for PM4, bytes for SDMA). */
static void submit(Queue *q, const uint32_t *dw, size_t n)
{
        uint64_t pos = q->sdma ? q->wptr / 4 : q->wptr;

        for (size_t i = 0; i < n; i++)
                q->ring[(pos + i) % (RING_SIZE / 4)] = dw[i];
        q->wptr += q->sdma ? n * 4 : n;
        __atomic_store_n(q->res.Queue_write_ptr_aql, q->wptr, __ATOMIC_RELEASE);
        __atomic_store_n(q->res.Queue_DoorBell_aql, q->wptr, __ATOMIC_RELEASE);
}

/* Has the engine read everything submitted? PM4 reports a 32-bit dword offset into the ring, SDMA its
 * 64-bit byte count. */
static bool drained(const Queue *q)
{
        for (int i = 0; i < 2000; i++) {
                if (q->sdma && __atomic_load_n(q->res.Queue_read_ptr_aql, __ATOMIC_ACQUIRE) == q->wptr)
                        return true;
                if (!q->sdma &&
                    __atomic_load_n(q->res.Queue_read_ptr, __ATOMIC_ACQUIRE) == q->wptr % (RING_SIZE / 4))
                        return true;
                usleep(1000);
        }
        return false;
}

static bool wait32(volatile uint32_t *p, uint32_t want)
{
        for (int i = 0; i < 2000 && __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; i++)
                usleep(1000);
        return __atomic_load_n(p, __ATOMIC_ACQUIRE) == want;
}

static uint32_t lo(const volatile void *p)
{
        return (uint32_t)(uintptr_t)p;
}

static uint32_t hi(const volatile void *p)
{
        return (uint32_t)((uintptr_t)p >> 32);
}

static int test_pm4(void)
{
        HsaEventDescriptor d = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu_node};
        volatile uint32_t *mem = gpu_mem(BUF_SIZE, false, false);
        HsaEvent *ev = NULL;
        Queue q;

        REQUIRE(mem != NULL);
        REQUIRE(queue_new(&q, false) == 0);
        /* NOPs: single-dword ones and one with a body */
        {
                const uint32_t nops[] = {PACKET3(PM4_NOP, 0x3fff),
                                         PACKET3(PM4_NOP, 0x3fff),
                                         PACKET3(PM4_NOP, 2),
                                         0xdead,
                                         0xbeef,
                                         0xf00d};

                submit(&q, nops, 6);
                REQUIRE(drained(&q));
        }
        /* WRITE_DATA to memory: two dwords land */
        {
                const uint32_t wd[] = {PACKET3(PM4_WRITE_DATA, 4),
                                       5u << 8 | 1u << 20,
                                       lo(mem),
                                       hi(mem),
                                       0x12345678,
                                       0x9abcdef0};

                submit(&q, wd, 6);
                REQUIRE(wait32(&mem[0], 0x12345678) && wait32(&mem[1], 0x9abcdef0));
        }
        /* RELEASE_MEM at end of pipe: the event id goes to the event's slot, the interrupt wakes the waiter
         */
        REQUIRE_KMT(hsaKmtCreateEvent(&d, false, false, &ev));
        REQUIRE(hsaKmtWaitOnEvent(ev, 0) == HSAKMT_STATUS_WAIT_TIMEOUT);
        {
                uint64_t slot = ev->EventData.HWData2;
                const uint32_t rm[] = {PACKET3(PM4_RELEASE_MEM, 6),
                                       CACHE_FLUSH_AND_INV_TS | EOP << 8,
                                       1u << 29 | 2u << 24, /* 32-bit data, interrupt after the write */
                                       (uint32_t)slot,
                                       (uint32_t)(slot >> 32),
                                       ev->EventId,
                                       0,
                                       ev->EventId};

                submit(&q, rm, 8);
        }
        REQUIRE_KMT(hsaKmtWaitOnEvent(ev, 2000));
        REQUIRE(drained(&q));
        REQUIRE_KMT(hsaKmtDestroyEvent(ev));
        queue_free(&q);
        gpu_free((void *)mem, BUF_SIZE);
        printf("pm4: nop, write_data, release_mem interrupt: ok\n");
        return 0;
}

static int test_sdma(void)
{
        HsaEventDescriptor d = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu_node};
        uint8_t *src = gpu_mem(BUF_SIZE, false, false), *vram = gpu_mem(BUF_SIZE, true, false);
        volatile uint32_t *fence = gpu_mem(4096, false, false);
        HsaEvent *ev = NULL;
        Queue q;

        REQUIRE(src && vram && fence);
        for (size_t i = 0; i < BUF_SIZE; i++)
                src[i] = (uint8_t)(i * 7 + 1);
        memset(vram, 0, BUF_SIZE);
        fence[0] = 0;
        REQUIRE(queue_new(&q, true) == 0);
        /* a NOP, then a fence */
        {
                const uint32_t p[] = {0, SDMA_OP_FENCE, lo(fence), hi(fence), 1};

                submit(&q, p, 5);
                REQUIRE(wait32(&fence[0], 1) && drained(&q));
        }
        /* a linear copy from host memory into VRAM, then a fence behind it */
        {
                const uint32_t p[] = {SDMA_OP_COPY, BUF_SIZE - 1,  0,         lo(src),   hi(src), lo(vram),
                                      hi(vram),     SDMA_OP_FENCE, lo(fence), hi(fence), 2};

                submit(&q, p, 11);
                REQUIRE(wait32(&fence[0], 2));
                REQUIRE(memcmp(src, vram, BUF_SIZE) == 0);
        }
        /* a trap after the event id was fenced into its slot: the wait wakes (ROCr's interrupt signals) */
        REQUIRE_KMT(hsaKmtCreateEvent(&d, false, false, &ev));
        {
                uint64_t slot = ev->EventData.HWData2;
                const uint32_t p[] = {SDMA_OP_FENCE, (uint32_t)slot, (uint32_t)(slot >> 32),
                                      ev->EventId,   SDMA_OP_TRAP,   0};

                submit(&q, p, 6);
        }
        REQUIRE_KMT(hsaKmtWaitOnEvent(ev, 2000));
        REQUIRE(drained(&q));
        REQUIRE_KMT(hsaKmtDestroyEvent(ev));
        queue_free(&q);
        gpu_free(src, BUF_SIZE);
        gpu_free(vram, BUF_SIZE);
        gpu_free((void *)fence, 4096);
        printf("sdma: nop, fence, copy host -> vram, trap interrupt: ok\n");
        return 0;
}

/* A write the GPU VM refuses: the memory event reports it and the queue stops. @unmapped: to an address
 * no BO covers (NotPresent), else into a read-only BO (ReadOnly). */
static int test_fault(bool sdma, bool unmapped)
{
        HsaEventDescriptor d = {.EventType = HSA_EVENTTYPE_MEMORY, .NodeId = gpu_node};
        volatile uint32_t *ro = gpu_mem(4096, false, true), *fence = gpu_mem(4096, false, false);
        HsaEvent *ev = NULL;
        uintptr_t target;
        Queue q;

        REQUIRE(ro && fence);
        fence[0] = 0;
        REQUIRE_KMT(hsaKmtCreateEvent(&d, true, false, &ev));
        REQUIRE(queue_new(&q, sdma) == 0);
        /* a page that was mapped and no longer is (taken after the queue's own, which could reuse it) */
        if (unmapped) {
                void *gone = gpu_mem(4096, false, false);

                REQUIRE(gone);
                gpu_free(gone, 4096);
                target = (uintptr_t)gone + 0x10;
        } else {
                target = (uintptr_t)ro + 0x10;
        }
        if (sdma) {
                const uint32_t p[] = {SDMA_OP_WRITE,
                                      (uint32_t)target,
                                      (uint32_t)(target >> 32),
                                      0,
                                      0x5555,
                                      SDMA_OP_FENCE,
                                      lo(fence),
                                      hi(fence),
                                      7};

                submit(&q, p, 9);
        } else {
                const uint32_t p[] = {PACKET3(PM4_WRITE_DATA, 3),
                                      5u << 8,
                                      (uint32_t)target,
                                      (uint32_t)(target >> 32),
                                      0x5555,
                                      PACKET3(PM4_WRITE_DATA, 3),
                                      5u << 8,
                                      lo(fence),
                                      hi(fence),
                                      7};

                submit(&q, p, 10);
        }
        REQUIRE_KMT(hsaKmtWaitOnEvent(ev, 2000));
        printf("%s fault: va 0x%llx not-present %u read-only %u\n", sdma ? "sdma" : "pm4",
               (unsigned long long)ev->EventData.EventData.MemoryAccessFault.VirtualAddress,
               ev->EventData.EventData.MemoryAccessFault.Failure.NotPresent,
               ev->EventData.EventData.MemoryAccessFault.Failure.ReadOnly);
        REQUIRE(ev->EventData.EventData.MemoryAccessFault.VirtualAddress == (target & ~4095ULL));
        REQUIRE(ev->EventData.EventData.MemoryAccessFault.NodeId == gpu_node);
        REQUIRE(ev->EventData.EventData.MemoryAccessFault.Failure.NotPresent == unmapped);
        REQUIRE(ev->EventData.EventData.MemoryAccessFault.Failure.ReadOnly == !unmapped);
        /* the queue stopped at the fault: nothing behind it runs, and the read-only page kept its bytes */
        usleep(50000);
        REQUIRE(fence[0] == 0);
        REQUIRE(ro[4] == 0);
        REQUIRE_KMT(hsaKmtDestroyEvent(ev));
        queue_free(&q);
        gpu_free((void *)ro, 4096);
        gpu_free((void *)fence, 4096);
        return 0;
}

/*
 * What KFD answers besides running packets: a RELEASE_MEM timestamp lies between the GPU clock counters read
 * before and after it (one clock, one rate); the XNACK mode cannot be set, not even to the mode in force,
 * while a queue is alive; an SVM range's attributes are refused for memory the process has not mapped.
 */
static int test_rules(void)
{
        volatile uint64_t *mem = gpu_mem(BUF_SIZE, false, false);
        HsaClockCounters before, after;
        HSA_SVM_ATTRIBUTE at = {.type = HSA_SVM_ATTR_GRANULARITY};
        HSAint32 xnack = -1;
        void *hole;
        Queue q;

        REQUIRE(mem != NULL);
        REQUIRE(queue_new(&q, false) == 0);
        {
                const uint32_t rm[] = {PACKET3(PM4_RELEASE_MEM, 6),
                                       CACHE_FLUSH_AND_INV_TS | EOP << 8,
                                       3u << 29, /* the GPU's 64-bit clock counter, no interrupt */
                                       lo(mem),
                                       hi(mem),
                                       0,
                                       0,
                                       0};

                REQUIRE_KMT(hsaKmtGetClockCounters(gpu_node, &before));
                usleep(1000);
                submit(&q, rm, 8);
                REQUIRE(drained(&q));
                usleep(1000);
                REQUIRE_KMT(hsaKmtGetClockCounters(gpu_node, &after));
                printf("clock: before %llu timestamp %llu after %llu\n",
                       (unsigned long long)before.GPUClockCounter, (unsigned long long)mem[0],
                       (unsigned long long)after.GPUClockCounter);
                REQUIRE(before.GPUClockCounter < mem[0] && mem[0] < after.GPUClockCounter);
        }
        REQUIRE_KMT(hsaKmtGetXNACKMode(&xnack));
        REQUIRE(hsaKmtSetXNACKMode(xnack) == HSAKMT_STATUS_ERROR);
        queue_free(&q);
        REQUIRE_KMT(hsaKmtSetXNACKMode(xnack));

        hole = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(hole != MAP_FAILED);
        REQUIRE_KMT(hsaKmtSVMGetAttr(hole, 4 * 4096, 1, &at));
        REQUIRE(munmap((char *)hole + 4096, 4096) == 0);
        REQUIRE(hsaKmtSVMGetAttr(hole, 4 * 4096, 1, &at) == HSAKMT_STATUS_ERROR);
        REQUIRE(hsaKmtSVMGetAttr((char *)hole + 4096, 4096, 1, &at) == HSAKMT_STATUS_ERROR);
        munmap(hole, 4 * 4096);
        gpu_free((void *)mem, BUF_SIZE);
        printf("rules: clock, xnack with a queue, svm attributes of unmapped memory: ok\n");
        return 0;
}

static int open_kfd(void)
{
        if (kmt_open_gpu(&gpu_node))
                return 1;
        REQUIRE(gpu_node != 0);
        return 0;
}

static bool broker;

static int close_kfd(void)
{
        ModelCounts c;

        if (broker) {
                REQUIRE_KMT(hsaKmtReleaseSystemProperties());
                REQUIRE_KMT(hsaKmtCloseKFD());
                return 0;
        }

        REQUIRE_KMT(hsaKmtReleaseSystemProperties());
        REQUIRE_KMT(hsaKmtCloseKFD());
        REQUIRE(model_counts(&c) == 0);
        REQUIRE(c.contexts == 0 && c.mems == 0 && c.bufs == 0 && c.queues == 0 && c.events == 0);
        return 0;
}

/* N queues are made, the next is refused (the class's limit), and one fits again once one went. */
static int test_limit(unsigned n)
{
        Queue q[17];
        HsaQueueResource extra;

        REQUIRE(n < 16);
        for (unsigned i = 0; i < n; i++)
                REQUIRE(queue_new(&q[i], i % 2) == 0);
        {
                uint32_t *ring = gpu_mem(RING_SIZE, false, false);
                REQUIRE(ring);
                REQUIRE(hsaKmtCreateQueue(gpu_node, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_NORMAL, ring,
                                          RING_SIZE, NULL, &extra) != HSAKMT_STATUS_SUCCESS);
                gpu_free(ring, RING_SIZE);
        }
        printf("queue %u refused\n", n + 1);
        if (n) {
                queue_free(&q[n - 1]);
                REQUIRE(queue_new(&q[n - 1], 1) == 0);
        }
        for (unsigned i = 0; i < n; i++)
                queue_free(&q[i]);
        return 0;
}

int main(int argc, char **argv)
{
        broker = argc > 1 && strncmp(argv[1], "broker", 6) == 0;
        if (argc > 2 && strcmp(argv[1], "broker-limit") == 0) {
                REQUIRE(open_kfd() == 0);
                REQUIRE(test_limit((unsigned)atoi(argv[2])) == 0);
                REQUIRE(close_kfd() == 0);
                printf("ok\n");
                return 0;
        }
        if (argc > 1 && strcmp(argv[1], "broker-fault") == 0) {
                REQUIRE(open_kfd() == 0);
                REQUIRE(test_fault(true, true) == 0);
                REQUIRE(close_kfd() == 0);
                printf("ok\n");
                return 0;
        }
        if (broker) {
                REQUIRE(open_kfd() == 0);
                REQUIRE(test_pm4() == 0 && test_sdma() == 0 && test_rules() == 0);
                REQUIRE(close_kfd() == 0);
                printf("ok\n");
                return 0;
        }
        /* a VM fault stops every queue of the process for good, as in the kernel: each fault gets a fresh
         * process context (close and reopen the KFD) */
        REQUIRE(open_kfd() == 0);
        REQUIRE(test_pm4() == 0 && test_sdma() == 0 && test_rules() == 0);
        REQUIRE(test_fault(false, false) == 0);
        REQUIRE(close_kfd() == 0);
        REQUIRE(open_kfd() == 0);
        REQUIRE(test_fault(true, true) == 0);
        REQUIRE(close_kfd() == 0);
        printf("ok\n");
        return 0;
}
