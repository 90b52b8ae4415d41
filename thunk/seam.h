/* The device seam: the one interface through which the thunk reaches a KFD, the kernel's or the model's. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * Every interaction with the driver goes through these ops: opening /dev/kfd and a render node, an ioctl
 * on one of those fds, an mmap of a device offset, and close. The kernel implementation (seam-kernel.c)
 * calls the real syscalls; the model (model*.c) serves the same requests on the kernel's own structs
 * (<linux/kfd_ioctl.h>, kfd-compat.h, <drm/amdgpu_drm.h>), with the kernel's errno rules.
 *
 * All ops return 0 or a negative errno. Fds handed out are real file descriptors with O_CLOEXEC set,
 * owned by the caller until passed to close(). No op keeps global state: the seam's @impl is the
 * whole context, so several seams (and several models) can live in one process.
 */
typedef struct ThunkSeamOps {
        const char *name; /* "kfd" or "model" */
        /* Open the KFD device. Each call returns a new fd; whether a second fd of one process is a new
         * KFD context (CREATE_PROCESS, ABI 1.19) is decided by ioctls, as in the kernel. */
        int (*open_kfd)(void *impl, int *ret_fd);
        /* Open /dev/dri/renderD<minor>. */
        int (*open_render)(void *impl, uint32_t minor, int *ret_fd);
        /* An ioctl on a KFD or render fd; @arg is the request's struct, sized as _IOC_SIZE(request). */
        int (*ioctl)(void *impl, int fd, unsigned long request, void *arg);
        /* mmap(addr, len, prot, flags, fd, offset); on success *ret is the mapping. */
        int (*mmap)(void *impl, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                    void **ret);
        int (*close)(void *impl, int fd);
        /* munmap(addr, len). The kernel learns of an unmap from its MMU notifiers, which drop the pages
         * from the process's SVM ranges; the model, which has none, learns of it here. */
        int (*munmap)(void *impl, void *addr, size_t len);
} ThunkSeamOps;

typedef struct ThunkSeam {
        const ThunkSeamOps *ops;
        void *impl;
} ThunkSeam;

/* The kernel's seam: plain syscalls, retried on EINTR only. */
extern const ThunkSeamOps thunk_seam_kernel_ops;
