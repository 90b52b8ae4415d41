/* Malicious clients: each hostile input gets its specific error, changes nothing, and harms no one else. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"
#include "wire.h"

#define MiB              (1ull << 20)
#define CONN_CAP_PER_UID 600

static Daemon dmn;
static DaemonState base;
static uint32_t gpus[16];
static size_t n_gpus;

/* A well-behaved client that holds memory of every kind, with data the tests check after every attack. */
static struct {
        gm_client *c;
        void *dev, *host, *managed, *vmm_res;
        gm_handle vmm_handle, dev_handle, host_handle;
} victim;

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fill(void *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i += 64)
                ((unsigned char *)p)[i] = (unsigned char)(seed + i / 64);
}

static bool same(const void *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i += 64)
                if (((const unsigned char *)p)[i] != (unsigned char)(seed + i / 64))
                        return false;
        return true;
}

static void victim_setup(void)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        gm_access_desc rw[2] = {{gpus[0], GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};

        CHECK_EQ(gm_client_connect(dmn.sock, "victim", &victim.c), 0);
        if (!victim.c)
                return;
        CHECK_EQ(gm_malloc(victim.c, 4 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &victim.dev), 0);
        CHECK_EQ(gm_host_malloc(victim.c, 2 * MiB, 0, -1, 0, &victim.host), 0);
        CHECK_EQ(gm_malloc_managed(victim.c, 2 * MiB, 0, &victim.managed), 0);
        CHECK_EQ(gm_mem_address_reserve(victim.c, 4 * MiB, 0, NULL, 0, &victim.vmm_res), 0);
        CHECK_EQ(gm_mem_create(victim.c, 2 * MiB, gpus[0], 0, &victim.vmm_handle), 0);
        CHECK_EQ(gm_mem_map(victim.c, victim.vmm_res, 2 * MiB, 0, victim.vmm_handle), 0);
        CHECK_EQ(gm_mem_set_access(victim.c, victim.vmm_res, 2 * MiB, rw, 2), 0);
        CHECK_EQ(gm_pointer_get_attributes(victim.c, victim.dev, &pa), 0);
        victim.dev_handle = pa.handle;
        CHECK_EQ(gm_pointer_get_attributes(victim.c, victim.host, &pa), 0);
        victim.host_handle = pa.handle;
        fill(victim.dev, 4 * MiB, 1);
        fill(victim.host, 2 * MiB, 2);
        fill(victim.managed, 2 * MiB, 3);
        fill(victim.vmm_res, 2 * MiB, 4);
}

/* The victim's memory and its connection are as they were. */
static void victim_check(const char *after)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int64_t t0 = now_ms(), limit = daemon_wrapped() ? 20000 : 1000; /* valgrind is slow */

        if (!victim.c)
                return;
        CHECK_EQ(gm_ping(victim.c), 0);
        if (now_ms() - t0 > limit)
                fprintf(stderr, "%s: the victim waited %lld ms for a ping\n", after,
                        (long long)(now_ms() - t0));
        CHECK(now_ms() - t0 <= limit);
        CHECK(same(victim.dev, 4 * MiB, 1));
        CHECK(same(victim.host, 2 * MiB, 2));
        CHECK(same(victim.managed, 2 * MiB, 3));
        CHECK(same(victim.vmm_res, 2 * MiB, 4));
        CHECK_EQ(gm_pointer_get_attributes(victim.c, victim.dev, &pa), 0);
        CHECK_EQ(pa.handle, victim.dev_handle);
        CHECK_EQ(gm_pointer_get_attributes(victim.c, victim.host, &pa), 0);
        CHECK_EQ(pa.handle, victim.host_handle);
}

static DaemonState with_victim; /* base plus what the victim holds */

/* Nothing beyond the victim's memory is held; the daemon's fds are its own plus the victim's. */
static void check_back(const char *what)
{
        CHECK_EQ(daemon_wait_base_after(&dmn, &with_victim, what), 0);
        victim_check(what);
}

static bool state_same(const DaemonState *a, const DaemonState *b)
{
        return daemon_state_same_but(a, b, DAEMON_STATE_IMPORTS | DAEMON_STATE_QUEUES | DAEMON_STATE_FDS);
}

/* ---- a raw client ---------------------------------------------------------------------------------- */

typedef struct Raw {
        int fd;
        uint32_t next_id;
        uint64_t base, size; /* its VA window */
} Raw;

static Gpumem__Request *req_vmm_create(uint64_t size, uint32_t gpu);
static Gpumem__Request *req_handle_op(int op, uint64_t handle);
static int rq(Raw *r, Gpumem__Request *q, const int *fds, size_t n_fds);

static bool raw_open(Raw *r)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Hello h = GPUMEM__HELLO__INIT;
        Gpumem__Reply *rep = NULL;
        int code;

        memset(r, 0, sizeof(*r));
        r->next_id = 1;
        r->fd = raw_connect(dmn.sock);
        CHECK(r->fd >= 0);
        if (r->fd < 0)
                return false;
        h.has_protocol_version = true;
        h.protocol_version = 1;
        h.client_name = "attacker";
        q.op_case = GPUMEM__REQUEST__OP_HELLO;
        q.hello = &h;
        code = raw_request(r->fd, r->next_id++, &q, NULL, 0, (void **)&rep, NULL, NULL, NULL);
        CHECK_EQ(code, 0);
        if (code == 0 && rep && rep->hello) {
                r->base = rep->hello->window_base;
                r->size = rep->hello->window_size;
        }
        raw_reply_free(rep);
        if (code != 0)
                return false;
        /* The client's own KFD context is made at its first memory operation and lives as long as the
         * client: make it now, so "nothing changed" below is about the failing requests alone. */
        rep = NULL;
        code = raw_request(r->fd, r->next_id++, req_vmm_create(4096, gpus[0]), NULL, 0, (void **)&rep, NULL,
                           NULL, NULL);
        CHECK_EQ(code, 0);
        if (code == 0 && rep && rep->vmm_create)
                CHECK_EQ(rq(r, req_handle_op(2, rep->vmm_create->handle), NULL, 0), 0);
        raw_reply_free(rep);
        return code == 0;
}

static void raw_close(Raw *r)
{
        if (r->fd >= 0)
                close(r->fd);
        r->fd = -1;
}

/* Send @q; return the code, with fds that come back closed. */
static int rq(Raw *r, Gpumem__Request *q, const int *fds, size_t n_fds)
{
        return raw_request(r->fd, r->next_id++, q, fds, n_fds, NULL, NULL, NULL, NULL);
}

/* A request that must fail with @want and change nothing in the daemon. */
#define EXPECT_CLEAN(r, q, fds, n_fds, want)                                                                 \
        do {                                                                                                 \
                DaemonState _s0, _s1;                                                                        \
                CHECK_EQ(daemon_state(&dmn, &_s0), 0);                                                       \
                int _code = rq((r), (q), (fds), (n_fds));                                                    \
                if (_code != (want))                                                                         \
                        check_failed(__FILE__, __LINE__, "%s -> %d, want %d", #q, _code, (want));            \
                CHECK_EQ(daemon_state(&dmn, &_s1), 0);                                                       \
                CHECK(state_same(&_s0, &_s1));                                                               \
        } while (0)

/* Request builders: one op each, fields as given. */
static Gpumem__Alloc alloc_m;
static Gpumem__Request *req_alloc(Gpumem__MemKind kind, uint64_t size, uint32_t gpu, uint64_t fixed)
{
        static Gpumem__Request q;
        gpumem__request__init(&q);
        gpumem__alloc__init(&alloc_m);
        alloc_m.has_kind = alloc_m.has_size = alloc_m.has_gpu_id = alloc_m.has_fixed_va = true;
        alloc_m.kind = kind;
        alloc_m.size = size;
        alloc_m.gpu_id = gpu;
        alloc_m.fixed_va = fixed;
        q.op_case = GPUMEM__REQUEST__OP_ALLOC;
        q.alloc = &alloc_m;
        return &q;
}

static Gpumem__Request *req_handle_op(int op, uint64_t handle)
{
        static Gpumem__Request q;
        static Gpumem__Free f;
        static Gpumem__DmabufExport e;
        static Gpumem__VmmRelease rel;
        static Gpumem__VmmProperties pr;
        static Gpumem__MapToGpus mp;
        static Gpumem__UnmapFromGpus ump;
        gpumem__request__init(&q);
        switch (op) {
        case 0:
                gpumem__free__init(&f);
                f.has_handle = true;
                f.handle = handle;
                q.op_case = GPUMEM__REQUEST__OP_FREE;
                q.free = &f;
                break;
        case 1:
                gpumem__dmabuf_export__init(&e);
                e.has_handle = true;
                e.handle = handle;
                q.op_case = GPUMEM__REQUEST__OP_DMABUF_EXPORT;
                q.dmabuf_export = &e;
                break;
        case 2:
                gpumem__vmm_release__init(&rel);
                rel.has_handle = true;
                rel.handle = handle;
                q.op_case = GPUMEM__REQUEST__OP_VMM_RELEASE;
                q.vmm_release = &rel;
                break;
        case 3:
                gpumem__vmm_properties__init(&pr);
                pr.has_handle = true;
                pr.handle = handle;
                q.op_case = GPUMEM__REQUEST__OP_VMM_PROPERTIES;
                q.vmm_properties = &pr;
                break;
        case 4:
                gpumem__map_to_gpus__init(&mp);
                mp.has_handle = true;
                mp.handle = handle;
                mp.n_gpu_ids = 1;
                mp.gpu_ids = gpus;
                q.op_case = GPUMEM__REQUEST__OP_MAP;
                q.map = &mp;
                break;
        default:
                gpumem__unmap_from_gpus__init(&ump);
                ump.has_handle = true;
                ump.handle = handle;
                q.op_case = GPUMEM__REQUEST__OP_UNMAP;
                q.unmap = &ump;
                break;
        }
        return &q;
}

static Gpumem__Request *req_vmm_reserve(uint64_t size, uint64_t fixed)
{
        static Gpumem__Request q;
        static Gpumem__VmmReserve v;
        gpumem__request__init(&q);
        gpumem__vmm_reserve__init(&v);
        v.has_size = v.has_fixed_va = true;
        v.size = size;
        v.fixed_va = fixed;
        q.op_case = GPUMEM__REQUEST__OP_VMM_RESERVE;
        q.vmm_reserve = &v;
        return &q;
}

static Gpumem__Request *req_vmm_create(uint64_t size, uint32_t gpu)
{
        static Gpumem__Request q;
        static Gpumem__VmmCreate v;
        gpumem__request__init(&q);
        gpumem__vmm_create__init(&v);
        v.has_size = v.has_gpu_id = true;
        v.size = size;
        v.gpu_id = gpu;
        q.op_case = GPUMEM__REQUEST__OP_VMM_CREATE;
        q.vmm_create = &v;
        return &q;
}

static Gpumem__Request *req_vmm_map(uint64_t va, uint64_t size, uint64_t offset, uint64_t handle)
{
        static Gpumem__Request q;
        static Gpumem__VmmMap v;
        gpumem__request__init(&q);
        gpumem__vmm_map__init(&v);
        v.has_va = v.has_size = v.has_offset = v.has_handle = true;
        v.va = va;
        v.size = size;
        v.offset = offset;
        v.handle = handle;
        q.op_case = GPUMEM__REQUEST__OP_VMM_MAP;
        q.vmm_map = &v;
        return &q;
}

/* Ops on a range [va, va+size): 0 vmm_unmap, 1 vmm_free, 2 vmm_set_access (GPU rw), 3 svm_set (granularity),
 * 4 svm_get (granularity), 5 svm_prefetch (system memory). */
static Gpumem__Request *req_range(int op, uint64_t va, uint64_t size)
{
        static Gpumem__Request q;
        static Gpumem__VmmUnmap um;
        static Gpumem__VmmFree vf;
        static Gpumem__VmmSetAccess sa;
        static Gpumem__AccessDesc d, *dp = &d;
        static Gpumem__SvmSetAttr ss;
        static Gpumem__SvmGetAttr sg;
        static Gpumem__SvmAttr a, *ap = &a;
        static Gpumem__SvmPrefetch pf;
        gpumem__request__init(&q);
        gpumem__svm_attr__init(&a);
        a.has_type = a.has_value = true;
        a.type = 7; /* KFD_IOCTL_SVM_ATTR_GRANULARITY */
        a.value = 1;
        switch (op) {
        case 0:
                gpumem__vmm_unmap__init(&um);
                um.has_va = um.has_size = true;
                um.va = va, um.size = size;
                q.op_case = GPUMEM__REQUEST__OP_VMM_UNMAP;
                q.vmm_unmap = &um;
                break;
        case 1:
                gpumem__vmm_free__init(&vf);
                vf.has_va = vf.has_size = true;
                vf.va = va, vf.size = size;
                q.op_case = GPUMEM__REQUEST__OP_VMM_FREE;
                q.vmm_free = &vf;
                break;
        case 2:
                gpumem__vmm_set_access__init(&sa);
                gpumem__access_desc__init(&d);
                d.has_gpu_id = d.has_access = true;
                d.gpu_id = gpus[0];
                d.access = GPUMEM__ACCESS__ACCESS_READ_WRITE;
                sa.has_va = sa.has_size = true;
                sa.va = va, sa.size = size;
                sa.n_desc = 1;
                sa.desc = &dp;
                q.op_case = GPUMEM__REQUEST__OP_VMM_SET_ACCESS;
                q.vmm_set_access = &sa;
                break;
        case 3:
                gpumem__svm_set_attr__init(&ss);
                ss.has_va = ss.has_size = true;
                ss.va = va, ss.size = size;
                ss.n_attrs = 1;
                ss.attrs = &ap;
                q.op_case = GPUMEM__REQUEST__OP_SVM_SET_ATTR;
                q.svm_set_attr = &ss;
                break;
        case 4:
                gpumem__svm_get_attr__init(&sg);
                sg.has_va = sg.has_size = true;
                sg.va = va, sg.size = size;
                sg.n_attrs = 1;
                sg.attrs = &ap;
                q.op_case = GPUMEM__REQUEST__OP_SVM_GET_ATTR;
                q.svm_get_attr = &sg;
                break;
        default:
                gpumem__svm_prefetch__init(&pf);
                pf.has_va = pf.has_size = pf.has_location = true;
                pf.va = va, pf.size = size;
                pf.location = 0;
                q.op_case = GPUMEM__REQUEST__OP_SVM_PREFETCH;
                q.svm_prefetch = &pf;
                break;
        }
        return &q;
}

/* Ops on one address: 0 pointer_info, 1 vmm_retain, 2 vmm_get_access. */
static Gpumem__Request *req_addr(int op, uint64_t va)
{
        static Gpumem__Request q;
        static Gpumem__PointerInfoGet pi;
        static Gpumem__VmmRetain rt;
        static Gpumem__VmmGetAccess ga;
        gpumem__request__init(&q);
        if (op == 0) {
                gpumem__pointer_info_get__init(&pi);
                pi.has_va = true;
                pi.va = va;
                q.op_case = GPUMEM__REQUEST__OP_POINTER_INFO;
                q.pointer_info = &pi;
        } else if (op == 1) {
                gpumem__vmm_retain__init(&rt);
                rt.has_va = true;
                rt.va = va;
                q.op_case = GPUMEM__REQUEST__OP_VMM_RETAIN;
                q.vmm_retain = &rt;
        } else {
                gpumem__vmm_get_access__init(&ga);
                ga.has_va = ga.has_gpu_id = true;
                ga.va = va;
                ga.gpu_id = gpus[0];
                q.op_case = GPUMEM__REQUEST__OP_VMM_GET_ACCESS;
                q.vmm_get_access = &ga;
        }
        return &q;
}

static Gpumem__Request *req_import(bool has_index, int32_t index)
{
        static Gpumem__Request q;
        static Gpumem__DmabufImport im;
        gpumem__request__init(&q);
        gpumem__dmabuf_import__init(&im);
        im.has_fd_index = has_index;
        im.fd_index = index;
        im.has_gpu_id = true;
        im.gpu_id = gpus[0];
        q.op_case = GPUMEM__REQUEST__OP_DMABUF_IMPORT;
        q.dmabuf_import = &im;
        return &q;
}

/* ---- frames ------------------------------------------------------------------------------------------ */

/*
 * A 4-byte packet with 20 fds: the daemon's control buffer holds 16, so the kernel truncates it and the
 * daemon refuses the packet with -EPROTO. Its receive buffer is shared by every connection: the error's
 * request id must not be read from bytes the previous packet (here a ping with id 4242) left there.
 */
static void short_packet_too_many_fds(void)
{
        int fds[20];
        char pkt[4] = {'G', 'M', 'E', 'M'};
        uint32_t id = 1;
        int code = 0;
        char reason[256] = "";
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Ping p = GPUMEM__PING__INIT;
        Raw r;

        if (!raw_open(&r))
                return;
        q.op_case = GPUMEM__REQUEST__OP_PING;
        q.ping = &p;
        r.next_id = 4242;
        CHECK_EQ(rq(&r, &q, NULL, 0), 0);
        fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        CHECK(fds[0] >= 0);
        for (size_t i = 1; i < ARRAY_SIZE(fds); i++)
                fds[i] = fds[0];
        CHECK_EQ(send_with_fds(r.fd, pkt, sizeof(pkt), fds, ARRAY_SIZE(fds), MSG_NOSIGNAL),
                 (ssize_t)sizeof(pkt));
        close(fds[0]);
        CHECK_EQ(raw_recv_reply(r.fd, &id, &code, reason, sizeof(reason), 5000), 0);
        CHECK_EQ(code, -EPROTO);
        CHECK_EQ(id, 0);
        raw_close(&r);
}

/* A connection that holds memory sends a malformed frame: one error, closed, its memory released. */
static void violation_holding(const char *what, const void *pkt, size_t len, const int *fds, size_t n_fds,
                              int want)
{
        Raw r;
        uint32_t id = 0;
        int code = 0, out[16];
        size_t n_out = 0;
        char reason[256] = "";

        if (!raw_open(&r))
                return;
        /* memory first, so the close has something to free */
        CHECK_EQ(raw_request(r.fd, r.next_id++, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_HOST, MiB, 0, 0), NULL,
                             0, NULL, out, &n_out, NULL),
                 0);
        gm_wire_close_fds(out, n_out);
        CHECK_EQ(rq(&r, req_vmm_create(2 * MiB, gpus[0]), NULL, 0), 0);
        CHECK_EQ(raw_send(r.fd, pkt, len, fds, n_fds), 0);
        CHECK_EQ(raw_recv_reply(r.fd, &id, &code, reason, sizeof(reason), 5000), 0);
        if (code != want)
                fprintf(stderr, "%s: code %d (%s), want %d\n", what, code, reason, want);
        CHECK_EQ(code, want);
        CHECK(reason[0] != '\0');
        CHECK(raw_closed(r.fd, 5000));
        raw_close(&r);
        check_back(what);
}

static void put_le32(uint8_t *p, uint32_t v)
{
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

static size_t ping_frame(uint8_t *buf, uint32_t id, uint16_t n_fds)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Ping p = GPUMEM__PING__INIT;
        size_t n;
        q.op_case = GPUMEM__REQUEST__OP_PING;
        q.ping = &p;
        n = gpumem__request__pack(&q, buf + GM_FRAME_HDR_SIZE);
        gm_frame_hdr_encode(buf, 1, id, (uint32_t)n, n_fds);
        return GM_FRAME_HDR_SIZE + n;
}

static size_t op_frame(uint8_t *buf, uint32_t id, const Gpumem__Request *q, uint16_t n_fds)
{
        size_t n = gpumem__request__pack(q, buf + GM_FRAME_HDR_SIZE);
        gm_frame_hdr_encode(buf, 1, id, (uint32_t)n, n_fds);
        return GM_FRAME_HDR_SIZE + n;
}

static void test_frames(void)
{
        static uint8_t big[GM_FRAME_MAX + 4096];
        uint8_t buf[512];
        int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC), two[2] = {devnull, devnull};
        size_t len;

        len = ping_frame(big, 9, 0);
        gm_frame_hdr_encode(big, 1, 9, sizeof(big) - GM_FRAME_HDR_SIZE, 0);
        violation_holding("oversized frame", big, sizeof(big), NULL, 0, -EMSGSIZE);
        put_le32(big + 8, GM_FRAME_BODY_MAX + 1); /* the encoder refuses this: written by hand */
        violation_holding("body_len over the limit", big, GM_FRAME_HDR_SIZE, NULL, 0, -EMSGSIZE);
        len = ping_frame(buf, 9, 0);
        violation_holding("truncated header", buf, 10, NULL, 0, -EBADMSG);
        violation_holding("truncated body", buf, len - 1, NULL, 0, -EBADMSG);
        buf[len] = 0;
        violation_holding("trailing bytes", buf, len + 1, NULL, 0, -EBADMSG);
        len = ping_frame(buf, 9, 2);
        violation_holding("header counts more fds than sent", buf, len, &devnull, 1, -EPROTO);
        len = ping_frame(buf, 9, 0);
        violation_holding("fd the header does not count", buf, len, &devnull, 1, -EPROTO);
        len = ping_frame(buf, 9, 1);
        violation_holding("fd on ping", buf, len, &devnull, 1, -EPROTO);
        len = op_frame(buf, 9, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, MiB, gpus[0], 0), 1);
        violation_holding("fd on alloc", buf, len, &devnull, 1, -EPROTO);
        len = op_frame(buf, 9, req_import(true, 0), 2);
        violation_holding("two fds on import", buf, len, two, 2, -EPROTO);
        len = ping_frame(buf, 9, 0);
        buf[6] = 17;
        violation_holding("more than 16 fds declared", buf, len, NULL, 0, -E2BIG);
        close(devnull);
        short_packet_too_many_fds();
}

/* Fds where a dmabuf is expected: refused before the driver sees them, the connection stays. */
static void test_import_fds(void)
{
        Raw r;
        int pfd[2], sp[2], fd;
        int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int file = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
        int efd = eventfd(0, EFD_CLOEXEC);
        int mfd = memfd_create("not-a-dmabuf", MFD_CLOEXEC);

        CHECK(devnull >= 0 && dir >= 0 && file >= 0 && efd >= 0 && mfd >= 0);
        CHECK_EQ(ftruncate(mfd, 2 * MiB), 0);
        CHECK_EQ(pipe2(pfd, O_CLOEXEC), 0);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
        if (!raw_open(&r))
                return;
        EXPECT_CLEAN(&r, req_import(true, 0), NULL, 0, -EBADF);      /* an index, but no fd */
        EXPECT_CLEAN(&r, req_import(false, 0), &devnull, 1, -EBADF); /* an fd, but no index */
        EXPECT_CLEAN(&r, req_import(true, 1), &devnull, 1, -EBADF);  /* index past the fds */
        EXPECT_CLEAN(&r, req_import(true, -1), &devnull, 1, -EBADF);
        EXPECT_CLEAN(&r, req_import(true, 0), &pfd[0], 1, -EINVAL);
        EXPECT_CLEAN(&r, req_import(true, 0), &sp[0], 1, -EINVAL);
        EXPECT_CLEAN(&r, req_import(true, 0), &dir, 1, -EINVAL);
        EXPECT_CLEAN(&r, req_import(true, 0), &devnull, 1, -EINVAL);
        EXPECT_CLEAN(&r, req_import(true, 0), &file, 1, -EINVAL);
        EXPECT_CLEAN(&r, req_import(true, 0), &efd, 1, -EINVAL);
        /* a sealable memfd is what the model takes as a foreign dmabuf (udmabuf): it imports, and the
         * import goes with the connection */
        CHECK_EQ(rq(&r, req_import(true, 0), &mfd, 1), 0);
        /* an export of the victim's handle is not the attacker's to name */
        EXPECT_CLEAN(&r, req_handle_op(1, victim.dev_handle), NULL, 0, -ENOENT);
        /* none of that was a violation: the connection still works */
        fd = r.fd;
        uint8_t buf[64];
        uint32_t id;
        int code;
        CHECK_EQ(raw_send(fd, buf, ping_frame(buf, 77, 0), NULL, 0), 0);
        CHECK_EQ(raw_recv_reply(fd, &id, &code, NULL, 0, 5000), 0);
        CHECK_EQ(code, 0);
        CHECK_EQ(id, 77);
        raw_close(&r);
        close(pfd[0]), close(pfd[1]), close(sp[0]), close(sp[1]);
        close(devnull), close(dir), close(file), close(efd), close(mfd);
        check_back("wrong fd types");
}

/* ---- handles ----------------------------------------------------------------------------------------- */

static void test_handles(void)
{
        Raw r;
        uint64_t seed = (uint64_t)now_ms() * 2654435761u;
        uint64_t own = 0;
        Gpumem__Reply *rep = NULL;
        DaemonState a, b;
        int n_zero = 0;

        if (!raw_open(&r))
                return;
        /* the victim's real handles, and their neighbours */
        uint64_t theirs[] = {victim.dev_handle, victim.host_handle, victim.vmm_handle};
        for (size_t i = 0; i < ARRAY_SIZE(theirs); i++)
                for (int op = 0; op < 6; op++) {
                        EXPECT_CLEAN(&r, req_handle_op(op, theirs[i]), NULL, 0, -ENOENT);
                        EXPECT_CLEAN(&r, req_handle_op(op, theirs[i] + 1), NULL, 0, -ENOENT);
                }
        EXPECT_CLEAN(&r, req_vmm_map(r.base, 2 * MiB, 0, victim.vmm_handle), NULL, 0, -ENOENT);
        /* guessing: thousands of random handles on every op that takes one, and nothing moves */
        CHECK_EQ(daemon_state(&dmn, &a), 0);
        for (int i = 0; i < 3000; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                uint64_t h = i < 100 ? (uint64_t)i : seed;
                int code = rq(&r, req_handle_op(i % 6, h), NULL, 0);
                if (code != -ENOENT)
                        fprintf(stderr, "guess 0x%llx op %d -> %d\n", (unsigned long long)h, i % 6, code);
                CHECK_EQ(code, -ENOENT);
                n_zero += code == 0;
        }
        CHECK_EQ(n_zero, 0);
        CHECK_EQ(daemon_state(&dmn, &b), 0);
        CHECK(state_same(&a, &b));
        /* a freed handle is dead for every op, and a new object does not get it back */
        CHECK_EQ(raw_request(r.fd, r.next_id++, req_vmm_create(2 * MiB, gpus[0]), NULL, 0, (void **)&rep,
                             NULL, NULL, NULL),
                 0);
        if (rep && rep->vmm_create)
                own = rep->vmm_create->handle;
        raw_reply_free(rep);
        CHECK(own != 0);
        CHECK_EQ(rq(&r, req_handle_op(2, own), NULL, 0), 0);
        for (int op = 0; op < 6; op++)
                EXPECT_CLEAN(&r, req_handle_op(op, own), NULL, 0, -ENOENT);
        for (int i = 0; i < 50; i++) {
                rep = NULL;
                CHECK_EQ(raw_request(r.fd, r.next_id++, req_vmm_create(4096, gpus[0]), NULL, 0, (void **)&rep,
                                     NULL, NULL, NULL),
                         0);
                if (rep && rep->vmm_create) {
                        CHECK(rep->vmm_create->handle != own);
                        CHECK_EQ(rq(&r, req_handle_op(2, rep->vmm_create->handle), NULL, 0), 0);
                }
                raw_reply_free(rep);
        }
        raw_close(&r);
        check_back("handle guessing");
}

/* ---- addresses --------------------------------------------------------------------------------------- */

static void test_addresses(void)
{
        Raw r;
        uint64_t v[] = {(uint64_t)(uintptr_t)victim.dev, (uint64_t)(uintptr_t)victim.host,
                        (uint64_t)(uintptr_t)victim.managed, (uint64_t)(uintptr_t)victim.vmm_res};
        int out[16];
        size_t n_out = 0;

        if (!raw_open(&r))
                return;
        for (size_t i = 0; i < ARRAY_SIZE(v); i++) {
                uint64_t va = v[i];
                /* another client's addresses are outside this one's window */
                EXPECT_CLEAN(&r, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, 2 * MiB, gpus[0], va), NULL, 0,
                             -EINVAL);
                EXPECT_CLEAN(&r, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_HOST, 2 * MiB, 0, va), NULL, 0,
                             -EINVAL);
                EXPECT_CLEAN(&r, req_vmm_reserve(2 * MiB, va), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_addr(0, va), NULL, 0, -EFAULT);
                EXPECT_CLEAN(&r, req_addr(1, va), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_addr(2, va), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(0, va, 2 * MiB), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(1, va, 4 * MiB), NULL, 0, -ENOENT);
                EXPECT_CLEAN(&r, req_range(2, va, 2 * MiB), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(3, va, 2 * MiB), NULL, 0, -EFAULT);
                EXPECT_CLEAN(&r, req_range(4, va, 2 * MiB), NULL, 0, -EFAULT);
                EXPECT_CLEAN(&r, req_range(5, va, 2 * MiB), NULL, 0, -EFAULT);
        }
        /* just outside its own window, on either side */
        EXPECT_CLEAN(&r, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, 2 * MiB, gpus[0], r.base - 2 * MiB),
                     NULL, 0, -EINVAL);
        EXPECT_CLEAN(
                &r, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, 4 * MiB, gpus[0], r.base + r.size - 2 * MiB),
                NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_reserve(4 * MiB, r.base + r.size - 2 * MiB), NULL, 0, -EINVAL);
        /* overlapping what it already has */
        CHECK_EQ(raw_request(r.fd, r.next_id++,
                             req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, 4 * MiB, gpus[0], r.base), NULL, 0,
                             NULL, out, &n_out, NULL),
                 0);
        gm_wire_close_fds(out, n_out);
        EXPECT_CLEAN(&r, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, 2 * MiB, gpus[0], r.base + 2 * MiB),
                     NULL, 0, -EADDRINUSE);
        EXPECT_CLEAN(&r, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_HOST, 8 * MiB, 0, r.base), NULL, 0,
                     -EADDRINUSE);
        EXPECT_CLEAN(&r, req_vmm_reserve(2 * MiB, r.base + 2 * MiB), NULL, 0, -EADDRINUSE);
        raw_close(&r);
        check_back("addresses of other clients");
}

/* ---- sizes ------------------------------------------------------------------------------------------- */

static void test_sizes(void)
{
        Raw r;
        Gpumem__Reply *rep = NULL;
        uint64_t res = 0, h = 0, managed = 0;
        int out[16];
        size_t n_out = 0;
        const Gpumem__MemKind kinds[] = {GPUMEM__MEM_KIND__MEM_KIND_DEVICE, GPUMEM__MEM_KIND__MEM_KIND_HOST,
                                         GPUMEM__MEM_KIND__MEM_KIND_MANAGED};

        if (!raw_open(&r))
                return;
        for (size_t k = 0; k < ARRAY_SIZE(kinds); k++) {
                uint32_t g = kinds[k] == GPUMEM__MEM_KIND__MEM_KIND_DEVICE ? gpus[0] : 0;
                EXPECT_CLEAN(&r, req_alloc(kinds[k], 0, g, 0), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_alloc(kinds[k], 1ull << 62, g, 0), NULL, 0, -ENOMEM);
                EXPECT_CLEAN(&r, req_alloc(kinds[k], UINT64_MAX - 100, g, 0), NULL, 0, -EOVERFLOW);
                EXPECT_CLEAN(&r, req_alloc(kinds[k], r.size + 1, g, 0), NULL, 0, -ENOMEM);
                /* start + size past the end of the window, and wrapping around */
                EXPECT_CLEAN(&r, req_alloc(kinds[k], 4 * MiB, g, r.base + r.size - 2 * MiB), NULL, 0,
                             -EINVAL);
                EXPECT_CLEAN(&r, req_alloc(kinds[k], 1ull << 40, g, UINT64_MAX - (1ull << 39) + 1), NULL, 0,
                             -ENOMEM);
        }
        /* VMM: sizes must be multiples of the 4 KiB granularity */
        EXPECT_CLEAN(&r, req_vmm_reserve(0, 0), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_reserve(4097, 0), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_reserve(1ull << 62, 0), NULL, 0, -ENOMEM);
        EXPECT_CLEAN(&r, req_vmm_reserve(UINT64_MAX & ~4095ull, 0), NULL, 0, -ENOMEM);
        EXPECT_CLEAN(&r, req_vmm_create(0, gpus[0]), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_create(4097, gpus[0]), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_create(1ull << 50, gpus[0]), NULL, 0, -ENOMEM);
        CHECK_EQ(raw_request(r.fd, r.next_id++, req_vmm_reserve(8 * MiB, 0), NULL, 0, (void **)&rep, NULL,
                             NULL, NULL),
                 0);
        if (rep && rep->vmm_reserve)
                res = rep->vmm_reserve->va;
        raw_reply_free(rep);
        rep = NULL;
        CHECK_EQ(raw_request(r.fd, r.next_id++, req_vmm_create(2 * MiB, gpus[0]), NULL, 0, (void **)&rep,
                             NULL, NULL, NULL),
                 0);
        if (rep && rep->vmm_create)
                h = rep->vmm_create->handle;
        raw_reply_free(rep);
        EXPECT_CLEAN(&r, req_vmm_map(res, 0, 0, h), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_map(res, 4097, 0, h), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_map(res + 1, 2 * MiB, 0, h), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_vmm_map(res, 2 * MiB, 4096, h), NULL, 0, -EINVAL); /* past the handle */
        EXPECT_CLEAN(&r, req_vmm_map(res, 4 * MiB, 0, h), NULL, 0, -EINVAL);    /* bigger than it */
        EXPECT_CLEAN(&r, req_vmm_map(res, 4096, UINT64_MAX & ~4095ull, h), NULL, 0,
                     -EINVAL); /* offset wraps */
        EXPECT_CLEAN(&r, req_vmm_map(res + 8 * MiB - 4096, 2 * MiB, 0, h), NULL, 0, -EINVAL); /* leaves it */
        CHECK_EQ(rq(&r, req_vmm_map(res, 2 * MiB, 0, h), NULL, 0), 0);
        for (int op = 0; op <= 2; op++) {
                if (op == 1)
                        continue;
                EXPECT_CLEAN(&r, req_range(op, res, 0), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(op, res, UINT64_MAX - 4095), NULL, 0, -EINVAL); /* wraps */
                EXPECT_CLEAN(&r, req_range(op, res, 1ull << 62), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(op, res, MiB), NULL, 0, -EINVAL); /* cuts the mapping */
        }
        EXPECT_CLEAN(&r, req_range(1, res, 0), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_range(1, res, UINT64_MAX - 4095), NULL, 0, -EINVAL);
        EXPECT_CLEAN(&r, req_range(1, res, 8 * MiB), NULL, 0, -EBUSY); /* still mapped */
        /* managed ranges: 0, unaligned, wrapping, beyond the allocation */
        CHECK_EQ(raw_request(r.fd, r.next_id++, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_MANAGED, 2 * MiB, 0, 0),
                             NULL, 0, (void **)&rep, out, &n_out, NULL),
                 0);
        gm_wire_close_fds(out, n_out);
        if (rep && rep->alloc)
                managed = rep->alloc->va;
        raw_reply_free(rep);
        for (int op = 3; op <= 5; op++) {
                EXPECT_CLEAN(&r, req_range(op, managed, 0), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(op, managed, 4097), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(op, managed + 1, 4096), NULL, 0, -EINVAL);
                EXPECT_CLEAN(&r, req_range(op, managed, UINT64_MAX & ~4095ull), NULL, 0, -EOVERFLOW);
                EXPECT_CLEAN(&r, req_range(op, managed, 4 * MiB), NULL, 0, -EINVAL);
        }
        raw_close(&r); /* everything it made goes with the connection */
        check_back("sizes");
}

/* ---- SVM attribute lists ------------------------------------------------------------------------------ */

/* Lists longer than the daemon takes, and a NUMA node that is not one: refused before anything is made. */
#define LIST_MAX_GPUS 64 /* the broker's BROKER_MAX_GPUS */
static void test_list_limits(void)
{
        Gpumem__Request *qa;
        uint32_t ids[LIST_MAX_GPUS + 2];
        Gpumem__AccessDesc desc[LIST_MAX_GPUS + 2], *descp[LIST_MAX_GPUS + 2];
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__MapToGpus mp = GPUMEM__MAP_TO_GPUS__INIT;
        Gpumem__VmmSetAccess sa = GPUMEM__VMM_SET_ACCESS__INIT;
        Raw r;

        if (!raw_open(&r))
                return;
        for (size_t i = 0; i < ARRAY_SIZE(ids); i++) {
                ids[i] = gpus[i % n_gpus];
                gpumem__access_desc__init(&desc[i]);
                desc[i].has_gpu_id = desc[i].has_access = true;
                desc[i].gpu_id = gpus[i % n_gpus];
                desc[i].access = GPUMEM__ACCESS__ACCESS_READ_WRITE;
                descp[i] = &desc[i];
        }
        /* 65 GPUs to map a new allocation on */
        qa = req_alloc(GPUMEM__MEM_KIND__MEM_KIND_DEVICE, MiB, gpus[0], 0);
        alloc_m.n_map_gpus = LIST_MAX_GPUS + 1;
        alloc_m.map_gpus = ids;
        EXPECT_CLEAN(&r, qa, NULL, 0, -E2BIG);
        /* NUMA nodes: one past any host's, and a negative one other than -1 ("nearest the GPU") */
        qa = req_alloc(GPUMEM__MEM_KIND__MEM_KIND_HOST, MiB, 0, 0);
        alloc_m.has_numa_node = true;
        alloc_m.numa_node = 4096;
        EXPECT_CLEAN(&r, qa, NULL, 0, -EINVAL);
        alloc_m.numa_node = -2;
        EXPECT_CLEAN(&r, qa, NULL, 0, -EINVAL);
        /* 65 GPUs to map an allocation on (the handle need not exist: the list is checked first) */
        mp.has_handle = true;
        mp.handle = 1;
        mp.n_gpu_ids = LIST_MAX_GPUS + 1;
        mp.gpu_ids = ids;
        q.op_case = GPUMEM__REQUEST__OP_MAP;
        q.map = &mp;
        EXPECT_CLEAN(&r, &q, NULL, 0, -E2BIG);
        /* 66 access descriptors (64 GPUs and the CPU is the most) */
        sa.has_va = sa.has_size = true;
        sa.va = r.base;
        sa.size = 2 * MiB;
        sa.n_desc = LIST_MAX_GPUS + 2;
        sa.desc = descp;
        gpumem__request__init(&q);
        q.op_case = GPUMEM__REQUEST__OP_VMM_SET_ACCESS;
        q.vmm_set_access = &sa;
        EXPECT_CLEAN(&r, &q, NULL, 0, -E2BIG);
        raw_close(&r);
}

static void test_svm_attrs(void)
{
        Raw r;
        Gpumem__Reply *rep = NULL;
        uint64_t m = 0;
        int out[16];
        size_t n_out = 0;
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__SvmSetAttr s = GPUMEM__SVM_SET_ATTR__INIT;
        Gpumem__SvmAttr a[40], *ap[40];
        struct {
                const char *what;
                uint32_t t[4], v[4];
                size_t n;
                int want;
        } cases[] = {
                /* KFD types: 0 preferred location, 1 prefetch location, 2 access, 3 access in place,
                 * 4 no access, 5 set flags, 6 clear flags, 7 granularity */
                {"duplicate granularity", {7, 7}, {1, 2}, 2, -EINVAL},
                {"duplicate set-flags", {5, 5}, {1, 1}, 2, -EINVAL},
                {"duplicate preferred location", {0, 0}, {0, 0}, 2, -EINVAL},
                {"access and no-access for one GPU", {2, 4}, {0, 0}, 2, -EINVAL}, /* GPU patched below */
                {"unknown type", {99}, {0}, 1, -EINVAL},
                {"type just past the last", {8}, {0}, 1, -EINVAL},
                {"granularity out of range", {7}, {64}, 1, -EINVAL},
                {"unknown flag", {5}, {0x100}, 1, -EINVAL},
                {"preferred location that is no GPU", {0}, {4242}, 1, -EINVAL},
                {"access for a GPU that does not exist", {2}, {4242}, 1, -EINVAL},
                {"prefetch to undefined", {1}, {0xffffffffu}, 1, -EINVAL},
                {"nothing", {0}, {0}, 0, -EINVAL},
        };

        if (!raw_open(&r))
                return;
        CHECK_EQ(raw_request(r.fd, r.next_id++, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_MANAGED, 2 * MiB, 0, 0),
                             NULL, 0, (void **)&rep, out, &n_out, NULL),
                 0);
        gm_wire_close_fds(out, n_out);
        if (rep && rep->alloc)
                m = rep->alloc->va;
        raw_reply_free(rep);
        cases[3].v[0] = cases[3].v[1] = gpus[0];
        s.has_va = s.has_size = true;
        s.va = m;
        s.size = 2 * MiB;
        s.attrs = ap;
        q.op_case = GPUMEM__REQUEST__OP_SVM_SET_ATTR;
        q.svm_set_attr = &s;
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                for (size_t k = 0; k < cases[i].n; k++) {
                        gpumem__svm_attr__init(&a[k]);
                        a[k].has_type = a[k].has_value = true;
                        a[k].type = cases[i].t[k];
                        a[k].value = cases[i].v[k];
                        ap[k] = &a[k];
                }
                s.n_attrs = cases[i].n;
                EXPECT_CLEAN(&r, &q, NULL, 0, cases[i].want);
        }
        /* more attributes than the daemon takes */
        for (size_t k = 0; k < 33; k++) {
                gpumem__svm_attr__init(&a[k]);
                a[k].has_type = a[k].has_value = true;
                a[k].type = 2; /* access, one per GPU: the count is what is wrong */
                a[k].value = gpus[k % n_gpus];
                ap[k] = &a[k];
        }
        s.n_attrs = 33;
        EXPECT_CLEAN(&r, &q, NULL, 0, -E2BIG);
        /* packed (since 3): the same checks, and never both ways at once; a get answers the way it asked */
        {
                uint64_t packed[33];
                for (size_t k = 0; k < 33; k++)
                        packed[k] = 2ull << 32 | gpus[k % n_gpus];
                s.packed_attrs = packed;
                s.n_attrs = 0;
                s.n_packed_attrs = 33;
                EXPECT_CLEAN(&r, &q, NULL, 0, -E2BIG);
                s.n_attrs = 1;
                s.n_packed_attrs = 1;
                EXPECT_CLEAN(&r, &q, NULL, 0, -EINVAL);
                packed[0] = 99ull << 32; /* unknown type */
                s.n_attrs = 0;
                EXPECT_CLEAN(&r, &q, NULL, 0, -EINVAL);
                packed[0] = 7ull << 32 | 9; /* granularity 9, packed */
                CHECK_EQ(rq(&r, &q, NULL, 0), 0);

                Gpumem__Request gq = GPUMEM__REQUEST__INIT;
                Gpumem__SvmGetAttr g = GPUMEM__SVM_GET_ATTR__INIT;
                uint64_t want = 7ull << 32;
                g.has_va = g.has_size = true;
                g.va = m;
                g.size = 2 * MiB;
                g.packed_attrs = &want;
                g.n_packed_attrs = 1;
                gq.op_case = GPUMEM__REQUEST__OP_SVM_GET_ATTR;
                gq.svm_get_attr = &g;
                rep = NULL;
                CHECK_EQ(raw_request(r.fd, r.next_id++, &gq, NULL, 0, (void **)&rep, NULL, NULL, NULL), 0);
                CHECK(rep && rep->svm_get_attr && rep->svm_get_attr->n_attrs == 0 &&
                      rep->svm_get_attr->n_packed_attrs == 1 &&
                      rep->svm_get_attr->packed_attrs[0] == (7ull << 32 | 9));
                raw_reply_free(rep);
                /* as messages, answered as messages */
                gpumem__svm_attr__init(&a[0]);
                a[0].has_type = true;
                a[0].type = 7;
                g.n_packed_attrs = 0;
                g.attrs = ap;
                g.n_attrs = 1;
                ap[0] = &a[0];
                rep = NULL;
                CHECK_EQ(raw_request(r.fd, r.next_id++, &gq, NULL, 0, (void **)&rep, NULL, NULL, NULL), 0);
                CHECK(rep && rep->svm_get_attr && rep->svm_get_attr->n_packed_attrs == 0 &&
                      rep->svm_get_attr->n_attrs == 1 && rep->svm_get_attr->attrs[0]->value == 9);
                raw_reply_free(rep);
        }
        raw_close(&r);
        check_back("SVM attribute lists");
}

/* ---- flooding ------------------------------------------------------------------------------------------ */

/* Thousands of memory requests without reading a reply: the daemon stops reading that client, others go on.
 */
static void test_flood(void)
{
        Raw r;
        static uint8_t buf[256];
        size_t len;
        int sent = 0;
        DaemonState mid;

        if (!raw_open(&r))
                return;
        len = op_frame(buf, 5, req_alloc(GPUMEM__MEM_KIND__MEM_KIND_HOST, 4096, 0, 0), 0);
        for (int i = 0; i < 20000; i++) {
                if (send(r.fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
                        break;
                sent++;
        }
        CHECK(sent > 100);
        usleep(300000);
        victim_check("a flood of allocations");
        CHECK_EQ(daemon_state(&dmn, &mid), 0);
        /* backpressure bounds what one silent client can make the daemon hold */
        fprintf(stderr, "flood: %d requests sent, %llu objects held while the client did not read\n", sent,
                (unsigned long long)mid.allocations);
        CHECK(mid.allocations <= with_victim.allocations + (uint64_t)sent);
        CHECK(mid.allocations < with_victim.allocations + 2000);
        raw_close(&r);
        check_back("flood");
}

/* ---- connections ------------------------------------------------------------------------------------- */

/* Read a connection-level error (request id 0) if one is there within @ms. */
static int refused_code(int fd, int ms)
{
        uint32_t id = 1;
        int code = 0;
        if (raw_recv_reply(fd, &id, &code, NULL, 0, ms) != 0)
                return 0;
        return id == 0 ? code : 0;
}

static void test_many_connections(void)
{
        enum { N = 2000 };
        static int fds[N];
        int accepted = 0, refused = 0, other = 0;
        struct pollfd *p = calloc(N, sizeof(*p));
        DaemonState s;

        if (!p)
                return;
        for (int i = 0; i < N; i++)
                fds[i] = raw_connect(dmn.sock);
        /* a refusal arrives right after accept: give the daemon time to accept all */
        usleep(500000);
        for (int i = 0; i < N; i++)
                p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        (void)poll(p, N, 2000);
        for (int i = 0; i < N; i++) {
                if (fds[i] < 0) {
                        other++;
                        continue;
                }
                int code = (p[i].revents & POLLIN) ? refused_code(fds[i], 100) : 0;
                if (code == -EUSERS)
                        refused++;
                else if (code == 0)
                        accepted++;
                else
                        other++;
        }
        fprintf(stderr, "connections: %d accepted, %d refused with -EUSERS, %d other\n", accepted, refused,
                other);
        /* the per-uid cap holds: the victim and these make CONN_CAP_PER_UID */
        CHECK_EQ(other, 0);
        CHECK_EQ(accepted, CONN_CAP_PER_UID - 1);
        CHECK_EQ(refused, N - accepted);
        victim_check("thousands of connections");
        /* the status connection is refused too while at the cap: free one slot first */
        close(fds[0]);
        fds[0] = -1;
        usleep(100000);
        CHECK_EQ(daemon_state(&dmn, &s), 0);
        CHECK_EQ(s.clients, CONN_CAP_PER_UID);
        for (int i = 0; i < N; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        free(p);
        check_back("thousands of connections");
}

/* Out of fds: the daemon pauses accepting, serves who it has, and accepts again once fds are back. */
static void test_out_of_fds(void)
{
        struct rlimit low, old;
        int fds[64], n_ok = 0;

        CHECK_EQ(prlimit(dmn.pid, RLIMIT_NOFILE, NULL, &old), 0);
        low = old;
        low.rlim_cur = (rlim_t)daemon_fd_count(&dmn) + 8;
        CHECK_EQ(prlimit(dmn.pid, RLIMIT_NOFILE, &low, NULL), 0);
        for (int i = 0; i < 64; i++)
                fds[i] = raw_connect(dmn.sock); /* connect succeeds: the listen backlog takes them */
        usleep(300000);
        victim_check("the daemon out of fds");
        CHECK_EQ(prlimit(dmn.pid, RLIMIT_NOFILE, &old, NULL), 0);
        /* within the daemon's retry pause every waiting connection is served */
        for (int i = 0; i < 64; i++) {
                if (fds[i] >= 0 && raw_hello(fds[i]) == 0)
                        n_ok++;
        }
        CHECK_EQ(n_ok, 64);
        for (int i = 0; i < 64; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        check_back("out of fds");
}

/* Connections that never say hello, or say it and then nothing: they cost little and block no one. */
static void test_half_open(void)
{
        enum { SILENT = 300, MUTE = 200 };
        static int silent[SILENT], mute[MUTE];
        long rss0 = daemon_rss_kb(&dmn), rss1;
        int zero;
        uint8_t nothing = 0;

        for (int i = 0; i < SILENT; i++)
                silent[i] = raw_connect(dmn.sock);
        for (int i = 0; i < MUTE; i++) {
                mute[i] = raw_connect(dmn.sock);
                CHECK_EQ(raw_hello(mute[i]), 0);
        }
        usleep(200000);
        victim_check("half-open connections");
        rss1 = daemon_rss_kb(&dmn);
        fprintf(stderr, "half-open: %d silent + %d mute connections cost the daemon %ld KiB of RSS\n", SILENT,
                MUTE, rss1 - rss0);
        /* a connection is a few KiB of bookkeeping; the windows are address space, not memory */
        CHECK(rss1 - rss0 < (SILENT + MUTE) * 32);
        /* a zero-length packet is end-of-stream on SOCK_SEQPACKET: the daemon closes, nothing else happens */
        zero = raw_connect(dmn.sock);
        CHECK_EQ(send(zero, &nothing, 0, MSG_NOSIGNAL), 0);
        CHECK(raw_closed(zero, 5000));
        close(zero);
        for (int i = 0; i < SILENT; i++)
                close(silent[i]);
        for (int i = 0; i < MUTE; i++)
                close(mute[i]);
        check_back("half-open connections");
}

/* A connection that never completes hello is closed after the daemon's hello timeout; one that did is not. */
static int hello_timeout_case(void)
{
        int fd = raw_connect(dmn.sock), greeted = raw_connect(dmn.sock);
        int64_t t0 = now_ms();
        uint32_t id = 1;
        int code = 0;

        CHECK_EQ(raw_hello(greeted), 0);
        CHECK_EQ(raw_recv_reply(fd, &id, &code, NULL, 0, 20000), 0);
        CHECK_EQ(id, 0);
        CHECK_EQ(code, -ETIMEDOUT);
        CHECK(raw_closed(fd, 5000));
        fprintf(stderr, "hello timeout: closed after %lld ms\n", (long long)(now_ms() - t0));
        CHECK(now_ms() - t0 >= 1500); /* not before the 2 s configured */
        CHECK(!raw_closed(greeted, 2500));
        close(fd);
        close(greeted);
        return check_failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
        static const TestCase cases[] = {
                {"malformed frames from a client that holds memory", test_frames},
                {"wrong fds where a dmabuf is expected", test_import_fds},
                {"handle guessing and freed handles", test_handles},
                {"other clients' and out-of-window addresses", test_addresses},
                {"sizes: zero, huge, unaligned, wrapping", test_sizes},
                {"SVM attribute lists", test_svm_attrs},
                {"lists over the limits, NUMA nodes that are not", test_list_limits},
                {"flooding without reading replies", test_flood},
                {"thousands of connections", test_many_connections},
                {"the daemon out of fds", test_out_of_fds},
                {"half-open connections", test_half_open},
        };
        char config[256];
        bool hello_timeout = argc > 1 && strcmp(argv[1], "hello-timeout") == 0;
        struct rlimit rl = {8192, 8192};
        int r;

        signal(SIGPIPE, SIG_IGN);
        if (hello_timeout && !daemon_accepts_config("[daemon]\nhello-timeout = 2\n", false)) {
                printf("SKIP: this gpumemd has no hello-timeout setting\n");
                return 77;
        }
        /* room for thousands of connections, in this process and in the daemon it starts */
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        /* windows of 2 GiB under ThreadSanitizer, which leaves the daemon a few TiB of VA: the connections
         * here are many, their windows are not what is tested */
        snprintf(config, sizeof(config),
                 "[daemon]\nlog-level = err\nmax-connections = 4000\n"
                 "max-connections-per-uid = %d\n%s%s",
                 CONN_CAP_PER_UID, hello_timeout ? "hello-timeout = 2\n" : "",
                 daemon_under_tsan() ? "window-size = 2G\n" : "");
        if (daemon_setup(&dmn, "mi300x", config, NULL, NULL, 0) < 0)
                return EXIT_FAILURE;
        if (hello_timeout)
                return daemon_finish(&dmn, hello_timeout_case());
        r = daemon_base_state(&dmn, &base);
        base.fds = daemon_quiet_fd_count(&dmn);
        if (r == 0)
                r = daemon_gpus(&dmn, gpus, ARRAY_SIZE(gpus));
        if (r < 0) {
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        n_gpus = (size_t)r;
        victim_setup();
        /* the baseline of every case: the victim's memory held, nothing else */
        usleep(100000);
        CHECK_EQ(daemon_state(&dmn, &with_victim), 0);
        with_victim.fds = daemon_quiet_fd_count(&dmn);
        r = run_tests(cases, ARRAY_SIZE(cases));
        if (victim.c) {
                gm_client_close(victim.c);
                DaemonState s;
                if (daemon_wait_base(&dmn, &base, 10000, &s) < 0)
                        r = EXIT_FAILURE;
        }
        return daemon_finish(&dmn, r);
}
