/* libgpumem_client memory API: allocations, VMM, sharing and managed-memory attributes through gpumemd. */
#include "client-private.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Refuse a call whose arguments are missing or out of range, saying which call (c may be NULL). */
struct MemEntry {
        gm_handle handle;
        uint64_t va, size;
        bool cpu_mapped;
        uint64_t cu_handle; /* backend cuda: this process's import of device memory, mapped at its image */
        bool cu_host;       /* backend cuda: host memory registered with CUDA here */
        bool freeing;       /* gm_mem_free() is taking it down; on c->freeing */
        MemEntry *next_freeing;
};

static uint64_t ptr_u64(const void *p)
{
        return (uint64_t)(uintptr_t)p;
}

/* Put this process's PROT_NONE window reservation back over a range it no longer maps. */
static void reserve_again(uint64_t va, uint64_t size)
{
        (void)mmap((void *)(uintptr_t)va, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

static int map_fd_at(uint64_t va, uint64_t size, int fd, uint64_t offset, bool writable)
{
        void *p = mmap((void *)(uintptr_t)va, size, PROT_READ | (writable ? PROT_WRITE : 0),
                       MAP_SHARED | MAP_FIXED, fd, (off_t)offset);
        return p == MAP_FAILED ? -errno : 0;
}

static bool in_window(const gm_client *c, uint64_t va, uint64_t size)
{
        return va >= c->window_base && size <= c->window_size && va - c->window_base <= c->window_size - size;
}

/*
 * Wait until no other thread is still taking down an allocation of this client's over [va, va + size).
 * The daemon may hand an address out again as soon as it has freed it, before the thread that freed it
 * has put the window's reservation back over its CPU mapping and forgotten it: a mapping made there in
 * the meantime would be lost, and the address found taken.
 */
static void wait_range_free(gm_client *c, uint64_t va, uint64_t size)
{
        pthread_mutex_lock(&c->mem_lock);
        for (;;) {
                const MemEntry *e = c->freeing;
                while (e && !(va < e->va + e->size && e->va < va + size))
                        e = e->next_freeing;
                if (!e)
                        break;
                pthread_cond_wait(&c->mem_cond, &c->mem_lock);
        }
        pthread_mutex_unlock(&c->mem_lock);
}

/* One request whose reply carries only a status. */
static int call_simple(gm_client *c, Gpumem__Request *req)
{
        Gpumem__Reply *reply = NULL;
        int r = gm_call(c, req, NULL, 0, &reply, NULL, NULL);
        if (r < 0)
                return r;
        gm_reply_free(c, reply);
        return 0;
}

/* Issue @req; on success check the result type and hand over the reply and its fds. */
static int call_result(gm_client *c, Gpumem__Request *req, Gpumem__Reply__ResultCase want,
                       Gpumem__Reply **ret, int *fds, size_t *n_fds)
{
        Gpumem__Reply *reply = NULL;
        size_t n = 0;
        int r = gm_call(c, req, NULL, 0, &reply, fds, fds ? &n : NULL);

        if (r < 0)
                return r;
        if (reply->result_case != want) {
                gm_wire_close_fds(fds, n);
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd replied with an unexpected result");
        }
        if (n_fds)
                *n_fds = n;
        *ret = reply;
        return 0;
}

/* ---- allocations ------------------------------------------------------------------------------------- */

/*
 * Backend cuda: device memory comes with its export, which this process imports and maps at the window's
 * image, for every GPU it was mapped on; host memory is registered with CUDA where it is mapped.
 */
static int cuda_map_new(gm_client *c, const gm_alloc_desc *d, const Gpumem__AllocReply *ar, const int *fds,
                        size_t n_fds, MemEntry *e)
{
        int access = (d->flags & GM_MEM_READ_ONLY) ? GM_ACCESS_READ : GM_ACCESS_READ_WRITE;
        const uint32_t *gpus = d->n_map_gpus ? d->map_gpus : &d->gpu_id;
        size_t n = d->n_map_gpus ? d->n_map_gpus : 1;
        int r;

        if (d->kind == GM_KIND_HOST) {
                r = gm_cuda_host_register(c, e->va, e->size);
                e->cu_host = r == 0;
                return r;
        }
        if (d->kind != GM_KIND_DEVICE)
                return 0;
        if (!ar->has_import_fd_index || ar->import_fd_index < 0 || (size_t)ar->import_fd_index >= n_fds)
                return gm_set_reason(c, -EPROTO, "gpumemd sent no export of the memory to map");
        r = gm_cuda_import(c, fds[ar->import_fd_index], d->gpu_id, &e->cu_handle);
        if (r < 0)
                return r;
        r = gm_cuda_map(c, e->va, e->size, 0, e->cu_handle);
        if (r < 0) {
                gm_cuda_release(c, e->cu_handle);
                e->cu_handle = 0;
                return r;
        }
        for (size_t i = 0; i < n && r == 0; i++)
                r = gm_cuda_access(c, e->va, e->size, gpus[i], access);
        if (r < 0) {
                (void)gm_cuda_unmap(c, e->va, e->size);
                gm_cuda_release(c, e->cu_handle);
                e->cu_handle = 0;
        }
        return r;
}

static void cuda_unmap_entry(gm_client *c, MemEntry *e)
{
        if (e->cu_handle) {
                (void)gm_cuda_unmap(c, e->va, e->size);
                gm_cuda_release(c, e->cu_handle);
                e->cu_handle = 0;
        }
        if (e->cu_host) {
                gm_cuda_host_unregister(c, e->va);
                e->cu_host = false;
        }
}

int gm_malloc_desc(gm_client *c, const gm_alloc_desc *d, void **ret_ptr)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        Gpumem__Reply *reply = NULL;
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        MemEntry *e;
        uint64_t va, size;
        int r;

        if (!c || !d || !ret_ptr)
                return BAD_ARGS(c);
        if (d->n_map_gpus > 64)
                return gm_set_reason(c, -E2BIG, "more than 64 GPUs to map on");
        a.has_kind = a.has_size = a.has_gpu_id = a.has_flags = a.has_numa_node = true;
        a.kind = (Gpumem__MemKind)d->kind;
        a.size = d->size;
        a.gpu_id = d->gpu_id;
        a.flags = d->flags;
        a.numa_node = d->numa_node;
        a.has_alignment = a.has_fixed_va = true;
        a.alignment = d->alignment;
        a.fixed_va = c->cuda ? gm_cuda_va(c, ptr_u64(d->fixed_addr)) : ptr_u64(d->fixed_addr);
        a.n_map_gpus = d->n_map_gpus;
        a.map_gpus = (uint32_t *)d->map_gpus;
        req.op_case = GPUMEM__REQUEST__OP_ALLOC;
        req.alloc = &a;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_ALLOC, &reply, fds, &n_fds);
        if (r < 0)
                return r;

        va = reply->alloc->va;
        size = reply->alloc->size;
        e = calloc(1, sizeof(*e));
        if (e) {
                e->handle = reply->alloc->handle;
                e->va = va;
                e->size = size;
        }
        /* an SVM range's memory lies where the process has the range, which may be outside the window */
        if (!e || (!in_window(c, va, size) &&
                   !((d->flags & GM_MEM_SVM_RANGE) && va == ptr_u64(d->fixed_addr) && size >= d->size))) {
                r = gm_set_reason(c, e ? -EPROTO : -ENOMEM,
                                  e ? "gpumemd placed memory outside the window" : "out of memory");
                goto undo;
        }
        wait_range_free(c, va, size);
        if (reply->alloc->mem_fd_index >= 0) {
                if ((size_t)reply->alloc->mem_fd_index >= n_fds) {
                        r = gm_set_reason(c, -EPROTO, "gpumemd named a memory fd it did not send");
                        goto undo;
                }
                r = map_fd_at(va, size, fds[reply->alloc->mem_fd_index], reply->alloc->mem_fd_offset,
                              !(d->flags & GM_MEM_READ_ONLY));
                if (r < 0) {
                        gm_set_reason(c, r, "cannot map the memory at 0x%llx: %s", (unsigned long long)va,
                                      strerror(-r));
                        goto undo;
                }
                e->cpu_mapped = true;
        }
        if (c->cuda) {
                r = cuda_map_new(c, d, reply->alloc, fds, n_fds, e);
                if (r < 0)
                        goto undo;
        }
        gm_wire_close_fds(fds, n_fds); /* mapped: the pages stay, the fds need not */
        pthread_mutex_lock(&c->mem_lock);
        r = hashmap_put(&c->allocs, va, e);
        pthread_mutex_unlock(&c->mem_lock);
        if (r < 0) {
                gm_set_reason(c, r, "cannot record the allocation");
                cuda_unmap_entry(c, e);
                if (e->cpu_mapped)
                        reserve_again(va, size);
                goto undo_daemon;
        }
        gm_reply_free(c, reply);
        /* backend cuda: device memory is seen at the window's image, host memory at its own address */
        *ret_ptr = (void *)(uintptr_t)(c->cuda && d->kind == GM_KIND_DEVICE ? gm_cuda_ptr(c, va) : va);
        return 0;

undo:
        gm_wire_close_fds(fds, n_fds);
undo_daemon : {
        /* give the memory back; the reason recorded above stays unless this fails too */
        Gpumem__Request freq = GPUMEM__REQUEST__INIT;
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.has_handle = true;
        f.handle = reply->alloc->handle;
        freq.op_case = GPUMEM__REQUEST__OP_FREE;
        freq.free = &f;
        (void)call_simple(c, &freq);
}
        free(e);
        gm_reply_free(c, reply);
        return r;
}

int gm_malloc(gm_client *c, size_t size, uint32_t gpu_id, unsigned flags, void **ret_ptr)
{
        gm_alloc_desc d = {
                .kind = GM_KIND_DEVICE, .size = size, .gpu_id = gpu_id, .flags = flags, .numa_node = -1};
        return gm_malloc_desc(c, &d, ret_ptr);
}

int gm_host_malloc(gm_client *c, size_t size, uint32_t gpu_id, int numa_node, unsigned flags, void **ret_ptr)
{
        gm_alloc_desc d = {
                .kind = GM_KIND_HOST, .size = size, .gpu_id = gpu_id, .flags = flags, .numa_node = numa_node};
        return gm_malloc_desc(c, &d, ret_ptr);
}

int gm_malloc_managed(gm_client *c, size_t size, unsigned flags, void **ret_ptr)
{
        gm_alloc_desc d = {.kind = GM_KIND_MANAGED, .size = size, .flags = flags, .numa_node = -1};
        return gm_malloc_desc(c, &d, ret_ptr);
}

static MemEntry *entry_of(gm_client *c, const void *ptr)
{
        MemEntry *e;

        pthread_mutex_lock(&c->mem_lock);
        e = hashmap_get(&c->allocs, gm_cuda_va(c, ptr_u64(ptr)));
        pthread_mutex_unlock(&c->mem_lock);
        return e;
}

int gm_mem_free(gm_client *c, void *ptr)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Free f = GPUMEM__FREE__INIT;
        MemEntry *e;
        bool busy;
        int r;

        if (!c)
                return BAD_ARGS(c);
        if (!ptr)
                return 0; /* like free(NULL) and hipFree(nullptr) */
        pthread_mutex_lock(&c->mem_lock);
        e = hashmap_get(&c->allocs, gm_cuda_va(c, ptr_u64(ptr)));
        busy = e && e->freeing;
        if (e && !busy) {
                e->freeing = true;
                e->next_freeing = c->freeing;
                c->freeing = e;
        }
        pthread_mutex_unlock(&c->mem_lock);
        if (!e)
                return gm_set_reason(c, -EINVAL,
                                     "%p was not returned by gm_malloc, gm_host_malloc or "
                                     "gm_malloc_managed",
                                     ptr);
        if (busy)
                return gm_set_reason(c, -EINVAL, "%p is being freed by another thread", ptr);
        f.has_handle = true;
        f.handle = e->handle;
        req.op_case = GPUMEM__REQUEST__OP_FREE;
        req.free = &f;
        /* this process's CUDA mapping goes first: it alone would keep the memory alive after the free (should
         * the daemon refuse the free, the pointer is unmapped here all the same) */
        cuda_unmap_entry(c, e);
        r = call_simple(c, &req);
        /* After the free: the pages then go in this process, as it drops the last mapping, not on the
         * daemon's event loop. The daemon keeps the memory charged until then and refunds it when the
         * kernel reports the file gone, a moment after this returns. */
        if (r == 0 && e->cpu_mapped) {
                if (in_window(c, e->va, e->size))
                        reserve_again(e->va, e->size);
                else /* an SVM range's memory: the address is the process's again */
                        (void)munmap((void *)(uintptr_t)e->va, e->size);
        }
        pthread_mutex_lock(&c->mem_lock);
        for (MemEntry **pp = &c->freeing; *pp; pp = &(*pp)->next_freeing) {
                if (*pp == e) {
                        *pp = e->next_freeing;
                        break;
                }
        }
        e->freeing = false;
        if (r == 0)
                (void)hashmap_remove(&c->allocs, e->va);
        pthread_cond_broadcast(&c->mem_cond);
        pthread_mutex_unlock(&c->mem_lock);
        if (r < 0)
                return r;
        free(e);
        return 0;
}

static int map_op(gm_client *c, void *ptr, const uint32_t *gpu_ids, size_t n, bool map)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__MapToGpus m = GPUMEM__MAP_TO_GPUS__INIT;
        Gpumem__UnmapFromGpus u = GPUMEM__UNMAP_FROM_GPUS__INIT;
        MemEntry *e;
        int r;

        if (!c || (n && !gpu_ids))
                return BAD_ARGS(c);
        e = entry_of(c, ptr);
        if (!e)
                return gm_set_reason(c, -EINVAL, "%p was not returned by gm_malloc or gm_host_malloc", ptr);
        if (map) {
                m.has_handle = true;
                m.handle = e->handle;
                m.n_gpu_ids = n;
                m.gpu_ids = (uint32_t *)gpu_ids;
                req.op_case = GPUMEM__REQUEST__OP_MAP;
                req.map = &m;
        } else {
                u.has_handle = true;
                u.handle = e->handle;
                u.n_gpu_ids = n;
                u.gpu_ids = (uint32_t *)gpu_ids;
                req.op_case = GPUMEM__REQUEST__OP_UNMAP;
                req.unmap = &u;
        }
        r = call_simple(c, &req);
        /* backend cuda: the access the daemon allowed is set here, in this process's context */
        for (size_t i = 0; r == 0 && e->cu_handle && i < n; i++)
                r = gm_cuda_access(c, e->va, e->size, gpu_ids[i],
                                   map ? GM_ACCESS_READ_WRITE : GM_ACCESS_NONE);
        return r;
}

int gm_mem_map_gpus(gm_client *c, void *ptr, const uint32_t *gpu_ids, size_t n)
{
        return map_op(c, ptr, gpu_ids, n, true);
}

int gm_mem_unmap_gpus(gm_client *c, void *ptr, const uint32_t *gpu_ids, size_t n)
{
        return map_op(c, ptr, gpu_ids, n, false);
}

/* ---- queries ----------------------------------------------------------------------------------------- */

int gm_mem_get_info(gm_client *c, uint32_t gpu_id, size_t *ret_free, size_t *ret_total)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__MemInfoGet g = GPUMEM__MEM_INFO_GET__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !gpu_id)
                return BAD_ARGS(c);
        g.has_gpu_id = true;
        g.gpu_id = gpu_id;
        req.op_case = GPUMEM__REQUEST__OP_MEM_INFO;
        req.mem_info = &g;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_MEM_INFO, &reply, NULL, NULL);
        if (r < 0)
                return r;
        if (reply->mem_info->n_gpus != 1) {
                size_t n = reply->mem_info->n_gpus;
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd answered for %zu GPUs", n);
        }
        if (ret_free)
                *ret_free = reply->mem_info->gpus[0]->free;
        if (ret_total)
                *ret_total = reply->mem_info->gpus[0]->total;
        gm_reply_free(c, reply);
        return 0;
}

static int pointer_view(gm_client *c, void *ctx, const uint8_t *p, size_t len)
{
        gm_pointer_attributes *a = ctx;
        GmPointerInfoView v;

        if (gm_pointer_info_view(p, len, &v) < 0)
                return gm_set_reason(c, -EPROTO, "undecodable pointer information from gpumemd");
        a->handle = v.handle;
        a->kind = v.kind;
        a->gpu_id = v.gpu_id;
        a->base = (void *)(uintptr_t)(a->kind == GM_KIND_HOST ? v.alloc_base : gm_cuda_ptr(c, v.alloc_base));
        a->size = v.size;
        a->flags = v.flags;
        a->cpu_accessible = v.cpu_accessible;
        a->n_mapped_gpus = v.n_mapped_gpus < 64 ? (uint32_t)v.n_mapped_gpus : 64;
        memcpy(a->mapped_gpus, v.mapped_gpus, a->n_mapped_gpus * sizeof(uint32_t));
        /* the GPUs beyond those mapped read as 0 */
        memset(a->mapped_gpus + a->n_mapped_gpus, 0, (64 - a->n_mapped_gpus) * sizeof(uint32_t));
        return 0;
}

int gm_pointer_get_attributes(gm_client *c, const void *ptr, gm_pointer_attributes *ret)
{
        gm_pointer_attributes a, *into;
        uint8_t body[24];
        size_t n;
        int r;

        if (!c || !ret || ret->struct_size == 0)
                return BAD_ARGS(c);
        n = gm_pb_put_uint_pad(body, 1, gm_cuda_va(c, ptr_u64(ptr)));
        /* A caller's struct of this size or larger is written in place, and only once the reply is read
         * whole (pointer_view writes nothing before); a shorter one gets the prefix it has room for. */
        into = ret->struct_size >= sizeof(a) ? ret : &a;
        r = gm_call_view(c, GPUMEM__REQUEST__OP_POINTER_INFO, body, n, GPUMEM__REPLY__RESULT_POINTER_INFO,
                         pointer_view, into);
        if (r < 0)
                return r;
        if (into == &a) {
                a.struct_size = ret->struct_size;
                memcpy(ret, &a, a.struct_size);
        } else {
                ret->struct_size = sizeof(a); /* what was written, for a caller built with a larger one */
        }
        return 0;
}

/* ---- managed memory ---------------------------------------------------------------------------------- */

/* @n attributes as messages in @buf, each pointed to from @ptrs, on the caller's stack, for a daemon older
 * than protocol 3 (a newer one takes them packed: svm_call_body). */
static void attrs_to_msgs(const gm_svm_attr *attrs, size_t n, Gpumem__SvmAttr *buf, Gpumem__SvmAttr **ptrs)
{
        for (size_t i = 0; i < n; i++) {
                gpumem__svm_attr__init(&buf[i]);
                buf[i].has_type = buf[i].has_value = true;
                buf[i].type = attrs[i].type;
                buf[i].value = attrs[i].value;
                ptrs[i] = &buf[i];
        }
}

#define GM_SVM_MAX_ATTRS 32
/* Two varint fields, a packed one's head and its varints, and the last padded write's spill. */
#define SVM_BODY_MAX (2 * 11 + 8 + 10 * GM_SVM_MAX_ATTRS + 8)

/* An SVM call of protocol 3 or later packed by hand into @body (room for SVM_BODY_MAX): va, size and the
 * attributes as one packed field (SvmSetAttr and SvmGetAttr share the form). Its size. */
static size_t svm_call_body(uint8_t *body, const void *ptr, size_t size, const gm_svm_attr *attrs, size_t n)
{
        uint64_t packed[GM_SVM_MAX_ATTRS];
        size_t len = 0;

        for (size_t i = 0; i < n; i++)
                packed[i] = (uint64_t)attrs[i].type << 32 | attrs[i].value;
        len += gm_pb_put_uint_pad(body + len, 1, ptr_u64(ptr));
        len += gm_pb_put_uint_pad(body + len, 2, size);
        len += gm_pb_put_packed(body + len, 4, packed, n);
        return len;
}

static int empty_view(gm_client *c, void *ctx, const uint8_t *p, size_t len)
{
        (void)ctx;
        return gm_empty_view(p, len) < 0 ? gm_set_reason(c, -EPROTO, "undecodable reply from gpumemd") : 0;
}

int gm_svm_set_attributes(gm_client *c, const void *ptr, size_t size, const gm_svm_attr *attrs, size_t n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__SvmSetAttr s = GPUMEM__SVM_SET_ATTR__INIT;
        Gpumem__SvmAttr buf[GM_SVM_MAX_ATTRS], *ptrs[GM_SVM_MAX_ATTRS];

        if (!c || (n && !attrs))
                return BAD_ARGS(c);
        if (n > GM_SVM_MAX_ATTRS)
                return gm_set_reason(c, -E2BIG, "more than %d attributes", GM_SVM_MAX_ATTRS);
        if (c->protocol_version >= 3) {
                uint8_t body[SVM_BODY_MAX];
                size_t len = svm_call_body(body, ptr, size, attrs, n);
                return gm_call_view(c, GPUMEM__REQUEST__OP_SVM_SET_ATTR, body, len,
                                    GPUMEM__REPLY__RESULT_EMPTY, empty_view, NULL);
        }
        s.has_va = s.has_size = true;
        s.va = ptr_u64(ptr);
        s.size = size;
        attrs_to_msgs(attrs, n, buf, ptrs);
        s.attrs = ptrs;
        s.n_attrs = n;
        req.op_case = GPUMEM__REQUEST__OP_SVM_SET_ATTR;
        req.svm_set_attr = &s;
        return call_simple(c, &req);
}

typedef struct SvmGetCtx {
        gm_svm_attr *attrs;
        size_t n;
} SvmGetCtx;

static int svm_get_view(gm_client *c, void *ctx, const uint8_t *p, size_t len)
{
        const SvmGetCtx *g = ctx;
        uint64_t packed[GM_SVM_MAX_ATTRS];
        size_t got = 0, n_msgs = 0;
        int r = gm_svm_attrs_view(p, len, packed, GM_SVM_MAX_ATTRS, &got, &n_msgs);

        if (r == -E2BIG)
                return gm_set_reason(c, -EPROTO, "gpumemd answered more than %d attributes for %zu",
                                     GM_SVM_MAX_ATTRS, g->n);
        if (r < 0)
                return gm_set_reason(c, -EPROTO, "undecodable SVM attributes from gpumemd");
        if (got != g->n || n_msgs) /* a packed request has a packed answer */
                return gm_set_reason(c, -EPROTO, "gpumemd answered %zu attributes for %zu", got + n_msgs,
                                     g->n);
        for (size_t i = 0; i < got; i++)
                g->attrs[i] = (gm_svm_attr){(uint32_t)(packed[i] >> 32), (uint32_t)packed[i]};
        return 0;
}

int gm_svm_get_attributes(gm_client *c, const void *ptr, size_t size, gm_svm_attr *attrs, size_t n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__SvmGetAttr g = GPUMEM__SVM_GET_ATTR__INIT;
        Gpumem__SvmAttr buf[GM_SVM_MAX_ATTRS], *ptrs[GM_SVM_MAX_ATTRS];
        const Gpumem__SvmGetAttrReply *gr;
        Gpumem__Reply *reply = NULL;
        size_t got;
        int r;

        if (!c || (n && !attrs))
                return BAD_ARGS(c);
        if (n > GM_SVM_MAX_ATTRS)
                return gm_set_reason(c, -E2BIG, "more than %d attributes", GM_SVM_MAX_ATTRS);
        if (c->protocol_version >= 3) {
                uint8_t body[SVM_BODY_MAX];
                size_t len = svm_call_body(body, ptr, size, attrs, n);
                SvmGetCtx ctx = {attrs, n};
                return gm_call_view(c, GPUMEM__REQUEST__OP_SVM_GET_ATTR, body, len,
                                    GPUMEM__REPLY__RESULT_SVM_GET_ATTR, svm_get_view, &ctx);
        }
        /* an older daemon: the attributes as messages, protobuf-c's way */
        g.has_va = g.has_size = true;
        g.va = ptr_u64(ptr);
        g.size = size;
        attrs_to_msgs(attrs, n, buf, ptrs);
        g.attrs = ptrs;
        g.n_attrs = n;
        req.op_case = GPUMEM__REQUEST__OP_SVM_GET_ATTR;
        req.svm_get_attr = &g;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_SVM_GET_ATTR, &reply, NULL, NULL);
        if (r < 0)
                return r;
        gr = reply->svm_get_attr;
        got = gr->n_attrs + gr->n_packed_attrs;
        if (got != n || (gr->n_attrs && gr->n_packed_attrs)) {
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd answered %zu attributes for %zu", got, n);
        }
        for (size_t i = 0; i < gr->n_attrs; i++)
                attrs[i] = (gm_svm_attr){gr->attrs[i]->type, gr->attrs[i]->value};
        for (size_t i = 0; i < gr->n_packed_attrs; i++)
                attrs[i] =
                        (gm_svm_attr){(uint32_t)(gr->packed_attrs[i] >> 32), (uint32_t)gr->packed_attrs[i]};
        gm_reply_free(c, reply);
        return 0;
}

/*
 * hipMemAdvise as ROCm's HIP runtime and ROCr turn it into KFD SVM attributes: read-mostly is a flag,
 * preferred location an attribute (undefined when unset), "accessed by" maps in place on that GPU and
 * its removal leaves the GPU merely allowed to access, coarse grain clears the coherent flag.
 */
int gm_mem_advise(gm_client *c, const void *ptr, size_t size, int advice, uint32_t location)
{
        gm_svm_attr a;

        if (!c)
                return BAD_ARGS(c);
        switch (advice) {
        case GM_ADVISE_SET_READ_MOSTLY:
                a = (gm_svm_attr){GM_SVM_ATTR_SET_FLAGS, GM_SVM_FLAG_GPU_READ_MOSTLY};
                break;
        case GM_ADVISE_UNSET_READ_MOSTLY:
                a = (gm_svm_attr){GM_SVM_ATTR_CLR_FLAGS, GM_SVM_FLAG_GPU_READ_MOSTLY};
                break;
        case GM_ADVISE_SET_PREFERRED_LOCATION:
                a = (gm_svm_attr){GM_SVM_ATTR_PREFERRED_LOC, location};
                break;
        case GM_ADVISE_UNSET_PREFERRED_LOCATION:
                a = (gm_svm_attr){GM_SVM_ATTR_PREFERRED_LOC, GM_SVM_LOCATION_UNDEFINED};
                break;
        case GM_ADVISE_SET_ACCESSED_BY:
        case GM_ADVISE_UNSET_ACCESSED_BY:
                if (location == GM_LOCATION_CPU) {
                        /* the CPU always reaches managed memory: nothing for the GPU driver to change, but
                         * the range must still be managed memory of this client */
                        gm_svm_attr q = {GM_SVM_ATTR_GRANULARITY, 0};
                        return gm_svm_get_attributes(c, ptr, size, &q, 1);
                }
                a = (gm_svm_attr){advice == GM_ADVISE_SET_ACCESSED_BY ? GM_SVM_ATTR_ACCESS_IN_PLACE
                                                                      : GM_SVM_ATTR_ACCESS,
                                  location};
                break;
        case GM_ADVISE_SET_COARSE_GRAIN:
                a = (gm_svm_attr){GM_SVM_ATTR_CLR_FLAGS, GM_SVM_FLAG_COHERENT};
                break;
        case GM_ADVISE_UNSET_COARSE_GRAIN:
                a = (gm_svm_attr){GM_SVM_ATTR_SET_FLAGS, GM_SVM_FLAG_COHERENT};
                break;
        default:
                return gm_set_reason(c, -EINVAL, "unknown advice %d", advice);
        }
        return gm_svm_set_attributes(c, ptr, size, &a, 1);
}

int gm_mem_prefetch(gm_client *c, const void *ptr, size_t size, uint32_t location)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__SvmPrefetch p = GPUMEM__SVM_PREFETCH__INIT;

        if (!c)
                return BAD_ARGS(c);
        p.has_va = p.has_size = p.has_location = true;
        p.va = ptr_u64(ptr);
        p.size = size;
        p.location = location;
        req.op_case = GPUMEM__REQUEST__OP_SVM_PREFETCH;
        req.svm_prefetch = &p;
        return call_simple(c, &req);
}

/* ---- VMM --------------------------------------------------------------------------------------------- */

/*
 * Backend cuda: import @fd (the export of the daemon's @handle; -1: the daemon sent none) into this
 * process's context, for gm_mem_map to map. On failure the daemon's handle is released too: the caller
 * is left holding nothing.
 */
static int cuda_take_handle(gm_client *c, gm_handle handle, int fd, uint32_t gpu_id)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmRelease rel = GPUMEM__VMM_RELEASE__INIT;
        uint64_t cu = 0;
        int r;

        r = fd >= 0 ? gm_cuda_import(c, fd, gpu_id, &cu)
                    : gm_set_reason(c, -EPROTO, "gpumemd sent no export of the handle to map");
        if (r == 0 && (r = gm_cuda_handle_put(c, handle, cu)) < 0)
                gm_cuda_release(c, cu);
        if (r < 0) {
                rel.has_handle = true;
                rel.handle = handle;
                req.op_case = GPUMEM__REQUEST__OP_VMM_RELEASE;
                req.vmm_release = &rel;
                (void)call_simple(c, &req);
        }
        return r;
}

int gm_mem_address_reserve(gm_client *c, size_t size, size_t alignment, void *addr, unsigned long long flags,
                           void **ret_ptr)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmReserve v = GPUMEM__VMM_RESERVE__INIT;
        Gpumem__Reply *reply = NULL;
        uint64_t va;
        int r;

        if (!c || !ret_ptr)
                return BAD_ARGS(c);
        v.has_size = v.has_alignment = v.has_fixed_va = v.has_flags = true;
        v.size = size;
        v.alignment = alignment;
        v.fixed_va = gm_cuda_va(c, ptr_u64(addr));
        v.flags = flags;
        req.op_case = GPUMEM__REQUEST__OP_VMM_RESERVE;
        req.vmm_reserve = &v;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_RESERVE, &reply, NULL, NULL);
        if (r < 0)
                return r;
        va = reply->vmm_reserve->va;
        gm_reply_free(c, reply);
        /* the caller maps into the range next: not while a free over it is still in progress */
        wait_range_free(c, va, size);
        *ret_ptr = (void *)(uintptr_t)gm_cuda_ptr(c, va);
        return 0;
}

int gm_mem_address_free(gm_client *c, void *ptr, size_t size)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmFree v = GPUMEM__VMM_FREE__INIT;

        if (!c)
                return BAD_ARGS(c);
        v.has_va = v.has_size = true;
        v.va = gm_cuda_va(c, ptr_u64(ptr));
        v.size = size;
        req.op_case = GPUMEM__REQUEST__OP_VMM_FREE;
        req.vmm_free = &v;
        return call_simple(c, &req);
}

int gm_mem_create(gm_client *c, size_t size, uint32_t gpu_id, unsigned flags, gm_handle *ret_handle)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmCreate v = GPUMEM__VMM_CREATE__INIT;
        Gpumem__Reply *reply = NULL;
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        int r = 0;

        if (!c || !ret_handle)
                return BAD_ARGS(c);
        v.has_size = v.has_gpu_id = v.has_flags = true;
        v.size = size;
        v.gpu_id = gpu_id;
        v.flags = flags;
        req.op_case = GPUMEM__REQUEST__OP_VMM_CREATE;
        req.vmm_create = &v;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_CREATE, &reply, fds, &n_fds);
        if (r < 0)
                return r;
        /* backend cuda: this process imports the handle's export, to map it where gm_mem_map says */
        if (c->cuda) {
                int ix = reply->vmm_create->has_import_fd_index ? reply->vmm_create->import_fd_index : -1;
                r = cuda_take_handle(c, reply->vmm_create->handle,
                                     ix >= 0 && (size_t)ix < n_fds ? fds[ix] : -1, gpu_id);
        }
        gm_wire_close_fds(fds, n_fds);
        if (r < 0) {
                gm_reply_free(c, reply);
                return r;
        }
        *ret_handle = reply->vmm_create->handle;
        gm_reply_free(c, reply);
        return 0;
}

int gm_mem_release(gm_client *c, gm_handle handle)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmRelease v = GPUMEM__VMM_RELEASE__INIT;
        int r;

        if (!c)
                return BAD_ARGS(c);
        v.has_handle = true;
        v.handle = handle;
        req.op_case = GPUMEM__REQUEST__OP_VMM_RELEASE;
        req.vmm_release = &v;
        r = call_simple(c, &req);
        /* CUDA keeps the memory while it is mapped here, as the daemon keeps it while mapped there */
        if (r == 0 && c->cuda)
                gm_cuda_release(c, gm_cuda_handle_take(c, handle));
        return r;
}

int gm_mem_map(gm_client *c, void *ptr, size_t size, size_t offset, gm_handle handle)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmMap v = GPUMEM__VMM_MAP__INIT;
        int r;

        if (!c)
                return BAD_ARGS(c);
        v.has_va = v.has_size = v.has_offset = v.has_handle = true;
        v.va = gm_cuda_va(c, ptr_u64(ptr));
        v.size = size;
        v.offset = offset;
        v.handle = handle;
        req.op_case = GPUMEM__REQUEST__OP_VMM_MAP;
        req.vmm_map = &v;
        r = call_simple(c, &req);
        if (r == 0 && c->cuda) {
                uint64_t cu = gm_cuda_handle_get(c, handle);
                r = cu ? gm_cuda_map(c, v.va, size, offset, cu)
                       : gm_set_reason(c, -ENOENT, "handle 0x%llx has no CUDA import in this process",
                                       (unsigned long long)handle);
                if (r < 0) {
                        /* the daemon's mapping goes too: the caller sees nothing mapped */
                        Gpumem__Request ureq = GPUMEM__REQUEST__INIT;
                        Gpumem__VmmUnmap u = GPUMEM__VMM_UNMAP__INIT;
                        u.has_va = u.has_size = true;
                        u.va = v.va;
                        u.size = size;
                        ureq.op_case = GPUMEM__REQUEST__OP_VMM_UNMAP;
                        ureq.vmm_unmap = &u;
                        (void)call_simple(c, &ureq);
                }
        }
        return r;
}

int gm_mem_unmap(gm_client *c, void *ptr, size_t size)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmUnmap v = GPUMEM__VMM_UNMAP__INIT;
        int r;

        if (!c)
                return BAD_ARGS(c);
        v.has_va = v.has_size = true;
        v.va = gm_cuda_va(c, ptr_u64(ptr));
        v.size = size;
        req.op_case = GPUMEM__REQUEST__OP_VMM_UNMAP;
        req.vmm_unmap = &v;
        /* backend cuda: this process's mappings first, as gm_mem_free does */
        if (c->cuda && (r = gm_cuda_unmap(c, v.va, size)) < 0)
                return r;
        r = call_simple(c, &req);
        /* whatever the CPU saw there is gone: keep the window reserved */
        if (r == 0 && in_window(c, v.va, v.size))
                reserve_again(v.va, v.size);
        return r;
}

int gm_mem_set_access(gm_client *c, void *ptr, size_t size, const gm_access_desc *desc, size_t n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmSetAccess v = GPUMEM__VMM_SET_ACCESS__INIT;
        Gpumem__AccessDesc d[65], *dp[65];
        Gpumem__Reply *reply = NULL;
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        bool cpu_none = false;
        int r = 0;

        if (!c || !desc || n == 0)
                return BAD_ARGS(c);
        if (n > 65)
                return gm_set_reason(c, -E2BIG, "more than 65 access descriptors");
        for (size_t i = 0; i < n; i++) {
                gpumem__access_desc__init(&d[i]);
                d[i].has_gpu_id = d[i].has_access = true;
                d[i].gpu_id = desc[i].gpu_id;
                d[i].access = (Gpumem__Access)desc[i].access;
                dp[i] = &d[i];
                if (desc[i].gpu_id == GM_LOCATION_CPU && desc[i].access == GM_ACCESS_NONE)
                        cpu_none = true;
        }
        v.has_va = v.has_size = true;
        v.va = gm_cuda_va(c, ptr_u64(ptr));
        v.size = size;
        v.n_desc = n;
        v.desc = dp;
        req.op_case = GPUMEM__REQUEST__OP_VMM_SET_ACCESS;
        req.vmm_set_access = &v;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_SET_ACCESS, &reply, fds, &n_fds);
        if (r < 0)
                return r;
        for (size_t i = 0; i < reply->vmm_set_access->n_cpu_maps && r == 0; i++) {
                const Gpumem__CpuMapping *m = reply->vmm_set_access->cpu_maps[i];
                if (m->fd_index < 0 || (size_t)m->fd_index >= n_fds || !in_window(c, m->va, m->size)) {
                        r = gm_set_reason(c, -EPROTO, "gpumemd sent an unusable CPU mapping");
                        break;
                }
                r = map_fd_at(m->va, m->size, fds[m->fd_index], m->fd_offset, m->writable);
                if (r < 0)
                        gm_set_reason(c, r, "cannot map 0x%llx for the CPU: %s", (unsigned long long)m->va,
                                      strerror(-r));
        }
        gm_wire_close_fds(fds, n_fds);
        gm_reply_free(c, reply);
        if (r == 0 && cpu_none && in_window(c, v.va, v.size))
                reserve_again(v.va, v.size);
        /* backend cuda: the GPU access the daemon allowed is set here, in this process's context */
        for (size_t i = 0; r == 0 && c->cuda && i < n; i++)
                if (desc[i].gpu_id != GM_LOCATION_CPU)
                        r = gm_cuda_access(c, v.va, size, desc[i].gpu_id, desc[i].access);
        return r;
}

int gm_mem_get_access(gm_client *c, const void *ptr, uint32_t location, int *ret_access)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmGetAccess g = GPUMEM__VMM_GET_ACCESS__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !ret_access)
                return BAD_ARGS(c);
        g.has_va = g.has_gpu_id = true;
        g.va = gm_cuda_va(c, ptr_u64(ptr));
        g.gpu_id = location;
        req.op_case = GPUMEM__REQUEST__OP_VMM_GET_ACCESS;
        req.vmm_get_access = &g;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_GET_ACCESS, &reply, NULL, NULL);
        if (r < 0)
                return r;
        *ret_access = reply->vmm_get_access->access;
        gm_reply_free(c, reply);
        return 0;
}

int gm_mem_get_allocation_granularity(gm_client *c, uint32_t gpu_id, int option, size_t *ret_granularity)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmGranularity g = GPUMEM__VMM_GRANULARITY__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !ret_granularity)
                return BAD_ARGS(c);
        if (option != GM_GRANULARITY_MINIMUM && option != GM_GRANULARITY_RECOMMENDED)
                return gm_set_reason(c, -EINVAL, "granularity option %d is neither minimum nor recommended",
                                     option);
        g.has_gpu_id = g.has_recommended = true;
        g.gpu_id = gpu_id;
        g.recommended = option == GM_GRANULARITY_RECOMMENDED;
        req.op_case = GPUMEM__REQUEST__OP_VMM_GRANULARITY;
        req.vmm_granularity = &g;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_GRANULARITY, &reply, NULL, NULL);
        if (r < 0)
                return r;
        *ret_granularity = reply->vmm_granularity->granularity;
        gm_reply_free(c, reply);
        return 0;
}

int gm_mem_retain_allocation_handle(gm_client *c, void *ptr, gm_handle *ret_handle)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmRetain v = GPUMEM__VMM_RETAIN__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !ret_handle)
                return BAD_ARGS(c);
        v.has_va = true;
        v.va = gm_cuda_va(c, ptr_u64(ptr));
        req.op_case = GPUMEM__REQUEST__OP_VMM_RETAIN;
        req.vmm_retain = &v;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_RETAIN, &reply, NULL, NULL);
        if (r < 0)
                return r;
        *ret_handle = reply->vmm_retain->handle;
        gm_reply_free(c, reply);
        return 0;
}

int gm_mem_get_allocation_properties(gm_client *c, gm_handle handle, gm_allocation_prop *ret)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__VmmProperties v = GPUMEM__VMM_PROPERTIES__INIT;
        Gpumem__Reply *reply = NULL;
        gm_allocation_prop p = {0};
        int r;

        if (!c || !ret || ret->struct_size == 0)
                return BAD_ARGS(c);
        v.has_handle = true;
        v.handle = handle;
        req.op_case = GPUMEM__REQUEST__OP_VMM_PROPERTIES;
        req.vmm_properties = &v;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_VMM_PROPERTIES, &reply, NULL, NULL);
        if (r < 0)
                return r;
        p.kind = reply->vmm_properties->kind;
        p.gpu_id = reply->vmm_properties->gpu_id;
        p.size = reply->vmm_properties->size;
        p.flags = reply->vmm_properties->flags;
        gm_reply_free(c, reply);
        p.struct_size = ret->struct_size < sizeof(p) ? ret->struct_size : sizeof(p);
        memcpy(ret, &p, p.struct_size);
        return 0;
}

/* ---- sharing ----------------------------------------------------------------------------------------- */

int gm_mem_export(gm_client *c, gm_handle handle, int *ret_fd, size_t *ret_size)
{
        return gm_mem_export_flags(c, handle, 0, ret_fd, ret_size);
}

int gm_mem_export_flags(gm_client *c, gm_handle handle, unsigned flags, int *ret_fd, size_t *ret_size)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__DmabufExport e = GPUMEM__DMABUF_EXPORT__INIT;
        Gpumem__Reply *reply = NULL;
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        int r, idx;

        if (!c || !ret_fd)
                return BAD_ARGS(c);
        if (flags & ~(unsigned)GM_EXPORT_READ_ONLY)
                return gm_set_reason(c, -EINVAL, "unknown export flags 0x%x",
                                     flags & ~(unsigned)GM_EXPORT_READ_ONLY);
        e.has_handle = true;
        e.handle = handle;
        e.has_read_only = (flags & GM_EXPORT_READ_ONLY) != 0;
        e.read_only = e.has_read_only;
        req.op_case = GPUMEM__REQUEST__OP_DMABUF_EXPORT;
        req.dmabuf_export = &e;
        r = call_result(c, &req, GPUMEM__REPLY__RESULT_DMABUF_EXPORT, &reply, fds, &n_fds);
        if (r < 0)
                return r;
        idx = reply->dmabuf_export->fd_index;
        if (idx < 0 || (size_t)idx >= n_fds) {
                gm_wire_close_fds(fds, n_fds);
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd named a dmabuf fd it did not send");
        }
        if ((flags & GM_EXPORT_READ_ONLY) && (fcntl(fds[idx], F_GETFL) & O_ACCMODE) != O_RDONLY) {
                /* a daemon that does not know the flag exported it writable: never hand that on */
                gm_wire_close_fds(fds, n_fds);
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EOPNOTSUPP, "this gpumemd cannot export read-only");
        }
        *ret_fd = fds[idx];
        fds[idx] = -1;
        if (ret_size)
                *ret_size = reply->dmabuf_export->size;
        gm_wire_close_fds(fds, n_fds);
        gm_reply_free(c, reply);
        return 0;
}

int gm_mem_import(gm_client *c, int fd, uint32_t gpu_id, gm_handle *ret_handle, size_t *ret_size)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__DmabufImport im = GPUMEM__DMABUF_IMPORT__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || fd < 0 || !ret_handle)
                return BAD_ARGS(c);
        im.has_fd_index = im.has_gpu_id = true;
        im.fd_index = 0;
        im.gpu_id = gpu_id;
        req.op_case = GPUMEM__REQUEST__OP_DMABUF_IMPORT;
        req.dmabuf_import = &im;
        r = gm_call(c, &req, &fd, 1, &reply, NULL, NULL);
        if (r < 0)
                return r;
        if (reply->result_case != GPUMEM__REPLY__RESULT_DMABUF_IMPORT) {
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd replied with an unexpected result");
        }
        /* backend cuda: this process imports the same fd, to map the handle where gm_mem_map says */
        if (c->cuda && (r = cuda_take_handle(c, reply->dmabuf_import->handle, fd, gpu_id)) < 0) {
                gm_reply_free(c, reply);
                return r;
        }
        *ret_handle = reply->dmabuf_import->handle;
        if (ret_size)
                *ret_size = reply->dmabuf_import->size;
        gm_reply_free(c, reply);
        return 0;
}
