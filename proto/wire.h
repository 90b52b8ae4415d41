/* gpumemd wire I/O: send and receive one frame packet with its fds over a SOCK_SEQPACKET socket. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#include "frame.h"

/*
 * Receive one packet into @buf (capacity @cap) and its fds into @fds (room for GM_FRAME_MAX_FDS).
 * Fds are received with MSG_CMSG_CLOEXEC. Returns the packet length (0 means the peer closed) or:
 *   -EAGAIN     nothing to read (non-blocking socket, or @flags has MSG_DONTWAIT)
 *   -EMSGSIZE   the packet was longer than @cap (it is consumed; any fds are closed)
 *   -EPROTO     control data was truncated (MSG_CTRUNC: more fds than allowed, or an LSM refused one), or
 *               ancillary data other than SCM_RIGHTS arrived; any fds are closed
 *   other       recvmsg's errno
 * On success *ret_n_fds says how many fds the caller now owns.
 */
ssize_t gm_wire_recv(int sock, void *buf, size_t cap, int *fds, size_t *ret_n_fds, int flags);

/*
 * Send header and body as one packet with @n_fds fds (borrowed: the caller still owns and closes them).
 * Uses MSG_NOSIGNAL, so a dead peer yields -EPIPE instead of SIGPIPE. Returns 0 or a negative errno
 * (-EAGAIN when the socket buffer is full and the socket is non-blocking).
 */
int gm_wire_send(int sock, const void *hdr, size_t hdr_len, const void *body, size_t body_len, const int *fds,
                 size_t n_fds, int flags);

/* Close @n fds in @fds (those >= 0) and set them to -1. */
void gm_wire_close_fds(int *fds, size_t n);
