/* Clients carried across a restart: their sockets and books out of a stopping daemon, into the next one. */
#pragma once

#include <stdbool.h>

#include "base/handover.h"

typedef struct Manager Manager;
typedef struct Conn Conn;
typedef struct Shard Shard;

/* What restoring clients asks of the daemon above it, which hands it these. */
typedef struct CarryHost {
        /* a connection for the socket @fd (taken), not placed yet */
        int (*conn_new)(Manager *m, int fd, Conn **ret);
        /* the shard a connection goes to, and its place there (under the lock) */
        Shard *(*pick_shard)(Manager *m);
        void (*place)(Manager *m, Conn *c, Shard *sh);
        /* a connection-level error frame (request id 0) on @fd, before it is closed */
        void (*refuse_send)(int fd, int code, const char *reason);
        /* the client's books in the broker, made as its first memory op makes them */
        int (*books)(Conn *c);
} CarryHost;

/*
 * Read the state among @fds (taken out of the set; NULL when there is none, or when it cannot be read: the
 * daemon then starts clean, and the log says why).
 */
Gpumemd__HandoverState *carry_read_state(HandoverFds *fds);
/*
 * Set up again, as they were, the clients of @st (may be NULL) whose sockets are among @fds: same id,
 * identity, class, window and protocol version, placed on the loops. What is left of @fds is closed (a
 * client not taken back sees its connection close). @st is freed. Before the loops start.
 */
void carry_restore(Manager *m, const CarryHost *host, Gpumemd__HandoverState *st, HandoverFds *fds);
/* Nothing of @c is in progress: no reply queued or being made (its reading is paused while stopping). */
bool carry_conn_settled(Conn *c);
/*
 * Once the loops stopped, under the lock: the fds to hand over (the listening socket, each carried client's
 * socket and pidfd, copies the caller owns) and the sealed state naming them, in @ret. A client that
 * cannot be carried is named in the log and told why (a connection-level error frame), and closes with the
 * daemon.
 */
int carry_collect(Manager *m, const CarryHost *host, HandoverFds *ret);
