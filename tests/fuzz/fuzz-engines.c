/* libFuzzer target: the KFD model's SDMA, PM4 and AQL engines running a ring of any content over a fixed GPU
 * VM. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include <linux/kfd_sysfs.h>

#include "kfd-compat.h"
#include "model.h"
#include "topology.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/*
 * The process's side of the GPU VM, at fixed addresses so that inputs can name them (and the fuzzer learns
 * them from the model's compares): host pages registered as userptr BOs at their own address, as libhsakmt
 * maps host memory, and two VRAM BOs. Every input starts from the same zeroed layout.
 *
 *   HOST + 0x00000  ring (up to 16 KiB)         HOST + 0x10000  read-write data (128 KiB)
 *   HOST + 0x04000  read and write pointers     HOST + 0x30000  read-only data (64 KiB)
 *   HOST + 0x08000  signal page (32 KiB)        HOST + 0x40000  never mapped
 *   VRAM            read-write VRAM (64 KiB)    VRAM + 0x10000  read-only VRAM (64 KiB)
 */
#define HOST      0x510000000000ULL
#define HOST_SIZE (1ULL << 20)
#define RING_OFF  0x0
#define PTRS_OFF  0x4000
#define PAGE_OFF  0x8000
#define RW_OFF    0x10000
#define RW_SIZE   0x20000
#define RO_OFF    0x30000
#define RO_SIZE   0x10000
#define VRAM      0x200000000ULL
#define VRAM_SIZE 0x10000
#define GPU_ID    0x1234u
#define WRITABLE  KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
#define EXEC      KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE

static ThunkTopology topo;
static ThunkNode nodes[2];
static ThunkMemBank banks[2];
static uint8_t *host;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
        (void)argc;
        (void)argv;
        host = mmap((void *)(uintptr_t)HOST, HOST_SIZE, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (host != (uint8_t *)(uintptr_t)HOST) {
                fprintf(stderr, "fuzz-engines: cannot map the host window at 0x%llx\n", HOST);
                abort();
        }
        /* one gfx9 dGPU with large-BAR VRAM, and a CPU node */
        banks[0] = (ThunkMemBank){.heap_type = HSA_MEM_HEAP_TYPE_SYSTEM, .size_in_bytes = 4ULL << 30};
        banks[1] = (ThunkMemBank){.heap_type = HSA_MEM_HEAP_TYPE_FB_PUBLIC, .size_in_bytes = 1ULL << 30};
        nodes[0] = (ThunkNode){.cpu_cores_count = 4, .mem_banks = &banks[0], .n_mem_banks = 1};
        nodes[1] = (ThunkNode){.node_id = 1,
                               .gpu_id = GPU_ID,
                               .is_gpu = true,
                               .simd_count = 8,
                               .drm_render_minor = 128,
                               .gfx_target_version = 90008,
                               .mem_banks = &banks[1],
                               .n_mem_banks = 1};
        topo = (ThunkTopology){.nodes = nodes, .n_nodes = 2, .n_gpus = 1};
        return 0;
}

static int io(ThunkModel *m, int fd, unsigned long req, void *arg)
{
        return thunk_model_ioctl(m, fd, req, arg);
}

static int bo(ThunkModel *m, int kfd, uint64_t va, uint64_t size, uint32_t flags, uint64_t *ret_handle)
{
        uint32_t id = GPU_ID;
        struct kfd_ioctl_alloc_memory_of_gpu_args a = {
                .va_addr = va, .size = size, .gpu_id = GPU_ID, .flags = flags, .mmap_offset = va};
        struct kfd_ioctl_map_memory_to_gpu_args mp = {.device_ids_array_ptr = (uintptr_t)&id, .n_devices = 1};

        if (io(m, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a) < 0)
                return -1;
        mp.handle = a.handle;
        if (ret_handle)
                *ret_handle = a.handle;
        return io(m, kfd, AMDKFD_IOC_MAP_MEMORY_TO_GPU, &mp);
}

/* Input: [queue type u8][ring size u8][ring bytes ...]; the bytes also fill the read-write data, so that an
 * indirect buffer or a signal the ring points at holds something. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static const uint32_t types[] = {KFD_IOC_QUEUE_TYPE_SDMA, KFD_IOC_QUEUE_TYPE_COMPUTE,
                                         KFD_IOC_QUEUE_TYPE_COMPUTE_AQL};
        static const uint32_t rings[] = {256, 1024, 4096, 16384};
        ThunkModelOptions o = {.kfd_minor = 19, .system_memory_bytes = 4ULL << 30};
        struct kfd_ioctl_create_queue_args q = {.gpu_id = GPU_ID, .queue_percentage = 100};
        struct kfd_ioctl_create_event_args sig = {.event_type = KFD_IOC_EVENT_SIGNAL, .auto_reset = 1};
        struct kfd_ioctl_create_event_args mem = {.event_type = KFD_IOC_EVENT_MEMORY, .auto_reset = 1};
        struct kfd_ioctl_acquire_vm_args acq = {.gpu_id = GPU_ID};
        ThunkModel *m = NULL;
        ThunkModelStats st;
        uint64_t page = 0, ring, n;
        uint32_t type;
        int kfd = -1, render = -1;

        if (size < 2)
                return 0;
        type = types[data[0] % 3];
        ring = rings[data[1] % 4];
        data += 2;
        size -= 2;
        n = size < ring ? size : ring;
        memset(host, 0, HOST_SIZE);
        memcpy(host + RING_OFF, data, n);
        memcpy(host + RW_OFF, data, size < RW_SIZE ? size : RW_SIZE);

        if (thunk_model_new(&topo, &o, &m) < 0 || thunk_model_open_kfd(m, &kfd) < 0 ||
            thunk_model_open_render(m, 128, &render) < 0)
                abort();
        acq.drm_fd = (uint32_t)render;
        if (io(m, kfd, AMDKFD_IOC_ACQUIRE_VM, &acq) < 0 ||
            bo(m, kfd, HOST + RING_OFF, 0x8000, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | WRITABLE, NULL) < 0 ||
            bo(m, kfd, HOST + PAGE_OFF, 0x8000, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | WRITABLE, &page) < 0 ||
            bo(m, kfd, HOST + RW_OFF, RW_SIZE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | WRITABLE | EXEC, NULL) < 0 ||
            bo(m, kfd, HOST + RO_OFF, RO_SIZE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, NULL) < 0 ||
            bo(m, kfd, VRAM, VRAM_SIZE, KFD_IOC_ALLOC_MEM_FLAGS_VRAM | WRITABLE, NULL) < 0 ||
            bo(m, kfd, VRAM + VRAM_SIZE, VRAM_SIZE, KFD_IOC_ALLOC_MEM_FLAGS_VRAM, NULL) < 0)
                abort();
        sig.event_page_offset = page;
        if (io(m, kfd, AMDKFD_IOC_CREATE_EVENT, &sig) < 0 || io(m, kfd, AMDKFD_IOC_CREATE_EVENT, &mem) < 0)
                abort();
        q.queue_type = type;
        q.ring_base_address = HOST + RING_OFF;
        q.ring_size = ring;
        q.read_pointer_address = HOST + PTRS_OFF;
        q.write_pointer_address = HOST + PTRS_OFF + 64;
        if (io(m, kfd, AMDKFD_IOC_CREATE_QUEUE, &q) < 0)
                abort();
        /* publish what the input holds: bytes (SDMA), dwords (PM4) or 64-byte packets (AQL) */
        if (type == KFD_IOC_QUEUE_TYPE_SDMA)
                __atomic_store_n((uint64_t *)(host + PTRS_OFF + 64), n & ~3ULL, __ATOMIC_RELEASE);
        else if (type == KFD_IOC_QUEUE_TYPE_COMPUTE)
                __atomic_store_n((uint64_t *)(host + PTRS_OFF + 64), n / 4, __ATOMIC_RELEASE);
        else
                __atomic_store_n((uint64_t *)(host + PTRS_OFF + 64), n / 64, __ATOMIC_RELEASE);
        /* the engines run until they stop retiring packets (a poll or barrier that never holds waits) */
        for (int i = 0; i < 16 && thunk_model_run_engines(m) > 0; i++)
                ;
        thunk_model_get_stats(m, &st);
        if (st.queues != 1 || st.events != 2)
                abort();
        if (thunk_model_close(m, kfd) < 0 || thunk_model_close(m, render) < 0)
                abort();
        thunk_model_get_stats(m, &st);
        if (st.contexts || st.bufs || st.mappings || st.queues || st.events)
                abort();
        thunk_model_free(m);
        return 0;
}
