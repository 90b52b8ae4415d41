/* A shard of the daemon: one event loop and what it keeps for the connections placed on it. */
#pragma once

#include <stdint.h>

#include "arena.h"
#include "base/loop.h"

typedef struct Manager Manager;
typedef struct Conn Conn;

/* Counters of one shard: written by its loop's thread only (COUNTER_ADD), summed by manager_stats(). */
typedef struct ManagerStats {
        uint64_t requests;
        uint64_t protocol_errors;
        uint64_t denials;
        uint64_t connections_total;
        uint64_t connections_refused;
        uint64_t stalled_drops; /* clients dropped for not reading their replies (send-timeout) */
} ManagerStats;

/*
 * A shard of the daemon: one event loop and what it keeps for the connections placed on it. Shard 0's loop
 * is the main thread's (listener, signals, timers of the whole daemon), which the daemon places no client
 * on; the others serve the clients, each on a thread of its own. A connection lives on one shard from
 * accept to free: its socket, its timers and its requests are handled only there.
 */
typedef struct Shard {
        Manager *m;
        unsigned index;
        Loop *loop;
        uint8_t *rx_buf, *tx_buf; /* one frame at a time is handled per loop */
        Arena req_arena;          /* a request's decoded messages, reset after each one */
        struct Metrics *metrics;  /* this loop's, summed when rendered */
        ManagerStats stats;       /* this loop's */
        struct WorkerHome *home;  /* where worker jobs submitted here finish; NULL without workers */
        Conn *dying;              /* killed, waiting for their deferred free (freed by manager_free if the
                                     loop ends first) */
        unsigned n_conns;         /* connections placed on it (under the manager's lock) */
        LoopTimer drain_timer;    /* closes its connections whose replies are out, while stopping */
        unsigned unsettled;       /* at a hand-over: its connections with replies still to go (under the
                                     manager's lock) */
        LoopWork drain_work;
} Shard;
