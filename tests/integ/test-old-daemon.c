/* The client library against a daemon that speaks only protocol 1: it must frame its hello so that such a
 * daemon can read it, and then speak the version the hello agreed on. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../common/check.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "wire.h"

typedef struct OldDaemon {
        int listen_fd;
        unsigned frames;          /* frames it could read */
        unsigned bad_version;     /* frames whose header was not version 1 */
        bool saw_hello, saw_ping; /* what it read and answered */
} OldDaemon;

/* One reply, framed as protocol 1 frames it. */
static void send_reply(int fd, uint32_t id, Gpumem__Reply *rep)
{
        uint8_t hdr[GM_FRAME_HDR_SIZE], body[4096];
        size_t len = gpumem__reply__get_packed_size(rep);

        if (len > sizeof(body) || gm_frame_hdr_encode(hdr, 1, id, (uint32_t)len, 0) < 0)
                return;
        gpumem__reply__pack(rep, body);
        (void)gm_wire_send(fd, hdr, sizeof(hdr), body, len, NULL, 0, 0);
}

/* A base for a window of @size that is free in this process (a sanitizer may reserve most of the address
 * space, so no fixed address will do): where the kernel places a mapping of that size. */
static uint64_t free_window_base(uint64_t size)
{
        void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

        if (p == MAP_FAILED)
                return 0x200000000000ull;
        munmap(p, size);
        return (uint64_t)(uintptr_t)p;
}

static void *old_daemon(void *arg)
{
        OldDaemon *d = arg;
        int fd = accept(d->listen_fd, NULL, NULL);
        uint8_t buf[GM_FRAME_MAX];

        if (fd < 0)
                return NULL;
        for (;;) {
                int fds[8];
                size_t n_fds = 0;
                GmFrameHdr h;
                const char *why = NULL;
                ssize_t n = gm_wire_recv(fd, buf, sizeof(buf), fds, &n_fds, 0);
                Gpumem__Request *req;
                Gpumem__Reply rep = GPUMEM__REPLY__INIT;
                Gpumem__Status st = GPUMEM__STATUS__INIT;

                if (n <= 0)
                        break;
                gm_wire_close_fds(fds, n_fds);
                /* a protocol-1 daemon reads frames up to version 1 and hangs up on anything newer */
                if (gm_frame_parse(buf, (size_t)n, n_fds, 1, &h, &why) < 0) {
                        d->bad_version++;
                        break;
                }
                d->frames++;
                req = gpumem__request__unpack(NULL, h.body_len, buf + GM_FRAME_HDR_SIZE);
                if (!req)
                        break;
                st.has_code = true;
                rep.status = &st;
                if (req->op_case == GPUMEM__REQUEST__OP_HELLO) {
                        Gpumem__HelloReply hr = GPUMEM__HELLO_REPLY__INIT;
                        hr.has_protocol_version = hr.has_client_id = hr.has_window_base = true;
                        hr.has_window_size = hr.has_page_size = true;
                        hr.protocol_version = 1; /* the lower of its own and the client's */
                        hr.client_id = 7;
                        hr.window_base = free_window_base(1ull << 30);
                        hr.window_size = 1ull << 30;
                        hr.page_size = 4096;
                        hr.server_version = (char *)"0.0.1";
                        hr.backend = (char *)"model";
                        rep.result_case = GPUMEM__REPLY__RESULT_HELLO;
                        rep.hello = &hr;
                        d->saw_hello = true;
                        send_reply(fd, h.request_id, &rep);
                } else if (req->op_case == GPUMEM__REQUEST__OP_PING) {
                        Gpumem__PingReply pr = GPUMEM__PING_REPLY__INIT;
                        pr.has_cookie = true;
                        pr.cookie = req->ping->cookie;
                        rep.result_case = GPUMEM__REPLY__RESULT_PING;
                        rep.ping = &pr;
                        d->saw_ping = true;
                        send_reply(fd, h.request_id, &rep);
                }
                gpumem__request__free_unpacked(req, NULL);
        }
        close(fd);
        return NULL;
}

static void test_protocol_1(void)
{
        char dir[] = "/tmp/gpumemd-old-XXXXXX", path[64], err[256];
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        OldDaemon d = {0};
        gm_client *c = NULL;
        pthread_t t;
        int r;

        CHECK(mkdtemp(dir) != NULL);
        snprintf(path, sizeof(path), "%s/old.sock", dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        d.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        CHECK(d.listen_fd >= 0);
        CHECK_EQ(bind(d.listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        CHECK_EQ(listen(d.listen_fd, 4), 0);
        CHECK_EQ(pthread_create(&t, NULL, old_daemon, &d), 0);

        r = gm_client_open(path, "old-daemon-test", &c, err, sizeof(err));
        CHECK_EQ(r, 0);
        if (r < 0)
                fprintf(stderr, "connect: %s (%s)\n", strerror(-r), err);
        CHECK(d.saw_hello);
        if (c) {
                CHECK_EQ(gm_client_protocol_version(c), 1u);
                CHECK_EQ(gm_ping(c), 0); /* framed as version 1 too, or the old daemon hangs up */
                CHECK(d.saw_ping);
                gm_client_close(c);
        }
        pthread_join(t, NULL);
        CHECK_EQ(d.bad_version, 0u);
        CHECK_EQ(d.frames, 2u);
        close(d.listen_fd);
        unlink(path);
        rmdir(dir);
}

int main(void)
{
        static const TestCase cases[] = {
                {"a protocol-1 daemon: hello it can read, then its version", test_protocol_1}};
        return run_tests(cases, ARRAY_SIZE(cases));
}
