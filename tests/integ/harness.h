/* Integration harness: run a real gpumemd on the model on a temporary socket, with a NOTIFY_SOCKET we own. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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
        volatile bool notify_stop;
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
/* SIGTERM and reap; returns the exit status (0..255), or a negative errno / -1000-signal when killed. */
int daemon_stop(Daemon *d);
/* Remove the temp dir and close what the harness holds. */
void daemon_cleanup(Daemon *d);
/* The daemon's open fd count. */
int daemon_fd_count(const Daemon *d);
/* The lowest count over 200 ms: the baseline without transient fds. */
int daemon_quiet_fd_count(const Daemon *d);

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
