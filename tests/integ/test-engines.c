/* A tenant whose queues never drain against another tenant's allocation and an administrator's status. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB         (1ull << 20)
#define N_QUEUES    256
#define QUEUE_BYTES 8192 /* per queue: a 4 KiB ring, then its read and write pointers and a flag */
#define SDMA_NOP    0u
#define SDMA_FENCE  5u

static Daemon dmn;
static uint32_t gpus[16];

typedef struct BusyQueue {
        uint32_t id;
        volatile uint64_t *rptr, *wptr;
        volatile uint32_t *flag;
} BusyQueue;

/*
 * An SDMA queue of @c at @base whose ring is blocks of a fence that writes 1 to its flag and 252 NOPs (253
 * packets in 256 dwords): every run of the engine, which retires at most 256 packets, writes the flag. Its
 * write pointer is so far ahead that it never drains.
 */
static int busy_queue(gm_client *c, uint32_t gpu, uint8_t *base, BusyQueue *q)
{
        uint32_t *ring = (uint32_t *)base;
        uint64_t db = 0;
        gm_queue_desc d = {.gpu_id = gpu, .type = 1 /* SDMA */, .percentage = 100, .priority = 7};

        q->rptr = (volatile uint64_t *)(base + 4096);
        q->wptr = q->rptr + 1;
        q->flag = (volatile uint32_t *)(base + 4096 + 128);
        for (size_t b = 0; b < 1024; b += 256) {
                ring[b] = SDMA_FENCE;
                ring[b + 1] = (uint32_t)(uintptr_t)q->flag;
                ring[b + 2] = (uint32_t)((uintptr_t)q->flag >> 32);
                ring[b + 3] = 1;
                for (size_t i = 4; i < 256; i++)
                        ring[b + i] = SDMA_NOP;
        }
        __atomic_store_n(q->wptr, 1ULL << 40, __ATOMIC_RELEASE);
        d.ring_va = (uintptr_t)ring;
        d.ring_size = 4096;
        d.rptr_va = (uintptr_t)q->rptr;
        d.wptr_va = (uintptr_t)q->wptr;
        return gm_queue_create(c, &d, &q->id, &db);
}

/*
 * Were the replies in while the engines were in a round? The flags were cleared from the last queue down
 * to the first, and are read back in that order, against the engines' order (first to last). Some middle
 * queue ran since, the first and the last did not: the engines had neither finished the round they were
 * in nor begun another. A round run whole under one hold of the lock never shows this, whatever the
 * timing: whatever ran after a middle queue in the same round includes the last, and a later round that
 * reached a middle queue ran the first before it.
 */
static bool in_round(const BusyQueue *q)
{
        uint32_t f[N_QUEUES];
        bool middle = false;

        for (int k = N_QUEUES - 1; k >= 0; k--)
                f[k] = __atomic_load_n(q[k].flag, __ATOMIC_ACQUIRE);
        for (int k = 1; k < N_QUEUES - 1; k++)
                middle |= f[k] != 0;
        return middle && f[0] == 0 && f[N_QUEUES - 1] == 0;
}

/*
 * 256 SDMA queues of one tenant that never drain, run by the model's engines, and another tenant's 4 MiB
 * device allocation and an administrator's status: both answered before the engines' round over the
 * attacker's queues ends. Checked from the queues' own flags (in_round), not by timing; a try in which
 * the victim asked too late in a round is tried again. When a round held the model's lock whole, every
 * try failed.
 */
static void test_busy_queues(void)
{
        gm_alloc_desc gtt = {
                .kind = GM_KIND_HOST, .size = N_QUEUES * QUEUE_BYTES, .flags = GM_MEM_GTT, .numa_node = -1};
        gm_client *attacker = daemon_client(&dmn, "attacker"), *victim = daemon_client(&dmn, "victim"),
                  *admin = daemon_client(&dmn, "admin");
        static BusyQueue q[N_QUEUES];
        uint8_t *mem = NULL;
        bool mid_round = false;
        int tries = 0;

        if (!attacker || !victim || !admin)
                goto out;
        CHECK_EQ(gm_malloc_desc(attacker, &gtt, (void **)&mem), 0);
        if (!mem)
                goto out;
        for (int k = 0; k < N_QUEUES; k++) {
                int r = busy_queue(attacker, gpus[0], mem + (size_t)k * QUEUE_BYTES, &q[k]);

                CHECK_EQ(r, 0);
                if (r < 0)
                        goto out;
        }
        for (tries = 1; tries <= 500 && !mid_round; tries++) {
                gm_status *st = NULL;
                void *p = NULL;

                for (int k = N_QUEUES - 1; k >= 0; k--)
                        __atomic_store_n(q[k].flag, 0, __ATOMIC_RELEASE);
                CHECK_EQ(gm_malloc(victim, 4 * MiB, gpus[0], 0, &p), 0);
                CHECK_EQ(gm_admin_status(admin, &st), 0);
                mid_round = in_round(q) && __atomic_load_n(q[N_QUEUES - 1].rptr, __ATOMIC_ACQUIRE) <
                                                   __atomic_load_n(q[N_QUEUES - 1].wptr, __ATOMIC_ACQUIRE);
                if (st)
                        CHECK(st->has_model && st->model_contexts >= 2);
                gm_status_free(st);
                if (p)
                        CHECK_EQ(gm_mem_free(victim, p), 0);
        }
        fprintf(stderr, "# %d tries\n", tries - 1);
        CHECK(mid_round);
        for (int k = 0; k < N_QUEUES; k++)
                CHECK_EQ(gm_queue_destroy(attacker, q[k].id), 0);
        CHECK_EQ(gm_mem_free(attacker, mem), 0);
out:
        gm_client_close(attacker);
        gm_client_close(victim);
        gm_client_close(admin);
}

int main(void)
{
        static const TestCase cases[] = {
                {"a tenant's busy queues hold up no other tenant's alloc and no status", test_busy_queues},
        };
        int r;

        signal(SIGPIPE, SIG_IGN);
        r = daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, gpus, ARRAY_SIZE(gpus));
        if (r <= 0)
                return r == 0 ? 77 : EXIT_FAILURE;
        return daemon_finish(&dmn, run_tests(cases, ARRAY_SIZE(cases)));
}
