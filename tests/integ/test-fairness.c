/* Hostile tenants against the daemon's shared time: its workers, its loops and its admin replies. One case
 * per run (its name is the first argument), each on a daemon of its own. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static DaemonState base;

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int start(const char *config)
{
        uint32_t gpus[16];
        int r = daemon_setup(&dmn, "mi300x", config, NULL, gpus, ARRAY_SIZE(gpus));

        if (r < 0)
                return r;
        /* clients of other uids reach the socket */
        chmod(dmn.dir, 0755);
        chmod(dmn.sock, 0666);
        return daemon_base_state(&dmn, &base);
}

/* The next reply on @fd is @want_id's, with status @want_code. */
static void expect_reply(int fd, uint32_t want_id, int want_code)
{
        char why[256] = "";
        uint32_t id = 0;
        int code = 1;

        CHECK_EQ(raw_recv_reply(fd, &id, &code, why, sizeof(why), 60000), 0);
        CHECK_EQ(id, want_id);
        CHECK_EQ(code, want_code);
        if (code != want_code)
                fprintf(stderr, "reply %u: %s\n", id, why);
}

/* A reply waiting on @fd right now (without blocking). */
static bool reply_waiting(int fd)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};
        return poll(&p, 1, 0) == 1;
}

/* ---- connections of another uid ---- */

/* In a child of another uid: connect (the daemon takes the peer's identity then) and hand the sockets to
 * the parent over the sync socket, then wait for it to hang up. */
static int connect_and_pass(void *arg)
{
        int sync = *(int *)arg, fds[16], n = 0;
        char c;

        if (read(sync, &n, sizeof(n)) != (ssize_t)sizeof(n) || n < 1 || n > 16)
                return 2;
        for (int i = 0; i < n; i++) {
                fds[i] = raw_connect(dmn.sock);
                if (fds[i] < 0)
                        return 3;
        }
        if (raw_send(sync, "x", 1, fds, (size_t)n) < 0)
                return 4;
        (void)!read(sync, &c, 1);
        return 0;
}

/* @n (at most 16) connections to the daemon made by @uid, each after its hello; false when a check failed. */
static bool connect_as(uid_t uid, int n, int *ret_fds)
{
        char buf[1], cbuf[CMSG_SPACE(16 * sizeof(int))];
        struct iovec iov = {buf, 1};
        struct msghdr mh = {
                .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
        struct cmsghdr *cm;
        int sync = -1;
        pid_t pid = fork_as_synced(uid, connect_and_pass, &sync);
        bool ok = false;

        CHECK(pid > 0);
        if (pid <= 0)
                return false;
        if (write(sync, &n, sizeof(n)) == (ssize_t)sizeof(n) && recvmsg(sync, &mh, MSG_CMSG_CLOEXEC) == 1 &&
            (cm = CMSG_FIRSTHDR(&mh)) && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN((size_t)n * sizeof(int))) {
                memcpy(ret_fds, CMSG_DATA(cm), (size_t)n * sizeof(int));
                ok = true;
        }
        CHECK_EQ(child_end(pid, sync), 0);
        CHECK(ok);
        for (int i = 0; ok && i < n; i++)
                CHECK_EQ(raw_hello(ret_fds[i]), 0);
        return ok;
}

/*
 * Two tenants share the workers fairly. A big one (its own uid) has 8 connections, each with a 512 MiB host
 * allocation being populated on the workers (in jobs of 64 MiB: 8 each, 64 in all, 2 running at a time);
 * then a small one (another uid) asks for 4 MiB (one job) on each of its 4 connections. The small tenant's
 * jobs take turns with the big one's: its 4 are started within the next 8 jobs, when no big allocation can
 * have had its 8 slices, so none of the big allocations is answered when the small ones all are. In one
 * queue they came after all eight big ones had started, and so after seven had finished; with whole
 * allocations as jobs, after the two running and one more each (5 of 8 answered).
 */
#define BIG_UID   61001
#define SMALL_UID 61002

static void test_fair_workers(void)
{
        int big[8], small[4], answered = 0;

        if (!connect_as(BIG_UID, 8, big))
                return;
        if (!connect_as(SMALL_UID, 4, small)) {
                for (int i = 0; i < 8; i++)
                        close(big[i]);
                return;
        }
        for (int i = 0; i < 8; i++)
                raw_send_host_alloc(big[i], 100 + (uint32_t)i, 512 * MiB);
        usleep(20 * 1000); /* the daemon has taken them by now */
        for (int i = 0; i < 4; i++)
                raw_send_host_alloc(small[i], 200 + (uint32_t)i, 4 * MiB);
        for (int i = 0; i < 4; i++)
                expect_reply(small[i], 200 + (uint32_t)i, 0);
        for (int i = 0; i < 8; i++)
                answered += reply_waiting(big[i]);
        fprintf(stderr, "big allocations answered when the small tenant's were: %d of 8\n", answered);
        CHECK_EQ(answered, 0);
        for (int i = 0; i < 8; i++) {
                expect_reply(big[i], 100 + (uint32_t)i, 0);
                close(big[i]);
        }
        for (int i = 0; i < 4; i++)
                close(small[i]);
        CHECK(daemon_wait_base(&dmn, &base, 30000, NULL) == 0);
}

#define FAIR_CONFIG "[daemon]\nlog-level = warning\nworker-threads = 2\n[class all]\nmatch-all = yes\n"

/*
 * A free of 1 GiB of host memory the client never mapped (the daemon's mapping and its file are the last
 * holders: the kernel frees every page there) does not stall the loop it came on: a ping of another client
 * of the same loop, sent while the free runs, is answered before the free is. The free's reply still comes
 * after the memory went: the class is refunded by then. The same for a client that goes holding 1 GiB.
 */
static void test_free_off_loop(void)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        Gpumem__Free fr = GPUMEM__FREE__INIT;
        Gpumem__Reply *rep = NULL;
        int fa = raw_connect(dmn.sock), fb = raw_connect(dmn.sock), fds[16];
        size_t n_fds = 0;
        uint64_t handle = 0, used = 1;
        int64_t t0, t_ping;

        CHECK(fa >= 0 && fb >= 0);
        if (fa < 0 || fb < 0)
                goto out;
        CHECK_EQ(raw_hello(fa), 0);
        CHECK_EQ(raw_hello(fb), 0);
        a.has_kind = a.has_size = true;
        a.kind = GPUMEM__MEM_KIND__MEM_KIND_HOST;
        a.size = 1024 * MiB;
        q.op_case = GPUMEM__REQUEST__OP_ALLOC;
        q.alloc = &a;
        CHECK_EQ(raw_request(fa, 10, &q, NULL, 0, (void **)&rep, fds, &n_fds, NULL), 0);
        if (rep && rep->alloc)
                handle = rep->alloc->handle;
        raw_reply_free(rep);
        for (size_t i = 0; i < n_fds; i++)
                close(fds[i]); /* never mapped here */
        CHECK(handle != 0);

        fr.has_handle = true;
        fr.handle = handle;
        q.op_case = GPUMEM__REQUEST__OP_FREE;
        q.free = &fr;
        t0 = now_ms();
        raw_send_request(fa, 11, &q);
        usleep(5 * 1000); /* the loop has taken the free by now */
        raw_send_ping(fb, 12);
        expect_reply(fb, 12, 0);
        t_ping = now_ms();
        CHECK(!reply_waiting(fa));
        expect_reply(fa, 11, 0);
        fprintf(stderr, "the other client's ping answered after %lld ms, the free after %lld ms\n",
                (long long)(t_ping - t0), (long long)(now_ms() - t0));
        CHECK_EQ(daemon_class_quota(&dmn, "all", GM_RESOURCE_HOST, 0, &used, NULL), 0);
        CHECK_EQ(used, 0);

        /* a client that goes holding 1 GiB: its teardown releases the memory on a worker too, so the other
         * client's ping is answered while the memory is still charged (until its file is gone) */
        q.op_case = GPUMEM__REQUEST__OP_ALLOC;
        q.alloc = &a;
        n_fds = 0;
        CHECK_EQ(raw_request(fa, 13, &q, NULL, 0, NULL, fds, &n_fds, NULL), 0);
        for (size_t i = 0; i < n_fds; i++)
                close(fds[i]);
        close(fa);
        fa = -1;
        usleep(5 * 1000); /* the loop has seen it go by now */
        raw_send_ping(fb, 14);
        expect_reply(fb, 14, 0);
        {
                Gpumem__AdminStatus as = GPUMEM__ADMIN_STATUS__INIT;
                q.op_case = GPUMEM__REQUEST__OP_ADMIN_STATUS;
                q.admin_status = &as;
                rep = NULL;
                CHECK_EQ(raw_request(fb, 15, &q, NULL, 0, (void **)&rep, NULL, NULL, NULL), 0);
                CHECK(rep && rep->admin_status && rep->admin_status->bytes_host == 1024 * MiB);
                raw_reply_free(rep);
        }
out:
        if (fa >= 0)
                close(fa);
        if (fb >= 0)
                close(fb);
        CHECK(daemon_wait_base(&dmn, &base, 30000, NULL) == 0);
}

/* one client loop: the two clients share it */
#define FREE_CONFIG "[daemon]\nlog-level = warning\nloops = 1\n[class all]\nmatch-all = yes\n"

/* The handle of the memory at @p of @c. */
static gm_handle handle_of(gm_client *c, void *p)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        return gm_pointer_get_attributes(c, p, &pa) == 0 ? pa.handle : 0;
}

/*
 * The end of a persistent share of 1 GiB whose publisher went: the share's file is the last of the memory,
 * and closing it frees every page. A revoke does that on a worker and is answered once it is done: a ping
 * of another client of the same loop, sent 5 ms after the revoke, is answered before the revoke is.
 */
static void test_share_end(void)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__ShareRevoke sr = GPUMEM__SHARE_REVOKE__INIT;
        gm_client *pub = daemon_client(&dmn, "loader");
        int fa = -1, fb = -1;
        void *host = NULL;

        if (!pub)
                return;
        CHECK_EQ(gm_host_malloc(pub, 1024 * MiB, 0, -1, 0, &host), 0);
        if (host)
                CHECK_EQ(gm_share_publish(pub, handle_of(pub, host), "big/one", GM_SHARE_READ_ONLY, NULL), 0);
        if (host)
                CHECK_EQ(gm_mem_free(pub, host), 0);
        gm_client_close(pub);
        CHECK_EQ(daemon_class_reaches(&dmn, "all", GM_RESOURCE_HANDLES, 1, 10000), 0); /* the share alone */

        fa = raw_connect(dmn.sock);
        fb = raw_connect(dmn.sock);
        CHECK(fa >= 0 && fb >= 0);
        if (fa < 0 || fb < 0)
                goto out;
        {
                /* shares came with protocol 3 */
                Gpumem__Hello h = GPUMEM__HELLO__INIT;
                h.has_protocol_version = true;
                h.protocol_version = GM_PROTOCOL_VERSION;
                q.op_case = GPUMEM__REQUEST__OP_HELLO;
                q.hello = &h;
                CHECK_EQ(raw_request(fa, 1, &q, NULL, 0, NULL, NULL, NULL, NULL), 0);
        }
        CHECK_EQ(raw_hello(fb), 0);
        sr.name = "big/one";
        q.op_case = GPUMEM__REQUEST__OP_SHARE_REVOKE;
        q.share_revoke = &sr;
        raw_send_request(fa, 20, &q);
        usleep(5 * 1000); /* the loop has taken the revoke by now */
        raw_send_ping(fb, 21);
        expect_reply(fb, 21, 0);
        CHECK(!reply_waiting(fa));
        expect_reply(fa, 20, 0);
out:
        if (fa >= 0)
                close(fa);
        if (fb >= 0)
                close(fb);
        CHECK(daemon_wait_base(&dmn, &base, 30000, NULL) == 0);
}

/* one client loop, and root may publish shares that outlive it */
#define SHARE_CONFIG                                                                                         \
        "[daemon]\nlog-level = warning\nloops = 1\n"                                                         \
        "[class all]\nmatch-all = yes\nshare-publish = big/*\nshare-persistent = big/*\n"

/* A client's hello with a small window, sent without waiting for its reply (@fd's replies read later). */
static void send_hello(int fd)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Hello h = GPUMEM__HELLO__INIT;

        h.has_protocol_version = h.has_window_size = true;
        h.protocol_version = GM_PROTOCOL_VERSION;
        h.window_size = 1ull << 30;
        h.client_name = "many";
        q.op_case = GPUMEM__REQUEST__OP_HELLO;
        q.hello = &h;
        raw_send_request(fd, 1, &q);
}

/* Its books made (a memory query): a client with books has a part in the metrics. */
static void send_mem_info(int fd)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__MemInfoGet mi = GPUMEM__MEM_INFO_GET__INIT;

        q.op_case = GPUMEM__REQUEST__OP_MEM_INFO;
        q.mem_info = &mi;
        raw_send_request(fd, 2, &q);
}

/* Lines of @path that start with @prefix. */
static size_t lines_starting(const char *path, const char *prefix)
{
        FILE *f = fopen(path, "re");
        char line[1024];
        size_t n = 0;

        CHECK(f != NULL);
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                n += strncmp(line, prefix, strlen(prefix)) == 0;
        fclose(f);
        return n;
}

#define MANY_CLIENTS 10000
static int n_many; /* clients the fd limits allow, up to MANY_CLIENTS */

/* One part of the metrics text at @cursor on the raw connection @fd: the next part's cursor, 0 at the end or
 * on an error (a check fails). */
static uint64_t metrics_page(int fd, uint64_t cursor)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__AdminMetrics am = GPUMEM__ADMIN_METRICS__INIT;
        Gpumem__Reply *rep = NULL;
        bool transport = false;
        uint64_t next = 0;

        am.has_cursor = true;
        am.cursor = cursor;
        q.op_case = GPUMEM__REQUEST__OP_ADMIN_METRICS;
        q.admin_metrics = &am;
        CHECK_EQ(raw_request(fd, 8, &q, NULL, 0, (void **)&rep, NULL, NULL, &transport), 0);
        if (rep && rep->admin_metrics)
                next = rep->admin_metrics->next;
        raw_reply_free(rep);
        return next;
}

/*
 * Admin replies of any size: with 10,000 clients connected, each with books (about 1.2 KiB of metrics
 * each, 110 of them filled the one frame a reply had), the textfile collector's recipe in docs/policy.md
 * writes every client's series, and the client list holds every client. Both come in pages; a request
 * without paging (an older client's) is answered as before: the whole list in one frame, -EMSGSIZE here.
 */
static void test_admin_many(void)
{
        static int fds[MANY_CLIENTS];
        const char *ctl = getenv("GPUMEMCTL");
        char cmd[1024], prom[256], why[256];
        gm_client_info *infos = NULL;
        size_t n_infos = 0, many = 0;
        gm_client *admin = NULL;
        uint32_t id;
        int code, n = 0;

        CHECK(ctl != NULL);
        if (!ctl)
                return;
        fprintf(stderr, "%d clients\n", n_many);
        for (; n < n_many; n++) {
                fds[n] = raw_connect(dmn.sock);
                CHECK(fds[n] >= 0);
                if (fds[n] < 0)
                        goto out;
                send_hello(fds[n]);
        }
        for (int i = 0; i < n; i++) {
                CHECK_EQ(raw_recv_reply(fds[i], &id, &code, why, sizeof(why), 60000), 0);
                CHECK_EQ(code, 0);
                send_mem_info(fds[i]);
        }
        for (int i = 0; i < n; i++) {
                CHECK_EQ(raw_recv_reply(fds[i], &id, &code, why, sizeof(why), 60000), 0);
                CHECK_EQ(code, 0);
        }

        /* the recipe, as docs/policy.md gives it */
        snprintf(prom, sizeof(prom), "%s/gpumemd.prom", dmn.dir);
        snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' metrics > '%s.tmp' && mv '%s.tmp' '%s'", ctl, dmn.sock,
                 prom, prom, prom);
        CHECK_EQ(system(cmd), 0);
        CHECK_EQ(lines_starting(prom, "gpumemd_client_handles{"), n_many);
        CHECK_EQ(lines_starting(prom, "gpumemd_client_memory_bytes{"), 4 * n_many);
        CHECK_EQ(lines_starting(prom, "gpumemd_connections "), 1);

        admin = daemon_client(&dmn, "admin");
        if (admin) {
                CHECK_EQ(gm_admin_clients(admin, &infos, &n_infos), 0);
                for (size_t i = 0; i < n_infos; i++)
                        many += strcmp(infos[i].name, "many") == 0;
                CHECK_EQ(many, n_many);
                CHECK_EQ(n_infos, n_many + 1);
                gm_client_info_free(infos, n_infos);
        }
        {
                /* an older client's request, with no paging: the one frame it always was */
                Gpumem__Request q = GPUMEM__REQUEST__INIT;
                Gpumem__AdminClients ac = GPUMEM__ADMIN_CLIENTS__INIT;
                int fd = raw_connect(dmn.sock);
                bool transport = false;

                CHECK(fd >= 0);
                CHECK_EQ(raw_hello(fd), 0);
                q.op_case = GPUMEM__REQUEST__OP_ADMIN_CLIENTS;
                q.admin_clients = &ac;
                CHECK_EQ(raw_request(fd, 5, &q, NULL, 0, NULL, NULL, NULL, &transport), -EMSGSIZE);
                CHECK(!transport);
                /* a cursor of no text this connection is reading */
                Gpumem__AdminMetrics am = GPUMEM__ADMIN_METRICS__INIT;
                am.has_cursor = true;
                am.cursor = 7ull << 40 | 5;
                q.op_case = GPUMEM__REQUEST__OP_ADMIN_METRICS;
                q.admin_metrics = &am;
                CHECK_EQ(raw_request(fd, 6, &q, NULL, 0, NULL, NULL, NULL, &transport), -ESTALE);
                /* nor of a text read to its end, once the next text is being read */
                uint64_t first = metrics_page(fd, 0), c = first;
                CHECK(first != 0);
                for (int i = 0; c && i < 10000; i++)
                        c = metrics_page(fd, c);
                CHECK(metrics_page(fd, 0) != 0);
                am.cursor = first;
                CHECK_EQ(raw_request(fd, 7, &q, NULL, 0, NULL, NULL, NULL, &transport), -ESTALE);
                close(fd);
        }
out:
        gm_client_close(admin);
        for (int i = 0; i < n; i++)
                close(fds[i]);
        CHECK(daemon_wait_base(&dmn, &base, 120000, NULL) == 0);
}

/* Room for the clients: connections, fds, and windows (of 1 GiB: 10 TiB in all). */
#define MANY_CONFIG                                                                                          \
        "[daemon]\nlog-level = warning\nmax-connections = 20000\nmax-connections-per-uid = 20000\n"          \
        "window-size = 1G\nmax-window-bytes-per-uid = 16T\n[class all]\nmatch-all = yes\n"

/*
 * This process and the daemon it starts (which raises its soft limit to the hard one it inherits) need an fd
 * per client, the daemon two (the socket and the client's pidfd): as many clients as that allows, up to
 * MANY_CLIENTS (where the hard limit cannot be raised, as in a container without CAP_SYS_RESOURCE).
 */
static int many_clients(void)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return 0;
        if (rl.rlim_max < 3 * MANY_CLIENTS) {
                struct rlimit more = {3 * MANY_CLIENTS, 3 * MANY_CLIENTS};
                if (setrlimit(RLIMIT_NOFILE, &more) == 0)
                        rl = more;
        }
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < 2000)
                return 0;
        return rl.rlim_cur >= 2 * MANY_CLIENTS + 512 ? MANY_CLIENTS : (int)(rl.rlim_cur - 512) / 2;
}

int main(int argc, char **argv)
{
        static const struct {
                const char *name;
                const char *config; /* the daemon's configuration file for the case */
                bool root;          /* needs other uids */
                TestCase tc;
        } cases[] = {
                {"workers",
                 FAIR_CONFIG,
                 true,
                 {"a tenant's slow jobs take turns with another's on the workers", test_fair_workers}},
                {"free",
                 FREE_CONFIG,
                 false,
                 {"a large free runs off its loop, and is answered once the memory went",
                  test_free_off_loop}},
                {"share-end",
                 SHARE_CONFIG,
                 false,
                 {"the end of a large persistent share releases its memory off the loop", test_share_end}},
                {"admin-many",
                 MANY_CONFIG,
                 false,
                 {"admin replies of 10,000 clients come in pages; the textfile recipe works",
                  test_admin_many}},
        };
        int r = EXIT_FAILURE;

        signal(SIGPIPE, SIG_IGN);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                if (argc > 1 && strcmp(argv[1], cases[i].name) == 0) {
                        if (cases[i].root && geteuid() != 0) {
                                fprintf(stderr, "needs root (clients of other uids)\n");
                                return 77;
                        }
                        if (strcmp(cases[i].name, "admin-many") == 0 && (n_many = many_clients()) == 0) {
                                fprintf(stderr, "no fd limit of 2,000 or more\n");
                                return 77;
                        }
                        if (start(cases[i].config) == 0)
                                r = run_tests(&cases[i].tc, 1);
                        if (dmn.pid > 0 && daemon_stop(&dmn) != 0)
                                r = EXIT_FAILURE;
                        daemon_cleanup(&dmn);
                        return r;
                }
        fprintf(stderr, "usage: %s CASE (", argv[0]);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                fprintf(stderr, "%s%s", i ? ", " : "", cases[i].name);
        fprintf(stderr, ")\n");
        return 2;
}
