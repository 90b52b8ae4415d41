/* The software KFD's render nodes: DRM files, GEM handles, PRIME, GEM_MMAP and GEM_VA. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "kfd-compat.h"
#include "model-private.h"

/* ------------------------------------------------------------------ render files */

static ModelGem *file_gem(ModelFile *f, uint32_t handle)
{
        for (size_t i = 0; i < f->n_gems; i++)
                if (f->gems[i].handle == handle)
                        return &f->gems[i];
        return NULL;
}

/* Drops the GEM handle at @i; its GEM_VA mappings in this file's VM go with it, as when amdgpu closes a
 * GEM object in a file. */
static void file_gem_close_at(ThunkModel *m, ModelFile *f, size_t i)
{
        ModelBuf *b = f->gems[i].buf;

        for (ModelMapping *mp = model_vm_first_after(&f->vm, 0), *next; mp; mp = next) {
                next = model_vm_next(&f->vm, mp);
                if (!mp->mem && mp->buf == b)
                        model_vm_remove(&f->vm, mp);
        }
        f->gems[i] = f->gems[--f->n_gems];
        MODEL_COUNT(m->cnt.gem_handles, -1);
        model_buf_unref(m, b);
}

void model_file_unref(ThunkModel *m, ModelFile *f)
{
        if (!f || --f->refs > 0)
                return;
        while (f->n_gems)
                file_gem_close_at(m, f, f->n_gems - 1);
        model_buf_disallow(m, f);
        for (ModelFile **p = &m->files; *p; p = &(*p)->next)
                if (*p == f) {
                        *p = f->next;
                        break;
                }
        free(f->gems);
        model_vm_clear(&f->vm);
        free(f);
}

/* ------------------------------------------------------------------ DRM handlers (render fds) */

int model_drm_gem_close(Call *c)
{
        struct drm_gem_close *a = c->arg;

        for (size_t i = 0; i < c->file->n_gems; i++)
                if (c->file->gems[i].handle == a->handle) {
                        file_gem_close_at(c->m, c->file, i);
                        return 0;
                }
        return -EINVAL;
}

static int gem_handle_for(ThunkModel *m, ModelFile *f, ModelBuf *b, bool read_only, uint32_t *ret)
{
        uint32_t h = 1;

        for (size_t i = 0; i < f->n_gems; i++)
                if (f->gems[i].buf == b) {
                        f->gems[i].read_only &= read_only; /* a writable fd of it makes it writable */
                        *ret = f->gems[i].handle;
                        return 0;
                }
        /* lowest free handle >= 1, like the DRM idr */
        while (file_gem(f, h))
                h++;
        if (ARRAY_RESERVE(f->gems, f->cap_gems, f->n_gems + 1, 8) < 0 || model_buf_allow(b, f) < 0)
                return -ENOMEM;
        f->gems[f->n_gems].handle = h;
        f->gems[f->n_gems].buf = b;
        f->gems[f->n_gems].read_only = read_only;
        f->n_gems++;
        MODEL_COUNT(m->cnt.gem_handles, 1);
        b->refs++;
        *ret = h;
        return 0;
}

int model_drm_prime_fd_to_handle(Call *c)
{
        struct drm_prime_handle *a = c->arg;
        int err = 0;
        ModelBuf *b = model_buf_by_fd(c->m, a->fd, &err);

        if (!b)
                return err;
        return gem_handle_for(c->m, c->file, b, model_fd_read_only(a->fd), &a->handle);
}

int model_drm_prime_handle_to_fd(Call *c)
{
        struct drm_prime_handle *a = c->arg;
        ModelGem *g = file_gem(c->file, a->handle);
        int fd, r;

        if (a->flags & ~(uint32_t)(DRM_CLOEXEC | DRM_RDWR))
                return -EINVAL;
        if (!g)
                return -ENOENT;
        r = model_buf_export_fd(c->m, g->buf, (a->flags & DRM_RDWR) != 0, a->flags, &fd);
        if (r < 0)
                return r;
        a->fd = fd;
        return 0;
}

int model_drm_amdgpu_gem_mmap(Call *c)
{
        union drm_amdgpu_gem_mmap *a = c->arg;
        ModelGem *g = file_gem(c->file, a->in.handle);

        if (!g)
                return -ENOENT;
        if (g->buf->type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                return -EPERM;
        a->out.addr_ptr = g->buf->mmap_offset;
        return 0;
}

int model_drm_amdgpu_gem_va(Call *c)
{
        struct drm_amdgpu_gem_va *a = c->arg;
        ModelFile *f = c->file;
        const uint32_t valid = AMDGPU_VM_DELAY_UPDATE | AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE |
                               AMDGPU_VM_PAGE_EXECUTABLE | AMDGPU_VM_MTYPE_MASK;
        uint64_t end = a->va_address + a->map_size;
        ModelGem *g = NULL;

        /* before 1.15 KFD did not manage GEM_VA mappings in a compute VM */
        if (f->compute_ctx && c->m->minor < 15)
                return -EINVAL;
        if (a->va_address < MODEL_GPUVM_BASE)
                return -EINVAL;
        if (end < a->va_address || end > MODEL_VM_END)
                return -EINVAL;
        if (a->flags & ~valid)
                return -EINVAL;
        switch (a->operation) {
        case AMDGPU_VA_OP_MAP:
        case AMDGPU_VA_OP_UNMAP:
        case AMDGPU_VA_OP_CLEAR:
        case AMDGPU_VA_OP_REPLACE:
                break;
        default:
                return -EINVAL;
        }
        if (a->operation != AMDGPU_VA_OP_CLEAR) {
                g = file_gem(f, a->handle);
                if (!g)
                        return -ENOENT;
        }
        if ((a->va_address | a->map_size | a->offset_in_bo) & (MODEL_PAGE - 1))
                return -EINVAL;
        if (a->operation == AMDGPU_VA_OP_UNMAP) {
                /* the exact start of a mapping of this handle's buffer: the first mapping to end after it */
                ModelMapping *mp = model_vm_first_after(&f->vm, a->va_address);

                if (!mp || mp->mem || mp->buf != g->buf || mp->start != a->va_address)
                        return -ENOENT;
                model_vm_remove(&f->vm, mp);
                return 0;
        }
        if (a->map_size == 0)
                return -EINVAL;
        if (a->operation == AMDGPU_VA_OP_MAP || a->operation == AMDGPU_VA_OP_REPLACE) {
                if (a->offset_in_bo + a->map_size < a->offset_in_bo ||
                    a->offset_in_bo + a->map_size > g->buf->size)
                        return -EINVAL;
                /* as amdgpu refuses a writable mapping of a read-only BO */
                if ((a->flags & AMDGPU_VM_PAGE_WRITEABLE) &&
                    (g->read_only || !(g->buf->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)))
                        return -EPERM;
        }
        if (a->operation == AMDGPU_VA_OP_CLEAR || a->operation == AMDGPU_VA_OP_REPLACE) {
                /* trim GEM mappings out of [va, end); a KFD mapping in the way is a conflict */
                ModelMapping *mp, *next;

                for (mp = model_vm_first_after(&f->vm, a->va_address); mp && mp->start < end;
                     mp = model_vm_next(&f->vm, mp))
                        if (mp->mem)
                                return -EINVAL;
                for (mp = model_vm_first_after(&f->vm, a->va_address); mp && mp->start < end; mp = next) {
                        next = model_vm_next(&f->vm, mp);
                        if (mp->start < a->va_address && mp->end > end) {
                                ModelMapping tail = *mp;
                                uint64_t old_end = mp->end;

                                tail.offset += end - mp->start;
                                tail.start = end;
                                mp->end = a->va_address;
                                if (model_vm_insert(&f->vm, &tail) < 0) {
                                        mp->end = old_end;
                                        return -ENOMEM;
                                }
                                break;
                        }
                        if (mp->start >= a->va_address && mp->end <= end) {
                                model_vm_remove(&f->vm, mp);
                                continue;
                        }
                        if (mp->start < a->va_address) {
                                mp->end = a->va_address;
                        } else {
                                mp->offset += end - mp->start;
                                mp->start = end;
                        }
                }
                if (a->operation == AMDGPU_VA_OP_CLEAR)
                        return 0;
        }
        {
                ModelMapping mp = {.start = a->va_address,
                                   .end = end,
                                   .buf = g->buf,
                                   .offset = a->offset_in_bo,
                                   .gem_flags = a->flags};

                return model_vm_insert(&f->vm, &mp);
        }
}
