/* The hand-over between a gpumemd that stops and the next: named fds (systemd's fd store, or an exec) and a
 * sealed, versioned state. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "handover.pb-c.h"

/*
 * The state's format (its major version) and revision. A reader takes any revision of its own format or an
 * older one, and refuses a newer format (it starts clean then, and says why).
 */
#define HANDOVER_FORMAT 1u
/* 2: clients' memory objects; 3: VMM handles, reservations, mappings; 4: imports; 5: named shares */
#define HANDOVER_REVISION 5u
/* A state larger than this is not read (a broken or hostile writer). */
#define HANDOVER_STATE_MAX (256u << 20)

/* The names the daemon gives its fds; any other name is a socket of socket activation. */
#define HANDOVER_NAME_PREFIX "gm-"
#define HANDOVER_NAME_STATE  "gm-state"
#define HANDOVER_NAME_LISTEN "gm-listen"
#define HANDOVER_NAME_FDS    "gm-fds"
/* fd names are at most this long (systemd's limit is 255) */
#define HANDOVER_NAME_MAX 64

typedef struct HandoverFd {
        char name[HANDOVER_NAME_MAX];
        int fd;
        /* the fd reports a hang-up while stored (a socket whose other end is closed): systemd must not poll
         * it, or it drops it from the store (FDPOLL=0) */
        bool no_poll;
} HandoverFd;

/* Named fds; each is owned by the set until taken. */
typedef struct HandoverFds {
        HandoverFd *v;
        size_t n, cap;
} HandoverFds;

/* Add @fd (taken, also on failure) under @name: -ENOMEM, -EINVAL (a name systemd would refuse). */
int handover_fds_add(HandoverFds *s, const char *name, int fd);
/* The same for an fd that hangs up while stored: systemd keeps it only if told not to poll it. */
int handover_fds_add_no_poll(HandoverFds *s, const char *name, int fd);
/* Take the fd named @name out of the set: the fd, or -ENOENT. */
int handover_fds_take(HandoverFds *s, const char *name);
/* Close what is left and free the set. */
void handover_fds_done(HandoverFds *s);

/*
 * The fds passed by socket activation or a hand-over (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES), taken into
 * @ret with close-on-exec set; the variables are unset. An fd without a name is named "unknown", as systemd
 * does. 0 (none passed is not an error), or a negative errno.
 */
int handover_fds_from_env(HandoverFds *ret);

/*
 * The state packed into a memfd sealed against every change (write, grow, shrink, seal): its reader knows
 * nobody altered it since. The fd is the caller's.
 */
int handover_state_seal(const Gpumemd__HandoverState *st, int *ret_fd);
/*
 * Read a state from @fd: the seals, the frame (magic, length, checksum) and the format are checked. On error
 * @why says what was wrong: -EPERM (not sealed), -EBADMSG (not a state, or damaged), -EPROTONOSUPPORT (a
 * newer format), -EFBIG. Free with gpumemd__handover_state__free_unpacked(st, NULL).
 */
int handover_state_open(int fd, Gpumemd__HandoverState **ret, char *why, size_t len);
/* The same on bytes in memory (for tests and fuzzing): no seals to check. */
int handover_state_parse(const uint8_t *buf, size_t len, Gpumemd__HandoverState **ret, char *why,
                         size_t why_len);
/* The framed bytes of @st (magic, length, checksum, body) in a buffer the caller frees. */
int handover_state_pack(const Gpumemd__HandoverState *st, uint8_t **ret, size_t *ret_len);

/*
 * Many fds as one: fds queued in order in a socket whose receiving end goes to the next daemon. The kernel
 * keeps fds in flight alive as long as that socket lives, in systemd's store or across an exec. They go in
 * messages of at most HANDOVER_CHANNEL_BATCH, each saying how many it holds, so that a reader whose fd table
 * is full loses only the fds that did not fit (they read as -1) and not their order.
 */
#define HANDOVER_CHANNEL_BATCH 250
typedef struct HandoverChannel {
        int send_fd, recv_fd;
        size_t n; /* fds queued */
} HandoverChannel;

/* An empty channel (two fds): 0 or a negative errno. */
int handover_channel_open(HandoverChannel *ch);
/* Queue @n (at most HANDOVER_CHANNEL_BATCH) borrowed fds as one message: -ENOBUFS when the socket's buffer
 * is full. */
int handover_channel_send(HandoverChannel *ch, const int *fds, size_t n);
/* The sending end closed (the reader sees the end after the last message); the receiving end is the
 * caller's. */
int handover_channel_finish(HandoverChannel *ch);
/* Both ends closed, whatever was queued dropped. */
void handover_channel_abort(HandoverChannel *ch);
/* @fds (borrowed) queued in order in a new channel whose receiving end comes back in *@ret_fd. */
int handover_channel_pack(const int *fds, size_t n, int *ret_fd);
/*
 * All the fds queued in @fd, in order (*@ret_fds is the caller's, each fd too). An fd the kernel could not
 * install (this process's fd table full) is -1 in its place, and *@ret_lost counts them; -EPROTO: cut short
 * where the messages do not say how many they held (a writer before counted messages).
 */
int handover_channel_unpack(int fd, int **ret_fds, size_t *ret_n, size_t *ret_lost);
/*
 * Grow this process's fd table at once to room for @n more fds (as far as RLIMIT_NOFILE allows), before
 * that many arrive: the kernel grows it by doublings, and in a process with several threads each doubling
 * waits for an RCU grace period, which thousands of fds arriving one doubling after another pay about ten
 * times. Nothing is done for fewer than 256, nor when it cannot be done.
 */
void handover_fd_room(size_t n);

/*
 * systemd's fd store (the service's FileDescriptorStoreMax=): each fd sent under its name with FDSTORE=1, and
 * FDPOLL=0 for those that hang up while stored (systemd polls the others and drops one on EPOLLHUP or
 * EPOLLERR; the next daemon takes the unpolled ones out by name, FDSTOREREMOVE=1, once it read them).
 * -ENOTCONN outside systemd (no NOTIFY_SOCKET). The fds stay the caller's.
 */
int handover_store(const HandoverFds *s);
/* Take @name out of systemd's store (FDSTOREREMOVE=1): a no-op outside systemd. */
int handover_store_remove(const char *name);

/*
 * Replace this process by @path with @argv, the fds of @s at 3, 4, ... and LISTEN_PID, LISTEN_FDS and
 * LISTEN_FDNAMES naming them (none of the three when @s is empty: LISTEN_FDS=0 is invalid). Returns only on
 * failure (a negative errno). The fds then sit at 3, 4, ..., where they may have replaced other fds of the
 * process (a library's cached socket): the caller only reports on stderr and exits.
 */
int handover_exec(const char *path, char *const argv[], HandoverFds *s);
