/* The fds of /dev/kfd and the render nodes that the gpumemd backend handed out, and which a child inherited.
 */
#include "fd-table.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_FDS 256

/* the process's device fds, as the kernel's file table is the process's (the layer's one backend) */
static struct {
        pthread_mutex_t lock;
        struct {
                int fd; /* 0: a free slot (fd + 1 is kept, so that the table needs no setup) */
                FdKind kind;
                uint32_t minor;
                bool inherited; /* opened by the parent before fork(): not this process's KFD */
        } fds[MAX_FDS];
} ft = {.lock = PTHREAD_MUTEX_INITIALIZER};

int fd_table_open(FdKind kind, uint32_t minor, int *ret_fd)
{
        char name[32];
        int fd;

        snprintf(name, sizeof(name), kind == FD_KFD ? "gpumem-kfd" : "gpumem-renderD%u", minor);
        fd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC);
        if (fd < 0)
                return -errno;
        pthread_mutex_lock(&ft.lock);
        for (size_t i = 0; i < MAX_FDS; i++)
                if (!ft.fds[i].fd) {
                        ft.fds[i].fd = fd + 1;
                        ft.fds[i].kind = kind;
                        ft.fds[i].minor = minor;
                        ft.fds[i].inherited = false;
                        pthread_mutex_unlock(&ft.lock);
                        *ret_fd = fd;
                        return 0;
                }
        pthread_mutex_unlock(&ft.lock);
        (void)syscall(SYS_close, fd);
        return -EMFILE;
}

int fd_table_find(int fd, FdKind *ret_kind, uint32_t *ret_minor)
{
        int r = -EBADF;

        pthread_mutex_lock(&ft.lock);
        for (size_t i = 0; i < MAX_FDS; i++)
                if (ft.fds[i].fd == fd + 1 && !ft.fds[i].inherited) {
                        if (ret_kind)
                                *ret_kind = ft.fds[i].kind;
                        if (ret_minor)
                                *ret_minor = ft.fds[i].minor;
                        r = 0;
                }
        pthread_mutex_unlock(&ft.lock);
        return r;
}

bool fd_table_forget(int fd)
{
        bool found = false;

        pthread_mutex_lock(&ft.lock);
        for (size_t i = 0; i < MAX_FDS; i++)
                if (ft.fds[i].fd == fd + 1) {
                        ft.fds[i].fd = 0;
                        found = true;
                }
        pthread_mutex_unlock(&ft.lock);
        return found;
}

size_t fd_table_count(void)
{
        size_t n = 0;

        pthread_mutex_lock(&ft.lock);
        for (size_t i = 0; i < MAX_FDS; i++)
                n += ft.fds[i].fd != 0;
        pthread_mutex_unlock(&ft.lock);
        return n;
}

void fd_table_after_fork_in_child(void)
{
        /* made anew: a thread of the parent's may have held it */
        pthread_mutex_init(&ft.lock, NULL);
        for (size_t i = 0; i < MAX_FDS; i++)
                if (ft.fds[i].fd)
                        ft.fds[i].inherited = true;
}
