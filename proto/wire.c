/* gpumemd wire I/O: recvmsg/sendmsg of one frame packet with SCM_RIGHTS, defensively. */
#include "wire.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/*
 * A call that must not wait (MSG_DONTWAIT, as every call of the daemon's) goes to the system call itself:
 * libc's wrappers make each a cancellation point, which costs two more calls around every one in a process
 * with threads. A call that may block keeps libc's, so that a thread blocked in it can still be cancelled.
 */
static inline ssize_t sys_recvmsg(int sock, struct msghdr *msg, int flags)
{
        return flags & MSG_DONTWAIT ? syscall(SYS_recvmsg, sock, msg, flags) : recvmsg(sock, msg, flags);
}

static inline ssize_t sys_sendmsg(int sock, const struct msghdr *msg, int flags)
{
        return flags & MSG_DONTWAIT ? syscall(SYS_sendmsg, sock, msg, flags) : sendmsg(sock, msg, flags);
}

void gm_wire_close_fds(int *fds, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                if (fds[i] >= 0)
                        close(fds[i]);
                fds[i] = -1;
        }
}

ssize_t gm_wire_recv(int sock, void *buf, size_t cap, int *fds, size_t *ret_n_fds, int flags)
{
        /* Exactly room for GM_FRAME_MAX_FDS: one more and the kernel reports MSG_CTRUNC. */
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * GM_FRAME_MAX_FDS)];
        } control;
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof(control.buf),
        };
        size_t n = 0;
        bool bad_cmsg = false;
        ssize_t len;

        *ret_n_fds = 0;
        do
                len = sys_recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
        while (len < 0 && errno == EINTR);
        if (len < 0)
                return -errno;

        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        const unsigned char *data = CMSG_DATA(c);
                        for (size_t i = 0; i < k; i++) {
                                int fd;
                                memcpy(&fd, data + i * sizeof(int), sizeof(int));
                                if (n < GM_FRAME_MAX_FDS)
                                        fds[n++] = fd;
                                else
                                        close(fd);
                        }
                } else {
                        bad_cmsg = true;
                }
        }

        if (msg.msg_flags & MSG_CTRUNC || bad_cmsg) {
                gm_wire_close_fds(fds, n);
                return -EPROTO;
        }
        if (msg.msg_flags & MSG_TRUNC) {
                gm_wire_close_fds(fds, n);
                return -EMSGSIZE;
        }
        *ret_n_fds = n;
        return len;
}

int gm_wire_send(int sock, const void *hdr, size_t hdr_len, const void *body, size_t body_len, const int *fds,
                 size_t n_fds, int flags)
{
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * GM_FRAME_MAX_FDS)];
        } control;
        struct iovec iov[2] = {
                {.iov_base = (void *)hdr, .iov_len = hdr_len},
                {.iov_base = (void *)body, .iov_len = body_len},
        };
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = body_len ? 2 : 1};
        ssize_t r;

        if (n_fds > GM_FRAME_MAX_FDS)
                return -E2BIG;
        if (n_fds > 0) {
                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        do
                r = sys_sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
        while (r < 0 && errno == EINTR);
        if (r < 0)
                return -errno;
        if ((size_t)r != hdr_len + body_len)
                return -EIO; /* SEQPACKET sends whole records or nothing; anything else is a kernel surprise
                              */
        return 0;
}
