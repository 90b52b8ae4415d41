/* Tests of the KFD model's engines: SDMA, PM4 and AQL packets and GPU VM faults, driven through the seam. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>
#include <linux/kfd_sysfs.h>

#include "../common/check.h"
#include "config.h"
#include "kfd-compat.h"
#include "model.h"

#define PAGE     4096ULL
#define GPU      0x1111u
#define VRAM_VA  0x200000000ULL
#define RING     4096 /* bytes of every test ring */
#define USERPTR  KFD_IOC_ALLOC_MEM_FLAGS_USERPTR
#define WRITABLE KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE

/* PM4 (soc15d.h) and SDMA v4 (vega10_sdma_pkt_open.h) encodings the tests write. */
#define PACKET3(op, n)   ((3u << 30) | (((op)&0xffu) << 8) | (((n)&0x3fffu) << 16))
#define PM4_NOP          0x10
#define PM4_WRITE_DATA   0x37
#define PM4_WAIT_REG_MEM 0x3c
#define PM4_IB           0x3f
#define PM4_EVENT_WRITE  0x46
#define PM4_RELEASE_MEM  0x49
#define PM4_ACQUIRE_MEM  0x58
#define SDMA_NOP         0
#define SDMA_COPY        1
#define SDMA_WRITE       2
#define SDMA_IB          4
#define SDMA_FENCE       5
#define SDMA_TRAP        6
#define SDMA_POLL        8
#define SDMA_ATOMIC      10
#define SDMA_FILL        11
#define SDMA_TIMESTAMP   13
#define SDMA_SUBWIN      (1u | 4u << 8) /* COPY, sub-op LINEAR_SUB_WIND */

/* ------------------------------------------------------------------ fixture: one gfx9 GPU */

typedef struct Ex {
        ThunkModel *m;
        ThunkSeam seam;
        int kfd;
        int render;
        ThunkTopology *topo;
        void *host[16]; /* host pages registered as userptr BOs, freed at the end */
        size_t n_host;
} Ex;

static int io(Ex *x, int fd, unsigned long req, void *arg)
{
        return x->seam.ops->ioctl(x->seam.impl, fd, req, arg);
}

static int ex_setup_opts(Ex *x, const ThunkModelOptions *opts)
{
        ThunkTopology *t = calloc(1, sizeof(*t));
        ThunkModelOptions o = *opts;
        struct kfd_ioctl_acquire_vm_args a = {.gpu_id = GPU};
        int r;

        memset(x, 0, sizeof(*x));
        t->n_nodes = 2;
        t->n_gpus = 1;
        t->nodes = calloc(2, sizeof(*t->nodes));
        t->nodes[0].cpu_cores_count = 4;
        t->nodes[0].mem_banks = calloc(1, sizeof(ThunkMemBank));
        t->nodes[0].n_mem_banks = 1;
        t->nodes[0].mem_banks[0].heap_type = HSA_MEM_HEAP_TYPE_SYSTEM;
        t->nodes[0].mem_banks[0].size_in_bytes = 16ULL << 30;
        t->nodes[1].node_id = 1;
        t->nodes[1].gpu_id = GPU;
        t->nodes[1].is_gpu = true;
        t->nodes[1].simd_count = 104;
        t->nodes[1].drm_render_minor = 128;
        t->nodes[1].gfx_target_version = 90008;
        t->nodes[1].capability = HSA_CAP_SVMAPI_SUPPORTED; /* SVM ranges the engines may reach */
        t->nodes[1].mem_banks = calloc(1, sizeof(ThunkMemBank));
        t->nodes[1].n_mem_banks = 1;
        t->nodes[1].mem_banks[0].heap_type = HSA_MEM_HEAP_TYPE_FB_PUBLIC;
        t->nodes[1].mem_banks[0].size_in_bytes = 8ULL << 30;
        r = thunk_model_new(t, &o, &x->m);
        free(t->nodes[0].mem_banks);
        free(t->nodes[1].mem_banks);
        free(t->nodes);
        free(t);
        if (r < 0)
                return r;
        thunk_model_seam(x->m, &x->seam);
        r = x->seam.ops->open_kfd(x->seam.impl, &x->kfd);
        if (r == 0)
                r = x->seam.ops->open_render(x->seam.impl, 128, &x->render);
        a.drm_fd = (uint32_t)x->render;
        return r < 0 ? r : io(x, x->kfd, AMDKFD_IOC_ACQUIRE_VM, &a);
}

static int ex_setup_with(Ex *x, bool doorbells)
{
        ThunkModelOptions o = {.kfd_minor = 19, .doorbells = doorbells};

        return ex_setup_opts(x, &o);
}

static int ex_setup(Ex *x)
{
        return ex_setup_with(x, false);
}

/* The counters a status reads without the model's lock agree with those counted under it. */
static int peek_matches(Ex *x)
{
        ThunkModelStats s, p;

        thunk_model_get_stats(x->m, &s);
        thunk_model_peek_stats(x->m, &p);
        REQUIRE_EQ(p.contexts, s.contexts);
        REQUIRE_EQ(p.mems, s.mems);
        REQUIRE_EQ(p.imports, s.imports);
        REQUIRE_EQ(p.mappings, s.mappings);
        REQUIRE_EQ(p.gem_handles, s.gem_handles);
        REQUIRE_EQ(p.svm_ranges, s.svm_ranges);
        REQUIRE_EQ(p.bufs, s.bufs);
        REQUIRE_EQ(p.system_used, s.system_used);
        REQUIRE_EQ(p.ttm_used, s.ttm_used);
        REQUIRE_EQ(p.vram_used[0], s.vram_used[0]);
        REQUIRE_EQ(p.queues, s.queues);
        return 0;
}

/* Ends the model and checks it held nothing more than the fds (and that a status saw what it held). */
static int ex_teardown(Ex *x)
{
        ThunkModelStats s;

        REQUIRE_RC(peek_matches(x), 0);
        REQUIRE_RC(x->seam.ops->close(x->seam.impl, x->kfd), 0);
        REQUIRE_RC(x->seam.ops->close(x->seam.impl, x->render), 0);
        thunk_model_get_stats(x->m, &s);
        REQUIRE(s.contexts == 0 && s.bufs == 0 && s.mappings == 0 && s.queues == 0 && s.events == 0);
        x->m = thunk_model_free(x->m);
        for (size_t i = 0; i < x->n_host; i++)
                free(x->host[i]);
        return 0;
}

static int map(Ex *x, uint64_t handle)
{
        uint32_t id = GPU;
        struct kfd_ioctl_map_memory_to_gpu_args a = {
                .handle = handle, .device_ids_array_ptr = (uintptr_t)&id, .n_devices = 1};

        return io(x, x->kfd, AMDKFD_IOC_MAP_MEMORY_TO_GPU, &a);
}

/* @size bytes of zeroed host memory, registered (userptr) at their own address and mapped on the GPU. */
static void *host(Ex *x, uint64_t size, uint32_t flags, uint64_t *ret_handle)
{
        void *p = aligned_alloc(PAGE, size);
        struct kfd_ioctl_alloc_memory_of_gpu_args a = {.size = size, .gpu_id = GPU, .flags = USERPTR | flags};

        if (!p || x->n_host == 16)
                return NULL;
        memset(p, 0, size);
        x->host[x->n_host++] = p;
        a.va_addr = a.mmap_offset = (uintptr_t)p;
        if (io(x, x->kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a) < 0 || map(x, a.handle) < 0)
                return NULL;
        if (ret_handle)
                *ret_handle = a.handle;
        return p;
}

/* A VRAM BO at @va, mapped on the GPU, and its CPU mapping through the render fd. */
static void *vram(Ex *x, uint64_t va, uint64_t size, uint32_t flags, uint64_t *ret_handle)
{
        struct kfd_ioctl_alloc_memory_of_gpu_args a = {.va_addr = va,
                                                       .size = size,
                                                       .gpu_id = GPU,
                                                       .flags = KFD_IOC_ALLOC_MEM_FLAGS_VRAM |
                                                                KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC | flags};
        void *p = NULL;

        if (io(x, x->kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a) < 0 || map(x, a.handle) < 0 ||
            x->seam.ops->mmap(x->seam.impl, NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, x->render,
                              a.mmap_offset, &p) < 0)
                return NULL;
        if (ret_handle)
                *ret_handle = a.handle;
        return p;
}

typedef struct Q {
        Ex *x;
        uint32_t id;
        uint32_t type;
        uint32_t *ring;
        volatile uint64_t *rptr;
        volatile uint64_t *wptr;
        uint64_t w; /* SDMA: bytes; PM4: dwords; AQL: packets */
        uint64_t doorbell_offset;
} Q;

static int queue(Ex *x, Q *q, uint32_t type)
{
        struct kfd_ioctl_create_queue_args a = {
                .ring_size = RING, .gpu_id = GPU, .queue_type = type, .queue_percentage = 100};
        uint64_t *ptrs;

        memset(q, 0, sizeof(*q));
        q->x = x;
        q->type = type;
        q->ring = host(x, RING, WRITABLE, NULL);
        ptrs = host(x, PAGE, WRITABLE, NULL);
        if (!q->ring || !ptrs)
                return -ENOMEM;
        q->rptr = ptrs;
        q->wptr = ptrs + 8;
        a.ring_base_address = (uintptr_t)q->ring;
        a.read_pointer_address = (uintptr_t)q->rptr;
        a.write_pointer_address = (uintptr_t)q->wptr;
        if (io(x, x->kfd, AMDKFD_IOC_CREATE_QUEUE, &a) < 0)
                return -EINVAL;
        q->id = a.queue_id;
        q->doorbell_offset = a.doorbell_offset;
        return 0;
}

/* Appends dwords to an SDMA or PM4 ring and publishes the write pointer. */
static void submit(Q *q, const uint32_t *dw, size_t n)
{
        bool sdma = q->type != KFD_IOC_QUEUE_TYPE_COMPUTE;
        uint64_t pos = sdma ? q->w / 4 : q->w;

        for (size_t i = 0; i < n; i++)
                q->ring[(pos + i) % (RING / 4)] = dw[i];
        q->w += sdma ? n * 4 : n;
        __atomic_store_n(q->wptr, q->w, __ATOMIC_RELEASE);
}

/* Runs the engines until @p holds @want (or about two seconds pass). */
static bool until64(Ex *x, volatile uint64_t *p, uint64_t want)
{
        for (int i = 0; i < 2000 && __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; i++)
                if (thunk_model_run_engines(x->m) == 0)
                        usleep(1000);
        return __atomic_load_n(p, __ATOMIC_ACQUIRE) == want;
}

static bool until32(Ex *x, volatile uint32_t *p, uint32_t want)
{
        for (int i = 0; i < 2000 && __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; i++)
                if (thunk_model_run_engines(x->m) == 0)
                        usleep(1000);
        return __atomic_load_n(p, __ATOMIC_ACQUIRE) == want;
}

/* Has the engine read all that was submitted? */
static bool drained(Q *q)
{
        if (q->type == KFD_IOC_QUEUE_TYPE_COMPUTE)
                return until32(q->x, (volatile uint32_t *)q->rptr, (uint32_t)(q->w % (RING / 4)));
        return until64(q->x, q->rptr, q->w);
}

/* Lets the engines run a while: for what must not happen. */
static void settle(Ex *x)
{
        for (int i = 0; i < 20; i++) {
                thunk_model_run_engines(x->m);
                usleep(1000);
        }
}

static uint32_t lo(const volatile void *p)
{
        return (uint32_t)(uintptr_t)p;
}

static uint32_t hi(const volatile void *p)
{
        return (uint32_t)((uintptr_t)p >> 32);
}

static int event_new(Ex *x, uint32_t type, uint64_t page_handle, struct kfd_ioctl_create_event_args *ret)
{
        struct kfd_ioctl_create_event_args a = {
                .event_type = type, .auto_reset = 1, .event_page_offset = page_handle};
        int r = io(x, x->kfd, AMDKFD_IOC_CREATE_EVENT, &a);

        *ret = a;
        return r;
}

static int wait_event(Ex *x, uint32_t id, uint32_t timeout, struct kfd_event_data *ret)
{
        struct kfd_event_data d = {.event_id = id};
        struct kfd_ioctl_wait_events_args a = {
                .events_ptr = (uintptr_t)&d, .num_events = 1, .timeout = timeout};
        int r = io(x, x->kfd, AMDKFD_IOC_WAIT_EVENTS, &a);

        if (ret)
                *ret = d;
        return r < 0 ? r : (int)a.wait_result;
}

/* ------------------------------------------------------------------ SDMA */

static int test_sdma(void)
{
        Ex x;
        Q q;
        uint64_t h_page;
        uint8_t *a, *v;
        volatile uint32_t *w;
        volatile uint64_t *w64;
        uint64_t *slots;
        struct kfd_ioctl_create_event_args ev;
        ThunkModelStats s;

        REQUIRE_RC(ex_setup(&x), 0);
        a = host(&x, 64 * 1024, WRITABLE, NULL);
        w = host(&x, PAGE, WRITABLE, NULL);
        slots = host(&x, KFD_SIGNAL_EVENT_LIMIT * 8, WRITABLE, &h_page);
        v = vram(&x, VRAM_VA, 64 * 1024, WRITABLE, NULL);
        REQUIRE(a && w && slots && v);
        w64 = (volatile uint64_t *)(w + 64);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);

        /* NOPs, one with two more dwords of its own; the read pointer is a byte count */
        {
                const uint32_t p[] = {SDMA_NOP, SDMA_NOP | 2u << 16, 0xdead, 0xbeef, SDMA_NOP};

                submit(&q, p, 5);
                REQUIRE(drained(&q) && *q.rptr == 20);
        }
        /* linear copy host -> VRAM (count is bytes - 1), then VRAM -> host, with a fence behind */
        for (int i = 0; i < 4096; i++)
                a[i] = (uint8_t)(i * 3 + 1);
        {
                const uint32_t p[] = {SDMA_COPY,
                                      4095,
                                      0,
                                      lo(a),
                                      hi(a),
                                      lo((void *)VRAM_VA),
                                      hi((void *)VRAM_VA),
                                      SDMA_COPY,
                                      4095,
                                      0,
                                      lo((void *)VRAM_VA),
                                      hi((void *)VRAM_VA),
                                      lo(a + 8192),
                                      hi(a + 8192),
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      1};

                submit(&q, p, 18);
                REQUIRE(until32(&x, &w[0], 1));
                REQUIRE(memcmp(a, v, 4096) == 0 && memcmp(a, a + 8192, 4096) == 0);
        }
        /* linear write of three dwords (count is dwords - 1) */
        {
                const uint32_t p[] = {SDMA_WRITE, lo(&w[1]), hi(&w[1]), 2, 11, 22, 33};

                submit(&q, p, 7);
                REQUIRE(until32(&x, &w[3], 33) && w[1] == 11 && w[2] == 22);
        }
        /* constant fill: dwords (ROCr's count, (n - 1) * 4) and bytes (count = bytes - 1) */
        {
                const uint32_t p[] = {SDMA_FILL | 2u << 30,
                                      lo(a + 16384),
                                      hi(a + 16384),
                                      0xa5a5a5a5,
                                      4 * 4,
                                      SDMA_FILL,
                                      lo(a + 20480),
                                      hi(a + 20480),
                                      0x77,
                                      2,
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      2};

                submit(&q, p, 14);
                REQUIRE(until32(&x, &w[0], 2));
                REQUIRE(((uint32_t *)(a + 16384))[4] == 0xa5a5a5a5 && ((uint32_t *)(a + 16384))[5] == 0);
                REQUIRE(a[20480] == 0x77 && a[20482] == 0x77 && a[20483] == 0);
        }
        /* atomics: a 64-bit add of -1 (ROCr's signal decrement) and a compare-and-swap */
        w64[0] = 5;
        w64[1] = 9;
        {
                const uint32_t p[] = {
                        SDMA_ATOMIC | 0x2fu << 25, lo(&w64[0]), hi(&w64[0]), 0xffffffff, 0xffffffff, 0, 0, 0,
                        SDMA_ATOMIC | 0x28u << 25, lo(&w64[1]), hi(&w64[1]), 42,         0,          9, 0, 0};

                submit(&q, p, 16);
                REQUIRE(until64(&x, &w64[1], 42) && w64[0] == 4);
        }
        /* a global timestamp */
        {
                const uint32_t p[] = {SDMA_TIMESTAMP | 2u << 8, lo(&w64[2]), hi(&w64[2])};

                submit(&q, p, 3);
                REQUIRE(drained(&q) && w64[2] != 0);
        }
        /* a memory poll waits until the value matches; a register poll passes; a finite one gives up */
        {
                const uint32_t p[] = {SDMA_POLL | 3u << 28 | 1u << 31,
                                      lo(&w[8]),
                                      hi(&w[8]),
                                      7,
                                      0xff,
                                      0xfff << 16 | 4,
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      3};
                const uint32_t r[] = {SDMA_POLL | 3u << 28,
                                      0,
                                      0,
                                      7,
                                      0xff,
                                      0,
                                      SDMA_POLL | 3u << 28 | 1u << 31,
                                      lo(&w[9]),
                                      hi(&w[9]),
                                      1,
                                      1,
                                      2 << 16,
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      4};

                submit(&q, p, 10);
                settle(&x);
                REQUIRE(w[0] == 2);
                __atomic_store_n(&w[8], 0x307, __ATOMIC_RELEASE);
                REQUIRE(until32(&x, &w[0], 3));
                submit(&q, r, 16);
                REQUIRE(until32(&x, &w[0], 4));
        }
        /* an indirect buffer: packets in a buffer of their own */
        {
                uint32_t *ib = (uint32_t *)(a + 32768);
                const uint32_t body[] = {SDMA_FENCE, lo(&w[10]), hi(&w[10]), 55,
                                         SDMA_NOP,   SDMA_NOP,   SDMA_NOP,   SDMA_NOP};
                const uint32_t p[] = {SDMA_IB, lo(ib), hi(ib), 8, 0, 0};

                memcpy(ib, body, sizeof(body));
                submit(&q, p, 6);
                REQUIRE(until32(&x, &w[10], 55) && drained(&q));
        }
        /* a fence of the event id into its slot and a trap: the waiter wakes, the slot is re-armed */
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_SIGNAL, h_page, &ev), 0);
        REQUIRE_RC(wait_event(&x, ev.event_id, 0, NULL), KFD_IOC_WAIT_RESULT_TIMEOUT);
        {
                const uint32_t p[] = {
                        SDMA_FENCE, lo(&slots[ev.event_id]), hi(&slots[ev.event_id]), ev.event_id, SDMA_TRAP,
                        0};

                submit(&q, p, 6);
        }
        REQUIRE_RC(wait_event(&x, ev.event_id, 2000, NULL), KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE(slots[ev.event_id] == ~0ULL);
        /* packets wrap around the end of the ring, and the read pointer keeps counting */
        while (q.w % RING != RING - 8) {
                const uint32_t nop = SDMA_NOP;

                submit(&q, &nop, 1);
        }
        {
                const uint32_t p[] = {SDMA_FENCE, lo(w), hi(w), 5};

                submit(&q, p, 4);
                REQUIRE(until32(&x, &w[0], 5) && drained(&q) && *q.rptr > RING);
        }
        /* an opcode the engine does not have stops the queue there (and faults: engines-illegal) */
        {
                const uint32_t p[] = {SDMA_FENCE, lo(w), hi(w), 6, 0xff, SDMA_FENCE, lo(w), hi(w), 7};

                submit(&q, p, 9);
                REQUIRE(until32(&x, &w[0], 6));
                settle(&x);
                REQUIRE(w[0] == 6 && *q.rptr == q.w - 20);
        }
        thunk_model_get_stats(x.m, &s);
        REQUIRE(s.queues == 1);
        munmap(v, 64 * 1024);
        return ex_teardown(&x);
}

/* Mappings of the model's per-GPU backing files in this process (the memfd's name in /proc/self/maps). */
static int heap_mappings(void)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        int n = 0;

        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strstr(line, "gpumem-heap"))
                        n++;
        fclose(f);
        return n;
}

static int export_fd(Ex *x, uint64_t handle, int *ret_fd)
{
        struct kfd_ioctl_export_dmabuf_args a = {.handle = handle, .flags = O_CLOEXEC};
        int r = io(x, x->kfd, AMDKFD_IOC_EXPORT_DMABUF, &a);

        *ret_fd = (int)a.dmabuf_fd;
        return r;
}

static int free_unmapped(Ex *x, uint64_t handle)
{
        uint32_t id = GPU;
        struct kfd_ioctl_unmap_memory_from_gpu_args u = {
                .handle = handle, .device_ids_array_ptr = (uintptr_t)&id, .n_devices = 1};
        struct kfd_ioctl_free_memory_of_gpu_args f = {.handle = handle};
        int r = io(x, x->kfd, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, &u);

        return r < 0 ? r : io(x, x->kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &f);
}

/*
 * A carved buffer (VRAM that is not host visible) that an SDMA copy wrote into can still be exported: the
 * engines' own view of its carve-out does not count as a CPU mapping left, the export shows the copied
 * bytes, and the engines then reach the buffer's new file, not the old pages. A carved buffer's view goes
 * with the buffer.
 */
static int test_sdma_export(void)
{
        Ex x;
        Q q;
        uint8_t *a, *d;
        volatile uint32_t *w;
        uint64_t hv = 0, hc = 0;
        struct kfd_ioctl_alloc_memory_of_gpu_args al = {.va_addr = VRAM_VA,
                                                        .size = 8 * PAGE,
                                                        .gpu_id = GPU,
                                                        .flags = KFD_IOC_ALLOC_MEM_FLAGS_VRAM | WRITABLE};
        ThunkModelStats s;
        int fd = -1, fd2 = -1;

        REQUIRE_RC(ex_setup(&x), 0);
        a = host(&x, 8 * PAGE, WRITABLE, NULL);
        w = host(&x, PAGE, WRITABLE, NULL);
        REQUIRE(a && w);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), 0);
        hv = al.handle;
        REQUIRE_RC(map(&x, hv), 0);
        thunk_model_get_stats(x.m, &s);
        REQUIRE(s.buffer_files == 0 && s.carved_bytes == 8 * PAGE);
        REQUIRE(heap_mappings() == 0);

        /* host -> carved VRAM, then a fence: the engine now holds a view of the carve-out */
        for (int i = 0; i < 4 * (int)PAGE; i++)
                a[i] = (uint8_t)(i * 7 + 3);
        {
                const uint32_t p[] = {
                        SDMA_COPY,           4 * PAGE - 1, 0,     lo(a), hi(a), lo((void *)VRAM_VA),
                        hi((void *)VRAM_VA), SDMA_FENCE,   lo(w), hi(w), 1};

                submit(&q, p, 11);
                REQUIRE(until32(&x, &w[0], 1));
        }
        REQUIRE(heap_mappings() == 1);

        /* the first export moves it to a file of its own, with the copied bytes; the view goes first */
        REQUIRE_RC(export_fd(&x, hv, &fd), 0);
        thunk_model_get_stats(x.m, &s);
        REQUIRE(s.buffer_files == 1 && s.carved_bytes == 0);
        REQUIRE(heap_mappings() == 0);
        d = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        REQUIRE(d != MAP_FAILED);
        REQUIRE(memcmp(d, a, 4 * PAGE) == 0);
        for (uint64_t i = 4 * PAGE; i < 8 * PAGE; i++)
                REQUIRE(d[i] == 0);

        /* the engine writes the new file now: a write and a copy show through the export, and a copy out of
         * it reads what a CPU write through the export put there */
        d[6 * PAGE] = 0x5a;
        {
                const uint32_t p[] = {SDMA_WRITE,
                                      lo((void *)(VRAM_VA + 5 * PAGE)),
                                      hi((void *)(VRAM_VA + 5 * PAGE)),
                                      1,
                                      0x11223344,
                                      0x55667788,
                                      SDMA_COPY,
                                      PAGE - 1,
                                      0,
                                      lo(a),
                                      hi(a),
                                      lo((void *)(VRAM_VA + 4 * PAGE)),
                                      hi((void *)(VRAM_VA + 4 * PAGE)),
                                      SDMA_COPY,
                                      PAGE - 1,
                                      0,
                                      lo((void *)(VRAM_VA + 6 * PAGE)),
                                      hi((void *)(VRAM_VA + 6 * PAGE)),
                                      lo(a + 6 * PAGE),
                                      hi(a + 6 * PAGE),
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      2};

                submit(&q, p, 24);
                REQUIRE(until32(&x, &w[0], 2));
        }
        REQUIRE(((uint32_t *)(d + 5 * PAGE))[0] == 0x11223344 &&
                ((uint32_t *)(d + 5 * PAGE))[1] == 0x55667788);
        REQUIRE(memcmp(d + 4 * PAGE, a, PAGE) == 0);
        REQUIRE(a[6 * PAGE] == 0x5a && a[6 * PAGE + 1] == 0);
        REQUIRE(heap_mappings() == 0);
        /* a second export is the same file again */
        {
                struct stat st, st2;

                REQUIRE_RC(export_fd(&x, hv, &fd2), 0);
                REQUIRE(fstat(fd, &st) == 0 && fstat(fd2, &st2) == 0 && st.st_ino == st2.st_ino);
                close(fd2);
        }
        REQUIRE(munmap(d, 8 * PAGE) == 0);
        close(fd);
        REQUIRE_RC(free_unmapped(&x, hv), 0);

        /* a carved buffer the engine touched and that is freed: its view goes with it */
        al.va_addr = VRAM_VA + 64 * PAGE;
        al.size = PAGE;
        REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), 0);
        hc = al.handle;
        REQUIRE_RC(map(&x, hc), 0);
        {
                const uint32_t p[] = {SDMA_FENCE,
                                      lo((void *)(VRAM_VA + 64 * PAGE)),
                                      hi((void *)(VRAM_VA + 64 * PAGE)),
                                      9,
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      3};

                submit(&q, p, 8);
                REQUIRE(until32(&x, &w[0], 3));
        }
        REQUIRE(heap_mappings() == 1);
        REQUIRE_RC(free_unmapped(&x, hc), 0);
        REQUIRE(heap_mappings() == 0);
        thunk_model_get_stats(x.m, &s);
        REQUIRE(s.carved_bytes == 0 && s.backing_resident_bytes == 0);
        return ex_teardown(&x);
}

/* ------------------------------------------------------------------ PM4 */

static int test_pm4(void)
{
        Ex x;
        Q q;
        uint64_t h_page;
        volatile uint32_t *w;
        volatile uint64_t *w64;
        uint64_t *slots;
        uint32_t *ib;
        struct kfd_ioctl_create_event_args ev;

        REQUIRE_RC(ex_setup(&x), 0);
        w = host(&x, PAGE, WRITABLE, NULL);
        ib = host(&x, PAGE, WRITABLE, NULL);
        slots = host(&x, KFD_SIGNAL_EVENT_LIMIT * 8, WRITABLE, &h_page);
        REQUIRE(w && ib && slots);
        w64 = (volatile uint64_t *)(w + 64);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_COMPUTE), 0);

        /* single-dword NOPs, a NOP with a body, a filler, a register write, cache and event packets */
        {
                const uint32_t p[] = {PACKET3(PM4_NOP, 0x3fff),
                                      PACKET3(PM4_NOP, 1),
                                      1,
                                      2,
                                      0x80000000,
                                      (0u << 30) | 1u << 16 | 0x1234,
                                      0,
                                      0,
                                      PACKET3(PM4_ACQUIRE_MEM, 5),
                                      0,
                                      0,
                                      0,
                                      0,
                                      0,
                                      0,
                                      PACKET3(PM4_EVENT_WRITE, 0),
                                      0x16};

                submit(&q, p, 17);
                REQUIRE(drained(&q) && *(volatile uint32_t *)q.rptr == 17);
        }
        /* WRITE_DATA to memory, and to one address */
        {
                const uint32_t p[] = {PACKET3(PM4_WRITE_DATA, 5),
                                      5u << 8,
                                      lo(&w[0]),
                                      hi(&w[0]),
                                      1,
                                      2,
                                      3,
                                      PACKET3(PM4_WRITE_DATA, 4),
                                      5u << 8 | 1u << 16,
                                      lo(&w[4]),
                                      hi(&w[4]),
                                      8,
                                      9};

                submit(&q, p, 13);
                REQUIRE(until32(&x, &w[4], 9) && w[0] == 1 && w[1] == 2 && w[2] == 3 && w[5] == 0);
        }
        /* RELEASE_MEM: 32-bit data, 64-bit data, the GPU clock */
        {
                const uint32_t p[] = {PACKET3(PM4_RELEASE_MEM, 6),
                                      0x14 | 5u << 8,
                                      1u << 29,
                                      lo(&w[6]),
                                      hi(&w[6]),
                                      66,
                                      0,
                                      0,
                                      PACKET3(PM4_RELEASE_MEM, 6),
                                      0x14 | 5u << 8,
                                      2u << 29,
                                      lo(&w64[0]),
                                      hi(&w64[0]),
                                      0x11111111,
                                      0x22222222,
                                      0,
                                      PACKET3(PM4_RELEASE_MEM, 6),
                                      0x14 | 5u << 8,
                                      3u << 29,
                                      lo(&w64[1]),
                                      hi(&w64[1]),
                                      0,
                                      0,
                                      0};

                submit(&q, p, 24);
                REQUIRE(drained(&q) && w[6] == 66 && w64[0] == 0x2222222211111111ULL && w64[1] != 0);
        }
        /* WAIT_REG_MEM on memory holds the queue until the value matches */
        {
                const uint32_t p[] = {
                        PACKET3(PM4_WAIT_REG_MEM, 5), 3 | 1u << 4, lo(&w[8]), hi(&w[8]), 5, 0xf, 4,
                        PACKET3(PM4_WRITE_DATA, 3),   5u << 8,     lo(&w[9]), hi(&w[9]), 77};

                submit(&q, p, 12);
                settle(&x);
                REQUIRE(w[9] == 0);
                __atomic_store_n(&w[8], 0x35, __ATOMIC_RELEASE);
                REQUIRE(until32(&x, &w[9], 77));
        }
        /* an indirect buffer, chaining to a second one */
        {
                const uint32_t second[] = {PACKET3(PM4_WRITE_DATA, 3), 5u << 8, lo(&w[11]), hi(&w[11]), 12};
                const uint32_t first[] = {PACKET3(PM4_WRITE_DATA, 3),
                                          5u << 8,
                                          lo(&w[10]),
                                          hi(&w[10]),
                                          11,
                                          PACKET3(PM4_IB, 2),
                                          lo(ib + 64),
                                          hi(ib + 64),
                                          5 | 1u << 20 | 1u << 23};
                const uint32_t p[] = {PACKET3(PM4_IB, 2), lo(ib), hi(ib), 9 | 1u << 23};

                memcpy(ib, first, sizeof(first));
                memcpy(ib + 64, second, sizeof(second));
                submit(&q, p, 4);
                REQUIRE(until32(&x, &w[11], 12) && w[10] == 11 && drained(&q));
        }
        /* RELEASE_MEM with an interrupt: the event id in its slot, INT_CTXID the id; the waiter wakes */
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_SIGNAL, h_page, &ev), 0);
        {
                const uint32_t p[] = {PACKET3(PM4_RELEASE_MEM, 6),
                                      0x14 | 5u << 8,
                                      1u << 29 | 2u << 24,
                                      lo(&slots[ev.event_id]),
                                      hi(&slots[ev.event_id]),
                                      ev.event_id,
                                      0,
                                      ev.event_id};

                submit(&q, p, 8);
        }
        REQUIRE_RC(wait_event(&x, ev.event_id, 2000, NULL), KFD_IOC_WAIT_RESULT_COMPLETE);
        /* packets wrap around the end of the ring; the read pointer is a dword offset into it */
        while (q.w % (RING / 4) != RING / 4 - 2)
                submit(&q, (const uint32_t[]){PACKET3(PM4_NOP, 0x3fff)}, 1);
        {
                const uint32_t p[] = {PACKET3(PM4_WRITE_DATA, 3), 5u << 8, lo(&w[12]), hi(&w[12]), 13};

                submit(&q, p, 5);
                REQUIRE(until32(&x, &w[12], 13) && drained(&q) && *(volatile uint32_t *)q.rptr == 3);
        }
        /* an IB that chains to itself runs forever, as on the CP, but a run at a time: runs return */
        {
                const uint32_t loop[] = {PACKET3(PM4_IB, 2), lo(ib + 128), hi(ib + 128),
                                         4 | 1u << 20 | 1u << 23};

                memcpy(ib + 128, loop, sizeof(loop));
                submit(&q, (const uint32_t[]){PACKET3(PM4_IB, 2), lo(ib + 128), hi(ib + 128), 4 | 1u << 23},
                       4);
                for (int i = 0; i < 8; i++)
                        REQUIRE(thunk_model_run_engines(x.m) > 0 || i > 0);
        }
        return ex_teardown(&x);
}

/* ------------------------------------------------------------------ SDMA sub-window copies */

static bool engines_quiet(Ex *x);

/* One side of a sub-window copy: the surface's base, the window's start and the pitches, in elements. */
typedef struct Win {
        uint8_t *base;
        uint32_t x, y, z;
        uint32_t pitch, slice;
} Win;

/* COPY LINEAR_SUB_WIND (vega10_sdma_pkt_open.h, ROCr's SDMA_PKT_COPY_LINEAR_RECT): elements of 2^@shift
 * bytes, a rectangle of @rx by @ry by @rz of them; pitches minus one, the row pitch in bits 31:13. */
static void subwin_packet(uint32_t p[13], unsigned int shift, const Win *src, const Win *dst, uint32_t rx,
                          uint32_t ry, uint32_t rz)
{
        const Win *w[2] = {src, dst};

        p[0] = SDMA_SUBWIN | shift << 29;
        for (int i = 0; i < 2; i++) {
                uint32_t *d = &p[1 + 5 * i];

                d[0] = lo(w[i]->base);
                d[1] = hi(w[i]->base);
                d[2] = w[i]->x | w[i]->y << 16;
                d[3] = w[i]->z | (w[i]->pitch - 1) << 13;
                d[4] = w[i]->slice - 1;
        }
        p[11] = (rx - 1) | (ry - 1) << 16;
        p[12] = rz - 1;
}

/* What the copy must do, on plain memory: @dst_ref stands for @dst->base. */
static void subwin_ref(uint8_t *dst_ref, unsigned int shift, const Win *src, const Win *dst, uint32_t rx,
                       uint32_t ry, uint32_t rz)
{
        for (uint64_t z = 0; z < rz; z++)
                for (uint64_t y = 0; y < ry; y++) {
                        uint64_t so = src->x + (src->y + y) * src->pitch + (src->z + z) * src->slice;
                        uint64_t d = dst->x + (dst->y + y) * dst->pitch + (dst->z + z) * dst->slice;

                        memmove(dst_ref + (d << shift), src->base + (so << shift), (uint64_t)rx << shift);
                }
}

/* Sub-window copies of elements of 1 to 16 bytes, with offsets, row and slice pitches: every byte of the
 * destination is what the packet names, or what it held. */
static int test_sdma_subwin(void)
{
        static const struct {
                unsigned int shift;
                Win s, d;
                uint32_t rx, ry, rz;
        } cases[] = {
                {0,
                 {.x = 3, .y = 2, .pitch = 37, .slice = 1},
                 {.x = 1, .y = 4, .pitch = 41, .slice = 1},
                 29,
                 5,
                 1},
                {1, {.x = 1, .y = 1, .z = 1, .pitch = 11, .slice = 58}, {.pitch = 13, .slice = 53}, 7, 3, 2},
                {2, {.pitch = 20, .slice = 1}, {.pitch = 16, .slice = 1}, 16, 16, 1},
                {3,
                 {.x = 5, .y = 1, .z = 1, .pitch = 9, .slice = 100},
                 {.x = 2, .pitch = 4, .slice = 40},
                 3,
                 9,
                 3},
                {4, {.y = 3, .pitch = 7, .slice = 30}, {.x = 2, .z = 1, .pitch = 8, .slice = 33}, 5, 4, 2},
                /* rows that overlap in the destination: they land in order */
                {2, {.pitch = 8, .slice = 1}, {.x = 1, .pitch = 2, .slice = 1}, 6, 10, 1},
        };
        const size_t n = 16 * PAGE;
        uint8_t *src, *dst, *ref = malloc(n);
        volatile uint32_t *w;
        Ex x;
        Q q;

        REQUIRE(ref);
        REQUIRE_RC(ex_setup(&x), 0);
        src = host(&x, n, 0, NULL);
        dst = host(&x, n, WRITABLE, NULL);
        w = host(&x, PAGE, WRITABLE, NULL);
        REQUIRE(src && dst && w);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        for (size_t i = 0; i < n; i++)
                src[i] = (uint8_t)(i * 7 + (i >> 8));
        for (uint32_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
                Win s = cases[c].s, d = cases[c].d;
                uint32_t p[13];

                s.base = src;
                d.base = dst;
                memset(dst, 0xcc, n);
                memcpy(ref, dst, n);
                subwin_ref(ref, cases[c].shift, &s, &d, cases[c].rx, cases[c].ry, cases[c].rz);
                subwin_packet(p, cases[c].shift, &s, &d, cases[c].rx, cases[c].ry, cases[c].rz);
                submit(&q, p, 13);
                submit(&q, (const uint32_t[]){SDMA_FENCE, lo(w), hi(w), c + 1}, 4);
                REQUIRE(until32(&x, w, c + 1));
                if (memcmp(dst, ref, n) != 0) {
                        fprintf(stderr, "sub-window case %u differs\n", c);
                        return 1;
                }
        }
        REQUIRE(drained(&q));
        free(ref);
        return ex_teardown(&x);
}

/*
 * A sub-window copy of many rows is cut into runs (each row costs the run's budget at least 1 KiB): 10000
 * rows of 4 bytes take three runs, the packet retiring in the third; the rows done stay done.
 */
static int test_sdma_subwin_runs(void)
{
        ThunkModelOptions o = {.kfd_minor = 19, .doorbells = true, .doorbell_kicks = true};
        const uint32_t rows = 10000;
        void *slice = NULL;
        volatile uint64_t *db;
        volatile uint32_t *w;
        uint32_t *src, *dst;
        Ex x;
        Q q;

        REQUIRE_RC(ex_setup_opts(&x, &o), 0);
        src = host(&x, 10 * PAGE, 0, NULL);        /* the rows' 4 bytes end to end */
        dst = host(&x, 20 * PAGE, WRITABLE, NULL); /* every other 4 bytes */
        w = host(&x, PAGE, WRITABLE, NULL);
        REQUIRE(src && dst && w);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(x.seam.ops->mmap(x.seam.impl, NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, x.kfd,
                                    q.doorbell_offset & ~8191ULL, &slice),
                   0);
        db = slice;
        REQUIRE(engines_quiet(&x));
        for (uint32_t i = 0; i < rows; i++)
                src[i] = i + 1;
        {
                Win s = {.base = (uint8_t *)src, .pitch = 1, .slice = 1};
                Win d = {.base = (uint8_t *)dst, .pitch = 2, .slice = 1};
                uint32_t p[13];

                subwin_packet(p, 2, &s, &d, 1, rows, 1);
                submit(&q, p, 13);
        }
        submit(&q, (const uint32_t[]){SDMA_FENCE, lo(w), hi(w), 1}, 4);
        __atomic_store_n(&db[(q.doorbell_offset & 8191) / 8], q.w, __ATOMIC_RELEASE);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 0);
        REQUIRE(dst[2 * 4095] == 4096 && dst[2 * 4096] == 0 && *q.rptr == 0);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 0);
        REQUIRE(dst[2 * 8191] == 8192 && dst[2 * 8192] == 0 && *q.rptr == 0);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 2);
        REQUIRE(*q.rptr == q.w && *w == 1);
        for (uint32_t i = 0; i < rows; i++)
                REQUIRE(dst[2 * i] == i + 1 && dst[2 * i + 1] == 0);
        munmap(slice, 8192);
        {
                struct kfd_ioctl_destroy_queue_args d = {.queue_id = q.id};
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
        }
        return ex_teardown(&x);
}

/* ------------------------------------------------------------------ GPU VM faults */

/* A fault must fire the memory event with @va's page and the reason, and stop the process's queues. */
static int expect_fault(Ex *x, uint32_t mem_event, uint64_t va, bool not_present, bool read_only)
{
        struct kfd_event_data d;

        REQUIRE_RC(wait_event(x, mem_event, 2000, &d), KFD_IOC_WAIT_RESULT_COMPLETE);
        REQUIRE(d.memory_exception_data.gpu_id == GPU);
        REQUIRE(d.memory_exception_data.va == (va & ~(PAGE - 1)));
        REQUIRE(d.memory_exception_data.failure.NotPresent == not_present);
        REQUIRE(d.memory_exception_data.failure.ReadOnly == read_only);
        REQUIRE(d.memory_exception_data.failure.NoExecute == 0 &&
                d.memory_exception_data.failure.imprecise == 0);
        return 0;
}

/* A page far below where the kernel places mappings. Under ThreadSanitizer application memory lies below
 * 512 GiB or around the program's image: a page below 512 GiB that nothing else asks for (an arbitrary
 * page, once freed, can be mapped again by the runtime before the engine looks). */
#if defined(__SANITIZE_THREAD__)
#define FAR_PAGE 0x007000000000ULL
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FAR_PAGE 0x007000000000ULL
#endif
#endif
#ifndef FAR_PAGE
#define FAR_PAGE 0x5e0000000000ULL
#endif

static int test_faults_sdma(void)
{
        Ex x;
        Q q, other, later;
        struct kfd_ioctl_create_event_args mev;
        volatile uint32_t *w, *ro;
        uint8_t *a;

        /* a copy from an unmapped page: NotPresent, and nothing copied */
        REQUIRE_RC(ex_setup(&x), 0);
        a = host(&x, 2 * PAGE, WRITABLE, NULL);
        w = host(&x, PAGE, WRITABLE, NULL);
        REQUIRE(a && w);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(queue(&x, &other, KFD_IOC_QUEUE_TYPE_COMPUTE), 0);
        {
                const uint64_t gone = 0x700000000ULL;
                const uint32_t p[] = {SDMA_COPY,
                                      2 * PAGE - 1,
                                      0,
                                      lo((void *)(gone + 0x1800)),
                                      hi((void *)(gone + 0x1800)),
                                      lo(a),
                                      hi(a),
                                      SDMA_FENCE,
                                      lo(w),
                                      hi(w),
                                      1};

                memset(a, 0x5a, 2 * PAGE);
                submit(&q, p, 11);
                REQUIRE(expect_fault(&x, mev.event_id, gone + 0x1800, true, false) == 0);
                REQUIRE(a[0] == 0x5a && a[2 * PAGE - 1] == 0x5a);
        }
        /* the queue stopped at the packet; so did every queue of the process, and new ones stay stopped */
        settle(&x);
        REQUIRE(w[0] == 0 && *q.rptr == 0);
        submit(&other, (const uint32_t[]){PACKET3(PM4_WRITE_DATA, 3), 5u << 8, lo(&w[1]), hi(&w[1]), 1}, 5);
        REQUIRE_RC(queue(&x, &later, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        submit(&later, (const uint32_t[]){SDMA_FENCE, lo(&w[2]), hi(&w[2]), 1}, 4);
        settle(&x);
        REQUIRE(w[1] == 0 && w[2] == 0);
        REQUIRE_RC(ex_teardown(&x), 0);

        /* a userptr BO whose pages the process unmapped while the BO stayed mapped on the GPU: the pages are
         * not present to the engine (NotPresent), and the model's thread does not touch them */
        REQUIRE_RC(ex_setup(&x), 0);
        {
                struct kfd_ioctl_alloc_memory_of_gpu_args al = {
                        .size = PAGE, .gpu_id = GPU, .flags = USERPTR | WRITABLE};
                /* far below where the kernel places new mappings (top down from the stack): the hole the
                 * munmap leaves is not filled again by some other mapping of this process meanwhile */
                void *want = (void *)(uintptr_t)FAR_PAGE;
                void *p = want ? mmap(want, PAGE, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
                               : MAP_FAILED;

                if (p != want) {
                        if (p != MAP_FAILED)
                                munmap(p, PAGE);
                        p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                }
                REQUIRE(p != MAP_FAILED);
                al.va_addr = al.mmap_offset = (uintptr_t)p;
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al), 0);
                REQUIRE_RC(map(&x, al.handle), 0);
                REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
                REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
                munmap(p, PAGE);
                REQUIRE(msync(p, PAGE, MS_ASYNC) < 0 && errno == ENOMEM); /* gone when the engine looks */
                submit(&q, (const uint32_t[]){SDMA_FENCE, lo(p), hi(p), 7}, 4);
                REQUIRE(expect_fault(&x, mev.event_id, (uintptr_t)p, true, false) == 0);
        }
        REQUIRE_RC(ex_teardown(&x), 0);

        /* a fence into a read-only BO: ReadOnly, and the BO keeps its bytes */
        REQUIRE_RC(ex_setup(&x), 0);
        ro = host(&x, PAGE, 0, NULL);
        REQUIRE(ro);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        submit(&q, (const uint32_t[]){SDMA_FENCE, lo(&ro[3]), hi(&ro[3]), 9}, 4);
        REQUIRE(expect_fault(&x, mev.event_id, (uintptr_t)&ro[3], false, true) == 0);
        REQUIRE(ro[3] == 0);
        return ex_teardown(&x);
}

/* A sub-window copy whose source rows run into a page nothing maps: that row faults (NotPresent, its page),
 * the rows before it are copied, it and those after are not, and the queue stops at the packet. */
static int test_faults_subwin(void)
{
        struct kfd_ioctl_create_event_args mev;
        uint8_t *v, *dst;
        uint32_t p[13];
        Ex x;
        Q q;

        REQUIRE_RC(ex_setup(&x), 0);
        v = vram(&x, VRAM_VA, 2 * PAGE, WRITABLE, NULL);
        dst = host(&x, 4 * PAGE, WRITABLE, NULL);
        REQUIRE(v && dst);
        memset(v, 0x3c, 2 * PAGE);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        {
                /* rows of 100 bytes every KiB from byte 24: row 8 starts in the page past the BO */
                Win s = {.base = (uint8_t *)(uintptr_t)VRAM_VA, .x = 24, .pitch = 1024, .slice = 1};
                Win d = {.base = dst, .pitch = 128, .slice = 1};

                subwin_packet(p, 0, &s, &d, 100, 10, 1);
                submit(&q, p, 13);
        }
        REQUIRE(expect_fault(&x, mev.event_id, VRAM_VA + 2 * PAGE, true, false) == 0);
        settle(&x);
        REQUIRE(*q.rptr == 0);
        for (size_t r = 0; r < 10; r++)
                for (size_t i = 0; i < 128; i++)
                        REQUIRE(dst[r * 128 + i] == (r < 8 && i < 100 ? 0x3c : 0));
        munmap(v, 2 * PAGE);
        return ex_teardown(&x);
}

/* One packet the engine cannot run, after a fence that it can: the fence lands, then the queue stops at the
 * packet and the process hears of it as of a fault at the packet's page, no reason given (every memory
 * event set, every queue stopped), so that nothing waits for the queue for ever. */
static int illegal_case(uint32_t type, const uint32_t *pkt, size_t n)
{
        struct kfd_ioctl_create_event_args mev;
        volatile uint32_t *w;
        uint64_t at;
        Ex x;
        Q q, later;

        REQUIRE_RC(ex_setup(&x), 0);
        w = host(&x, PAGE, WRITABLE, NULL);
        REQUIRE(w);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, type), 0);
        if (type == KFD_IOC_QUEUE_TYPE_SDMA)
                submit(&q, (const uint32_t[]){SDMA_FENCE, lo(w), hi(w), 1}, 4);
        else
                submit(&q, (const uint32_t[]){PACKET3(PM4_WRITE_DATA, 3), 5u << 8, lo(w), hi(w), 1}, 5);
        at = type == KFD_IOC_QUEUE_TYPE_SDMA ? q.w : q.w * 4;
        submit(&q, pkt, n);
        REQUIRE(expect_fault(&x, mev.event_id, (uintptr_t)q.ring + at, false, false) == 0);
        settle(&x);
        REQUIRE(w[0] == 1);
        if (type == KFD_IOC_QUEUE_TYPE_SDMA)
                REQUIRE(*q.rptr == at);
        else
                REQUIRE(*(volatile uint32_t *)q.rptr == at / 4);
        REQUIRE_RC(queue(&x, &later, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        submit(&later, (const uint32_t[]){SDMA_FENCE, lo(&w[1]), hi(&w[1]), 1}, 4);
        settle(&x);
        REQUIRE(w[1] == 0);
        return ex_teardown(&x);
}

static int test_illegal(void)
{
        uint32_t subwin[13] = {SDMA_SUBWIN | 5u << 29}; /* elements of 32 bytes are not defined */

        REQUIRE(illegal_case(KFD_IOC_QUEUE_TYPE_SDMA, (const uint32_t[]){0xff, 0, 0, 0}, 4) == 0);
        REQUIRE(illegal_case(KFD_IOC_QUEUE_TYPE_SDMA, subwin, 13) == 0);
        /* an atomic operation the engine does not have */
        REQUIRE(illegal_case(KFD_IOC_QUEUE_TYPE_SDMA,
                             (const uint32_t[]){SDMA_ATOMIC | 0x7fu << 25, 0, 0, 0, 0, 0, 0, 0}, 8) == 0);
        /* a PM4 type-1 header */
        REQUIRE(illegal_case(KFD_IOC_QUEUE_TYPE_COMPUTE, (const uint32_t[]){1u << 30, 0}, 2) == 0);
        return 0;
}

/* SET_ATTR on [p, p + size) with @n attributes. */
static int svm_set(Ex *x, void *p, uint64_t size, const struct kfd_ioctl_svm_attribute *at, uint32_t n)
{
        uint64_t buf[1 + 3 + 8];
        struct kfd_ioctl_svm_args *a = (void *)buf;

        memset(buf, 0, sizeof(buf));
        a->start_addr = (uintptr_t)p;
        a->size = size;
        a->op = KFD_IOCTL_SVM_OP_SET_ATTR;
        a->nattr = n;
        memcpy(a->attrs, at, n * sizeof(*at));
        return io(x, x->kfd, thunk_kfd_svm_request(n), a);
}

/*
 * SVM ranges (hipMallocManaged's memory): the engines reach the process's own pages where a range's ACCESS
 * (or ACCESS_IN_PLACE) names their GPU, with GPU_RO a write is a ReadOnly fault, and a range that names no
 * GPU is not present to it.
 */
static int test_svm(void)
{
        Ex x;
        Q q;
        struct kfd_ioctl_create_event_args mev;
        uint8_t *m = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        volatile uint32_t *w;
        const struct kfd_ioctl_svm_attribute access = {KFD_IOCTL_SVM_ATTR_ACCESS, GPU},
                                             ro = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, KFD_IOCTL_SVM_FLAG_GPU_RO};

        REQUIRE(m != MAP_FAILED);
        REQUIRE_RC(ex_setup(&x), 0);
        w = host(&x, PAGE, WRITABLE, NULL);
        REQUIRE(w);
        memset(m, 0x11, 4 * PAGE);
        REQUIRE_RC(svm_set(&x, m, 2 * PAGE, &access, 1), 0);
        REQUIRE_RC(peek_matches(&x), 0); /* an SVM range counted for a status too */
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        /* a fence into the range, a copy out of it into a BO, a fence after both */
        {
                const uint32_t p[] = {SDMA_FENCE, lo(m + 8),  hi(m + 8), 0xfeed,    SDMA_COPY,
                                      15,         0,          lo(m + 4), hi(m + 4), lo(&w[4]),
                                      hi(&w[4]),  SDMA_FENCE, lo(w),     hi(w),     1};
                submit(&q, p, 15);
        }
        settle(&x);
        REQUIRE(w[0] == 1);
        REQUIRE(*(uint32_t *)(m + 8) == 0xfeed);
        REQUIRE(w[4] == 0x11111111u && w[5] == 0xfeed);
        REQUIRE_RC(ex_teardown(&x), 0);

        /* read-only for the GPU: the write is a ReadOnly fault and the page keeps its bytes */
        REQUIRE_RC(ex_setup(&x), 0);
        REQUIRE_RC(svm_set(&x, m, 2 * PAGE, (const struct kfd_ioctl_svm_attribute[]){access, ro}, 2), 0);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        submit(&q, (const uint32_t[]){SDMA_FENCE, lo(m + PAGE), hi(m + PAGE), 0xbad}, 4);
        REQUIRE(expect_fault(&x, mev.event_id, (uintptr_t)(m + PAGE), false, true) == 0);
        REQUIRE(*(uint32_t *)(m + PAGE) == 0x11111111u);
        REQUIRE_RC(ex_teardown(&x), 0);

        /* a range that names no GPU: not present */
        REQUIRE_RC(ex_setup(&x), 0);
        REQUIRE_RC(svm_set(&x, m + 2 * PAGE, 2 * PAGE,
                           &(struct kfd_ioctl_svm_attribute){KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, 0}, 1),
                   0);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        submit(&q, (const uint32_t[]){SDMA_FENCE, lo(m + 3 * PAGE), hi(m + 3 * PAGE), 0xbad}, 4);
        REQUIRE(expect_fault(&x, mev.event_id, (uintptr_t)(m + 3 * PAGE), true, false) == 0);
        REQUIRE(*(uint32_t *)(m + 3 * PAGE) == 0x11111111u);
        REQUIRE_RC(ex_teardown(&x), 0);
        munmap(m, 4 * PAGE);
        return 0;
}

static int test_faults_pm4(void)
{
        Ex x;
        Q q;
        struct kfd_ioctl_create_event_args mev;
        volatile uint32_t *ro;
        uint64_t h;

        /* WRITE_DATA into a read-only VRAM BO */
        REQUIRE_RC(ex_setup(&x), 0);
        ro = vram(&x, VRAM_VA, PAGE, 0, &h);
        REQUIRE(ro);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_COMPUTE), 0);
        submit(&q,
               (const uint32_t[]){PACKET3(PM4_WRITE_DATA, 3), 5u << 8, (uint32_t)(VRAM_VA + 64),
                                  (uint32_t)(VRAM_VA >> 32), 1},
               5);
        REQUIRE(expect_fault(&x, mev.event_id, VRAM_VA + 64, false, true) == 0);
        REQUIRE(ro[16] == 0 && *(volatile uint32_t *)q.rptr == 0);
        munmap((void *)ro, PAGE);
        REQUIRE_RC(ex_teardown(&x), 0);

        /* an indirect buffer nowhere: the CP's fetch faults */
        REQUIRE_RC(ex_setup(&x), 0);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_COMPUTE), 0);
        submit(&q, (const uint32_t[]){PACKET3(PM4_IB, 2), 0x40000000, 0x7, 16 | 1u << 23}, 4);
        REQUIRE(expect_fault(&x, mev.event_id, 0x740000000ULL, true, false) == 0);
        return ex_teardown(&x);
}

/* A GEM_VA mapping keeps the rights it was made with: a read-only one refuses an engine's write. */
static int test_faults_gem_va(void)
{
        Ex x;
        Q q;
        struct kfd_ioctl_create_event_args mev;
        struct kfd_ioctl_export_dmabuf_args ex = {.flags = O_CLOEXEC};
        struct drm_prime_handle ph = {0};
        struct drm_amdgpu_gem_va va = {0};
        volatile uint32_t *w, *v;
        uint64_t h;
        const uint64_t alias = 0x300000000ULL;

        REQUIRE_RC(ex_setup(&x), 0);
        w = host(&x, PAGE, WRITABLE, NULL);
        v = vram(&x, VRAM_VA, PAGE, WRITABLE, &h);
        REQUIRE(w && v);
        ex.handle = h;
        REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        ph.fd = (int)ex.dmabuf_fd;
        REQUIRE_RC(io(&x, x.render, DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph), 0);
        va.handle = ph.handle;
        va.operation = AMDGPU_VA_OP_MAP;
        va.flags = AMDGPU_VM_PAGE_READABLE;
        va.va_address = alias;
        va.map_size = PAGE;
        REQUIRE_RC(io(&x, x.render, DRM_IOCTL_AMDGPU_GEM_VA, &va), 0);
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        /* reading through the alias works: it is the BO's page */
        v[0] = 0x1234;
        submit(&q,
               (const uint32_t[]){SDMA_COPY, 3, 0, (uint32_t)alias, (uint32_t)(alias >> 32), lo(&w[0]),
                                  hi(&w[0])},
               7);
        /* the engine publishes its read pointer (release) after the copy: the copy is seen after it */
        REQUIRE(drained(&q));
        REQUIRE(__atomic_load_n(&w[0], __ATOMIC_ACQUIRE) == 0x1234);
        submit(&q, (const uint32_t[]){SDMA_FENCE, (uint32_t)alias + 8, (uint32_t)(alias >> 32), 5}, 4);
        REQUIRE(expect_fault(&x, mev.event_id, alias + 8, false, true) == 0);
        REQUIRE(v[2] == 0);
        close((int)ex.dmabuf_fd);
        munmap((void *)v, PAGE);
        return ex_teardown(&x);
}

/* ------------------------------------------------------------------ AQL */

/* A kernel dispatch whose descriptor, first instruction, arguments or completion signal is out of the VM
 * faults there; the packet stays in the ring. */
static int aql_dispatch_fault(int which)
{
        Ex x;
        Q q;
        struct kfd_ioctl_create_event_args mev;
        uint8_t *mem, *pkt;
        uint64_t kd, kernarg, sig, bad = 0x740000000ULL + 0x100, want;
        uint32_t kernarg_size = 16;

        REQUIRE_RC(ex_setup(&x), 0);
        mem = host(&x, 4 * PAGE, WRITABLE, NULL);
        REQUIRE(mem);
        kd = (uintptr_t)mem;
        kernarg = (uintptr_t)mem + PAGE;
        sig = (uintptr_t)mem + 2 * PAGE;
        ((int64_t *)(mem + 2 * PAGE))[1] = 1;
        memcpy(mem + 8, &kernarg_size, 4); /* the descriptor's kernarg size */
        if (which == 0)
                kd = bad;
        if (which == 1) {
                int64_t entry = (int64_t)(bad - kd);

                memcpy(mem + 16, &entry, 8); /* the entry point, relative to the descriptor */
        }
        if (which == 2)
                kernarg = bad;
        if (which == 3)
                sig = bad;
        want = which == 0 ? kd : which == 2 ? kernarg : bad;
        REQUIRE_RC(event_new(&x, KFD_IOC_EVENT_MEMORY, 0, &mev), 0);
        REQUIRE_RC(queue(&x, &q, KFD_IOC_QUEUE_TYPE_COMPUTE_AQL), 0);
        for (int i = 0; i < RING / 64; i++)
                *(uint16_t *)((uint8_t *)q.ring + i * 64) = 1; /* INVALID */
        pkt = (uint8_t *)q.ring;
        memcpy(pkt + 32, &kd, 8);
        memcpy(pkt + 40, &kernarg, 8);
        memcpy(pkt + 56, &sig, 8);
        __atomic_store_n((uint16_t *)pkt, 2, __ATOMIC_RELEASE);
        __atomic_store_n(q.wptr, 1, __ATOMIC_RELEASE);
        REQUIRE(expect_fault(&x, mev.event_id, want, true, false) == 0);
        REQUIRE(*q.rptr == 0 && (*(uint16_t *)pkt & 0xff) == 2);
        if (which != 3)
                REQUIRE(((int64_t *)(mem + 2 * PAGE))[1] == 1);
        return ex_teardown(&x);
}

static int test_faults_aql(void)
{
        for (int which = 0; which < 4; which++)
                if (aql_dispatch_fault(which) != 0) {
                        fprintf(stderr, "AQL dispatch fault case %d\n", which);
                        return 1;
                }
        return 0;
}

/* ------------------------------------------------------------------ runner */

/*
 * In doorbell mode the engines run a queue up to what its doorbell was rung with, as the hardware does: a
 * write pointer that moved in memory alone is not seen, and the doorbell page the kfd fd maps is the one
 * the engines read.
 */
static int test_doorbells(void)
{
        Ex x;
        Q sdma, pm4;
        void *slice = NULL;
        volatile uint64_t *db;
        const uint32_t nops[] = {SDMA_NOP, SDMA_NOP, SDMA_NOP};

        REQUIRE_RC(ex_setup_with(&x, true), 0);
        REQUIRE_RC(queue(&x, &sdma, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(queue(&x, &pm4, KFD_IOC_QUEUE_TYPE_COMPUTE), 0);
        REQUIRE((sdma.doorbell_offset & ~8191ULL) == (pm4.doorbell_offset & ~8191ULL));
        REQUIRE_RC(x.seam.ops->mmap(x.seam.impl, NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, x.kfd,
                                    sdma.doorbell_offset & ~8191ULL, &slice),
                   0);
        db = slice;
        REQUIRE(db[(sdma.doorbell_offset & 8191) / 8] == 0); /* unrung */
        submit(&sdma, nops, 3);
        settle(&x);
        REQUIRE(*sdma.rptr == 0); /* the write pointer moved, the doorbell did not */
        __atomic_store_n(&db[(sdma.doorbell_offset & 8191) / 8], sdma.w, __ATOMIC_RELEASE);
        REQUIRE(drained(&sdma) && *sdma.rptr == 12);
        /* PM4: a doorbell in dwords; rung short of the write pointer, the engine stops there */
        {
                const uint32_t p[] = {PACKET3(PM4_NOP, 0), 0, PACKET3(PM4_NOP, 0), 0};
                submit(&pm4, p, 4);
                __atomic_store_n(&db[(pm4.doorbell_offset & 8191) / 8], 2, __ATOMIC_RELEASE);
                REQUIRE(until32(&x, (volatile uint32_t *)pm4.rptr, 2));
                settle(&x);
                REQUIRE(*(volatile uint32_t *)pm4.rptr == 2);
                __atomic_store_n(&db[(pm4.doorbell_offset & 8191) / 8], pm4.w, __ATOMIC_RELEASE);
                REQUIRE(drained(&pm4));
        }
        munmap(slice, 8192);
        {
                struct kfd_ioctl_destroy_queue_args d = {.queue_id = sdma.id};
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
                d.queue_id = pm4.id;
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
        }
        return ex_teardown(&x);
}

/* ------------------------------------------------------------------ fairness and idle engines */

#define BUSY_QUEUES 32

/*
 * SDMA queue @k of those laid out in @mem, 8 KiB each: the ring, then its read and write pointers and a
 * flag. The ring is blocks of 256 dwords, a fence that writes 1 to the flag and 252 NOP dwords: a run of
 * the engine (256 packets, every one at least a dword) passes a fence; the write pointer is so far ahead
 * that the queue never drains.
 */
static int busy_queue(Ex *x, uint8_t *mem, int k, uint32_t *ret_id, volatile uint32_t **ret_flag)
{
        uint8_t *base = mem + (size_t)k * 8192;
        uint32_t *ring = (uint32_t *)base;
        uint64_t *ptrs = (uint64_t *)(base + RING);
        volatile uint32_t *flag = (volatile uint32_t *)(base + RING + 128);
        struct kfd_ioctl_create_queue_args a = {.ring_base_address = (uintptr_t)ring,
                                                .ring_size = RING,
                                                .read_pointer_address = (uintptr_t)ptrs,
                                                .write_pointer_address = (uintptr_t)(ptrs + 1),
                                                .gpu_id = GPU,
                                                .queue_type = KFD_IOC_QUEUE_TYPE_SDMA,
                                                .queue_percentage = 100};

        for (size_t b = 0; b < RING / 4; b += 256) {
                const uint32_t fence[] = {SDMA_FENCE, lo(flag), hi(flag), 1};

                memcpy(&ring[b], fence, sizeof(fence));
                for (size_t i = 4; i < 256; i++)
                        ring[b + i] = SDMA_NOP;
        }
        ptrs[1] = 1ULL << 40;
        if (io(x, x->kfd, AMDKFD_IOC_CREATE_QUEUE, &a) < 0)
                return -EINVAL;
        *ret_id = a.queue_id;
        *ret_flag = flag;
        return 0;
}

/*
 * Did a call come back while the engines were in a round? The flags were cleared from the last queue down
 * to the first and are read back in that order, against the engines' order (first to last). Some middle
 * queue ran since, the first and the last did not: the engines had neither finished the round they were in
 * nor begun another. A round run whole under one hold of the lock never shows this, whatever the timing:
 * whatever ran after a middle queue in the same round includes the last, and a later round that reached a
 * middle queue ran the first before it.
 */
static bool in_round(volatile uint32_t *const *flags)
{
        uint32_t f[BUSY_QUEUES];
        bool middle = false;

        for (int k = BUSY_QUEUES - 1; k >= 0; k--)
                f[k] = __atomic_load_n(flags[k], __ATOMIC_ACQUIRE);
        for (int k = 1; k < BUSY_QUEUES - 1; k++)
                middle |= f[k] != 0;
        return middle && f[0] == 0 && f[BUSY_QUEUES - 1] == 0;
}

/*
 * The per-run bound as ioctls see it: an ioctl waits for the queue the engines are running, then goes
 * before the rest of the round. With 32 queues that never drain, an allocation comes back within a round
 * (in_round). Checked from the queues' own flags, not by timing; a try that asked too late in a round is
 * tried again.
 */
static int test_yield(void)
{
        Ex x;
        uint8_t *mem;
        uint32_t ids[BUSY_QUEUES];
        volatile uint32_t *flags[BUSY_QUEUES];
        bool mid_round = false;

        REQUIRE_RC(ex_setup(&x), 0);
        mem = host(&x, BUSY_QUEUES * 8192, WRITABLE, NULL);
        REQUIRE(mem);
        /* the engines' thread starts with the first queue and runs a round over them in this order */
        for (int k = 0; k < BUSY_QUEUES; k++)
                REQUIRE_RC(busy_queue(&x, mem, k, &ids[k], &flags[k]), 0);
        for (int attempt = 0; attempt < 1000 && !mid_round; attempt++) {
                struct kfd_ioctl_alloc_memory_of_gpu_args a = {.va_addr = VRAM_VA,
                                                               .size = PAGE,
                                                               .gpu_id = GPU,
                                                               .flags = KFD_IOC_ALLOC_MEM_FLAGS_VRAM};
                struct kfd_ioctl_free_memory_of_gpu_args f = {0};

                for (int k = BUSY_QUEUES - 1; k >= 0; k--)
                        __atomic_store_n(flags[k], 0, __ATOMIC_RELEASE);
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a), 0);
                mid_round = in_round(flags);
                f.handle = a.handle;
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &f), 0);
                /* a moment for the engines to get into a round */
                usleep(100);
        }
        REQUIRE(mid_round);
        for (int k = 0; k < BUSY_QUEUES; k++) {
                struct kfd_ioctl_destroy_queue_args d = {.queue_id = ids[k]};
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
        }
        return ex_teardown(&x);
}

/* Some 100 ms without a round of the engines' own thread, within 5 s: it sleeps. */
static bool engines_quiet(Ex *x)
{
        for (int i = 0; i < 50; i++) {
                uint64_t a = thunk_model_engine_rounds(x->m);

                usleep(100000);
                if (thunk_model_engine_rounds(x->m) == a)
                        return true;
        }
        return false;
}

/*
 * The per-run bound: a queue's run retires at most 256 packets and moves at most 4 MiB (a packet that moves
 * more runs whole), and the round goes on to the next queue. Driven by thunk_model_run_engines() alone:
 * with doorbell kicks and none made, the engines' own thread sleeps through it.
 */
static int test_budget(void)
{
        ThunkModelOptions o = {.kfd_minor = 19, .doorbells = true, .doorbell_kicks = true};
        const uint32_t nop2[] = {SDMA_NOP | 1u << 16, 0xdead};
        void *slice = NULL;
        volatile uint64_t *db;
        uint8_t *src, *dst;
        Ex x;
        Q cp, np;

        REQUIRE_RC(ex_setup_opts(&x, &o), 0);
        src = host(&x, 1 << 20, WRITABLE, NULL);
        dst = host(&x, 1 << 20, WRITABLE, NULL);
        REQUIRE(src && dst);
        REQUIRE_RC(queue(&x, &cp, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(queue(&x, &np, KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(x.seam.ops->mmap(x.seam.impl, NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, x.kfd,
                                    cp.doorbell_offset & ~8191ULL, &slice),
                   0);
        db = slice;
        REQUIRE(engines_quiet(&x));
        /* 16 copies of 1 MiB on one queue, 300 two-dword NOPs on the other */
        for (int i = 0; i < 16; i++) {
                const uint32_t p[] = {SDMA_COPY, (1u << 20) - 1, 0, lo(src), hi(src), lo(dst), hi(dst)};
                submit(&cp, p, 7);
        }
        for (int i = 0; i < 300; i++)
                submit(&np, nop2, 2);
        __atomic_store_n(&db[(cp.doorbell_offset & 8191) / 8], cp.w, __ATOMIC_RELEASE);
        __atomic_store_n(&db[(np.doorbell_offset & 8191) / 8], np.w, __ATOMIC_RELEASE);
        /* one round: 4 MiB of copies, 256 NOPs */
        REQUIRE_EQ(thunk_model_run_engines(x.m), 4 + 256);
        REQUIRE_EQ(*cp.rptr, 4 * 7 * 4);
        REQUIRE_EQ(*np.rptr, 256 * 2 * 4);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 4 + 44);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 4);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 4);
        REQUIRE_EQ(thunk_model_run_engines(x.m), 0);
        REQUIRE(*cp.rptr == cp.w && *np.rptr == np.w);
        munmap(slice, 8192);
        {
                struct kfd_ioctl_destroy_queue_args d = {.queue_id = cp.id};
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
                d.queue_id = np.id;
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
        }
        return ex_teardown(&x);
}

/*
 * Idle queues cost nothing when the owner kicks the model after each doorbell write: once every queue is
 * drained the engines' thread runs no round until a kick (on main it looked every millisecond), and a
 * kick after a doorbell write runs the queue with no call to thunk_model_run_engines().
 */
static int test_idle(void)
{
        ThunkModelOptions o = {.kfd_minor = 19, .doorbells = true, .doorbell_kicks = true};
        const uint32_t nops[] = {SDMA_NOP, SDMA_NOP, SDMA_NOP};
        void *slice = NULL;
        volatile uint64_t *db;
        Ex x;
        Q q[4];

        REQUIRE_RC(ex_setup_opts(&x, &o), 0);
        for (int i = 0; i < 4; i++)
                REQUIRE_RC(queue(&x, &q[i], KFD_IOC_QUEUE_TYPE_SDMA), 0);
        REQUIRE_RC(x.seam.ops->mmap(x.seam.impl, NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, x.kfd,
                                    q[0].doorbell_offset & ~8191ULL, &slice),
                   0);
        db = slice;
        /* some 100 ms without a round, within 5 s (a loaded machine may delay the first ones) */
        REQUIRE(engines_quiet(&x));
        /* a doorbell written and kicked: the engines' own thread runs the queue */
        submit(&q[2], nops, 3);
        __atomic_store_n(&db[(q[2].doorbell_offset & 8191) / 8], q[2].w, __ATOMIC_RELEASE);
        thunk_model_doorbell_kick(x.m);
        for (int i = 0; i < 5000 && __atomic_load_n(q[2].rptr, __ATOMIC_ACQUIRE) != 12; i++)
                usleep(1000);
        REQUIRE(*q[2].rptr == 12);
        munmap(slice, 8192);
        for (int i = 0; i < 4; i++) {
                struct kfd_ioctl_destroy_queue_args d = {.queue_id = q[i].id};
                REQUIRE_RC(io(&x, x.kfd, AMDKFD_IOC_DESTROY_QUEUE, &d), 0);
        }
        return ex_teardown(&x);
}

static const RcTestCase tests[] = {
        {"doorbells", test_doorbells},
        {"sdma", test_sdma},
        {"sdma-export", test_sdma_export},
        {"pm4", test_pm4},
        {"faults-sdma", test_faults_sdma},
        {"faults-subwin", test_faults_subwin},
        {"sdma-subwin", test_sdma_subwin},
        {"sdma-subwin-runs", test_sdma_subwin_runs},
        {"illegal", test_illegal},
        {"faults-pm4", test_faults_pm4},
        {"faults-gem-va", test_faults_gem_va},
        {"faults-aql", test_faults_aql},
        {"svm", test_svm},
        {"yield", test_yield},
        {"idle", test_idle},
        {"budget", test_budget},
};

int main(int argc, char **argv)
{
        return run_rc_tests(tests, ARRAY_SIZE(tests), argc > 1 ? argv[1] : NULL);
}
