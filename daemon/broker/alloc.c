/* Device, host and managed memory allocated for a client: at once, or in steps for slow host memory. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker-private.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static uint64_t default_align(uint64_t size)
{
        uint64_t a = BROKER_PAGE_SIZE;
        /* like libhsakmt: grow with the size, up to 2 MiB, so large buffers can use large GPU pages */
        while (a < (2ull << 20) && size >= 2 * a)
                a <<= 1;
        return a;
}

static int check_size(uint64_t size, uint64_t window, uint64_t *ret_rounded, Reason *w)
{
        char b1[32];

        if (size == 0)
                return reason_set(w, -EINVAL, "size 0");
        if (size > UINT64_MAX - BROKER_PAGE_SIZE)
                return reason_set(w, -EOVERFLOW, "size %llu overflows", (unsigned long long)size);
        *ret_rounded = (size + BROKER_PAGE_SIZE - 1) & ~(BROKER_PAGE_SIZE - 1);
        if (*ret_rounded > window)
                return reason_set(w, -ENOMEM, "size %llu is larger than this client's %s VA window",
                                  (unsigned long long)size, broker_human(window, b1, sizeof(b1)));
        return 0;
}

/* Create the shared pages of host or managed memory and map them at va in the daemon. */
static int shared_pages(uint64_t va, uint64_t size, const char *name, int *ret_fd, Reason *w)
{
        int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        void *p;

        if (fd < 0)
                return reason_set(w, -errno, "memfd_create: %s", strerror(errno));
        /* sealed at its size: a client holding the fd cannot shrink it under the daemon and the importers;
         * open to one more seal, the write seal it takes when it is first handed out read-only
         * (broker_seal_read_only), which holds where mode 0400 does not: against a holder with
         * CAP_DAC_OVERRIDE opening it again writable through /proc */
        if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
            fchmod(fd, 0400) < 0) {
                int r = -errno;
                close(fd);
                return reason_set(w, r, "cannot size shared memory: %s", strerror(-r));
        }
        p = mmap((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
        if (p == MAP_FAILED) {
                int r = -errno;
                close(fd);
                broker_reserve_again(va, size);
                return reason_set(w, r, "cannot map shared memory: %s", strerror(-r));
        }
        *ret_fd = fd;
        return 0;
}

/* Is @node a NUMA node of this host? */
static bool host_has_node(int node)
{
        return node >= 0 && numa_available() >= 0 && node <= numa_max_node() &&
               numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node);
}

static int alloc_device(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, BrokerAllocResult *res, Reason *w)
{
        uint32_t gpu = a->gpu_id;
        const uint32_t *map = a->n_map_gpus ? a->map_gpus : &gpu;
        size_t n_map = a->n_map_gpus ? a->n_map_gpus : 1;
        DriverCtx *ctx;
        char b1[32];
        int r;

        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        r = driver_mem_alloc_vram(c->b->drv, ctx, gpu, o->va, o->size, a->flags, &o->mem);
        if (r == -ENOMEM)
                return reason_set(w, r, "GPU %u has no room for %s of VRAM", gpu,
                                  broker_human(o->size, b1, sizeof(b1)));
        if (r == -EOPNOTSUPP && driver_has(c->b->drv, DRIVER_CAP_CLIENT_MAPS))
                return reason_set(w, r,
                                  "the %s driver has no device memory with flags 0x%x (coherent, uncached "
                                  "and contiguous are AMD's kinds)",
                                  driver_name(c->b->drv), a->flags);
        if (r == -EOPNOTSUPP)
                return reason_set(w, r, "the driver cannot give contiguous VRAM (KFD: ABI 1.16)");
        if (r == -EINVAL && (a->flags & BROKER_FLAG_HOST_VISIBLE) &&
            driver_has(c->b->drv, DRIVER_CAP_CLIENT_MAPS))
                return reason_set(w, r, "the %s driver gives no CPU mapping of device memory",
                                  driver_name(c->b->drv));
        if (r == -EINVAL && (a->flags & BROKER_FLAG_HOST_VISIBLE))
                return reason_set(w, r, "GPU %u cannot give host-visible VRAM (small BAR)", gpu);
        if (r < 0)
                return reason_set(w, r, "the driver refused the allocation: %s", strerror(-r));
        r = driver_mem_map(c->b->drv, o->mem, map, n_map);
        if (r < 0) {
                (void)driver_mem_free(c->b->drv, o->mem);
                o->mem = NULL;
                return reason_set(w, r, "cannot map the allocation on the GPUs asked for: %s", strerror(-r));
        }
        if (driver_has(c->b->drv, DRIVER_CAP_CLIENT_MAPS))
                r = driver_mem_export(c->b->drv, o->mem, &res->import_fd);
        else if (a->flags & BROKER_FLAG_HOST_VISIBLE)
                r = driver_mem_export(c->b->drv, o->mem, &res->fd);
        if (r < 0) {
                broker_obj_mem_free(c->b, o);
                return reason_set(w, r,
                                  driver_has(c->b->drv, DRIVER_CAP_CLIENT_MAPS)
                                          ? "cannot export the allocation for the client to map: %s"
                                          : "cannot export the allocation for CPU access: %s",
                                  strerror(-r));
        }
        return 0;
}

/* Host memory, first step: the shared pages at the object's VA, bound to the NUMA node asked for. */
static int host_pages(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, Reason *w)
{
        Broker *b = c->b;
        uint32_t gpu = a->gpu_id ? a->gpu_id : b->gpu_ids[0];
        int node = a->numa_node;
        int r;

        if (node < -1)
                return reason_set(w, -EINVAL,
                                  "NUMA node %d: a node number, or -1 for the one nearest the GPU", node);
        if (node >= 0 && !host_has_node(node))
                return reason_set(w, -EINVAL, "NUMA node %d does not exist on this host", node);
        if (node < 0) {
                int nearest = b->gpu_numa[broker_gpu_index(b, gpu)];
                node = host_has_node(nearest) ? nearest : -1;
        }
        r = shared_pages(o->va, o->size, "gpumem-host", &o->memfd, w);
        if (r < 0)
                return r;
        if (node >= 0) {
                unsigned long mask[16] = {0};
                mask[node / (8 * sizeof(long))] |= 1ul << (node % (8 * sizeof(long)));
                if (mbind((void *)(uintptr_t)o->va, o->size, MPOL_BIND, mask, sizeof(mask) * 8,
                          MPOL_MF_STRICT) < 0) {
                        r = reason_set(w, -errno, "cannot bind the memory to NUMA node %d: %s", node,
                                       strerror(errno));
                        broker_drop_pages(c, o);
                        return r;
                }
        }
        o->numa_node = node;
        return 0;
}

/*
 * Second step, the slow one: pinned memory has every page faulted in now, on the chosen node. It touches
 * nothing but the object's own pages, so it may run on a worker thread. Returns 0 or a negative errno.
 */
static int host_populate(uint64_t va, uint64_t size)
{
        return madvise((void *)(uintptr_t)va, size, MADV_POPULATE_WRITE) < 0 ? -errno : 0;
}

/* Last step: register the populated pages with the driver, map them, and dup the fd for the client. On
 * failure the pages are gone too. */
static int host_register(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, int populated,
                         BrokerAllocResult *res, Reason *w)
{
        Broker *b = c->b;
        uint32_t gpu = a->gpu_id ? a->gpu_id : b->gpu_ids[0];
        int r = populated;

        if (r < 0) {
                reason_set(w, r, "cannot populate %llu bytes of host memory: %s", (unsigned long long)o->size,
                           strerror(-r));
                goto fail;
        }
        r = driver_mem_register_host(b->drv, gpu, o->va, o->size, a->flags, &o->mem);
        if (r < 0) {
                reason_set(w, r, "the driver refused to register host memory: %s", strerror(-r));
                goto fail;
        }
        if (a->n_map_gpus) {
                r = driver_mem_map(c->b->drv, o->mem, a->map_gpus, a->n_map_gpus);
        } else {
                /* every GPU the client's class may use */
                uint32_t ids[BROKER_MAX_GPUS];
                size_t n = broker_allowed_gpu_ids(c, ids);
                r = n ? driver_mem_map(c->b->drv, o->mem, ids, n) : 0;
        }
        if (r < 0) {
                reason_set(w, r, "cannot map host memory on the GPUs: %s", strerror(-r));
                (void)driver_mem_free(c->b->drv, o->mem);
                o->mem = NULL;
                goto fail;
        }
        r = broker_obj_dup_memfd(o, &res->fd, w);
        if (r < 0) {
                broker_obj_mem_free(c->b, o);
                goto fail;
        }
        return 0;
fail:
        broker_drop_pages(c, o);
        return r;
}

/*
 * Host memory in the client's own GPU VM (BROKER_FLAG_GTT): a GTT buffer of the client's context, which
 * its queues reach (a client context takes no registered pages, on the kernel as in the model). Its
 * dmabuf is the memory's file, as a memfd is for other host memory: the daemon maps it at the object's VA
 * and hands a duplicate to the client. The driver pins the pages; nothing is populated here.
 */
static int alloc_host_gtt(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, BrokerAllocResult *res,
                          Reason *w)
{
        Broker *b = c->b;
        uint32_t gpu = a->gpu_id ? a->gpu_id : b->gpu_ids[0];
        uint32_t ids[BROKER_MAX_GPUS];
        const uint32_t *map = a->map_gpus;
        size_t n = a->n_map_gpus;
        DriverCtx *ctx;
        void *p;
        int r;

        if (a->numa_node >= 0)
                return reason_set(w, -EINVAL, "GTT host memory is placed by the driver: no NUMA node");
        if (a->flags & BROKER_FLAG_READ_ONLY)
                return reason_set(w, -EINVAL, "GTT host memory is writable: its dmabuf maps it for the CPU");
        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        r = driver_mem_alloc_gtt(b->drv, ctx, gpu, o->va, o->size, a->flags & ~(uint32_t)BROKER_FLAG_GTT,
                                 &o->mem);
        if (r == -EOPNOTSUPP)
                return reason_set(w, r, "the driver has no GTT memory of a client's own");
        if (r < 0)
                return reason_set(w, r, "the driver refused the GTT allocation: %s", strerror(-r));
        if (!n) { /* every GPU the client's class may use */
                n = broker_allowed_gpu_ids(c, ids);
                map = ids;
        }
        r = n ? driver_mem_map(b->drv, o->mem, map, n) : 0;
        if (r < 0) {
                reason_set(w, r, "cannot map the GTT memory on the GPUs: %s", strerror(-r));
                goto fail_mem;
        }
        r = driver_mem_export(b->drv, o->mem, &o->memfd);
        if (r < 0) {
                reason_set(w, r, "cannot export the GTT memory for CPU access: %s", strerror(-r));
                goto fail_mem;
        }
        /* an SVM range's memory lies where the process has the range, outside the window the daemon keeps
         * free in its own address space: it is not mapped here */
        if (!o->outer) {
                p = mmap((void *)(uintptr_t)o->va, o->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                         o->memfd, 0);
                if (p == MAP_FAILED) {
                        r = reason_set(w, -errno, "cannot map the GTT memory here: %s", strerror(errno));
                        broker_reserve_again(o->va, o->size);
                        goto fail_fd;
                }
        }
        r = broker_obj_dup_memfd(o, &res->fd, w);
        if (r < 0) {
                if (!o->outer)
                        broker_unmap_shared(b, o->va, o->size);
                goto fail_fd;
        }
        return 0;
fail_fd:
        o->memfd = safe_close(o->memfd);
fail_mem:
        broker_obj_mem_free(b, o);
        return r;
}

static int alloc_host(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, BrokerAllocResult *res, Reason *w)
{
        int r;

        if (a->flags & BROKER_FLAG_GTT)
                return alloc_host_gtt(c, a, o, res, w);
        r = host_pages(c, a, o, w);

        if (r < 0)
                return r;
        return host_register(c, a, o, host_populate(o->va, o->size), res, w);
}

static int alloc_managed(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, BrokerAllocResult *res, Reason *w)
{
        Broker *b = c->b;
        int r;

        if (!driver_has(b->drv, DRIVER_CAP_MANAGED))
                return reason_set(w, -EOPNOTSUPP,
                                  "managed memory needs the driver's SVM API (KFD: ABI 1.5), which "
                                  "the %s driver has not",
                                  driver_name(b->drv));
        if (a->flags & ~(uint32_t)(BROKER_FLAG_COHERENT | BROKER_FLAG_READ_ONLY | BROKER_FLAG_EXECUTABLE |
                                   BROKER_FLAG_EXT_COHERENT))
                return reason_set(w, -EINVAL,
                                  "managed memory takes only coherent, ext-coherent, read-only and "
                                  "executable flags");
        r = shared_pages(o->va, o->size, "gpumem-managed", &o->memfd, w);
        if (r < 0)
                return r;
        r = driver_managed_register(b->drv, o->va, o->size, a->flags);
        if (r < 0) {
                reason_set(w, r,
                           r == -ENOMEM ? "the driver's system memory limit has no room for this range"
                                        : "the driver refused the managed range: %s",
                           strerror(-r));
                goto fail;
        }
        r = broker_obj_dup_memfd(o, &res->fd, w);
        if (r < 0)
                goto fail;
        return 0;
fail:
        broker_drop_pages(c, o);
        return r;
}

/* Check an allocation, reserve its quota-checked VA: the object, not published yet. */
static int alloc_prepare(BrokerClient *c, const BrokerAllocArgs *a, Obj **ret, Reason *w)
{
        uint64_t size = 0, align;
        Obj *o;
        int r;

        r = check_size(a->size, thunk_va_space_limit(c->window) - thunk_va_space_base(c->window), &size, w);
        if (r < 0)
                return r;
        r = broker_check_alignment(a->alignment, w);
        if (r < 0)
                return r;
        r = broker_check_flags(a->flags, w);
        if (r < 0)
                return r;
        if ((a->flags & BROKER_FLAG_GTT) && a->kind != BROKER_KIND_HOST)
                return reason_set(w, -EINVAL, "GTT is a flag of host memory");
        if (a->flags & BROKER_FLAG_SVM_RANGE) {
                uint64_t wb = thunk_va_space_base(c->window), wl = thunk_va_space_limit(c->window);
                if (!(a->flags & BROKER_FLAG_GTT) || !a->fixed_va)
                        return reason_set(w, -EINVAL,
                                          "an SVM range's memory is GTT host memory at a fixed address");
                if (!driver_has(c->b->drv, DRIVER_CAP_PRIVATE_VM))
                        return reason_set(w, -EOPNOTSUPP,
                                          "SVM ranges need a GPU VM per client (KFD: ABI 1.19)");
                if (a->fixed_va % BROKER_PAGE_SIZE || a->fixed_va > BROKER_SVM_LIMIT ||
                    size > BROKER_SVM_LIMIT - a->fixed_va)
                        return reason_set(w, -EINVAL,
                                          "0x%llx+0x%llx is no page-aligned range of user addresses",
                                          (unsigned long long)a->fixed_va, (unsigned long long)size);
                if (a->fixed_va < wl && a->fixed_va + size > wb)
                        return reason_set(w, -EINVAL, "0x%llx+0x%llx is in the window: allocate it there",
                                          (unsigned long long)a->fixed_va, (unsigned long long)size);
                if ((r = broker_client_outer(c, w)) < 0)
                        return r;
        }
        switch (a->kind) {
        case BROKER_KIND_DEVICE:
                if (broker_gpu_index(c->b, a->gpu_id) < 0)
                        return reason_set(w, -ENODEV, "no GPU with id %u", a->gpu_id);
                /* the driver's granularity (CUDA: 2 MiB), which is what the GPU spends and the class pays */
                if (size > UINT64_MAX - c->b->dev_gran)
                        return reason_set(w, -EOVERFLOW, "size %llu overflows", (unsigned long long)size);
                size = (size + c->b->dev_gran - 1) & ~(c->b->dev_gran - 1);
                break;
        case BROKER_KIND_HOST:
                if (a->gpu_id && broker_gpu_index(c->b, a->gpu_id) < 0)
                        return reason_set(w, -ENODEV, "no GPU with id %u", a->gpu_id);
                if (a->flags & (BROKER_FLAG_CONTIGUOUS | BROKER_FLAG_HOST_VISIBLE))
                        return reason_set(w, -EINVAL, "contiguous and host-visible are device-memory flags");
                break;
        case BROKER_KIND_MANAGED:
                if (a->n_map_gpus)
                        return reason_set(w, -EINVAL, "managed memory is mapped through its SVM attributes");
                break;
        default:
                return reason_set(w, -EINVAL, "memory kind %d cannot be allocated this way", (int)a->kind);
        }
        r = broker_check_gpus(c->b, a->map_gpus, a->n_map_gpus, w);
        if (r < 0)
                return r;
        if (a->gpu_id && (r = broker_gpu_allowed(c, a->gpu_id, w)) < 0)
                return r;
        if ((r = broker_gpus_allowed(c, a->map_gpus, a->n_map_gpus, w)) < 0)
                return r;
        r = broker_quota_check(c, a->kind, a->gpu_id, size,
                               a->kind != BROKER_KIND_DEVICE || broker_driver_file_at_alloc(c->b, a->flags),
                               w);
        if (r < 0)
                return r;

        o = broker_obj_new(a->kind);
        if (!o)
                return reason_set(w, -ENOMEM, "out of memory");
        /* GTT host memory: the daemon's dmabuf of it, and the driver's own file behind that */
        o->backing_fd =
                (a->kind == BROKER_KIND_DEVICE && broker_driver_file_at_alloc(c->b, a->flags)) ||
                (a->kind == BROKER_KIND_HOST && (a->flags & BROKER_FLAG_GTT) && broker_driver_holds_fd(c->b));
        o->size = size;
        o->gpu_id = a->kind == BROKER_KIND_MANAGED ? 0 : a->gpu_id;
        o->flags = a->flags;
        o->outer = (a->flags & BROKER_FLAG_SVM_RANGE) != 0;
        align = a->alignment ? a->alignment : default_align(size);
        if (a->kind == BROKER_KIND_DEVICE && align < c->b->dev_gran)
                align = c->b->dev_gran;
        if (o->outer) {
                r = thunk_va_alloc_fixed(c->outer, a->fixed_va, size, o);
                if (r == -EADDRINUSE)
                        reason_set(w, r, "0x%llx+0x%llx overlaps another SVM range of this client",
                                   (unsigned long long)a->fixed_va, (unsigned long long)size);
                else if (r < 0)
                        reason_set(w, r, "cannot place 0x%llx: %s", (unsigned long long)a->fixed_va,
                                   strerror(-r));
                o->va = a->fixed_va;
        } else {
                r = broker_take_va(c, size, align, a->fixed_va, o, &o->va, w);
        }
        if (r < 0) {
                free(o);
                return r;
        }
        *ret = o;
        return 0;
}

/*
 * Charge and publish the object once the memory is made (@r >= 0), or undo it all and give back its VA.
 * @charged: what was charged for it already (a pending allocation holds its quota while it is made), or
 * NULL.
 */
static int alloc_finish(BrokerClient *c, const BrokerAllocArgs *a, Obj *o, BrokerAllocResult res, int r,
                        const Charge *charged, BrokerAllocResult *ret, Reason *w)
{
        Charge taken = {0};
        bool paid = charged != NULL;

        if (charged)
                taken = *charged;
        o->pending = false;
        if (r >= 0) {
                if (!paid) {
                        taken = broker_obj_charge(o);
                        r = broker_charge_take(c, &taken, w);
                        paid = r >= 0;
                }
                if (r >= 0 && (r = broker_obj_publish(c, o)) < 0)
                        reason_set(w, r, "out of memory");
                if (r < 0) {
                        res.fd = safe_close(res.fd);
                        res.import_fd = safe_close(res.import_fd);
                        if (o->mem)
                                broker_obj_mem_free(c->b, o);
                        if (o->memfd >= 0)
                                broker_drop_pages(c, o);
                }
        }
        if (r < 0) {
                if (paid)
                        broker_charge_give(c, &taken);
                (void)thunk_va_free(broker_obj_space(c, o), o->va);
                free(o);
                return r;
        }
        if (o->kind == BROKER_KIND_HOST)
                o->gpu_id = a->gpu_id;
        if (res.fd >= 0)
                broker_note_file(c->b, o, res.fd);
        if (res.import_fd >= 0)
                broker_note_file(c->b, o, res.import_fd);
        res.handle = o->handle;
        res.va = o->va;
        res.size = o->size;
        *ret = res;
        return 0;
}

int broker_alloc(BrokerClient *c, const BrokerAllocArgs *a, BrokerAllocResult *ret, Reason *w)
{
        BrokerAllocResult res = {.fd = -1, .import_fd = -1};
        Obj *o;
        int r;

        r = alloc_prepare(c, a, &o, w);
        if (r < 0)
                return r;
        if (a->kind == BROKER_KIND_DEVICE)
                r = alloc_device(c, a, o, &res, w);
        else if (a->kind == BROKER_KIND_HOST)
                r = alloc_host(c, a, o, &res, w);
        else
                r = alloc_managed(c, a, o, &res, w);
        return alloc_finish(c, a, o, res, r, NULL, ret, w);
}

struct BrokerPending {
        BrokerClient *c;
        BrokerAllocArgs a;
        uint32_t map_gpus[BROKER_MAX_GPUS];
        Obj *o;
        Charge charged; /* what it holds of its class's quota while it is made */
        int populated;  /* 0, or the populate's negative errno */
        uint64_t done;  /* bytes populated so far, from the start */
};

bool broker_alloc_is_slow(const BrokerAllocArgs *a)
{
        return a->kind == BROKER_KIND_HOST && !(a->flags & BROKER_FLAG_GTT) &&
               a->size >= BROKER_SLOW_HOST_BYTES;
}

int broker_alloc_begin(BrokerClient *c, const BrokerAllocArgs *a, BrokerPending **ret, Reason *w)
{
        BrokerPending *p;
        Obj *o;
        int r;

        if (a->kind != BROKER_KIND_HOST)
                return reason_set(w, -EINVAL, "only host memory is allocated in steps");
        if (a->n_map_gpus > BROKER_MAX_GPUS)
                return reason_set(w, -E2BIG, "more GPUs than there are");
        p = calloc(1, sizeof(*p));
        if (!p)
                return reason_set(w, -ENOMEM, "out of memory");
        r = alloc_prepare(c, a, &o, w);
        if (r < 0) {
                free(p);
                return r;
        }
        /* found by nobody (pointer queries, frees, overlapping VMM) until it is published */
        o->pending = true;
        /* the quota is held from now, its memory file included: allocations made meanwhile see it taken */
        p->charged = broker_obj_charge(o);
        p->charged.held_fds = 1;
        r = broker_charge_take(c, &p->charged, w);
        if (r < 0) {
                (void)alloc_finish(c, a, o, (BrokerAllocResult){.fd = -1, .import_fd = -1}, r, NULL, NULL, w);
                free(p);
                return r;
        }
        r = host_pages(c, a, o, w);
        if (r < 0) {
                (void)alloc_finish(c, a, o, (BrokerAllocResult){.fd = -1, .import_fd = -1}, r, &p->charged,
                                   NULL, w);
                free(p);
                return r;
        }
        p->c = c;
        p->a = *a;
        if (a->n_map_gpus)
                memcpy(p->map_gpus, a->map_gpus, a->n_map_gpus * sizeof(*a->map_gpus));
        p->a.map_gpus = p->map_gpus;
        p->o = o;
        *ret = p;
        return 0;
}

void broker_pending_populate(BrokerPending *p)
{
        while (!broker_pending_populate_step(p, p->o->size))
                ;
}

bool broker_pending_populate_step(BrokerPending *p, uint64_t max)
{
        uint64_t n = p->o->size - p->done < max ? p->o->size - p->done : max;

        if (p->populated == 0)
                p->populated = host_populate(p->o->va + p->done, n);
        p->done += n;
        return p->populated < 0 || p->done == p->o->size;
}

int broker_alloc_end(BrokerPending *p, BrokerAllocResult *ret, Reason *w)
{
        BrokerAllocResult res = {.fd = -1, .import_fd = -1};
        BrokerClient *c = p->c;
        Obj *o = p->o;
        int r;

        /* the charge held is the object's (or goes back as it was taken, when registering fails) */
        r = host_register(c, &p->a, o, p->populated, &res, w);
        r = alloc_finish(c, &p->a, o, res, r, &p->charged, ret, w);
        free(p);
        return r;
}
