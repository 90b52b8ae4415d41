/* libgpumem_client memory API: allocations, VMM, sharing and managed-memory attributes through gpumemd. */
#include "client-private.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "macro.h"

struct MemEntry {
        gm_handle handle;
        uint64_t va, size;
        bool cpu_mapped;
        GmBackendMem bk; /* what the backend took into this process (client-backend.h) */
        bool freeing;    /* gm_mem_free() is taking it down; on c->freeing */
        MemEntry *next_freeing;
};

static uint64_t ptr_u64(const void *p)
{
        return (uint64_t)(uintptr_t)p;
}

/* Put this process's PROT_NONE window reservation back over a range it no longer maps. */
static void reserve_again(uint64_t va, uint64_t size)
{
        (void)map_at(va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

static int map_fd_at(uint64_t va, uint64_t size, int fd, uint64_t offset, bool writable)
{
        return map_at(va, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | MAP_FIXED, fd, offset);
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

/* ---- allocations ------------------------------------------------------------------------------------- */

/* The new allocation @ar of @d, for the backend to take into this process. */
static GmBackendNew backend_new(const gm_alloc_desc *d, const Gpumem__AllocReply *ar, const int *fds,
                                size_t n_fds)
{
        bool has_fd =
                ar->has_import_fd_index && ar->import_fd_index >= 0 && (size_t)ar->import_fd_index < n_fds;

        return (GmBackendNew){
                .handle = ar->handle,
                .kind = d->kind,
                .va = ar->va,
                .size = ar->size,
                .gpu_id = d->gpu_id,
                .gpus = d->n_map_gpus ? d->map_gpus : &d->gpu_id,
                .n_gpus = d->n_map_gpus ? d->n_map_gpus : 1,
                .access = (d->flags & GM_MEM_READ_ONLY) ? GM_ACCESS_READ : GM_ACCESS_READ_WRITE,
                .fd = has_fd ? fds[ar->import_fd_index] : -1,
        };
}

int gm_malloc_desc(gm_client *c, const gm_alloc_desc *d, void **ret_ptr)
{
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        Gpumem__Reply *reply = NULL;
        GmBackendNew n;
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
        a.fixed_va = gm_ptr_va(c, d->fixed_addr);
        a.n_map_gpus = d->n_map_gpus;
        a.map_gpus = (uint32_t *)d->map_gpus;
        r = gm_request_fds(c, GPUMEM__REQUEST__OP_ALLOC, &a, NULL, 0, GPUMEM__REPLY__RESULT_ALLOC, &reply,
                           fds, &n_fds);
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
        n = backend_new(d, reply->alloc, fds, n_fds);
        r = c->bk->map_new(c, &n, &e->bk);
        if (r < 0)
                goto undo;
        gm_wire_close_fds(fds, n_fds); /* mapped: the pages stay, the fds need not */
        pthread_mutex_lock(&c->mem_lock);
        r = hashmap_put(&c->allocs, va, e);
        pthread_mutex_unlock(&c->mem_lock);
        if (r < 0) {
                gm_set_reason(c, r, "cannot record the allocation");
                c->bk->unmap_alloc(c, &e->bk, va, size);
                if (e->cpu_mapped)
                        reserve_again(va, size);
                goto undo_daemon;
        }
        gm_reply_free(c, reply);
        /* device memory is where the backend shows it, host memory at its own address */
        *ret_ptr = d->kind == GM_KIND_DEVICE ? gm_va_ptr(c, va) : (void *)(uintptr_t)va;
        return 0;

undo:
        gm_wire_close_fds(fds, n_fds);
undo_daemon:
        /* give the memory back; the reason recorded above stays unless this fails too */
        (void)gm_request_num(c, GPUMEM__REQUEST__OP_FREE, reply->alloc->handle, GM_ANY_RESULT, NULL, NULL);
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
        e = hashmap_get(&c->allocs, gm_ptr_va(c, ptr));
        pthread_mutex_unlock(&c->mem_lock);
        return e;
}

int gm_mem_free(gm_client *c, void *ptr)
{
        Gpumem__Free f = GPUMEM__FREE__INIT;
        MemEntry *e;
        bool busy;
        int r;

        if (!c)
                return BAD_ARGS(c);
        if (!ptr)
                return 0; /* like free(NULL) and hipFree(nullptr) */
        pthread_mutex_lock(&c->mem_lock);
        e = hashmap_get(&c->allocs, gm_ptr_va(c, ptr));
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
        /* the backend's mapping goes first: it alone could keep the memory alive after the free (should the
         * daemon refuse the free, the pointer is unmapped here all the same) */
        c->bk->unmap_alloc(c, &e->bk, e->va, e->size);
        r = gm_request(c, GPUMEM__REQUEST__OP_FREE, &f, GM_ANY_RESULT, NULL);
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
        Gpumem__MapToGpus m = GPUMEM__MAP_TO_GPUS__INIT;
        Gpumem__UnmapFromGpus u = GPUMEM__UNMAP_FROM_GPUS__INIT;
        MemEntry *e;
        int r;

        if (!c || (n && !gpu_ids))
                return BAD_ARGS(c);
        e = entry_of(c, ptr);
        if (!e)
                return gm_set_reason(c, -EINVAL, "%p was not returned by gm_malloc or gm_host_malloc", ptr);
        /* the two ops' messages are alike */
        m.has_handle = u.has_handle = true;
        m.handle = u.handle = e->handle;
        m.n_gpu_ids = u.n_gpu_ids = n;
        m.gpu_ids = u.gpu_ids = (uint32_t *)gpu_ids;
        r = map ? gm_request(c, GPUMEM__REQUEST__OP_MAP, &m, GM_ANY_RESULT, NULL)
                : gm_request(c, GPUMEM__REQUEST__OP_UNMAP, &u, GM_ANY_RESULT, NULL);
        /* the access the daemon allowed, in this process too */
        for (size_t i = 0; r == 0 && i < n; i++)
                r = c->bk->access(c, &e->bk, e->va, e->size, gpu_ids[i],
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

/* One GPU's free and total memory, into the two size_t pointers of @ctx (either may be NULL). */
static int mem_info_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__MemInfoReply *mi = result;
        size_t **ret = ctx;

        if (mi->n_gpus != 1)
                return gm_set_reason(c, -EPROTO, "gpumemd answered for %zu GPUs", mi->n_gpus);
        if (ret[0])
                *ret[0] = mi->gpus[0]->free;
        if (ret[1])
                *ret[1] = mi->gpus[0]->total;
        return 0;
}

int gm_mem_get_info(gm_client *c, uint32_t gpu_id, size_t *ret_free, size_t *ret_total)
{
        size_t *ret[2] = {ret_free, ret_total};

        if (!c || !gpu_id)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_MEM_INFO, gpu_id, GPUMEM__REPLY__RESULT_MEM_INFO,
                              mem_info_take, ret);
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
        a->base = a->kind == GM_KIND_HOST ? (void *)(uintptr_t)v.alloc_base : gm_va_ptr(c, v.alloc_base);
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
        n = gm_pb_put_uint_pad(body, 1, gm_ptr_va(c, ptr));
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
                Gpumem__SvmAttr a = GPUMEM__SVM_ATTR__INIT;

                a.has_type = a.has_value = true;
                a.type = attrs[i].type;
                a.value = attrs[i].value;
                buf[i] = a;
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

/* An older daemon's answer to a get: the attributes as messages, or packed (never both). */
static int svm_get_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__SvmGetAttrReply *gr = result;
        const SvmGetCtx *g = ctx;
        size_t got = gr->n_attrs + gr->n_packed_attrs;

        if (got != g->n || (gr->n_attrs && gr->n_packed_attrs))
                return gm_set_reason(c, -EPROTO, "gpumemd answered %zu attributes for %zu", got, g->n);
        for (size_t i = 0; i < gr->n_attrs; i++)
                g->attrs[i] = (gm_svm_attr){gr->attrs[i]->type, gr->attrs[i]->value};
        for (size_t i = 0; i < gr->n_packed_attrs; i++)
                g->attrs[i] =
                        (gm_svm_attr){(uint32_t)(gr->packed_attrs[i] >> 32), (uint32_t)gr->packed_attrs[i]};
        return 0;
}

/*
 * Set (@get false) or get @n attributes of [@ptr, +@size): packed by hand for a daemon of protocol 3 or
 * later, as protobuf-c messages for an older one. The two ops' messages have the same fields.
 */
static int svm_call(gm_client *c, bool get, const void *ptr, size_t size, gm_svm_attr *attrs, size_t n)
{
        Gpumem__SvmSetAttr s = GPUMEM__SVM_SET_ATTR__INIT;
        Gpumem__SvmGetAttr g = GPUMEM__SVM_GET_ATTR__INIT;
        Gpumem__SvmAttr buf[GM_SVM_MAX_ATTRS], *ptrs[GM_SVM_MAX_ATTRS];
        SvmGetCtx ctx = {attrs, n};

        if (n > GM_SVM_MAX_ATTRS)
                return gm_set_reason(c, -E2BIG, "more than %d attributes", GM_SVM_MAX_ATTRS);
        if (c->protocol_version >= 3) {
                uint8_t body[SVM_BODY_MAX];
                size_t len = svm_call_body(body, ptr, size, attrs, n);
                return get ? gm_call_view(c, GPUMEM__REQUEST__OP_SVM_GET_ATTR, body, len,
                                          GPUMEM__REPLY__RESULT_SVM_GET_ATTR, svm_get_view, &ctx)
                           : gm_call_view(c, GPUMEM__REQUEST__OP_SVM_SET_ATTR, body, len,
                                          GPUMEM__REPLY__RESULT_EMPTY, empty_view, NULL);
        }
        attrs_to_msgs(attrs, n, buf, ptrs);
        s.has_va = s.has_size = g.has_va = g.has_size = true;
        s.va = g.va = ptr_u64(ptr);
        s.size = g.size = size;
        s.attrs = g.attrs = ptrs;
        s.n_attrs = g.n_attrs = n;
        return get ? gm_request_take(c, GPUMEM__REQUEST__OP_SVM_GET_ATTR, &g,
                                     GPUMEM__REPLY__RESULT_SVM_GET_ATTR, svm_get_take, &ctx)
                   : gm_request(c, GPUMEM__REQUEST__OP_SVM_SET_ATTR, &s, GM_ANY_RESULT, NULL);
}

int gm_svm_set_attributes(gm_client *c, const void *ptr, size_t size, const gm_svm_attr *attrs, size_t n)
{
        if (!c || (n && !attrs))
                return BAD_ARGS(c);
        /* only read */
        return svm_call(c, false, ptr, size, (gm_svm_attr *)attrs, n);
}

int gm_svm_get_attributes(gm_client *c, const void *ptr, size_t size, gm_svm_attr *attrs, size_t n)
{
        if (!c || (n && !attrs))
                return BAD_ARGS(c);
        return svm_call(c, true, ptr, size, attrs, n);
}

/*
 * hipMemAdvise as ROCm's HIP runtime and ROCr turn it into KFD SVM attributes: read-mostly is a flag,
 * preferred location an attribute (undefined when unset), "accessed by" maps in place on that GPU and
 * its removal leaves the GPU merely allowed to access, coarse grain clears the coherent flag. Each advice
 * is one attribute, whose value is the call's location where the row says so.
 */
static const struct {
        int advice;
        uint32_t type, value;
        bool at_location;
} advice_attrs[] = {
        {GM_ADVISE_SET_READ_MOSTLY, GM_SVM_ATTR_SET_FLAGS, GM_SVM_FLAG_GPU_READ_MOSTLY, false},
        {GM_ADVISE_UNSET_READ_MOSTLY, GM_SVM_ATTR_CLR_FLAGS, GM_SVM_FLAG_GPU_READ_MOSTLY, false},
        {GM_ADVISE_SET_PREFERRED_LOCATION, GM_SVM_ATTR_PREFERRED_LOC, 0, true},
        {GM_ADVISE_UNSET_PREFERRED_LOCATION, GM_SVM_ATTR_PREFERRED_LOC, GM_SVM_LOCATION_UNDEFINED, false},
        {GM_ADVISE_SET_ACCESSED_BY, GM_SVM_ATTR_ACCESS_IN_PLACE, 0, true},
        {GM_ADVISE_UNSET_ACCESSED_BY, GM_SVM_ATTR_ACCESS, 0, true},
        {GM_ADVISE_SET_COARSE_GRAIN, GM_SVM_ATTR_CLR_FLAGS, GM_SVM_FLAG_COHERENT, false},
        {GM_ADVISE_UNSET_COARSE_GRAIN, GM_SVM_ATTR_SET_FLAGS, GM_SVM_FLAG_COHERENT, false}};

int gm_mem_advise(gm_client *c, const void *ptr, size_t size, int advice, uint32_t location)
{
        if (!c)
                return BAD_ARGS(c);
        if ((advice == GM_ADVISE_SET_ACCESSED_BY || advice == GM_ADVISE_UNSET_ACCESSED_BY) &&
            location == GM_LOCATION_CPU) {
                /* the CPU always reaches managed memory: nothing for the GPU driver to change, but the range
                 * must still be managed memory of this client */
                gm_svm_attr q = {GM_SVM_ATTR_GRANULARITY, 0};
                return gm_svm_get_attributes(c, ptr, size, &q, 1);
        }
        for (size_t i = 0; i < ARRAY_SIZE(advice_attrs); i++) {
                if (advice_attrs[i].advice == advice) {
                        gm_svm_attr a = {advice_attrs[i].type,
                                         advice_attrs[i].at_location ? location : advice_attrs[i].value};
                        return gm_svm_set_attributes(c, ptr, size, &a, 1);
                }
        }
        return gm_set_reason(c, -EINVAL, "unknown advice %d", advice);
}

int gm_mem_prefetch(gm_client *c, const void *ptr, size_t size, uint32_t location)
{
        Gpumem__SvmPrefetch p = GPUMEM__SVM_PREFETCH__INIT;

        if (!c)
                return BAD_ARGS(c);
        p.has_va = p.has_size = p.has_location = true;
        p.va = ptr_u64(ptr);
        p.size = size;
        p.location = location;
        return gm_request(c, GPUMEM__REQUEST__OP_SVM_PREFETCH, &p, GM_ANY_RESULT, NULL);
}

/* ---- VMM --------------------------------------------------------------------------------------------- */

/*
 * A VMM handle the daemon made or imported (@fd: its export for this process, -1 when none came), for the
 * backend to take in where gm_mem_map will map it. On failure the daemon's handle is released too: the
 * caller is left holding nothing.
 */
static int take_handle(gm_client *c, gm_handle handle, int fd, uint32_t gpu_id)
{
        GmBackendNew n = {.handle = handle, .kind = GM_KIND_DEVICE, .gpu_id = gpu_id, .fd = fd};
        int r = c->bk->map_new(c, &n, NULL);

        if (r < 0)
                (void)gm_request_num(c, GPUMEM__REQUEST__OP_VMM_RELEASE, handle, GM_ANY_RESULT, NULL, NULL);
        return r;
}

int gm_mem_address_reserve(gm_client *c, size_t size, size_t alignment, void *addr, unsigned long long flags,
                           void **ret_ptr)
{
        Gpumem__VmmReserve v = GPUMEM__VMM_RESERVE__INIT;
        uint64_t va;
        int r;

        if (!c || !ret_ptr)
                return BAD_ARGS(c);
        v.has_size = v.has_alignment = v.has_fixed_va = v.has_flags = true;
        v.size = size;
        v.alignment = alignment;
        v.fixed_va = gm_ptr_va(c, addr);
        v.flags = flags;
        r = gm_request_take(c, GPUMEM__REQUEST__OP_VMM_RESERVE, &v, GPUMEM__REPLY__RESULT_VMM_RESERVE,
                            gm_take_num, &va);
        if (r < 0)
                return r;
        /* the caller maps into the range next: not while a free over it is still in progress */
        wait_range_free(c, va, size);
        *ret_ptr = gm_va_ptr(c, va);
        return 0;
}

int gm_mem_address_free(gm_client *c, void *ptr, size_t size)
{
        Gpumem__VmmFree v = GPUMEM__VMM_FREE__INIT;

        if (!c)
                return BAD_ARGS(c);
        v.has_va = v.has_size = true;
        v.va = gm_ptr_va(c, ptr);
        v.size = size;
        return gm_request(c, GPUMEM__REQUEST__OP_VMM_FREE, &v, GM_ANY_RESULT, NULL);
}

int gm_mem_create(gm_client *c, size_t size, uint32_t gpu_id, unsigned flags, gm_handle *ret_handle)
{
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
        r = gm_request_fds(c, GPUMEM__REQUEST__OP_VMM_CREATE, &v, NULL, 0, GPUMEM__REPLY__RESULT_VMM_CREATE,
                           &reply, fds, &n_fds);
        if (r < 0)
                return r;
        {
                int ix = reply->vmm_create->has_import_fd_index ? reply->vmm_create->import_fd_index : -1;
                r = take_handle(c, reply->vmm_create->handle, ix >= 0 && (size_t)ix < n_fds ? fds[ix] : -1,
                                gpu_id);
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
        int r;

        if (!c)
                return BAD_ARGS(c);
        r = gm_request_num(c, GPUMEM__REQUEST__OP_VMM_RELEASE, handle, GM_ANY_RESULT, NULL, NULL);
        if (r == 0)
                c->bk->release(c, handle);
        return r;
}

int gm_mem_map(gm_client *c, void *ptr, size_t size, size_t offset, gm_handle handle)
{
        Gpumem__VmmMap v = GPUMEM__VMM_MAP__INIT;
        int r;

        if (!c)
                return BAD_ARGS(c);
        v.has_va = v.has_size = v.has_offset = v.has_handle = true;
        v.va = gm_ptr_va(c, ptr);
        v.size = size;
        v.offset = offset;
        v.handle = handle;
        r = gm_request(c, GPUMEM__REQUEST__OP_VMM_MAP, &v, GM_ANY_RESULT, NULL);
        if (r == 0) {
                r = c->bk->map(c, v.va, size, offset, handle);
                if (r < 0) {
                        /* the daemon's mapping goes too: the caller sees nothing mapped */
                        Gpumem__VmmUnmap u = GPUMEM__VMM_UNMAP__INIT;
                        u.has_va = u.has_size = true;
                        u.va = v.va;
                        u.size = size;
                        (void)gm_request(c, GPUMEM__REQUEST__OP_VMM_UNMAP, &u, GM_ANY_RESULT, NULL);
                }
        }
        return r;
}

int gm_mem_unmap(gm_client *c, void *ptr, size_t size)
{
        Gpumem__VmmUnmap v = GPUMEM__VMM_UNMAP__INIT;
        int r;

        if (!c)
                return BAD_ARGS(c);
        v.has_va = v.has_size = true;
        v.va = gm_ptr_va(c, ptr);
        v.size = size;
        /* the backend's mappings first, as gm_mem_free does */
        if ((r = c->bk->unmap(c, v.va, size)) < 0)
                return r;
        r = gm_request(c, GPUMEM__REQUEST__OP_VMM_UNMAP, &v, GM_ANY_RESULT, NULL);
        /* whatever the CPU saw there is gone: keep the window reserved */
        if (r == 0 && in_window(c, v.va, v.size))
                reserve_again(v.va, v.size);
        return r;
}

int gm_mem_set_access(gm_client *c, void *ptr, size_t size, const gm_access_desc *desc, size_t n)
{
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
        v.va = gm_ptr_va(c, ptr);
        v.size = size;
        v.n_desc = n;
        v.desc = dp;
        r = gm_request_fds(c, GPUMEM__REQUEST__OP_VMM_SET_ACCESS, &v, NULL, 0,
                           GPUMEM__REPLY__RESULT_VMM_SET_ACCESS, &reply, fds, &n_fds);
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
        /* the GPU access the daemon allowed, in this process too */
        for (size_t i = 0; r == 0 && i < n; i++)
                if (desc[i].gpu_id != GM_LOCATION_CPU)
                        r = c->bk->access(c, NULL, v.va, size, desc[i].gpu_id, desc[i].access);
        return r;
}

int gm_mem_get_access(gm_client *c, const void *ptr, uint32_t location, int *ret_access)
{
        Gpumem__VmmGetAccess g = GPUMEM__VMM_GET_ACCESS__INIT;
        uint64_t access;
        int r;

        if (!c || !ret_access)
                return BAD_ARGS(c);
        g.has_va = g.has_gpu_id = true;
        g.va = gm_ptr_va(c, ptr);
        g.gpu_id = location;
        r = gm_request_take(c, GPUMEM__REQUEST__OP_VMM_GET_ACCESS, &g, GPUMEM__REPLY__RESULT_VMM_GET_ACCESS,
                            gm_take_num, &access);
        if (r == 0)
                *ret_access = (int)access;
        return r;
}

int gm_mem_get_allocation_granularity(gm_client *c, uint32_t gpu_id, int option, size_t *ret_granularity)
{
        Gpumem__VmmGranularity g = GPUMEM__VMM_GRANULARITY__INIT;
        uint64_t granularity;
        int r;

        if (!c || !ret_granularity)
                return BAD_ARGS(c);
        if (option != GM_GRANULARITY_MINIMUM && option != GM_GRANULARITY_RECOMMENDED)
                return gm_set_reason(c, -EINVAL, "granularity option %d is neither minimum nor recommended",
                                     option);
        g.has_gpu_id = g.has_recommended = true;
        g.gpu_id = gpu_id;
        g.recommended = option == GM_GRANULARITY_RECOMMENDED;
        r = gm_request_take(c, GPUMEM__REQUEST__OP_VMM_GRANULARITY, &g, GPUMEM__REPLY__RESULT_VMM_GRANULARITY,
                            gm_take_num, &granularity);
        if (r == 0)
                *ret_granularity = granularity;
        return r;
}

int gm_mem_retain_allocation_handle(gm_client *c, void *ptr, gm_handle *ret_handle)
{
        if (!c || !ret_handle)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_VMM_RETAIN, gm_ptr_va(c, ptr),
                              GPUMEM__REPLY__RESULT_VMM_RETAIN, gm_take_num, ret_handle);
}

/* The properties, as much of them as the caller's struct has room for (its struct_size). */
static int properties_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__VmmPropertiesReply *v = result;
        gm_allocation_prop *ret = ctx;
        gm_allocation_prop p = {0};

        (void)c;
        p.kind = v->kind;
        p.gpu_id = v->gpu_id;
        p.size = v->size;
        p.flags = v->flags;
        p.struct_size = ret->struct_size < sizeof(p) ? ret->struct_size : sizeof(p);
        memcpy(ret, &p, p.struct_size);
        return 0;
}

int gm_mem_get_allocation_properties(gm_client *c, gm_handle handle, gm_allocation_prop *ret)
{
        if (!c || !ret || ret->struct_size == 0)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_VMM_PROPERTIES, handle,
                              GPUMEM__REPLY__RESULT_VMM_PROPERTIES, properties_take, ret);
}

/* ---- sharing ----------------------------------------------------------------------------------------- */

int gm_mem_export(gm_client *c, gm_handle handle, int *ret_fd, size_t *ret_size)
{
        return gm_mem_export_flags(c, handle, 0, ret_fd, ret_size);
}

int gm_mem_export_flags(gm_client *c, gm_handle handle, unsigned flags, int *ret_fd, size_t *ret_size)
{
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
        r = gm_request_fds(c, GPUMEM__REQUEST__OP_DMABUF_EXPORT, &e, NULL, 0,
                           GPUMEM__REPLY__RESULT_DMABUF_EXPORT, &reply, fds, &n_fds);
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
        Gpumem__DmabufImport im = GPUMEM__DMABUF_IMPORT__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || fd < 0 || !ret_handle)
                return BAD_ARGS(c);
        im.has_fd_index = im.has_gpu_id = true;
        im.fd_index = 0;
        im.gpu_id = gpu_id;
        r = gm_request_fds(c, GPUMEM__REQUEST__OP_DMABUF_IMPORT, &im, &fd, 1,
                           GPUMEM__REPLY__RESULT_DMABUF_IMPORT, &reply, NULL, NULL);
        if (r < 0)
                return r;
        /* the backend takes the same fd in, for gm_mem_map to map the handle */
        if ((r = take_handle(c, reply->dmabuf_import->handle, fd, gpu_id)) < 0) {
                gm_reply_free(c, reply);
                return r;
        }
        *ret_handle = reply->dmabuf_import->handle;
        if (ret_size)
                *ret_size = reply->dmabuf_import->size;
        gm_reply_free(c, reply);
        return 0;
}
