/* gpumemd's root: start-up order, signals, readiness, drain, reload and teardown. */
#pragma once

#include "server/core.h"

/* gpumemd's exit status when its backend finds no GPU (EX_UNAVAILABLE): the unit does not restart on it. */
#define GPUMEMD_EXIT_NO_DEVICE 69

/* Create the manager from parsed options: opens the backend and the listening socket. -ENODEV: the backend
 * found no device. */
int manager_new(Manager **ret, const Options *opts);
Manager *manager_free(Manager *m);
/* Run until SIGTERM/SIGINT; returns the exit code. Sends READY=1 once the loop runs. */
int manager_run(Manager *m);
/* Re-read the config file (SIGHUP): a bad file changes nothing. Under the lock. */
int manager_reload(Manager *m);

/* A connection of this daemon for the accepted socket @fd (conn_new with the daemon's ConnHost), and its
 * place in the daemon: its id, its shard, the connection list (listener.h's). Under the lock. */
int manager_conn_new(Manager *m, int fd, Conn **ret);
void manager_conn_place(Manager *m, Conn *c, Shard *sh);
/* main()'s argv, for a re-exec (borrowed: it lives as long as the process). */
void manager_set_argv(Manager *m, char **argv);
/* After manager_run(): how the stop hands the clients on (MANAGER_HANDOVER_*) and what to hand, moved
 * to @ret (empty for a plain stop). */
int manager_take_handover(Manager *m, struct HandoverFds *ret);
