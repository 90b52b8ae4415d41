/* gpumem-wait-bench: what a request-reply round trip costs by the way the server waits for the request. */
#include <errno.h>
#include <liburing.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

/*
 * One client and one server process on a SOCK_SEQPACKET pair, the client sending a ping-sized request and
 * waiting for the ping-sized reply, as gpumemd's clients do. The server receives with recvmsg and room for
 * fds, as gpumemd does, and waits one of these ways:
 *   block        in recvmsg itself: one thread per connection, the benchmark's floor
 *   epoll        epoll_wait, then recvmsg, then sendmsg: gpumemd's event loop (libevent over epoll)
 *   epoll+again  the same, reading again after each reply until EAGAIN
 *   uring        io_uring_enter waiting for a recvmsg the ring made into a buffer of its own (a provided
 *                buffer ring: no buffer per connection), the reply by sendmsg
 *   uring-defer  the same on a ring whose completions run only when its one thread waits (DEFER_TASKRUN)
 *   uring-multi  one multishot recvmsg armed once, on such a ring
 * The rounds interleave the ways, so what the machine does meanwhile falls on all of them alike; the table
 * gives each way's median p50 over the rounds and its ratio to the floor's median, and the median over the
 * rounds of its p50 against the floor's of the same round ('paired'), which holds on a machine whose speed
 * changes in steps between rounds.
 */

enum { M_BLOCK, M_EPOLL, M_AGAIN, M_URING, M_DEFER, M_MULTI, N_MODES };
static const char *const mode_names[N_MODES] = {"block", "epoll",       "epoll+again",
                                                "uring", "uring-defer", "uring-multi"};

enum { REQ_LEN = 22, REP_LEN = 26, BUF_LEN = 4096, N_BUFS = 8, BGID = 1, MAX_FDS = 8 };

static void die(const char *what, int err)
{
        fprintf(stderr, "gpumem-wait-bench: %s: %s\n", what, strerror(err));
        exit(1);
}

static void pin(int cpu)
{
        cpu_set_t set;

        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
                die("sched_setaffinity", errno);
}

typedef struct Rx {
        struct msghdr msg;
        struct iovec iov;
        uint8_t data[BUF_LEN];
        union { /* last: its size is no constant to clang */
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        } control;
} Rx;

static ssize_t rx_recv(int fd, Rx *rx, int flags)
{
        memset(&rx->msg, 0, sizeof(rx->msg));
        rx->iov.iov_base = rx->data;
        rx->iov.iov_len = sizeof(rx->data);
        rx->msg.msg_iov = &rx->iov;
        rx->msg.msg_iovlen = 1;
        rx->msg.msg_control = rx->control.buf;
        rx->msg.msg_controllen = sizeof(rx->control.buf);
        return recvmsg(fd, &rx->msg, flags | MSG_CMSG_CLOEXEC);
}

static int reply(int fd)
{
        static const uint8_t out[REP_LEN];
        struct iovec iov = {.iov_base = (void *)out, .iov_len = sizeof(out)};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

        return sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(out) ? 0 : -1;
}

static void serve_blocking(int fd)
{
        static Rx rx;

        while (rx_recv(fd, &rx, 0) > 0 && reply(fd) == 0)
                ;
}

static void serve_epoll(int fd, bool again)
{
        static Rx rx;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        int ep = epoll_create1(EPOLL_CLOEXEC);

        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
                die("epoll", errno);
        for (;;) {
                ssize_t n;
                if (epoll_wait(ep, &ev, 1, -1) < 0)
                        continue;
                while ((n = rx_recv(fd, &rx, MSG_DONTWAIT)) > 0) {
                        if (reply(fd) < 0)
                                return;
                        if (!again)
                                break;
                }
                if (n == 0 || (n < 0 && errno != EAGAIN))
                        return;
        }
}

/* The ring's buffers: N_BUFS of BUF_LEN bytes, given to the kernel, which picks one per received packet. */
typedef struct Bufs {
        struct io_uring_buf_ring *br;
        uint8_t (*data)[BUF_LEN];
} Bufs;

static void bufs_init(struct io_uring *ring, Bufs *b)
{
        struct io_uring_buf_reg reg = {.ring_entries = N_BUFS, .bgid = BGID};
        int r;

        if (posix_memalign((void **)&b->br, 4096, N_BUFS * sizeof(struct io_uring_buf)) != 0 ||
            !(b->data = malloc(N_BUFS * BUF_LEN)))
                die("buffers", ENOMEM);
        reg.ring_addr = (uintptr_t)b->br;
        if ((r = io_uring_register_buf_ring(ring, &reg, 0)) < 0)
                die("io_uring_register_buf_ring", -r);
        io_uring_buf_ring_init(b->br);
        for (int i = 0; i < N_BUFS; i++)
                io_uring_buf_ring_add(b->br, b->data[i], BUF_LEN, (unsigned short)i,
                                      io_uring_buf_ring_mask(N_BUFS), i);
        io_uring_buf_ring_advance(b->br, N_BUFS);
}

static void buf_give_back(Bufs *b, unsigned id)
{
        io_uring_buf_ring_add(b->br, b->data[id], BUF_LEN, (unsigned short)id, io_uring_buf_ring_mask(N_BUFS),
                              0);
        io_uring_buf_ring_advance(b->br, 1);
}

static void arm_recv(struct io_uring *ring, int fd, struct msghdr *msg, bool multishot)
{
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

        if (multishot)
                io_uring_prep_recvmsg_multishot(sqe, fd, msg, MSG_CMSG_CLOEXEC);
        else
                io_uring_prep_recvmsg(sqe, fd, msg, MSG_CMSG_CLOEXEC);
        /* after a reply the next request is not there yet: wait for it before trying */
        sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = BGID;
}

static void serve_uring(int fd, int mode)
{
        struct io_uring_params p = {0};
        struct io_uring ring;
        static struct msghdr msg;
        static struct iovec iov = {.iov_len = BUF_LEN}; /* its base is the buffer the kernel picks */
        static union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        } control;
        bool multi = mode == M_MULTI;
        Bufs b;
        int r;

        if (mode != M_URING)
                p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
        if ((r = io_uring_queue_init_params(8, &ring, &p)) < 0)
                die("io_uring_queue_init", -r);
        bufs_init(&ring, &b);
        /* the multishot form reads its control length from the header: the rest goes into each buffer */
        msg.msg_control = multi ? NULL : control.buf;
        msg.msg_controllen = multi ? 0 : sizeof(control.buf);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        arm_recv(&ring, fd, &msg, multi);
        for (;;) {
                struct io_uring_cqe *cqe;
                if ((r = io_uring_submit_and_wait(&ring, 1)) < 0 && r != -EINTR)
                        die("io_uring_submit_and_wait", -r);
                while (io_uring_peek_cqe(&ring, &cqe) == 0) {
                        int res = cqe->res;
                        unsigned flags = cqe->flags;
                        io_uring_cqe_seen(&ring, cqe);
                        if (res == -ENOBUFS) { /* every buffer in use: cannot happen with one client */
                                arm_recv(&ring, fd, &msg, multi);
                                continue;
                        }
                        if (res <= 0) {
                                io_uring_queue_exit(&ring);
                                return;
                        }
                        if (flags & IORING_CQE_F_BUFFER)
                                buf_give_back(&b, flags >> IORING_CQE_BUFFER_SHIFT);
                        if (reply(fd) < 0)
                                return;
                        if (!multi || !(flags & IORING_CQE_F_MORE))
                                arm_recv(&ring, fd, &msg, multi);
                }
        }
}

/* @iters round trips (after a tenth as many to warm up) against a server of @mode: the p50, in ns. */
static uint64_t run(int mode, int cpu_server, int cpu_client, size_t iters, uint64_t *s)
{
        uint8_t req[REQ_LEN] = {1}, rep[BUF_LEN];
        int sv[2];
        pid_t pid;

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                die("socketpair", errno);
        pid = fork();
        if (pid < 0)
                die("fork", errno);
        if (pid == 0) {
                close(sv[0]);
                pin(cpu_server);
                if (mode == M_BLOCK)
                        serve_blocking(sv[1]);
                else if (mode == M_EPOLL || mode == M_AGAIN)
                        serve_epoll(sv[1], mode == M_AGAIN);
                else
                        serve_uring(sv[1], mode);
                _exit(0);
        }
        close(sv[1]);
        pin(cpu_client);
        for (size_t i = 0; i < iters + iters / 10; i++) {
                uint64_t t0 = bench_now_ns();
                if (send(sv[0], req, sizeof(req), MSG_NOSIGNAL) != sizeof(req) ||
                    recv(sv[0], rep, sizeof(rep), 0) != REP_LEN)
                        die(mode_names[mode], errno ? errno : EPROTO);
                if (i >= iters / 10)
                        s[i - iters / 10] = bench_now_ns() - t0;
        }
        close(sv[0]);
        waitpid(pid, NULL, 0);
        qsort(s, iters, sizeof(*s), bench_cmp_u64);
        return s[iters / 2];
}

int main(int argc, char **argv)
{
        size_t iters = argc > 1 ? strtoul(argv[1], NULL, 0) : 50000;
        int rounds = argc > 2 ? atoi(argv[2]) : 5;
        int cpu_a = argc > 3 ? atoi(argv[3]) : 0, cpu_b = argc > 4 ? atoi(argv[4]) : 1;
        uint64_t *s = malloc(iters * sizeof(*s)),
                 *p50 = malloc(sizeof(uint64_t) * 2 * N_MODES * (size_t)rounds);
        double *pair = malloc(sizeof(double) * N_MODES * (size_t)rounds);

        if (argc > 5 || iters < 10 || rounds < 1 || !s || !p50 || !pair) {
                fprintf(stderr, "usage: gpumem-wait-bench [ITERS [ROUNDS [CPU_A [CPU_B]]]]\n");
                return 2;
        }
        printf("Round trip of a %d-byte request and a %d-byte reply over SOCK_SEQPACKET, by how the server "
               "waits; p50 in us, median over %d interleaved rounds of %zu\n",
               REQ_LEN, REP_LEN, rounds, iters);
        for (int r = 0; r < rounds; r++)
                for (int two = 0; two < 2; two++)
                        for (int m = 0; m < N_MODES; m++)
                                p50[((size_t)two * N_MODES + (size_t)m) * (size_t)rounds + (size_t)r] =
                                        run(m, two ? cpu_b : cpu_a, cpu_a, iters, s);
        for (int two = 0; two < 2; two++) {
                uint64_t *fl = &p50[((size_t)two * N_MODES + M_BLOCK) * (size_t)rounds];
                uint64_t floor;
                printf(two ? "server on CPU %d, client on CPU %d\n" : "server and client on CPU %d\n",
                       two ? cpu_b : cpu_a, cpu_a);
                /* the pairs first, while every row is still in round order; the floor's row is sorted last */
                for (int m = 0; m < N_MODES; m++) {
                        uint64_t *v = &p50[((size_t)two * N_MODES + (size_t)m) * (size_t)rounds];
                        for (int r = 0; r < rounds; r++)
                                pair[(size_t)m * (size_t)rounds + (size_t)r] = (double)v[r] / (double)fl[r];
                        qsort(&pair[(size_t)m * (size_t)rounds], (size_t)rounds, sizeof(double),
                              bench_cmp_double);
                }
                for (int m = N_MODES - 1; m >= 0; m--)
                        qsort(&p50[((size_t)two * N_MODES + (size_t)m) * (size_t)rounds], (size_t)rounds,
                              sizeof(uint64_t), bench_cmp_u64);
                floor = fl[rounds / 2];
                for (int m = 0; m < N_MODES; m++) {
                        const uint64_t *v = &p50[((size_t)two * N_MODES + (size_t)m) * (size_t)rounds];
                        printf("  %-12s %7.2f  x %.2f  paired x %.2f  (rounds %.2f-%.2f)\n", mode_names[m],
                               v[rounds / 2] / 1e3, (double)v[rounds / 2] / (double)floor,
                               pair[(size_t)m * (size_t)rounds + (size_t)(rounds / 2)], v[0] / 1e3,
                               v[rounds - 1] / 1e3);
                }
        }
        free(pair);
        free(s);
        free(p50);
        return 0;
}
