/* Memory ops: the protocol side of the broker (decode, call the broker, build the reply and its fds). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "broker/broker.h"
#include "server/classes.h"
#include "server/core.h"
#include "request.h"
#include "view.h"
#include "base/worker.h"

int conn_books_new(Conn *c)
{
        int err;

        if (c->broker)
                return 0;
        err = broker_client_new(c->m->broker, c->window, &c->broker);
        if (err < 0)
                return err;
        err = broker_client_set_uid(c->broker, c->ident.uid);
        if (err < 0) {
                c->broker = broker_client_free(c->broker);
                return err;
        }
        broker_client_set_account(c->broker, c->cls ? &c->cls->acct : NULL);
        broker_client_set_tag(c->broker, c->id);
        broker_client_set_flow(c->broker, c->ident.uid);
        broker_client_set_interrupt(c->broker, queues_interrupt, c);
        return 0;
}

int req_books(ReqCtx *r, BrokerClient **ret)
{
        int err = conn_books_new(r->c);

        *ret = r->c->broker; /* NULL when that failed */
        if (err < 0)
                return reply_fail(r, err, "out of memory");
        return 0;
}

int reply_fail_why(ReqCtx *r, int err, const Reason *w)
{
        return reply_fail(r, err, "%s", reason_or_errno(w, err));
}

int reply_empty_or_why(ReqCtx *r, int err, const Reason *w)
{
        return err < 0 ? reply_fail_why(r, err, w) : reply_empty(r);
}

int reply_result_or_why(ReqCtx *r, int err, const Reason *w, void *result)
{
        return err < 0 ? reply_fail_why(r, err, w) : reply_result(r, result);
}

int req_call_id(ReqCtx *r, uint32_t id, int (*fn)(BrokerClient *bc, uint32_t id, Reason *w))
{
        Reason w = {""};
        WITH_CLIENT(r, bc);

        return reply_empty_or_why(r, fn(bc, id, &w), &w);
}

/* ---- device, host, managed ----------------------------------------------------------------------------- */

/* The reply to an allocation the broker made (@err >= 0) or refused. */
static int alloc_reply(ReqCtx *r, BrokerClient *bc, int err, const BrokerAllocResult *res, Reason *w)
{
        Gpumem__AllocReply ar = GPUMEM__ALLOC_REPLY__INIT;
        int idx = -1;

        if (err < 0)
                return reply_fail_why(r, err, w);
        if (res->fd >= 0) {
                idx = reply_add_fd(r, res->fd);
                if (idx < 0) {
                        /* cannot happen with one fd per reply; keep the books straight anyway */
                        if (res->import_fd >= 0)
                                close(res->import_fd);
                        (void)broker_mem_free(bc, res->handle, w);
                        return reply_fail(r, idx, "cannot attach the memory fd");
                }
        }
        if (res->import_fd >= 0) {
                int ix = reply_add_fd(r, res->import_fd);
                if (ix < 0) {
                        (void)broker_mem_free(bc, res->handle, w);
                        return reply_fail(r, ix, "cannot attach the memory's export");
                }
                ar.has_import_fd_index = true;
                ar.import_fd_index = ix;
        }
        ar.has_handle = ar.has_va = ar.has_size = ar.has_mem_fd_index = true;
        ar.handle = res->handle;
        ar.va = res->va;
        ar.size = res->size;
        ar.mem_fd_index = idx;
        ar.has_mem_fd_offset = idx >= 0;
        ar.mem_fd_offset = res->fd_offset;
        return reply_result(r, &ar);
}

/* Slow work of a request on a worker: the client's uid is its tenant, so that the workers' time is shared
 * fairly between uids however many connections one of them has (worker.h). */
static void req_submit(ReqCtx *r, WorkerJob *job)
{
        job->flow = r->c->ident.uid;
        worker_submit(r->m->workers, r->c->sh->home, job);
}

/*
 * Host memory the daemon populates itself: the populating runs on a worker, a slice per job, the rest on the
 * loop. Each slice is a job of its own, so another uid's job waits for one slice per worker at most, not for
 * a whole allocation (worker.h: flows take turns between jobs).
 */
#define POPULATE_SLICE (64ull << 20)

typedef struct AllocJob {
        WorkerJob job; /* first: the pool hands it back */
        Req *req;
        BrokerClient *bc;
        BrokerPending *pending;
        bool populated; /* every slice is in (or one failed) */
} AllocJob;

static void alloc_job_run(WorkerJob *j)
{
        AllocJob *aj = (AllocJob *)j;

        aj->populated = broker_pending_populate_step(aj->pending, POPULATE_SLICE);
}

static void alloc_job_done(WorkerJob *j)
{
        AllocJob *aj = (AllocJob *)j;
        Manager *m = req_ctx(aj->req)->m;
        BrokerAllocResult res = {.fd = -1, .import_fd = -1};
        Reason w = {""};
        int err;

        if (!aj->populated) {
                /* the next slice, in its flow's next turn */
                req_submit(req_ctx(aj->req), &aj->job);
                return;
        }
        manager_lock(m);
        err = broker_alloc_end(aj->pending, &res, &w);
        err = alloc_reply(req_ctx(aj->req), aj->bc, err, &res, &w);
        req_end(aj->req, err);
        manager_unlock(m);
        free(aj);
}

static int alloc_deferred(ReqCtx *r, BrokerClient *bc, const BrokerAllocArgs *args)
{
        AllocJob *aj = calloc(1, sizeof(*aj));
        BrokerAllocResult res = {.fd = -1, .import_fd = -1};
        Reason w = {""};
        int err;

        if (!aj)
                return reply_fail(r, -ENOMEM, "out of memory");
        err = broker_alloc_begin(bc, args, &aj->pending, &w);
        if (err < 0) {
                free(aj);
                return reply_fail_why(r, err, &w);
        }
        err = req_defer(r, &aj->req);
        if (err < 0) {
                /* no room to wait: make it here, on the loop, as without workers */
                broker_pending_populate(aj->pending);
                err = broker_alloc_end(aj->pending, &res, &w);
                free(aj);
                return alloc_reply(r, bc, err, &res, &w);
        }
        aj->bc = bc;
        aj->job.run = alloc_job_run;
        aj->job.done = alloc_job_done;
        req_submit(r, &aj->job);
        return REQ_DEFERRED;
}

int op_alloc(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__Alloc *a = req->alloc;
        BrokerAllocArgs args = {0};
        BrokerAllocResult res = {.fd = -1, .import_fd = -1};
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        if (a->n_map_gpus > BROKER_MAX_GPUS)
                return reply_fail(r, -E2BIG, "more than %d GPUs to map on", BROKER_MAX_GPUS);
        args.kind = (BrokerKind)a->kind;
        args.size = a->size;
        args.gpu_id = a->gpu_id;
        args.flags = a->flags;
        args.numa_node = a->has_numa_node ? a->numa_node : -1;
        args.alignment = a->alignment;
        args.fixed_va = a->fixed_va;
        args.map_gpus = a->map_gpus;
        args.n_map_gpus = a->n_map_gpus;
        if (a->kind != GPUMEM__MEM_KIND__MEM_KIND_DEVICE && a->kind != GPUMEM__MEM_KIND__MEM_KIND_HOST &&
            a->kind != GPUMEM__MEM_KIND__MEM_KIND_MANAGED)
                return reply_fail(r, -EINVAL, "alloc takes kind device, host or managed, not %d",
                                  (int)a->kind);
        {
                /* the op table cannot tell the kind before decoding: check the family here */
                unsigned fam = a->kind == GPUMEM__MEM_KIND__MEM_KIND_DEVICE ? POLICY_OP_DEVICE
                               : a->kind == GPUMEM__MEM_KIND__MEM_KIND_HOST ? POLICY_OP_HOST
                                                                            : POLICY_OP_MANAGED;
                ClassState *cs = r->c->cls;
                if (cs && (READ_ONCE(cs->deny_ops) & fam)) {
                        /* counted with the other denials where the request's -EACCES is seen */
                        return reply_fail(r, -EACCES, "class '%s' may not allocate %s memory", cs->name,
                                          fam == POLICY_OP_DEVICE ? "device"
                                          : fam == POLICY_OP_HOST ? "host"
                                                                  : "managed");
                }
        }
        if (r->m->workers && broker_alloc_is_slow(&args))
                return alloc_deferred(r, bc, &args);
        err = broker_alloc(bc, &args, &res, &w);
        return alloc_reply(r, bc, err, &res, &w);
}

/* An op on one object of the client's books named by @handle: @fn, answered Empty. */
static int call_handle(ReqCtx *r, uint64_t handle, int (*fn)(BrokerClient *bc, uint64_t handle, Reason *w))
{
        Reason w = {""};
        WITH_CLIENT(r, bc);

        return reply_empty_or_why(r, fn(bc, handle, &w), &w);
}

/* A free of much memory: the broker's books change on the loop, the memory is released on a worker, and
 * the reply (with the refunds of what nothing else holds) comes once it is gone. */
typedef struct FreeJob {
        WorkerJob job; /* first: the pool hands it back */
        Req *req;
        Broker *b;
        BrokerDrop *drops;
} FreeJob;

static void free_drops(BrokerDrop *d, bool run)
{
        while (d) {
                BrokerDrop *next = d->next;
                if (run)
                        broker_drop_run(d);
                free(d);
                d = next;
        }
}

static void free_job_run(WorkerJob *j)
{
        for (BrokerDrop *d = ((FreeJob *)j)->drops; d; d = d->next)
                broker_drop_run(d);
}

static void free_job_done(WorkerJob *j)
{
        FreeJob *fj = (FreeJob *)j;
        Manager *m = req_ctx(fj->req)->m;

        manager_lock(m);
        broker_process_events(fj->b);
        req_end(fj->req, reply_empty(req_ctx(fj->req)));
        manager_unlock(m);
        free_drops(fj->drops, false);
        free(fj);
}

int reply_after_drops(ReqCtx *r, int err, const Reason *w, BrokerDrop *drops)
{
        FreeJob *fj = NULL;

        if (drops && err >= 0 && r->m->workers && (fj = calloc(1, sizeof(*fj))) &&
            req_defer(r, &fj->req) == 0) {
                fj->b = r->m->broker;
                fj->drops = drops;
                fj->job.run = free_job_run;
                fj->job.done = free_job_done;
                req_submit(r, &fj->job);
                return REQ_DEFERRED;
        }
        /* no workers, or no room to wait: released here, on the loop */
        free(fj);
        if (drops) {
                free_drops(drops, true);
                broker_process_events(r->m->broker);
        }
        return reply_empty_or_why(r, err, w);
}

int op_free(ReqCtx *r, const Gpumem__Request *req)
{
        BrokerDrop *drops;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        broker_client_hold_drops(bc);
        err = broker_mem_free(bc, req->free->handle, &w);
        drops = broker_client_take_drops(bc);
        return reply_after_drops(r, err, &w, drops);
}

/* map, unmap: a buffer on some of the client's GPUs */
static int call_gpus(ReqCtx *r, uint64_t handle, const uint32_t *gpu_ids, size_t n,
                     int (*fn)(BrokerClient *bc, uint64_t handle, const uint32_t *gpu_ids, size_t n,
                               Reason *w))
{
        Reason w = {""};
        WITH_CLIENT(r, bc);

        if (n > BROKER_MAX_GPUS)
                return reply_fail(r, -E2BIG, "more than %d GPUs", BROKER_MAX_GPUS);
        return reply_empty_or_why(r, fn(bc, handle, gpu_ids, n, &w), &w);
}

int op_map(ReqCtx *r, const Gpumem__Request *req)
{
        return call_gpus(r, req->map->handle, req->map->gpu_ids, req->map->n_gpu_ids, broker_map);
}

int op_unmap(ReqCtx *r, const Gpumem__Request *req)
{
        return call_gpus(r, req->unmap->handle, req->unmap->gpu_ids, req->unmap->n_gpu_ids, broker_unmap);
}

/* ---- queries ------------------------------------------------------------------------------------------- */

static int pointer_info_answer(ReqCtx *r, uint64_t va)
{
        uint8_t buf[GM_REPLY_HEAD_MAX + GM_POINTER_INFO_MAX(BROKER_MAX_GPUS)];
        BrokerPtrInfo info;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_pointer_info(bc, va, &info, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        GmPointerInfoOut o = {.handle = info.handle,
                              .kind = (int32_t)info.kind,
                              .gpu_id = info.gpu_id,
                              .alloc_base = info.base,
                              .size = info.size,
                              .n_mapped_gpus = info.n_mapped,
                              .mapped_gpus = info.mapped,
                              .flags = info.flags,
                              .cpu_accessible = info.cpu_accessible};
        return reply_result_packed(r, buf, gm_pack_pointer_info(buf + GM_REPLY_HEAD_MAX, &o));
}

REQ_U64_HANDLERS(op_pointer_info, pointer_info, va, pointer_info_answer)

int op_mem_info(ReqCtx *r, const Gpumem__Request *req)
{
        BrokerGpuMem mem[BROKER_MAX_GPUS];
        Gpumem__GpuMemInfo g[BROKER_MAX_GPUS], *gp[BROKER_MAX_GPUS];
        size_t n = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_mem_info(bc, req->mem_info->gpu_id, mem, &n, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        for (size_t i = 0; i < n; i++) {
                /* no more than its topology files told it the GPU has (ops-query.c), whatever its class
                 * allows since: what a ROCm program sizes itself from agrees with AVAILABLE_MEMORY */
                int gi = r->c->vram_told ? broker_gpu_index(r->m->broker, mem[i].gpu_id) : -1;
                if (gi >= 0 && mem[i].total > r->c->vram_told[gi])
                        mem[i].total = r->c->vram_told[gi];
                if (gi >= 0 && mem[i].free > r->c->vram_told[gi])
                        mem[i].free = r->c->vram_told[gi];
                g[i] = (Gpumem__GpuMemInfo){MSG_INIT(gpumem__gpu_mem_info), OPT(gpu_id, mem[i].gpu_id),
                                            OPT(total, mem[i].total), OPT(free, mem[i].free),
                                            OPT(used, mem[i].used)};
                gp[i] = &g[i];
        }
        Gpumem__MemInfoReply mr = {MSG_INIT(gpumem__mem_info_reply), .n_gpus = n, .gpus = gp};
        return reply_result(r, &mr);
}

/* ---- VMM ----------------------------------------------------------------------------------------------- */

int op_vmm_reserve(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__VmmReserve *a = req->vmm_reserve;
        Gpumem__VmmReserveReply vr = GPUMEM__VMM_RESERVE_REPLY__INIT;
        uint64_t va = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        if (a->flags)
                return reply_fail(r, -EINVAL, "reservation flags 0x%llx are not defined",
                                  (unsigned long long)a->flags);
        err = broker_vmm_reserve(bc, a->size, a->alignment, a->fixed_va, &va, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        vr.has_va = true;
        vr.va = va;
        return reply_result(r, &vr);
}

/* vmm_free, vmm_unmap: a range of the client's reserved VA */
static int call_range(ReqCtx *r, uint64_t va, uint64_t size,
                      int (*fn)(BrokerClient *bc, uint64_t va, uint64_t size, Reason *w))
{
        Reason w = {""};
        WITH_CLIENT(r, bc);

        return reply_empty_or_why(r, fn(bc, va, size, &w), &w);
}

int op_vmm_free(ReqCtx *r, const Gpumem__Request *req)
{
        return call_range(r, req->vmm_free->va, req->vmm_free->size, broker_vmm_free);
}

int op_vmm_create(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__VmmCreate *a = req->vmm_create;
        Gpumem__VmmCreateReply cr = GPUMEM__VMM_CREATE_REPLY__INIT;
        uint64_t handle = 0;
        Reason w = {""};
        int err, fd = -1;
        WITH_CLIENT(r, bc);

        err = broker_vmm_create(bc, a->size, a->gpu_id, a->flags, &handle, &fd, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        if (fd >= 0) {
                int ix = reply_add_fd(r, fd);
                if (ix < 0) {
                        (void)broker_vmm_release(bc, handle, &w);
                        return reply_fail(r, ix, "cannot attach the handle's export");
                }
                cr.has_import_fd_index = true;
                cr.import_fd_index = ix;
        }
        cr.has_handle = true;
        cr.handle = handle;
        return reply_result(r, &cr);
}

int op_vmm_release(ReqCtx *r, const Gpumem__Request *req)
{
        return call_handle(r, req->vmm_release->handle, broker_vmm_release);
}

int op_vmm_map(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__VmmMap *a = req->vmm_map;
        Reason w = {""};
        WITH_CLIENT(r, bc);

        return reply_empty_or_why(r, broker_vmm_map(bc, a->va, a->size, a->offset, a->handle, &w), &w);
}

int op_vmm_unmap(ReqCtx *r, const Gpumem__Request *req)
{
        return call_range(r, req->vmm_unmap->va, req->vmm_unmap->size, broker_vmm_unmap);
}

int op_vmm_set_access(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__VmmSetAccess *a = req->vmm_set_access;
        Gpumem__VmmSetAccessReply sr = GPUMEM__VMM_SET_ACCESS_REPLY__INIT;
        BrokerAccess d[BROKER_MAX_GPUS + 1];
        BrokerCpuMap cpu[BROKER_MAX_CPU_MAPS];
        Gpumem__CpuMapping cm[BROKER_MAX_CPU_MAPS], *cmp[BROKER_MAX_CPU_MAPS];
        size_t n_cpu = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        if (a->n_desc > BROKER_MAX_GPUS + 1)
                return reply_fail(r, -E2BIG, "more than %d access descriptors", BROKER_MAX_GPUS + 1);
        for (size_t i = 0; i < a->n_desc; i++)
                d[i] = (BrokerAccess){a->desc[i]->gpu_id, (int)a->desc[i]->access};
        err = broker_vmm_set_access(bc, a->va, a->size, d, a->n_desc, cpu, &n_cpu, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        for (size_t i = 0; i < n_cpu; i++) {
                gpumem__cpu_mapping__init(&cm[i]);
                cm[i].has_va = cm[i].has_size = cm[i].has_fd_index = cm[i].has_fd_offset =
                        cm[i].has_writable = true;
                cm[i].va = cpu[i].va;
                cm[i].size = cpu[i].size;
                cm[i].fd_offset = cpu[i].offset;
                cm[i].writable = cpu[i].prot_write;
                cm[i].fd_index = reply_add_fd(r, cpu[i].fd);
                cmp[i] = &cm[i];
        }
        sr.n_cpu_maps = n_cpu;
        sr.cpu_maps = cmp;
        return reply_result(r, &sr);
}

int op_vmm_get_access(ReqCtx *r, const Gpumem__Request *req)
{
        Gpumem__VmmGetAccessReply gr = GPUMEM__VMM_GET_ACCESS_REPLY__INIT;
        int access = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_vmm_get_access(bc, req->vmm_get_access->va, req->vmm_get_access->gpu_id, &access, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        gr.has_access = true;
        gr.access = (Gpumem__Access)access;
        return reply_result(r, &gr);
}

int op_vmm_granularity(ReqCtx *r, const Gpumem__Request *req)
{
        Gpumem__VmmGranularityReply gr = GPUMEM__VMM_GRANULARITY_REPLY__INIT;
        if (broker_gpu_index(r->m->broker, req->vmm_granularity->gpu_id) < 0)
                return reply_fail(r, -ENODEV, "no GPU with id %u", req->vmm_granularity->gpu_id);
        gr.has_granularity = true;
        gr.granularity = broker_granularity(r->m->broker, req->vmm_granularity->recommended);
        return reply_result(r, &gr);
}

int op_vmm_retain(ReqCtx *r, const Gpumem__Request *req)
{
        uint64_t handle = 0;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_vmm_retain(bc, req->vmm_retain->va, &handle, &w);
        Gpumem__VmmRetainReply rr = {MSG_INIT(gpumem__vmm_retain_reply), OPT(handle, handle)};
        return reply_result_or_why(r, err, &w, &rr);
}

int op_vmm_properties(ReqCtx *r, const Gpumem__Request *req)
{
        BrokerProps p = {0};
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_vmm_properties(bc, req->vmm_properties->handle, &p, &w);
        Gpumem__VmmPropertiesReply pr = {MSG_INIT(gpumem__vmm_properties_reply),
                                         OPT(kind, (Gpumem__MemKind)p.kind), OPT(gpu_id, p.gpu_id),
                                         OPT(size, p.size), OPT(flags, p.flags)};
        return reply_result_or_why(r, err, &w, &pr);
}

/* ---- sharing ------------------------------------------------------------------------------------------- */

int op_dmabuf_export(ReqCtx *r, const Gpumem__Request *req)
{
        uint64_t size = 0;
        Reason w = {""};
        int err, fd = -1;
        WITH_CLIENT(r, bc);

        err = broker_export(bc, req->dmabuf_export->handle,
                            req->dmabuf_export->has_read_only && req->dmabuf_export->read_only, &fd, &size,
                            &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        Gpumem__DmabufExportReply er = {MSG_INIT(gpumem__dmabuf_export_reply),
                                        OPT(fd_index, reply_add_fd(r, fd)), OPT(size, size)};
        return reply_result(r, &er);
}

static const char *fd_kind(mode_t mode)
{
        switch (mode & S_IFMT) {
        case S_IFSOCK:
                return "a socket";
        case S_IFIFO:
                return "a pipe";
        case S_IFDIR:
                return "a directory";
        case S_IFCHR:
                return "a character device";
        case S_IFBLK:
                return "a block device";
        case S_IFLNK:
                return "a symbolic link";
        default:
                return NULL; /* a regular file (memfd) or an anonymous inode (a dmabuf) */
        }
}

int op_dmabuf_import(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__DmabufImport *a = req->dmabuf_import;
        uint64_t handle = 0, size = 0;
        struct stat st;
        const char *kind;
        Reason w = {""};
        int err, fd;
        WITH_CLIENT(r, bc);

        if (!a->has_fd_index)
                return reply_fail(r, -EBADF, "no fd index given");
        err = req_take_fd(r, a->fd_index, &fd);
        if (err < 0)
                return reply_fail(r, err, "fd index %d names no fd of this request", a->fd_index);
        /* checked before the driver sees it: only a memory file can be a dmabuf, but a driver whose clients
         * map memory themselves exports files of its device (CUDA: /dev/nvidiactl), which it knows again */
        if (fstat(fd, &st) < 0) {
                err = -errno;
                safe_close(fd);
                return reply_fail(r, err, "cannot inspect the fd");
        }
        kind = fd_kind(st.st_mode);
        if (kind && !(S_ISCHR(st.st_mode) && driver_has(r->m->drv, DRIVER_CAP_CLIENT_MAPS))) {
                safe_close(fd);
                return reply_fail(r, -EINVAL, "the fd is %s, not a dmabuf", kind);
        }
        err = broker_import(bc, fd, a->gpu_id, &handle, &size, &w);
        safe_close(fd); /* the driver holds its own reference to the buffer */
        if (err < 0)
                return reply_fail_why(r, err, &w);
        Gpumem__DmabufImportReply ir = {MSG_INIT(gpumem__dmabuf_import_reply), OPT(handle, handle),
                                        OPT(size, size)};
        return reply_result(r, &ir);
}

/* ---- managed memory ------------------------------------------------------------------------------------ */

/* The attributes as messages, or (since 3) packed as type << 32 | value: one way or the other. */
static int copy_attrs(ReqCtx *r, Gpumem__SvmAttr **in, size_t n, const uint64_t *packed, size_t n_packed,
                      BrokerSvmAttr *out, size_t *ret_n)
{
        if (n && n_packed)
                return reply_fail(r, -EINVAL, "attributes given both as messages and packed");
        if (n + n_packed > BROKER_SVM_MAX_ATTRS)
                return reply_fail(r, -E2BIG, "more than %d attributes", BROKER_SVM_MAX_ATTRS);
        for (size_t i = 0; i < n; i++)
                out[i] = (BrokerSvmAttr){in[i]->type, in[i]->value};
        for (size_t i = 0; i < n_packed; i++)
                out[i] = (BrokerSvmAttr){(uint32_t)(packed[i] >> 32), (uint32_t)packed[i]};
        *ret_n = n + n_packed;
        return 0;
}

static int svm_set_answer(ReqCtx *r, uint64_t va, uint64_t size, const BrokerSvmAttr *attrs, size_t n)
{
        uint8_t buf[GM_REPLY_HEAD_MAX]; /* an Empty */
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_svm_set(bc, va, size, attrs, n, &w);
        return err < 0 ? reply_fail_why(r, err, &w) : reply_result_packed(r, buf, 0);
}

int op_svm_set_attr(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__SvmSetAttr *a = req->svm_set_attr;
        BrokerSvmAttr attrs[BROKER_SVM_MAX_ATTRS];
        size_t n = 0;
        int err = copy_attrs(r, a->attrs, a->n_attrs, a->packed_attrs, a->n_packed_attrs, attrs, &n);

        return err < 0 ? err : svm_set_answer(r, a->va, a->size, attrs, n);
}

/* The attributes of an SVM call read in place: false for a form left to the general way (attributes as
 * messages, too many, anything malformed). */
static bool svm_call_in_place(const uint8_t *msg, size_t len, BrokerSvmAttr *attrs, GmSvmCallView *ret)
{
        uint64_t packed[BROKER_SVM_MAX_ATTRS];

        if (gm_svm_call_view(msg, len, packed, BROKER_SVM_MAX_ATTRS, ret) < 0 || ret->n_msgs)
                return false;
        for (size_t i = 0; i < ret->n; i++)
                attrs[i] = (BrokerSvmAttr){(uint32_t)(packed[i] >> 32), (uint32_t)packed[i]};
        return true;
}

int op_svm_set_attr_view(ReqCtx *r, const uint8_t *msg, size_t len)
{
        BrokerSvmAttr attrs[BROKER_SVM_MAX_ATTRS];
        GmSvmCallView v;

        if (!svm_call_in_place(msg, len, attrs, &v))
                return REQ_NOT_VIEWED;
        return svm_set_answer(r, v.va, v.size, attrs, v.n);
}

/* Answered the way it was asked: packed attributes for @packed (a call of protocol 3 on), else messages. */
static int svm_get_answer(ReqCtx *r, uint64_t va, uint64_t size, BrokerSvmAttr *attrs, size_t n, bool packed)
{
        Gpumem__SvmGetAttrReply gr = GPUMEM__SVM_GET_ATTR_REPLY__INIT;
        Gpumem__SvmAttr out[BROKER_SVM_MAX_ATTRS], *outp[BROKER_SVM_MAX_ATTRS];
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        err = broker_svm_get(bc, va, size, attrs, n, &w);
        if (err < 0)
                return reply_fail_why(r, err, &w);
        if (packed) {
                uint8_t buf[GM_REPLY_HEAD_MAX + 8 + 10 * BROKER_SVM_MAX_ATTRS + 8];
                uint64_t wire[BROKER_SVM_MAX_ATTRS];
                for (size_t i = 0; i < n; i++)
                        wire[i] = (uint64_t)attrs[i].type << 32 | attrs[i].value;
                return reply_result_packed(r, buf, gm_pb_put_packed(buf + GM_REPLY_HEAD_MAX, 2, wire, n));
        }
        for (size_t i = 0; i < n; i++) {
                out[i] = (Gpumem__SvmAttr){MSG_INIT(gpumem__svm_attr), OPT(type, attrs[i].type),
                                           OPT(value, attrs[i].value)};
                outp[i] = &out[i];
        }
        gr.n_attrs = n;
        gr.attrs = outp;
        return reply_result(r, &gr);
}

int op_svm_get_attr(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__SvmGetAttr *a = req->svm_get_attr;
        BrokerSvmAttr attrs[BROKER_SVM_MAX_ATTRS];
        size_t n = 0;
        int err = copy_attrs(r, a->attrs, a->n_attrs, a->packed_attrs, a->n_packed_attrs, attrs, &n);

        return err < 0 ? err : svm_get_answer(r, a->va, a->size, attrs, n, a->n_packed_attrs > 0);
}

int op_svm_get_attr_view(ReqCtx *r, const uint8_t *msg, size_t len)
{
        BrokerSvmAttr attrs[BROKER_SVM_MAX_ATTRS];
        GmSvmCallView v;

        if (!svm_call_in_place(msg, len, attrs, &v))
                return REQ_NOT_VIEWED;
        return svm_get_answer(r, v.va, v.size, attrs, v.n, v.n > 0);
}

/* A large prefetch: the driver's migration runs on a worker, the checks and the reply on the loop. */
typedef struct PrefetchJob {
        WorkerJob job; /* first: the pool hands it back */
        Req *req;
        BrokerPrefetch p;
} PrefetchJob;

static void prefetch_job_run(WorkerJob *j)
{
        broker_prefetch_run(&((PrefetchJob *)j)->p);
}

static void prefetch_job_done(WorkerJob *j)
{
        PrefetchJob *pj = (PrefetchJob *)j;
        ReqCtx *r = req_ctx(pj->req);
        Manager *m = r->m;
        Reason w = {""};
        int err;

        manager_lock(m);
        err = broker_prefetch_end(&pj->p, &w);
        req_end(pj->req, reply_empty_or_why(r, err, &w));
        manager_unlock(m);
        free(pj);
}

int op_svm_prefetch(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__SvmPrefetch *a = req->svm_prefetch;
        PrefetchJob *pj;
        Reason w = {""};
        int err;
        WITH_CLIENT(r, bc);

        if (!r->m->workers || !broker_prefetch_is_slow(bc, a->size)) {
                err = broker_svm_prefetch(bc, a->va, a->size, a->location, &w);
                return reply_empty_or_why(r, err, &w);
        }
        pj = calloc(1, sizeof(*pj));
        if (!pj)
                return reply_fail(r, -ENOMEM, "out of memory");
        err = broker_prefetch_begin(bc, a->va, a->size, a->location, &pj->p, &w);
        if (err >= 0 && req_defer(r, &pj->req) == 0) {
                pj->job.run = prefetch_job_run;
                pj->job.done = prefetch_job_done;
                req_submit(r, &pj->job);
                return REQ_DEFERRED;
        }
        if (err >= 0) {
                /* no room to wait: prefetch here, on the loop */
                broker_prefetch_run(&pj->p);
                err = broker_prefetch_end(&pj->p, &w);
        }
        free(pj);
        return reply_empty_or_why(r, err, &w);
}
