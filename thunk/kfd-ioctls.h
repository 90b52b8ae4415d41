/* The KFD and DRM ioctls the project knows, listed once: name, request, argument struct and ABI minor. */
#pragma once

#include <stdint.h>
#include <strings.h>
#include <linux/ioctl.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "kfd-compat.h"

/*
 * X(NAME, REQUEST, ARGS, MINOR), one row an ioctl, as the kernel's uapi has it:
 *   NAME     what logs and fault injection call it: the KFD's without AMDKFD_IOC_ (and _DEPRECATED), the
 *            DRM core's DRM_ and amdgpu's AMDGPU_ before the rest of the uapi's name;
 *   REQUEST  the uapi's request: type, number, direction and _IOC_SIZE (kfd_ioctl.h, kfd-compat.h, libdrm);
 *   ARGS     its argument struct, so that sizeof(ARGS) == _IOC_SIZE(REQUEST);
 *   MINOR    the KFD ABI minor from which the KFD has it: 11 for every ioctl the 1.11 header (the oldest the
 *            project builds against) has already; 0 for the DRM ones, which are the render node's.
 *
 * Every place that names, numbers or dispatches these ioctls expands the lists: the model's tables, the
 * preload layer's log and the client-side KFD's dispatch, the daemon's fault injection, and the
 * helpers below. tests/unit/test-kfd-ioctls.c checks the lists against themselves and against the model.
 */

/* An ioctl without an argument: a type of size 0 (a GNU C zero-length array). */
#define THUNK_IOCTL_NO_ARGS char[0]

/* The KFD's table (/dev/kfd), by number from AMDKFD_COMMAND_START on, with no hole. */
#define THUNK_KFD_IOCTLS(X)                                                                                  \
        X(GET_VERSION, AMDKFD_IOC_GET_VERSION, struct kfd_ioctl_get_version_args, 11)                        \
        X(CREATE_QUEUE, AMDKFD_IOC_CREATE_QUEUE, struct kfd_ioctl_create_queue_args, 11)                     \
        X(DESTROY_QUEUE, AMDKFD_IOC_DESTROY_QUEUE, struct kfd_ioctl_destroy_queue_args, 11)                  \
        X(SET_MEMORY_POLICY, AMDKFD_IOC_SET_MEMORY_POLICY, struct kfd_ioctl_set_memory_policy_args, 11)      \
        X(GET_CLOCK_COUNTERS, AMDKFD_IOC_GET_CLOCK_COUNTERS, struct kfd_ioctl_get_clock_counters_args, 11)   \
        X(GET_PROCESS_APERTURES, AMDKFD_IOC_GET_PROCESS_APERTURES,                                           \
          struct kfd_ioctl_get_process_apertures_args, 11)                                                   \
        X(UPDATE_QUEUE, AMDKFD_IOC_UPDATE_QUEUE, struct kfd_ioctl_update_queue_args, 11)                     \
        X(CREATE_EVENT, AMDKFD_IOC_CREATE_EVENT, struct kfd_ioctl_create_event_args, 11)                     \
        X(DESTROY_EVENT, AMDKFD_IOC_DESTROY_EVENT, struct kfd_ioctl_destroy_event_args, 11)                  \
        X(SET_EVENT, AMDKFD_IOC_SET_EVENT, struct kfd_ioctl_set_event_args, 11)                              \
        X(RESET_EVENT, AMDKFD_IOC_RESET_EVENT, struct kfd_ioctl_reset_event_args, 11)                        \
        X(WAIT_EVENTS, AMDKFD_IOC_WAIT_EVENTS, struct kfd_ioctl_wait_events_args, 11)                        \
        X(DBG_REGISTER, AMDKFD_IOC_DBG_REGISTER_DEPRECATED, struct kfd_ioctl_dbg_register_args, 11)          \
        X(DBG_UNREGISTER, AMDKFD_IOC_DBG_UNREGISTER_DEPRECATED, struct kfd_ioctl_dbg_unregister_args, 11)    \
        X(DBG_ADDRESS_WATCH, AMDKFD_IOC_DBG_ADDRESS_WATCH_DEPRECATED,                                        \
          struct kfd_ioctl_dbg_address_watch_args, 11)                                                       \
        X(DBG_WAVE_CONTROL, AMDKFD_IOC_DBG_WAVE_CONTROL_DEPRECATED, struct kfd_ioctl_dbg_wave_control_args,  \
          11)                                                                                                \
        X(SET_SCRATCH_BACKING_VA, AMDKFD_IOC_SET_SCRATCH_BACKING_VA,                                         \
          struct kfd_ioctl_set_scratch_backing_va_args, 11)                                                  \
        X(GET_TILE_CONFIG, AMDKFD_IOC_GET_TILE_CONFIG, struct kfd_ioctl_get_tile_config_args, 11)            \
        X(SET_TRAP_HANDLER, AMDKFD_IOC_SET_TRAP_HANDLER, struct kfd_ioctl_set_trap_handler_args, 11)         \
        X(GET_PROCESS_APERTURES_NEW, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW,                                   \
          struct kfd_ioctl_get_process_apertures_new_args, 11)                                               \
        X(ACQUIRE_VM, AMDKFD_IOC_ACQUIRE_VM, struct kfd_ioctl_acquire_vm_args, 11)                           \
        X(ALLOC_MEMORY_OF_GPU, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, struct kfd_ioctl_alloc_memory_of_gpu_args,    \
          11)                                                                                                \
        X(FREE_MEMORY_OF_GPU, AMDKFD_IOC_FREE_MEMORY_OF_GPU, struct kfd_ioctl_free_memory_of_gpu_args, 11)   \
        X(MAP_MEMORY_TO_GPU, AMDKFD_IOC_MAP_MEMORY_TO_GPU, struct kfd_ioctl_map_memory_to_gpu_args, 11)      \
        X(UNMAP_MEMORY_FROM_GPU, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU,                                           \
          struct kfd_ioctl_unmap_memory_from_gpu_args, 11)                                                   \
        X(SET_CU_MASK, AMDKFD_IOC_SET_CU_MASK, struct kfd_ioctl_set_cu_mask_args, 11)                        \
        X(GET_QUEUE_WAVE_STATE, AMDKFD_IOC_GET_QUEUE_WAVE_STATE, struct kfd_ioctl_get_queue_wave_state_args, \
          11)                                                                                                \
        X(GET_DMABUF_INFO, AMDKFD_IOC_GET_DMABUF_INFO, struct kfd_ioctl_get_dmabuf_info_args, 11)            \
        X(IMPORT_DMABUF, AMDKFD_IOC_IMPORT_DMABUF, struct kfd_ioctl_import_dmabuf_args, 11)                  \
        X(ALLOC_QUEUE_GWS, AMDKFD_IOC_ALLOC_QUEUE_GWS, struct kfd_ioctl_alloc_queue_gws_args, 11)            \
        X(SMI_EVENTS, AMDKFD_IOC_SMI_EVENTS, struct kfd_ioctl_smi_events_args, 11)                           \
        X(SVM, AMDKFD_IOC_SVM, struct kfd_ioctl_svm_args, 11)                                                \
        X(SET_XNACK_MODE, AMDKFD_IOC_SET_XNACK_MODE, struct kfd_ioctl_set_xnack_mode_args, 11)               \
        X(CRIU_OP, AMDKFD_IOC_CRIU_OP, struct kfd_ioctl_criu_args, 11)                                       \
        X(AVAILABLE_MEMORY, AMDKFD_IOC_AVAILABLE_MEMORY, struct kfd_ioctl_get_available_memory_args, 11)     \
        X(EXPORT_DMABUF, AMDKFD_IOC_EXPORT_DMABUF, struct kfd_ioctl_export_dmabuf_args, 12)                  \
        X(RUNTIME_ENABLE, AMDKFD_IOC_RUNTIME_ENABLE, struct kfd_ioctl_runtime_enable_args, 13)               \
        X(DBG_TRAP, AMDKFD_IOC_DBG_TRAP, struct kfd_ioctl_dbg_trap_args, 13)                                 \
        X(CREATE_PROCESS, AMDKFD_IOC_CREATE_PROCESS, THUNK_IOCTL_NO_ARGS, 19)

/* The DRM ioctls of a render node that the thunk issues, the model serves or libdrm sends through the
 * preload layer: the DRM core's, then amdgpu's (from DRM_COMMAND_BASE). */
#define THUNK_DRM_IOCTLS(X)                                                                                  \
        X(DRM_VERSION, DRM_IOCTL_VERSION, struct drm_version, 0)                                             \
        X(DRM_GET_CLIENT, DRM_IOCTL_GET_CLIENT, struct drm_client, 0)                                        \
        X(DRM_GEM_CLOSE, DRM_IOCTL_GEM_CLOSE, struct drm_gem_close, 0)                                       \
        X(DRM_PRIME_HANDLE_TO_FD, DRM_IOCTL_PRIME_HANDLE_TO_FD, struct drm_prime_handle, 0)                  \
        X(DRM_PRIME_FD_TO_HANDLE, DRM_IOCTL_PRIME_FD_TO_HANDLE, struct drm_prime_handle, 0)                  \
        X(AMDGPU_GEM_MMAP, DRM_IOCTL_AMDGPU_GEM_MMAP, union drm_amdgpu_gem_mmap, 0)                          \
        X(AMDGPU_INFO, DRM_IOCTL_AMDGPU_INFO, struct drm_amdgpu_info, 0)                                     \
        X(AMDGPU_GEM_VA, DRM_IOCTL_AMDGPU_GEM_VA, struct drm_amdgpu_gem_va, 0)

/* The name of a KFD or DRM request, by its type and number (what the drivers dispatch on), or NULL. A number
 * listed twice is a duplicate case: it does not build. */
#define THUNK_IOCTL_NAME_CASE(name, req, args, minor)                                                        \
        case _IOC_NR(req):                                                                                   \
                return #name;
static inline const char *thunk_ioctl_name(unsigned long request)
{
        if (_IOC_TYPE(request) == AMDKFD_IOCTL_BASE) {
                switch (_IOC_NR(request)) {
                        THUNK_KFD_IOCTLS(THUNK_IOCTL_NAME_CASE)
                default:
                        break;
                }
        } else if (_IOC_TYPE(request) == DRM_IOCTL_BASE) {
                switch (_IOC_NR(request)) {
                        THUNK_DRM_IOCTLS(THUNK_IOCTL_NAME_CASE)
                default:
                        break;
                }
        }
        return NULL;
}
#undef THUNK_IOCTL_NAME_CASE

/* The ABI minor from which the KFD has ioctl number @nr, or -1 for a number it never had. */
#define THUNK_IOCTL_MINOR_CASE(name, req, args, minor)                                                       \
        case _IOC_NR(req):                                                                                   \
                return minor;
static inline int thunk_kfd_ioctl_minor(unsigned int nr)
{
        switch (nr) {
                THUNK_KFD_IOCTLS(THUNK_IOCTL_MINOR_CASE)
        default:
                return -1;
        }
}
#undef THUNK_IOCTL_MINOR_CASE

/* One past the KFD's last ioctl number at ABI @minor (AMDKFD_COMMAND_END of that minor's header). */
#define THUNK_IOCTL_END_AT(name, req, args, since)                                                           \
        if ((since) <= minor && _IOC_NR(req) + 1 > end)                                                      \
                end = _IOC_NR(req) + 1;
static inline unsigned int thunk_kfd_command_end(uint32_t minor)
{
        unsigned int end = 0;

        /* an older ABI still has the 1.11 table: the oldest the list describes, not an empty one */
        if (minor < 11)
                minor = 11;
        THUNK_KFD_IOCTLS(THUNK_IOCTL_END_AT)
        return end;
}
#undef THUNK_IOCTL_END_AT

/* The request of the KFD or DRM ioctl named @s (in any case), or 0. */
#define THUNK_IOCTL_REQUEST_OF(name, req, args, minor)                                                       \
        if (strcasecmp(s, #name) == 0)                                                                       \
                return req;
static inline unsigned long thunk_ioctl_request(const char *s)
{
        THUNK_KFD_IOCTLS(THUNK_IOCTL_REQUEST_OF)
        THUNK_DRM_IOCTLS(THUNK_IOCTL_REQUEST_OF)
        return 0;
}
#undef THUNK_IOCTL_REQUEST_OF
