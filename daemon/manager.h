/* gpumemd's root object: event loop, listener, signals, readiness, the thunk device and all connections. */
#pragma once

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "log.h"
#include "options.h"
#include "arena.h"
#include "driver.h"
#include "vaman.h"

typedef struct Conn Conn;
typedef struct BrokerClient BrokerClient;

typedef struct ManagerStats {
        uint64_t requests;
        uint64_t protocol_errors;
        uint64_t denials;
        uint64_t connections_total;
        uint64_t connections_refused;
        uint64_t stalled_drops; /* clients dropped for not reading their replies (send-timeout) */
} ManagerStats;

typedef struct Manager {
        struct event_base *base;
        Options opts;
        Driver *drv; /* the device backend (driver-kfd.c) */
        struct Broker *broker;
        struct WorkerPool *workers; /* slow work off the loop; NULL with worker-threads = 0 */
        struct Policy *policy;      /* the running policy (classes) */
        struct ClassState *classes; /* per-class state, by name */
        struct Metrics *metrics;
        struct evhttp *http; /* optional metrics listener */
        char preset_name[64];

        int listen_fd;
        bool listen_bound; /* we bound it ourselves (not socket-activated): unlink on exit */
        struct event *listen_ev;
        struct event *accept_retry_ev;
        struct event *sigterm_ev, *sigint_ev, *sighup_ev;
        struct event *sigusr2_ev; /* model fault injection for tests ($GPUMEMD_MODEL_FAULTS_FILE) */
        struct event *watchdog_ev;
        struct event *drain_ev;
        struct event *broker_ev; /* the broker's notice that memory which outlived its handle is gone */
        struct Reaper *reapers;  /* teardowns of departed clients, going on in slices */
        struct event *reap_ev;
        bool freeing;
        struct event *status_ev;
        bool status_pending;

        /* Client VA windows are carved from this space (the SVM aperture above the low reserved range). */
        ThunkVaSpace *va;
        size_t va_blocked; /* ranges of the space the daemon itself maps (never windows) */

        Conn *conns; /* doubly linked, newest first */
        Conn *dying; /* killed, waiting for their deferred free (freed by manager_free if the loop ends first)
                      */
        unsigned n_conns;
        uint64_t next_client_id;

        uint8_t *rx_buf; /* one frame at a time is handled, so one receive and one send buffer serve all */
        uint8_t *tx_buf;
        Arena req_arena; /* a request's decoded messages, reset after each one */
        /* the topology reply, packed once ([1]: with every property): the topology never changes */
        uint8_t *topology_reply[2];
        size_t topology_reply_len[2];

        uint64_t started_mono_usec;
        uint64_t started_real_usec;
        ManagerStats stats;
        LogRatelimit conn_log_rl; /* connect/disconnect lines, which any client can cause */
        bool stopping;
        uint64_t drain_deadline_usec;
        int exit_code;
} Manager;

/* Create the manager from parsed options: opens the backend and the listening socket. */
int manager_new(Manager **ret, const Options *opts);
Manager *manager_free(Manager *m);
/* Run until SIGTERM/SIGINT; returns the exit code. Sends READY=1 once the loop runs. */
int manager_run(Manager *m);
/* Re-read the config file (SIGHUP): a bad file changes nothing. */
int manager_reload(Manager *m);

/* Objects a departed client's teardown frees per loop round, other clients' requests in between. */
#define MANAGER_TEARDOWN_SLICE 4096

/*
 * Take over the teardown of @bc and the windows of @c (moved out of it) and finish it in slices from the
 * loop. -ENOMEM or -ESHUTDOWN (the manager is being freed): the caller tears down at once.
 */
int manager_reap(Manager *m, BrokerClient *bc, Conn *c);

/* Tell systemd how many clients are served (STATUS=). */
void manager_notify_status(Manager *m);
unsigned manager_conns_of_uid(const Manager *m, uid_t uid);
Conn *manager_find_conn(Manager *m, uint64_t client_id);
