/* The fds of /dev/kfd and the render nodes that the gpumemd backend handed out, and which a child inherited.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { FD_KFD = 1, FD_RENDER = 2 } FdKind;

/* A new memfd standing for the device file (close-on-exec), listed: 0 and *@ret_fd, or a negative errno. */
int fd_table_open(FdKind kind, uint32_t minor, int *ret_fd);

/* 0 for an fd of this process's KFD, with its kind and minor (either pointer may be NULL); -EBADF for one not
 * listed or inherited from a parent. */
int fd_table_find(int fd, FdKind *ret_kind, uint32_t *ret_minor);

/* Forget @fd (the caller closes it): whether it was listed, inherited or not. */
bool fd_table_forget(int fd);

size_t fd_table_count(void);

/* In a child after fork() (its only thread): every fd listed is its parent's KFD, not the child's. */
void fd_table_after_fork_in_child(void);
