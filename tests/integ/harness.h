/* Integration harness: run a real gpumemd on the model on a temporary socket, with a NOTIFY_SOCKET we own. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpumem-client.h"

/*
 * An fd the daemon gave the supervisor's fd store (FDSTORE=1 with FDNAME=), as systemd keeps them: at most
 * HARNESS_FD_STORE_MAX (the shipped unit's FileDescriptorStoreMax=), and, unless sent with FDPOLL=0, polled:
 * one that reports EPOLLHUP or EPOLLERR is closed and forgotten.
 */
#define HARNESS_FD_STORE_MAX 16
typedef struct StoredFd {
        char name[256];
        int fd;
        bool poll;
} StoredFd;

typedef struct Daemon {
        pid_t pid;
        char dir[64];
        char sock[128];
        char conf[128];
        int notify_fd;
        char notify_path[128];
        char notify_log[8192]; /* every notification received, newline separated (under notify_lock) */
        pthread_mutex_t notify_lock;
        pthread_t notify_thread; /* drains the notify socket so the daemon never waits on us */
        bool notify_thread_running;
        _Atomic bool notify_stop; /* set by daemon_cleanup, read by the notify thread */
        _Atomic bool notify_busy; /* the notify thread has a notification in hand */
        StoredFd *store;          /* the fd store (under notify_lock) */
        size_t n_store, cap_store;
} Daemon;

/*
 * Start gpumemd (path from $GPUMEMD) with --socket in a fresh temp dir, the model backend with @preset,
 * a config file holding @config_text (may be NULL), and @extra_args (NULL-terminated, may be NULL).
 * Waits for READY=1. Returns 0 or a negative errno.
 */
int daemon_start(Daemon *d, const char *preset, const char *config_text, const char *const *extra_args);
/*
 * daemon_start() for a test program's main, and with @ret_gpus daemon_gpus() (at most @cap): the number of
 * GPUs (0 without @ret_gpus), or a negative errno (-ENODEV: no GPU), said on stderr, the daemon cleaned up.
 */
int daemon_setup(Daemon *d, const char *preset, const char *config_text, const char *const *extra_args,
                 uint32_t *ret_gpus, size_t cap);
/* The end of a test program's main: stop and clean up; @r, or EXIT_FAILURE when the daemon did not exit 0. */
int daemon_finish(Daemon *d, int r);
/* Whether this gpumemd accepts @config_text (--check-config); its complaints go to stderr with @show. */
bool daemon_accepts_config(const char *config_text, bool show);
/* Wait until a notification containing @what arrives (or was seen); 0 or -ETIMEDOUT. */
int daemon_wait_notify(Daemon *d, const char *what, int timeout_ms);
/* Replace the config file (for SIGHUP tests). */
int daemon_write_config(Daemon *d, const char *config_text);
/* SIGTERM and reap; returns the exit status (0..255), or a negative errno / -1000-signal when killed. A stop
 * for good, as `systemctl stop`: what the daemon put in the fd store is closed once it exited. */
int daemon_stop(Daemon *d);
/* The same, keeping the fd store for daemon_restart_handover() (the first half of `systemctl restart`). */
int daemon_term(Daemon *d);
/* Remove the temp dir and close what the harness holds. */
void daemon_cleanup(Daemon *d);
/* The daemon's open fd count. */
int daemon_fd_count(const Daemon *d);
/* The daemon's own fds: daemon_fd_count() without a wrapper's (valgrind's) fds. */
int daemon_own_fds(const Daemon *d);
/* The lowest count over 200 ms: the baseline without transient fds. */
int daemon_quiet_fd_count(const Daemon *d);

/*
 * $GPUMEMD_WRAPPER, when set, is a command line the daemon runs under (e.g. "valgrind --error-exitcode=99
 * --leak-check=full"): split at spaces and put before the daemon's argv. Start-up waits are longer then.
 */
bool daemon_wrapped(void);
/*
 * The backend switch of the suites: with GPUMEM_TEST_BACKEND=kfd the daemon runs --backend kfd under
 * $GPUMEM_TEST_KFD_PRELOAD (libgpumem-model-preload.so), which serves /dev/kfd, the render nodes and the KFD
 * sysfs from the model at the libc level (the preset and a --model-kfd-minor go to it by its environment;
 * GPUMEM_TEST_KFD_MINOR sets the ABI of the tests that name none): the preload's path then, else NULL (the
 * model backend, entered by function calls).
 */
const char *daemon_kfd_preload(void);
/*
 * A client a restart is to carry. Under ThreadSanitizer the daemon's windows above 1 TiB can only lie where
 * the kernel also places a program's image at exec (the sanitizer takes the rest), so a new daemon may find
 * its own binary where a carried window was, and refuse to take that client back (it says so, the client sees
 * its connection close). Such clients ask for windows below 1 TiB there, which the new image never takes;
 * elsewhere they take the daemon's default.
 */
int daemon_connect_carried(Daemon *d, const char *name, gm_client **ret);
/*
 * The tests (and so the daemon next to them) are built with ThreadSanitizer, whose shadow and metadata
 * take most of the address space above 1 TiB: the daemon then has room for a few TiB of client VA windows,
 * in pieces of at most 1.5 TiB.
 */
bool daemon_under_tsan(void);
/* Like daemon_start(), but on an existing Daemon whose dir, socket and config are kept (a restart). */
int daemon_restart(Daemon *d, const char *preset, const char *const *extra_args);
/*
 * A restart as systemd makes it with the service's fd store: the stored fds are passed to the new daemon
 * (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID) and stay in the store until the daemon removes them
 * (FDSTOREREMOVE=1). daemon_restart() is a stop and a start: the store is emptied first.
 */
int daemon_restart_handover(Daemon *d, const char *preset, const char *const *extra_args);
/* Fds in the store; the fd stored under @name (the store's, -ENOENT when none). */
size_t daemon_store_count(Daemon *d);
int daemon_store_fd(Daemon *d, const char *name);
/* Put @fd (taken) in the store under @name, in place of what was stored under it. */
void daemon_store_put(Daemon *d, const char *name, int fd);
/* Close everything in the store. */
void daemon_store_clear(Daemon *d);
/* Forget the notifications seen so far (to wait for a second READY=1 of a re-executed daemon). */
void daemon_notify_clear(Daemon *d);
/* SIGKILL and reap. */
int daemon_kill(Daemon *d);
/* SIGKILL the process *@pid and reap it, when there is one (> 0); *@pid is 0 then. */
void kill_and_reap(pid_t *pid);
/* Resident memory of the daemon in KiB (VmRSS), or a negative errno. */
long daemon_rss_kb(const Daemon *d);

/* What the daemon and its backend hold, from admin_status over a connection of its own. */
typedef struct DaemonState {
        uint32_t clients, va_windows;
        uint64_t allocations, bytes_device, bytes_host, bytes_managed, requests, protocol_errors;
        bool has_model;
        uint32_t model_contexts;
        uint64_t model_buffers, model_handles, model_imports, model_mappings, model_gem_handles;
        uint64_t model_svm_ranges, model_system_bytes, model_vram_bytes, model_queues;
        int fds; /* the daemon's open fds, counted while the status connection is closed */
} DaemonState;

/* The ids of the daemon's GPUs in its topology's order, at most @cap, read over a connection of the
 * harness's own; how many, or a negative errno. */
int daemon_gpus(Daemon *d, uint32_t *ret_ids, size_t cap);
/* Read the state (the status connection is counted in clients and va_windows, and closed again). */
int daemon_state(Daemon *d, DaemonState *ret);
/* The state to come back to: taken once no other client is connected, with the daemon's quiet fd count. */
int daemon_base_state(Daemon *d, DaemonState *ret);
/* True when nothing is held beyond @base: its allocations and bytes, the model's counters and fds. */
bool daemon_state_is_base(const DaemonState *s, const DaemonState *base);
/* The counters daemon_state_is_base() compares, for daemon_state_same_but(). */
enum {
        DAEMON_STATE_CONTEXTS = 1 << 0,
        DAEMON_STATE_IMPORTS = 1 << 1,
        DAEMON_STATE_QUEUES = 1 << 2,
        DAEMON_STATE_FDS = 1 << 3,
};
/* daemon_state_is_base() without the counters in @ignore (DAEMON_STATE_* bits). */
bool daemon_state_same_but(const DaemonState *a, const DaemonState *b, unsigned ignore);
/* Wait up to @timeout_ms for daemon_state_is_base(); 0, or -ETIMEDOUT with the last state in @ret_last
 * (may be NULL) and a line on stderr naming what differs. */
int daemon_wait_base(Daemon *d, const DaemonState *base, int timeout_ms, DaemonState *ret_last);
/* daemon_wait_base() for up to 10 s after @what, which a line on stderr names when it timed out. */
int daemon_wait_base_after(Daemon *d, const DaemonState *base, const char *what);

/* Raw protocol access for hostile-input tests. */
int raw_connect(const char *sock);
/* Send one packet (no fds or @n_fds fds). */
int raw_send(int fd, const void *buf, size_t len, const int *fds, size_t n_fds);
/* Build and send a frame around @body with @request_id. */
int raw_send_frame(int fd, uint32_t request_id, const void *body, size_t body_len, uint16_t version,
                   uint16_t hdr_n_fds, const int *fds, size_t n_fds);
/* Send a valid hello and read its reply; 0 or the reply's error code. */
int raw_hello(int fd);
/* Receive one reply: its request id, status code and reason. -ECONNRESET on EOF, -ETIMEDOUT. */
int raw_recv_reply(int fd, uint32_t *ret_id, int *ret_code, char *reason, size_t reason_len, int timeout_ms);
/* True when the daemon closed the connection (EOF within @timeout_ms). */
bool raw_closed(int fd, int timeout_ms);
/*
 * Send @req (packed by the harness; @req is a Gpumem__Request *) with @fds and wait for its reply. Returns
 * the reply's status code, or a negative errno of the transport (-ECONNRESET, -ETIMEDOUT) with
 * *ret_transport set. Fds that come back are stored in @ret_fds (room for 16; NULL: closed) and counted in
 * *ret_n_fds. The unpacked reply goes to *ret_reply when given (free with raw_reply_free).
 */
int raw_request(int fd, uint32_t request_id, const void *req, const int *fds, size_t n_fds, void **ret_reply,
                int *ret_fds, size_t *ret_n_fds, bool *ret_transport);
void raw_reply_free(void *reply);
/* Send @req (a Gpumem__Request *, packed here; a check fails when it does not fit 256 bytes) without waiting
 * for its reply; a host allocation of @size, a ping, the same way. */
void raw_send_request(int fd, uint32_t id, const void *req);
void raw_send_host_alloc(int fd, uint32_t id, uint64_t size);
void raw_send_ping(int fd, uint32_t id);
/* raw_request() of a hello (protocol 1) from client @name: its reply's code, the reply in *@ret_reply. */
int raw_hello_named(int fd, uint32_t request_id, const char *name, void **ret_reply);
/*
 * The reply in the packet @pkt (@n bytes, with @n_fds fds): 0 with it unpacked in *@ret_reply (free with
 * raw_reply_free), -EPROTO for a bad frame, -EBADMSG for a reply without a status. *@ret_id (may be NULL)
 * is its request id once the frame is good.
 */
int raw_reply_parse(const void *pkt, size_t n, size_t n_fds, uint32_t *ret_id, void **ret_reply);

/* ---- the client library's side: admin views and client processes ---- */

/* A client of the daemon named @name; a check fails when it cannot connect (NULL then). */
gm_client *daemon_client(Daemon *d, const char *name);
/*
 * What class @cls uses of @resource on GPU @gpu (0: all GPUs) and its limit, as administrators see them,
 * over a connection of its own. Both are UINT64_MAX when there is no such row, or on failure (may be NULL).
 * Returns 0, or the negative errno of the connection or the query.
 */
int daemon_class_quota(Daemon *d, const char *cls, int resource, uint32_t gpu, uint64_t *ret_used,
                       uint64_t *ret_limit);
/* Wait up to @timeout_ms until class @cls uses @want of @resource (all GPUs): 0, the negative errno of a
 * query that failed, or -ETIMEDOUT with a line on stderr. */
int daemon_class_reaches(Daemon *d, const char *cls, int resource, uint64_t want, int timeout_ms);
/* The share @name as administrators list it: 0, -ENOENT when there is none, or a negative errno. */
int daemon_share_info(Daemon *d, const char *name, gm_share_info *ret);
/*
 * One object of each kind made by @c and left held, for a client that is to be killed: device memory on
 * @dev_gpu, mapped on @map_gpu too and exported (and imported again with @import), host and managed memory
 * with an SVM attribute, and VMM memory of @gpu mapped in a reservation. Every step's error is ignored.
 */
void client_leave_objects(gm_client *c, uint32_t dev_gpu, uint32_t map_gpu, uint32_t gpu, bool import);

/*
 * A client process (named "doomed") that is to be killed: it connects and runs @fn(@c, @ready, @arg), which
 * writes a byte to @ready once it holds what it should and never returns. Its pid once that byte came; -1
 * (the process reaped) when it did not.
 */
pid_t fork_doomed(Daemon *d, void (*fn)(gm_client *c, int ready, void *arg), void *arg);

/*
 * The tests' SDMA queue in 64 KiB of a client's GTT memory: its ring (4 KiB) at the start, the read and write
 * pointers at 4 KiB, and at 8 KiB a dword that the tests' fence packets write.
 */
typedef struct GttQueue {
        gm_queue_desc desc; /* for gm_queue_create */
        uint32_t *ring;
        uint64_t *rptr, *wptr;
        volatile uint32_t *fence;
} GttQueue;
/* The queue of GPU @gpu laid out in @mem. */
void gtt_queue_init(GttQueue *g, void *mem, uint32_t gpu);
/* A thread's wait (up to 10 s) for the event @id of @c: event_waiter() is the thread, @result what it got. */
typedef struct EventWaiter {
        gm_client *c;
        uint32_t id;
        int result;
} EventWaiter;
void *event_waiter(void *arg);
/* Wait up to @ms milliseconds until *@p is @want (as the GPU writes it): whether it is. */
bool wait_u32(volatile uint32_t *p, uint32_t want, int ms);

/* ---- children of other uids ---- */

/*
 * @fn(@arg) in a child process that became @uid (its group too, no supplementary groups): its pid, or -1.
 * The child exits with what @fn returned, or 1 when that is 0 but a check failed there; with 100 when it
 * could not become @uid.
 */
pid_t fork_as(uid_t uid, int (*fn)(void *), void *arg);
/* fork_as() with a socketpair between the two: @fn's argument points at the child's end, *@ret_sync is ours
 * (-1 when the pair cannot be made). */
pid_t fork_as_synced(uid_t uid, int (*fn)(void *), int *ret_sync);
/* Reap the child @pid: its exit status, 128 + the signal that ended it, or -1. */
int child_status(pid_t pid);
/* Close our end @sync (when >= 0) of a fork_as_synced() child's socket, then child_status(). */
int child_end(pid_t pid, int sync);
/* fork_as() and child_status(): 0 when every check in the child held. */
int run_as(uid_t uid, int (*fn)(void *), void *arg);
