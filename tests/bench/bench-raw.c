/* gpumem-bench: the raw protocol (frame sizes, idle connections), the SOCK_SEQPACKET floors and the raw
 * echo server of the throughput floor. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "../integ/harness.h"
#include "frame.h"
#include "gpumem.pb-c.h"
#include "wire.h"
#include "bench.h"

/* Send @req with request id 1; receive the reply packet. Returns the request packet length via
 * @ret_req_len, the reply's length, or a negative errno (also for a failed status). */
static ssize_t raw_call(int fd, const Gpumem__Request *req, size_t *ret_req_len)
{
        static uint8_t buf[GM_FRAME_MAX];
        uint8_t hdr[GM_FRAME_HDR_SIZE];
        int fds[GM_FRAME_MAX_FDS];
        size_t len = gpumem__request__get_packed_size(req), n_fds = 0;
        Gpumem__Reply *reply;
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
        r = raw_reply_parse(buf, (size_t)n, n_fds, NULL, (void **)&reply);
        if (r < 0)
                return r;
        r = reply->status->code;
        raw_reply_free(reply);
        return r < 0 ? r : n;
}

int raw_hello_window(int fd, uint64_t window_size)
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

/* The packet of @req and its reply's, their sizes in *@ret_req and *@ret_rep: 0 or a negative errno. */
static int packet_sizes(int fd, const Gpumem__Request *req, size_t *ret_req, size_t *ret_rep)
{
        ssize_t n = raw_call(fd, req, ret_req);

        if (n < 0)
                return (int)n;
        *ret_rep = (size_t)n;
        return 0;
}

/* The size of an export's reply packet as the daemon builds it (status 0, fd index, size). */
static size_t export_reply_size(void)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status status = GPUMEM__STATUS__INIT;
        Gpumem__DmabufExportReply er = GPUMEM__DMABUF_EXPORT_REPLY__INIT;

        status.has_code = true;
        status.reason = "";
        er.has_fd_index = er.has_size = true;
        er.size = 2 * MIB;
        reply.status = &status;
        reply.result_case = GPUMEM__REPLY__RESULT_DMABUF_EXPORT;
        reply.dmabuf_export = &er;
        return GM_FRAME_HDR_SIZE + gpumem__reply__get_packed_size(&reply);
}

/* The packet sizes gpumemd uses for the small ops, measured on the wire, so the floor sends the same. */
int measure_frame_sizes(Report *rep, const char *sock)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Ping ping = GPUMEM__PING__INIT;
        Gpumem__TopologyGet tg = GPUMEM__TOPOLOGY_GET__INIT;
        int fd = raw_connect(sock), r;

        if (fd < 0)
                return fd;
        if (raw_hello_window(fd, 0) < 0) {
                close(fd);
                return -EPROTO;
        }
        ping.has_cookie = true;
        ping.cookie = 0x676d;
        req.op_case = GPUMEM__REQUEST__OP_PING;
        req.ping = &ping;
        r = packet_sizes(fd, &req, &rep->sz_ping_req, &rep->sz_ping_rep);
        if (r == 0) {
                tg.has_with_properties = true;
                tg.with_properties = false;
                req.op_case = GPUMEM__REQUEST__OP_TOPOLOGY;
                req.topology = &tg;
                r = packet_sizes(fd, &req, &rep->sz_topo_req, &rep->sz_topo_rep);
        }
        close(fd);
        if (r == 0)
                rep->sz_export_rep = export_reply_size();
        return r;
}

ssize_t recv_packet(int fd, void *buf, size_t cap, int *ret_fd)
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

int send_packet(int fd, const void *buf, size_t len, int pass_fd)
{
        return send_with_fds(fd, buf, len, &pass_fd, pass_fd >= 0, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
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

void floor_samples(const Settings *st, size_t req_len, size_t rep_len, bool with_fd, int cpu, size_t iters,
                   uint64_t *s)
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
void raw_server_start(RawServer *s, const char *dir, size_t rep_len, const Settings *st)
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

void raw_server_stop(RawServer *s)
{
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        unlink(s->path);
}
