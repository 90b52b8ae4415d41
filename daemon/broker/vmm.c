/* VMM: VA reservations, physical handles, their mappings, and the GPUs' and the CPU's access to them. */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"
#include "macro.h"

int broker_vmm_release(BrokerClient *c, uint64_t handle, Reason *w)
{
        Obj *o = broker_obj_lookup(c, handle);
        int r;

        if (!o || (o->kind != BROKER_KIND_VMM && o->kind != BROKER_KIND_IMPORT))
                return reason_set(w, -ENOENT, "no VMM handle 0x%llx", (unsigned long long)handle);
        if (--o->client_refs > 0)
                return 0;
        if (o->map_refs > 0) {
                hashmap_remove(&c->objs, o->handle); /* it lives on for its mappings */
        } else if ((r = broker_phys_maybe_destroy(c, o, false, w)) < 0) {
                o->client_refs = 1; /* the driver keeps its memory: the handle stays as it was */
                return r;
        }
        broker_process_events(c->b);
        return 0;
}

static int check_gran(const char *what, uint64_t v, Reason *w)
{
        if (v % BROKER_GRANULARITY_MIN)
                return reason_set(w, -EINVAL, "%s %llu is not a multiple of the 4 KiB granularity", what,
                                  (unsigned long long)v);
        return 0;
}

/* A VMM size: not 0, in whole granules. */
static int check_size(uint64_t size, Reason *w)
{
        if (size == 0)
                return reason_set(w, -EINVAL, "size 0");
        return check_gran("size", size, w);
}

int broker_vmm_reserve(BrokerClient *c, uint64_t size, uint64_t alignment, uint64_t fixed_va,
                       uint64_t *ret_va, Reason *w)
{
        Charge ch;
        uint64_t align;
        Obj *o;
        int r;

        r = check_size(size, w);
        if (r < 0)
                return r;
        r = broker_check_alignment(alignment, w);
        if (r < 0)
                return r;
        if (size > thunk_va_space_limit(c->window) - thunk_va_space_base(c->window))
                return reason_set(w, -ENOMEM,
                                  "a reservation of %llu bytes is larger than this client's VA window",
                                  (unsigned long long)size);
        align = alignment ? alignment
                          : (size >= BROKER_GRANULARITY_RECOMM ? BROKER_GRANULARITY_RECOMM : 4096);
        o = broker_obj_new(BROKER_KIND_RESERVATION);
        if (!o)
                return reason_set(w, -ENOMEM, "out of memory");
        o->size = size;
        /* a reservation is a handle and no memory: nothing for the driver to do, so it is paid first */
        ch = broker_obj_charge(o);
        r = broker_charge_take(c, &ch, w);
        if (r < 0) {
                free(o);
                return r;
        }
        r = broker_take_va(c, size, align, fixed_va, o, &o->va, w);
        if (r < 0) {
                broker_charge_give(c, &ch);
                free(o);
                return r;
        }
        r = thunk_va_space_new(o->va, size, 0, &o->maps);
        if (r >= 0)
                r = broker_obj_publish(c, o);
        if (r < 0) {
                thunk_va_space_free(o->maps);
                (void)thunk_va_free(broker_obj_space(c, o), o->va);
                broker_charge_give(c, &ch);
                free(o);
                return reason_set(w, r, "out of memory");
        }
        *ret_va = o->va;
        return 0;
}

Obj *broker_reservation_at(const BrokerClient *c, uint64_t va)
{
        Obj *o = broker_obj_at(c, va);
        return o && o->kind == BROKER_KIND_RESERVATION ? o : NULL;
}

int broker_vmm_free(BrokerClient *c, uint64_t va, uint64_t size, Reason *w)
{
        Obj *o = broker_reservation_at(c, va);

        if (!o || o->va != va)
                return reason_set(w, -ENOENT, "no reservation starts at 0x%llx", (unsigned long long)va);
        if (size != o->size)
                return reason_set(w, -EINVAL, "the reservation at 0x%llx is %llu bytes, not %llu",
                                  (unsigned long long)va, (unsigned long long)o->size,
                                  (unsigned long long)size);
        if (thunk_va_space_count(o->maps) > 0)
                return reason_set(w, -EBUSY, "%zu mappings remain in the reservation at 0x%llx",
                                  thunk_va_space_count(o->maps), (unsigned long long)va);
        hashmap_remove(&c->objs, o->handle);
        (void)thunk_va_free(broker_obj_space(c, o), o->va);
        thunk_va_space_free(o->maps);
        broker_charge_obj_give(c, o);
        free(o);
        return 0;
}

int broker_vmm_create(BrokerClient *c, uint64_t size, uint32_t gpu_id, uint32_t flags, uint64_t *ret_handle,
                      int *ret_import_fd, Reason *w)
{
        DriverCtx *ctx;
        char b1[32];
        Obj *o;
        int r;

        r = check_size(size, w);
        if (r < 0)
                return r;
        if (size % c->b->dev_gran)
                return reason_set(w, -EINVAL,
                                  "size %llu is not a multiple of the driver's %llu-byte granularity",
                                  (unsigned long long)size, (unsigned long long)c->b->dev_gran);
        r = broker_gpu_allowed(c, gpu_id, w);
        if (r < 0)
                return r;
        r = broker_check_flags(flags, w);
        if (r < 0)
                return r;
        r = broker_quota_check(c, BROKER_KIND_VMM, gpu_id, size, broker_driver_file_at_alloc(c->b, flags), w);
        if (r < 0)
                return r;
        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        o = broker_obj_new(BROKER_KIND_VMM);
        if (!o)
                return reason_set(w, -ENOMEM, "out of memory");
        r = driver_mem_alloc_vram(c->b->drv, ctx, gpu_id, 0, size, flags, &o->mem);
        if (r < 0) {
                free(o);
                if (r == -ENOMEM)
                        return reason_set(w, r, "GPU %u has no room for %s of VRAM", gpu_id,
                                          broker_human(size, b1, sizeof(b1)));
                return reason_set(w, r, "the driver refused the allocation: %s", strerror(-r));
        }
        o->size = size;
        o->gpu_id = gpu_id;
        o->flags = flags;
        o->client_refs = 1;
        o->backing_fd = broker_driver_file_at_alloc(c->b, flags);
        *ret_import_fd = -1;
        if (driver_has(c->b->drv, DRIVER_CAP_CLIENT_MAPS) &&
            (r = driver_mem_export(c->b->drv, o->mem, ret_import_fd)) < 0) {
                (void)driver_mem_free(c->b->drv, o->mem);
                free(o);
                return reason_set(w, r, "cannot export the handle for the client to map: %s", strerror(-r));
        }
        r = broker_obj_add(c, o, w);
        if (r < 0) {
                *ret_import_fd = safe_close(*ret_import_fd);
                return r;
        }
        *ret_handle = o->handle;
        return 0;
}

uint64_t broker_granularity(const Broker *b, bool recommended)
{
        uint64_t g = recommended ? BROKER_GRANULARITY_RECOMM : BROKER_GRANULARITY_MIN;
        return b->dev_gran > g ? b->dev_gran : g;
}

int broker_vmm_map(BrokerClient *c, uint64_t va, uint64_t size, uint64_t offset, uint64_t handle, Reason *w)
{
        Obj *phys = broker_obj_lookup(c, handle), *res;
        VmmMap *m;
        int r;

        if (!phys || (phys->kind != BROKER_KIND_VMM && phys->kind != BROKER_KIND_IMPORT))
                return reason_set(w, -ENOENT, "no VMM handle 0x%llx", (unsigned long long)handle);
        if ((r = check_size(size, w)) < 0 || (r = check_gran("offset", offset, w)) < 0 ||
            (r = check_gran("address", va, w)) < 0)
                return r;
        if (offset > phys->size || size > phys->size - offset)
                return reason_set(w, -EINVAL, "offset %llu + size %llu is beyond the %llu-byte handle",
                                  (unsigned long long)offset, (unsigned long long)size,
                                  (unsigned long long)phys->size);
        if (!broker_in_window(c, va, size))
                return reason_set(w, -EINVAL, "0x%llx+0x%llx is outside this client's VA window",
                                  (unsigned long long)va, (unsigned long long)size);
        res = broker_reservation_at(c, va);
        if (!res || va + size > res->va + res->size)
                return reason_set(w, -EINVAL, "0x%llx+0x%llx is not inside one VA reservation",
                                  (unsigned long long)va, (unsigned long long)size);
        /* the daemon keeps a record per mapping: it costs a handle like any object */
        r = broker_charge_take(c, &(Charge){.objects = 1}, w);
        if (r < 0)
                return r;
        m = calloc(1, sizeof(*m));
        if (!m) {
                broker_charge_give(c, &(Charge){.objects = 1});
                return reason_set(w, -ENOMEM, "out of memory");
        }
        m->res = res;
        m->phys = phys;
        m->va = va;
        m->size = size;
        m->offset = offset;
        r = thunk_va_alloc_fixed(res->maps, va, size, m);
        if (r < 0) {
                free(m);
                broker_charge_give(c, &(Charge){.objects = 1});
                if (r == -EADDRINUSE)
                        return reason_set(w, r, "0x%llx+0x%llx overlaps an existing mapping",
                                          (unsigned long long)va, (unsigned long long)size);
                return reason_set(w, r, "cannot record the mapping: %s", strerror(-r));
        }
        phys->map_refs++;
        return 0;
}

static GemGrant *grant_of(VmmMap *m, uint32_t gpu_id)
{
        return ARRAY_FIND(m->gem, m->n_gem, gpu_id, gpu_id);
}

static void grant_remove(VmmMap *m, GemGrant *g)
{
        *g = m->gem[--m->n_gem];
}

/* Take away every GPU's access to a mapping. Every grant is tried; the ones the driver refused to drop stay
 * recorded, and the first error is returned. */
int broker_map_revoke_all(Broker *b, VmmMap *m)
{
        size_t kept = 0;
        int err = 0;

        for (size_t i = 0; i < m->n_gem; i++) {
                int r = driver_revoke(b->drv, m->gem[i].m);
                if (r < 0) {
                        err = err ? err : r;
                        m->gem[kept++] = m->gem[i];
                }
        }
        m->n_gem = kept;
        return err;
}

/*
 * Drop mapping @m (its GPU access gone already), and its handle where nothing else keeps that. Where the
 * driver refuses to free the handle's memory, the mapping and the handle stay and the error is returned,
 * except at the client's teardown (@teardown).
 */
int broker_map_destroy(BrokerClient *c, VmmMap *m, bool teardown, Reason *w)
{
        Obj *phys = m->phys;
        int r;

        phys->map_refs--;
        r = broker_phys_maybe_destroy(c, phys, teardown, w);
        if (r < 0) {
                phys->map_refs++;
                return r;
        }
        (void)thunk_va_free(m->res->maps, m->va);
        free(m);
        broker_charge_give(c, &(Charge){.objects = 1});
        return 0;
}

/*
 * The mappings of one reservation that exactly cover [va, va+size): the range must start and end on mapping
 * boundaries and cut none. Gaps between mappings are fine.
 */
static int covered_maps(BrokerClient *c, uint64_t va, uint64_t size, VmmMap **out, size_t cap, size_t *ret_n,
                        Reason *w)
{
        Obj *res;
        size_t n = 0;
        uint64_t end;

        if (size == 0)
                return reason_set(w, -EINVAL, "size 0");
        if (!broker_in_window(c, va, size))
                return reason_set(w, -EINVAL, "0x%llx+0x%llx is outside this client's VA window",
                                  (unsigned long long)va, (unsigned long long)size);
        res = broker_reservation_at(c, va);
        end = va + size;
        if (!res || end > res->va + res->size)
                return reason_set(w, -EINVAL, "0x%llx+0x%llx is not inside one VA reservation",
                                  (unsigned long long)va, (unsigned long long)size);
        for (uint64_t at = va; at < end;) {
                ThunkVaObject vo;
                if (thunk_va_next(res->maps, at, &vo) < 0 || vo.start >= end)
                        break;
                VmmMap *m = vo.data;
                if (m->va < va)
                        break; /* unreachable: next() starts at va */
                if (m->va + m->size > end)
                        return reason_set(w, -EINVAL, "0x%llx+0x%llx cuts the mapping at 0x%llx",
                                          (unsigned long long)va, (unsigned long long)size,
                                          (unsigned long long)m->va);
                if (n == cap)
                        return reason_set(w, -E2BIG, "more than %zu mappings in one call", cap);
                out[n++] = m;
                at = m->va + m->size;
        }
        {
                /* a mapping that starts before va and reaches into the range is cut too */
                VmmMap *first = broker_map_at(res, va);
                if (first && first->va != va)
                        return reason_set(w, -EINVAL,
                                          "0x%llx is inside the mapping at 0x%llx, not at its start",
                                          (unsigned long long)va, (unsigned long long)first->va);
        }
        if (n == 0)
                return reason_set(w, -EINVAL, "nothing is mapped in 0x%llx+0x%llx", (unsigned long long)va,
                                  (unsigned long long)size);
        *ret_n = n;
        return 0;
}

int broker_vmm_unmap(BrokerClient *c, uint64_t va, uint64_t size, Reason *w)
{
        VmmMap *maps[1024];
        size_t n = 0;
        int r;

        r = covered_maps(c, va, size, maps, sizeof(maps) / sizeof(maps[0]), &n, w);
        if (r < 0)
                return r;
        /* mapping by mapping: where the driver refuses one, those before it are gone (their refunds are
         * taken below), it and those after it stay (docs/policy.md) */
        for (size_t i = 0; i < n && r >= 0; i++) {
                r = broker_map_revoke_all(c->b, maps[i]);
                if (r < 0)
                        r = reason_set(w, r, "the driver refused to unmap 0x%llx: %s",
                                       (unsigned long long)maps[i]->va, strerror(-r));
                else
                        r = broker_map_destroy(c, maps[i], false, w);
        }
        broker_process_events(c->b);
        return r < 0 ? r : 0;
}

typedef struct Undo {
        VmmMap *m;
        uint32_t gpu_id;
        int old_access;
} Undo;

/* Set one GPU's access to a mapping: revoke the old grant, then add the new one. */
int broker_set_gpu_access(BrokerClient *c, DriverCtx *ctx, VmmMap *m, uint32_t gpu_id, int access, Reason *w)
{
        GemGrant *g = grant_of(m, gpu_id);
        int r, taken;

        if (g) {
                r = driver_revoke(c->b->drv, g->m);
                if (r < 0)
                        return reason_set(w, r,
                                          "the driver refused to take GPU %u's access to 0x%llx away: %s",
                                          gpu_id, (unsigned long long)m->va, strerror(-r));
                grant_remove(m, g);
        }
        if (access == BROKER_ACCESS_NONE)
                return 0;
        if (m->n_gem == BROKER_MAX_GPUS)
                return reason_set(w, -E2BIG, "0x%llx is granted to %d GPUs already, the most",
                                  (unsigned long long)m->va, BROKER_MAX_GPUS);
        DriverGrant *gm = NULL;
        /* a grant goes through a dmabuf of the memory (KFD: export, then PRIME import): the fd it may
         * cost is paid first */
        taken = broker_export_fd_take(c, m->phys, w);
        if (taken < 0)
                return taken;
        r = driver_grant(c->b->drv, ctx, m->phys->mem, gpu_id, m->va, m->offset, m->size, access,
                         (m->phys->flags & BROKER_FLAG_EXECUTABLE) != 0, &gm);
        broker_export_fd_end(c, m->phys, taken, r >= 0);
        if (r < 0)
                return reason_set(w, r, "the driver refused GPU %u access to 0x%llx: %s", gpu_id,
                                  (unsigned long long)m->va, strerror(-r));
        m->gem[m->n_gem++] = (GemGrant){gpu_id, access, gm};
        return 0;
}

int broker_vmm_set_access(BrokerClient *c, uint64_t va, uint64_t size, const BrokerAccess *d, size_t n,
                          BrokerCpuMap *cpu, size_t *ret_n_cpu, Reason *w)
{
        VmmMap *maps[256];
        size_t n_maps = 0, n_cpu = 0, n_undo = 0;
        Undo *undo = NULL;
        const BrokerAccess *cpu_desc = NULL;
        DriverCtx *ctx;
        bool any_gpu = false;
        int r;

        if (n == 0)
                return reason_set(w, -EINVAL, "no access descriptor");
        for (size_t i = 0; i < n; i++) {
                if (d[i].access != BROKER_ACCESS_NONE && d[i].access != BROKER_ACCESS_READ &&
                    d[i].access != BROKER_ACCESS_READ_WRITE)
                        return reason_set(w, -EINVAL, "access %d is not none, read or read-write",
                                          d[i].access);
                if (d[i].gpu_id) {
                        /* revoking needs no permission for the GPU, only that it exists */
                        int r0 = d[i].access == BROKER_ACCESS_NONE
                                         ? (broker_gpu_index(c->b, d[i].gpu_id) < 0
                                                    ? reason_set(w, -ENODEV, "no GPU with id %u", d[i].gpu_id)
                                                    : 0)
                                         : broker_gpu_allowed(c, d[i].gpu_id, w);
                        if (r0 < 0)
                                return r0;
                }
                for (size_t k = 0; k < i; k++)
                        if (d[k].gpu_id == d[i].gpu_id)
                                return reason_set(w, -EINVAL, "location %u given twice", d[i].gpu_id);
                if (d[i].gpu_id == 0)
                        cpu_desc = &d[i];
                else
                        any_gpu = true;
        }
        if (!broker_in_window(c, va, 1) && broker_share_at(c, va))
                return broker_share_set_access(c, broker_share_at(c, va), d, n, w);
        if (cpu_desc && cpu_desc->access != BROKER_ACCESS_NONE &&
            driver_has(c->b->drv, DRIVER_CAP_CLIENT_MAPS))
                return reason_set(w, -EOPNOTSUPP,
                                  "the %s driver gives no CPU access to device memory: copy through the GPU",
                                  driver_name(c->b->drv));
        if (any_gpu && !driver_has(c->b->drv, DRIVER_CAP_VA_GRANTS))
                return reason_set(
                        w, -EOPNOTSUPP,
                        "the driver cannot grant GPU access to VMM mappings (KFD: ABI 1.15, GEM_VA)");
        r = covered_maps(c, va, size, maps, sizeof(maps) / sizeof(maps[0]), &n_maps, w);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n_maps; i++)
                for (size_t k = 0; k < n; k++)
                        if (d[k].access == BROKER_ACCESS_READ_WRITE && broker_obj_read_only(maps[i]->phys))
                                return reason_set(
                                        w, -EACCES, "0x%llx maps read-only memory: %s may only read it",
                                        (unsigned long long)maps[i]->va, d[k].gpu_id ? "a GPU" : "the CPU");
        if (cpu_desc && cpu_desc->access != BROKER_ACCESS_NONE && n_maps > BROKER_MAX_CPU_MAPS)
                return reason_set(w, -E2BIG, "CPU access is granted on at most %d mappings per call",
                                  BROKER_MAX_CPU_MAPS);
        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        undo = calloc(n_maps * n + 1, sizeof(*undo));
        if (!undo)
                return reason_set(w, -ENOMEM, "out of memory");

        for (size_t i = 0; i < n_maps; i++) {
                for (size_t k = 0; k < n; k++) {
                        GemGrant *g;
                        int old;
                        if (d[k].gpu_id == 0)
                                continue;
                        g = grant_of(maps[i], d[k].gpu_id);
                        old = g ? g->access : BROKER_ACCESS_NONE;
                        if (old == d[k].access)
                                continue;
                        r = broker_set_gpu_access(c, ctx, maps[i], d[k].gpu_id, d[k].access, w);
                        if (r < 0) {
                                /* the old grant was dropped before the new one failed: put it back too */
                                if (old != BROKER_ACCESS_NONE && !grant_of(maps[i], d[k].gpu_id))
                                        undo[n_undo++] = (Undo){maps[i], d[k].gpu_id, old};
                                goto rollback;
                        }
                        undo[n_undo++] = (Undo){maps[i], d[k].gpu_id, old};
                }
        }
        if (cpu_desc && cpu_desc->access != BROKER_ACCESS_NONE) {
                for (size_t i = 0; i < n_maps; i++) {
                        int fd = -1, taken = broker_export_fd_take(c, maps[i]->phys, w);
                        if (taken < 0) {
                                r = taken;
                                goto rollback;
                        }
                        r = driver_mem_export(c->b->drv, maps[i]->phys->mem, &fd);
                        broker_export_fd_end(c, maps[i]->phys, taken, r >= 0);
                        if (r < 0) {
                                reason_set(w, r, "cannot export 0x%llx for CPU access: %s",
                                           (unsigned long long)maps[i]->va, strerror(-r));
                                goto rollback;
                        }
                        /* a read grant hands out a file that cannot be mapped writable (the client's
                         * own: it is not sealed); memory sealed read-only takes no writable mapping */
                        if (cpu_desc->access != BROKER_ACCESS_READ_WRITE)
                                r = broker_make_read_only(&fd, w);
                        else if ((r = broker_check_writable(fd, w)) < 0)
                                safe_close(fd);
                        if (r < 0)
                                goto rollback;
                        broker_note_file(c->b, maps[i]->phys, fd);
                        cpu[n_cpu].fd = fd;
                        cpu[n_cpu].va = maps[i]->va;
                        cpu[n_cpu].size = maps[i]->size;
                        cpu[n_cpu].offset = maps[i]->offset;
                        cpu[n_cpu].prot_write = cpu_desc->access == BROKER_ACCESS_READ_WRITE;
                        n_cpu++;
                }
        }
        if (cpu_desc)
                for (size_t i = 0; i < n_maps; i++)
                        maps[i]->cpu_access = cpu_desc->access;
        free(undo);
        *ret_n_cpu = n_cpu;
        return 0;

rollback:
        while (n_cpu > 0) {
                n_cpu--;
                cpu[n_cpu].fd = safe_close(cpu[n_cpu].fd);
        }
        while (n_undo > 0) {
                Undo *u = &undo[--n_undo];
                Reason ignored = {""}; /* the first failure is the one reported */
                (void)broker_set_gpu_access(c, ctx, u->m, u->gpu_id, u->old_access, &ignored);
        }
        free(undo);
        return r;
}

static VmmMap *mapping_at(const BrokerClient *c, uint64_t va)
{
        Obj *res = broker_in_window(c, va, 1) ? broker_reservation_at(c, va) : NULL;
        return res ? broker_map_at(res, va) : NULL;
}

int broker_vmm_get_access(BrokerClient *c, uint64_t va, uint32_t gpu_id, int *ret_access, Reason *w)
{
        VmmMap *m = mapping_at(c, va);
        GemGrant *g;

        if (gpu_id && broker_gpu_index(c->b, gpu_id) < 0)
                return reason_set(w, -ENODEV, "no GPU with id %u", gpu_id);
        if (!m && !broker_in_window(c, va, 1) && broker_share_at(c, va))
                return broker_share_get_access(c, broker_share_at(c, va), gpu_id, ret_access, w);
        if (!m)
                return reason_set(w, -EINVAL, "nothing is mapped at 0x%llx", (unsigned long long)va);
        if (gpu_id == 0) {
                *ret_access = m->cpu_access;
                return 0;
        }
        g = grant_of(m, gpu_id);
        *ret_access = g ? g->access : BROKER_ACCESS_NONE;
        return 0;
}

int broker_vmm_retain(BrokerClient *c, uint64_t va, uint64_t *ret_handle, Reason *w)
{
        VmmMap *m = mapping_at(c, va);
        Obj *phys;
        int r;

        if (!m)
                return reason_set(w, -EINVAL, "nothing is mapped at 0x%llx", (unsigned long long)va);
        phys = m->phys;
        if (phys->client_refs == 0) {
                /* released but still mapped: the handle becomes nameable again */
                r = hashmap_put(&c->objs, phys->handle, phys);
                if (r < 0)
                        return reason_set(w, r, "out of memory");
        }
        phys->client_refs++;
        *ret_handle = phys->handle;
        return 0;
}

int broker_vmm_properties(BrokerClient *c, uint64_t handle, BrokerProps *ret, Reason *w)
{
        Obj *o = broker_obj_lookup(c, handle);

        if (!o || o->kind == BROKER_KIND_RESERVATION)
                return reason_set(w, -ENOENT, "no handle 0x%llx", (unsigned long long)handle);
        *ret = (BrokerProps){o->kind, o->gpu_id, o->size, o->flags};
        return 0;
}
