/* The kernel's device seam: /dev/kfd and DRM render nodes reached through plain syscalls. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "seam.h"

#define KFD_DEVICE_PATH "/dev/kfd"

static int kernel_open_path(const char *path, int *ret_fd)
{
        int fd;

        do {
                fd = open(path, O_RDWR | O_CLOEXEC);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return -errno;
        *ret_fd = fd;
        return 0;
}

static int kernel_open_kfd(void *impl, int *ret_fd)
{
        return kernel_open_path(KFD_DEVICE_PATH, ret_fd);
}

static int kernel_open_render(void *impl, uint32_t minor, int *ret_fd)
{
        char path[64];

        snprintf(path, sizeof(path), "/dev/dri/renderD%u", minor);
        return kernel_open_path(path, ret_fd);
}

/*
 * Only EINTR is retried: the KFD ioctls that can be interrupted (MAP/UNMAP waiting for page-table updates)
 * carry their progress in the argument struct, so re-issuing the same struct resumes them. EAGAIN is the
 * caller's to judge (a KFD locked for reset should not be spun on).
 */
static int kernel_ioctl(void *impl, int fd, unsigned long request, void *arg)
{
        int r;

        do {
                r = ioctl(fd, request, arg);
        } while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int kernel_mmap(void *impl, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                       void **ret)
{
        void *p;

        p = mmap(addr, len, prot, flags, fd, (off_t)offset);
        if (p == MAP_FAILED)
                return -errno;
        *ret = p;
        return 0;
}

static int kernel_close(void *impl, int fd)
{
        /* Linux releases the fd even when close() reports EINTR, so it must not be retried. */
        if (close(fd) < 0 && errno != EINTR)
                return -errno;
        return 0;
}

static int kernel_munmap(void *impl, void *addr, size_t len)
{
        return munmap(addr, len) < 0 ? -errno : 0;
}

const ThunkSeamOps thunk_seam_kernel_ops = {
        .name = "kfd",
        .open_kfd = kernel_open_kfd,
        .open_render = kernel_open_render,
        .ioctl = kernel_ioctl,
        .mmap = kernel_mmap,
        .close = kernel_close,
        .munmap = kernel_munmap,
};
