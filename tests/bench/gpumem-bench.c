/* gpumemd benchmarks: broker round trips against the raw SOCK_SEQPACKET floor, throughput, isolation, scale,
 * a million live allocations under 20,000 fds. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "thunk.h"
#include "vaman.h"
#include "wire.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

/* SVM attribute and location values of the KFD ABI (kfd_ioctl.h), used for the in-process calls. */
#define SVM_ATTR_PREFERRED_LOC 0
#define SVM_ATTR_ACCESS        2
#define SVM_ATTR_SET_FLAGS     5
#define SVM_FLAG_HOST_ACCESS   0x1

/* ---- settings and results ------------------------------------------------------------------------------ */

typedef struct Settings {
        const char *gpumemd;
        const char *preset;
        const char *json_path;
        bool long_run;
        size_t floor_iters;  /* ping-pong iterations per floor */
        size_t op_iters;     /* iterations per single-round-trip broker op */
        size_t seq_iters;    /* iterations of multi-round-trip sequences */
        double tput_seconds; /* per throughput point */
        size_t scale_small;  /* live allocations, small point */
        size_t scale_big;    /* live allocations, large point */
        size_t idle_conns;
        size_t many_small;              /* live allocations, small point of the fd-limited run */
        size_t many_big;                /* live allocations, large point */
        unsigned long long many_nofile; /* the daemon's RLIMIT_NOFILE in that run */
        int cpu_a, cpu_b; /* latency CPU, and the other CPU (== cpu_a on a single-CPU machine) */
        cpu_set_t all_cpus;
} Settings;

typedef struct Lat {
        size_t n;
        double p50_us, p99_us, mean_us;
        double ops_per_s; /* one iteration per operation, back to back */
} Lat;

typedef struct Row {
        char section[24];
        char name[48];
        unsigned rtts; /* round trips per iteration */
        bool fd;       /* the reply carries an fd */
        Lat pinned, unpinned;
        char floor[32]; /* floor row the ratios use */
        double ratio_p50, ratio_p99;
} Row;

typedef struct Target {
        char what[96];
        char measured[64];
        double ratio, limit;
        bool higher_is_better;
        bool met;
} Target;

typedef struct Report {
        Row rows[64];
        size_t n_rows;
        Target targets[32];
        size_t n_targets;
        /* throughput */
        unsigned tput_clients[4];
        double tput_gpumemd[4], tput_raw[4];
        size_t n_tput;
        /* slow-op isolation */
        Lat iso_idle, iso_loaded;
        double iso_bg_ops_per_s[2], iso_bg_mean_ms[2];
        /* scaling */
        size_t scale_small, scale_big, scale_reached, scale_want;
        char scale_note[256];
        double scale_fill_seconds, scale_teardown_seconds;
        Row scale_rows[8];
        size_t n_scale_rows;
        unsigned long long daemon_nofile;
        /* many live allocations under a low fd limit */
        bool many_ran;
        size_t many_small, many_want, many_reached;
        unsigned long long many_nofile;
        double many_fill_small_us, many_fill_big_us; /* wall time per allocation while filling */
        double many_fill_seconds, many_teardown_seconds;
        int many_fds_small, many_fds_big;        /* the daemon's open fds at each point */
        long many_rss_small_kb, many_rss_big_kb; /* its RSS */
        char many_note[256];
        Row many_rows[8];
        size_t n_many_rows;
        /* idle connections */
        size_t idle_n, idle_want;
        long idle_rss_before_kb, idle_rss_after_kb, idle_slab_delta_kb;
        double idle_bytes_per_conn, idle_slab_per_conn;
        char idle_note[256];
        /* frame sizes */
        size_t sz_ping_req, sz_ping_rep, sz_topo_req, sz_topo_rep, sz_export_rep;
} Report;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        fputs("gpumem-bench: ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        exit(1);
}

static uint64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* Sorts @s. */
static Lat lat_of(uint64_t *s, size_t n)
{
        Lat l = {.n = n};
        double sum = 0;

        if (n == 0)
                return l;
        qsort(s, n, sizeof(*s), cmp_u64);
        for (size_t i = 0; i < n; i++)
                sum += (double)s[i];
        l.p50_us = (double)s[n / 2] / 1e3;
        l.p99_us = (double)s[(size_t)((double)(n - 1) * 0.99)] / 1e3;
        l.mean_us = sum / (double)n / 1e3;
        l.ops_per_s = sum > 0 ? (double)n / (sum / 1e9) : 0;
        return l;
}

static Row *add_row(Report *r, const char *section, const char *name, unsigned rtts, bool fd)
{
        Row *w;

        if (r->n_rows >= sizeof(r->rows) / sizeof(r->rows[0]))
                die("too many result rows");
        w = &r->rows[r->n_rows++];
        memset(w, 0, sizeof(*w));
        snprintf(w->section, sizeof(w->section), "%s", section);
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->rtts = rtts;
        w->fd = fd;
        return w;
}

static const Row *find_row(const Report *r, const char *section, const char *name)
{
        for (size_t i = 0; i < r->n_rows; i++)
                if (strcmp(r->rows[i].section, section) == 0 && strcmp(r->rows[i].name, name) == 0)
                        return &r->rows[i];
        return NULL;
}

static void add_target(Report *r, const char *what, const char *measured, double ratio, double limit,
                       bool higher_is_better)
{
        Target *t = &r->targets[r->n_targets++];

        snprintf(t->what, sizeof(t->what), "%s", what);
        snprintf(t->measured, sizeof(t->measured), "%s", measured);
        t->ratio = ratio;
        t->limit = limit;
        t->higher_is_better = higher_is_better;
        t->met = !isnan(ratio) && (higher_is_better ? ratio >= limit : ratio <= limit);
}

/* ---- CPU placement ------------------------------------------------------------------------------------- */

static void set_affinity_tid(pid_t tid, const cpu_set_t *set)
{
        (void)sched_setaffinity(tid, sizeof(*set), set);
}

static void pin_self(int cpu)
{
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        set_affinity_tid(0, &s);
}

static void unpin_self(const Settings *st)
{
        set_affinity_tid(0, &st->all_cpus);
}

/* Every thread of @pid, as taskset -a does. */
static void place_process(pid_t pid, const cpu_set_t *set)
{
        char path[64];
        struct dirent *e;
        DIR *dir;

        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        dir = opendir(path);
        if (!dir) {
                set_affinity_tid(pid, set);
                return;
        }
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.')
                        set_affinity_tid((pid_t)atoi(e->d_name), set);
        closedir(dir);
}

/* The event loop (the main thread) on @loop_cpu, every other thread of @pid (its workers) on @others_cpu. */
static void pin_loop_apart(pid_t pid, int loop_cpu, int others_cpu)
{
        char path[64];
        struct dirent *e;
        cpu_set_t a, b;
        DIR *dir;

        CPU_ZERO(&a);
        CPU_SET(loop_cpu, &a);
        CPU_ZERO(&b);
        CPU_SET(others_cpu, &b);
        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        dir = opendir(path);
        if (!dir) {
                set_affinity_tid(pid, &a);
                return;
        }
        /* the main thread and the other event loops ("gpumemd-loop") on @loop_cpu, the worker threads
         * ("gpumemd-work") on @others_cpu */
        while ((e = readdir(dir))) {
                char comm_path[sizeof(path) + 280], comm[32] = "";
                FILE *f;
                if (e->d_name[0] == '.')
                        continue;
                snprintf(comm_path, sizeof(comm_path), "%s/%s/comm", path, e->d_name);
                f = fopen(comm_path, "re");
                if (f) {
                        if (!fgets(comm, sizeof(comm), f))
                                comm[0] = '\0';
                        fclose(f);
                }
                set_affinity_tid((pid_t)atoi(e->d_name), strncmp(comm, "gpumemd-work", 12) == 0 ? &b : &a);
        }
        closedir(dir);
}

static void pin_process(pid_t pid, int cpu)
{
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        place_process(pid, &s);
}

/* ---- the daemon ---------------------------------------------------------------------------------------- */

typedef struct Daemon {
        pid_t pid;
        char dir[32];
        char sock[96];
        char notify[96];
        int notify_fd;
} Daemon;

static unsigned long long nofile_max(void)
{
        unsigned long long v = 0;
        FILE *f = fopen("/proc/sys/fs/nr_open", "re");

        if (f) {
                if (fscanf(f, "%llu", &v) != 1)
                        v = 0;
                fclose(f);
        }
        return v ? v : 1048576;
}

/* Raise this process's fd limit as far as allowed (inherited by what it execs). */
static unsigned long long raise_nofile(void)
{
        struct rlimit rl;
        unsigned long long want = nofile_max();

        rl.rlim_cur = rl.rlim_max = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        return (unsigned long long)rl.rlim_cur;
}

/* Start gpumemd with @config_text (NULL: none) and RLIMIT_NOFILE @nofile (soft and hard; 0: as high as this
 * process may raise it). */
static int daemon_start(Daemon *d, const Settings *st, const char *config_text, unsigned long long nofile)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        char conf[160] = "/dev/null";
        uint64_t deadline;

        memset(d, 0, sizeof(*d));
        d->notify_fd = -1;
        snprintf(d->dir, sizeof(d->dir), "/tmp/gpumem-bench-XXXXXX");
        if (!mkdtemp(d->dir))
                return -errno;
        snprintf(d->sock, sizeof(d->sock), "%s/gpumemd.sock", d->dir);
        snprintf(d->notify, sizeof(d->notify), "%s/notify", d->dir);
        if (config_text) {
                FILE *f;
                snprintf(conf, sizeof(conf), "%s/gpumemd.conf", d->dir);
                f = fopen(conf, "we");
                if (!f)
                        return -errno;
                fputs(config_text, f);
                fclose(f);
        }
        d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (d->notify_fd < 0)
                return -errno;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->notify);
        if (bind(d->notify_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                return -errno;

        d->pid = fork();
        if (d->pid < 0)
                return -errno;
        if (d->pid == 0) {
                if (nofile) {
                        /* the hard limit too: gpumemd raises its soft limit to the hard one */
                        struct rlimit rl = {.rlim_cur = nofile, .rlim_max = nofile};
                        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                                _exit(126);
                } else {
                        (void)raise_nofile();
                }
                set_affinity_tid(0, &st->all_cpus);
                setenv("NOTIFY_SOCKET", d->notify, 1);
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_PID");
                execl(st->gpumemd, st->gpumemd, "--socket", d->sock, "--config", conf, "--log-level",
                      "warning", "--backend", "model", "--model-preset", st->preset, (char *)NULL);
                _exit(127);
        }
        deadline = now_ns() + 20ull * 1000000000ull;
        for (;;) {
                struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
                char buf[1024];
                ssize_t n;

                if (poll(&p, 1, 50) > 0) {
                        n = recv(d->notify_fd, buf, sizeof(buf) - 1, 0);
                        if (n > 0) {
                                buf[n] = '\0';
                                if (strstr(buf, "READY=1")) {
                                        /* Nobody reads it from now on: gone, it cannot fill up and block
                                         * the daemon's later STATUS= messages. */
                                        close(d->notify_fd);
                                        d->notify_fd = -1;
                                        unlink(d->notify);
                                        return 0;
                                }
                        }
                }
                if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
                        d->pid = 0;
                        return -ECHILD;
                }
                if (now_ns() > deadline)
                        return -ETIMEDOUT;
        }
}

static void daemon_kill(Daemon *d)
{
        char cmd[128];

        if (d->pid > 0) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, NULL, 0);
                d->pid = 0;
        }
        if (d->notify_fd >= 0)
                close(d->notify_fd);
        d->notify_fd = -1;
        if (d->dir[0]) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
                (void)!system(cmd);
                d->dir[0] = '\0';
        }
}

static long proc_status_kb(pid_t pid, const char *key)
{
        char path[64], line[256];
        size_t kl = strlen(key);
        long v = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
                        v = strtol(line + kl + 1, NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

static long meminfo_kb(const char *key)
{
        char line[256];
        size_t kl = strlen(key);
        long v = -1;
        FILE *f = fopen("/proc/meminfo", "re");

        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
                        v = strtol(line + kl + 1, NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

static unsigned long long proc_nofile(pid_t pid)
{
        char path[64], line[256];
        unsigned long long v = 0;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, "Max open files", 14) == 0) {
                        v = strtoull(line + 14, NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

/* Open fds of @pid, -1 if they cannot be read. */
static int proc_fd_count(pid_t pid)
{
        char path[64];
        struct dirent *e;
        DIR *dir;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
        dir = opendir(path);
        if (!dir)
                return -1;
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(dir);
        return n;
}

/* ---- raw protocol (frame sizes, idle connections) ------------------------------------------------------ */

static int raw_connect(const char *path)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        if (fd < 0)
                return -errno;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

/* Send @req with request id 1; receive the reply packet. Returns the request packet length via
 * @ret_req_len, the reply's length, or a negative errno (also for a failed status). */
static ssize_t raw_call(int fd, const Gpumem__Request *req, size_t *ret_req_len)
{
        static uint8_t buf[GM_FRAME_MAX];
        uint8_t hdr[GM_FRAME_HDR_SIZE];
        int fds[GM_FRAME_MAX_FDS];
        size_t len = gpumem__request__get_packed_size(req), n_fds = 0;
        Gpumem__Reply *reply;
        GmFrameHdr h;
        ssize_t n;
        int r;

        if (len > sizeof(buf))
                return -EMSGSIZE;
        gpumem__request__pack(req, buf);
        gm_frame_hdr_encode(hdr, GM_PROTOCOL_VERSION, 1, (uint32_t)len, 0);
        r = gm_wire_send(fd, hdr, sizeof(hdr), buf, len, NULL, 0, 0);
        if (r < 0)
                return r;
        if (ret_req_len)
                *ret_req_len = GM_FRAME_HDR_SIZE + len;
        n = gm_wire_recv(fd, buf, sizeof(buf), fds, &n_fds, 0);
        if (n <= 0)
                return n == 0 ? -ECONNRESET : n;
        gm_wire_close_fds(fds, n_fds);
        if (gm_frame_parse(buf, (size_t)n, n_fds, GM_PROTOCOL_VERSION, &h, NULL) < 0)
                return -EPROTO;
        reply = gpumem__reply__unpack(NULL, h.body_len, buf + GM_FRAME_HDR_SIZE);
        if (!reply || !reply->status) {
                if (reply)
                        gpumem__reply__free_unpacked(reply, NULL);
                return -EBADMSG;
        }
        r = reply->status->code;
        gpumem__reply__free_unpacked(reply, NULL);
        return r < 0 ? r : n;
}

static int raw_hello(int fd, uint64_t window_size)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Hello h = GPUMEM__HELLO__INIT;
        ssize_t n;

        h.has_protocol_version = true;
        h.protocol_version = GM_PROTOCOL_VERSION;
        h.client_name = "bench";
        h.has_window_size = window_size != 0;
        h.window_size = window_size;
        req.op_case = GPUMEM__REQUEST__OP_HELLO;
        req.hello = &h;
        n = raw_call(fd, &req, NULL);
        return n < 0 ? (int)n : 0;
}

/* The packet sizes gpumemd uses for the small ops, measured on the wire, so the floor sends the same. */
static int measure_frame_sizes(Report *rep, const char *sock)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Ping ping = GPUMEM__PING__INIT;
        Gpumem__TopologyGet tg = GPUMEM__TOPOLOGY_GET__INIT;
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status status = GPUMEM__STATUS__INIT;
        Gpumem__DmabufExportReply er = GPUMEM__DMABUF_EXPORT_REPLY__INIT;
        int fd = raw_connect(sock);
        ssize_t n;

        if (fd < 0)
                return fd;
        if (raw_hello(fd, 0) < 0) {
                close(fd);
                return -EPROTO;
        }
        ping.has_cookie = true;
        ping.cookie = 0x676d;
        req.op_case = GPUMEM__REQUEST__OP_PING;
        req.ping = &ping;
        n = raw_call(fd, &req, &rep->sz_ping_req);
        if (n < 0)
                goto fail;
        rep->sz_ping_rep = (size_t)n;
        tg.has_with_properties = true;
        tg.with_properties = false;
        req.op_case = GPUMEM__REQUEST__OP_TOPOLOGY;
        req.topology = &tg;
        n = raw_call(fd, &req, &rep->sz_topo_req);
        if (n < 0)
                goto fail;
        rep->sz_topo_rep = (size_t)n;
        close(fd);
        /* the export reply as the daemon builds it (status 0, fd index, size) */
        status.has_code = true;
        status.reason = "";
        er.has_fd_index = er.has_size = true;
        er.size = 2 * MIB;
        reply.status = &status;
        reply.result_case = GPUMEM__REPLY__RESULT_DMABUF_EXPORT;
        reply.dmabuf_export = &er;
        rep->sz_export_rep = GM_FRAME_HDR_SIZE + gpumem__reply__get_packed_size(&reply);
        return 0;
fail:
        close(fd);
        return (int)n;
}

/* ---- the floor: raw SOCK_SEQPACKET ping-pong ----------------------------------------------------------- */

static ssize_t recv_packet(int fd, void *buf, size_t cap, int *ret_fd)
{
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * GM_FRAME_MAX_FDS)];
        } control;
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        ssize_t n;

        if (ret_fd) {
                msg.msg_control = control.buf;
                msg.msg_controllen = sizeof(control.buf);
                *ret_fd = -1;
        }
        n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (n > 0 && ret_fd) {
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                        memcpy(ret_fd, CMSG_DATA(c), sizeof(int));
        }
        return n;
}

static int send_packet(int fd, const void *buf, size_t len, int pass_fd)
{
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int))];
        } control;
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

        if (pass_fd >= 0) {
                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = sizeof(control.buf);
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
        }
        return sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

/* Echo server of the floor: answer every packet with @rep_len bytes (and @pass_fd when >= 0). */
static void floor_serve(int fd, size_t rep_len, int pass_fd)
{
        static uint8_t in[GM_FRAME_MAX], out[GM_FRAME_MAX];

        memset(out, 0x5a, rep_len);
        for (;;) {
                ssize_t n = recv_packet(fd, in, sizeof(in), NULL);
                if (n <= 0)
                        return;
                if (send_packet(fd, out, rep_len, pass_fd) < 0)
                        return;
        }
}

static void floor_samples(const Settings *st, size_t req_len, size_t rep_len, bool with_fd, int cpu,
                          size_t iters, uint64_t *s)
{
        static uint8_t req[GM_FRAME_MAX], in[GM_FRAME_MAX];
        int sv[2];
        pid_t pid;

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                die("floor: %s", strerror(errno));
        pid = fork();
        if (pid == 0) {
                int mfd = -1;
                close(sv[0]);
                if (cpu >= 0)
                        pin_self(cpu);
                else
                        unpin_self(st);
                if (with_fd) {
                        mfd = memfd_create("floor", MFD_CLOEXEC);
                        if (mfd < 0 || ftruncate(mfd, 2 * MIB) < 0)
                                _exit(1);
                }
                floor_serve(sv[1], rep_len, mfd);
                _exit(0);
        }
        close(sv[1]);
        if (cpu >= 0)
                pin_self(cpu);
        else
                unpin_self(st);
        memset(req, 0xa5, req_len);
        for (size_t i = 0; i < iters + iters / 10; i++) {
                uint64_t t0 = now_ns();
                int rfd = -1;
                if (send_packet(sv[0], req, req_len, -1) < 0 ||
                    recv_packet(sv[0], in, sizeof(in), with_fd ? &rfd : NULL) != (ssize_t)rep_len)
                        die("floor ping-pong failed: %s", strerror(errno));
                if (rfd >= 0)
                        close(rfd);
                else if (with_fd)
                        die("floor: no fd in the reply");
                if (i >= iters / 10)
                        s[i - iters / 10] = now_ns() - t0;
        }
        close(sv[0]);
        waitpid(pid, NULL, 0);
}

/* ---- broker operations through libgpumem_client -------------------------------------------------------- */

typedef struct Ops {
        gm_client *c;
        uint32_t gpu[2];
        void *dev; /* a device allocation for map/unmap, export and pointer queries */
        gm_handle dev_handle;
        void *managed; /* managed memory for SVM attributes */
        size_t managed_size;
        unsigned flip;
} Ops;

typedef int (*OpFn)(Ops *o);

static int op_ping(Ops *o)
{
        return gm_ping(o->c);
}

static int op_topology(Ops *o)
{
        gm_topology *t = NULL;
        int r = gm_topology_get(o->c, false, &t);
        gm_topology_free(t);
        return r;
}

static int op_alloc_free(Ops *o)
{
        void *p = NULL;
        int r = gm_malloc(o->c, 4 * KIB, o->gpu[0], 0, &p);
        return r < 0 ? r : gm_mem_free(o->c, p);
}

static int op_map_unmap(Ops *o)
{
        int r = gm_mem_map_gpus(o->c, o->dev, &o->gpu[1], 1);
        return r < 0 ? r : gm_mem_unmap_gpus(o->c, o->dev, &o->gpu[1], 1);
}

static int op_vmm(Ops *o)
{
        gm_access_desc acc = {.gpu_id = o->gpu[0], .access = GM_ACCESS_READ_WRITE};
        gm_handle h = 0;
        void *va = NULL;
        int r;

        if ((r = gm_mem_address_reserve(o->c, 2 * MIB, 0, NULL, 0, &va)) < 0)
                return r;
        if ((r = gm_mem_create(o->c, 2 * MIB, o->gpu[0], 0, &h)) < 0 ||
            (r = gm_mem_map(o->c, va, 2 * MIB, 0, h)) < 0 ||
            (r = gm_mem_set_access(o->c, va, 2 * MIB, &acc, 1)) < 0 ||
            (r = gm_mem_unmap(o->c, va, 2 * MIB)) < 0 || (r = gm_mem_release(o->c, h)) < 0)
                return r;
        return gm_mem_address_free(o->c, va, 2 * MIB);
}

static int op_export(Ops *o)
{
        size_t size = 0;
        int fd = -1;
        int r = gm_mem_export(o->c, o->dev_handle, &fd, &size);
        if (r < 0)
                return r;
        close(fd);
        return 0;
}

static int op_svm_set(Ops *o)
{
        gm_svm_attr a = {GM_SVM_ATTR_PREFERRED_LOC, o->gpu[o->flip++ & 1]};
        return gm_svm_set_attributes(o->c, o->managed, o->managed_size, &a, 1);
}

static int op_svm_get(Ops *o)
{
        gm_svm_attr a[2] = {{GM_SVM_ATTR_PREFERRED_LOC, 0}, {GM_SVM_ATTR_ACCESS, o->gpu[0]}};
        return gm_svm_get_attributes(o->c, o->managed, o->managed_size, a, 2);
}

static int op_pointer(Ops *o)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int r = gm_pointer_get_attributes(o->c, (char *)o->dev + 100, &pa);
        return r < 0 ? r : (pa.base == o->dev ? 0 : -EPROTO);
}

static void measure_samples(OpFn fn, Ops *o, size_t iters, const char *name, uint64_t *s)
{
        size_t warm = iters / 10 + 1;

        for (size_t i = 0; i < warm + iters; i++) {
                uint64_t t0 = now_ns();
                int r = fn(o);
                uint64_t t1 = now_ns();
                if (r < 0)
                        die("%s failed: %s", name, strerror(-r));
                if (i >= warm)
                        s[i - warm] = t1 - t0;
        }
}

static Lat measure_op(OpFn fn, Ops *o, size_t iters, const char *name)
{
        uint64_t *s = calloc(iters, sizeof(*s));
        Lat l;

        if (!s)
                die("out of memory");
        measure_samples(fn, o, iters, name, s);
        l = lat_of(s, iters);
        free(s);
        return l;
}

static int ops_setup(Ops *o, const char *sock, const char *name)
{
        gm_topology *t = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        size_t n = 0;
        int r;

        memset(o, 0, sizeof(*o));
        r = gm_client_connect(sock, name, &o->c);
        if (r < 0)
                return r;
        r = gm_topology_get(o->c, false, &t);
        if (r < 0)
                return r;
        for (size_t i = 0; i < t->n_nodes && n < 2; i++)
                if (t->nodes[i].is_gpu)
                        o->gpu[n++] = t->nodes[i].gpu_id;
        gm_topology_free(t);
        if (n == 0)
                return -ENODEV;
        if (n == 1)
                o->gpu[1] = o->gpu[0];
        if ((r = gm_malloc(o->c, 2 * MIB, o->gpu[0], 0, &o->dev)) < 0 ||
            (r = gm_pointer_get_attributes(o->c, o->dev, &pa)) < 0)
                return r;
        o->dev_handle = pa.handle;
        o->managed_size = 2 * MIB;
        return gm_malloc_managed(o->c, o->managed_size, 0, &o->managed);
}

static void ops_done(Ops *o)
{
        gm_client_close(o->c);
        o->c = NULL;
}

static const struct {
        const char *name;
        OpFn fn;
        unsigned rtts;
        bool fd;
        bool small; /* a one-round-trip op the small-op targets apply to */
        const char *floor;
} broker_ops[] = {
        {"ping", op_ping, 1, false, true, "small"},
        {"topology", op_topology, 1, false, false, "topology-size"},
        {"alloc+free (4 KiB device)", op_alloc_free, 2, false, false, "small"},
        {"map+unmap (second GPU)", op_map_unmap, 2, false, false, "small"},
        {"vmm sequence (7 ops)", op_vmm, 7, false, false, "small"},
        {"dmabuf export (+fd)", op_export, 1, true, false, "small"},
        {"svm set attributes", op_svm_set, 1, false, true, "small"},
        {"svm get attributes", op_svm_get, 1, false, true, "small"},
        {"pointer query", op_pointer, 1, false, true, "small"},
};
#define N_BROKER_OPS (sizeof(broker_ops) / sizeof(broker_ops[0]))

/*
 * The floors and the broker ops, pinned and unpinned, in interleaved rounds: whatever else the machine does
 * during the run falls on every row alike, so the ratios compare like with like.
 */
static void run_latency(const Settings *st, Report *rep, const Daemon *d)
{
        const struct {
                const char *name;
                size_t req, rep;
                bool fd;
        } f[] = {
                {"small", rep->sz_ping_req, rep->sz_ping_rep, false},
                {"small+fd", rep->sz_ping_req, rep->sz_export_rep, true},
                {"topology-size", rep->sz_topo_req, rep->sz_topo_rep, false},
        };
        enum { N_FLOORS = sizeof(f) / sizeof(f[0]), N_ROWS = N_FLOORS + N_BROKER_OPS };
        const unsigned rounds = 5;
        uint64_t *samples[N_ROWS][2];
        size_t iters[N_ROWS];
        Row *rows[N_ROWS];
        Ops o;
        int r = ops_setup(&o, d->sock, "bench-latency");

        if (r < 0)
                die("cannot set up the latency client: %s", strerror(-r));
        for (size_t i = 0; i < N_ROWS; i++) {
                if (i < N_FLOORS) {
                        rows[i] = add_row(rep, "floor", f[i].name, 1, f[i].fd);
                        snprintf(rows[i]->floor, sizeof(rows[i]->floor), "%s", f[i].name);
                        rows[i]->ratio_p50 = rows[i]->ratio_p99 = 1.0;
                        iters[i] = st->floor_iters / rounds;
                } else {
                        size_t k = i - N_FLOORS;
                        rows[i] = add_row(rep, "gpumemd", broker_ops[k].name, broker_ops[k].rtts,
                                          broker_ops[k].fd);
                        snprintf(rows[i]->floor, sizeof(rows[i]->floor), "%s", broker_ops[k].floor);
                        iters[i] = (broker_ops[k].rtts > 1 ? st->seq_iters : st->op_iters) / rounds;
                }
                for (int m = 0; m < 2; m++) {
                        samples[i][m] = calloc(iters[i] * rounds, sizeof(uint64_t));
                        if (!samples[i][m])
                                die("out of memory");
                }
        }
        for (unsigned round = 0; round < rounds; round++) {
                for (size_t i = 0; i < N_ROWS; i++) {
                        for (int m = 0; m < 2; m++) {
                                uint64_t *out = samples[i][m] + round * iters[i];
                                bool pinned = m == 0;
                                if (pinned) {
                                        pin_process(d->pid, st->cpu_a);
                                        pin_self(st->cpu_a);
                                } else {
                                        place_process(d->pid, &st->all_cpus);
                                        unpin_self(st);
                                }
                                if (i < N_FLOORS)
                                        floor_samples(st, f[i].req, f[i].rep, f[i].fd,
                                                      pinned ? st->cpu_a : -1, iters[i], out);
                                else
                                        measure_samples(broker_ops[i - N_FLOORS].fn, &o, iters[i],
                                                        broker_ops[i - N_FLOORS].name, out);
                        }
                }
        }
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        for (size_t i = 0; i < N_ROWS; i++) {
                rows[i]->pinned = lat_of(samples[i][0], iters[i] * rounds);
                rows[i]->unpinned = lat_of(samples[i][1], iters[i] * rounds);
                free(samples[i][0]);
                free(samples[i][1]);
        }
        ops_done(&o);
}

/* ---- the same operations in-process on the thunk and the model ----------------------------------------- */

typedef struct InProc {
        ThunkDevice *dev;
        ThunkContext *ctx;
        ThunkVaSpace *va;
        uint32_t gpu[2];
        ThunkBo *bo; /* mapped device BO for map/unmap, export and queries */
        uint64_t svm_va, svm_size;
        unsigned flip;
} InProc;

typedef int (*InFn)(InProc *p);

static int in_alloc_free(InProc *p)
{
        ThunkAllocArgs a = {.kind = THUNK_MEM_VRAM,
                            .gpu_id = p->gpu[0],
                            .flags = THUNK_MEM_WRITABLE | THUNK_MEM_NO_SUBSTITUTE,
                            .size = 4 * KIB};
        ThunkBo *bo = NULL;
        int r = thunk_va_alloc(p->va, a.size, 4 * KIB, NULL, &a.va);

        if (r < 0)
                return r;
        if ((r = thunk_bo_alloc(p->ctx, &a, &bo)) < 0 || (r = thunk_bo_map(bo, &p->gpu[0], 1)) < 0)
                return r;
        if ((r = thunk_bo_unmap_all(bo)) < 0 || (r = thunk_bo_free(bo)) < 0)
                return r;
        return thunk_va_free(p->va, a.va);
}

static int in_map_unmap(InProc *p)
{
        int r = thunk_bo_map(p->bo, &p->gpu[1], 1);
        return r < 0 ? r : thunk_bo_unmap(p->bo, &p->gpu[1], 1);
}

static int in_vmm(InProc *p)
{
        ThunkAllocArgs a = {.kind = THUNK_MEM_VRAM,
                            .gpu_id = p->gpu[0],
                            .flags = THUNK_MEM_WRITABLE | THUNK_MEM_NO_SUBSTITUTE,
                            .size = 2 * MIB};
        ThunkGemMapping *m = NULL;
        ThunkBo *bo = NULL;
        uint64_t va = 0;
        int r = thunk_va_alloc(p->va, 2 * MIB, 2 * MIB, NULL, &va);

        if (r < 0)
                return r;
        if ((r = thunk_bo_alloc(p->ctx, &a, &bo)) < 0 ||
            (r = thunk_gem_map_bo(p->ctx, bo, p->gpu[0], va, 0, 2 * MIB,
                                  THUNK_GEM_VA_READABLE | THUNK_GEM_VA_WRITEABLE, &m)) < 0 ||
            (r = thunk_gem_unmap(m)) < 0 || (r = thunk_bo_free(bo)) < 0)
                return r;
        return thunk_va_free(p->va, va);
}

static int in_export(InProc *p)
{
        int fd = -1, r = thunk_bo_export_dmabuf(p->bo, &fd);
        if (r < 0)
                return r;
        close(fd);
        return 0;
}

static int in_svm_set(InProc *p)
{
        ThunkSvmAttr a = {SVM_ATTR_PREFERRED_LOC, p->gpu[p->flip++ & 1]};
        return thunk_svm_set(thunk_device_primary_context(p->dev), p->svm_va, p->svm_size, &a, 1);
}

static int in_svm_get(InProc *p)
{
        ThunkSvmAttr a[2] = {{SVM_ATTR_PREFERRED_LOC, 0}, {SVM_ATTR_ACCESS, p->gpu[0]}};
        return thunk_svm_get(thunk_device_primary_context(p->dev), p->svm_va, p->svm_size, a, 2);
}

static int in_pointer(InProc *p)
{
        ThunkVaObject vo;
        int r = thunk_va_lookup(p->va, thunk_bo_info(p->bo)->va + 100, &vo);
        return r < 0 ? r : (vo.data == p->bo && thunk_bo_is_mapped(p->bo, p->gpu[0]) ? 0 : -EPROTO);
}

static Lat measure_in(InFn fn, InProc *p, size_t iters, const char *name)
{
        uint64_t *s = calloc(iters, sizeof(*s));
        size_t warm = iters / 10 + 1;
        Lat l;

        if (!s)
                die("out of memory");
        for (size_t i = 0; i < warm + iters; i++) {
                uint64_t t0 = now_ns();
                int r = fn(p);
                uint64_t t1 = now_ns();
                if (r < 0)
                        die("in-process %s failed: %s", name, strerror(-r));
                if (i >= warm)
                        s[i - warm] = t1 - t0;
        }
        l = lat_of(s, iters);
        free(s);
        return l;
}

static void run_inproc(const Settings *st, Report *rep)
{
        static const struct {
                const char *name;
                InFn fn;
        } ops[] = {
                {"alloc+free (4 KiB device)", in_alloc_free},
                {"map+unmap (second GPU)", in_map_unmap},
                {"vmm sequence (7 ops)", in_vmm},
                {"dmabuf export (+fd)", in_export},
                {"svm set attributes", in_svm_set},
                {"svm get attributes", in_svm_get},
                {"pointer query", in_pointer},
        };
        ThunkOptions to = {.backend = THUNK_BACKEND_MODEL, .topology_root = st->preset};
        ThunkAllocArgs a = {.kind = THUNK_MEM_VRAM,
                            .flags = THUNK_MEM_WRITABLE | THUNK_MEM_NO_SUBSTITUTE,
                            .size = 2 * MIB};
        ThunkSvmAttr sa = {SVM_ATTR_SET_FLAGS, SVM_FLAG_HOST_ACCESS};
        uint64_t base, limit, start;
        char err[256] = "";
        InProc p = {0};
        void *mem;
        int r;

        r = thunk_device_open(&to, &p.dev, err, sizeof(err));
        if (r < 0)
                die("in-process: cannot open the model: %s", err[0] ? err : strerror(-r));
        p.ctx = thunk_device_primary_context(p.dev);
        for (size_t i = 0, n = 0; i < thunk_device_gpu_count(p.dev) && n < 2; i++)
                p.gpu[n++] = thunk_device_gpu(p.dev, i)->gpu_id;
        if (thunk_device_gpu_count(p.dev) < 2)
                p.gpu[1] = p.gpu[0];
        /* the address books a client with its own KFD keeps too (libhsakmt has its own VA manager) */
        thunk_device_svm_aperture(p.dev, &base, &limit);
        start = ((base > (1ull << 40) ? base : (1ull << 40)) + 2 * MIB - 1) & ~(2 * MIB - 1);
        if ((r = thunk_va_space_new(start, 64 * GIB, 4 * KIB, &p.va)) < 0)
                die("in-process: VA space: %s", strerror(-r));
        a.gpu_id = p.gpu[0];
        if ((r = thunk_va_alloc(p.va, a.size, 2 * MIB, NULL, &a.va)) < 0 ||
            (r = thunk_bo_alloc(p.ctx, &a, &p.bo)) < 0 || (r = thunk_bo_map(p.bo, &p.gpu[0], 1)) < 0)
                die("in-process: device BO: %s", strerror(-r));
        (void)thunk_va_free(p.va, a.va);
        (void)thunk_va_alloc(p.va, a.size, 2 * MIB, p.bo, &a.va); /* same address, now naming the BO */
        /* managed memory: pages at an SVM address of this process */
        p.svm_size = 2 * MIB;
        if ((r = thunk_va_alloc(p.va, p.svm_size, 2 * MIB, NULL, &p.svm_va)) < 0)
                die("in-process: SVM VA: %s", strerror(-r));
        mem = mmap((void *)(uintptr_t)p.svm_va, p.svm_size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (mem != (void *)(uintptr_t)p.svm_va)
                die("in-process: cannot map SVM memory at 0x%llx", (unsigned long long)p.svm_va);
        if ((r = thunk_svm_set(thunk_device_primary_context(p.dev), p.svm_va, p.svm_size, &sa, 1)) < 0)
                die("in-process: SVM range: %s", strerror(-r));

        pin_self(st->cpu_a);
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                Row *w = add_row(rep, "in-process", ops[i].name, 0, false);
                size_t iters = strstr(ops[i].name, "sequence") || strstr(ops[i].name, "+") ? st->seq_iters
                                                                                           : st->op_iters;
                w->pinned = measure_in(ops[i].fn, &p, iters, ops[i].name);
        }
        unpin_self(st);
        munmap(mem, p.svm_size);
        (void)thunk_bo_unmap_all(p.bo);
        (void)thunk_bo_free(p.bo);
        thunk_va_space_free(p.va);
        thunk_device_close(p.dev);
}

/* ---- throughput ------------------------------------------------------------------------------------------
 */

typedef struct Fleet {
        pid_t pids[64];
        int result_fd[64];
        size_t n;
        int go_w; /* closing it starts every client */
} Fleet;

/* A client process: connect, report ready, wait for the start, run for @seconds, write its count. */
static void fleet_client(const char *sock, bool raw, size_t req_len, double seconds, int ready_w, int go_r,
                         int result_w)
{
        static uint8_t buf[GM_FRAME_MAX], in[GM_FRAME_MAX];
        gm_client *c = NULL;
        uint64_t count = 0, deadline;
        char one = 1;
        int fd = -1;

        if (raw)
                fd = raw_connect(sock);
        else if (gm_client_connect(sock, "bench-tput", &c) < 0)
                _exit(2);
        if (raw && fd < 0)
                _exit(2);
        memset(buf, 0xa5, req_len);
        (void)!write(ready_w, &one, 1);
        close(ready_w);
        (void)!read(go_r, &one, 1); /* EOF when the parent closes the other end */
        deadline = now_ns() + (uint64_t)(seconds * 1e9);
        while (now_ns() < deadline) {
                for (int k = 0; k < 16; k++) {
                        if (raw) {
                                if (send_packet(fd, buf, req_len, -1) < 0 ||
                                    recv_packet(fd, in, sizeof(in), NULL) <= 0)
                                        _exit(3);
                        } else if (gm_ping(c) < 0) {
                                _exit(3);
                        }
                        count++;
                }
        }
        (void)!write(result_w, &count, sizeof(count));
        _exit(0);
}

static double fleet_run(const Settings *st, const char *sock, bool raw, size_t req_len, unsigned n)
{
        int go[2], ready[2];
        pid_t pids[64];
        int res[64];
        uint64_t total = 0;
        char b;

        if (pipe2(go, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        for (unsigned i = 0; i < n; i++) {
                int rp[2];
                if (pipe2(rp, O_CLOEXEC) < 0)
                        die("pipe: %s", strerror(errno));
                pids[i] = fork();
                if (pids[i] == 0) {
                        close(go[1]);
                        close(ready[0]);
                        close(rp[0]);
                        unpin_self(st);
                        fleet_client(sock, raw, req_len, st->tput_seconds, ready[1], go[0], rp[1]);
                }
                close(rp[1]);
                res[i] = rp[0];
        }
        close(ready[1]);
        close(go[0]);
        for (unsigned i = 0; i < n; i++)
                if (read(ready[0], &b, 1) != 1)
                        die("a throughput client failed to connect");
        close(ready[0]);
        close(go[1]);
        for (unsigned i = 0; i < n; i++) {
                uint64_t c = 0;
                if (read(res[i], &c, sizeof(c)) != (ssize_t)sizeof(c))
                        die("a throughput client failed");
                total += c;
                close(res[i]);
                waitpid(pids[i], NULL, 0);
        }
        return (double)total / st->tput_seconds;
}

typedef struct RawServer {
        pid_t pid;
        char path[96];
} RawServer;

typedef struct RawConn {
        int fd;
        size_t rep_len;
} RawConn;

static void *raw_conn_thread(void *userdata)
{
        RawConn *rc = userdata;
        uint8_t *in = malloc(GM_FRAME_MAX), *out = calloc(1, rc->rep_len + 1);

        if (in && out)
                for (;;) {
                        ssize_t n = recv(rc->fd, in, GM_FRAME_MAX, 0);
                        if (n <= 0 || send(rc->fd, out, rc->rep_len, MSG_NOSIGNAL) < 0)
                                break;
                }
        close(rc->fd);
        free(in);
        free(out);
        free(rc);
        return NULL;
}

/* The throughput floor: a thread-per-connection SOCK_SEQPACKET echo server in its own process. */
static void raw_server_start(RawServer *s, const char *dir, size_t rep_len, const Settings *st)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int lfd;

        snprintf(s->path, sizeof(s->path), "%s/raw.sock", dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
        lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, SOMAXCONN) < 0)
                die("raw server: %s", strerror(errno));
        s->pid = fork();
        if (s->pid == 0) {
                unpin_self(st);
                for (;;) {
                        pthread_t t;
                        RawConn *rc = malloc(sizeof(*rc));
                        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
                        if (fd < 0 || !rc)
                                _exit(0);
                        rc->fd = fd;
                        rc->rep_len = rep_len;
                        if (pthread_create(&t, NULL, raw_conn_thread, rc) != 0)
                                _exit(1);
                        pthread_detach(t);
                }
        }
        close(lfd);
}

static void raw_server_stop(RawServer *s)
{
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        unlink(s->path);
}

static void run_throughput(const Settings *st, Report *rep, const Daemon *d)
{
        static const unsigned counts[] = {1, 4, 16, 64};
        RawServer rs;

        raw_server_start(&rs, d->dir, rep->sz_ping_rep, st);
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        for (size_t i = 0; i < 4; i++) {
                rep->tput_clients[i] = counts[i];
                rep->tput_gpumemd[i] = fleet_run(st, d->sock, false, 0, counts[i]);
                rep->tput_raw[i] = fleet_run(st, rs.path, true, rep->sz_ping_req, counts[i]);
        }
        rep->n_tput = 4;
        raw_server_stop(&rs);
}

/* ---- small ops while other clients run slow ones ------------------------------------------------------- */

/* A background client: large host allocations (pinned pages) or prefetches of a large managed range. */
static void slow_client(const char *sock, int kind, int stop_r, int result_w)
{
        gm_client *c = NULL;
        gm_topology *t = NULL;
        uint32_t gpu = 0;
        uint64_t n = 0, busy_ns = 0;
        void *managed = NULL;
        const size_t big = 64 * MIB;

        if (gm_client_connect(sock, "bench-slow", &c) < 0 || gm_topology_get(c, false, &t) < 0)
                _exit(2);
        for (size_t i = 0; i < t->n_nodes; i++)
                if (t->nodes[i].is_gpu && !gpu)
                        gpu = t->nodes[i].gpu_id;
        gm_topology_free(t);
        if (kind == 1 && gm_malloc_managed(c, big, 0, &managed) < 0)
                _exit(2);
        for (;;) {
                struct pollfd p = {.fd = stop_r, .events = POLLIN};
                uint64_t t0 = now_ns();
                int r;

                if (poll(&p, 1, 0) > 0)
                        break;
                if (kind == 0) {
                        void *h = NULL;
                        r = gm_host_malloc(c, big, gpu, -1, 0, &h);
                        if (r >= 0)
                                r = gm_mem_free(c, h);
                } else {
                        r = gm_mem_prefetch(c, managed, big, (n & 1) ? GM_LOCATION_CPU : gpu);
                }
                if (r < 0)
                        _exit(3);
                busy_ns += now_ns() - t0;
                n++;
        }
        uint64_t out[2] = {n, busy_ns};
        (void)!write(result_w, out, sizeof(out));
        gm_client_close(c);
        _exit(0);
}

static void run_isolation(const Settings *st, Report *rep, const Daemon *d)
{
        int stop[2], res[2][2];
        pid_t pids[2];
        uint64_t t_start, t_end;
        Ops o;
        int r = ops_setup(&o, d->sock, "bench-isolation");

        if (r < 0)
                die("isolation client: %s", strerror(-r));
        /* the loop shares its CPU with the measured client only: the daemon's worker threads (the slow
         * part of the slow ops) go with the slow clients */
        pin_loop_apart(d->pid, st->cpu_a, st->cpu_b);
        pin_self(st->cpu_a);
        rep->iso_idle = measure_op(op_ping, &o, st->op_iters, "ping");

        if (pipe2(stop, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        for (int k = 0; k < 2; k++) {
                if (pipe2(res[k], O_CLOEXEC) < 0)
                        die("pipe: %s", strerror(errno));
                pids[k] = fork();
                if (pids[k] == 0) {
                        close(stop[1]);
                        close(res[k][0]);
                        /* on the other CPU: only the daemon's time is shared with the measured client */
                        pin_self(st->cpu_b);
                        slow_client(d->sock, k, stop[0], res[k][1]);
                }
                close(res[k][1]);
        }
        close(stop[0]);
        usleep(200000); /* let the slow clients get going */
        t_start = now_ns();
        rep->iso_loaded = measure_op(op_ping, &o, st->op_iters, "ping under load");
        t_end = now_ns();
        close(stop[1]);
        for (int k = 0; k < 2; k++) {
                uint64_t out[2] = {0, 0};
                if (read(res[k][0], out, sizeof(out)) != (ssize_t)sizeof(out))
                        die("a slow client failed");
                close(res[k][0]);
                waitpid(pids[k], NULL, 0);
                rep->iso_bg_ops_per_s[k] = (double)out[0] / ((double)(t_end - t_start) / 1e9);
                rep->iso_bg_mean_ms[k] = out[0] ? (double)out[1] / (double)out[0] / 1e6 : 0;
        }
        place_process(d->pid, &st->all_cpus);
        unpin_self(st);
        ops_done(&o);
}

/* ---- scaling with live allocations --------------------------------------------------------------------- */

typedef struct Filler {
        gm_client *c;
        uint32_t gpu;
        size_t n;
        int err;
} Filler;

static void *fill_thread(void *userdata)
{
        Filler *f = userdata;

        for (size_t i = 0; i < f->n; i++) {
                void *p = NULL;
                int r = gm_malloc(f->c, 4 * KIB, f->gpu, 0, &p);
                if (r < 0) {
                        f->err = r;
                        f->n = i;
                        break;
                }
        }
        return NULL;
}

/* Add @n device allocations of 4 KiB to @c's books, from 4 threads on the one connection. */
static size_t fill(gm_client *c, uint32_t gpu, size_t n, int *ret_err)
{
        Filler f[4];
        pthread_t t[4];
        size_t done = 0;

        *ret_err = 0;
        for (int i = 0; i < 4; i++) {
                f[i] = (Filler){c, gpu, n / 4 + (i == 0 ? n % 4 : 0), 0};
                pthread_create(&t[i], NULL, fill_thread, &f[i]);
        }
        for (int i = 0; i < 4; i++) {
                pthread_join(t[i], NULL);
                done += f[i].n;
                if (f[i].err)
                        *ret_err = f[i].err;
        }
        return done;
}

/* The time a disconnect keeps the daemon busy freeing what the client held, until its books show nothing. */
static double teardown_seconds(const char *sock, Ops *o, unsigned poll_us)
{
        gm_client *probe = NULL;
        uint64_t t0;
        int r = gm_client_connect(sock, "bench-probe", &probe);

        if (r < 0)
                die("probe client: %s", strerror(-r));
        t0 = now_ns();
        ops_done(o);
        for (;;) {
                gm_status *s = NULL;
                uint64_t left;
                r = gm_admin_status(probe, &s);
                if (r < 0)
                        die("admin status: %s", strerror(-r));
                left = s->allocations;
                gm_status_free(s);
                if (left == 0 || now_ns() - t0 > 1200ull * 1000000000ull)
                        break;
                usleep(poll_us);
        }
        gm_client_close(probe);
        return (double)(now_ns() - t0) / 1e9;
}

static void run_scaling(const Settings *st, Report *rep)
{
        static const struct {
                const char *name;
                OpFn fn;
                bool seq;
        } ops[] = {
                {"ping", op_ping, false},
                {"pointer query", op_pointer, false},
                {"alloc+free (4 KiB device)", op_alloc_free, true},
                {"map+unmap (second GPU)", op_map_unmap, true},
        };
        Lat small[4];
        Daemon d;
        Ops o;
        size_t have, got;
        uint64_t t0;
        int r, err = 0;

        rep->scale_small = st->scale_small;
        rep->scale_big = rep->scale_want = st->scale_big;
        r = daemon_start(&d, st, NULL, 0);
        if (r < 0)
                die("cannot start gpumemd for the scaling run: %s", strerror(-r));
        rep->daemon_nofile = proc_nofile(d.pid);
        r = ops_setup(&o, d.sock, "bench-scale");
        if (r < 0)
                die("scaling client: %s", strerror(-r));
        have = fill(o.c, o.gpu[0], st->scale_small, &err);
        if (err)
                die("cannot hold %zu allocations: %s", st->scale_small, strerror(-err));
        pin_process(d.pid, st->cpu_a);
        pin_self(st->cpu_a);
        for (size_t i = 0; i < 4; i++)
                small[i] = measure_op(ops[i].fn, &o, ops[i].seq ? st->seq_iters : st->op_iters, ops[i].name);
        place_process(d.pid, &st->all_cpus);
        unpin_self(st);

        t0 = now_ns();
        got = fill(o.c, o.gpu[0], rep->scale_big - have, &err);
        rep->scale_fill_seconds = (double)(now_ns() - t0) / 1e9;
        have += got;
        rep->scale_reached = have;
        if (err)
                snprintf(rep->scale_note, sizeof(rep->scale_note),
                         "stopped at %zu live allocations: %s (daemon RLIMIT_NOFILE %llu)", have,
                         strerror(-err), rep->daemon_nofile);

        pin_process(d.pid, st->cpu_a);
        pin_self(st->cpu_a);
        for (size_t i = 0; i < 4; i++) {
                Row *w = &rep->scale_rows[rep->n_scale_rows++];
                memset(w, 0, sizeof(*w));
                snprintf(w->section, sizeof(w->section), "scaling");
                snprintf(w->name, sizeof(w->name), "%s", ops[i].name);
                w->pinned = small[i];
                w->unpinned =
                        measure_op(ops[i].fn, &o, ops[i].seq ? st->seq_iters : st->op_iters, ops[i].name);
                w->ratio_p50 = w->unpinned.p50_us / w->pinned.p50_us;
                w->ratio_p99 = w->unpinned.p99_us / w->pinned.p99_us;
        }
        place_process(d.pid, &st->all_cpus);
        unpin_self(st);

        /* Teardown: how long the daemon is busy freeing what a client held when it leaves (it serves
         * nobody meanwhile). Measured until its books show the objects gone. */
        rep->scale_teardown_seconds = teardown_seconds(d.sock, &o, 1000);
        daemon_kill(&d);
}

/* ---- a million live allocations in a daemon limited to 20,000 fds -------------------------------------- */

/*
 * The goal this measures: device allocations cost the daemon no fd, so a daemon whose RLIMIT_NOFILE is
 * 20,000 (soft and hard, set before exec) holds a million of them, at the per-op latency of a thousand.
 * One client fills from 4 threads on one connection; each point's ops run pinned, as in the scaling run.
 * Numbers only: nothing here fails on timing.
 */
static void run_many(const Settings *st, Report *rep)
{
        static const struct {
                const char *name;
                OpFn fn;
                bool seq;
        } ops[] = {
                {"ping", op_ping, false},
                {"pointer query", op_pointer, false},
                {"alloc+free (4 KiB device)", op_alloc_free, true},
                {"map+unmap (second GPU)", op_map_unmap, true},
        };
        Lat small[4];
        Daemon d;
        Ops o;
        size_t have, got;
        uint64_t t0;
        int r, err = 0;

        rep->many_ran = true;
        rep->many_small = st->many_small;
        rep->many_want = st->many_big;
        r = daemon_start(&d, st, NULL, st->many_nofile);
        if (r < 0)
                die("cannot start gpumemd for the many-allocations run: %s", strerror(-r));
        rep->many_nofile = proc_nofile(d.pid);
        r = ops_setup(&o, d.sock, "bench-many");
        if (r < 0)
                die("many-allocations client: %s", strerror(-r));
        t0 = now_ns();
        have = fill(o.c, o.gpu[0], st->many_small, &err);
        if (err)
                die("cannot hold %zu allocations: %s", st->many_small, strerror(-err));
        rep->many_fill_small_us = (double)(now_ns() - t0) / 1e3 / (double)have;
        rep->many_fds_small = proc_fd_count(d.pid);
        rep->many_rss_small_kb = proc_status_kb(d.pid, "VmRSS");
        pin_process(d.pid, st->cpu_a);
        pin_self(st->cpu_a);
        for (size_t i = 0; i < 4; i++)
                small[i] = measure_op(ops[i].fn, &o, ops[i].seq ? st->seq_iters : st->op_iters, ops[i].name);
        place_process(d.pid, &st->all_cpus);
        unpin_self(st);

        t0 = now_ns();
        got = fill(o.c, o.gpu[0], st->many_big - have, &err);
        rep->many_fill_seconds = (double)(now_ns() - t0) / 1e9;
        rep->many_fill_big_us = got ? rep->many_fill_seconds * 1e6 / (double)got : NAN;
        have += got;
        rep->many_reached = have;
        rep->many_fds_big = proc_fd_count(d.pid);
        rep->many_rss_big_kb = proc_status_kb(d.pid, "VmRSS");
        if (err)
                snprintf(rep->many_note, sizeof(rep->many_note), "stopped at %zu live allocations: %s", have,
                         strerror(-err));

        pin_process(d.pid, st->cpu_a);
        pin_self(st->cpu_a);
        for (size_t i = 0; i < 4; i++) {
                Row *w = &rep->many_rows[rep->n_many_rows++];
                memset(w, 0, sizeof(*w));
                snprintf(w->section, sizeof(w->section), "many");
                snprintf(w->name, sizeof(w->name), "%s", ops[i].name);
                w->pinned = small[i];
                w->unpinned =
                        measure_op(ops[i].fn, &o, ops[i].seq ? st->seq_iters : st->op_iters, ops[i].name);
                w->ratio_p50 = w->unpinned.p50_us / w->pinned.p50_us;
                w->ratio_p99 = w->unpinned.p99_us / w->pinned.p99_us;
        }
        place_process(d.pid, &st->all_cpus);
        unpin_self(st);
        /* the probe's status calls walk the model's books: not too often while a million go */
        rep->many_teardown_seconds = teardown_seconds(d.sock, &o, 20000);
        daemon_kill(&d);
}

/* ---- memory per idle connection ------------------------------------------------------------------------ */

static void run_idle(const Settings *st, Report *rep)
{
        char conf[256];
        Daemon d;
        size_t want_n = st->idle_conns;
        int *fds = calloc(want_n + 1, sizeof(int));
        long slab0;
        size_t n = 0;
        int r;

        if (!fds)
                die("out of memory");
        snprintf(conf, sizeof(conf), "[daemon]\nmax-connections = %zu\nmax-connections-per-uid = %zu\n",
                 st->idle_conns + 64, st->idle_conns + 64);
        r = daemon_start(&d, st, conf, 0);
        if (r < 0)
                die("cannot start gpumemd for the idle-connection run: %s", strerror(-r));
        rep->idle_want = want_n;
        {
                /* a connection holds two fds in the daemon: its socket and the peer's pidfd */
                unsigned long long lim = proc_nofile(d.pid);
                if (lim && lim < 2 * want_n + 256) {
                        want_n = lim > 256 + 200 ? (size_t)(lim - 256) / 2 : 100;
                        snprintf(rep->idle_note, sizeof(rep->idle_note),
                                 "capped at %zu of %zu wanted: each connection holds a socket and a pidfd in "
                                 "the "
                                 "daemon, whose RLIMIT_NOFILE hard limit is %llu",
                                 want_n, rep->idle_want, lim);
                }
        }
        /* one connection first, so what every daemon allocates once is not counted */
        fds[0] = raw_connect(d.sock);
        if (fds[0] < 0 || raw_hello(fds[0], 2 * MIB) < 0)
                die("idle: first connection failed");
        usleep(100000);
        rep->idle_rss_before_kb = proc_status_kb(d.pid, "VmRSS");
        slab0 = meminfo_kb("Slab");
        for (n = 1; n <= want_n; n++) {
                int fd = raw_connect(d.sock);
                if (fd < 0) {
                        snprintf(rep->idle_note, sizeof(rep->idle_note), "connect %zu: %s", n, strerror(-fd));
                        break;
                }
                fds[n] = fd;
                r = raw_hello(fd, 2 * MIB);
                if (r < 0) {
                        snprintf(rep->idle_note, sizeof(rep->idle_note), "hello %zu: %s", n, strerror(-r));
                        break;
                }
        }
        usleep(100000);
        rep->idle_n = n - 1;
        rep->idle_rss_after_kb = proc_status_kb(d.pid, "VmRSS");
        rep->idle_slab_delta_kb = meminfo_kb("Slab") - slab0;
        rep->idle_bytes_per_conn = rep->idle_n ? (double)(rep->idle_rss_after_kb - rep->idle_rss_before_kb) *
                                                         1024.0 / (double)rep->idle_n
                                               : NAN;
        rep->idle_slab_per_conn =
                rep->idle_n ? (double)rep->idle_slab_delta_kb * 1024.0 / (double)rep->idle_n : NAN;
        for (size_t i = 0; i <= n && i <= want_n; i++)
                if (fds[i] > 0)
                        close(fds[i]);
        free(fds);
        daemon_kill(&d);
}

/* ---- ratios, targets, output -----------------------------------------------------------------------------
 */

static void compute_ratios(Report *rep)
{
        for (size_t i = 0; i < rep->n_rows; i++) {
                Row *w = &rep->rows[i];
                const Row *f;
                if (strcmp(w->section, "gpumemd") != 0)
                        continue;
                f = find_row(rep, "floor", w->floor);
                if (!f)
                        continue;
                /* a sequence of k round trips is held against k floors */
                w->ratio_p50 = w->pinned.p50_us / (w->rtts * f->pinned.p50_us);
                w->ratio_p99 = w->pinned.p99_us / (w->rtts * f->pinned.p99_us);
        }
}

static void compute_targets(Report *rep)
{
        const Row *floor = find_row(rep, "floor", "small");
        char m[64], what[96];

        for (size_t i = 0; i < N_BROKER_OPS; i++) {
                const Row *w = find_row(rep, "gpumemd", broker_ops[i].name);
                if (!w || !broker_ops[i].small)
                        continue;
                snprintf(what, sizeof(what), "%s p50 <= 1.3x floor p50 (pinned)", w->name);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->pinned.p50_us, floor->pinned.p50_us);
                add_target(rep, what, m, w->ratio_p50, 1.3, false);
                snprintf(what, sizeof(what), "%s p99 <= 2x floor p99 (pinned)", w->name);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->pinned.p99_us, floor->pinned.p99_us);
                add_target(rep, what, m, w->ratio_p99, 2.0, false);
        }
        {
                const Row *w = find_row(rep, "gpumemd", "dmabuf export (+fd)");
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->pinned.p50_us, floor->pinned.p50_us);
                add_target(rep, "dmabuf export (+fd) p50 <= 1.6x plain floor p50 (pinned)", m, w->ratio_p50,
                           1.6, false);
        }
        for (size_t i = 0; i < rep->n_tput; i++)
                if (rep->tput_clients[i] == 16) {
                        snprintf(m, sizeof(m), "%.0f vs %.0f ops/s", rep->tput_gpumemd[i], rep->tput_raw[i]);
                        add_target(rep, "throughput, 16 clients >= 0.65x thread-per-connection server", m,
                                   rep->tput_gpumemd[i] / rep->tput_raw[i], 0.65, true);
                }
        snprintf(m, sizeof(m), "%.2f us vs %.2f us", rep->iso_loaded.p99_us, rep->iso_idle.p99_us);
        add_target(rep, "ping p99 under slow ops <= 2x idle p99 (pinned)", m,
                   rep->iso_loaded.p99_us / rep->iso_idle.p99_us, 2.0, false);
        for (size_t i = 0; i < rep->n_scale_rows; i++) {
                const Row *w = &rep->scale_rows[i];
                snprintf(what, sizeof(what), "%s p50 at %zu <= 1.2x at %zu allocations", w->name,
                         rep->scale_reached, rep->scale_small);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->unpinned.p50_us, w->pinned.p50_us);
                add_target(rep, what, m, w->ratio_p50, 1.2, false);
        }
        for (size_t i = 0; i < rep->n_many_rows; i++) {
                const Row *w = &rep->many_rows[i];
                snprintf(what, sizeof(what), "%s p50 at %zu <= 1.2x at %zu, %llu fds", w->name,
                         rep->many_reached, rep->many_small, rep->many_nofile);
                snprintf(m, sizeof(m), "%.2f us vs %.2f us", w->unpinned.p50_us, w->pinned.p50_us);
                add_target(rep, what, m, w->ratio_p50, 1.2, false);
        }
        if (rep->many_ran && rep->many_reached < rep->many_want) {
                snprintf(m, sizeof(m), "%zu of %zu", rep->many_reached, rep->many_want);
                add_target(rep, "live allocations held under 20,000 fds", m,
                           (double)rep->many_reached / (double)rep->many_want, 1.0, true);
        }
        if (rep->scale_reached < rep->scale_big) {
                snprintf(m, sizeof(m), "%zu of %zu", rep->scale_reached, rep->scale_big);
                add_target(rep, "live allocations held", m,
                           (double)rep->scale_reached / (double)rep->scale_big, 1.0, true);
        }
        if (rep->idle_n < rep->idle_want) {
                snprintf(m, sizeof(m), "%zu of %zu", rep->idle_n, rep->idle_want);
                add_target(rep, "idle connections held", m, (double)rep->idle_n / (double)rep->idle_want, 1.0,
                           true);
        }
        snprintf(m, sizeof(m), "%.0f bytes over %zu connections", rep->idle_bytes_per_conn, rep->idle_n);
        add_target(rep, "daemon RSS per idle connection < 16 KiB", m, rep->idle_bytes_per_conn / 16384.0, 1.0,
                   false);
        /* "< 16 KiB" is strict */
        if (rep->idle_bytes_per_conn >= 16384.0)
                rep->targets[rep->n_targets - 1].met = false;
}

static void print_lat_cells(const Lat *l)
{
        if (l->n)
                printf(" %9.2f %9.2f", l->p50_us, l->p99_us);
        else
                printf(" %9s %9s", "-", "-");
}

static void print_report(const Settings *st, const Report *rep)
{
        struct utsname u;

        uname(&u);
        printf("\ngpumemd benchmark (%s run) on %s %s, %ld CPUs; model backend, preset %s\n",
               st->long_run ? "long" : "default", u.sysname, u.release, sysconf(_SC_NPROCESSORS_ONLN),
               st->preset);
        printf("Latency: microseconds; 'pinned' = daemon (every thread) and client on CPU %d; 'unpinned' = "
               "scheduler's choice.\nThroughput is unpinned. Ratios use the pinned figures; a sequence of k "
               "round "
               "trips is held against k floors.\n",
               st->cpu_a);
        printf("Frame sizes on the wire: ping %zu/%zu bytes, topology %zu/%zu, dmabuf export reply %zu (+1 "
               "fd)\n\n",
               rep->sz_ping_req, rep->sz_ping_rep, rep->sz_topo_req, rep->sz_topo_rep, rep->sz_export_rep);

        printf("%-11s %-27s %3s %9s %9s %11s %9s %9s  %-14s %6s %6s\n", "section", "operation", "RTT", "p50",
               "p99", "ops/s", "p50", "p99", "floor", "x p50", "x p99");
        printf("%-11s %-27s %3s %9s %9s %11s %9s %9s\n", "", "", "", "pinned", "pinned", "pinned", "unpinned",
               "unpinned");
        for (size_t i = 0; i < rep->n_rows; i++) {
                const Row *w = &rep->rows[i];
                printf("%-11s %-27s %3u", w->section, w->name, w->rtts);
                print_lat_cells(&w->pinned);
                printf(" %11.0f", w->pinned.ops_per_s);
                print_lat_cells(&w->unpinned);
                if (strcmp(w->section, "gpumemd") == 0)
                        printf("  %-14s %6.2f %6.2f", w->floor, w->ratio_p50, w->ratio_p99);
                else if (strcmp(w->section, "in-process") == 0) {
                        const Row *b = find_row(rep, "gpumemd", w->name);
                        if (b)
                                printf("  %-14s %6.2f %6.2f", "(broker/this)",
                                       b->pinned.p50_us / w->pinned.p50_us,
                                       b->pinned.p99_us / w->pinned.p99_us);
                }
                printf("\n");
        }

        printf("\nThroughput (ping, unpinned, %.1f s per point)\n%8s %14s %14s %7s\n", st->tput_seconds,
               "clients", "gpumemd ops/s", "raw ops/s", "ratio");
        for (size_t i = 0; i < rep->n_tput; i++)
                printf("%8u %14.0f %14.0f %7.2f\n", rep->tput_clients[i], rep->tput_gpumemd[i],
                       rep->tput_raw[i], rep->tput_gpumemd[i] / rep->tput_raw[i]);

        printf("\nSmall ops beside slow ones (ping pinned with the daemon's loops on CPU %d; two clients and "
               "the daemon's "
               "workers on CPU %d "
               "run "
               "64 MiB host alloc+free and 64 MiB prefetches)\n",
               st->cpu_a, st->cpu_b);
        printf("  idle:   p50 %8.2f us  p99 %8.2f us\n  loaded: p50 %8.2f us  p99 %8.2f us  (p99 x%.2f)\n",
               rep->iso_idle.p50_us, rep->iso_idle.p99_us, rep->iso_loaded.p50_us, rep->iso_loaded.p99_us,
               rep->iso_loaded.p99_us / rep->iso_idle.p99_us);
        printf("  slow ops: host alloc+free %.1f/s (%.2f ms each), prefetch %.1f/s (%.2f ms each)\n",
               rep->iso_bg_ops_per_s[0], rep->iso_bg_mean_ms[0], rep->iso_bg_ops_per_s[1],
               rep->iso_bg_mean_ms[1]);

        printf("\nScaling: one client holding %zu vs %zu live 4 KiB device allocations (pinned; daemon "
               "RLIMIT_NOFILE %llu)\n",
               rep->scale_small, rep->scale_reached, rep->daemon_nofile);
        if (rep->scale_note[0])
                printf("  %s\n", rep->scale_note);
        printf("%-27s %10s %10s %10s %10s %7s %7s\n", "operation", "p50 small", "p99 small", "p50 large",
               "p99 large", "x p50", "x p99");
        for (size_t i = 0; i < rep->n_scale_rows; i++) {
                const Row *w = &rep->scale_rows[i];
                printf("%-27s %10.2f %10.2f %10.2f %10.2f %7.2f %7.2f\n", w->name, w->pinned.p50_us,
                       w->pinned.p99_us, w->unpinned.p50_us, w->unpinned.p99_us, w->ratio_p50, w->ratio_p99);
        }
        printf("  filling took %.1f s; freeing them all at disconnect kept the daemon busy %.2f s\n",
               rep->scale_fill_seconds, rep->scale_teardown_seconds);

        if (rep->many_ran) {
                printf("\nMany live allocations: one client holding %zu vs %zu live 4 KiB device allocations "
                       "(pinned; daemon RLIMIT_NOFILE %llu, soft and hard)\n",
                       rep->many_small, rep->many_reached, rep->many_nofile);
                if (rep->many_note[0])
                        printf("  %s\n", rep->many_note);
                printf("%-27s %10s %10s %10s %10s %7s %7s\n", "operation", "p50 small", "p99 small",
                       "p50 large", "p99 large", "x p50", "x p99");
                for (size_t i = 0; i < rep->n_many_rows; i++) {
                        const Row *w = &rep->many_rows[i];
                        printf("%-27s %10.2f %10.2f %10.2f %10.2f %7.2f %7.2f\n", w->name, w->pinned.p50_us,
                               w->pinned.p99_us, w->unpinned.p50_us, w->unpinned.p99_us, w->ratio_p50,
                               w->ratio_p99);
                }
                printf("  filling (4 threads, one connection): %.2f us per allocation for the first %zu, "
                       "%.2f us "
                       "for the next %zu (%.1f s)\n",
                       rep->many_fill_small_us, rep->many_small, rep->many_fill_big_us,
                       rep->many_reached - rep->many_small, rep->many_fill_seconds);
                printf("  daemon fds %d at %zu, %d at %zu; daemon RSS %ld KiB at %zu, %ld KiB at %zu (%.0f "
                       "bytes "
                       "per allocation)\n",
                       rep->many_fds_small, rep->many_small, rep->many_fds_big, rep->many_reached,
                       rep->many_rss_small_kb, rep->many_small, rep->many_rss_big_kb, rep->many_reached,
                       rep->many_reached > rep->many_small
                               ? (double)(rep->many_rss_big_kb - rep->many_rss_small_kb) * 1024.0 /
                                         (double)(rep->many_reached - rep->many_small)
                               : NAN);
                printf("  freeing them all at disconnect kept the daemon busy %.2f s\n",
                       rep->many_teardown_seconds);
        }

        printf("\nIdle connections: %zu (each after hello with a 2 MiB window): daemon RSS %ld -> %ld KiB, "
               "%.0f "
               "bytes each; kernel slab %+.0f bytes each%s%s\n",
               rep->idle_n, rep->idle_rss_before_kb, rep->idle_rss_after_kb, rep->idle_bytes_per_conn,
               rep->idle_slab_per_conn, rep->idle_note[0] ? "; " : "", rep->idle_note);

        printf("\nTargets\n");
        for (size_t i = 0; i < rep->n_targets; i++) {
                const Target *t = &rep->targets[i];
                printf("  [%s] %-72s %6.2f (limit %s%.2f)  %s\n", t->met ? "met   " : "MISSED", t->what,
                       t->ratio, t->higher_is_better ? ">=" : "<=", t->limit, t->measured);
        }
        printf("\n");
}

static void json_lat(FILE *f, const char *key, const Lat *l)
{
        fprintf(f,
                "\"%s\": {\"n\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f, \"mean_us\": %.3f, \"ops_per_s\": "
                "%.1f}",
                key, l->n, l->p50_us, l->p99_us, l->mean_us, l->ops_per_s);
}

static double json_num(double v)
{
        return isnan(v) || isinf(v) ? -1 : v;
}

static int write_json(const Settings *st, const Report *rep)
{
        struct utsname u;
        FILE *f = fopen(st->json_path, "we");

        if (!f)
                return -errno;
        uname(&u);
        fprintf(f, "{\n  \"machine\": {\"kernel\": \"%s %s\", \"cpus\": %ld, \"arch\": \"%s\"},\n", u.sysname,
                u.release, sysconf(_SC_NPROCESSORS_ONLN), u.machine);
        fprintf(f,
                "  \"run\": {\"long\": %s, \"pinned_cpu\": %d, \"other_cpu\": %d, \"backend\": \"model\", "
                "\"preset\": \"%s\", \"latency\": \"pinned: daemon and client on one CPU; unpinned beside "
                "it\", "
                "\"throughput\": \"unpinned\"},\n",
                st->long_run ? "true" : "false", st->cpu_a, st->cpu_b, st->preset);
        fprintf(f,
                "  \"frame_sizes\": {\"ping_request\": %zu, \"ping_reply\": %zu, \"topology_request\": %zu, "
                "\"topology_reply\": %zu, \"export_reply\": %zu},\n",
                rep->sz_ping_req, rep->sz_ping_rep, rep->sz_topo_req, rep->sz_topo_rep, rep->sz_export_rep);
        fprintf(f, "  \"latency\": [\n");
        for (size_t i = 0; i < rep->n_rows; i++) {
                const Row *w = &rep->rows[i];
                fprintf(f, "    {\"section\": \"%s\", \"op\": \"%s\", \"round_trips\": %u, \"fd\": %s, ",
                        w->section, w->name, w->rtts, w->fd ? "true" : "false");
                json_lat(f, "pinned", &w->pinned);
                fprintf(f, ", ");
                json_lat(f, "unpinned", &w->unpinned);
                if (strcmp(w->section, "gpumemd") == 0)
                        fprintf(f, ", \"floor\": \"%s\", \"ratio_p50\": %.3f, \"ratio_p99\": %.3f", w->floor,
                                json_num(w->ratio_p50), json_num(w->ratio_p99));
                fprintf(f, "}%s\n", i + 1 < rep->n_rows ? "," : "");
        }
        fprintf(f, "  ],\n  \"throughput\": [\n");
        for (size_t i = 0; i < rep->n_tput; i++)
                fprintf(f,
                        "    {\"clients\": %u, \"gpumemd_ops_per_s\": %.1f, \"raw_ops_per_s\": %.1f, "
                        "\"ratio\": %.3f}%s\n",
                        rep->tput_clients[i], rep->tput_gpumemd[i], rep->tput_raw[i],
                        rep->tput_gpumemd[i] / rep->tput_raw[i], i + 1 < rep->n_tput ? "," : "");
        fprintf(f, "  ],\n  \"isolation\": {");
        json_lat(f, "idle", &rep->iso_idle);
        fprintf(f, ", ");
        json_lat(f, "loaded", &rep->iso_loaded);
        fprintf(f,
                ", \"p99_ratio\": %.3f, \"host_alloc_free_per_s\": %.2f, \"host_alloc_free_ms\": %.3f, "
                "\"prefetch_per_s\": %.2f, \"prefetch_ms\": %.3f},\n",
                json_num(rep->iso_loaded.p99_us / rep->iso_idle.p99_us), rep->iso_bg_ops_per_s[0],
                rep->iso_bg_mean_ms[0], rep->iso_bg_ops_per_s[1], rep->iso_bg_mean_ms[1]);
        fprintf(f,
                "  \"scaling\": {\"small\": %zu, \"large_wanted\": %zu, \"large\": %zu, \"daemon_nofile\": "
                "%llu, "
                "\"fill_seconds\": %.2f, \"teardown_seconds\": %.3f, \"note\": \"%s\", \"ops\": [\n",
                rep->scale_small, rep->scale_want, rep->scale_reached, rep->daemon_nofile,
                rep->scale_fill_seconds, rep->scale_teardown_seconds, rep->scale_note);
        for (size_t i = 0; i < rep->n_scale_rows; i++) {
                const Row *w = &rep->scale_rows[i];
                fprintf(f, "    {\"op\": \"%s\", ", w->name);
                json_lat(f, "small", &w->pinned);
                fprintf(f, ", ");
                json_lat(f, "large", &w->unpinned);
                fprintf(f, ", \"ratio_p50\": %.3f, \"ratio_p99\": %.3f}%s\n", json_num(w->ratio_p50),
                        json_num(w->ratio_p99), i + 1 < rep->n_scale_rows ? "," : "");
        }
        fprintf(f, "  ]},\n");
        if (rep->many_ran) {
                fprintf(f,
                        "  \"many\": {\"small\": %zu, \"large_wanted\": %zu, \"large\": %zu, "
                        "\"daemon_nofile\": %llu, \"fill_us_small\": %.3f, \"fill_us_large\": %.3f, "
                        "\"fill_seconds\": %.2f, \"teardown_seconds\": %.3f, \"daemon_fds_small\": %d, "
                        "\"daemon_fds_large\": %d, \"daemon_rss_kb_small\": %ld, \"daemon_rss_kb_large\": "
                        "%ld, "
                        "\"note\": \"%s\", \"ops\": [\n",
                        rep->many_small, rep->many_want, rep->many_reached, rep->many_nofile,
                        json_num(rep->many_fill_small_us), json_num(rep->many_fill_big_us),
                        rep->many_fill_seconds, rep->many_teardown_seconds, rep->many_fds_small,
                        rep->many_fds_big, rep->many_rss_small_kb, rep->many_rss_big_kb, rep->many_note);
                for (size_t i = 0; i < rep->n_many_rows; i++) {
                        const Row *w = &rep->many_rows[i];
                        fprintf(f, "    {\"op\": \"%s\", ", w->name);
                        json_lat(f, "small", &w->pinned);
                        fprintf(f, ", ");
                        json_lat(f, "large", &w->unpinned);
                        fprintf(f, ", \"ratio_p50\": %.3f, \"ratio_p99\": %.3f}%s\n", json_num(w->ratio_p50),
                                json_num(w->ratio_p99), i + 1 < rep->n_many_rows ? "," : "");
                }
                fprintf(f, "  ]},\n");
        }
        fprintf(f,
                "  \"idle_connections\": {\"n\": %zu, \"rss_before_kb\": %ld, \"rss_after_kb\": %ld, "
                "\"bytes_per_connection\": %.1f, \"kernel_slab_bytes_per_connection\": %.1f, \"note\": "
                "\"%s\"},\n",
                rep->idle_n, rep->idle_rss_before_kb, rep->idle_rss_after_kb,
                json_num(rep->idle_bytes_per_conn), json_num(rep->idle_slab_per_conn), rep->idle_note);
        fprintf(f, "  \"targets\": [\n");
        for (size_t i = 0; i < rep->n_targets; i++) {
                const Target *t = &rep->targets[i];
                fprintf(f,
                        "    {\"target\": \"%s\", \"measured\": \"%s\", \"ratio\": %.3f, \"limit\": %.2f, "
                        "\"higher_is_better\": %s, \"met\": %s}%s\n",
                        t->what, t->measured, json_num(t->ratio), t->limit,
                        t->higher_is_better ? "true" : "false", t->met ? "true" : "false",
                        i + 1 < rep->n_targets ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        return fclose(f) == 0 ? 0 : -errno;
}

/* ---- main ------------------------------------------------------------------------------------------------
 */

static void usage(void)
{
        printf("usage: gpumem-bench --gpumemd PATH --preset DIR [--json FILE] [--long] [--only SECTIONS]\n"
               "  --long (or GPUMEM_BENCH_LONG=1): more iterations, 1M live allocations, 10k idle "
               "connections\n"
               "  GPUMEM_BENCH_ALLOCS=N, GPUMEM_BENCH_CONNS=N override those counts\n"
               "  --only: comma-separated subset of broker (with the "
               "floors),inproc,tput,iso,scale,many,idle;\n"
               "    many (1M live allocations in a daemon limited to 20,000 fds; GPUMEM_BENCH_MANY=N sets\n"
               "    the count) runs in a --long run or when named\n");
}

static bool want(const char *only, const char *what)
{
        return !only || strstr(only, what) != NULL;
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                {"gpumemd", required_argument, NULL, 'd'},
                {"preset", required_argument, NULL, 'p'},
                {"json", required_argument, NULL, 'j'},
                {"long", no_argument, NULL, 'l'},
                {"only", required_argument, NULL, 'o'},
                {"help", no_argument, NULL, 'h'},
                {NULL, 0, NULL, 0},
        };
        static Report rep;
        Settings st = {.json_path = "gpumem-bench.json"};
        const char *only = NULL, *env;
        cpu_set_t mine;
        Daemon d;
        int c, r;

        st.gpumemd = getenv("GPUMEMD");
        while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        st.gpumemd = optarg;
                        break;
                case 'p':
                        st.preset = optarg;
                        break;
                case 'j':
                        st.json_path = optarg;
                        break;
                case 'l':
                        st.long_run = true;
                        break;
                case 'o':
                        only = optarg;
                        break;
                case 'h':
                        usage();
                        return 0;
                default:
                        usage();
                        return 2;
                }
        }
        if (!st.gpumemd || !st.preset) {
                usage();
                return 2;
        }
        env = getenv("GPUMEM_BENCH_LONG");
        if (env && *env && strcmp(env, "0") != 0)
                st.long_run = true;
        st.floor_iters = st.long_run ? 200000 : 40000;
        st.op_iters = st.long_run ? 100000 : 10000;
        st.seq_iters = st.long_run ? 20000 : 2000;
        st.tput_seconds = st.long_run ? 5.0 : 2.0;
        st.scale_small = 1000;
        st.scale_big = st.long_run ? 1000000 : 20000;
        st.idle_conns = 10000;
        st.many_small = 1000;
        st.many_big = 1000000;
        st.many_nofile = 20000;
        if ((env = getenv("GPUMEM_BENCH_MANY")) && atol(env) > 1000)
                st.many_big = (size_t)atol(env);
        if ((env = getenv("GPUMEM_BENCH_ALLOCS")) && atol(env) > 1000)
                st.scale_big = (size_t)atol(env);
        if ((env = getenv("GPUMEM_BENCH_CONNS")) && atol(env) > 0)
                st.idle_conns = (size_t)atol(env);

        /* CPUs this process may use: latency runs on the first, slow neighbours on the second */
        sched_getaffinity(0, sizeof(mine), &mine);
        st.all_cpus = mine;
        st.cpu_a = st.cpu_b = -1;
        for (int i = 0; i < CPU_SETSIZE; i++)
                if (CPU_ISSET(i, &mine)) {
                        if (st.cpu_a < 0)
                                st.cpu_a = i;
                        else if (st.cpu_b < 0)
                                st.cpu_b = i;
                }
        if (st.cpu_b < 0)
                st.cpu_b = st.cpu_a;
        (void)raise_nofile(); /* 10k idle connections live in this process */
        signal(SIGPIPE, SIG_IGN);

        r = daemon_start(&d, &st, NULL, 0);
        if (r < 0)
                die("cannot start %s: %s", st.gpumemd, strerror(-r));
        r = measure_frame_sizes(&rep, d.sock);
        if (r < 0)
                die("cannot measure frame sizes: %s", strerror(-r));
        if (want(only, "broker"))
                run_latency(&st, &rep, &d);
        if (want(only, "inproc"))
                run_inproc(&st, &rep);
        if (want(only, "tput"))
                run_throughput(&st, &rep, &d);
        if (want(only, "iso"))
                run_isolation(&st, &rep, &d);
        daemon_kill(&d);
        if (want(only, "scale"))
                run_scaling(&st, &rep);
        if (only ? want(only, "many") : st.long_run)
                run_many(&st, &rep);
        if (want(only, "idle"))
                run_idle(&st, &rep);

        compute_ratios(&rep);
        if (!only)
                compute_targets(&rep);
        print_report(&st, &rep);
        r = write_json(&st, &rep);
        if (r < 0)
                die("cannot write %s: %s", st.json_path, strerror(-r));
        printf("JSON: %s\n", st.json_path);
        return 0;
}
