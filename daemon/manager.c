/* gpumemd's root object: start-up order, signals, readiness, drain and teardown (accept: server/listener.c).
 */
#include "manager.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <systemd/sd-daemon.h>

#include "broker/broker.h"
#include "carry.h"
#include "server/classes.h"
#include "ops/exposition.h"
#include "base/metrics.h"
#include <event2/http.h>
#include "config/policy.h"
#include "config.h"
#include "server/conn.h"
#include "server/listener.h"
#include "frame.h"
#include "map.h"
#include "base/handover.h"
#include "base/service-job.h"
#include "base/log.h"
#include "ops/request.h"
#include "server/window.h"
#include "base/worker.h"

/* Objects a departed client's teardown frees per loop round, other clients' requests in between. */
#define MANAGER_TEARDOWN_SLICE 4096
#define DRAIN_TIMEOUT_USEC     (3u * 1000000u)
/* vm.max_map_count where it cannot be read (the kernel's default), and the least left to the daemon itself.
 */
#define MANAGER_MAP_COUNT_DEFAULT 65530u
#define MANAGER_OWN_MAPPINGS      8192u

static void set_client_limits(Manager *m);

static void on_status_timer(evutil_socket_t fd, short what, void *userdata)
{
        Manager *m = userdata;
        unsigned n;

        manager_lock(m);
        m->status_pending = false;
        n = m->n_conns;
        manager_unlock(m);
        /* a preset is a simulated node: said in so many words wherever an operator looks */
        (void)sd_notifyf(0, "STATUS=Serving %u client%s on %s%s%s%s", n, n == 1 ? "" : "s",
                         driver_name(m->drv),
                         m->preset_name[0] ? " (SIMULATED GPUs, no hardware; preset " : "", m->preset_name,
                         m->preset_name[0] ? ")" : "");
}

typedef struct Reaper {
        struct Reaper *next;
        BrokerClient *bc;
        WindowSet windows;
} Reaper;

static void reaper_finish(Reaper *r)
{
        (void)broker_client_free(r->bc);
        window_set_release(&r->windows);
        free(r);
}

/*
 * One slice of the oldest teardown per main loop round. Requests of other loops that need the lock are
 * served in between: a slice with threads waiting for the lock leaves the next one to the last of them
 * (manager_unlock()), since an unfair mutex would otherwise go back to this thread slice after slice.
 */
static void on_reap(evutil_socket_t fd, short what, void *userdata)
{
        static const struct timeval now = {0, 0};
        Manager *m = userdata;
        Reaper *r;
        bool next = false;

        manager_lock(m);
        r = m->reapers;
        if (r && broker_client_teardown_step(r->bc, MANAGER_TEARDOWN_SLICE)) {
                m->reapers = r->next;
                reaper_finish(r);
        }
        if (!m->reapers)
                m->reap_posted = false;
        else if (__atomic_load_n(&m->lock_waiters, __ATOMIC_RELAXED) > 0)
                m->reap_parked = true;
        else
                next = true;
        manager_unlock(m);
        if (next)
                evtimer_add(m->reap_ev, &now);
}

/*
 * Take over the teardown of @bc and the windows of @c (moved out of it) and finish it in slices from the
 * main loop. -ENOMEM or -ESHUTDOWN (the manager is being freed): the caller tears down at once.
 */
static int manager_reap(Manager *m, BrokerClient *bc, Conn *c)
{
        Reaper *r, **tail;

        if (m->freeing || !m->reap_ev)
                return -ESHUTDOWN;
        r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->bc = bc;
        window_take(c, &r->windows);
        for (tail = &m->reapers; *tail; tail = &(*tail)->next)
                ;
        *tail = r;
        /* the slices run on the main loop; it is told once until the list runs empty */
        manager_reap_post(m);
        return 0;
}

/* ---- what a connection asks of the daemon (ConnHost) ----------------------------------------------------
 */

static void host_packet(Conn *c, const uint8_t *buf, size_t len, int *fds, size_t n_fds)
{
        request_handle(c, buf, len, fds, n_fds);
}

static void host_violation(Conn *c, uint32_t request_id, int code, const char *reason)
{
        request_violation(c, request_id, code, reason);
}

static void host_gone(Conn *c, bool killed)
{
        Manager *m = c->m;

        if (c->prev)
                c->prev->next = c->next;
        else if (m->conns == c)
                m->conns = c->next;
        else
                return; /* not linked */
        if (c->next)
                c->next->prev = c->prev;
        c->prev = c->next = NULL;
        m->n_conns--;
        c->sh->n_conns--;
        if (!killed)
                return;
        if (c->proto_version)
                conn_log(c, conn_session_log_level(c), GM_MESSAGE_CLIENT_DISCONNECT, &m->conn_log_rl,
                         "disconnected after %llu requests", (unsigned long long)c->requests);
        manager_notify_status(m);
}

static void host_teardown(Conn *c)
{
        events_conn_gone(c); /* its waits refer to its books */
        /* its GPU context may run on (in slices below) after the connection is freed: no more interrupts
         * for it */
        if (c->broker)
                broker_client_set_interrupt(c->broker, NULL, NULL);
        /* objects first (they live in the window), then the window itself; a client with many objects goes
         * in slices between other clients' requests */
        if (c->broker && broker_client_records(c->broker) > MANAGER_TEARDOWN_SLICE &&
            manager_reap(c->m, c->broker, c) == 0)
                c->broker = NULL;
        else {
                c->broker = broker_client_free(c->broker);
                window_release(c);
        }
        classes_leave(c);
}

static uint64_t host_inflight_limit(const Conn *c)
{
        /* read on the connection's loop without the lock: its class's limit, copied into it whenever the
         * class or the limit changes (a reload may free the class it had) */
        return READ_ONCE(c->max_inflight);
}

static void host_limited(Conn *c)
{
        metrics_deny(c->sh->metrics, DENY_INFLIGHT);
}

static const char *host_class_name(const Conn *c)
{
        return c->cls ? c->cls->name : "";
}

/* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
// clang-format off
static const ConnHost conn_host = {
        .packet = host_packet, .violation = host_violation, .lock = manager_lock, .unlock = manager_unlock,
        .gone = host_gone, .teardown = host_teardown, .inflight_limit = host_inflight_limit,
        .limited = host_limited, .class_name = host_class_name
};
// clang-format on

int manager_conn_new(Manager *m, int fd, Conn **ret)
{
        return listener_conn_new(m, fd, ret);
}

void manager_conn_place(Manager *m, Conn *c, Shard *sh)
{
        listener_place(m, c, sh);
}

/* What carrying clients across a restart needs of the manager. */
/* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
// clang-format off
static const CarryHost carry_host = {
        .conn_new = listener_conn_new, .pick_shard = listener_pick_shard, .place = listener_place,
        .refuse_send = listener_refuse_send, .books = conn_books_new
};
// clang-format on

/*
 * The fds passed at start (LISTEN_FDS): a socket of socket activation, and what a daemon before this one
 * handed over (names starting "gm-", into @ret_ours). Their names are kept, to be taken out of systemd's
 * fd store once the clients are back.
 */
static int take_passed_fds(Manager *m, HandoverFds *ret_ours)
{
        HandoverFds all;
        int n = handover_fds_from_env(&all), r = 0;

        *ret_ours = (HandoverFds){0};
        if (n < 0)
                return log_error_errno(n, "socket activation: %s", strerror(-n));
        if (all.n) {
                m->passed_names = calloc(all.n, sizeof(*m->passed_names));
                if (!m->passed_names) {
                        handover_fds_done(&all);
                        return log_error_errno(-ENOMEM, "out of memory");
                }
        }
        for (size_t i = 0; i < all.n; i++) {
                HandoverFd *f = &all.v[i];
                if (strncmp(f->name, HANDOVER_NAME_PREFIX, strlen(HANDOVER_NAME_PREFIX)) == 0) {
                        strcpy(m->passed_names[m->n_passed_names++], f->name);
                        if (r == 0)
                                r = handover_fds_add(ret_ours, f->name, f->fd);
                        else
                                safe_close(f->fd);
                        f->fd = -1;
                        continue;
                }
                if (r == 0 && m->listen_fd >= 0)
                        r = log_error_errno(-EINVAL, "socket activation passed more than one socket");
                else if (r == 0 && !listener_fd_usable(f->fd))
                        r = log_error_errno(-EINVAL,
                                            "the activated socket '%s' is not a listening AF_UNIX "
                                            "SOCK_SEQPACKET",
                                            f->name);
                if (r == 0) {
                        m->listen_fd = f->fd;
                        f->fd = -1;
                }
        }
        handover_fds_done(&all); /* what was not taken */
        return r;
}

/* While stopping, every loop closes its connections whose replies are all out; the rest get until the
 * deadline. The main loop's tick also ends the run, once no connection is left or the deadline passed. */
static void on_drain_tick(void *userdata)
{
        Shard *sh = userdata;
        Manager *m = sh->m;
        unsigned left;

        manager_lock(m);
        if (m->handover != MANAGER_HANDOVER_NONE) {
                /* the connections stay open for the next daemon: wait until none has a reply to go */
                sh->unsettled = 0;
                for (Conn *c = m->conns; c; c = c->next)
                        if (c->sh == sh && !carry_conn_settled(c))
                                sh->unsettled++;
                left = 0;
                for (unsigned i = 0; i < m->n_shards; i++)
                        left += m->shards[i].unsettled;
                if (sh->index != 0)
                        left = sh->unsettled;
        } else {
                for (Conn *c = m->conns, *next; c; c = next) {
                        next = c->next;
                        if (c->sh == sh && transport_idle(&c->t)) {
                                /* the reason first (a connection-level error), then the close */
                                if (!c->dead)
                                        (void)conn_send_error(
                                                c, 0, -ESHUTDOWN,
                                                m->stop_job == SERVICE_JOB_STOP
                                                        ? "gpumemd was stopped by the service manager"
                                                        : "gpumemd is stopping");
                                conn_kill(c);
                        }
                }
                left = sh->index == 0 ? m->n_conns : sh->n_conns;
        }
        manager_unlock(m);
        if (sh->index == 0 && (left == 0 || now_usec(CLOCK_MONOTONIC) >= m->drain_deadline_usec)) {
                event_base_loopbreak(m->base);
                return;
        }
        /* a hand-over waits only for replies on their way out: it looks again soon */
        if (left)
                loop_timer_arm(&sh->drain_timer, m->handover != MANAGER_HANDOVER_NONE ? 1000 : 50000);
}

/* On each loop: stop reading its clients, and start its drain. */
static void drain_start(void *arg)
{
        Shard *sh = arg;
        Manager *m = sh->m;

        manager_lock(m);
        for (Conn *c = m->conns; c; c = c->next)
                if (c->sh == sh)
                        transport_pause(&c->t, true);
        manager_unlock(m);
        on_drain_tick(sh);
}

/* How long a SIGTERM waits for systemd to say whether it stops or restarts the unit. */
#define STOP_JOB_TIMEOUT_USEC (500u * 1000u)

static void on_signal_stop(evutil_socket_t sig, short what, void *userdata)
{
        Manager *m = userdata;
        const char *notify = getenv("NOTIFY_SOCKET");
        unsigned n;

        if (m->stopping)
                return;
        m->stopping = true;
        manager_lock(m);
        n = m->n_conns;
        m->drain_deadline_usec = now_usec(CLOCK_MONOTONIC) + DRAIN_TIMEOUT_USEC;
        /*
         * Under systemd a SIGTERM may be a restart: the clients go into its fd store, which gives them to
         * the next start (systemd empties the store when the service stops for good). SIGUSR1: this process
         * re-executes itself.
         */
        if (sig == SIGUSR1)
                m->handover = MANAGER_HANDOVER_EXEC;
        else if (sig == SIGTERM && m->opts.handover && notify && *notify) {
                /* the same SIGTERM comes for a stop and a restart: the unit's job tells them apart; a stop
                 * for good closes the clients with the reason, instead of leaving them in a store systemd
                 * empties (without a job, or without a bus to ask, the clients are handed over) */
                ServiceJob job = service_job_query(STOP_JOB_TIMEOUT_USEC);
                m->handover = job == SERVICE_JOB_STOP ? MANAGER_HANDOVER_NONE : MANAGER_HANDOVER_STORE;
                m->stop_job = job;
        }
        for (unsigned i = 0; i < m->n_shards; i++)
                m->shards[i].unsettled = 1; /* until its loop counted */
        manager_unlock(m);
        if (m->handover == MANAGER_HANDOVER_EXEC) {
                log_info("received SIGUSR1, re-executing %s with %u client%s", m->exe_path, n,
                         n == 1 ? "" : "s");
                (void)sd_notify(0, "RELOADING=1\nSTATUS=Re-executing, clients carried over");
        } else {
                log_info("received %s%s%s, %s %u client%s", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                         m->stop_job != SERVICE_JOB_UNKNOWN ? " for a " : "",
                         m->stop_job != SERVICE_JOB_UNKNOWN ? service_job_name(m->stop_job) : "",
                         m->handover ? "handing over" : "draining", n, n == 1 ? "" : "s");
                (void)sd_notify(0, m->handover ? "STOPPING=1\nSTATUS=Handing clients over"
                                               : "STOPPING=1\nSTATUS=Draining clients");
        }
        listener_pause(m);
        for (unsigned i = 1; i < m->n_shards; i++)
                loop_post_work(m->shards[i].loop, &m->shards[i].drain_work, drain_start, &m->shards[i]);
        drain_start(&m->shards[0]);
}

/* Memory that outlived its handle has gone: its class is refunded. */
static void on_broker_event(evutil_socket_t fd, short what, void *userdata)
{
        Manager *m = userdata;

        manager_lock(m);
        broker_process_events(m->broker);
        manager_unlock(m);
}

static void on_sigusr1(evutil_socket_t sig, short what, void *userdata)
{
        Manager *m = userdata;

        if (!m->opts.handover || !m->exe_path || !m->argv) {
                log_warning("SIGUSR1: re-executing is off (handover = no) or this daemon was not started "
                            "from a program path; ignored");
                return;
        }
        on_signal_stop(sig, what, userdata);
}

static void on_sighup(evutil_socket_t sig, short what, void *userdata)
{
        Manager *m = userdata;

        manager_lock(m);
        (void)manager_reload(m);
        manager_unlock(m);
}

static void on_watchdog(evutil_socket_t fd, short what, void *userdata)
{
        (void)sd_notify(0, "WATCHDOG=1");
}

int manager_reload(Manager *m)
{
        Options next;
        Policy *policy = NULL;
        char err[4096];
        int r;

        r = options_copy(&next, &m->opts);
        if (r < 0)
                return log_error_errno(r, "reload: out of memory");
        r = options_load_file(&next, m->opts.config_path ? m->opts.config_path : GPUMEMD_CONFIG_FILE,
                              m->opts.config_explicit, err, sizeof(err));
        {
                /* both readers, so the log lists every error of the file, as --check-config does */
                size_t used = strnlen(err, sizeof(err));
                int rp = policy_load(m->opts.config_path ? m->opts.config_path : GPUMEMD_CONFIG_FILE,
                                     m->opts.config_explicit, &policy, r < 0 ? err + used : err,
                                     r < 0 ? sizeof(err) - used : sizeof(err));
                if (r >= 0)
                        r = rp;
                else
                        policy = policy_free(policy);
        }
        if (r < 0) {
                options_done(&next);
                log_full(LOG_ERR, r, GM_MESSAGE_CONFIG_RELOAD, NULL,
                         "reload refused, the running configuration stays: %s", err);
                return r;
        }
        /* both parts are good: apply them together (options first: the policy's admin rights use them) */
        if (strcmp(next.socket_path, m->opts.socket_path) != 0 || next.socket_mode != m->opts.socket_mode ||
            strcmp(next.backend, m->opts.backend) != 0 ||
            strcmp(next.model_preset, m->opts.model_preset) != 0 ||
            next.model_kfd_minor != m->opts.model_kfd_minor ||
            (next.topology_root == NULL) != (m->opts.topology_root == NULL) ||
            (next.topology_root && strcmp(next.topology_root, m->opts.topology_root) != 0) ||
            next.worker_threads != m->opts.worker_threads || next.loops != m->opts.loops)
                log_notice("reload: socket, socket-mode, backend, model-preset, model-kfd-minor, topology, "
                           "worker-threads and loops changes take effect at the next start");
        if ((next.metrics_listen == NULL) != (m->opts.metrics_listen == NULL) ||
            (next.metrics_listen && strcmp(next.metrics_listen, m->opts.metrics_listen) != 0))
                log_notice("reload: metrics-listen changes take effect at the next start");
        /* Settings that apply at once: logging, caps, windows of new clients, administrators. */
        m->opts.log_level = next.log_level;
        m->opts.max_connections = next.max_connections;
        m->opts.max_connections_per_uid = next.max_connections_per_uid;
        /* read by the loops without the lock */
        WRITE_ONCE(m->opts.hello_timeout_sec, next.hello_timeout_sec);
        WRITE_ONCE(m->opts.send_timeout_sec, next.send_timeout_sec);
        m->opts.window_size = next.window_size;
        m->opts.max_window_bytes_per_uid = next.max_window_bytes_per_uid;
        m->opts.max_mappings = next.max_mappings;
        m->opts.max_mappings_per_uid = next.max_mappings_per_uid;
        m->opts.max_host_per_uid = next.max_host_per_uid;
        m->opts.max_event_threads_per_uid = next.max_event_threads_per_uid;
        set_client_limits(m);
        memcpy(m->opts.admin_gids, next.admin_gids, sizeof(next.admin_gids));
        m->opts.n_admin_gids = next.n_admin_gids;
        log_set_level(m->opts.log_level);
        classes_apply(m, policy);
        options_done(&next);
        log_full(LOG_NOTICE, 0, GM_MESSAGE_CONFIG_RELOAD, NULL, "configuration reloaded");
        return 0;
}

static int open_backend(Manager *m)
{
        const DriverBackend *b = driver_backend_find(m->opts.backend);
        char preset[PATH_MAX], err[512] = "";
        DriverOpenArgs a = {.topology_root = m->opts.topology_root,
                            .model_kfd_minor = m->opts.model_kfd_minor,
                            .max_listeners = m->opts.max_event_threads};
        int r;

        if (!b)
                return log_error_errno(-EINVAL, "no backend called '%s'", m->opts.backend);
        if (b->flags & DRIVER_BACKEND_PRESET) {
                r = options_preset_dir(&m->opts, preset, sizeof(preset));
                if (r < 0)
                        return log_error_errno(r, "model preset '%s' not found: %s", m->opts.model_preset,
                                               strerror(-r));
                a.topology_root = preset;
                const char *slash = strrchr(preset, '/');
                const char *name = slash ? slash + 1 : preset;
                size_t n = strnlen(name, sizeof(m->preset_name) - 1);
                memcpy(m->preset_name, name, n);
                m->preset_name[n] = '\0';
        }
        r = b->open(&a, &m->drv, err, sizeof(err));
        if (r < 0)
                log_error_errno(r, "cannot open the %s backend: %s", b->name, err[0] ? err : strerror(-r));
        /* no device node, or none behind it: a node without the GPU this backend serves (main() exits
         * with a status of its own, which the unit does not restart on) */
        if ((r == -ENOENT || r == -ENODEV) && !(b->flags & DRIVER_BACKEND_PRESET))
                return -ENODEV;
        return r < 0 ? r : 0;
}

/*
 * Testing hook of the model backend: with $GPUMEMD_MODEL_FAULTS_FILE set at start, SIGUSR2 reads that file
 * and arms the model's fault injection, so error paths in the middle of multi-step operations can be
 * driven from outside. Each line is "IOCTL NTH ERRNO" (IOCTL a name driver-kfd.c knows or a number, NTH 1 =
 * the next call, ERRNO positive); earlier faults are cleared first. Never armed with the kfd backend.
 */
static void on_sigusr2(evutil_socket_t sig, short what, void *userdata)
{
        Manager *m = userdata;
        const char *path = getenv("GPUMEMD_MODEL_FAULTS_FILE");
        char err[256] = "";
        int n;

        if (!path || !driver_has(m->drv, DRIVER_CAP_TEST_FAULTS))
                return;
        manager_lock(m);
        n = driver_test_faults(m->drv, path, err, sizeof(err));
        manager_unlock(m);
        if (n < 0) {
                log_warning_errno(n, "model faults: %s", err[0] ? err : strerror(-n));
                return;
        }
        log_notice("model faults armed: %d", n);
        (void)sd_notifyf(0, "STATUS=model faults armed: %d", n);
}

/*
 * Named shares live in one region of the aperture that no window holds, reserved in the daemon like a
 * window, so that every reader maps a share at the same VA. Without room for it the daemon runs without
 * shares and says so. Where the daemon before this one had it when that one handed shares over (@handed),
 * so that they lie where their readers map them.
 */
static void setup_shared_region(Manager *m, const Gpumemd__HandoverState *handed)
{
        uint64_t size = m->opts.shared_region_size, base = 0;
        int r = -ENOENT;

        if (size == 0)
                return;
        if (handed && handed->n_shares && handed->share_region_size == size && handed->share_region_base) {
                r = thunk_va_alloc_fixed(m->va, handed->share_region_base, size, m);
                if (r == 0)
                        base = handed->share_region_base;
        }
        if (r < 0)
                r = thunk_va_alloc(m->va, size, 1ull << 30, m, &base);
        if (r < 0) {
                log_warning("no room for the %llu GiB shared region in the aperture: no named shares",
                            (unsigned long long)(size >> 30));
                return;
        }
        if (map_at(base, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                   -1, 0) < 0) {
                (void)thunk_va_free(m->va, base);
                log_warning("cannot reserve the shared region at 0x%llx: no named shares",
                            (unsigned long long)base);
                return;
        }
        r = broker_share_region(m->broker, base, size);
        if (r < 0) {
                munmap((void *)(uintptr_t)base, size);
                (void)thunk_va_free(m->va, base);
                log_warning_errno(r, "cannot set up the shared region: %s", strerror(-r));
                return;
        }
        m->shared_base = base;
        m->shared_size = size;
        m->va_blocked++; /* never a window: not counted as one */
}

static int setup_va(Manager *m)
{
        uint64_t base, limit, start;
        int r;

        driver_svm_aperture(m->drv, &base, &limit);
        start = base > WINDOW_SPACE_START ? base : WINDOW_SPACE_START;
        start = (start + WINDOW_ALIGN - 1) & ~(WINDOW_ALIGN - 1);
        if (limit <= start || limit - start + 1 < m->opts.window_size)
                return log_error_errno(-ERANGE,
                                       "the SVM aperture 0x%llx-0x%llx has no room for client windows",
                                       (unsigned long long)base, (unsigned long long)limit);
        r = thunk_va_space_new(start, ((limit + 1) & ~(WINDOW_ALIGN - 1)) - start, WINDOW_ALIGN, &m->va);
        if (r < 0)
                return log_error_errno(r, "cannot set up the VA space: %s", strerror(-r));
        r = window_space_init(m->va);
        if (r < 0)
                return log_error_errno(r, "cannot read the daemon's own mappings: %s", strerror(-r));
        m->va_blocked = thunk_va_space_count(m->va);

        /* the low space, below the first: only what the aperture has of it */
        start = base > WINDOW_LOW_START ? base : WINDOW_LOW_START;
        start = (start + WINDOW_ALIGN - 1) & ~(WINDOW_ALIGN - 1);
        if (start < WINDOW_SPACE_START && limit > start &&
            thunk_va_space_new(start, WINDOW_SPACE_START - start, WINDOW_ALIGN, &m->va_low) == 0) {
                r = window_space_init(m->va_low);
                if (r < 0)
                        return log_error_errno(r, "cannot read the daemon's own mappings: %s", strerror(-r));
                m->va_low_blocked = thunk_va_space_count(m->va_low);
        }
        return 0;
}

/* Loops to run: the option, or one per CPU this process may use. */
static unsigned loops_wanted(const Options *o)
{
        cpu_set_t set;
        unsigned n = o->loops;

        if (n == 0)
                n = sched_getaffinity(0, sizeof(set), &set) == 0 ? (unsigned)CPU_COUNT(&set) : 1;
        return n < 1 ? 1 : n > MANAGER_MAX_LOOPS ? MANAGER_MAX_LOOPS : n;
}

/*
 * The main loop's base. Its timers use the precise monotonic clock: it times the deadlines of shard 0's
 * loop, which that loop's heap holds against CLOCK_MONOTONIC; the coarse clock would fire them up to a tick
 * early, for nothing.
 */
static struct event_base *main_base_new(void)
{
        struct event_config *cfg = event_config_new();
        struct event_base *base;

        if (!cfg)
                return NULL;
        (void)event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
        base = event_base_new_with_config(cfg);
        event_config_free(cfg);
        return base;
}

/* Shard 0's loop runs its events from the main loop's base; the others on threads of their own. */
static int shard_init(Manager *m, Shard *sh, unsigned index)
{
        int r;

        sh->m = m;
        sh->index = index;
        r = loop_new(index == 0 ? m->base : NULL, &sh->loop);
        if (r < 0)
                return r;
        sh->metrics = calloc(1, sizeof(*sh->metrics));
        sh->rx_buf = malloc(GM_FRAME_MAX);
        sh->tx_buf = malloc(GM_FRAME_MAX);
        if (!sh->metrics || !sh->rx_buf || !sh->tx_buf || arena_init(&sh->req_arena, 64 * 1024) < 0)
                return -ENOMEM;
        r = loop_timer_init(&sh->drain_timer, sh->loop, on_drain_tick, sh);
        if (r < 0)
                return r;
        if (m->workers) {
                r = worker_home_new(m->workers, sh->loop, &sh->home);
                if (r < 0)
                        return r;
        }
        return 0;
}

static void shard_done(Shard *sh)
{
        loop_timer_done(&sh->drain_timer);
        free(sh->metrics);
        free(sh->rx_buf);
        free(sh->tx_buf);
        arena_done(&sh->req_arena);
        sh->loop = loop_free(sh->loop);
}

/* The manager alone: its lock, its settings, its clocks and the main loop's base. */
static int manager_alloc(const Options *opts, Manager **ret)
{
        pthread_mutexattr_t attr;
        Manager *m;
        int r;

        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->listen_fd = -1;
        for (size_t i = 0; i < ARRAY_SIZE(m->fd_reserve); i++)
                m->fd_reserve[i] = -1;
        m->conn_host = &conn_host;
        /* recursive: a transport tells of a peer gone from inside a send, which may be made with the lock
         * held (a reply) or without it (a ping's) */
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&m->lock, &attr);
        pthread_mutexattr_destroy(&attr);
        m->conn_log_rl = (LogRatelimit)LOG_RATELIMIT_INIT(100, 20);
        r = options_copy(&m->opts, opts);
        if (r < 0) {
                pthread_mutex_destroy(&m->lock);
                free(m);
                return r;
        }
        m->started_mono_usec = now_usec(CLOCK_MONOTONIC);
        m->started_real_usec = now_usec(CLOCK_REALTIME);
        *ret = m;
        m->base = main_base_new();
        return m->base ? 0 : -ENOMEM;
}

/*
 * What clients' objects may cost in entries of the daemon's memory map: max-mappings (by default half of
 * vm.max_map_count, the other half the daemon's own: its libraries, threads, the windows' reservations and
 * the model's), and of one uid max-mappings-per-uid (an eighth of that). Over the kernel's limit every mmap
 * of the daemon fails, another tenant's allocation and the next connection's as much as the offender's.
 * And the host memory of one uid (max-host-per-uid), over all its classes.
 */
static void set_client_limits(Manager *m)
{
        _cleanup_fclose_ FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
        unsigned long long kernel = MANAGER_MAP_COUNT_DEFAULT, own;
        uint64_t total, per_uid;

        /* the kernel's default only when the limit cannot be read: a lower one set by the node is the one
         * every mmap of the daemon meets */
        if (!f || fscanf(f, "%llu", &kernel) != 1 || kernel < 2)
                kernel = MANAGER_MAP_COUNT_DEFAULT;
        own = kernel / 2 < MANAGER_OWN_MAPPINGS ? kernel / 2 : MANAGER_OWN_MAPPINGS;
        total = m->opts.max_mappings ? m->opts.max_mappings : kernel / 2;
        if (total > kernel - own) {
                log_warning(
                        "max-mappings %llu leaves the daemon less than %llu of vm.max_map_count %llu: %llu "
                        "used",
                        (unsigned long long)total, own, kernel, kernel - own);
                total = kernel - own;
        }
        per_uid = m->opts.max_mappings_per_uid ? m->opts.max_mappings_per_uid : total / 8;
        broker_set_mapping_limits(m->broker, total, per_uid > total ? total : per_uid);
        broker_set_host_per_uid(m->broker, m->opts.max_host_per_uid ? m->opts.max_host_per_uid : UINT64_MAX);
        uint32_t threads = m->opts.max_event_threads ? m->opts.max_event_threads : DRIVER_MAX_LISTENERS;
        uint32_t threads_uid =
                m->opts.max_event_threads_per_uid ? m->opts.max_event_threads_per_uid : threads / 4;
        broker_set_listeners_per_uid(m->broker, threads_uid ? threads_uid : 1);
}

/* The device and what the daemon keeps of it: the backend, the topology reply, the VA space, the broker. */
static int open_device(Manager *m)
{
        int r;

        r = open_backend(m);
        if (r < 0)
                return r;
        r = op_topology_prepare(m);
        if (r < 0)
                return log_error_errno(r, "cannot pack the topology reply: %s", strerror(-r));
        r = setup_va(m);
        if (r < 0)
                return r;
        r = broker_new(m->drv, &m->broker);
        if (r < 0)
                return r;
        set_client_limits(m);
        return 0;
}

static void drop_job_run(WorkerJob *j)
{
        broker_drop_run((BrokerDrop *)j);
}

static void drop_job_done(WorkerJob *j)
{
        free(j);
}

/*
 * Large memory a client freed, or left behind, is released on a worker, the client's uid its flow: its loop
 * (whichever it is that freed it) serves the others meanwhile. Once the workers have stopped (at the end),
 * here.
 */
static void manager_drop(void *arg, BrokerDrop *d, uint64_t flow)
{
        Manager *m = arg;

        for (unsigned i = 0; m->workers && i < m->n_shards; i++)
                if (m->shards[i].home && loop_is_current(m->shards[i].loop)) {
                        d->job = (WorkerJob){.run = drop_job_run, .done = drop_job_done, .flow = flow};
                        worker_submit(m->workers, m->shards[i].home, &d->job);
                        return;
                }
        broker_drop_run(d);
        free(d);
}

/*
 * The worker threads and the event loops, not started yet. Shard 0 is the main loop (listener, signals, the
 * daemon's timers, the HTTP exposition); the clients are served by the loops after it, each on a thread of
 * its own, so none of them waits behind the main loop's work and each waits on its own epoll set alone.
 */
static int setup_loops(Manager *m)
{
        int r;

        if (m->opts.worker_threads) {
                r = worker_pool_new(m->opts.worker_threads, &m->workers);
                if (r < 0)
                        return log_error_errno(r, "cannot start %u worker threads: %s",
                                               m->opts.worker_threads, strerror(-r));
        }
        m->n_shards = loops_wanted(&m->opts) + 1;
        m->shards = calloc(m->n_shards, sizeof(*m->shards));
        if (!m->shards)
                return -ENOMEM;
        for (unsigned i = 0; i < m->n_shards; i++) {
                r = shard_init(m, &m->shards[i], i);
                if (r < 0)
                        return log_error_errno(r, "cannot set up event loop %u: %s", i, strerror(-r));
        }
        if (m->workers)
                broker_set_dropper(m->broker, manager_drop, m);
        return 0;
}

static int load_policy(Manager *m)
{
        Policy *policy = NULL;
        char err[4096] = "";
        int r;

        r = policy_load(m->opts.config_path ? m->opts.config_path : GPUMEMD_CONFIG_FILE,
                        m->opts.config_explicit, &policy, err, sizeof(err));
        if (r < 0)
                return log_error_errno(r, "the policy cannot be loaded: %s", err);
        classes_apply(m, policy);
        return 0;
}

/* The listening socket (passed by socket activation, handed over by the daemon before, or bound here), and
 * the metrics' listener when one is asked for. */
static int setup_listeners(Manager *m, const Gpumemd__HandoverState *handed, HandoverFds *passed)
{
        int r = listener_open(m, handed, passed);

        if (r < 0)
                return r;
        return m->opts.metrics_listen ? metrics_listen(m, m->opts.metrics_listen) : 0;
}

/* The main loop's events: where each is kept, and whether it waits from the start (the timers do not). */
typedef struct MainEvent {
        struct event **ev;
        evutil_socket_t fd; /* a socket, a signal's number, or -1 for a timer */
        short what;
        event_callback_fn cb;
        bool add;
} MainEvent;

static int main_events_add(Manager *m, const MainEvent *evs, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                *evs[i].ev = event_new(m->base, evs[i].fd, evs[i].what, evs[i].cb, m);
                if (!*evs[i].ev || (evs[i].add && event_add(*evs[i].ev, NULL) < 0))
                        return -ENOMEM;
        }
        return 0;
}

static int setup_main_events(Manager *m)
{
        const short sig = EV_SIGNAL | EV_PERSIST;
        const MainEvent evs[] = {
                {&m->sigterm_ev, SIGTERM, sig, on_signal_stop, true},
                {&m->sigint_ev, SIGINT, sig, on_signal_stop, true},
                {&m->sighup_ev, SIGHUP, sig, on_sighup, true},
                {&m->sigusr1_ev, SIGUSR1, sig, on_sigusr1, true},
                {&m->broker_ev, broker_event_fd(m->broker), EV_READ | EV_PERSIST, on_broker_event, true},
                {&m->reap_ev, -1, 0, on_reap, false},
                {&m->status_ev, -1, 0, on_status_timer, false},
        };
        const MainEvent faults = {&m->sigusr2_ev, SIGUSR2, sig, on_sigusr2, true};
        int r;

        r = main_events_add(m, evs, ARRAY_SIZE(evs));
        if (r >= 0)
                r = listener_start(m);
        if (r < 0)
                return r;
        if (driver_has(m->drv, DRIVER_CAP_TEST_FAULTS) && getenv("GPUMEMD_MODEL_FAULTS_FILE"))
                return main_events_add(m, &faults, 1);
        return 0;
}

static void main_events_free(Manager *m)
{
        struct event **evs[] = {
                &m->sigterm_ev,  &m->sigint_ev, &m->sighup_ev, &m->sigusr1_ev, &m->sigusr2_ev,
                &m->watchdog_ev, &m->broker_ev, &m->reap_ev,   &m->status_ev,
        };

        for (size_t i = 0; i < ARRAY_SIZE(evs); i++)
                if (*evs[i]) {
                        event_free(*evs[i]);
                        *evs[i] = NULL;
                }
}

/* Hold the fd reserve (eventfds: no file, no device, nothing the sandbox must allow). */
static void fd_reserve_take(Manager *m)
{
        for (size_t i = 0; i < ARRAY_SIZE(m->fd_reserve); i++)
                if (m->fd_reserve[i] < 0)
                        m->fd_reserve[i] = eventfd(0, EFD_CLOEXEC);
}

static void fd_reserve_release(Manager *m)
{
        for (size_t i = 0; i < ARRAY_SIZE(m->fd_reserve); i++)
                m->fd_reserve[i] = safe_close(m->fd_reserve[i]);
}

/* The program's path, for a re-exec: replaced by an upgrade, the re-exec runs the new program at that path.
 */
static void remember_exe_path(Manager *m)
{
        char path[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);

        if (n <= 0)
                return;
        path[n] = '\0';
        if (n > 10 && strcmp(path + n - 10, " (deleted)") == 0)
                path[n - 10] = '\0';
        m->exe_path = strdup(path);
}

/* The client loops run from now on: nothing reaches them before the listener accepts. */
static int start_loops(Manager *m)
{
        for (unsigned i = 1; i < m->n_shards; i++) {
                int r = loop_start(m->shards[i].loop);
                if (r < 0)
                        return log_error_errno(r, "cannot start event loop %u: %s", i, strerror(-r));
        }
        return 0;
}

int manager_new(Manager **ret, const Options *opts)
{
        Gpumemd__HandoverState *handed = NULL;
        HandoverFds passed = {0};
        Manager *m = NULL;
        int r;

        r = manager_alloc(opts, &m);
        if (r < 0)
                goto fail;
        r = open_device(m);
        if (r < 0)
                goto fail;
        /* what a daemon before this one handed over: the state first, for where its shares lie */
        r = take_passed_fds(m, &passed);
        if (r < 0)
                goto fail;
        handed = carry_read_state(&passed);
        /* after the passed fds, which sit at 3, 4, ... until taken */
        fd_reserve_take(m);
        setup_shared_region(m, handed);
        r = setup_loops(m);
        if (r < 0)
                goto fail;
        r = load_policy(m);
        if (r < 0)
                goto fail;
        r = setup_listeners(m, handed, &passed);
        if (r < 0)
                goto fail;
        r = setup_main_events(m);
        if (r < 0)
                goto fail;
        /* the clients a daemon before this one handed over, back on their loops before those start */
        carry_restore(m, &carry_host, TAKE_PTR(handed), &passed);
        for (size_t i = 0; i < m->n_passed_names; i++)
                (void)handover_store_remove(m->passed_names[i]);
        remember_exe_path(m);
        r = start_loops(m);
        if (r < 0)
                goto fail;
        *ret = m;
        return 0;
fail:
        if (handed)
                gpumemd__handover_state__free_unpacked(handed, NULL);
        handover_fds_done(&passed);
        manager_free(m);
        return r;
}

/* Work the loops had been handed and not run, run here once they stopped; it may hand on more. */
static void run_pending(Manager *m)
{
        bool ran;

        do {
                ran = false;
                for (unsigned i = 0; i < m->n_shards; i++)
                        if (m->shards[i].loop)
                                ran |= loop_run_pending(m->shards[i].loop);
        } while (ran);
}

Manager *manager_free(Manager *m)
{
        if (!m)
                return NULL;
        /* the other loops first: from here everything runs on this thread */
        for (unsigned i = 1; i < m->n_shards; i++)
                loop_stop(m->shards[i].loop);
        manager_lock(m);
        m->freeing = true; /* from here teardowns finish at once */
        manager_unlock(m);
        run_pending(m);
        /* then the work in progress: its requests end (their connections may be freed then) */
        m->workers = worker_pool_free(m->workers);
        run_pending(m);
        manager_lock(m);
        /* the dying first: one whose peer went may still be in the list too (it leaves it when freed) */
        for (unsigned i = 0; i < m->n_shards; i++)
                while (m->shards[i].dying) {
                        Conn *c = m->shards[i].dying;
                        m->shards[i].dying = c->dying_next;
                        conn_free(c);
                }
        while (m->conns)
                conn_free(m->conns);
        manager_unlock(m);
        main_events_free(m);
        while (m->reapers) {
                Reaper *r = m->reapers;
                m->reapers = r->next;
                reaper_finish(r);
        }
        listener_close(m);
        if (m->http)
                evhttp_free(m->http);
        classes_free_all(m);
        broker_free(m->broker);
        if (m->shared_size)
                munmap((void *)(uintptr_t)m->shared_base, m->shared_size);
        thunk_va_space_free(m->va);
        thunk_va_space_free(m->va_low);
        m->drv = driver_close(m->drv);
        if (m->shards) {
                for (unsigned i = 0; i < m->n_shards; i++)
                        shard_done(&m->shards[i]);
                free(m->shards);
        }
        if (m->base)
                event_base_free(m->base); /* after shard 0's loop, which it hosted */
        free(m->topology_reply[0]);
        free(m->topology_reply[1]);
        for (size_t i = 0; i < m->n_topology_files; i++) {
                free(m->topology_files[i].path);
                free(m->topology_files[i].content);
        }
        free(m->topology_files);
        if (m->carried) {
                handover_fds_done(m->carried);
                free(m->carried);
        }
        fd_reserve_release(m);
        free(m->exe_path);
        free(m->passed_names);
        options_done(&m->opts);
        pthread_mutex_destroy(&m->lock);
        free(m);
        return NULL;
}

/* The loops stopped: what goes to the next daemon. Whatever fails, the clients are closed as at a plain stop.
 */
static void collect_handover(Manager *m)
{
        HandoverFds *fds = calloc(1, sizeof(*fds));
        int r = fds ? 0 : -ENOMEM;

        for (unsigned i = 1; i < m->n_shards; i++)
                loop_stop(m->shards[i].loop);
        run_pending(m);
        /* room for what the hand-over opens, however full clients made the fd table */
        fd_reserve_release(m);
        manager_lock(m);
        if (r == 0)
                r = carry_collect(m, &carry_host, fds);
        manager_unlock(m);
        if (r < 0) {
                log_error_errno(r, "cannot hand anything over, the clients are closed: %s", strerror(-r));
                /* a re-exec still runs the program again, with nothing handed over */
                if (fds && m->handover == MANAGER_HANDOVER_EXEC) {
                        m->carried = fds;
                        return;
                }
                free(fds);
                m->handover = MANAGER_HANDOVER_NONE;
                return;
        }
        m->carried = fds;
}

int manager_run(Manager *m)
{
        uint64_t wd_usec = 0;

        if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
                struct timeval tv = {(time_t)(wd_usec / 2 / 1000000), (suseconds_t)(wd_usec / 2 % 1000000)};
                m->watchdog_ev = event_new(m->base, -1, EV_PERSIST, on_watchdog, m);
                if (m->watchdog_ev)
                        event_add(m->watchdog_ev, &tv);
        }
        log_full(LOG_INFO, 0, GM_MESSAGE_STARTED, NULL,
                 "gpumemd %s serving on %s (%s backend%s%s, %zu %sGPUs)", GPUMEMD_VERSION,
                 m->listen_bound ? m->opts.socket_path : "the activated socket", driver_name(m->drv),
                 m->preset_name[0] ? ", preset " : "", m->preset_name, driver_gpu_count(m->drv),
                 m->preset_name[0] ? "SIMULATED " : "");
        /* Ready only now: the backend is open, topology and VM are up, the socket listens. */
        (void)sd_notify(0, "READY=1");
        on_status_timer(-1, 0, m);
        event_base_dispatch(m->base);
        if (m->handover != MANAGER_HANDOVER_NONE)
                collect_handover(m);
        log_full(LOG_INFO, 0, GM_MESSAGE_STOPPED, NULL,
                 m->carried ? "gpumemd stopped, its clients handed over" : "gpumemd stopped");
        return m->exit_code;
}

void manager_set_argv(Manager *m, char **argv)
{
        m->argv = argv;
}

int manager_take_handover(Manager *m, HandoverFds *ret)
{
        *ret = (HandoverFds){0};
        if (!m->carried)
                return MANAGER_HANDOVER_NONE;
        *ret = *m->carried;
        *m->carried = (HandoverFds){0};
        return m->handover;
}
