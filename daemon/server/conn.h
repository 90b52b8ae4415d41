/* A client connection: identity frozen at accept, frame I/O with fds, output queue and deferred free. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "gpumem.pb-c.h"
#include "base/log.h"
#include "base/loop.h"
#include "transport.h"
#include "base/util.h"

typedef struct Manager Manager;
typedef struct Shard Shard;
typedef struct Conn Conn;
typedef struct ThunkVaSpace ThunkVaSpace;
typedef struct BrokerClient BrokerClient;
typedef struct ClassState ClassState;

/*
 * What a connection asks of the daemon above it, which hands it these at conn_new(): the connection calls
 * nothing above itself but through them. All are called on the connection's loop.
 */
typedef struct ConnHost {
        /* A request packet (the loop's receive buffer, valid during the call); takes @fds. */
        void (*packet)(Conn *c, const uint8_t *buf, size_t len, int *fds, size_t n_fds);
        /* The transport refused a packet: a protocol violation, answered and closed by the daemon. */
        void (*violation)(Conn *c, uint32_t request_id, int code, const char *reason);
        /* The manager's lock, around what the connection does on its own (recursive). */
        void (*lock)(Manager *m);
        void (*unlock)(Manager *m);
        /* Out of the daemon's list and counts (a no-op once out); @killed: it was closed, not freed at
         * shutdown. Under the lock. */
        void (*gone)(Conn *c, bool killed);
        /* Release what the daemon holds for it (memory objects, window, class). Under the lock. */
        void (*teardown)(Conn *c);
        /* Replies it may have in flight; and that it was held at that limit. */
        uint64_t (*inflight_limit)(const Conn *c);
        void (*limited)(Conn *c);
        /* Its class's name for log lines ("" for none). */
        const char *(*class_name)(const Conn *c);
} ConnHost;

typedef struct ConnIdentity {
        pid_t pid;
        uid_t uid;
        gid_t gid;
        gid_t *groups; /* supplementary groups (SO_PEERGROUPS) */
        size_t n_groups;
        int pidfd;    /* pins the peer process, so a reused pid cannot be mistaken for it */
        char *cgroup; /* unified-hierarchy path from /proc/PID/cgroup, or NULL */
} ConnIdentity;

/*
 * A client. It lives on one shard (its loop thread does all its I/O and runs all its requests). Its books
 * (broker client, class, window) are written on its loop under its lock (conn_lock: requests on its own
 * memory) or under the manager's (everything else); other threads read or change them holding both, the
 * manager's first. Its loop keeps some counters without either (requests, inflight).
 */
/* A text an administrator reads part by part, kept with the connection until its last part went. */
typedef struct PagedText {
        struct PagedText *next;
        uint32_t token; /* names it in the cursor of its parts */
        char *text;
        size_t len;
} PagedText;

typedef struct Conn {
        Manager *m; /* for the request handlers above; the connection itself only carries it */
        const ConnHost *host;
        const uint32_t *send_timeout_sec,
                *hello_timeout_sec; /* the daemon's settings (read as they change) */
        Shard *sh;                  /* its loop; set when the daemon places it */
        LoopWork start_work;
        Conn *prev, *next;
        Transport t;           /* the socket, its frames and its reply queue */
        LoopTimer hello_timer; /* closes the connection if hello does not come in time */
        LoopTimer free_timer;  /* its deferred free (conn_kill), set up at its start so a kill cannot fail */
        LoopWork free_work;    /* the same before its start */
        uint64_t id;
        ConnIdentity ident;
        char *name;
        char container[64];     /* "docker/<id>" etc., from the cgroup */
        char pod[64];           /* Kubernetes pod UID */
        uint16_t proto_version; /* 0 until hello */
        bool admin;
        bool dead;
        Conn *dying_next;      /* on its shard's list of killed connections until the loop frees them */
        uint64_t requests;     /* written by its loop only */
        int64_t inflight;      /* replies queued or being made (written by its loop only) */
        uint64_t max_inflight; /* its class's limit, kept here for its loop to read without the lock */
        bool started;          /* conn_start() ran: its transport has events and buffers */
        uint64_t connected_real_usec;
        ThunkVaSpace *window;
        uint64_t window_base, window_size;
        uint64_t window_tail;             /* bytes after the window reserved with it (its guard), or 0 */
        ThunkVaSpace *window_rejected[4]; /* windows this client could not reserve, held until it leaves */
        uint64_t window_rejected_tail[4];
        bool low_window; /* its windows lie below 1 TiB (asked for at hello) */
        unsigned n_window_rejected;
        LogRatelimit log_rl;
        BrokerClient *broker;            /* the client's memory objects, from its first memory op */
        ClassState *cls;                 /* its policy class */
        unsigned deferred;               /* requests that finish later (their reply slots are queued) */
        struct PendingWait *event_waits; /* event waits answered when they end (ops-events.c) */
        bool free_when_idle;             /* conn_free() came while some were still pending */
        pthread_mutex_t lock;            /* the client's lock (above) */
        atomic_bool irq_posted;          /* a look at its event page is posted to its loop (ops-queues.c) */
        struct PagedText *paged;         /* admin_metrics' texts being read part by part (ops-admin.c) */
        uint32_t paged_seq;              /* the token of its newest text (ops-admin.c) */
        /* per broker GPU, the VRAM its topology files gave it (ops-query.c; NULL before it read them) */
        uint64_t *vram_told;
} Conn;

static inline void conn_lock(Conn *c)
{
        pthread_mutex_lock(&c->lock);
}

static inline void conn_unlock(Conn *c)
{
        pthread_mutex_unlock(&c->lock);
}

/*
 * Take ownership of an accepted socket @fd (closed on failure too) and read the peer's identity. The
 * connection is in no list and watches nothing yet. @send_timeout_sec and @hello_timeout_sec point at the
 * daemon's settings, which a reload may change. Under the daemon's lock.
 */
int conn_new(Manager *m, const ConnHost *host, const uint32_t *send_timeout_sec,
             const uint32_t *hello_timeout_sec, int fd, Conn **ret);
/* On its shard's thread, without the lock: start reading it and its hello deadline. */
void conn_start(Conn *c);
/* Free now (only from outside the connection's own callbacks, e.g. at shutdown). Under the lock, on its
 * shard's thread (or when no loop runs). */
Conn *conn_free(Conn *c);
/* Mark dead, stop its events and free it from a fresh loop iteration. Safe inside its own callbacks. Under
 * the lock, on its shard's thread. */
void conn_kill(Conn *c);
/*
 * Send a reply frame. Takes ownership of @fds (closed once sent, or on failure). When the socket is full
 * the packet is queued and the connection stops reading until the queue drains (backpressure).
 */
int conn_send(Conn *c, uint32_t request_id, const Gpumem__Reply *reply, int *fds, size_t n_fds);
/*
 * A request that finishes later keeps its place: conn_slot_reserve() queues an empty slot (counted in
 * flight; replies behind it wait), conn_slot_fill() puts the reply in it and sends what can go, and
 * conn_deferred_end() is called once the request is done with the connection, which conn_free() keeps
 * alive until then.
 */
int conn_slot_reserve(Conn *c, TransportPacket **ret);
int conn_slot_fill(Conn *c, TransportPacket *slot, uint32_t request_id, const Gpumem__Reply *reply, int *fds,
                   size_t n_fds);
void conn_deferred_end(Conn *c);
/* Send a reply whose body (a packed Reply) was made earlier, e.g. a cached one; no fds. */
int conn_send_packed(Conn *c, uint32_t request_id, const uint8_t *body, size_t body_len);
/* Hello is done: the hello timer stops. */
void conn_hello_done(Conn *c);
/* Send an error reply (no fds). */
int conn_send_error(Conn *c, uint32_t request_id, int code, const char *reason);

bool conn_in_group(const Conn *c, gid_t gid);
/* Requests the connection may have in flight (replies not yet taken by the socket): its class's limit. */
uint64_t conn_inflight_limit(const Conn *c);

/* The level of @c's connect and disconnect lines: an administrator's gpumemctl session (a query, a quota
 * change) is debug, so that each call of the tool does not put two lines in the journal; any other info. */
int conn_session_log_level(const Conn *c);
/* Log a line about @c with its identity as journal fields; @rl (may be NULL) limits lines a client triggers.
 */
void conn_log(Conn *c, int prio, const char *message_id, LogRatelimit *rl, const char *fmt, ...)
        _printf_(5, 6);
