/* Tests of the KFD model's events and user-mode queues: waits, signals, the AQL packet processor. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "model-fixture.h"

static double ms_now(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int create_event(Fx *f, uint32_t type, bool auto_reset, struct kfd_ioctl_create_event_args *ret)
{
        struct kfd_ioctl_create_event_args a = {.event_type = type, .auto_reset = auto_reset};
        int r = io(f, f->kfd, AMDKFD_IOC_CREATE_EVENT, &a);

        if (r == 0)
                *ret = a;
        return r;
}

static int wait_events(Fx *f, const uint32_t *ids, uint32_t n, bool all, uint32_t timeout, uint32_t *result)
{
        struct kfd_event_data d[4];
        struct kfd_ioctl_wait_events_args a = {
                .events_ptr = (uintptr_t)d, .num_events = n, .wait_for_all = all, .timeout = timeout};
        int r;

        memset(d, 0, sizeof(d));
        for (uint32_t i = 0; i < n; i++)
                d[i].event_id = ids[i];
        r = io(f, f->kfd, AMDKFD_IOC_WAIT_EVENTS, &a);
        *result = a.wait_result;
        return r;
}

/* The result of a wait for @ids (KFD_IOC_WAIT_RESULT_*), or -1 when the model refused the call. */
static int waited(Fx *f, const uint32_t *ids, uint32_t n, bool all, uint32_t timeout)
{
        uint32_t result;

        return wait_events(f, ids, n, all, timeout, &result) == 0 ? (int)result : -1;
}

typedef struct Setter {
        Fx *f;
        uint32_t id;
} Setter;

static void *set_later(void *arg)
{
        Setter *st = arg;
        struct kfd_ioctl_set_event_args a = {.event_id = st->id};

        usleep(30000);
        io(st->f, st->f->kfd, AMDKFD_IOC_SET_EVENT, &a);
        return NULL;
}

int test_events(void)
{
        Fx f;
        struct kfd_ioctl_create_event_args sig, man, hw;
        struct kfd_ioctl_set_event_args set = {0};
        struct kfd_ioctl_reset_event_args reset = {0};
        struct kfd_ioctl_destroy_event_args destroy = {0};
        struct kfd_ioctl_get_clock_counters_args clk = {0};
        struct kfd_ioctl_get_tile_config_args tile = {0};
        struct kfd_ioctl_set_trap_handler_args trap = {.tba_addr = 0x1000, .tma_addr = 0x2000, .gpu_id = G0};
        uint32_t tiles[64], result, ids[2];
        uint64_t *page = NULL;
        ThunkModelStats s;
        pthread_t th;
        Setter st;
        double t;

        REQUIRE_RC(fx_setup(&f, 11), 0);
        /* a signal event: slot = id, the driver's signal page is mapped through the kfd fd */
        REQUIRE_RC(create_event(&f, KFD_IOC_EVENT_SIGNAL, true, &sig), 0);
        REQUIRE(sig.event_id == 0 && sig.event_slot_index == 0 && sig.event_trigger_data == 0);
        REQUIRE(sig.event_page_offset == THUNK_KFD_MMAP_TYPE_EVENTS);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, KFD_SIGNAL_EVENT_LIMIT * 8, PROT_READ | PROT_WRITE,
                                    MAP_SHARED, f.kfd, sig.event_page_offset, (void **)&page),
                   0);
        REQUIRE(page[0] == ~0ULL);
        REQUIRE_RC(create_event(&f, KFD_IOC_EVENT_SIGNAL, false, &man), 0);
        REQUIRE(man.event_id == 1);
        /* other events take ids from the upper half; only signal events may be set from the CPU */
        REQUIRE_RC(create_event(&f, KFD_IOC_EVENT_HW_EXCEPTION, false, &hw), 0);
        REQUIRE(hw.event_id >= 0x40000000u);
        set.event_id = hw.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), -EINVAL);
        set.event_id = 77;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), -EINVAL);
        /* the page is set once: naming another is -EINVAL */
        {
                struct kfd_ioctl_create_event_args again = {.event_page_offset = THUNK_KFD_HANDLE(G0, 0)};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_EVENT, &again), -EINVAL);
        }
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.events == 3);

        /* an unsignalled wait blocks until its timeout */
        ids[0] = sig.event_id;
        t = ms_now();
        REQUIRE_RC(wait_events(&f, ids, 1, false, 60, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_TIMEOUT && ms_now() - t >= 55);
        /* set: the wait completes and consumes an auto-reset event */
        set.event_id = sig.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), 0);
        REQUIRE(waited(&f, ids, 1, false, 1000) == KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE(waited(&f, ids, 1, false, 0) == KFD_IOC_WAIT_RESULT_TIMEOUT);
        /* a manual-reset event stays set until reset */
        set.event_id = man.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_EVENT, &set), 0);
        ids[0] = man.event_id;
        REQUIRE(waited(&f, ids, 1, false, 0) == KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE(waited(&f, ids, 1, false, 0) == KFD_IOC_WAIT_RESULT_COMPLETE);
        /* wait for all: one of two set is not enough; wait for any: it is */
        ids[1] = sig.event_id;
        REQUIRE(waited(&f, ids, 2, true, 0) == KFD_IOC_WAIT_RESULT_TIMEOUT);
        REQUIRE(waited(&f, ids, 2, false, 0) == KFD_IOC_WAIT_RESULT_COMPLETE);
        reset.event_id = man.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_RESET_EVENT, &reset), 0);
        REQUIRE(waited(&f, ids, 1, false, 0) == KFD_IOC_WAIT_RESULT_TIMEOUT);
        /* an infinite wait is released by a SET_EVENT from another thread */
        st = (Setter){.f = &f, .id = sig.event_id};
        REQUIRE(pthread_create(&th, NULL, set_later, &st) == 0);
        ids[0] = sig.event_id;
        REQUIRE(waited(&f, ids, 1, false, 0xffffffffu) == KFD_IOC_WAIT_RESULT_COMPLETE);
        pthread_join(th, NULL);
        /* unknown events */
        ids[0] = 4000;
        REQUIRE_RC(wait_events(&f, ids, 1, false, 0, &result), -EINVAL);
        destroy.event_id = 4000;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_EVENT, &destroy), -EINVAL);
        destroy.event_id = hw.event_id;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_EVENT, &destroy), 0);

        /* clock counters: gpu_id 0 is no error, it just has no GPU counter */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_CLOCK_COUNTERS, &clk), 0);
        REQUIRE(clk.gpu_clock_counter == 0 && clk.cpu_clock_counter &&
                clk.system_clock_freq == 1000000000ULL);
        clk.gpu_id = G0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_CLOCK_COUNTERS, &clk), 0);
        REQUIRE(clk.gpu_clock_counter != 0);
        /* tile config: counts clamp to the driver's tables */
        tile.tile_config_ptr = (uintptr_t)tiles;
        tile.macro_tile_config_ptr = (uintptr_t)tiles;
        tile.num_tile_configs = 64;
        tile.num_macro_tile_configs = 64;
        tile.gpu_id = G0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_TILE_CONFIG, &tile), 0);
        REQUIRE(tile.num_tile_configs == 32 && tile.num_macro_tile_configs == 16 && tile.gb_addr_config != 0);
        tile.gpu_id = 0x9999;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_TILE_CONFIG, &tile), -EINVAL);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_TRAP_HANDLER, &trap), 0);
        trap.gpu_id = 0x9999;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_TRAP_HANDLER, &trap), -EINVAL);
        munmap(page, KFD_SIGNAL_EVENT_LIMIT * 8);
        return fx_teardown(&f);
}

/* amd_signal_t as ROCr lays it out (64 bytes): kind, value, event mailbox, event id. */
typedef struct TestSignal {
        int64_t kind;
        volatile int64_t value;
        uint64_t mailbox;
        uint32_t event_id;
        uint32_t pad[9];
} TestSignal;

_Static_assert(sizeof(TestSignal) == 64, "amd_signal_t size");

static void put_packet(uint8_t *ring, uint64_t slot, uint16_t type, const uint64_t *deps, uint64_t completion)
{
        uint8_t *p = ring + slot * 64;

        memset(p + 2, 0, 62);
        for (int i = 0; deps && i < 5; i++)
                memcpy(p + 8 + 8 * i, &deps[i], 8);
        memcpy(p + 56, &completion, 8);
        __atomic_store_n((uint16_t *)p, type, __ATOMIC_RELEASE);
}

/* A kernel dispatch of the (zeroed, so 0-argument) kernel descriptor at @kd: the packet processor does not
 * run kernels, but what the CP would read of one must be in the GPU VM. */
static void put_dispatch(uint8_t *ring, uint64_t slot, const void *kd, uint64_t completion)
{
        uint8_t *p = ring + slot * 64;
        uint64_t kobj = (uintptr_t)kd;

        memset(p + 2, 0, 62);
        memcpy(p + 32, &kobj, 8);
        memcpy(p + 56, &completion, 8);
        __atomic_store_n((uint16_t *)p, 2 /* KERNEL_DISPATCH */, __ATOMIC_RELEASE);
}

static bool wait_value(volatile uint64_t *p, uint64_t want)
{
        for (int i = 0; i < 2000 && __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; i++)
                usleep(1000);
        return __atomic_load_n(p, __ATOMIC_ACQUIRE) == want;
}

int test_queues(void)
{
        Fx f;
        struct kfd_ioctl_create_queue_args q = {0};
        struct kfd_ioctl_destroy_queue_args dq = {0};
        struct kfd_ioctl_set_xnack_mode_args xn = {.xnack_enabled = 1};
        struct kfd_ioctl_create_event_args ev;
        uint64_t *mem, *rptr, *wptr, *events;
        uint8_t *ring;
        TestSignal *sig;
        uint64_t deps[5] = {0}, h_mem, h_events, off;
        void *db = NULL;
        uint32_t q0, q1, result, id, n = 0;
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 11), 0);
        /* everything the packet processor reads or writes is in the queue's GPU VM, as on a GPU: host
         * pages registered as userptr BOs at their own address, the way libhsakmt maps host memory */
        mem = aligned_alloc(4096, 4 * 4096);
        events = aligned_alloc(4096, KFD_SIGNAL_EVENT_LIMIT * 8);
        REQUIRE(mem != NULL && events != NULL);
        memset(mem, 0, 4 * 4096);
        off = (uintptr_t)mem;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, (uintptr_t)mem, 4 * 4096,
                            KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, &h_mem, &off),
                   0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h_mem, (const uint32_t[]){G0}, 1, &n), 0);
        off = (uintptr_t)events;
        n = 0;
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, (uintptr_t)events, KFD_SIGNAL_EVENT_LIMIT * 8,
                            KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, &h_events,
                            &off),
                   0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h_events, (const uint32_t[]){G0}, 1, &n), 0);
        ring = (uint8_t *)mem; /* 64 packets */
        rptr = mem + 4096 / 8; /* read and write indices */
        wptr = rptr + 8;
        sig = (TestSignal *)(mem + 2 * 4096 / 8); /* signals */
        for (int i = 0; i < 64; i++)
                *(uint16_t *)(ring + i * 64) = 1; /* INVALID */

        q.ring_base_address = (uintptr_t)ring;
        q.ring_size = 4096;
        q.read_pointer_address = (uintptr_t)rptr;
        q.write_pointer_address = (uintptr_t)wptr;
        q.gpu_id = G0;
        q.queue_type = KFD_IOC_QUEUE_TYPE_COMPUTE_AQL;
        q.queue_percentage = 100;
        q.queue_priority = 7;
        /* the kernel's argument checks */
        {
                struct kfd_ioctl_create_queue_args b = q;

                b.queue_percentage = 101;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EINVAL);
                b = q;
                b.ring_size = 3000;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EINVAL);
                b = q;
                b.queue_type = 9;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -524);
                b = q;
                b.gpu_id = 0x9999;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EINVAL);
                b = q;
                b.write_pointer_address = 1ULL << 60;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), -EFAULT);
        }
        /* a dummy second queue first: ids and SOC15 doorbell offsets (8 bytes per queue in the slice) */
        {
                struct kfd_ioctl_create_queue_args b = q;

                /* its own (empty) ring and pointers: the SDMA engine runs it too */
                b.queue_type = KFD_IOC_QUEUE_TYPE_SDMA;
                b.ring_base_address = (uintptr_t)(mem + 3 * 4096 / 8);
                b.ring_size = 2048;
                b.read_pointer_address = (uintptr_t)(mem + 3 * 4096 / 8 + 256);
                b.write_pointer_address = (uintptr_t)(mem + 3 * 4096 / 8 + 264);
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &b), 0);
                q1 = b.queue_id;
                REQUIRE(q1 == 0);
        }
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_QUEUE, &q), 0);
        q0 = q.queue_id;
        REQUIRE(q0 == 1);
        REQUIRE(q.doorbell_offset == (THUNK_KFD_MMAP_TYPE_DOORBELL | THUNK_KFD_MMAP_GPU_ID(G0) | 8));
        /* the doorbell slice is real shared memory behind the kfd fd, and only maps whole */
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, f.kfd,
                                    q.doorbell_offset & ~8191ULL, &db),
                   -EINVAL);
        REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, f.kfd,
                                    q.doorbell_offset & ~8191ULL, &db),
                   0);
        ((volatile uint64_t *)db)[1] = 0;
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.queues == 2);
        /* XNACK cannot change while queues exist */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_XNACK_MODE, &xn), -EBUSY);

        /* a barrier-AND waits for its dependency; the dispatch behind it waits in order */
        sig[0].value = 1; /* dependency */
        sig[1].value = 1; /* barrier completion */
        sig[2].value = 1; /* dispatch completion */
        deps[0] = (uintptr_t)&sig[0];
        put_packet(ring, 0, 3 /* BARRIER_AND */, deps, (uintptr_t)&sig[1]);
        put_dispatch(ring, 1, &sig[32], (uintptr_t)&sig[2]);
        __atomic_store_n(wptr, 2, __ATOMIC_RELEASE);
        usleep(50000);
        REQUIRE(__atomic_load_n(rptr, __ATOMIC_ACQUIRE) == 0 &&
                __atomic_load_n(&sig[1].value, __ATOMIC_ACQUIRE) == 1 &&
                __atomic_load_n(&sig[2].value, __ATOMIC_ACQUIRE) == 1);
        __atomic_store_n(&sig[0].value, 0, __ATOMIC_RELEASE);
        REQUIRE(wait_value(rptr, 2));
        REQUIRE(__atomic_load_n(&sig[1].value, __ATOMIC_ACQUIRE) == 0 &&
                __atomic_load_n(&sig[2].value, __ATOMIC_ACQUIRE) == 0);
        REQUIRE((*(uint16_t *)ring & 0xff) == 1 && (*(uint16_t *)(ring + 64) & 0xff) == 1);

        /* a barrier-OR retires as soon as one dependency is satisfied */
        __atomic_store_n(&sig[3].value, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&sig[4].value, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&sig[1].value, 1, __ATOMIC_RELEASE);
        deps[0] = (uintptr_t)&sig[3];
        deps[1] = (uintptr_t)&sig[4];
        put_packet(ring, 2, 5 /* BARRIER_OR */, deps, (uintptr_t)&sig[1]);
        __atomic_store_n(wptr, 3, __ATOMIC_RELEASE);
        usleep(30000);
        REQUIRE(__atomic_load_n(rptr, __ATOMIC_ACQUIRE) == 2);
        __atomic_store_n(&sig[4].value, 0, __ATOMIC_RELEASE);
        REQUIRE(wait_value(rptr, 3));
        REQUIRE(__atomic_load_n(&sig[1].value, __ATOMIC_ACQUIRE) == 0);

        /* a completion signal with an event mailbox: the id lands in the slot and the event fires (the signal
         * page is a BO in the GPU VM, as libhsakmt gives it on dGPUs) */
        {
                struct kfd_ioctl_create_event_args a = {
                        .event_type = KFD_IOC_EVENT_SIGNAL, .auto_reset = 1, .event_page_offset = h_events};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_EVENT, &a), 0);
                ev = a;
        }
        id = ev.event_id;
        __atomic_store_n(&sig[5].value, 1, __ATOMIC_RELEASE);
        sig[5].mailbox = (uintptr_t)&events[id];
        sig[5].event_id = id;
        put_dispatch(ring, 3, &sig[32], (uintptr_t)&sig[5]);
        __atomic_store_n(wptr, 4, __ATOMIC_RELEASE);
        REQUIRE_RC(wait_events(&f, &id, 1, false, 2000, &result), 0);
        REQUIRE(result == KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE(__atomic_load_n(&sig[5].value, __ATOMIC_ACQUIRE) == 0 &&
                __atomic_load_n(rptr, __ATOMIC_ACQUIRE) == 4);
        /* the interrupt re-armed the slot */
        REQUIRE(events[id] == ~0ULL);

        dq.queue_id = 77;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_QUEUE, &dq), -EINVAL);
        dq.queue_id = q1;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DESTROY_QUEUE, &dq), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.queues == 1 && s.events == 1);
        /* the rest goes with the context */
        munmap(db, 8192);
        REQUIRE_RC(fx_teardown(&f), 0);
        free(mem);
        free(events);
        return 0;
}
