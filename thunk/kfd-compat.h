/* The KFD ioctl ABI as the project uses it: the distribution's <linux/kfd_ioctl.h> plus what newer kernels
 * added. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <linux/ioctl.h>
#include <linux/kfd_ioctl.h>

/*
 * The distribution header may be as old as ABI 1.11. Everything added later that the project touches is
 * defined here, each item behind its own guard, so a newer header simply takes precedence. The static
 * asserts at the end pin every struct size and field offset the thunk and the model rely on: if a header
 * ever disagrees with the kernel's layout, the build fails instead of the ioctl.
 */

/* ABI 1.12: export a BO as a dmabuf fd. */
#ifndef AMDKFD_IOC_EXPORT_DMABUF
struct kfd_ioctl_export_dmabuf_args {
        __u64 handle;    /* to KFD */
        __u32 flags;     /* to KFD: open flags of the new fd (O_CLOEXEC) */
        __u32 dmabuf_fd; /* from KFD */
};
#define AMDKFD_IOC_EXPORT_DMABUF AMDKFD_IOWR(0x24, struct kfd_ioctl_export_dmabuf_args)
#endif

/* ABI 1.13: debugger runtime enable. */
#ifndef AMDKFD_IOC_RUNTIME_ENABLE
struct kfd_ioctl_runtime_enable_args {
        __u64 r_debug;
        __u32 mode_mask;
        __u32 capabilities_mask;
};
#define AMDKFD_IOC_RUNTIME_ENABLE AMDKFD_IOWR(0x25, struct kfd_ioctl_runtime_enable_args)
#endif
#ifndef KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK
#define KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK    1
#define KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK 2
#endif
#ifndef KFD_RUNTIME_ENABLE_CAPS_SUPPORTS_CORE_DUMP_MASK
#define KFD_RUNTIME_ENABLE_CAPS_SUPPORTS_CORE_DUMP_MASK 0x80000000u
#endif

/* ABI 1.13: debugger trap (the model does not serve it): the process, the operation and its arguments, which
 * the uapi lays out as a union of one struct per operation, the largest 24 bytes. */
#ifndef AMDKFD_IOC_DBG_TRAP
struct kfd_ioctl_dbg_trap_args {
        __u32 pid;
        __u32 op;
        __u64 op_args[3];
};
#define AMDKFD_IOC_DBG_TRAP AMDKFD_IOWR(0x26, struct kfd_ioctl_dbg_trap_args)
#endif

/* ABI 1.19: turn this fd's context into a new secondary KFD process. */
#ifndef AMDKFD_IOC_CREATE_PROCESS
#define AMDKFD_IOC_CREATE_PROCESS AMDKFD_IO(0x27)
#endif

/* The uapi header spells bit 31 as (1 << 31), which overflows int; the same bit as an unsigned constant. */
#undef KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
#define KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE (1u << 31)

/* Allocation flags added after 1.11. */
#ifndef KFD_IOC_ALLOC_MEM_FLAGS_EXT_COHERENT
#define KFD_IOC_ALLOC_MEM_FLAGS_EXT_COHERENT (1 << 24)
#endif
#ifndef KFD_IOC_ALLOC_MEM_FLAGS_CONTIGUOUS
#define KFD_IOC_ALLOC_MEM_FLAGS_CONTIGUOUS (1 << 23)
#endif

#ifndef KFD_IOCTL_SVM_FLAG_EXT_COHERENT
#define KFD_IOCTL_SVM_FLAG_EXT_COHERENT 0x00000080
#endif

#ifndef KFD_INVALID_GPUID
#define KFD_INVALID_GPUID 0xffffffffu
#endif
#ifndef KFD_INVALID_QUEUEID
#define KFD_INVALID_QUEUEID 0xffffffffu
#endif

/* Handles: the owning GPU in the high half, a per-(process, GPU) id in the low half. */
#define THUNK_KFD_HANDLE(gpu_id, idr) (((uint64_t)(gpu_id) << 32) | (uint32_t)(idr))
#define THUNK_KFD_HANDLE_GPU(h)       ((uint32_t)((uint64_t)(h) >> 32))
#define THUNK_KFD_HANDLE_IDR(h)       ((uint32_t)((uint64_t)(h)&0xffffffffu))

/* mmap offsets on /dev/kfd: type in bits 63:62, gpu_id in 61:46. */
#define THUNK_KFD_MMAP_TYPE_SHIFT    62
#define THUNK_KFD_MMAP_TYPE_MASK     (3ULL << THUNK_KFD_MMAP_TYPE_SHIFT)
#define THUNK_KFD_MMAP_TYPE_DOORBELL (3ULL << THUNK_KFD_MMAP_TYPE_SHIFT)
#define THUNK_KFD_MMAP_TYPE_EVENTS   (2ULL << THUNK_KFD_MMAP_TYPE_SHIFT)
#define THUNK_KFD_MMAP_TYPE_RESERVED (1ULL << THUNK_KFD_MMAP_TYPE_SHIFT)
#define THUNK_KFD_MMAP_TYPE_MMIO     (0ULL << THUNK_KFD_MMAP_TYPE_SHIFT)
#define THUNK_KFD_MMAP_GPU_ID_SHIFT  46
#define THUNK_KFD_MMAP_GPU_ID_MASK   (0xffffULL << THUNK_KFD_MMAP_GPU_ID_SHIFT)
#define THUNK_KFD_MMAP_GPU_ID(id)                                                                            \
        (((uint64_t)(id) << THUNK_KFD_MMAP_GPU_ID_SHIFT) & THUNK_KFD_MMAP_GPU_ID_MASK)
#define THUNK_KFD_MMAP_GET_GPU_ID(o)                                                                         \
        ((uint32_t)(((o)&THUNK_KFD_MMAP_GPU_ID_MASK) >> THUNK_KFD_MMAP_GPU_ID_SHIFT))

/* ---- layout pins (sizes and offsets from the kernel's uapi header) ---- */
#define THUNK_KFD_PIN(type, field, off)                                                                      \
        _Static_assert(offsetof(struct type, field) == (off), #type "." #field)
#define THUNK_KFD_SIZE(type, sz) _Static_assert(sizeof(struct type) == (sz), #type " size")

THUNK_KFD_SIZE(kfd_ioctl_get_version_args, 8);
THUNK_KFD_PIN(kfd_ioctl_get_version_args, major_version, 0);
THUNK_KFD_PIN(kfd_ioctl_get_version_args, minor_version, 4);

THUNK_KFD_SIZE(kfd_ioctl_set_memory_policy_args, 32);
THUNK_KFD_PIN(kfd_ioctl_set_memory_policy_args, alternate_aperture_base, 0);
THUNK_KFD_PIN(kfd_ioctl_set_memory_policy_args, alternate_aperture_size, 8);
THUNK_KFD_PIN(kfd_ioctl_set_memory_policy_args, gpu_id, 16);
THUNK_KFD_PIN(kfd_ioctl_set_memory_policy_args, default_policy, 20);
THUNK_KFD_PIN(kfd_ioctl_set_memory_policy_args, alternate_policy, 24);

THUNK_KFD_SIZE(kfd_ioctl_set_scratch_backing_va_args, 16);
THUNK_KFD_PIN(kfd_ioctl_set_scratch_backing_va_args, va_addr, 0);
THUNK_KFD_PIN(kfd_ioctl_set_scratch_backing_va_args, gpu_id, 8);

THUNK_KFD_SIZE(kfd_ioctl_get_process_apertures_new_args, 16);
THUNK_KFD_PIN(kfd_ioctl_get_process_apertures_new_args, kfd_process_device_apertures_ptr, 0);
THUNK_KFD_PIN(kfd_ioctl_get_process_apertures_new_args, num_of_nodes, 8);

THUNK_KFD_SIZE(kfd_process_device_apertures, 56);
THUNK_KFD_PIN(kfd_process_device_apertures, lds_base, 0);
THUNK_KFD_PIN(kfd_process_device_apertures, lds_limit, 8);
THUNK_KFD_PIN(kfd_process_device_apertures, scratch_base, 16);
THUNK_KFD_PIN(kfd_process_device_apertures, scratch_limit, 24);
THUNK_KFD_PIN(kfd_process_device_apertures, gpuvm_base, 32);
THUNK_KFD_PIN(kfd_process_device_apertures, gpuvm_limit, 40);
THUNK_KFD_PIN(kfd_process_device_apertures, gpu_id, 48);
THUNK_KFD_PIN(kfd_process_device_apertures, pad, 52);

THUNK_KFD_SIZE(kfd_ioctl_acquire_vm_args, 8);
THUNK_KFD_PIN(kfd_ioctl_acquire_vm_args, drm_fd, 0);
THUNK_KFD_PIN(kfd_ioctl_acquire_vm_args, gpu_id, 4);

THUNK_KFD_SIZE(kfd_ioctl_alloc_memory_of_gpu_args, 40);
THUNK_KFD_PIN(kfd_ioctl_alloc_memory_of_gpu_args, va_addr, 0);
THUNK_KFD_PIN(kfd_ioctl_alloc_memory_of_gpu_args, size, 8);
THUNK_KFD_PIN(kfd_ioctl_alloc_memory_of_gpu_args, handle, 16);
THUNK_KFD_PIN(kfd_ioctl_alloc_memory_of_gpu_args, mmap_offset, 24);
THUNK_KFD_PIN(kfd_ioctl_alloc_memory_of_gpu_args, gpu_id, 32);
THUNK_KFD_PIN(kfd_ioctl_alloc_memory_of_gpu_args, flags, 36);

THUNK_KFD_SIZE(kfd_ioctl_free_memory_of_gpu_args, 8);
THUNK_KFD_PIN(kfd_ioctl_free_memory_of_gpu_args, handle, 0);

THUNK_KFD_SIZE(kfd_ioctl_map_memory_to_gpu_args, 24);
THUNK_KFD_PIN(kfd_ioctl_map_memory_to_gpu_args, handle, 0);
THUNK_KFD_PIN(kfd_ioctl_map_memory_to_gpu_args, device_ids_array_ptr, 8);
THUNK_KFD_PIN(kfd_ioctl_map_memory_to_gpu_args, n_devices, 16);
THUNK_KFD_PIN(kfd_ioctl_map_memory_to_gpu_args, n_success, 20);

THUNK_KFD_SIZE(kfd_ioctl_unmap_memory_from_gpu_args, 24);
THUNK_KFD_PIN(kfd_ioctl_unmap_memory_from_gpu_args, handle, 0);
THUNK_KFD_PIN(kfd_ioctl_unmap_memory_from_gpu_args, device_ids_array_ptr, 8);
THUNK_KFD_PIN(kfd_ioctl_unmap_memory_from_gpu_args, n_devices, 16);
THUNK_KFD_PIN(kfd_ioctl_unmap_memory_from_gpu_args, n_success, 20);

THUNK_KFD_SIZE(kfd_ioctl_get_dmabuf_info_args, 32);
THUNK_KFD_PIN(kfd_ioctl_get_dmabuf_info_args, size, 0);
THUNK_KFD_PIN(kfd_ioctl_get_dmabuf_info_args, metadata_ptr, 8);
THUNK_KFD_PIN(kfd_ioctl_get_dmabuf_info_args, metadata_size, 16);
THUNK_KFD_PIN(kfd_ioctl_get_dmabuf_info_args, gpu_id, 20);
THUNK_KFD_PIN(kfd_ioctl_get_dmabuf_info_args, flags, 24);
THUNK_KFD_PIN(kfd_ioctl_get_dmabuf_info_args, dmabuf_fd, 28);

THUNK_KFD_SIZE(kfd_ioctl_import_dmabuf_args, 24);
THUNK_KFD_PIN(kfd_ioctl_import_dmabuf_args, va_addr, 0);
THUNK_KFD_PIN(kfd_ioctl_import_dmabuf_args, handle, 8);
THUNK_KFD_PIN(kfd_ioctl_import_dmabuf_args, gpu_id, 16);
THUNK_KFD_PIN(kfd_ioctl_import_dmabuf_args, dmabuf_fd, 20);

THUNK_KFD_SIZE(kfd_ioctl_export_dmabuf_args, 16);
THUNK_KFD_PIN(kfd_ioctl_export_dmabuf_args, handle, 0);
THUNK_KFD_PIN(kfd_ioctl_export_dmabuf_args, flags, 8);
THUNK_KFD_PIN(kfd_ioctl_export_dmabuf_args, dmabuf_fd, 12);

THUNK_KFD_SIZE(kfd_ioctl_svm_attribute, 8);
THUNK_KFD_PIN(kfd_ioctl_svm_attribute, type, 0);
THUNK_KFD_PIN(kfd_ioctl_svm_attribute, value, 4);
THUNK_KFD_SIZE(kfd_ioctl_svm_args, 24);
THUNK_KFD_PIN(kfd_ioctl_svm_args, start_addr, 0);
THUNK_KFD_PIN(kfd_ioctl_svm_args, size, 8);
THUNK_KFD_PIN(kfd_ioctl_svm_args, op, 16);
THUNK_KFD_PIN(kfd_ioctl_svm_args, nattr, 20);
THUNK_KFD_PIN(kfd_ioctl_svm_args, attrs, 24);

THUNK_KFD_SIZE(kfd_ioctl_set_xnack_mode_args, 4);
THUNK_KFD_PIN(kfd_ioctl_set_xnack_mode_args, xnack_enabled, 0);

THUNK_KFD_SIZE(kfd_ioctl_get_available_memory_args, 16);
THUNK_KFD_PIN(kfd_ioctl_get_available_memory_args, available, 0);
THUNK_KFD_PIN(kfd_ioctl_get_available_memory_args, gpu_id, 8);
THUNK_KFD_PIN(kfd_ioctl_get_available_memory_args, pad, 12);

THUNK_KFD_SIZE(kfd_ioctl_runtime_enable_args, 16);
THUNK_KFD_PIN(kfd_ioctl_runtime_enable_args, r_debug, 0);
THUNK_KFD_PIN(kfd_ioctl_runtime_enable_args, mode_mask, 8);
THUNK_KFD_PIN(kfd_ioctl_runtime_enable_args, capabilities_mask, 12);

THUNK_KFD_SIZE(kfd_ioctl_dbg_trap_args, 32);
THUNK_KFD_PIN(kfd_ioctl_dbg_trap_args, pid, 0);
THUNK_KFD_PIN(kfd_ioctl_dbg_trap_args, op, 4);

/* The request numbers are part of the ABI too. */
_Static_assert(AMDKFD_IOC_GET_VERSION == 0x80084B01u, "GET_VERSION");
_Static_assert(AMDKFD_IOC_SET_MEMORY_POLICY == 0x40204B04u, "SET_MEMORY_POLICY");
_Static_assert(AMDKFD_IOC_SET_SCRATCH_BACKING_VA == 0xC0104B11u, "SET_SCRATCH_BACKING_VA");
_Static_assert(AMDKFD_IOC_GET_PROCESS_APERTURES_NEW == 0xC0104B14u, "GET_PROCESS_APERTURES_NEW");
_Static_assert(AMDKFD_IOC_ACQUIRE_VM == 0x40084B15u, "ACQUIRE_VM");
_Static_assert(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU == 0xC0284B16u, "ALLOC_MEMORY_OF_GPU");
_Static_assert(AMDKFD_IOC_FREE_MEMORY_OF_GPU == 0x40084B17u, "FREE_MEMORY_OF_GPU");
_Static_assert(AMDKFD_IOC_MAP_MEMORY_TO_GPU == 0xC0184B18u, "MAP_MEMORY_TO_GPU");
_Static_assert(AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU == 0xC0184B19u, "UNMAP_MEMORY_FROM_GPU");
_Static_assert(AMDKFD_IOC_GET_DMABUF_INFO == 0xC0204B1Cu, "GET_DMABUF_INFO");
_Static_assert(AMDKFD_IOC_IMPORT_DMABUF == 0xC0184B1Du, "IMPORT_DMABUF");
_Static_assert(AMDKFD_IOC_SVM == 0xC0184B20u, "SVM");
_Static_assert(AMDKFD_IOC_SET_XNACK_MODE == 0xC0044B21u, "SET_XNACK_MODE");
_Static_assert(AMDKFD_IOC_AVAILABLE_MEMORY == 0xC0104B23u, "AVAILABLE_MEMORY");
_Static_assert(AMDKFD_IOC_EXPORT_DMABUF == 0xC0104B24u, "EXPORT_DMABUF");
_Static_assert(AMDKFD_IOC_RUNTIME_ENABLE == 0xC0104B25u, "RUNTIME_ENABLE");
_Static_assert(AMDKFD_IOC_DBG_TRAP == 0xC0204B26u, "DBG_TRAP");
_Static_assert(AMDKFD_IOC_CREATE_PROCESS == 0x00004B27u, "CREATE_PROCESS");

/* The SVM ioctl carries its attribute array in the size field. */
static inline unsigned long thunk_kfd_svm_request(uint32_t nattr)
{
        return AMDKFD_IOC_SVM +
               ((unsigned long)nattr * sizeof(struct kfd_ioctl_svm_attribute) << _IOC_SIZESHIFT);
}
