/* Clients carried across a restart: systemd's fd-store protocol (a supervisor of the harness's), and a
 * re-exec on SIGUSR1. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static uint32_t gpu0;

static bool is_disconnect_errno(int r)
{
        return r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN;
}

/* The admin view of client @id (false when the daemon does not list it). */
static bool listed(uint64_t id, gm_client_info *ret)
{
        gm_client *adm = NULL;
        gm_client_info *infos = NULL;
        size_t n = 0;
        bool found = false;

        if (gm_client_connect(dmn.sock, "admin", &adm) != 0)
                return false;
        if (gm_admin_clients(adm, &infos, &n) == 0)
                for (size_t i = 0; i < n; i++)
                        if (infos[i].client_id == id) {
                                if (ret)
                                        *ret = infos[i];
                                found = true;
                        }
        gm_client_info_free(infos, n);
        gm_client_close(adm);
        return found;
}

typedef struct Late {
        pthread_t thread;
        gm_client *c;
        int r;
} Late;

/* A client that connects while no daemon runs: it waits in the listening socket's backlog. */
static void *late_connect(void *arg)
{
        Late *l = arg;
        l->r = gm_client_connect(dmn.sock, "late", &l->c);
        return NULL;
}

static int raw_ping_send(int fd, uint32_t id)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Ping ping = GPUMEM__PING__INIT;
        uint8_t body[64];
        size_t len;

        ping.has_cookie = true;
        ping.cookie = 0x5eed;
        req.op_case = GPUMEM__REQUEST__OP_PING;
        req.ping = &ping;
        len = gpumem__request__pack(&req, body);
        return raw_send_frame(fd, id, body, len, 1, 0, NULL, 0);
}

/*
 * SIGTERM with a supervisor that keeps an fd store, then a start with what it kept: the clients without
 * memory go on over the same connections (same ids, windows and names); a request sent while no daemon ran
 * is answered by the next one; a client that connected meanwhile is served; a client holding memory is
 * closed (memory is not carried yet) and nothing of it is left.
 */
static int store_case(void)
{
        gm_client *a = NULL, *holder = NULL;
        uint64_t a_id, base0, size0, base1, size1;
        gm_client_info info;
        DaemonState s;
        void *p = NULL;
        uint32_t rid = 0;
        int code = 0, raw;
        char reason[128];
        Late late = {0};

        REQUIRE_RC(gm_client_connect(dmn.sock, "carried", &a), 0);
        a_id = gm_client_id(a);
        gm_client_window(a, &base0, &size0);
        CHECK_RC(gm_ping(a), 0);
        raw = raw_connect(dmn.sock);
        CHECK(raw >= 0);
        CHECK_EQ(raw_hello(raw), 0);
        CHECK_RC(gm_client_connect(dmn.sock, "holder", &holder), 0);
        CHECK_RC(gm_malloc(holder, 2 * MiB, gpu0, GM_MEM_HOST_VISIBLE, &p), 0);

        CHECK_EQ(daemon_term(&dmn), 0);
        /* into the store: the listening socket, the state, and the carried clients' sockets and pidfds */
        CHECK(daemon_store_fd(&dmn, "gm-state") >= 0);
        CHECK(daemon_store_fd(&dmn, "gm-listen") >= 0);
        CHECK(daemon_store_count(&dmn) >= 6);
        /* while no daemon runs: a request on a carried connection, and a new client at the door */
        CHECK_EQ(raw_ping_send(raw, 77), 0);
        CHECK_EQ(pthread_create(&late.thread, NULL, late_connect, &late), 0);
        usleep(100000);

        REQUIRE_EQ(daemon_restart_handover(&dmn, "mi300x", NULL), 0);
        CHECK_EQ(raw_recv_reply(raw, &rid, &code, reason, sizeof(reason), 5000), 0);
        CHECK_EQ(rid, 77);
        CHECK_EQ(code, 0);
        CHECK_EQ(pthread_join(late.thread, NULL), 0);
        CHECK_RC(late.r, 0);
        if (late.c) {
                CHECK_RC(gm_ping(late.c), 0);
                CHECK(gm_client_id(late.c) > a_id); /* ids go on from where the old daemon was */
                gm_client_close(late.c);
        }
        /* the same connection, the same client */
        CHECK_RC(gm_ping(a), 0);
        CHECK(listed(a_id, &info));
        CHECK_EQ(info.pid, (uint32_t)getpid());
        gm_client_window(a, &base1, &size1);
        CHECK_EQ(base1, base0);
        CHECK_EQ(size1, size0);
        /* the new daemon holds that window: a second client's window lies elsewhere */
        {
                gm_client *b = NULL;
                uint64_t bb = 0, bs = 0;
                CHECK_RC(gm_client_connect(dmn.sock, "neighbour", &b), 0);
                if (b) {
                        gm_client_window(b, &bb, &bs);
                        CHECK(bb + bs <= base0 || bb >= base0 + size0);
                        gm_client_close(b);
                }
        }
        /* its calls work as before: memory made now is its own */
        {
                void *q = NULL;
                CHECK_RC(gm_malloc(a, 2 * MiB, gpu0, GM_MEM_HOST_VISIBLE, &q), 0);
                if (q) {
                        memset(q, 0x5a, 2 * MiB);
                        CHECK_RC(gm_mem_free(a, q), 0);
                }
        }
        /* the holder's memory lived in the old daemon's KFD context: its connection is closed */
        CHECK(is_disconnect_errno(gm_ping(holder)));
        /* the daemon took its names out of the store once it had the clients back */
        CHECK_EQ(daemon_store_count(&dmn), 0);
        CHECK_EQ(daemon_state(&dmn, &s), 0);
        CHECK_EQ(s.allocations, 0);
        CHECK_EQ(s.bytes_device + s.bytes_host + s.bytes_managed, 0);
        CHECK_EQ(s.clients, 3); /* a, the raw client and the status connection */
        gm_client_close(holder);
        gm_client_close(a);
        close(raw);
        return 0;
}

static void test_store(void)
{
        (void)store_case();
}

/* A state that cannot be read: the daemon starts clean and serves, and the carried sockets are closed. */
static int bad_state_case(void)
{
        gm_client *a = NULL, *b = NULL;
        int fd;

        REQUIRE_RC(gm_client_connect(dmn.sock, "carried", &a), 0);
        CHECK_EQ(daemon_term(&dmn), 0);
        /* an unsealed file in place of the state: anyone could have written it */
        fd = memfd_create("not-a-state", MFD_CLOEXEC);
        CHECK(fd >= 0);
        CHECK_EQ(write(fd, "GMDSTATE garbage", 16), 16);
        daemon_store_put(&dmn, "gm-state", fd);
        REQUIRE_EQ(daemon_restart_handover(&dmn, "mi300x", NULL), 0);
        CHECK(is_disconnect_errno(gm_ping(a)));
        CHECK_RC(gm_client_connect(dmn.sock, "after", &b), 0);
        if (b)
                CHECK_RC(gm_ping(b), 0);
        CHECK_EQ(daemon_store_count(&dmn), 0);
        gm_client_close(b);
        gm_client_close(a);
        return 0;
}

static void test_bad_state(void)
{
        (void)bad_state_case();
}

/* SIGUSR1: the same process runs the program again, the fds inherited; clients go on. */
static int reexec_case(void)
{
        gm_client *a = NULL;
        pid_t pid = dmn.pid;
        uint64_t a_id, base0, size0, base1, size1;

        if (daemon_wrapped()) {
                fprintf(stderr, "re-exec: skipped under a wrapper (it would run the program without it)\n");
                return 0;
        }
        REQUIRE_RC(gm_client_connect(dmn.sock, "carried", &a), 0);
        a_id = gm_client_id(a);
        gm_client_window(a, &base0, &size0);
        daemon_notify_clear(&dmn);
        CHECK_EQ(kill(dmn.pid, SIGUSR1), 0);
        CHECK_EQ(daemon_wait_notify(&dmn, "RELOADING=1", 10000), 0);
        CHECK_EQ(daemon_wait_notify(&dmn, "READY=1", 10000), 0);
        CHECK_EQ(dmn.pid, pid);
        CHECK_RC(gm_ping(a), 0);
        CHECK(listed(a_id, NULL));
        gm_client_window(a, &base1, &size1);
        CHECK_EQ(base1, base0);
        CHECK_EQ(size1, size0);
        gm_client_close(a);
        return 0;
}

static void test_reexec(void)
{
        (void)reexec_case();
}

int main(void)
{
        static const TestCase cases[] = {
                {"restart through the fd store: connections, ids and windows carried", test_store},
                {"a state that cannot be read: the daemon starts clean", test_bad_state},
                {"SIGUSR1 re-executes the daemon, clients carried", test_reexec},
        };
        int r;

        signal(SIGPIPE, SIG_IGN);
        r = daemon_start(&dmn, "mi300x", "[daemon]\nlog-level = notice\n", NULL);
        if (r < 0 || daemon_gpus(&dmn, &gpu0, 1) < 1) {
                fprintf(stderr, "cannot start gpumemd: %s\n", strerror(r < 0 ? -r : ENODEV));
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        r = run_tests(cases, ARRAY_SIZE(cases));
        if (daemon_stop(&dmn) != 0)
                r = EXIT_FAILURE;
        daemon_cleanup(&dmn);
        return r;
}
