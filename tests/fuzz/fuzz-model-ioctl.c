/* libFuzzer target: the KFD model's ioctl entry, with any request number, size and payload, on its fds. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "config.h"
#include <amdgpu_drm.h>

#include "fuzz-input.h"
#include "kfd-compat.h"
#include "model.h"
#include "topology.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ThunkTopology *topo;

/*
 * Pointers inside ioctl structs are user addresses the kernel would copy_from_user(). The model dereferences
 * them like the kernel does after a successful copy, so the fuzzer keeps them inside its own buffer: any
 * non-zero pointer field is replaced by this scratch area, and the element counts that go with it are cut
 * to what fits. Zero stays zero, so the model's -EFAULT paths are still reached.
 */
#define SCRATCH_SIZE 65536
static uint8_t scratch[SCRATCH_SIZE] __attribute__((aligned(64)));

/* Requests the fuzzer picks among (the rest come from raw numbers). Queue ioctls are left out: a user
 * queue is read by the model's queue processor as a GPU reads memory, asynchronously and without a copy. */
static const unsigned long known[] = {
        AMDKFD_IOC_GET_VERSION,
        AMDKFD_IOC_SET_MEMORY_POLICY,
        AMDKFD_IOC_GET_CLOCK_COUNTERS,
        AMDKFD_IOC_CREATE_EVENT,
        AMDKFD_IOC_DESTROY_EVENT,
        AMDKFD_IOC_SET_EVENT,
        AMDKFD_IOC_RESET_EVENT,
        AMDKFD_IOC_WAIT_EVENTS,
        AMDKFD_IOC_GET_TILE_CONFIG,
        AMDKFD_IOC_GET_PROCESS_APERTURES,
        AMDKFD_IOC_SET_SCRATCH_BACKING_VA,
        AMDKFD_IOC_GET_PROCESS_APERTURES_NEW,
        AMDKFD_IOC_ACQUIRE_VM,
        AMDKFD_IOC_ALLOC_MEMORY_OF_GPU,
        AMDKFD_IOC_FREE_MEMORY_OF_GPU,
        AMDKFD_IOC_MAP_MEMORY_TO_GPU,
        AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU,
        AMDKFD_IOC_GET_DMABUF_INFO,
        AMDKFD_IOC_IMPORT_DMABUF,
        AMDKFD_IOC_SVM,
        AMDKFD_IOC_SET_XNACK_MODE,
        AMDKFD_IOC_AVAILABLE_MEMORY,
        AMDKFD_IOC_EXPORT_DMABUF,
        AMDKFD_IOC_RUNTIME_ENABLE,
        AMDKFD_IOC_CREATE_PROCESS,
        DRM_IOCTL_GEM_CLOSE,
        DRM_IOCTL_PRIME_HANDLE_TO_FD,
        DRM_IOCTL_PRIME_FD_TO_HANDLE,
        DRM_IOCTL_AMDGPU_GEM_MMAP,
        DRM_IOCTL_AMDGPU_GEM_VA,
};

static bool is_queue_nr(unsigned long req)
{
        unsigned nr = _IOC_NR(req);
        return _IOC_TYPE(req) == AMDKFD_IOCTL_BASE &&
               (nr == _IOC_NR(AMDKFD_IOC_CREATE_QUEUE) || nr == _IOC_NR(AMDKFD_IOC_UPDATE_QUEUE) ||
                nr == _IOC_NR(AMDKFD_IOC_SET_TRAP_HANDLER));
}

#define PATCH_PTR(type, field)                                                                               \
        do {                                                                                                 \
                type *_a = (type *)arg;                                                                      \
                if (_a->field)                                                                               \
                        _a->field = (uint64_t)(uintptr_t)scratch;                                            \
        } while (0)
#define CLAMP(type, field, max)                                                                              \
        do {                                                                                                 \
                type *_a = (type *)arg;                                                                      \
                if (_a->field > (max))                                                                       \
                        _a->field = (max);                                                                   \
        } while (0)

/* The model reads arg as the kernel's struct for the request's number, whatever the size: patch by number. */
static void sanitise(unsigned long req, void *arg)
{
        if (_IOC_TYPE(req) != AMDKFD_IOCTL_BASE)
                return; /* the DRM ioctls the model serves carry no user pointers */
        switch (_IOC_NR(req)) {
        case _IOC_NR(AMDKFD_IOC_GET_PROCESS_APERTURES_NEW):
                PATCH_PTR(struct kfd_ioctl_get_process_apertures_new_args, kfd_process_device_apertures_ptr);
                CLAMP(struct kfd_ioctl_get_process_apertures_new_args, num_of_nodes,
                      SCRATCH_SIZE / sizeof(struct kfd_process_device_apertures));
                break;
        case _IOC_NR(AMDKFD_IOC_MAP_MEMORY_TO_GPU):
        case _IOC_NR(AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU):
                PATCH_PTR(struct kfd_ioctl_map_memory_to_gpu_args, device_ids_array_ptr);
                CLAMP(struct kfd_ioctl_map_memory_to_gpu_args, n_devices, SCRATCH_SIZE / sizeof(uint32_t));
                break;
        case _IOC_NR(AMDKFD_IOC_GET_DMABUF_INFO):
                PATCH_PTR(struct kfd_ioctl_get_dmabuf_info_args, metadata_ptr);
                CLAMP(struct kfd_ioctl_get_dmabuf_info_args, metadata_size, SCRATCH_SIZE);
                break;
        case _IOC_NR(AMDKFD_IOC_GET_TILE_CONFIG):
                PATCH_PTR(struct kfd_ioctl_get_tile_config_args, tile_config_ptr);
                PATCH_PTR(struct kfd_ioctl_get_tile_config_args, macro_tile_config_ptr);
                CLAMP(struct kfd_ioctl_get_tile_config_args, num_tile_configs, SCRATCH_SIZE / 4);
                CLAMP(struct kfd_ioctl_get_tile_config_args, num_macro_tile_configs, SCRATCH_SIZE / 4);
                break;
        case _IOC_NR(AMDKFD_IOC_WAIT_EVENTS):
                PATCH_PTR(struct kfd_ioctl_wait_events_args, events_ptr);
                CLAMP(struct kfd_ioctl_wait_events_args, num_events,
                      SCRATCH_SIZE / sizeof(struct kfd_event_data));
                CLAMP(struct kfd_ioctl_wait_events_args, timeout, 0); /* never sleep */
                break;
        case _IOC_NR(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU): {
                /* a userptr names process memory: keep it inside the scratch area, page aligned */
                struct kfd_ioctl_alloc_memory_of_gpu_args *a = arg;
                if (a->flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                        if (a->mmap_offset)
                                a->mmap_offset = (uint64_t)(uintptr_t)scratch;
                        if (a->size > SCRATCH_SIZE)
                                a->size = SCRATCH_SIZE;
                }
                break;
        }
        default:
                break;
        }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
        char err[256], path[4096];
        const char *dir = getenv("GPUMEMD_PRESETDIR");

        snprintf(path, sizeof(path), "%s/mi300x", dir ? dir : GPUMEMD_SOURCE_PRESETDIR);
        if (thunk_topology_load(path, &topo, err, sizeof(err)) < 0) {
                fprintf(stderr, "fuzz-model-ioctl: cannot load %s: %s\n", path, err);
                abort();
        }
        return 0;
}

/* Input: [kfd minor u8] then ops of [fd sel u8][request sel u8 (+u32 when raw)][len u8][len bytes]. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static uint8_t arg[16384 + 64] __attribute__((aligned(64)));
        ThunkModelOptions o = {0};
        ThunkModelStats st;
        ThunkModel *m = NULL;
        Reader r = {data, size};
        int fds[1 + THUNK_MODEL_MAX_GPUS + 1], n_fds = 0, kfd2 = -1;

        o.kfd_minor = 11 + rd8(&r) % 9;
        o.system_memory_bytes = 4ull << 30; /* keep the model's limits (and the fuzzer's RSS) small */
        if (thunk_model_new(topo, &o, &m) < 0)
                abort();
        if (thunk_model_open_kfd(m, &fds[n_fds]) == 0)
                n_fds++;
        for (size_t g = 0; g < topo->n_gpus && g < 8; g++) {
                const ThunkNode *n = thunk_topology_gpu_by_index(topo, g);
                if (n && thunk_model_open_render(m, n->drm_render_minor, &fds[n_fds]) == 0)
                        n_fds++;
        }
        for (int ops = 0; r.n > 0 && ops < 64; ops++) {
                uint8_t fsel = rd8(&r), rsel = rd8(&r);
                unsigned long req;
                size_t len, usize;
                int fd;

                if (fsel == 0xff) {
                        /* a second kfd fd: a secondary context where the ABI allows it */
                        if (kfd2 < 0)
                                (void)thunk_model_open_kfd(m, &kfd2);
                        continue;
                }
                if (fsel == 0xfe && kfd2 >= 0) {
                        thunk_model_close(m, kfd2);
                        kfd2 = -1;
                        continue;
                }
                fd = fsel % 16 == 15 ? 1000 + fsel : fsel % 16 == 14 && kfd2 >= 0 ? kfd2 : fds[fsel % n_fds];
                if (rsel < 0xc0)
                        req = known[rsel % (sizeof(known) / sizeof(known[0]))];
                else
                        req = (uint32_t)rdn(&r, 4); /* anything: other types, numbers, sizes and directions */
                if (is_queue_nr(req))
                        req = AMDKFD_IOC_GET_VERSION;
                usize = _IOC_SIZE(req);
                len = rd8(&r);
                memset(arg, 0, sizeof(arg));
                for (size_t i = 0; i < len && i < sizeof(arg); i++)
                        arg[i] = rd8(&r);
                sanitise(req, arg);
                (void)usize;
                (void)thunk_model_ioctl(m, fd, req, arg);
                if (rsel == 0xbf)
                        thunk_model_clear_faults(m);
                else if (rsel == 0xbe)
                        (void)thunk_model_inject_fault(m, known[len % (sizeof(known) / sizeof(known[0]))],
                                                       1 + len % 3, 1 + len % 40);
        }
        if (kfd2 >= 0)
                thunk_model_close(m, kfd2);
        for (int i = 0; i < n_fds; i++)
                thunk_model_close(m, fds[i]);
        /* nothing outlives the fds: every context, buffer and mapping is gone with them */
        thunk_model_get_stats(m, &st);
        if (st.contexts != 0 || st.kfd_fds != 0 || st.render_fds != 0 || st.mems != 0 || st.bufs != 0 ||
            st.mappings != 0 || st.gem_handles != 0 || st.system_used != 0 || st.ttm_used != 0) {
                fprintf(stderr,
                        "model state left after every fd closed: contexts %u kfd %u render %u mems %llu bufs "
                        "%llu mappings %llu gem %llu system %llu ttm %llu\n",
                        st.contexts, st.kfd_fds, st.render_fds, (unsigned long long)st.mems,
                        (unsigned long long)st.bufs, (unsigned long long)st.mappings,
                        (unsigned long long)st.gem_handles, (unsigned long long)st.system_used,
                        (unsigned long long)st.ttm_used);
                abort();
        }
        thunk_model_free(m);
        return 0;
}
