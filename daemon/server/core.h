/* gpumemd's shared state (the Manager) and what the layers above the connection use of it: the manager's
 * lock, the connection list, the shards' counters, status updates. manager.c creates, runs and frees it. */
#pragma once

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "arena.h"
#include "drivers/driver.h"
#include "base/log.h"
#include "base/loop.h"
#include "config/options.h"
#include "shard.h"
#include "base/vaman.h"

typedef struct Conn Conn;
typedef struct BrokerClient BrokerClient;

#define MANAGER_MAX_LOOPS 64

/* what collecting the hand-over opens at once: the channel's two ends, the state, the listening socket's
 * copy, and spares for a copy being queued and for each move of an exec */
#define MANAGER_FD_RESERVE 8

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
         * The manager's lock: the connection list, the classes, the VA windows and the daemon's settings
         * are touched only under it, and so is any client's books from a thread other than its loop's
         * (with the client's lock inside it). The loops take it around a connection's setup and teardown,
         * hello, administration, a worker job's end and a violation. A request on the client's own memory
         * takes only the client's lock (the broker locks what clients share, each account its usage);
         * a ping and the topology take neither, nor does socket I/O. Locks are taken in this order:
         * manager, client, broker, account, then the driver's own. It is recursive: a connection that
         * ends inside a callback made under it takes it again.
         */
        pthread_mutex_t lock;
        Shard *shards;
        unsigned n_shards;
        unsigned next_shard;

        const struct ConnHost *conn_host; /* what a connection asks of the daemon (manager.c's) */
        int listen_fd;
        bool listen_bound; /* we bound it ourselves (not socket-activated): unlink on exit */
        struct event *listen_ev;
        struct event *accept_retry_ev;
        struct event *sigterm_ev, *sigint_ev, *sighup_ev;
        struct event *sigusr1_ev; /* re-execute, the clients carried over */
        struct event *sigusr2_ev; /* model fault injection for tests ($GPUMEMD_MODEL_FAULTS_FILE) */
        struct event *watchdog_ev;
        struct event *broker_ev; /* the broker's notice that memory which outlived its handle is gone */
        struct Reaper *reapers;  /* teardowns of departed clients, going on in slices */
        struct event *reap_ev;
        bool reap_posted;      /* the main loop was told to run reap_ev (under the lock) */
        bool reap_parked;      /* the next slice waits for the threads that wanted the lock (under it) */
        unsigned lock_waiters; /* threads blocked in manager_lock() (atomic) */
        LoopWork reap_work;
        bool freeing;
        struct event *status_ev;
        bool status_pending; /* a STATUS= update is due (under the lock) */
        LoopWork status_work;

        /* Client VA windows are carved from this space (the SVM aperture above the low reserved range). */
        ThunkVaSpace *va;
        size_t va_blocked; /* ranges of the space the daemon itself maps (never windows) */
        /* Windows below 1 TiB for clients that ask (Hello's GM_HELLO_LOW_WINDOW); NULL when the aperture or
         * the daemon's own mappings leave no room there. */
        ThunkVaSpace *va_low;
        size_t va_low_blocked;
        uint64_t shared_base, shared_size; /* the named shares' region (0: none), reserved in the daemon */

        Conn *conns; /* doubly linked, newest first */
        unsigned n_conns;
        uint64_t next_client_id;

        /* the topology reply, packed at start ([1]: with every property): the topology never changes */
        uint8_t *topology_reply[2];
        size_t topology_reply_len[2];
        /* the same topology as its sysfs files (TOPOLOGY_FILES), made at start */
        struct TopologyFile {
                char *path;
                char *content;
                size_t len;
                /* nodes/NODE/properties (bank -1) or nodes/NODE/mem_banks/BANK/properties: the files that
                 * hold a GPU's VRAM size, which each client is served as its class allows; else node -1 */
                int node, bank;
        } * topology_files;
        size_t n_topology_files;

        uint64_t started_mono_usec;
        uint64_t started_real_usec;
        LogRatelimit conn_log_rl; /* connect/disconnect lines, which any client can cause (under the lock) */
        bool stopping;
        uint64_t drain_deadline_usec;
        int exit_code;

        /* A restart that hands the clients on (carry.c, docs/operations.md) */
        int handover;                /* MANAGER_HANDOVER_*: how this stop ends */
        int stop_job;                /* ServiceJob: what systemd said it does with the unit at SIGTERM */
        char *exe_path;              /* what a re-exec runs: this program's path, as started */
        char **argv;                 /* main()'s, for a re-exec */
        struct HandoverFds *carried; /* what manager_run() collected for main() to hand over */
        char (*passed_names)[64];    /* the fd names handed to this daemon, to drop from systemd's store */
        size_t n_passed_names;
        /* fds held from the start and closed to make the hand-over: a daemon whose fd table clients filled
         * still has room for the channel, the state and the copy of the listening socket */
        int fd_reserve[MANAGER_FD_RESERVE];
};

enum {
        MANAGER_HANDOVER_NONE,  /* a plain stop: clients are closed */
        MANAGER_HANDOVER_STORE, /* SIGTERM under systemd: into its fd store, for the next start */
        MANAGER_HANDOVER_EXEC,  /* SIGUSR1: this process re-executes itself, fds inherited */
};

/* The manager's lock (Manager.lock). */
void manager_lock(Manager *m);
void manager_unlock(Manager *m);
/* Have the main loop run the departed clients' teardowns in slices, if not already told. Under the lock. */
void manager_reap_post(Manager *m);
/* Every shard's counters added up. */
void manager_stats(const Manager *m, ManagerStats *ret);
/* The shard whose loop runs on the calling thread (NULL on any other thread). */
Shard *manager_current_shard(Manager *m);
/* Tell systemd how many clients are served (STATUS=), at most once a second. Under the lock. */
void manager_notify_status(Manager *m);
/* Connections of @uid; the connection with @client_id (NULL: none). Under the lock. */
unsigned manager_conns_of_uid(const Manager *m, uid_t uid);
Conn *manager_find_conn(Manager *m, uint64_t client_id);
