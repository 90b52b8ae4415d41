/* Integration tests: a real gpumemd on the model, real client processes and raw hostile connections. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"

static Daemon dmn;
static int baseline_fds;

static void test_ready_and_status(void)
{
        CHECK_EQ(daemon_wait_notify(&dmn, "READY=1", 0), 0);
        CHECK_EQ(daemon_wait_notify(&dmn, "STATUS=Serving", 2000), 0);
}

static void test_handshake(void)
{
        gm_client *c = daemon_client(&dmn, "handshake");
        uint64_t base = 0, size = 0;
        uint32_t major = 0, minor = 0;

        if (!c)
                return;
        gm_client_window(c, &base, &size);
        CHECK(base >= (1ull << 40));
        CHECK(size >= (1ull << 30));
        CHECK_EQ(base % (2u << 20), 0);
        /* the window is reserved in this process: nothing else can be mapped there */
        void *p = mmap((void *)(uintptr_t)base, 4096, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(p == MAP_FAILED && errno == EEXIST);
        CHECK(strcmp(gm_client_backend(c), daemon_kfd_preload() ? "kfd" : "model") == 0);
        CHECK(gm_client_server_version(c)[0] != '\0');
        CHECK_EQ(gm_client_protocol_version(c), GM_PROTOCOL_VERSION);
        gm_client_kfd_version(c, &major, &minor);
        CHECK_EQ(major, 1);
        CHECK(minor >= 11);
        CHECK(gm_client_id(c) > 0);
        CHECK_EQ(gm_ping(c), 0);

        /* two clients at once get different windows */
        gm_client *c2 = daemon_client(&dmn, "second");
        if (c2) {
                uint64_t base2;
                gm_client_window(c2, &base2, NULL);
                CHECK(base2 >= base + size || base2 + size <= base);
                gm_client_close(c2);
        }
        gm_client_close(c);
}

/* A client whose address space already uses the window offered gets another one. */
static void test_window_retry(void)
{
        gm_client *a = daemon_client(&dmn, "first"), *b = NULL;
        uint64_t wa = 0, size = 0, wb = 0;
        void *squat;

        if (!a)
                return;
        gm_client_window(a, &wa, &size);
        gm_client_close(a); /* wa is free again: the daemon's first fit offers it to the next client */
        squat = mmap((void *)(uintptr_t)(wa + size / 2), 4096, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(squat != MAP_FAILED);
        usleep(100000); /* the first client's teardown */
        b = daemon_client(&dmn, "second");
        if (b) {
                gm_client_window(b, &wb, NULL);
                CHECK(wb != wa);
                CHECK(wb + size <= (uint64_t)(uintptr_t)squat || wb > (uint64_t)(uintptr_t)squat);
                CHECK_EQ(gm_ping(b), 0);
                gm_client_close(b);
        }
        if (squat != MAP_FAILED)
                munmap(squat, 4096);
}

static void test_topology(void)
{
        gm_client *c = daemon_client(&dmn, "topology");
        gm_topology *t = NULL;
        size_t gpus = 0, cpus = 0;

        if (!c)
                return;
        CHECK_EQ(gm_topology_get(c, true, &t), 0);
        if (t) {
                for (size_t i = 0; i < t->n_nodes; i++) {
                        const gm_topology_node *n = &t->nodes[i];
                        if (n->is_gpu) {
                                gpus++;
                                CHECK(n->gpu_id != 0);
                                CHECK_EQ(n->local_mem_size, 192ull << 30);
                                CHECK_EQ(n->gfx_target_version, 90402);
                                CHECK(n->numa_node == 0 || n->numa_node == 1);
                                CHECK(n->large_bar);
                                CHECK(n->hive_id != 0);
                                CHECK(n->n_properties > 20);
                                CHECK(n->n_io_links >= 8); /* one PCIe link to its CPU and seven XGMI */
                        } else {
                                cpus++;
                                CHECK(n->system_mem_size > 0);
                        }
                }
                gm_topology_free(t);
        }
        CHECK_EQ(gpus, 8);
        CHECK_EQ(cpus, 2);
        gm_client_close(c);
}

static uint32_t first_gpu(gm_client *c);

/* A client that asks for it gets its window below 1 TiB (libhsakmt's limit), above 64 GiB. */
static void test_low_window(void)
{
        gm_client_options o = {
                .struct_size = sizeof(o), .socket_path = dmn.sock, .name = "low", .low_window = true};
        gm_client *c = NULL, *d = NULL, *e = NULL;
        uint64_t base = 0, size = 0;
        char err[256];

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
        /* the sanitizer's shadow memory fills that range in the daemon: it has no low windows to give */
        int r = gm_client_open_with(&o, &c, err, sizeof(err));
        CHECK(r == -ENOMEM || r == -ENOSPC);
        CHECK(c == NULL);
        return;
#endif
        CHECK_EQ(gm_client_open_with(&o, &c, err, sizeof(err)), 0);
        if (c) {
                gm_client_window(c, &base, &size);
                CHECK(base >= (64ull << 30));
                CHECK(base + size <= (1ull << 40));
                CHECK_EQ(gm_ping(c), 0);
                /* objects back to back, as libhsakmt places scratch slices: no guard between them there */
                uint32_t gpu = first_gpu(c);
                void *p[3] = {NULL, NULL, NULL};
                for (int i = 0; i < 3; i++) {
                        gm_alloc_desc ad = {.kind = GM_KIND_DEVICE,
                                            .size = 64 << 10,
                                            .gpu_id = gpu,
                                            .numa_node = -1,
                                            .fixed_addr = (void *)(uintptr_t)(base + (64ull << 20) +
                                                                              (uint64_t)i * (64 << 10))};
                        CHECK_EQ(gm_malloc_desc(c, &ad, &p[i]), 0);
                }
                for (int i = 2; i >= 0; i--)
                        CHECK_EQ(gm_mem_free(c, p[i]), 0);
        }
        /* the others stay above it */
        d = daemon_client(&dmn, "high");
        if (d) {
                gm_client_window(d, &base, &size);
                CHECK(base >= (1ull << 40));
        }
        /* a struct too short to hold the flag is refused, not read past */
        o.struct_size = offsetof(gm_client_options, low_window);
        CHECK_EQ(gm_client_open_with(&o, &e, err, sizeof(err)), -EINVAL);
        CHECK(e == NULL);
        gm_client_close(c);
        gm_client_close(d);
}

/* The topology as sysfs files: every node's gpu_id, name and properties as the decoded topology has them. */
static void test_topology_files(void)
{
        gm_client *c = daemon_client(&dmn, "topology-files");
        gm_topology_file *f = NULL;
        gm_topology *t = NULL;
        size_t n = 0, props_files = 0;

        if (!c)
                return;
        CHECK_EQ(gm_topology_files(c, &f, &n), 0);
        CHECK_EQ(gm_topology_get(c, true, &t), 0);
        CHECK(n > 2 * 10); /* two files of the tree and three per node at least */
        for (size_t i = 0; t && i < n; i++) {
                unsigned node;
                char tail[32];
                CHECK(f[i].path[0] != '/' && !strstr(f[i].path, ".."));
                if (sscanf(f[i].path, "nodes/%u/%31s", &node, tail) != 2 || node >= t->n_nodes)
                        continue;
                const gm_topology_node *tn = &t->nodes[node];
                if (strcmp(tail, "gpu_id") == 0) {
                        CHECK_EQ(strtoul(f[i].content, NULL, 10), tn->gpu_id);
                } else if (strcmp(tail, "name") == 0) {
                        CHECK(strncmp(f[i].content, tn->name, strlen(tn->name)) == 0);
                } else if (strcmp(tail, "properties") == 0) {
                        /* the same lines, in the same order, as the raw properties */
                        const char *p = f[i].content;
                        size_t k = 0;
                        char key[64];
                        unsigned long long v;
                        int used;
                        while (sscanf(p, "%63s %llu\n%n", key, &v, &used) == 2) {
                                CHECK(k < tn->n_properties);
                                if (k < tn->n_properties) {
                                        CHECK(strcmp(key, tn->properties[k].key) == 0);
                                        CHECK_EQ(v, tn->properties[k].value);
                                }
                                k++;
                                p += used;
                        }
                        CHECK_EQ(k, tn->n_properties);
                        props_files++;
                }
        }
        CHECK_EQ(props_files, 10);
        /* and each GPU's tiling: GFX9 keeps no tables, only its address config */
        for (size_t i = 0; t && i < t->n_nodes; i++) {
                gm_tile_config tc;
                if (!t->nodes[i].is_gpu)
                        continue;
                CHECK_EQ(gm_tile_config_get(c, t->nodes[i].gpu_id, &tc), 0);
                CHECK(tc.gb_addr_config != 0);
                for (uint32_t k = 0; k < tc.n_tile; k++)
                        CHECK_EQ(tc.tile[k], 0);
        }
        {
                gm_tile_config tc;
                CHECK_EQ(gm_tile_config_get(c, 12345, &tc), -ENODEV);
        }
        gm_topology_files_free(f, n);
        gm_topology_free(t);
        gm_client_close(c);
}

typedef struct ThreadArg {
        gm_client *c;
        int failures;
} ThreadArg;

static void *pinger(void *p)
{
        ThreadArg *a = p;
        for (int i = 0; i < 300; i++) {
                if (i % 50 == 0) {
                        gm_topology *t = NULL;
                        if (gm_topology_get(a->c, false, &t) < 0)
                                a->failures++;
                        gm_topology_free(t);
                }
                if (gm_ping(a->c) < 0)
                        a->failures++;
        }
        return NULL;
}

static void test_threads(void)
{
        gm_client *c = daemon_client(&dmn, "threads");
        pthread_t th[8];
        ThreadArg args[8];

        if (!c)
                return;
        for (int i = 0; i < 8; i++) {
                args[i] = (ThreadArg){.c = c};
                pthread_create(&th[i], NULL, pinger, &args[i]);
        }
        for (int i = 0; i < 8; i++) {
                pthread_join(th[i], NULL);
                CHECK_EQ(args[i].failures, 0);
        }
        gm_client_close(c);
}

/* One hostile exchange: optional hello, a bad packet, then the expected error reply and a close. */
static void expect_violation(const char *what, bool hello, const void *pkt, size_t len, const int *fds,
                             size_t n_fds, int want_code)
{
        int fd = raw_connect(dmn.sock);
        uint32_t id = 99;
        int code = 0;
        char reason[256] = "";

        CHECK(fd >= 0);
        if (fd < 0)
                return;
        if (hello)
                CHECK_EQ(raw_hello(fd), 0);
        CHECK_EQ(raw_send(fd, pkt, len, fds, n_fds), 0);
        int r = raw_recv_reply(fd, &id, &code, reason, sizeof(reason), 5000);
        if (r != 0 || code != want_code)
                fprintf(stderr, "case '%s': recv %d code %d reason '%s'\n", what, r, code, reason);
        CHECK_EQ(r, 0);
        CHECK_EQ(code, want_code);
        CHECK(reason[0] != '\0');
        CHECK(raw_closed(fd, 5000));
        close(fd);
}

/* A frame of @body into @buf, which has room for @cap bytes: its length, or 0 (a failed check) when it does
 * not fit. */
static size_t frame(uint8_t *buf, size_t cap, uint32_t id, const void *body, size_t body_len,
                    uint16_t version, uint16_t n_fds)
{
        CHECK(cap >= GM_FRAME_HDR_SIZE && body_len <= cap - GM_FRAME_HDR_SIZE);
        if (cap < GM_FRAME_HDR_SIZE || body_len > cap - GM_FRAME_HDR_SIZE)
                return 0;
        gm_frame_hdr_encode(buf, version, id, (uint32_t)body_len, n_fds);
        if (body_len)
                memcpy(buf + GM_FRAME_HDR_SIZE, body, body_len);
        return GM_FRAME_HDR_SIZE + body_len;
}

/* The frame @buf (@len bytes) sent on the raw connection @fd, and the reply read: 0 with the reply's id, code
 * and reason, or a negative errno. */
static int send_for_reply(int fd, const uint8_t *buf, size_t len, uint32_t *ret_id, int *ret_code,
                          char *reason, size_t reason_len)
{
        int r = raw_send(fd, buf, len, NULL, 0);

        return r != 0 ? r : raw_recv_reply(fd, ret_id, ret_code, reason, reason_len, 5000);
}

/* @req as a hello of protocol @version, in @h. */
static void hello_request(Gpumem__Request *req, Gpumem__Hello *h, uint32_t version)
{
        h->has_protocol_version = true;
        h->protocol_version = version;
        req->op_case = GPUMEM__REQUEST__OP_HELLO;
        req->hello = h;
}

static size_t ping_body(uint8_t *buf)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Ping p = GPUMEM__PING__INIT;
        req.op_case = GPUMEM__REQUEST__OP_PING;
        req.ping = &p;
        return gpumem__request__pack(&req, buf);
}

static void test_hostile_frames(void)
{
        static uint8_t big[GM_FRAME_MAX + 512];
        uint8_t buf[512], body[64];
        size_t blen = ping_body(body), len;
        gm_client *bystander = daemon_client(&dmn, "bystander");
        int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

        /* too long: more than the maximum frame */
        len = frame(big, sizeof(big), 5, NULL, 0, 1, 0);
        memset(big + GM_FRAME_HDR_SIZE, 0, sizeof(big) - GM_FRAME_HDR_SIZE);
        expect_violation("too long", true, big, sizeof(big), NULL, 0, -EMSGSIZE);
        /* truncated header */
        len = frame(buf, sizeof(buf), 5, body, blen, 1, 0);
        expect_violation("truncated header", true, buf, 8, NULL, 0, -EBADMSG);
        /* body shorter than the header says */
        expect_violation("truncated body", true, buf, len - 1, NULL, 0, -EBADMSG);
        /* header says one fd, none sent; and an fd the header does not declare */
        len = frame(buf, sizeof(buf), 5, body, blen, 1, 1);
        expect_violation("fd count over", true, buf, len, NULL, 0, -EPROTO);
        len = frame(buf, sizeof(buf), 5, body, blen, 1, 0);
        expect_violation("fd count under", true, buf, len, &devnull, 1, -EPROTO);
        /* fds declared and sent with an op that takes none */
        len = frame(buf, sizeof(buf), 5, body, blen, 1, 1);
        expect_violation("fd on ping", true, buf, len, &devnull, 1, -EPROTO);
        /* wrong magic, wrong version */
        len = frame(buf, sizeof(buf), 5, body, blen, 1, 0);
        buf[1] = 'X';
        expect_violation("bad magic", true, buf, len, NULL, 0, -EPROTO);
        len = frame(buf, sizeof(buf), 5, body, blen, 9, 0);
        expect_violation("bad version", true, buf, len, NULL, 0, -EPROTONOSUPPORT);
        /* garbage protobuf: a ping tag with a length running past the end */
        {
                uint8_t junk[] = {0x12, 0x40, 0x08, 0xff, 0xff};
                len = frame(buf, sizeof(buf), 5, junk, sizeof(junk), 1, 0);
                expect_violation("garbage body", true, buf, len, NULL, 0, -EBADMSG);
                uint8_t notag[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
                len = frame(buf, sizeof(buf), 5, notag, sizeof(notag), 1, 0);
                expect_violation("garbage tag", true, buf, len, NULL, 0, -EBADMSG);
                len = frame(buf, sizeof(buf), 5, NULL, 0, 1, 0);
                expect_violation("empty body", true, buf, len, NULL, 0, -EBADMSG);
        }
        /* two ops in one request */
        {
                uint8_t two[64];
                size_t n = ping_body(two);
                memcpy(two + n, two, n); /* ping twice: unpack keeps one, the tag said one */
                uint8_t hello_then_ping[128];
                Gpumem__Request req = GPUMEM__REQUEST__INIT;
                Gpumem__TopologyGet tg = GPUMEM__TOPOLOGY_GET__INIT;
                req.op_case = GPUMEM__REQUEST__OP_TOPOLOGY;
                req.topology = &tg;
                size_t m = gpumem__request__pack(&req, hello_then_ping);
                memcpy(hello_then_ping + m, two, n);
                len = frame(buf, sizeof(buf), 5, hello_then_ping, m + n, 1, 0);
                expect_violation("two ops", true, buf, len, NULL, 0, -EBADMSG);
        }
        /* a request before hello, and request id 0 */
        len = frame(buf, sizeof(buf), 5, body, blen, 1, 0);
        expect_violation("no hello", false, buf, len, NULL, 0, -EPROTO);
        len = frame(buf, sizeof(buf), 0, body, blen, 1, 0);
        expect_violation("id zero", true, buf, len, NULL, 0, -EPROTO);

        close(devnull);
        /* the daemon kept serving everyone else throughout */
        if (bystander) {
                CHECK_EQ(gm_ping(bystander), 0);
                gm_client_close(bystander);
        }
}

/* Errors that are not violations: a reply with the errno and the connection stays usable. */
static void test_request_errors(void)
{
        int fd = raw_connect(dmn.sock);
        uint8_t buf[256], body[128];
        uint32_t id;
        int code;
        char reason[256];
        size_t len;

        CHECK(fd >= 0);
        if (fd < 0)
                return;
        CHECK_EQ(raw_hello(fd), 0);
        /* an op number this daemon does not know (a newer client) */
        {
                uint8_t unknown[] = {0x9a, 0x06, 0x00}; /* field 99, length-delimited, empty */
                len = frame(buf, sizeof(buf), 7, unknown, sizeof(unknown), 1, 0);
                CHECK_EQ(send_for_reply(fd, buf, len, &id, &code, reason, sizeof(reason)), 0);
                CHECK_EQ(id, 7);
                CHECK_EQ(code, -EOPNOTSUPP);
                CHECK_STR_CONTAINS(reason, "99");
        }
        /* a second hello */
        {
                Gpumem__Request req = GPUMEM__REQUEST__INIT;
                Gpumem__Hello h = GPUMEM__HELLO__INIT;
                hello_request(&req, &h, 1);
                len = frame(buf, sizeof(buf), 8, body, gpumem__request__pack(&req, body), 1, 0);
                CHECK_EQ(send_for_reply(fd, buf, len, &id, &code, reason, sizeof(reason)), 0);
                CHECK_EQ(id, 8);
                CHECK_EQ(code, -EALREADY);
        }
        /* a window retry naming somebody else's window */
        {
                Gpumem__Request req = GPUMEM__REQUEST__INIT;
                Gpumem__WindowRetry w = GPUMEM__WINDOW_RETRY__INIT;
                w.has_failed_base = true;
                w.failed_base = 0x1000;
                req.op_case = GPUMEM__REQUEST__OP_WINDOW_RETRY;
                req.window_retry = &w;
                len = frame(buf, sizeof(buf), 9, body, gpumem__request__pack(&req, body), 1, 0);
                CHECK_EQ(send_for_reply(fd, buf, len, &id, &code, reason, sizeof(reason)), 0);
                CHECK_EQ(code, -EINVAL);
        }
        /* still usable */
        len = frame(buf, sizeof(buf), 10, body, ping_body(body), 1, 0);
        CHECK_EQ(send_for_reply(fd, buf, len, &id, &code, reason, sizeof(reason)), 0);
        CHECK_EQ(id, 10);
        CHECK_EQ(code, 0);
        close(fd);

        /* hello with no protocol version */
        fd = raw_connect(dmn.sock);
        {
                Gpumem__Request req = GPUMEM__REQUEST__INIT;
                Gpumem__Hello h = GPUMEM__HELLO__INIT;
                req.op_case = GPUMEM__REQUEST__OP_HELLO;
                req.hello = &h;
                len = frame(buf, sizeof(buf), 1, body, gpumem__request__pack(&req, body), 1, 0);
                CHECK_EQ(send_for_reply(fd, buf, len, &id, &code, reason, sizeof(reason)), 0);
                CHECK_EQ(code, -EPROTONOSUPPORT);
        }
        close(fd);
}

/* A non-administrator (uid 65534 in a child process) is refused admin ops but served otherwise. */
static void test_non_admin(void)
{
        pid_t pid;
        int status;

        chmod(dmn.dir, 0755);
        chmod(dmn.sock, 0666);
        pid = fork();
        if (pid == 0) {
                gm_client *c = NULL;
                gm_status *s = NULL;
                char msg[256];
                if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
                        _exit(10);
                if (gm_client_connect(dmn.sock, "nobody", &c) < 0)
                        _exit(11);
                if (gm_ping(c) < 0)
                        _exit(12);
                int r = gm_admin_status(c, &s);
                if (r != -EACCES)
                        _exit(13);
                gm_strerror(c, r, msg, sizeof(msg));
                if (!strstr(msg, "administrators"))
                        _exit(14);
                if (gm_admin_disconnect(c, 1) != -EACCES)
                        _exit(15);
                if (gm_ping(c) < 0) /* a denial does not disconnect */
                        _exit(16);
                gm_client_close(c);
                _exit(0);
        }
        CHECK(pid > 0);
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status));
        CHECK_EQ(WEXITSTATUS(status), 0);
        chmod(dmn.sock, 0660);
}

/*
 * An administrator disconnects clients the moment they connect, before their loop may have started them:
 * each disconnect is answered (0, or -ESRCH when it came before the accept), the daemon stays up, and the
 * clients it reached are told so.
 */
static void test_disconnect_at_connect(void)
{
        gm_client *admin = daemon_client(&dmn, "admin");
        gm_client *probe;
        uint64_t next;
        int hit = 0, missed = 0;

        if (!admin)
                return;
        probe = daemon_client(&dmn, "probe");
        if (!probe) {
                gm_client_close(admin);
                return;
        }
        next = gm_client_id(probe) + 1;
        gm_client_close(probe);
        for (int i = 0; i < 200; i++, next++) {
                int fd = raw_connect(dmn.sock);
                int r;

                CHECK(fd >= 0);
                if (fd < 0)
                        break;
                r = gm_admin_disconnect(admin, next);
                CHECK(r == 0 || r == -ESRCH);
                if (r == 0)
                        hit++;
                else
                        missed++;
                close(fd);
        }
        CHECK_EQ(gm_ping(admin), 0);
        fprintf(stderr, "disconnect at connect: %d reached, %d before their accept\n", hit, missed);
        gm_client_close(admin);
}

static void test_admin_status_and_disconnect(void)
{
        gm_client *admin = daemon_client(&dmn, "admin");
        gm_client *victim = daemon_client(&dmn, "victim");
        gm_status *s = NULL;
        gm_client_info *infos = NULL;
        size_t n = 0;
        char msg[256];
        bool found = false;

        if (!admin || !victim) {
                gm_client_close(admin);
                gm_client_close(victim);
                return;
        }
        CHECK_EQ(gm_admin_status(admin, &s), 0);
        if (s) {
                CHECK_EQ(s->clients, 2);
                CHECK_EQ(s->gpus, 8);
                /* the kernel path (under the model's preload) names no preset: it serves what /dev/kfd is */
                CHECK(strcmp(s->backend, daemon_kfd_preload() ? "kfd" : "model") == 0);
                CHECK(strcmp(s->preset, daemon_kfd_preload() ? "" : "mi300x") == 0);
                /* KFD 1.19 (the default): a GPU VM per client */
                CHECK(s->has_private_gpu_vm && s->private_gpu_vm);
                CHECK(s->requests > 0);
                CHECK_EQ(s->pid, dmn.pid);
                gm_status_free(s);
        }
        CHECK_EQ(gm_admin_clients(admin, &infos, &n), 0);
        for (size_t i = 0; i < n; i++) {
                if (infos[i].client_id == gm_client_id(victim)) {
                        found = true;
                        CHECK(strcmp(infos[i].name, "victim") == 0);
                        CHECK_EQ(infos[i].pid, getpid());
                        CHECK_EQ(infos[i].uid, getuid());
                        CHECK(infos[i].cgroup[0] == '/');
                }
        }
        CHECK(found);
        gm_client_info_free(infos, n);

        char *metrics = NULL;
        CHECK_EQ(gm_admin_metrics(admin, &metrics), 0);
        CHECK_STR_CONTAINS(metrics, "gpumemd_connections 2");
        CHECK_STR_CONTAINS(metrics, "# TYPE gpumemd_requests_total counter");
        gm_free(metrics);

        CHECK_EQ(gm_admin_disconnect(admin, 999999), -ESRCH);
        CHECK_EQ(gm_admin_disconnect(admin, gm_client_id(victim)), 0);
        int r = gm_ping(victim);
        CHECK_EQ(r, -ECONNABORTED);
        CHECK_STR_CONTAINS(gm_strerror(victim, r, msg, sizeof(msg)), "administrator");
        /* every later call fails the same way, without touching the socket */
        CHECK_EQ(gm_ping(victim), -ECONNABORTED);
        CHECK_EQ(gm_admin_set_log_level(admin, "loud"), -EINVAL);
        CHECK_EQ(gm_admin_set_log_level(admin, "debug"), 0);
        CHECK_EQ(gm_admin_set_log_level(admin, "info"), 0);
        gm_client_close(victim);
        gm_client_close(admin);
}

static void wait_daemon_fds(int want)
{
        for (int i = 0; i < 250 && daemon_fd_count(&dmn) != want; i++)
                usleep(20000);
}

/* The daemon is back at @fds fds, and a new client (@name) is the only one it serves. */
static void check_left_nothing(int fds, const char *name)
{
        gm_client *c;

        wait_daemon_fds(fds);
        CHECK_EQ(daemon_fd_count(&dmn), fds);
        c = daemon_client(&dmn, name);
        if (c) {
                gm_status *st = NULL;
                CHECK_EQ(gm_admin_status(c, &st), 0);
                if (st)
                        CHECK_EQ(st->clients, 1);
                gm_status_free(st);
                gm_client_close(c);
        }
}

/* The handles the daemon counts for the client with @id (gpumemctl clients). */
static uint32_t handles_of(gm_client *admin, uint64_t id)
{
        gm_client_info *infos = NULL;
        size_t n = 0;
        uint32_t h = UINT32_MAX;

        if (gm_admin_clients(admin, &infos, &n) < 0)
                return h;
        for (size_t i = 0; i < n; i++)
                if (infos[i].client_id == id)
                        h = infos[i].handles;
        gm_client_info_free(infos, n);
        return h;
}

/* KFD events kept by the daemon: set, reset, auto-reset, wait-all, destroy under a wait, bad input. */
static void test_events(void)
{
        gm_client *c = daemon_client(&dmn, "events"), *admin = daemon_client(&dmn, "events-admin");
        uint32_t a = 0, b = 0, m = 0, slot = 99, ids[2];
        EventWaiter w = {0};
        pthread_t th;
        void *page = NULL;

        if (!c || !admin)
                goto out;
        CHECK_EQ(gm_host_malloc(c, 64 << 10, 0, -1, 0, &page), 0);
        CHECK_EQ(gm_event_create(c, 0, true, page, &a, &slot), 0);
        CHECK_EQ(slot, a);
        CHECK_EQ(gm_event_create(c, 0, false, NULL, &m, NULL), 0);
        CHECK(m != a);
        CHECK_EQ(handles_of(admin, gm_client_id(c)), 3); /* the page and two events */

        /* auto-reset: a wait takes it */
        CHECK_EQ(gm_event_wait(c, &a, 1, false, 0), 1);
        CHECK_EQ(gm_event_set(c, a), 0);
        CHECK_EQ(gm_event_wait(c, &a, 1, false, 0), 0);
        CHECK_EQ(gm_event_wait(c, &a, 1, false, 0), 1);
        /* manual reset: it stays set until reset */
        CHECK_EQ(gm_event_set(c, m), 0);
        CHECK_EQ(gm_event_wait(c, &m, 1, false, 0), 0);
        CHECK_EQ(gm_event_wait(c, &m, 1, false, 0), 0);
        CHECK_EQ(gm_event_reset(c, m), 0);
        CHECK_EQ(gm_event_wait(c, &m, 1, false, 50), 1);
        /* all of them */
        ids[0] = a;
        ids[1] = m;
        CHECK_EQ(gm_event_set(c, m), 0);
        CHECK_EQ(gm_event_wait(c, ids, 2, true, 0), 1);
        CHECK_EQ(gm_event_set(c, m), 0);
        CHECK_EQ(gm_event_set(c, a), 0);
        CHECK_EQ(gm_event_wait(c, ids, 2, true, 0), 0);

        /* a wait on an event that is destroyed meanwhile fails as KFD's does */
        CHECK_EQ(gm_event_create(c, 0, true, NULL, &b, NULL), 0);
        w.c = c;
        w.id = b;
        CHECK_EQ(pthread_create(&th, NULL, event_waiter, &w), 0);
        usleep(50 * 1000);
        CHECK_EQ(gm_ping(c), 0); /* the connection goes on meanwhile */
        CHECK_EQ(gm_event_destroy(c, b), 0);
        CHECK_EQ(pthread_join(th, NULL), 0);
        CHECK_EQ(w.result, 2);

        /* bad input changes nothing */
        CHECK_EQ(gm_event_create(c, 99, false, NULL, &b, NULL), -EINVAL);
        CHECK_EQ(gm_event_create(c, 0, false, page, &b, NULL), -EINVAL); /* the page is set already */
        CHECK_EQ(gm_event_wait(c, (uint32_t[]){12345}, 1, false, 0), -EINVAL);
        CHECK_EQ(gm_event_destroy(c, b), -EINVAL);
        CHECK_EQ(gm_event_create(c, 8, false, NULL, &b, NULL), 0);
        CHECK(b >= 0x40000000u);
        CHECK_EQ(gm_event_set(c, b), -EINVAL); /* only signal events are set from the CPU */
        CHECK_EQ(handles_of(admin, gm_client_id(c)), 4);
        CHECK_EQ(gm_event_destroy(c, b), 0);
        CHECK_EQ(gm_event_destroy(c, a), 0);
        CHECK_EQ(gm_event_destroy(c, m), 0);
        CHECK_EQ(handles_of(admin, gm_client_id(c)), 1);
        CHECK_EQ(gm_mem_free(c, page), 0);
out:
        gm_client_close(c);
        gm_client_close(admin);
}

/* The first GPU's id, from the daemon's topology (0 if none). */
static uint32_t first_gpu(gm_client *c)
{
        gm_topology *t = NULL;
        uint32_t id = 0;

        if (gm_topology_get(c, false, &t) < 0)
                return 0;
        for (size_t i = 0; i < t->n_nodes && !id; i++)
                if (t->nodes[i].is_gpu)
                        id = t->nodes[i].gpu_id;
        gm_topology_free(t);
        return id;
}

/* SDMA v4 packets (the model's engine runs them as the GPU does): a fence writes a dword, a trap
 * interrupts with a context id. */
#define SDMA_FENCE 5u
#define SDMA_TRAP  6u

/*
 * A queue the daemon runs in the client's own context: its ring and pointers in GTT host memory both
 * share, packets written here and run there, a trap that reaches the client's event through the daemon;
 * every bad request refused with nothing changed; the class's queue limit; a client that goes with its
 * queue leaves nothing.
 */
static void test_queues(void)
{
        gm_client *c = NULL, *admin = NULL;
        gm_alloc_desc d = {.kind = GM_KIND_HOST, .size = 64 << 10, .flags = GM_MEM_GTT, .numa_node = -1};
        uint32_t gpu = 0, id = 0, ev = 0, slot = 0, second = 0;
        uint64_t db = 0, *page = NULL;
        uint8_t *mem = NULL;
        DaemonState base, now;

        CHECK_EQ(daemon_base_state(&dmn, &base), 0);
        c = daemon_client(&dmn, "queues");
        admin = daemon_client(&dmn, "queues-admin");
        if (!c || !admin)
                goto out;
        gpu = first_gpu(c);
        CHECK(gpu != 0);
        d.gpu_id = gpu;
        CHECK_EQ(gm_malloc_desc(c, &d, (void **)&mem), 0);
        CHECK_EQ(gm_malloc_desc(c, &d, (void **)&page), 0);
        if (!mem || !page)
                goto out;
        /* GTT memory is host memory of the client's own context: read-only or NUMA-bound it is not */
        {
                gm_alloc_desc bad = d;
                void *p = NULL;
                bad.flags |= GM_MEM_READ_ONLY;
                CHECK_EQ(gm_malloc_desc(c, &bad, &p), -EINVAL);
                bad = d;
                bad.kind = GM_KIND_DEVICE;
                CHECK_EQ(gm_malloc_desc(c, &bad, &p), -EINVAL);
                bad = d;
                bad.numa_node = 0; /* the driver places GTT pages */
                CHECK_EQ(gm_malloc_desc(c, &bad, &p), -EINVAL);
        }
        GttQueue g;

        gtt_queue_init(&g, mem, gpu);
        gm_queue_desc q = g.desc;
        /* bad requests: a clear errno, no queue made */
        {
                gm_queue_desc bad = q;
                bad.ring_va = 0x1000;
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -EFAULT);
                bad = q;
                bad.wptr_va = (uintptr_t)mem + (64 << 10) - 4; /* runs past the memory's end */
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -EFAULT);
                bad = q;
                bad.type = 9;
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -EINVAL);
                bad = q;
                bad.ring_size = 3000;
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -EINVAL);
                bad = q;
                bad.gpu_id = 12345;
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -ENODEV);
                /* host memory that is not GTT lives in the daemon's context, which no queue of the client's
                 * reaches */
                void *plain = NULL;
                CHECK_EQ(gm_host_malloc(c, 64 << 10, 0, -1, 0, &plain), 0);
                bad = q;
                bad.ring_va = (uintptr_t)plain;
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -EFAULT);
                CHECK_EQ(gm_mem_free(c, plain), 0);
                /* the daemon rings the doorbell from the write pointer, so it must be memory it can read:
                 * device memory is refused */
                void *vram = NULL;
                CHECK_EQ(gm_malloc(c, 64 << 10, gpu, 0, &vram), 0);
                bad = q;
                bad.wptr_va = (uintptr_t)vram;
                CHECK_EQ(gm_queue_create(c, &bad, &id, &db), -EFAULT);
                CHECK_EQ(gm_mem_free(c, vram), 0);
                CHECK_EQ(gm_queue_destroy(c, 77), -EINVAL);
                CHECK_EQ(gm_queue_update(c, 77, 0, 0, 100, 7), -EINVAL);
                CHECK_EQ(daemon_state(&dmn, &now), 0);
                CHECK_EQ(now.model_queues, base.model_queues);
        }
        CHECK_EQ(gm_queue_create(c, &q, &id, &db), 0);
        CHECK_EQ(db >> 62, 3); /* KFD's doorbell mmap type */
        CHECK_EQ(daemon_state(&dmn, &now), 0);
        CHECK_EQ(now.model_queues, base.model_queues + 1);
        CHECK_EQ(handles_of(admin, gm_client_id(c)), 3); /* two allocations and the queue */

        /* a signal event whose slot in the page the GPU writes, then interrupts for */
        for (size_t i = 0; i < (64 << 10) / 8; i++)
                page[i] = UINT64_MAX;
        CHECK_EQ(gm_event_create(c, 0, false, page, &ev, &slot), 0);
        CHECK_EQ(gm_event_wait(c, &ev, 1, false, 0), 1);
        /* the wait is pending in the daemon before the GPU runs anything: only the interrupt can end it */
        EventWaiter w = {.c = c, .id = ev, .result = -1};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, event_waiter, &w), 0);
        usleep(100000);
        {
                uint64_t slot_va = (uintptr_t)&page[slot];
                const uint32_t p[] = {SDMA_FENCE,
                                      (uint32_t)(uintptr_t)g.fence,
                                      (uint32_t)((uintptr_t)g.fence >> 32),
                                      0xC0FFEEu,
                                      SDMA_FENCE,
                                      (uint32_t)slot_va,
                                      (uint32_t)(slot_va >> 32),
                                      ev,
                                      SDMA_TRAP,
                                      ev};
                memcpy(g.ring, p, sizeof(p));
                __atomic_store_n(g.wptr, (uint64_t)sizeof(p), __ATOMIC_RELEASE);
        }
        CHECK(wait_u32(g.fence, 0xC0FFEEu, 5000));
        pthread_join(th, NULL);
        CHECK_EQ(w.result, 0);
        CHECK_EQ(page[slot], UINT64_MAX); /* acknowledged by the daemon, as KFD does */
        CHECK_EQ(__atomic_load_n(g.rptr, __ATOMIC_ACQUIRE), 40);
        /* a ring moved to where the memory is not: refused, the queue as it was */
        CHECK_EQ(gm_queue_update(c, id, 0x1000, 4096, 100, 7), -EFAULT);
        CHECK_EQ(gm_queue_update(c, id, (uintptr_t)g.ring, 4096, 50, 3), 0);

        /* the class's limit: one queue */
        CHECK_EQ(gm_admin_quota_set(admin, "default", GM_RESOURCE_QUEUES, 0, 1, false), 0);
        CHECK_EQ(gm_queue_create(c, &q, &second, &db), -EDQUOT);
        CHECK_EQ(gm_admin_quota_set(admin, "default", GM_RESOURCE_QUEUES, 0, GM_UNLIMITED, false), 0);
        CHECK_EQ(gm_queue_create(c, &q, &second, &db), 0);
        CHECK_EQ(gm_queue_destroy(c, second), 0);
        CHECK_EQ(gm_queue_destroy(c, second), -EINVAL);
        CHECK_EQ(gm_event_destroy(c, ev), 0);

        /* the memory of a queue's write pointer freed while the queue lives: the daemon, which reads the
         * write pointer to ring the doorbell, reads its own mapping of it and goes on */
        {
                uint64_t *other = NULL;
                CHECK_EQ(gm_malloc_desc(c, &d, (void **)&other), 0);
                gm_queue_desc fq = q;
                fq.wptr_va = (uintptr_t)other;
                CHECK_EQ(gm_queue_create(c, &fq, &second, &db), 0);
                CHECK_EQ(gm_mem_free(c, other), 0);
                usleep(20000); /* the relay looks at every queue at least every millisecond */
                CHECK_EQ(gm_ping(c), 0);
                CHECK_EQ(gm_queue_destroy(c, second), 0);
                CHECK_EQ(handles_of(admin, gm_client_id(c)), 3);
        }

        /* a GPU VM fault: a fence into memory that is gone stops the queue, and a memory event waiting
         * ends with the faulting page, as KFD reports it */
        {
                uint32_t mev = 0;
                void *gone = NULL;
                gm_memory_exception exc[2];
                size_t n_exc = 9;
                CHECK_EQ(gm_host_malloc(c, 4096, 0, -1, 0, &gone), 0);
                CHECK_EQ(gm_mem_free(c, gone), 0);
                CHECK_EQ(gm_event_create(c, 8, false, NULL, &mev, NULL), 0);
                EventWaiter fw = {.c = c, .id = mev, .result = -1};
                pthread_t fth;
                CHECK_EQ(pthread_create(&fth, NULL, event_waiter, &fw), 0);
                usleep(100000);
                const uint32_t p[] = {
                        SDMA_FENCE, (uint32_t)(uintptr_t)gone,    (uint32_t)((uintptr_t)gone >> 32),    1,
                        SDMA_FENCE, (uint32_t)(uintptr_t)g.fence, (uint32_t)((uintptr_t)g.fence >> 32), 2};
                memcpy((uint8_t *)g.ring + 40, p, sizeof(p));
                __atomic_store_n(g.wptr, (uint64_t)(40 + sizeof(p)), __ATOMIC_RELEASE);
                pthread_join(fth, NULL);
                CHECK_EQ(fw.result, 0);
                CHECK_EQ(gm_event_wait_faults(c, &mev, 1, false, 0, exc, 2, &n_exc), 0);
                CHECK_EQ(n_exc, 1);
                CHECK_EQ(exc[0].event_id, mev);
                CHECK_EQ(exc[0].gpu_id, gpu);
                CHECK_EQ(exc[0].va, (uintptr_t)gone & ~4095ull);
                CHECK(exc[0].not_present && !exc[0].read_only);
                usleep(50000);
                CHECK_EQ(*g.fence, 0xC0FFEEu); /* nothing behind the fault ran */
                CHECK_EQ(gm_event_destroy(c, mev), 0);
        }

        /* it goes with the queue alive: the daemon destroys it before the memory it reads */
        gm_client_close(c);
        c = NULL;
        gm_client_close(admin);
        admin = NULL;
        CHECK_EQ(daemon_wait_base(&dmn, &base, 5000, NULL), 0);
out:
        gm_client_close(c);
        gm_client_close(admin);
}

/* One attacker: a fresh client (a fault stops a context's queues for good) with an SDMA or AQL queue on GTT
 * memory of its own, which runs @dw (SDMA dwords) or @pkt (one AQL packet) and must fault at @want_page
 * (0: must not fault) with nothing of the attacker's own changed but its ring. */
typedef struct Attack {
        const char *what;
        bool aql;
        uint32_t dw[16];
        size_t n_dw;
        uint8_t pkt[64];
        uint64_t want_page;
} Attack;

static void run_attack(uint32_t gpu, const Attack *a)
{
        gm_client *c = daemon_client(&dmn, "attacker");
        gm_alloc_desc d = {
                .kind = GM_KIND_HOST, .size = 64 << 10, .gpu_id = gpu, .flags = GM_MEM_GTT, .numa_node = -1};
        gm_memory_exception exc[1];
        uint32_t id = 0, mev = 0;
        uint64_t db = 0;
        uint8_t *mem = NULL;
        size_t n_exc = 0;

        if (!c)
                return;
        CHECK_EQ(gm_malloc_desc(c, &d, (void **)&mem), 0);
        if (!mem)
                goto out;
        memset(mem, 0, 64 << 10);
        uint64_t *rptr = (uint64_t *)(mem + 4096), *wptr = rptr + 1;
        uint8_t *own = mem + 8192; /* the attacker's own data, which nothing may change */
        memset(own, 0x5a, 4096);
        gm_queue_desc q = {.gpu_id = gpu,
                           .type = a->aql ? 2 : 1,
                           .percentage = 100,
                           .ring_va = (uintptr_t)mem,
                           .ring_size = 4096,
                           .rptr_va = (uintptr_t)rptr,
                           .wptr_va = (uintptr_t)wptr};
        CHECK_EQ(gm_queue_create(c, &q, &id, &db), 0);
        CHECK_EQ(gm_event_create(c, 8, false, NULL, &mev, NULL), 0);
        if (a->aql) {
                uint16_t hdr;
                memcpy(mem + 2, a->pkt + 2, 62);
                memcpy(&hdr, a->pkt, 2);
                __atomic_store_n((uint16_t *)mem, hdr, __ATOMIC_RELEASE); /* the header last, as a producer */
                __atomic_store_n(wptr, 1, __ATOMIC_RELEASE);
        } else {
                memcpy(mem, a->dw, a->n_dw * 4);
                __atomic_store_n(wptr, (uint64_t)(a->n_dw * 4), __ATOMIC_RELEASE);
        }
        int r = gm_event_wait_faults(c, &mev, 1, false, a->want_page ? 5000 : 300, exc, 1, &n_exc);
        if (a->want_page) {
                if (r != 0 || n_exc != 1)
                        fprintf(stderr, "attack '%s': no fault (wait %d, %zu faults)\n", a->what, r, n_exc);
                CHECK_EQ(r, 0);
                CHECK_EQ(n_exc, 1);
                if (n_exc == 1) {
                        CHECK_EQ(exc[0].va, a->want_page);
                        CHECK(exc[0].not_present);
                }
        } else {
                CHECK_EQ(r, 1); /* no fault */
        }
        for (size_t i = 0; i < 4096; i++)
                if (own[i] != 0x5a) {
                        fprintf(stderr, "attack '%s': the attacker's own byte %zu changed\n", a->what, i);
                        CHECK(own[i] == 0x5a);
                        break;
                }
out:
        gm_client_close(c);
}

/*
 * Queues follow addresses read from memory their client writes. Every access goes through that client's own
 * GPU VM, which holds its objects alone: a packet aimed at another client's memory, at an address of the
 * daemon's own (its heap, its stack, its code) or at an unmapped VA faults, and the fault is the attacker's
 * memory event; the victim's bytes, the daemon and every other client are untouched.
 */
static void test_queues_hostile(void)
{
        gm_client *v = NULL, *a = NULL;
        gm_alloc_desc d = {.kind = GM_KIND_HOST, .size = 64 << 10, .flags = GM_MEM_GTT, .numa_node = -1};
        uint8_t *vmem = NULL;
        uint32_t gpu, id = 0;
        uint64_t db = 0;
        DaemonState base;
        int heap_probe = 0;

        CHECK_EQ(daemon_base_state(&dmn, &base), 0);
        v = daemon_client(&dmn, "victim");
        if (!v)
                return;
        gpu = first_gpu(v);
        d.gpu_id = gpu;
        CHECK_EQ(gm_malloc_desc(v, &d, (void **)&vmem), 0);
        if (!vmem)
                goto out;
        memset(vmem, 0xab, 64 << 10);
        const uint64_t vva = (uintptr_t)vmem, vpage = vva & ~4095ull;
        /* addresses of the daemon's own: its code, its heap, its stack, from its maps */
        uint64_t daemon_addr[3] = {0};
        {
                char path[64], line[512];
                snprintf(path, sizeof(path), "/proc/%d/maps", (int)dmn.pid);
                FILE *f = fopen(path, "r");
                while (f && fgets(line, sizeof(line), f)) {
                        unsigned long lo = 0, hi = 0;
                        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2)
                                continue;
                        if (strstr(line, "gpumemd") && !daemon_addr[0])
                                daemon_addr[0] = lo;
                        if (strstr(line, "[heap]"))
                                daemon_addr[1] = lo;
                        if (strstr(line, "[stack]"))
                                daemon_addr[2] = hi - 4096;
                }
                if (f)
                        fclose(f);
                heap_probe = daemon_addr[0] != 0;
                CHECK(heap_probe);
        }

        /* a ring or pointer in another client's memory is refused outright */
        a = daemon_client(&dmn, "attacker");
        if (a) {
                gm_alloc_desc ad = d;
                uint8_t *amem = NULL;
                CHECK_EQ(gm_malloc_desc(a, &ad, (void **)&amem), 0);
                gm_queue_desc q = {.gpu_id = gpu,
                                   .type = 1,
                                   .ring_va = vva,
                                   .ring_size = 4096,
                                   .rptr_va = (uintptr_t)amem + 4096,
                                   .wptr_va = (uintptr_t)amem + 4104};
                CHECK_EQ(gm_queue_create(a, &q, &id, &db), -EFAULT);
                q.ring_va = (uintptr_t)amem;
                q.wptr_va = vva;
                CHECK_EQ(gm_queue_create(a, &q, &id, &db), -EFAULT);
                q.wptr_va = daemon_addr[1] ? daemon_addr[1] : 0x1000;
                CHECK_EQ(gm_queue_create(a, &q, &id, &db), -EFAULT);
                gm_client_close(a);
                a = NULL;
        }

        Attack attacks[16];
        size_t n = 0;
        /* SDMA: a fence into the victim, a copy out of the victim, a poll on it, then the daemon's own */
        attacks[n++] = (Attack){.what = "sdma fence into the victim",
                                .dw = {5, (uint32_t)vva, (uint32_t)(vva >> 32), 0xdead},
                                .n_dw = 4,
                                .want_page = vpage};
        for (int k = 0; k < 3; k++)
                if (daemon_addr[k])
                        attacks[n++] = (Attack){
                                .what = "sdma fence into the daemon",
                                .dw = {5, (uint32_t)daemon_addr[k], (uint32_t)(daemon_addr[k] >> 32), 0xdead},
                                .n_dw = 4,
                                .want_page = daemon_addr[k] & ~4095ull};
        attacks[n++] = (Attack){.what = "sdma fence at an unmapped VA",
                                .dw = {5, 0x10000, 0, 0xdead},
                                .n_dw = 4,
                                .want_page = 0x10000};
        /* linear copy (op 1, sub-op 0): 4096 bytes from the victim to... nowhere that counts */
        attacks[n++] = (Attack){.what = "sdma copy out of the victim",
                                .dw = {1, 4095, 0, (uint32_t)vva, (uint32_t)(vva >> 32), 0, 0},
                                .n_dw = 7,
                                .want_page = vpage};
        /* POLL_REGMEM (op 8) on the victim's memory: memory space, equal, retry forever */
        attacks[n++] = (Attack){.what = "sdma poll on the victim",
                                .dw = {8u | (1u << 31) | (3u << 28), (uint32_t)vva, (uint32_t)(vva >> 32),
                                       0xabababab, 0xffffffffu, 0xfff0000u},
                                .n_dw = 6,
                                .want_page = vpage};
        /* AQL: a barrier whose dependency signal, and one whose completion signal, is the victim's */
        {
                Attack b = {.what = "aql barrier depending on the victim's signal",
                            .aql = true,
                            .want_page = vpage};
                uint16_t hdr = 3; /* BARRIER_AND */
                memcpy(b.pkt, &hdr, 2);
                memcpy(b.pkt + 8, &vva, 8);
                attacks[n++] = b;
                Attack s = {.what = "aql completion signal in the victim", .aql = true, .want_page = vpage};
                memcpy(s.pkt, &hdr, 2);
                memcpy(s.pkt + 56, &vva, 8);
                attacks[n++] = s;
        }
        for (size_t i = 0; i < n; i++)
                run_attack(gpu, &attacks[i]);

        /* the victim's bytes and the victim itself */
        for (size_t i = 0; i < (64 << 10); i++)
                if (vmem[i] != 0xab) {
                        fprintf(stderr, "victim byte %zu is 0x%02x\n", i, vmem[i]);
                        CHECK(vmem[i] == 0xab);
                        break;
                }
        CHECK_EQ(gm_ping(v), 0);
        CHECK_EQ(gm_mem_free(v, vmem), 0);
out:
        gm_client_close(v);
        v = NULL;
        CHECK_EQ(daemon_wait_base(&dmn, &base, 5000, NULL), 0);
}

/*
 * The memory behind a client-side KFD's SVM range: GTT host memory at the range's own address outside the
 * window, mapped there in the client and not in the daemon; what it may not be is refused with nothing
 * changed, and a client that goes with it leaves nothing.
 */
static void test_svm_range_memory(void)
{
        gm_client *c = NULL;
        gm_alloc_desc d = {.kind = GM_KIND_HOST,
                           .size = 2 << 20,
                           .flags = GM_MEM_GTT | GM_MEM_SVM_RANGE,
                           .numa_node = -1};
        uint64_t wbase = 0, wsize = 0;
        void *p = NULL, *q = NULL;
        uint8_t *range;
        DaemonState base;

        CHECK_EQ(daemon_base_state(&dmn, &base), 0);
        c = daemon_client(&dmn, "svm-range");
        if (!c)
                return;
        d.gpu_id = first_gpu(c);
        gm_client_window(c, &wbase, &wsize);
        /* a range of this process's own, as HIP maps managed memory */
        range = mmap(NULL, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(range != MAP_FAILED);
        if (range == MAP_FAILED)
                goto out;
        {
                gm_alloc_desc bad = d;
                bad.fixed_addr = range;
                bad.flags = GM_MEM_SVM_RANGE;
                CHECK_EQ(gm_malloc_desc(c, &bad, &q), -EINVAL); /* GTT only */
                bad = d;
                CHECK_EQ(gm_malloc_desc(c, &bad, &q), -EINVAL); /* at a fixed address only */
                bad.fixed_addr = (void *)(uintptr_t)(wbase + (4 << 20));
                CHECK_EQ(gm_malloc_desc(c, &bad, &q), -EINVAL); /* not in the window */
                bad.fixed_addr = (void *)(uintptr_t)(1ull << 47);
                CHECK_EQ(gm_malloc_desc(c, &bad, &q), -EINVAL); /* not past user space */
                bad.fixed_addr = range + 1;
                CHECK_EQ(gm_malloc_desc(c, &bad, &q), -EINVAL); /* page aligned */
                bad = d;
                bad.kind = GM_KIND_DEVICE;
                bad.fixed_addr = range;
                CHECK_EQ(gm_malloc_desc(c, &bad, &q), -EINVAL); /* host memory only */
        }
        d.fixed_addr = range;
        CHECK_EQ(gm_malloc_desc(c, &d, &p), 0);
        CHECK(p == range);
        memset(range, 0x3c, 2 << 20); /* the client's mapping of it */
        {
                gm_alloc_desc again = d;
                again.fixed_addr = range + (1 << 20);
                CHECK_EQ(gm_malloc_desc(c, &again, &q), -EADDRINUSE); /* overlaps the first */
        }
        CHECK_EQ(gm_mem_free(c, p), 0);
        /* the address is the process's again: nothing is mapped there now */
        CHECK(msync(range, 4096, MS_ASYNC) < 0 && errno == ENOMEM);
        d.fixed_addr = range + (2 << 20);
        CHECK_EQ(gm_malloc_desc(c, &d, &p), 0);
        /* it goes with the memory held */
out:
        gm_client_close(c);
        if (range != MAP_FAILED)
                munmap(range, 4 << 20);
        CHECK_EQ(daemon_wait_base(&dmn, &base, 5000, NULL), 0);
}

/* One request of protocol 2 on a raw connection, and (@want_reply) its reply's code. */
static int raw_v2(int fd, uint32_t id, Gpumem__Request *req, bool want_reply)
{
        uint8_t buf[GM_FRAME_HDR_SIZE + 2048], body[2048];
        size_t n = gpumem__request__get_packed_size(req);
        uint32_t got = 0;
        int code = 0;
        char reason[128];

        if (n > sizeof(body))
                return -E2BIG;
        n = gpumem__request__pack(req, body);
        if (raw_send(fd, buf, frame(buf, sizeof(buf), id, body, n, 2, 0), NULL, 0) < 0)
                return -EIO;
        if (!want_reply)
                return 0;
        if (raw_recv_reply(fd, &got, &code, reason, sizeof(reason), 5000) < 0 || got != id)
                return -EPROTO;
        return code;
}

/* A protocol-2 hello on the raw connection @fd, as request 1: 0 or the reply's error. */
static int raw_v2_hello(int fd)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Hello h = GPUMEM__HELLO__INIT;

        hello_request(&req, &h, 2);
        return raw_v2(fd, 1, &req, true);
}

/* A client's events are bounded: the signal slots its page has, and 256 of the other types. */
static void test_events_bounded(void)
{
        gm_client *c = daemon_client(&dmn, "events-bounded");
        uint32_t id, ids[600];
        void *page = NULL;
        size_t n = 0;

        if (!c)
                return;
        /* a 4 KiB event page holds 512 signal slots */
        CHECK_EQ(gm_host_malloc(c, 4096, 0, -1, 0, &page), 0);
        CHECK_EQ(gm_event_create(c, 0, false, page, &ids[n++], NULL), 0);
        while (n < 600 && gm_event_create(c, 0, false, NULL, &ids[n], NULL) == 0)
                n++;
        CHECK_EQ(n, 512);
        CHECK_EQ(gm_event_create(c, 0, false, NULL, &id, NULL), -ENOSPC);
        /* a freed slot is the next one taken */
        CHECK_EQ(gm_event_destroy(c, ids[100]), 0);
        CHECK_EQ(gm_event_create(c, 0, false, NULL, &id, NULL), 0);
        CHECK_EQ(id, ids[100]);
        for (size_t i = 0; i < n; i++)
                CHECK_EQ(gm_event_destroy(c, ids[i]), 0);
        for (n = 0; n < 300 && gm_event_create(c, 8, false, NULL, &ids[n], NULL) == 0; n++)
                ;
        CHECK_EQ(n, 256);
        for (size_t i = 0; i < n; i++)
                CHECK_EQ(gm_event_destroy(c, ids[i]), 0);
        CHECK_EQ(gm_mem_free(c, page), 0);
        gm_client_close(c);
}

/* A client that goes while its waits are pending leaves nothing (raw: the waits are never answered). */
static void test_events_pending_at_exit(void)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__EventCreate ec = GPUMEM__EVENT_CREATE__INIT;
        Gpumem__EventWait ew = GPUMEM__EVENT_WAIT__INIT;
        uint32_t id0 = 0;
        int fd = raw_connect(dmn.sock);

        CHECK(fd >= 0);
        if (fd < 0)
                return;
        CHECK_EQ(raw_v2_hello(fd), 0);
        ec.has_type = true;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_CREATE;
        req.event_create = &ec;
        CHECK_EQ(raw_v2(fd, 2, &req, true), 0); /* the client's first event: id 0 */
        ew.n_event_ids = 1;
        ew.event_ids = &id0;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_WAIT;
        req.event_wait = &ew;
        for (uint32_t i = 0; i < 4; i++)
                CHECK_EQ(raw_v2(fd, 10 + i, &req, false), 0); /* no timeout: pending until the client goes */
        /* the daemon answers other requests meanwhile */
        req.op_case = GPUMEM__REQUEST__OP_EVENT_RESET;
        Gpumem__EventId e = GPUMEM__EVENT_ID__INIT;
        e.has_event_id = true;
        req.event_reset = &e;
        CHECK_EQ(raw_v2(fd, 20, &req, true), 0);
        close(fd);
        check_left_nothing(baseline_fds, "events-after");
}

/* What a hostile client can do with the protocol-2 ops gets a clear error, and others go on meanwhile. */
static void test_v2_ops_hostile(void)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__EventCreate ec = GPUMEM__EVENT_CREATE__INIT;
        Gpumem__EventWait ew = GPUMEM__EVENT_WAIT__INIT;
        Gpumem__TopologyFilesGet tf = GPUMEM__TOPOLOGY_FILES_GET__INIT;
        uint32_t ids[300] = {0};
        gm_client *other = daemon_client(&dmn, "bystander");
        void *dev = NULL;
        int fd = raw_connect(dmn.sock);

        CHECK(fd >= 0);
        if (fd < 0 || !other)
                goto out;
        CHECK_EQ(raw_v2_hello(fd), 0);
        tf.has_from = true;
        tf.from = 1u << 30;
        req.op_case = GPUMEM__REQUEST__OP_TOPOLOGY_FILES;
        req.topology_files = &tf;
        CHECK_EQ(raw_v2(fd, 2, &req, true), -EINVAL);
        /* an event page that is no host memory of this client's: nothing, then someone else's device memory
         */
        ec.has_page_va = true;
        ec.page_va = 0x1000;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_CREATE;
        req.event_create = &ec;
        CHECK_EQ(raw_v2(fd, 3, &req, true), -EINVAL);
        uint32_t gpu[8];
        CHECK(daemon_gpus(&dmn, gpu, 8) > 0);
        CHECK_EQ(gm_malloc(other, 2 << 20, gpu[0], 0, &dev), 0);
        ec.page_va = (uint64_t)(uintptr_t)dev;
        CHECK_EQ(raw_v2(fd, 4, &req, true), -EINVAL);
        ec.has_page_va = false;
        CHECK_EQ(raw_v2(fd, 5, &req, true), 0); /* event 0 */
        /* too many events in one wait */
        ew.n_event_ids = 300;
        ew.event_ids = ids;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_WAIT;
        req.event_wait = &ew;
        CHECK_EQ(raw_v2(fd, 6, &req, true), -EINVAL);
        /* 256 pending waits; the next is refused at once, and the connection and the others go on */
        ew.n_event_ids = 1;
        for (uint32_t i = 0; i < 256; i++)
                CHECK_EQ(raw_v2(fd, 100 + i, &req, false), 0);
        CHECK_EQ(raw_v2(fd, 7, &req, true), -EAGAIN);
        CHECK_EQ(gm_ping(other), 0);
        Gpumem__EventId e = GPUMEM__EVENT_ID__INIT;
        e.has_event_id = true;
        req.op_case = GPUMEM__REQUEST__OP_EVENT_SET;
        req.event_set = &e;
        /* setting it ends all 256 (answered before or after the set's own reply) */
        CHECK_EQ(raw_v2(fd, 8, &req, false), 0);
        {
                unsigned got = 0, set_ok = 0;
                for (int i = 0; i < 257; i++) {
                        uint32_t id = 0;
                        int code = -1;
                        char reason[64];
                        if (raw_recv_reply(fd, &id, &code, reason, sizeof(reason), 5000) < 0)
                                break;
                        if (id == 8)
                                set_ok += code == 0;
                        else if (id >= 100 && id < 356 && code == 0)
                                got++;
                }
                CHECK_EQ(got, 256);
                CHECK_EQ(set_ok, 1);
        }
out:
        if (fd >= 0)
                close(fd);
        if (dev)
                CHECK_EQ(gm_mem_free(other, dev), 0);
        gm_client_close(other);
        /* a version-1 client is told the event ops are newer than what it agreed on */
        fd = raw_connect(dmn.sock);
        if (fd >= 0) {
                CHECK_EQ(raw_hello(fd), 0);
                req.op_case = GPUMEM__REQUEST__OP_EVENT_CREATE;
                req.event_create = &ec;
                uint8_t buf[256], body[128];
                size_t n = gpumem__request__pack(&req, body);
                uint32_t id = 0;
                int code = 0;
                char reason[128];
                CHECK_EQ(raw_send(fd, buf, frame(buf, sizeof(buf), 9, body, n, 1, 0), NULL, 0), 0);
                CHECK_EQ(raw_recv_reply(fd, &id, &code, reason, sizeof(reason), 5000), 0);
                CHECK_EQ(code, -EOPNOTSUPP);
                close(fd);
        }
}

/* A client that floods requests and never reads stalls only itself. */
static void test_flood_without_reading(void)
{
        int fd = raw_connect(dmn.sock);
        uint8_t buf[128], body[64];
        size_t len;
        int sent = 0;

        CHECK(fd >= 0);
        if (fd < 0)
                return;
        CHECK_EQ(raw_hello(fd), 0);
        len = frame(buf, sizeof(buf), 2, body, ping_body(body), 1, 0);
        for (int i = 0; i < 100000; i++) {
                if (send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
                        break;
                sent++;
        }
        CHECK(sent > 100);
        gm_client *other = daemon_client(&dmn, "other");
        if (other) {
                for (int i = 0; i < 100; i++)
                        CHECK_EQ(gm_ping(other), 0);
                gm_client_close(other);
        }
        close(fd);
}

/* A client killed with SIGKILL mid-session leaves nothing behind in the daemon. */

static void ping_forever(gm_client *c, int ready, void *arg)
{
        (void)!write(ready, "x", 1);
        for (;;)
                (void)gm_ping(c);
}

static void test_killed_client(void)
{
        pid_t pid = fork_doomed(&dmn, ping_forever, NULL);

        CHECK(pid > 0);
        usleep(20000);
        kill_and_reap(&pid);
        check_left_nothing(baseline_fds, "after");
}

static void test_daemon_fds_back_to_baseline(void)
{
        wait_daemon_fds(baseline_fds);
        CHECK_EQ(daemon_fd_count(&dmn), baseline_fds);
}

int main(void)
{
        static const TestCase cases[] = {
                {"READY and STATUS notifications", test_ready_and_status},
                {"handshake and VA window", test_handshake},
                {"a window the client cannot reserve is retried", test_window_retry},
                {"topology", test_topology},
                {"topology as sysfs files", test_topology_files},
                {"windows below 1 TiB for clients that ask", test_low_window},
                {"KFD events kept by the daemon", test_events},
                {"user-mode queues run by the daemon, their interrupts relayed", test_queues},
                {"a queue's packets reach its own client's memory alone", test_queues_hostile},
                {"the memory behind an SVM range, outside the window", test_svm_range_memory},
                {"pending event waits of a client that goes", test_events_pending_at_exit},
                {"a client's events are bounded", test_events_bounded},
                {"hostile use of the protocol-2 ops", test_v2_ops_hostile},
                {"threads share one connection", test_threads},
                {"hostile frames get one error and a close", test_hostile_frames},
                {"request errors keep the connection", test_request_errors},
                {"non-administrators are refused admin ops", test_non_admin},
                {"admin status, clients, metrics, disconnect", test_admin_status_and_disconnect},
                {"disconnects the moment clients connect", test_disconnect_at_connect},
                {"flooding without reading stalls only the flooder", test_flood_without_reading},
                {"SIGKILLed client is cleaned up", test_killed_client},
                {"daemon fds back to baseline", test_daemon_fds_back_to_baseline},
        };
        int r;

        signal(SIGPIPE, SIG_IGN);
        if (daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = notice\n", NULL, NULL, 0) < 0)
                return EXIT_FAILURE;
        baseline_fds = daemon_quiet_fd_count(&dmn);
        r = run_tests(cases, ARRAY_SIZE(cases));
        int st = daemon_stop(&dmn);
        if (st != 0) {
                fprintf(stderr, "gpumemd exited with %d\n", st);
                r = EXIT_FAILURE;
        }
        if (daemon_wait_notify(&dmn, "STOPPING=1", 1000) < 0) {
                fprintf(stderr, "no STOPPING=1 notification\n");
                r = EXIT_FAILURE;
        }
        /* Under a supervisor with an fd store the daemon handed its listening socket over, so the file stays
         * for the next start; once the store is emptied (a stop for good) nothing listens there any more. */
        struct stat st_sock;
        if (stat(dmn.sock, &st_sock) == 0) {
                int fd = raw_connect(dmn.sock);
                if (fd >= 0) {
                        fprintf(stderr, "the socket still accepts after the stop\n");
                        close(fd);
                        r = EXIT_FAILURE;
                }
        }
        daemon_cleanup(&dmn);
        return r;
}
