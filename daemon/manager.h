/* gpumemd's root object: event loop, listener, signals, readiness, the thunk device and all connections. */
#pragma once

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "log.h"
#include "options.h"
#include "arena.h"
#include "driver.h"
#include "loop.h"
#include "vaman.h"

typedef struct Conn Conn;
typedef struct BrokerClient BrokerClient;

/* Counters of one shard: written by its loop's thread only (COUNTER_ADD), summed by manager_stats(). */
typedef struct ManagerStats {
        uint64_t requests;
        uint64_t protocol_errors;
        uint64_t denials;
        uint64_t connections_total;
        uint64_t connections_refused;
        uint64_t stalled_drops; /* clients dropped for not reading their replies (send-timeout) */
} ManagerStats;

typedef struct Manager Manager;

/*
 * A shard of the daemon: one event loop and what it keeps for the connections placed on it. Shard 0's loop
 * is the main thread's (listener, signals, timers of the whole daemon, and clients too); the others run on
 * threads of their own. A connection lives on one shard from accept to free: its socket, its timers and
 * its requests are handled only there.
 */
typedef struct Shard {
        Manager *m;
        unsigned index;
        Loop *loop;
        struct event_base *base;
        uint8_t *rx_buf, *tx_buf; /* one frame at a time is handled per loop */
        Arena req_arena;          /* a request's decoded messages, reset after each one */
        struct Metrics *metrics;  /* this loop's, summed when rendered */
        ManagerStats stats;       /* this loop's */
        struct WorkerHome *home;  /* where worker jobs submitted here finish; NULL without workers */
        Conn *dying;              /* killed, waiting for their deferred free (freed by manager_free if the
                                     loop ends first) */
        unsigned n_conns;         /* connections placed on it (under the manager's lock) */
        struct event *drain_ev;   /* closes its connections whose replies are out, while stopping */
        LoopWork drain_work;
} Shard;

#define MANAGER_MAX_LOOPS 64

struct Manager {
        struct event_base *base; /* the main loop's (shard 0) */
        Options opts;
        Driver *drv; /* the device backend (driver-kfd.c) */
        struct Broker *broker;
        struct WorkerPool *workers; /* slow work off the loops; NULL with worker-threads = 0 */
        struct Policy *policy;      /* the running policy (classes) */
        struct ClassState *classes; /* per-class state, by name */
        struct evhttp *http;        /* optional metrics listener */
        char preset_name[64];

        /*
         * The books' lock: the broker and its accounts, the classes, the VA windows, the driver and the
         * connection list are touched only under it. The loops take it around a request's handler, a
         * connection's setup and teardown and a worker job's end; a ping and the topology never take it,
         * nor does a connection's socket I/O. It is recursive: a transport reports a peer gone from
         * inside a send, made with or without it.
         */
        pthread_mutex_t lock;
        Shard *shards;
        unsigned n_shards;
        unsigned next_shard;

        int listen_fd;
        bool listen_bound; /* we bound it ourselves (not socket-activated): unlink on exit */
        struct event *listen_ev;
        struct event *accept_retry_ev;
        struct event *sigterm_ev, *sigint_ev, *sighup_ev;
        struct event *sigusr2_ev; /* model fault injection for tests ($GPUMEMD_MODEL_FAULTS_FILE) */
        struct event *watchdog_ev;
        struct event *broker_ev; /* the broker's notice that memory which outlived its handle is gone */
        struct Reaper *reapers;  /* teardowns of departed clients, going on in slices */
        struct event *reap_ev;
        bool reap_posted; /* the main loop was told to run reap_ev (under the lock) */
        LoopWork reap_work;
        bool freeing;
        struct event *status_ev;
        bool status_pending; /* a STATUS= update is due (under the lock) */
        LoopWork status_work;

        /* Client VA windows are carved from this space (the SVM aperture above the low reserved range). */
        ThunkVaSpace *va;
        size_t va_blocked; /* ranges of the space the daemon itself maps (never windows) */

        Conn *conns; /* doubly linked, newest first */
        unsigned n_conns;
        uint64_t next_client_id;

        /* the topology reply, packed at start ([1]: with every property): the topology never changes */
        uint8_t *topology_reply[2];
        size_t topology_reply_len[2];

        uint64_t started_mono_usec;
        uint64_t started_real_usec;
        LogRatelimit conn_log_rl; /* connect/disconnect lines, which any client can cause (under the lock) */
        bool stopping;
        uint64_t drain_deadline_usec;
        int exit_code;
};

/* Create the manager from parsed options: opens the backend and the listening socket. */
int manager_new(Manager **ret, const Options *opts);
Manager *manager_free(Manager *m);
/* Run until SIGTERM/SIGINT; returns the exit code. Sends READY=1 once the loop runs. */
int manager_run(Manager *m);
/* Re-read the config file (SIGHUP): a bad file changes nothing. Under the lock. */
int manager_reload(Manager *m);

/* Objects a departed client's teardown frees per loop round, other clients' requests in between. */
#define MANAGER_TEARDOWN_SLICE 4096

/*
 * Take over the teardown of @bc and the windows of @c (moved out of it) and finish it in slices from the
 * loop. -ENOMEM or -ESHUTDOWN (the manager is being freed): the caller tears down at once.
 */
int manager_reap(Manager *m, BrokerClient *bc, Conn *c);

/* Tell systemd how many clients are served (STATUS=). Under the lock. */
void manager_notify_status(Manager *m);
/* The books' lock (Manager.lock). */
void manager_lock(Manager *m);
void manager_unlock(Manager *m);
/* Every shard's counters added up. */
void manager_stats(const Manager *m, ManagerStats *ret);
/* The shard whose loop runs on the calling thread (NULL on any other thread). */
Shard *manager_current_shard(Manager *m);
unsigned manager_conns_of_uid(const Manager *m, uid_t uid);
Conn *manager_find_conn(Manager *m, uint64_t client_id);
