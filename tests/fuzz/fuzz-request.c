/* libFuzzer target: request decoding and dispatch in the daemon core, on the model, over a socketpair Conn.
 */
#include <dirent.h>
#include <errno.h>
#include <sanitizer/common_interface_defs.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <unistd.h>

#include "broker/broker.h"
#include "server/classes.h"
#include "server/conn.h"
#include "drivers/driver-kfd.h"
#include "frame.h"
#include "fuzz-input.h"
#include "gpumem.pb-c.h"
#include "base/log.h"
#include "manager.h"
#include "model.h"
#include "ops/request.h"
#include "wire.h"
#include "base/worker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/*
 * One Manager on the model (mi300x) lives for the whole run, as the daemon's does. Each input is one client:
 * a Conn over a socketpair, fed frames by calling request_handle() as the read callback would, replies
 * drained from the other end. When the input ends the client goes, and the daemon must be back where it
 * started: no connection, no object, no window, the model's counters and the process's fds as before.
 *
 * Input: [session u8] then records of [ctl u8] ...
 *   session bit 0: hello first (done by the harness), bit 1: an unprivileged identity, bit 2: small window
 *   ctl & 3 == 0: [len u16][body]: a frame with a correct header around @body
 *   ctl & 3 == 1: [len u16][bytes]: a raw packet, header and all
 *   ctl & 3 >= 2: [op u8][fields...]: a request the harness builds from the bytes, with addresses and
 *                 handles drawn from what earlier replies returned, so deep paths are reached
 *   (ctl >> 2) & 3: fds sent with the frame, of kinds picked by ctl >> 4 (/dev/null, a memfd, a pipe, a
 *                 socket, a directory, an fd from an earlier reply)
 */

static Manager *mgr;
static char tmpdir[64];
static ThunkModelStats model_base;
static int fd_base = -1;

/* What earlier replies handed out: the fuzzer reuses it, as a real client would. */
typedef struct Pool {
        uint64_t vas[16];
        size_t n_vas;
        uint64_t handles[16];
        size_t n_handles;
        int fds[4];
        size_t n_fds;
        uint64_t window_base, window_size;
} Pool;

static void pool_va(Pool *p, uint64_t va)
{
        p->vas[p->n_vas++ % 16] = va;
}

static void pool_handle(Pool *p, uint64_t h)
{
        p->handles[p->n_handles++ % 16] = h;
}

static void pool_fd(Pool *p, int fd)
{
        if (p->n_fds < 4)
                p->fds[p->n_fds++] = fd;
        else
                close(fd);
}

/*
 * The process's open fds, every number (not only those below some bound), from getdents64 over
 * /proc/self/fd kept open for the whole run (its own fd is in the baseline): a few syscalls per input where
 * probing each number with fcntl() took thousands, which were most of the fuzzer's time.
 */
static int proc_fd_dir = -1;

struct linux_dirent64 {
        uint64_t d_ino;
        int64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[];
};

static int count_fds(void)
{
        static char buf[8192] __attribute__((aligned(8)));
        int n = 0;

        if (proc_fd_dir < 0 || lseek(proc_fd_dir, 0, SEEK_SET) < 0)
                abort();
        for (;;) {
                long got = syscall(SYS_getdents64, proc_fd_dir, buf, sizeof(buf));
                if (got < 0)
                        abort();
                /* only 0 is the end: procfs may stop a call early (an fd it could not describe), and a
                 * count cut short there was once taken for fds the daemon had lost */
                if (got == 0)
                        return n;
                for (long off = 0; off < got;) {
                        const struct linux_dirent64 *e = (const void *)(buf + off);
                        if (e->d_name[0] != '.')
                                n++;
                        off += e->d_reclen;
                }
        }
}

/* What the process holds, to tell a leaked fd by its target. */
static void list_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;

        while (d && (e = readdir(d))) {
                char path[300], target[256];
                ssize_t n;
                if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
                        continue;
                snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
                n = readlink(path, target, sizeof(target) - 1);
                target[n > 0 ? n : 0] = '\0';
                fprintf(stderr, "  fd %s -> %s\n", e->d_name, target);
        }
        if (d)
                closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
        Options o;
        char sock[128];

        snprintf(tmpdir, sizeof(tmpdir), "/tmp/gpumemd-fuzz-XXXXXX");
        if (!mkdtemp(tmpdir))
                abort();
        snprintf(sock, sizeof(sock), "%s/gpumemd.sock", tmpdir);
        options_init(&o);
        free(o.socket_path);
        o.socket_path = strdup(sock);
        /* a policy that lets every client publish and open shares under f/ (none outlives its client, so
         * each input still leaves nothing behind) */
        {
                char conf[160];
                FILE *f;
                snprintf(conf, sizeof(conf), "%s/gpumemd.conf", tmpdir);
                f = fopen(conf, "w");
                if (!f ||
                    fputs("[class fuzz]\nmatch-all = yes\nshare-publish = f/*\nshare-read = f/*\n"
                          "share-write = f/a f/b\n",
                          f) < 0 ||
                    fclose(f) != 0)
                        abort();
                o.config_path = strdup(conf);
                o.config_explicit = true;
        }
        snprintf(o.backend, sizeof(o.backend), "model");
        o.log_level = LOG_EMERG;
        o.window_size = 128ull << 20; /* bounds what one client can allocate (host memory is populated) */
        o.loops = 1;                  /* every connection on the one loop this harness runs */
        log_set_level(LOG_EMERG);
        if (manager_new(&mgr, &o) < 0) {
                fprintf(stderr, "fuzz-request: cannot start the daemon core\n");
                abort();
        }
        options_done(&o);
        /* The daemon's SIGTERM and SIGINT events would take the signals from libFuzzer, which then never
         * stops or prints its final stats when a run is cut off: give them back (libevent restores the
         * handlers it replaced). */
        event_del(mgr->sigterm_ev);
        event_del(mgr->sigint_ev);
        /* the socket file is not needed: connections come from socketpairs; the policy is loaded */
        unlink(sock);
        {
                char conf[160];
                snprintf(conf, sizeof(conf), "%s/gpumemd.conf", tmpdir);
                unlink(conf);
        }
        rmdir(tmpdir);
        thunk_model_get_stats(driver_kfd_model(mgr->drv), &model_base);
        proc_fd_dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (proc_fd_dir < 0)
                abort();
        /* The sanitizer starts its symbolizer (two pipes, kept open) the first time it names a function,
         * e.g. when libFuzzer reports new coverage: start it now so its pipes are in the fd baseline. */
        {
                char sym[256];
                __sanitizer_symbolize_pc(__builtin_return_address(0), "%p %F %L", sym, sizeof(sym));
        }
        return 0;
}

static void run_loop(void)
{
        /* work handed to the worker threads ends on the loop: wait for all of it */
        while (mgr->shards[0].home && worker_pending(mgr->shards[0].home))
                event_base_loop(mgr->base, EVLOOP_ONCE);
        /* deferred frees and queued writes run from the event loop */
        for (int i = 0; i < 4; i++)
                event_base_loop(mgr->base, EVLOOP_NONBLOCK);
}

/* Read every reply waiting on @sock; remember what they hand out. */
static void drain(int sock, Pool *pool)
{
        static uint8_t buf[GM_FRAME_MAX];

        for (;;) {
                int fds[GM_FRAME_MAX_FDS];
                size_t n_fds = 0;
                ssize_t n = gm_wire_recv(sock, buf, sizeof(buf), fds, &n_fds, MSG_DONTWAIT);
                GmFrameHdr h;
                Gpumem__Reply *rep;

                if (n <= 0)
                        return;
                /* every reply the daemon sends is a well-formed frame with a status */
                if (gm_frame_parse(buf, (size_t)n, n_fds, GM_PROTOCOL_VERSION, &h, NULL) < 0)
                        abort();
                rep = gpumem__reply__unpack(NULL, h.body_len, buf + GM_FRAME_HDR_SIZE);
                if (!rep || !rep->status || !rep->status->has_code || rep->status->code > 0)
                        abort();
                if (rep->status->code < 0 &&
                    (n_fds != 0 || rep->result_case != GPUMEM__REPLY__RESULT__NOT_SET))
                        abort(); /* a failure carries no result and no fd */
                switch (rep->result_case) {
                case GPUMEM__REPLY__RESULT_HELLO:
                        pool->window_base = rep->hello->window_base;
                        pool->window_size = rep->hello->window_size;
                        break;
                case GPUMEM__REPLY__RESULT_ALLOC:
                        pool_va(pool, rep->alloc->va);
                        pool_handle(pool, rep->alloc->handle);
                        break;
                case GPUMEM__REPLY__RESULT_VMM_RESERVE:
                        pool_va(pool, rep->vmm_reserve->va);
                        break;
                case GPUMEM__REPLY__RESULT_VMM_CREATE:
                        pool_handle(pool, rep->vmm_create->handle);
                        break;
                case GPUMEM__REPLY__RESULT_VMM_RETAIN:
                        pool_handle(pool, rep->vmm_retain->handle);
                        break;
                case GPUMEM__REPLY__RESULT_DMABUF_IMPORT:
                        pool_handle(pool, rep->dmabuf_import->handle);
                        break;
                case GPUMEM__REPLY__RESULT_SHARE_PUBLISH:
                        pool_va(pool, rep->share_publish->va);
                        break;
                case GPUMEM__REPLY__RESULT_SHARE_OPEN:
                        pool_va(pool, rep->share_open->va);
                        pool_handle(pool, rep->share_open->handle);
                        break;
                default:
                        break;
                }
                gpumem__reply__free_unpacked(rep, NULL);
                for (size_t i = 0; i < n_fds; i++)
                        pool_fd(pool, fds[i]);
        }
}

static uint64_t pick_va(Reader *r, const Pool *p)
{
        uint8_t sel = rd8(r);
        uint64_t off = (uint64_t)rd8(r) << 12;

        switch (sel % 8) {
        case 0:
        case 1:
        case 2:
                return p->n_vas ? p->vas[rd8(r) % (p->n_vas < 16 ? p->n_vas : 16)] + (sel & 8 ? off : 0) : 0;
        case 3:
                return p->window_base + ((uint64_t)rdn(r, 2) << 12);
        case 4:
                return p->window_base + p->window_size - off;
        case 5:
                return rdn(r, 8);
        case 6:
                return p->window_base - off - 4096;
        default:
                return 0;
        }
}

static uint64_t pick_size(Reader *r)
{
        uint8_t sel = rd8(r);

        switch (sel % 8) {
        case 0:
        case 1:
                return (uint64_t)(1 + rd8(r) % 64) << 12;
        case 2:
                return (uint64_t)(1 + rd8(r) % 8) << 21;
        case 3:
                return rdn(r, 3);
        case 4:
                return rdn(r, 8);
        case 5:
                return UINT64_MAX - rd8(r);
        case 6:
                return 0;
        default:
                return (uint64_t)rd8(r) << 20;
        }
}

static uint64_t pick_handle(Reader *r, const Pool *p)
{
        uint8_t sel = rd8(r);
        if (sel < 200 && p->n_handles)
                return p->handles[sel % (p->n_handles < 16 ? p->n_handles : 16)];
        return sel & 1 ? rdn(r, 8) : sel;
}

static uint32_t pick_gpu(Reader *r)
{
        uint8_t sel = rd8(r);
        size_t n = broker_gpu_count(mgr->broker);
        if (sel < 240 && n)
                return broker_gpu_id(mgr->broker, sel % n);
        return sel == 240 ? 0 : (uint32_t)rdn(r, 4);
}

/* Build a request from the input; returns its packed length in @out (0: nothing to send). */
static size_t build_request(Reader *r, const Pool *p, uint8_t *out, size_t cap)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        union {
                Gpumem__Hello hello;
                Gpumem__Alloc alloc;
                Gpumem__Free free_;
                Gpumem__MapToGpus map;
                Gpumem__UnmapFromGpus unmap;
                Gpumem__PointerInfoGet pinfo;
                Gpumem__MemInfoGet minfo;
                Gpumem__VmmReserve vres;
                Gpumem__VmmFree vfree;
                Gpumem__VmmCreate vcreate;
                Gpumem__VmmRelease vrel;
                Gpumem__VmmMap vmap;
                Gpumem__VmmUnmap vunmap;
                Gpumem__VmmSetAccess vset;
                Gpumem__VmmGetAccess vget;
                Gpumem__VmmRetain vret;
                Gpumem__VmmProperties vprop;
                Gpumem__DmabufExport exp;
                Gpumem__DmabufImport imp;
                Gpumem__SvmSetAttr sset;
                Gpumem__SvmGetAttr sget;
                Gpumem__SvmPrefetch spre;
                Gpumem__TopologyGet topo;
                Gpumem__AdminDisconnect disc;
                Gpumem__Ping ping;
                Gpumem__WindowRetry retry;
                Gpumem__TopologyFilesGet tfiles;
                Gpumem__EventCreate ecreate;
                Gpumem__EventId eid;
                Gpumem__EventWait ewait;
                Gpumem__QueueCreate qcreate;
                Gpumem__QueueId qid;
                Gpumem__QueueUpdate qupdate;
                Gpumem__SharePublish spub;
                Gpumem__ShareOpen sopen;
                Gpumem__ShareRevoke srevoke;
                Gpumem__AdminShares ashares;
        } u;
        /* names the policy lets the client publish and open, one it may not, and ones no share can have */
        static const char *const share_names[] = {"f/a", "f/b", "f/c", "other/a", "", "f/../a", "f//a"};
        uint32_t event_ids[3];
        Gpumem__AdminStatus astat = GPUMEM__ADMIN_STATUS__INIT;
        Gpumem__AdminClients aclients = GPUMEM__ADMIN_CLIENTS__INIT;
        Gpumem__AdminMetrics ametrics = GPUMEM__ADMIN_METRICS__INIT;
        Gpumem__AccessDesc desc[4], *descp[4];
        Gpumem__SvmAttr attrs[6], *attrp[6];
        uint64_t packed[6];
        size_t n_packed = 0, n_msgs = 0;
        uint32_t gpus[4];
        size_t n;
        uint8_t op = rd8(r);

        switch (op % 26) {
        case 0:
                gpumem__hello__init(&u.hello);
                u.hello.has_protocol_version = true;
                u.hello.protocol_version = rd8(r) % (GM_PROTOCOL_VERSION + 1);
                u.hello.has_window_size = rd8(r) & 1;
                u.hello.window_size = (uint64_t)rd8(r) << 21;
                u.hello.client_name = "fuzz";
                q.op_case = GPUMEM__REQUEST__OP_HELLO;
                q.hello = &u.hello;
                break;
        case 1:
        case 2:
                gpumem__alloc__init(&u.alloc);
                u.alloc.has_kind = u.alloc.has_size = u.alloc.has_gpu_id = u.alloc.has_flags = true;
                u.alloc.kind = (Gpumem__MemKind)(rd8(r) % 7);
                u.alloc.size = pick_size(r);
                u.alloc.gpu_id = pick_gpu(r);
                u.alloc.flags = rd8(r) & 1 ? rd8(r) : (uint32_t)rdn(r, 4);
                u.alloc.has_numa_node = rd8(r) & 1;
                u.alloc.numa_node = (int8_t)rd8(r);
                u.alloc.has_alignment = u.alloc.has_fixed_va = true;
                u.alloc.alignment = rd8(r) & 1 ? (uint64_t)1 << (rd8(r) % 64) : 0;
                u.alloc.fixed_va = rd8(r) & 1 ? pick_va(r, p) : 0;
                n = rd8(r) % 5;
                for (size_t i = 0; i < n; i++)
                        gpus[i] = pick_gpu(r);
                u.alloc.n_map_gpus = n;
                u.alloc.map_gpus = gpus;
                q.op_case = GPUMEM__REQUEST__OP_ALLOC;
                q.alloc = &u.alloc;
                break;
        case 3:
                gpumem__free__init(&u.free_);
                u.free_.has_handle = true;
                u.free_.handle = pick_handle(r, p);
                q.op_case = GPUMEM__REQUEST__OP_FREE;
                q.free = &u.free_;
                break;
        case 4:
        case 5:
                n = rd8(r) % 5;
                for (size_t i = 0; i < n; i++)
                        gpus[i] = pick_gpu(r);
                if (op % 26 == 4) {
                        gpumem__map_to_gpus__init(&u.map);
                        u.map.has_handle = true;
                        u.map.handle = pick_handle(r, p);
                        u.map.n_gpu_ids = n;
                        u.map.gpu_ids = gpus;
                        q.op_case = GPUMEM__REQUEST__OP_MAP;
                        q.map = &u.map;
                } else {
                        gpumem__unmap_from_gpus__init(&u.unmap);
                        u.unmap.has_handle = true;
                        u.unmap.handle = pick_handle(r, p);
                        u.unmap.n_gpu_ids = n;
                        u.unmap.gpu_ids = gpus;
                        q.op_case = GPUMEM__REQUEST__OP_UNMAP;
                        q.unmap = &u.unmap;
                }
                break;
        case 6:
                gpumem__pointer_info_get__init(&u.pinfo);
                u.pinfo.has_va = true;
                u.pinfo.va = pick_va(r, p);
                q.op_case = GPUMEM__REQUEST__OP_POINTER_INFO;
                q.pointer_info = &u.pinfo;
                break;
        case 7:
                gpumem__mem_info_get__init(&u.minfo);
                u.minfo.has_gpu_id = true;
                u.minfo.gpu_id = pick_gpu(r);
                q.op_case = GPUMEM__REQUEST__OP_MEM_INFO;
                q.mem_info = &u.minfo;
                break;
        case 8:
                gpumem__vmm_reserve__init(&u.vres);
                u.vres.has_size = u.vres.has_alignment = u.vres.has_fixed_va = u.vres.has_flags = true;
                u.vres.size = pick_size(r);
                u.vres.alignment = rd8(r) & 1 ? (uint64_t)1 << (rd8(r) % 64) : 0;
                u.vres.fixed_va = rd8(r) & 1 ? pick_va(r, p) : 0;
                u.vres.flags = rd8(r) == 0xff;
                q.op_case = GPUMEM__REQUEST__OP_VMM_RESERVE;
                q.vmm_reserve = &u.vres;
                break;
        case 9:
                gpumem__vmm_free__init(&u.vfree);
                u.vfree.has_va = u.vfree.has_size = true;
                u.vfree.va = pick_va(r, p);
                u.vfree.size = pick_size(r);
                q.op_case = GPUMEM__REQUEST__OP_VMM_FREE;
                q.vmm_free = &u.vfree;
                break;
        case 10:
        case 11:
                gpumem__vmm_create__init(&u.vcreate);
                u.vcreate.has_size = u.vcreate.has_gpu_id = u.vcreate.has_flags = true;
                u.vcreate.size = pick_size(r);
                u.vcreate.gpu_id = pick_gpu(r);
                u.vcreate.flags = rd8(r) & 0x7f;
                q.op_case = GPUMEM__REQUEST__OP_VMM_CREATE;
                q.vmm_create = &u.vcreate;
                break;
        case 12:
                gpumem__vmm_release__init(&u.vrel);
                u.vrel.has_handle = true;
                u.vrel.handle = pick_handle(r, p);
                q.op_case = GPUMEM__REQUEST__OP_VMM_RELEASE;
                q.vmm_release = &u.vrel;
                break;
        case 13:
        case 14:
                gpumem__vmm_map__init(&u.vmap);
                u.vmap.has_va = u.vmap.has_size = u.vmap.has_offset = u.vmap.has_handle = true;
                u.vmap.va = pick_va(r, p);
                u.vmap.size = pick_size(r);
                u.vmap.offset = rd8(r) & 1 ? 0 : pick_size(r);
                u.vmap.handle = pick_handle(r, p);
                q.op_case = GPUMEM__REQUEST__OP_VMM_MAP;
                q.vmm_map = &u.vmap;
                break;
        case 15:
                gpumem__vmm_unmap__init(&u.vunmap);
                u.vunmap.has_va = u.vunmap.has_size = true;
                u.vunmap.va = pick_va(r, p);
                u.vunmap.size = pick_size(r);
                q.op_case = GPUMEM__REQUEST__OP_VMM_UNMAP;
                q.vmm_unmap = &u.vunmap;
                break;
        case 16:
        case 17:
                gpumem__vmm_set_access__init(&u.vset);
                u.vset.has_va = u.vset.has_size = true;
                u.vset.va = pick_va(r, p);
                u.vset.size = pick_size(r);
                n = rd8(r) % 5;
                for (size_t i = 0; i < n; i++) {
                        gpumem__access_desc__init(&desc[i]);
                        desc[i].has_gpu_id = desc[i].has_access = true;
                        desc[i].gpu_id = rd8(r) & 1 ? 0 : pick_gpu(r);
                        desc[i].access = (Gpumem__Access)(rd8(r) % 5);
                        descp[i] = &desc[i];
                }
                u.vset.n_desc = n;
                u.vset.desc = descp;
                q.op_case = GPUMEM__REQUEST__OP_VMM_SET_ACCESS;
                q.vmm_set_access = &u.vset;
                break;
        case 18:
                gpumem__vmm_get_access__init(&u.vget);
                u.vget.has_va = u.vget.has_gpu_id = true;
                u.vget.va = pick_va(r, p);
                u.vget.gpu_id = rd8(r) & 1 ? 0 : pick_gpu(r);
                q.op_case = GPUMEM__REQUEST__OP_VMM_GET_ACCESS;
                q.vmm_get_access = &u.vget;
                break;
        case 19:
                gpumem__vmm_retain__init(&u.vret);
                u.vret.has_va = true;
                u.vret.va = pick_va(r, p);
                q.op_case = GPUMEM__REQUEST__OP_VMM_RETAIN;
                q.vmm_retain = &u.vret;
                break;
        case 20:
                gpumem__dmabuf_export__init(&u.exp);
                u.exp.has_handle = true;
                u.exp.handle = pick_handle(r, p);
                q.op_case = GPUMEM__REQUEST__OP_DMABUF_EXPORT;
                q.dmabuf_export = &u.exp;
                break;
        case 21:
                gpumem__dmabuf_import__init(&u.imp);
                u.imp.has_fd_index = rd8(r) != 0xff;
                u.imp.fd_index = (int8_t)rd8(r) % 3;
                u.imp.has_gpu_id = true;
                u.imp.gpu_id = pick_gpu(r);
                q.op_case = GPUMEM__REQUEST__OP_DMABUF_IMPORT;
                q.dmabuf_import = &u.imp;
                break;
        case 22:
        case 23:
                n = rd8(r) % 7;
                for (size_t i = 0; i < n; i++) {
                        gpumem__svm_attr__init(&attrs[i]);
                        attrs[i].has_type = attrs[i].has_value = true;
                        attrs[i].type = rd8(r) % 12;
                        attrs[i].value = rd8(r) & 1 ? pick_gpu(r) : (uint32_t)rdn(r, rd8(r) % 5);
                        attrp[i] = &attrs[i];
                }
                /* packed (since 3) or as messages, or (refused) both */
                {
                        uint8_t how = rd8(r) % 4;
                        for (size_t i = 0; i < n; i++)
                                packed[i] = (uint64_t)attrs[i].type << 32 | attrs[i].value;
                        n_packed = how >= 2 ? n : 0;
                        if (how == 2)
                                n_msgs = 0;
                        else
                                n_msgs = n;
                }
                if (op % 26 == 22) {
                        gpumem__svm_set_attr__init(&u.sset);
                        u.sset.has_va = u.sset.has_size = true;
                        u.sset.va = pick_va(r, p);
                        u.sset.size = pick_size(r);
                        u.sset.n_attrs = n_msgs;
                        u.sset.attrs = attrp;
                        u.sset.n_packed_attrs = n_packed;
                        u.sset.packed_attrs = packed;
                        q.op_case = GPUMEM__REQUEST__OP_SVM_SET_ATTR;
                        q.svm_set_attr = &u.sset;
                } else {
                        gpumem__svm_get_attr__init(&u.sget);
                        u.sget.has_va = u.sget.has_size = true;
                        u.sget.va = pick_va(r, p);
                        u.sget.size = pick_size(r);
                        u.sget.n_attrs = n_msgs;
                        u.sget.attrs = attrp;
                        u.sget.n_packed_attrs = n_packed;
                        u.sget.packed_attrs = packed;
                        q.op_case = GPUMEM__REQUEST__OP_SVM_GET_ATTR;
                        q.svm_get_attr = &u.sget;
                }
                break;
        case 24:
                gpumem__svm_prefetch__init(&u.spre);
                u.spre.has_va = u.spre.has_size = u.spre.has_location = true;
                u.spre.va = pick_va(r, p);
                u.spre.size = pick_size(r);
                u.spre.location = rd8(r) & 1 ? 0 : pick_gpu(r);
                q.op_case = GPUMEM__REQUEST__OP_SVM_PREFETCH;
                q.svm_prefetch = &u.spre;
                break;
        default:
                switch (rd8(r) % 13) {
                case 0:
                        q.op_case = GPUMEM__REQUEST__OP_ADMIN_STATUS;
                        q.admin_status = &astat;
                        break;
                case 1:
                        q.op_case = GPUMEM__REQUEST__OP_ADMIN_CLIENTS;
                        q.admin_clients = &aclients;
                        break;
                case 2:
                        q.op_case = GPUMEM__REQUEST__OP_ADMIN_METRICS;
                        q.admin_metrics = &ametrics;
                        break;
                case 3:
                        gpumem__topology_get__init(&u.topo);
                        u.topo.has_with_properties = true;
                        u.topo.with_properties = rd8(r) & 1;
                        q.op_case = GPUMEM__REQUEST__OP_TOPOLOGY;
                        q.topology = &u.topo;
                        break;
                case 4:
                        gpumem__window_retry__init(&u.retry);
                        u.retry.has_failed_base = true;
                        u.retry.failed_base = rd8(r) & 1 ? p->window_base : rdn(r, 8);
                        q.op_case = GPUMEM__REQUEST__OP_WINDOW_RETRY;
                        q.window_retry = &u.retry;
                        break;
                case 5:
                        gpumem__topology_files_get__init(&u.tfiles);
                        u.tfiles.has_from = rd8(r) & 1;
                        u.tfiles.from = (uint32_t)rdn(r, rd8(r) % 3);
                        q.op_case = GPUMEM__REQUEST__OP_TOPOLOGY_FILES;
                        q.topology_files = &u.tfiles;
                        break;
                case 6:
                        gpumem__event_create__init(&u.ecreate);
                        u.ecreate.has_type = u.ecreate.has_auto_reset = u.ecreate.has_page_va = true;
                        u.ecreate.type = rd8(r) % 10;
                        u.ecreate.auto_reset = rd8(r) & 1;
                        u.ecreate.page_va = rd8(r) & 1 ? pick_va(r, p) : 0;
                        q.op_case = GPUMEM__REQUEST__OP_EVENT_CREATE;
                        q.event_create = &u.ecreate;
                        break;
                case 7: {
                        uint8_t which = rd8(r);
                        gpumem__event_id__init(&u.eid);
                        u.eid.has_event_id = true;
                        /* the first ids are the ones events get */
                        u.eid.event_id = (which & 4 ? 0x40000000u : 0u) + rd8(r) % 4;
                        q.op_case = which % 3 == 0   ? GPUMEM__REQUEST__OP_EVENT_SET
                                    : which % 3 == 1 ? GPUMEM__REQUEST__OP_EVENT_RESET
                                                     : GPUMEM__REQUEST__OP_EVENT_DESTROY;
                        if (q.op_case == GPUMEM__REQUEST__OP_EVENT_SET)
                                q.event_set = &u.eid;
                        else if (q.op_case == GPUMEM__REQUEST__OP_EVENT_RESET)
                                q.event_reset = &u.eid;
                        else
                                q.event_destroy = &u.eid;
                        break;
                }
                case 8:
                        gpumem__event_wait__init(&u.ewait);
                        u.ewait.n_event_ids = rd8(r) % 4;
                        for (size_t i = 0; i < u.ewait.n_event_ids; i++)
                                event_ids[i] = rd8(r) % 4;
                        u.ewait.event_ids = event_ids;
                        u.ewait.has_wait_all = u.ewait.has_timeout_ms = true;
                        u.ewait.wait_all = rd8(r) & 1;
                        /* short waits: a pending one ends before the input does */
                        u.ewait.timeout_ms = rd8(r) % 3;
                        q.op_case = GPUMEM__REQUEST__OP_EVENT_WAIT;
                        q.event_wait = &u.ewait;
                        break;
                case 9:
                        /* addresses from earlier allocations, so that some queues are made and run */
                        gpumem__queue_create__init(&u.qcreate);
                        u.qcreate.has_gpu_id = u.qcreate.has_type = u.qcreate.has_percentage = true;
                        u.qcreate.has_priority = u.qcreate.has_ring_va = u.qcreate.has_ring_size = true;
                        u.qcreate.has_rptr_va = u.qcreate.has_wptr_va = true;
                        u.qcreate.gpu_id = pick_gpu(r);
                        u.qcreate.type = rd8(r) % 5;
                        u.qcreate.percentage = rd8(r);
                        u.qcreate.priority = rd8(r) % 17;
                        u.qcreate.ring_va = pick_va(r, p);
                        u.qcreate.ring_size = rd8(r) & 1 ? 4096 : pick_size(r);
                        u.qcreate.rptr_va = pick_va(r, p) + (rd8(r) & 0x18);
                        u.qcreate.wptr_va = pick_va(r, p) + (rd8(r) & 0x18);
                        if (rd8(r) & 1) {
                                u.qcreate.has_eop_va = u.qcreate.has_eop_size = true;
                                u.qcreate.eop_va = pick_va(r, p);
                                u.qcreate.eop_size = pick_size(r);
                        }
                        if (rd8(r) & 1) {
                                u.qcreate.has_ctx_save_va = u.qcreate.has_ctx_save_size = true;
                                u.qcreate.ctx_save_va = pick_va(r, p);
                                u.qcreate.ctx_save_size = pick_size(r);
                        }
                        q.op_case = GPUMEM__REQUEST__OP_QUEUE_CREATE;
                        q.queue_create = &u.qcreate;
                        break;
                case 10:
                        if (rd8(r) & 1) {
                                gpumem__queue_id__init(&u.qid);
                                u.qid.has_queue_id = true;
                                u.qid.queue_id = rd8(r) % 4; /* the first ids are the ones queues get */
                                q.op_case = GPUMEM__REQUEST__OP_QUEUE_DESTROY;
                                q.queue_destroy = &u.qid;
                        } else {
                                gpumem__queue_update__init(&u.qupdate);
                                u.qupdate.has_queue_id = u.qupdate.has_ring_va = u.qupdate.has_ring_size =
                                        true;
                                u.qupdate.has_percentage = u.qupdate.has_priority = true;
                                u.qupdate.queue_id = rd8(r) % 4;
                                u.qupdate.ring_va = rd8(r) & 1 ? pick_va(r, p) : 0;
                                u.qupdate.ring_size = rd8(r) & 1 ? 4096 : pick_size(r);
                                u.qupdate.percentage = rd8(r);
                                u.qupdate.priority = rd8(r) % 17;
                                q.op_case = GPUMEM__REQUEST__OP_QUEUE_UPDATE;
                                q.queue_update = &u.qupdate;
                        }
                        break;
                case 11:
                        switch (rd8(r) % 4) {
                        case 0:
                                gpumem__share_publish__init(&u.spub);
                                u.spub.has_handle = u.spub.has_read_only = true;
                                u.spub.handle = pick_handle(r, p);
                                u.spub.name = (char *)share_names[rd8(r) % ARRAY_SIZE(share_names)];
                                u.spub.read_only = rd8(r) & 1;
                                q.op_case = GPUMEM__REQUEST__OP_SHARE_PUBLISH;
                                q.share_publish = &u.spub;
                                break;
                        case 1:
                                gpumem__share_open__init(&u.sopen);
                                u.sopen.name = (char *)share_names[rd8(r) % ARRAY_SIZE(share_names)];
                                u.sopen.has_write = true;
                                u.sopen.write = rd8(r) & 1;
                                u.sopen.n_gpu_ids = rd8(r) % 3;
                                for (size_t i = 0; i < u.sopen.n_gpu_ids; i++)
                                        gpus[i] = pick_gpu(r);
                                u.sopen.gpu_ids = gpus;
                                q.op_case = GPUMEM__REQUEST__OP_SHARE_OPEN;
                                q.share_open = &u.sopen;
                                break;
                        case 2:
                                gpumem__share_revoke__init(&u.srevoke);
                                u.srevoke.name = (char *)share_names[rd8(r) % ARRAY_SIZE(share_names)];
                                q.op_case = GPUMEM__REQUEST__OP_SHARE_REVOKE;
                                q.share_revoke = &u.srevoke;
                                break;
                        default:
                                gpumem__admin_shares__init(&u.ashares);
                                u.ashares.has_from = rd8(r) & 1;
                                u.ashares.from = rd8(r);
                                q.op_case = GPUMEM__REQUEST__OP_ADMIN_SHARES;
                                q.admin_shares = &u.ashares;
                                break;
                        }
                        break;
                default:
                        gpumem__ping__init(&u.ping);
                        u.ping.has_cookie = true;
                        u.ping.cookie = rdn(r, 8);
                        q.op_case = GPUMEM__REQUEST__OP_PING;
                        q.ping = &u.ping;
                        break;
                }
                break;
        }
        n = gpumem__request__get_packed_size(&q);
        if (n > cap)
                return 0;
        return gpumem__request__pack(&q, out);
}

/* An fd of the kind @k, as a hostile client might attach it. */
static int make_fd(unsigned k, Pool *pool)
{
        int fds[2], fd = -1;

        switch (k % 6) {
        case 0:
                return open("/dev/null", O_RDWR | O_CLOEXEC);
        case 1:
                fd = memfd_create("fuzz", MFD_CLOEXEC);
                if (fd >= 0 && ftruncate(fd, 2 << 20) < 0) {
                        close(fd);
                        fd = -1;
                }
                return fd;
        case 2:
                if (pipe2(fds, O_CLOEXEC) < 0)
                        return -1;
                close(fds[1]);
                return fds[0];
        case 3:
                if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0)
                        return -1;
                close(fds[1]);
                return fds[0];
        case 4:
                return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        default:
                return pool->n_fds ? fcntl(pool->fds[k % pool->n_fds], F_DUPFD_CLOEXEC, 3)
                                   : open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
}

static void put_hdr(uint8_t *buf, uint32_t id, uint32_t body_len, unsigned n_fds)
{
        if (gm_frame_hdr_encode(buf, GM_PROTOCOL_VERSION, id, body_len, n_fds) < 0)
                abort();
}

/* One counter that must be back at its start value; false (and a line naming it) when it is not. */
static bool same(const char *what, unsigned long long now, unsigned long long base)
{
        if (now == base)
                return true;
        fprintf(stderr, "  %s: %llu, at start %llu\n", what, now, base);
        return false;
}

static void check_back_to_base(void)
{
        ThunkModelStats st;
        BrokerUsage u;
        int fds;
        bool ok = true;

        broker_totals(mgr->broker, &u);
        thunk_model_get_stats(driver_kfd_model(mgr->drv), &st);
        fds = count_fds();
        if (fd_base < 0)
                fd_base = fds;
        /* every comparison runs (no short cut), so a failure names all that differs */
        ok &= same("connections", mgr->n_conns + (mgr->conns != NULL), 0);
        ok &= same("broker objects", u.objects, 0);
        ok &= same("broker device bytes", u.device_bytes, 0);
        ok &= same("broker host bytes", u.host_bytes, 0);
        ok &= same("broker managed bytes", u.managed_bytes, 0);
        ok &= same("broker vmm bytes", u.vmm_bytes, 0);
        ok &= same("broker held fds", u.held_fds, 0);
        ok &= same("VA windows", thunk_va_space_count(mgr->va), mgr->va_blocked);
        ok &= same("model contexts", st.contexts, model_base.contexts);
        ok &= same("model kfd fds", st.kfd_fds, model_base.kfd_fds);
        ok &= same("model render fds", st.render_fds, model_base.render_fds);
        ok &= same("model render files", st.render_files, model_base.render_files);
        ok &= same("model KFD handles", st.mems, model_base.mems);
        ok &= same("model buffers", st.bufs, model_base.bufs);
        ok &= same("model imports", st.imports, model_base.imports);
        ok &= same("model mappings", st.mappings, model_base.mappings);
        ok &= same("model GEM handles", st.gem_handles, model_base.gem_handles);
        ok &= same("model SVM ranges", st.svm_ranges, model_base.svm_ranges);
        ok &= same("model system bytes", st.system_used, model_base.system_used);
        ok &= same("model TTM bytes", st.ttm_used, model_base.ttm_used);
        for (uint32_t i = 0; i < st.n_gpus && i < THUNK_MODEL_MAX_GPUS; i++)
                ok &= same("model VRAM bytes of a GPU", st.vram_used[i], model_base.vram_used[i]);
        ok &= same("model queues", st.queues, model_base.queues);
        ok &= same("model events", st.events, model_base.events);
        ok &= same("process fds", (unsigned)fds, (unsigned)fd_base);
        if (!ok) {
                fprintf(stderr, "state left behind by a client that has gone (above); the process's fds:\n");
                list_fds();
                abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static uint8_t pkt[GM_FRAME_MAX];
        Reader r = {data, size};
        Pool pool = {0};
        uint8_t session;
        uint32_t next_id = 1;
        int sv[2];
        Conn *c = NULL;

        if (fd_base < 0)
                check_back_to_base(); /* the first call sets the fd baseline */
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
                abort();
        manager_lock(mgr);
        if (manager_conn_new(mgr, sv[0], &c) < 0)
                abort();
        manager_conn_place(mgr, c, &mgr->shards[0]);
        {
                /* its class, as the daemon's accept gives it one: the policy's limits and share rights */
                char why[256];
                if (classes_admit(mgr, c, why, sizeof(why)) < 0)
                        abort();
        }
        manager_unlock(mgr);
        conn_start(c);
        session = rd8(&r);
        if (session & 2)
                c->ident.uid = 65534; /* an unprivileged identity: admin ops must be refused */
        if (session & 1 && c) {
                Gpumem__Request q = GPUMEM__REQUEST__INIT;
                Gpumem__Hello h = GPUMEM__HELLO__INIT;
                size_t n;
                h.has_protocol_version = true;
                /* the oldest version, or the newest, whose ops (events, queues, shares) it may then call */
                h.protocol_version = session & 8 ? GM_PROTOCOL_VERSION : 1;
                h.has_window_size = (session & 4) != 0;
                h.window_size = 8ull << 20;
                h.client_name = "fuzz";
                q.op_case = GPUMEM__REQUEST__OP_HELLO;
                q.hello = &h;
                n = gpumem__request__pack(&q, pkt + GM_FRAME_HDR_SIZE);
                put_hdr(pkt, next_id++, (uint32_t)n, 0);
                request_handle(c, pkt, GM_FRAME_HDR_SIZE + n, NULL, 0);
                drain(sv[1], &pool);
        }

        for (int rec = 0; r.n > 0 && rec < 48 && c; rec++) {
                uint8_t ctl = rd8(&r);
                unsigned n_fds = (ctl >> 2) & 3;
                int fds[4];
                size_t len = 0;

                if ((ctl & 3) <= 1) {
                        size_t want = rdn(&r, 2) % 4096;
                        if ((ctl & 3) == 0) {
                                for (len = 0; len < want && r.n; len++)
                                        pkt[GM_FRAME_HDR_SIZE + len] = rd8(&r);
                                put_hdr(pkt, next_id++, (uint32_t)len, n_fds);
                                len += GM_FRAME_HDR_SIZE;
                        } else {
                                for (len = 0; len < want && r.n; len++)
                                        pkt[len] = rd8(&r);
                        }
                } else {
                        len = build_request(&r, &pool, pkt + GM_FRAME_HDR_SIZE, GM_FRAME_BODY_MAX);
                        put_hdr(pkt, (ctl & 0x80) ? 0 : next_id++, (uint32_t)len, n_fds);
                        len += GM_FRAME_HDR_SIZE;
                }
                for (unsigned i = 0; i < n_fds; i++) {
                        fds[i] = make_fd((ctl >> 4) + i, &pool);
                        if (fds[i] < 0)
                                abort();
                }
                /* the daemon reads nothing more of a connection while its work is in progress on a worker
                 * (transport_hold): neither does this, or a free would race the worker's prefetch */
                while (c->t.held && mgr->shards[0].home && worker_pending(mgr->shards[0].home))
                        event_base_loop(mgr->base, EVLOOP_ONCE);
                for (int i = 0; i < 4 && c->t.held; i++)
                        event_base_loop(mgr->base, EVLOOP_NONBLOCK);
                request_handle(c, pkt, len, fds, n_fds);
                /* a violation kills the connection; the loop then frees it, so forget it first */
                if (c->dead)
                        c = NULL;
                drain(sv[1], &pool);
                event_base_loop(mgr->base, EVLOOP_NONBLOCK);
                drain(sv[1], &pool);
        }

        /* the client goes: its connection closes, and everything it held must be released */
        if (c && !c->dead) {
                manager_lock(mgr);
                conn_kill(c);
                manager_unlock(mgr);
        }
        run_loop();
        /* a reply that went out as the client went (an allocation a worker finished) may carry an fd: take
         * it too, rather than leave it in flight in the socket */
        drain(sv[1], &pool);
        close(sv[1]);
        /* and the files it was handed: memory freed while they lived (lingering, still charged) is refunded
         * once the broker's inotify watch reports them gone, from the loop. Always: closing the socket
         * releases whatever fds were still in flight in it */
        for (size_t i = 0; i < pool.n_fds; i++)
                close(pool.fds[i]);
        run_loop();
        check_back_to_base();
        return 0;
}
