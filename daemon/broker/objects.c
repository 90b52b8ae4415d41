/* The broker's objects: handles, their VA, freeing them, GPU mappings, and the queries over them. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "broker-private.h"

static uint64_t new_handle(const BrokerClient *c)
{
        for (;;) {
                uint64_t h = 0;
                if (getrandom(&h, sizeof(h), 0) != sizeof(h))
                        h ^= (uint64_t)random() << 32 ^ (uint64_t)random() ^ (uint64_t)(uintptr_t)&h;
                /* handles are unguessable and never 0, UINT64_MAX or already taken */
                if (h != 0 && h != UINT64_MAX && !hashmap_get(&c->objs, h))
                        return h;
        }
}

Obj *broker_obj_new(BrokerKind kind)
{
        Obj *o = calloc(1, sizeof(*o));
        if (o) {
                o->kind = kind;
                o->memfd = -1;
                o->numa_node = -1;
        }
        return o;
}

/* Give @o a handle the client can name. */
int broker_obj_publish(BrokerClient *c, Obj *o)
{
        if (!o->handle)
                o->handle = new_handle(c);
        return hashmap_put(&c->objs, o->handle, o);
}

Obj *broker_obj_lookup(BrokerClient *c, uint64_t handle)
{
        return hashmap_get(&c->objs, handle);
}

/*
 * A VMM handle or import the driver made (mapped nowhere yet): charged to its client and given a handle, or,
 * out of the class's limits or of memory, its buffer back to the driver and @o freed.
 */
int broker_obj_add(BrokerClient *c, Obj *o, Reason *w)
{
        Charge ch = broker_obj_charge(o);
        int r = broker_charge_take(c, &ch, w);

        if (r >= 0 && (r = broker_obj_publish(c, o)) < 0) {
                broker_charge_give(c, &ch);
                reason_set(w, r, "out of memory");
        }
        if (r < 0) {
                (void)driver_mem_free(c->b->drv, o->mem);
                free(o);
        }
        return r;
}

/* A copy of @o's memfd (host or managed memory) in *@ret_fd, for the client: -1 there on failure. */
int broker_obj_dup_memfd(const Obj *o, int *ret_fd, Reason *w)
{
        *ret_fd = fcntl(o->memfd, F_DUPFD_CLOEXEC, 3);
        if (*ret_fd < 0)
                return reason_set(w, -errno, "cannot duplicate the memory fd: %s", strerror(errno));
        return 0;
}

/* Give @o's buffer back to the driver, unmapped from its GPUs first. */
void broker_obj_mem_free(Broker *b, Obj *o)
{
        (void)driver_mem_unmap_all(b->drv, o->mem);
        (void)driver_mem_free(b->drv, o->mem);
        o->mem = NULL;
}

/* Put a PROT_NONE reservation back over [va, va+size) of the daemon's copy of the window. */
void broker_reserve_again(uint64_t va, uint64_t size)
{
        (void)mmap((void *)(uintptr_t)va, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* Drop the daemon's mapping of shared or managed memory at [va, va+size), through the driver, which drops
 * the pages from its SVM ranges as the kernel's MMU notifier does. */
void broker_unmap_shared(Broker *b, uint64_t va, uint64_t size)
{
        (void)driver_cpu_unmap(b->drv, va, size);
        broker_reserve_again(va, size);
}

void broker_set_dropper(Broker *b, void (*fn)(void *arg, BrokerDrop *d, uint64_t flow), void *arg)
{
        b->dropper = fn;
        b->dropper_arg = arg;
}

void broker_client_set_flow(BrokerClient *c, uint64_t flow)
{
        c->flow = flow;
}

void broker_client_hold_drops(BrokerClient *c)
{
        c->hold_drops = true;
}

BrokerDrop *broker_client_take_drops(BrokerClient *c)
{
        BrokerDrop *d = c->drops;

        c->drops = NULL;
        c->hold_drops = false;
        return d;
}

/* A drop unmaps its pages a slice at a time: munmap holds the process's mmap lock while it frees a slice's
 * pages, and the loops take that lock to map (windows, new memory). */
#define DROP_SLICE (64ull << 20)

void broker_drop_run(BrokerDrop *d)
{
        for (uint64_t off = 0; d->addr && off < d->size; off += DROP_SLICE)
                munmap((uint8_t *)d->addr + off, d->size - off < DROP_SLICE ? d->size - off : DROP_SLICE);
        d->addr = NULL;
        d->fd = safe_close(d->fd);
}

/* The alignment a mapping moved out of the window keeps: a PMD's, so that the kernel moves page tables
 * whole instead of their entries one by one. */
#define DETACH_ALIGN (2ull << 20)

/*
 * Move the daemon's mapping of [va, va+size) to a place of its own outside every window. The pages go with
 * the mapping, untouched: a move costs page tables, not pages. NULL when it cannot be moved.
 */
static void *detach_pages(uint64_t va, uint64_t size)
{
        size_t span = size + DETACH_ALIGN;
        uint8_t *area = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        uint8_t *dst, *p;

        if (area == MAP_FAILED)
                return NULL;
        dst = (uint8_t *)(((uintptr_t)area + DETACH_ALIGN - 1) & ~(uintptr_t)(DETACH_ALIGN - 1));
        p = mremap((void *)(uintptr_t)va, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
        if (p == MAP_FAILED) {
                munmap(area, span);
                return NULL;
        }
        /* what is left of the place around it */
        if (dst > area)
                munmap(area, (size_t)(dst - area));
        if (dst + size < area + span)
                munmap(dst + size, (size_t)(area + span - (dst + size)));
        return p;
}

void broker_drop_file(Broker *b, int fd, uint64_t size, uint64_t flow, BrokerDrop **hold)
{
        BrokerDrop *d = NULL;

        if (fd >= 0 && size >= BROKER_SLOW_FREE_BYTES && (b->dropper || hold))
                d = calloc(1, sizeof(*d));
        if (!d) {
                safe_close(fd);
                return;
        }
        d->fd = fd;
        d->size = size;
        if (hold) {
                d->next = *hold;
                *hold = d;
        } else {
                b->dropper(b->dropper_arg, d, flow);
        }
}

void broker_drop_pages(BrokerClient *c, Obj *o)
{
        Broker *b = c->b;
        BrokerDrop *d = NULL;

        if (o->size >= BROKER_SLOW_FREE_BYTES && (b->dropper || c->hold_drops))
                d = calloc(1, sizeof(*d));
        if (!d) {
                if (!o->outer)
                        broker_unmap_shared(b, o->va, o->size);
                o->memfd = safe_close(o->memfd);
                return;
        }
        d->size = o->size;
        d->fd = TAKE_FD(o->memfd);
        if (!o->outer) {
                /* the driver's unmap after the move finds nothing mapped there (cheap), and tells the
                 * driver's SVM ranges that the pages went; without the move, they are released here */
                d->addr = detach_pages(o->va, o->size);
                broker_unmap_shared(b, o->va, o->size);
        }
        if (c->hold_drops) {
                d->next = c->drops;
                c->drops = d;
        } else if (b->dropper) {
                b->dropper(b->dropper_arg, d, c->flow);
        } else {
                broker_drop_run(d);
                free(d);
        }
}

int broker_check_gpus(const Broker *b, const uint32_t *ids, size_t n, Reason *w)
{
        for (size_t i = 0; i < n; i++) {
                if (broker_gpu_index(b, ids[i]) < 0)
                        return reason_set(w, -ENODEV, "no GPU with id %u", ids[i]);
                for (size_t k = 0; k < i; k++)
                        if (ids[k] == ids[i])
                                return reason_set(w, -EINVAL, "GPU %u listed twice", ids[i]);
        }
        return 0;
}

int broker_check_flags(uint32_t f, Reason *w)
{
        if (f & ~(uint32_t)_BROKER_FLAG_ALL)
                return reason_set(w, -EINVAL, "unknown allocation flags 0x%x",
                                  f & ~(uint32_t)_BROKER_FLAG_ALL);
        /* the same combinations libhsakmt refuses */
        if ((f & BROKER_FLAG_EXT_COHERENT) && !(f & BROKER_FLAG_COHERENT))
                return reason_set(w, -EINVAL, "extended coherence needs fine-grained (coherent) memory");
        if ((f & BROKER_FLAG_EXT_COHERENT) && (f & BROKER_FLAG_UNCACHED))
                return reason_set(w, -EINVAL, "extended coherence and uncached exclude each other");
        return 0;
}

/* The VA space an object lives in. */
ThunkVaSpace *broker_obj_space(const BrokerClient *c, const Obj *o)
{
        return o->outer ? c->outer : c->window;
}

/* Reserve VA in the client's window. */
int broker_take_va(BrokerClient *c, uint64_t size, uint64_t align, uint64_t fixed, Obj *o, uint64_t *ret,
                   Reason *w)
{
        char b1[32];
        int r;

        if (fixed) {
                if (fixed % align)
                        return reason_set(w, -EINVAL, "address 0x%llx is not aligned to %s",
                                          (unsigned long long)fixed, broker_human(align, b1, sizeof(b1)));
                r = thunk_va_alloc_fixed(c->window, fixed, size, o);
                if (r == -ERANGE || r == -EOVERFLOW)
                        return reason_set(w, -EINVAL, "0x%llx+0x%llx is outside this client's VA window",
                                          (unsigned long long)fixed, (unsigned long long)size);
                if (r == -EADDRINUSE)
                        return reason_set(w, r, "0x%llx+0x%llx overlaps memory this client already has",
                                          (unsigned long long)fixed, (unsigned long long)size);
                if (r < 0)
                        return reason_set(w, r, "cannot place 0x%llx: %s", (unsigned long long)fixed,
                                          strerror(-r));
                *ret = fixed;
                return 0;
        }
        r = thunk_va_alloc(c->window, size, align, o, ret);
        if (r == -ENOMEM)
                return reason_set(w, r, "no room for %s in this client's VA window",
                                  broker_human(size, b1, sizeof(b1)));
        if (r < 0)
                return reason_set(w, r, "cannot place %s in the VA window: %s",
                                  broker_human(size, b1, sizeof(b1)), strerror(-r));
        return 0;
}

int broker_check_alignment(uint64_t align, Reason *w)
{
        if (align && (align < BROKER_PAGE_SIZE || (align & (align - 1)) || align > (1ull << 30)))
                return reason_set(w, -EINVAL, "alignment %llu is not a power of two between 4 KiB and 1 GiB",
                                  (unsigned long long)align);
        return 0;
}

/* Free what an allocation holds (not its handle or VA). At a client's teardown (@teardown) a driver refusal
 * does not stop the rest: the client's context release takes the GPU side, and the memory file must still
 * be closed. */
int broker_destroy_alloc(BrokerClient *c, Obj *o, bool teardown, Reason *w)
{
        int tmp_fd = -1, r;

        /* a dmabuf of it went out: hold one more while the BO goes, to watch its memory after */
        if (o->mem && o->memfd < 0 && o->handed_out && driver_mem_export(c->b->drv, o->mem, &tmp_fd) < 0)
                tmp_fd = -1;
        if (o->mem) {
                r = driver_mem_unmap_all(c->b->drv, o->mem);
                if (r < 0 && !teardown) {
                        safe_close(tmp_fd);
                        return reason_set(w, r, "cannot unmap the allocation from its GPUs: %s",
                                          strerror(-r));
                }
                r = r < 0 ? r : driver_mem_free(c->b->drv, o->mem);
                if (r < 0 && !teardown) {
                        safe_close(tmp_fd);
                        return reason_set(w, r, "the driver refused to free the allocation: %s",
                                          strerror(-r));
                }
                o->mem = NULL;
        }
        /* its share changes only once the memory went: a refused free leaves it as it was */
        broker_share_obj_gone(c, o);
        broker_linger_start(c, o, o->memfd >= 0 ? o->memfd : tmp_fd);
        safe_close(tmp_fd);
        broker_obj_forget_file(c->b, o);
        if (o->memfd >= 0) {
                broker_drop_pages(c, o);
                broker_charge_give(c, &(Charge){.held_fds = 1});
        }
        return 0;
}

static int free_alloc(BrokerClient *c, Obj *o, Reason *w)
{
        int r = broker_destroy_alloc(c, o, false, w);

        if (r < 0)
                return r;
        hashmap_remove(&c->objs, o->handle);
        (void)thunk_va_free(broker_obj_space(c, o), o->va);
        broker_charge_obj_give(c, o); /* held_fds was already refunded when the fd closed */
        broker_svm_log_free(c, o);
        free(o);
        return 0;
}

/*
 * A VMM handle or import nobody names or maps any more: free its BO, then the object, out of the client's
 * handles if it is still there. A free the driver refuses leaves all as it was and is returned, except at
 * the client's teardown (@teardown), where the release of its context takes what the driver kept.
 */
int broker_phys_maybe_destroy(BrokerClient *c, Obj *o, bool teardown, Reason *w)
{
        int tmp_fd = -1, r;

        if (o->client_refs > 0 || o->map_refs > 0)
                return 0;
        if (o->mem && o->handed_out && driver_mem_export(c->b->drv, o->mem, &tmp_fd) < 0)
                tmp_fd = -1;
        r = o->mem ? driver_mem_free(c->b->drv, o->mem) : 0;
        if (r < 0 && !teardown) {
                safe_close(tmp_fd);
                return reason_set(w, r, "the driver refused to free the memory of %s 0x%llx: %s",
                                  o->kind == BROKER_KIND_IMPORT ? "import" : "VMM handle",
                                  (unsigned long long)o->handle, strerror(-r));
        }
        if (hashmap_get(&c->objs, o->handle) == o)
                hashmap_remove(&c->objs, o->handle);
        broker_share_obj_gone(c, o);
        broker_linger_start(c, o, tmp_fd);
        safe_close(tmp_fd);
        broker_obj_forget_file(c->b, o);
        broker_charge_obj_give(c, o);
        free(o);
        return 0;
}

int broker_mem_free(BrokerClient *c, uint64_t handle, Reason *w)
{
        Obj *o = broker_obj_lookup(c, handle);

        if (!o)
                return reason_set(w, -ENOENT, "no allocation with handle 0x%llx", (unsigned long long)handle);
        switch (o->kind) {
        case BROKER_KIND_DEVICE:
        case BROKER_KIND_HOST:
        case BROKER_KIND_MANAGED: {
                int r = free_alloc(c, o, w);
                broker_process_events(c->b); /* memory no one else holds is refunded before the reply */
                return r;
        }
        case BROKER_KIND_VMM:
        case BROKER_KIND_IMPORT:
                return broker_vmm_release(c, handle, w);
        case BROKER_KIND_SHARE:
                hashmap_remove(&c->objs, o->handle);
                broker_share_ref_drop(c, o);
                free(o);
                broker_process_events(c->b);
                return 0;
        default:
                return reason_set(w, -EINVAL, "0x%llx is a VA reservation: free it with vmm_free",
                                  (unsigned long long)handle);
        }
}

int broker_map(BrokerClient *c, uint64_t handle, const uint32_t *gpu_ids, size_t n, Reason *w)
{
        Obj *o = broker_obj_lookup(c, handle);
        int r;

        if (!o)
                return reason_set(w, -ENOENT, "no allocation with handle 0x%llx", (unsigned long long)handle);
        if (o->kind == BROKER_KIND_MANAGED)
                return reason_set(w, -EINVAL, "managed memory is mapped through its SVM attributes");
        if (o->kind == BROKER_KIND_SHARE)
                return reason_set(w, -EINVAL, "a share is mapped on its reader's GPUs when it is opened");
        if (o->kind != BROKER_KIND_DEVICE && o->kind != BROKER_KIND_HOST)
                return reason_set(w, -EINVAL, "VMM handles are mapped with vmm_map and vmm_set_access");
        if (n == 0)
                return reason_set(w, -EINVAL, "no GPU to map on");
        r = broker_gpus_allowed(c, gpu_ids, n, w);
        if (r < 0)
                return r;
        r = driver_mem_map(c->b->drv, o->mem, gpu_ids, n);
        if (r < 0)
                return reason_set(w, r, "the driver refused to map the allocation: %s", strerror(-r));
        return 0;
}

int broker_unmap(BrokerClient *c, uint64_t handle, const uint32_t *gpu_ids, size_t n, Reason *w)
{
        Obj *o = broker_obj_lookup(c, handle);
        int r;

        if (!o)
                return reason_set(w, -ENOENT, "no allocation with handle 0x%llx", (unsigned long long)handle);
        if (o->kind != BROKER_KIND_DEVICE && o->kind != BROKER_KIND_HOST)
                return reason_set(w, -EINVAL, "only device and host allocations are mapped to GPUs this way");
        if (n == 0) {
                r = driver_mem_unmap_all(c->b->drv, o->mem);
        } else {
                r = broker_check_gpus(c->b, gpu_ids, n, w);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < n; i++)
                        if (!driver_mem_is_mapped(c->b->drv, o->mem, gpu_ids[i]))
                                return reason_set(w, -EINVAL, "the allocation is not mapped on GPU %u",
                                                  gpu_ids[i]);
                r = driver_mem_unmap(c->b->drv, o->mem, gpu_ids, n);
        }
        if (r < 0)
                return reason_set(w, r, "the driver refused to unmap the allocation: %s", strerror(-r));
        return 0;
}

bool broker_in_window(const BrokerClient *c, uint64_t va, uint64_t size)
{
        uint64_t lo = thunk_va_space_base(c->window), hi = thunk_va_space_limit(c->window);
        return va >= lo && size <= hi - lo && va - lo <= hi - lo - size;
}

Obj *broker_obj_at(const BrokerClient *c, uint64_t va)
{
        ThunkVaObject vo;
        const Obj *o = thunk_va_lookup(c->window, va, &vo) == 0 ? vo.data : NULL;
        return o && !o->pending ? (Obj *)o : NULL;
}

VmmMap *broker_map_at(const Obj *res, uint64_t va)
{
        ThunkVaObject vo;
        return thunk_va_lookup(res->maps, va, &vo) == 0 ? vo.data : NULL;
}

int broker_pointer_info(BrokerClient *c, uint64_t va, BrokerPtrInfo *ret, Reason *w)
{
        VmmMap *m = NULL;
        Obj *o;

        if (!broker_in_window(c, va, 1) && (o = broker_share_at(c, va)) != NULL)
                return broker_share_pointer_info(c, o, ret, w);
        if (!broker_in_window(c, va, 1))
                return reason_set(w, -EFAULT, "0x%llx is outside this client's VA window",
                                  (unsigned long long)va);
        o = broker_obj_at(c, va);
        if (!o)
                return reason_set(w, -ENOENT, "nothing is allocated at 0x%llx", (unsigned long long)va);
        if (o->kind == BROKER_KIND_RESERVATION && !(m = broker_map_at(o, va)))
                return reason_set(w, -ENOENT, "0x%llx is reserved but not mapped", (unsigned long long)va);
        /* written in place, the mapped GPUs up to their count: the array is most of the struct */
        ret->n_mapped = 0;
        if (m) {
                ret->handle = m->phys->client_refs ? m->phys->handle : 0;
                ret->kind = m->phys->kind;
                ret->gpu_id = m->phys->gpu_id;
                ret->base = m->va;
                ret->size = m->size;
                ret->flags = m->phys->flags;
                ret->cpu_accessible = m->cpu_access != BROKER_ACCESS_NONE;
                for (size_t i = 0; i < m->n_gem; i++)
                        ret->mapped[ret->n_mapped++] = m->gem[i].gpu_id;
        } else {
                ret->handle = o->handle;
                ret->kind = o->kind;
                ret->gpu_id = o->gpu_id;
                ret->base = o->va;
                ret->size = o->size;
                ret->flags = o->flags;
                ret->cpu_accessible = o->memfd >= 0 || (o->flags & BROKER_FLAG_HOST_VISIBLE);
                broker_mapped_gpus_into(c->b, o, ret->mapped, &ret->n_mapped);
        }
        return 0;
}

/* The VRAM @a's limits give it on broker GPU @i, no more than the GPU has. Under the account's lock. */
static uint64_t vram_allowance_locked(const Broker *b, const BrokerAccount *a, size_t i)
{
        uint64_t allow = b->gpu_vram[i];

        if (a->max_vram_gpu[i] < allow)
                allow = a->max_vram_gpu[i];
        if (a->max_vram < allow)
                allow = a->max_vram;
        return allow;
}

uint64_t broker_vram_allowance(const Broker *b, BrokerAccount *a, size_t gpu_index)
{
        uint64_t allow;

        if (gpu_index >= b->n_gpus)
                return 0;
        if (!a)
                return b->gpu_vram[gpu_index];
        broker_account_lock(a);
        allow = vram_allowance_locked(b, a, gpu_index);
        broker_account_unlock(a);
        return allow;
}

int broker_mem_info(BrokerClient *c, uint32_t gpu_id, BrokerGpuMem *out, size_t *ret_n, Reason *w)
{
        Broker *b = c->b;
        DriverCtx *ctx = c->ctx ? c->ctx : b->primary;
        size_t n = 0;

        if (gpu_id && broker_gpu_index(b, gpu_id) < 0)
                return reason_set(w, -ENODEV, "no GPU with id %u", gpu_id);
        for (size_t i = 0; i < b->n_gpus; i++) {
                uint64_t avail = 0;
                int r;

                if (gpu_id && b->gpu_ids[i] != gpu_id)
                        continue;
                r = driver_available_memory(b->drv, ctx, b->gpu_ids[i], &avail);
                if (r < 0)
                        return reason_set(w, r, "cannot read the available memory of GPU %u: %s",
                                          b->gpu_ids[i], strerror(-r));
                out[n].gpu_id = b->gpu_ids[i];
                out[n].total = b->gpu_vram[i];
                out[n].used = c->usage.vram_bytes[i];
                out[n].free = avail < out[n].total ? avail : out[n].total;
                if (c->acct) {
                        /* the class's allowance: its per-GPU and total VRAM limits, less what the class uses
                         */
                        BrokerAccount *a = c->acct;
                        broker_account_lock(a);
                        uint64_t vram = a->used.device_bytes + a->used.vmm_bytes;
                        uint64_t used_gpu = a->used.vram_bytes[i];
                        uint64_t left_gpu = used_gpu < a->max_vram_gpu[i] ? a->max_vram_gpu[i] - used_gpu : 0;
                        uint64_t left_all = vram < a->max_vram ? a->max_vram - vram : 0;
                        /* the same allowance as the topology files serve as the GPU's VRAM bank */
                        uint64_t allow = vram_allowance_locked(b, a, i);
                        if (!(__atomic_load_n(&a->allowed_gpus, __ATOMIC_RELAXED) & (1ull << i)))
                                allow = left_gpu = 0;
                        out[n].total = allow;
                        out[n].used = used_gpu;
                        if (left_gpu < out[n].free)
                                out[n].free = left_gpu;
                        if (left_all < out[n].free)
                                out[n].free = left_all;
                        broker_account_unlock(a);
                }
                n++;
        }
        *ret_n = n;
        return 0;
}

size_t broker_client_list(const BrokerClient *c, size_t *cursor, BrokerObjInfo *out, size_t cap)
{
        size_t n = 0, it = *cursor;
        Obj *o;

        while (n < cap && hashmap_next(&c->objs, &it, NULL, (void **)&o)) {
                BrokerObjInfo *i = &out[n++];
                /* Bin-packed by hand: clang-format puts a designated initializer one member to a line. */
                // clang-format off
                *i = (BrokerObjInfo){
                        .handle = o->handle, .kind = o->kind, .size = o->size, .gpu_id = o->gpu_id, .va = o->va,
                        .exports = o->exports
                };
                // clang-format on
                broker_mapped_gpus_into(c->b, o, i->mapped, &i->n_mapped);
        }
        *cursor = n == cap ? it : 0;
        return n;
}
