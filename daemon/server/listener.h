/* gpumemd's listener: the listening socket, accept and its hygiene, and a connection's place on a loop. */
#pragma once

#include <stdbool.h>

#include "base/handover.h"
#include "conn.h"
#include "core.h"

/*
 * The listening socket, where socket activation passed none: the one the daemon before this one handed over
 * (@handed, its fds in @passed), or one bound here on the socket path. Non-blocking, closed on exec.
 */
int listener_open(Manager *m, const Gpumemd__HandoverState *handed, HandoverFds *passed);
/* Accept on the main loop from now on: each connection is made with m->conn_host, admitted to a class and
 * placed on a loop. */
int listener_start(Manager *m);
/* Accept no more (the daemon stops). */
void listener_pause(Manager *m);
/* The listener's events and socket; the socket file goes where this daemon bound it and hands nothing on. */
void listener_close(Manager *m);
/* A listening AF_UNIX SOCK_SEQPACKET socket, as socket activation must pass. */
bool listener_fd_usable(int fd);

/* A connection for the accepted socket @fd, made with m->conn_host; not placed yet. Under the lock. */
int listener_conn_new(Manager *m, int fd, Conn **ret);
/* The client loop (shards 1 to n) with the fewest connections, in turn among equals. Under the lock. */
Shard *listener_pick_shard(Manager *m);
/* @c's place in the daemon: its id, its shard, the connection list. Under the lock. */
void listener_place(Manager *m, Conn *c, Shard *sh);
/* A connection-level error frame (request id 0) on @fd, before it is closed. */
void listener_refuse_send(int fd, int code, const char *reason);
