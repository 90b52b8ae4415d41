/* Integration harness: run a real gpumemd on the model on a temporary socket, with a NOTIFY_SOCKET we own. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* An fd the daemon gave the supervisor's fd store (FDSTORE=1 with FDNAME=), as systemd keeps them. */
typedef struct StoredFd {
        char name[256];
        int fd;
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
/* Wait up to @timeout_ms for daemon_state_is_base(); 0, or -ETIMEDOUT with the last state in @ret_last
 * (may be NULL) and a line on stderr naming what differs. */
int daemon_wait_base(Daemon *d, const DaemonState *base, int timeout_ms, DaemonState *ret_last);

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
