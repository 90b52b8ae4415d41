/* The software KFD's memory: accounting, buffers, GPU VMs and the memory ioctls (see docs/thunk-model.md). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kfd-compat.h"
#include "model-private.h"

/* ------------------------------------------------------------------ accounting (kfd-abi.md §6) */

int model_charge(ThunkModel *m, int gpu, uint32_t type, uint64_t size)
{
        uint64_t sys = 0, ttm = 0, vram = 0;

        if (type == KFD_IOC_ALLOC_MEM_FLAGS_GTT) {
                sys = size;
                ttm = size;
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_VRAM) {
                vram = size;
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                sys = size;
        }
        if ((uint64_t)m->system_used + sys > m->system_limit || (uint64_t)m->ttm_used + ttm > m->ttm_limit)
                return -ENOMEM;
        if (vram) {
                ModelGpu *g = &m->gpus[gpu];
                uint64_t limit = g->vram_size > m->pt_reserve ? g->vram_size - m->pt_reserve : 0;

                if ((uint64_t)g->vram_used + vram > limit)
                        return -ENOMEM;
                g->vram_used += vram;
                g->vram_used_aligned += (vram + MODEL_2M - 1) & ~(MODEL_2M - 1);
        }
        m->system_used += sys;
        m->ttm_used += ttm;
        return 0;
}

void model_uncharge(ThunkModel *m, int gpu, uint32_t type, uint64_t size)
{
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_GTT) {
                m->system_used -= size;
                m->ttm_used -= size;
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_VRAM) {
                m->gpus[gpu].vram_used -= size;
                m->gpus[gpu].vram_used_aligned -= (size + MODEL_2M - 1) & ~(MODEL_2M - 1);
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                m->system_used -= size;
        }
}

static uint64_t available_memory(const ThunkModel *m, int gpu)
{
        const ModelGpu *g = &m->gpus[gpu];
        int64_t avail;

        if (g->apu) {
                int64_t sys = (int64_t)m->system_limit - m->system_used;
                int64_t ttm = (int64_t)m->ttm_limit - m->ttm_used;

                avail = sys < ttm ? sys : ttm;
                if (avail < 0)
                        return 0;
                return (uint64_t)avail & ~(MODEL_PAGE - 1);
        }
        avail = (int64_t)g->vram_size - (int64_t)g->vram_used_aligned - (int64_t)m->pt_reserve;
        if (avail < 0)
                return 0;
        return (uint64_t)avail & ~(MODEL_2M - 1);
}

/* ------------------------------------------------------------------ buffers */

int model_buf_allow(ModelBuf *b, ModelFile *f)
{
        ModelFile **n;

        for (size_t i = 0; i < b->n_allowed; i++)
                if (b->allowed[i] == f)
                        return 0;
        n = realloc(b->allowed, (b->n_allowed + 1) * sizeof(*n));
        if (!n)
                return -ENOMEM;
        n[b->n_allowed++] = f;
        b->allowed = n;
        return 0;
}

void model_buf_disallow(ThunkModel *m, ModelFile *f)
{
        for (ModelBuf *b = m->bufs; b; b = b->next)
                for (size_t i = 0; i < b->n_allowed; i++)
                        if (b->allowed[i] == f) {
                                b->allowed[i] = b->allowed[--b->n_allowed];
                                break;
                        }
}

static void buf_link(ThunkModel *m, ModelBuf *b)
{
        b->next = m->bufs;
        if (b->next)
                b->next->pprev = &b->next;
        b->pprev = &m->bufs;
        m->bufs = b;
}

static int buf_new(ThunkModel *m, int owner, uint32_t type, uint32_t flags, uint64_t size, ModelBuf **ret)
{
        ModelBuf *b = calloc(1, sizeof(*b));
        struct stat st;
        int r;

        if (!b)
                return -ENOMEM;
        b->memfd = -1;
        b->refs = 1;
        b->size = size;
        b->type = type;
        b->flags = flags;
        b->owner = owner;
        if (type != KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                /* sealed at its size: whoever holds an exported fd can map it, never resize it under the
                 * others (a shrink would turn their pages into SIGBUS) */
                b->memfd = memfd_create("gpumem-bo", MFD_CLOEXEC | MFD_ALLOW_SEALING);
                if (b->memfd < 0 || ftruncate(b->memfd, (off_t)size) < 0 ||
                    fcntl(b->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
                    fstat(b->memfd, &st) < 0) {
                        r = -errno;
                        goto fail;
                }
                b->dev = st.st_dev;
                b->ino = st.st_ino;
        }
        b->mmap_offset = m->next_mmap_offset;
        m->next_mmap_offset += size + MODEL_PAGE; /* one page of space between objects */
        buf_link(m, b);
        *ret = b;
        return 0;
fail:
        if (b->memfd >= 0)
                close(b->memfd);
        free(b);
        return r;
}

void model_buf_unref(ThunkModel *m, ModelBuf *b)
{
        if (!b || --b->refs > 0)
                return;
        *b->pprev = b->next;
        if (b->next)
                b->next->pprev = b->pprev;
        if (b->charge_type)
                model_uncharge(m, b->owner, b->charge_type, b->charge);
        if (b->memfd >= 0)
                close(b->memfd);
        free(b->allowed);
        free(b);
}

ModelBuf *model_buf_by_fd(ThunkModel *m, int fd, int *err)
{
        struct stat st;

        if (fd < 0 || fstat(fd, &st) < 0) {
                *err = -EBADF;
                return NULL;
        }
        for (ModelBuf *b = m->bufs; b; b = b->next)
                if (b->memfd >= 0 && b->dev == st.st_dev && b->ino == st.st_ino)
                        return b;
        *err = -EINVAL;
        return NULL;
}

/* Was @fd opened read-only? Then what imports it may only read, whatever the exporter could. */
bool model_fd_read_only(int fd)
{
        int fl = fcntl(fd, F_GETFL);
        return fl >= 0 && (fl & O_ACCMODE) == O_RDONLY;
}

/* A new open file of @b's memory: what a dmabuf fd is to its receiver. Read-only unless writable. */
int model_buf_export_fd(ModelBuf *b, bool writable, uint32_t flags, int *ret_fd)
{
        char path[64];
        int fd;

        if (b->memfd < 0)
                return -EPERM;
        if (writable) {
                /* like the kernel's exports of one dmabuf: another fd of the same open file */
                fd = fcntl(b->memfd, (flags & O_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 3);
                if (fd < 0)
                        return -errno;
                *ret_fd = fd;
                return 0;
        }
        /* read-only: a file of its own opened read-only, so the holder cannot map it writable */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", b->memfd);
        fd = open(path, (writable ? O_RDWR : O_RDONLY) | ((flags & O_CLOEXEC) ? O_CLOEXEC : 0));
        if (fd < 0)
                return -errno;
        *ret_fd = fd;
        return 0;
}

/* ------------------------------------------------------------------ GPU VMs */

/* Index of the first mapping ending after @start. */
size_t model_vm_lower(const ModelVm *vm, uint64_t start)
{
        size_t lo = 0, hi = vm->n;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;

                if (vm->v[mid].end <= start)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

bool model_vm_overlaps(const ModelVm *vm, uint64_t start, uint64_t end)
{
        size_t i = model_vm_lower(vm, start);

        return i < vm->n && vm->v[i].start < end;
}

int model_vm_insert(ModelVm *vm, const ModelMapping *mp)
{
        size_t i;

        if (model_vm_overlaps(vm, mp->start, mp->end))
                return -EINVAL;
        if (model_grow((void **)&vm->v, &vm->cap, vm->n + 1, sizeof(*vm->v)) < 0)
                return -ENOMEM;
        i = model_vm_lower(vm, mp->start);
        memmove(&vm->v[i + 1], &vm->v[i], (vm->n - i) * sizeof(*vm->v));
        vm->v[i] = *mp;
        vm->n++;
        return 0;
}

void model_vm_remove_at(ModelVm *vm, size_t i)
{
        memmove(&vm->v[i], &vm->v[i + 1], (vm->n - i - 1) * sizeof(*vm->v));
        vm->n--;
}

static bool vm_remove_mem(ModelVm *vm, const ModelMem *mem)
{
        /* a KFD mapping starts at its memory's VA: found by bisection, whatever the VM holds */
        size_t at = model_vm_lower(vm, mem->va);

        if (at < vm->n && vm->v[at].mem == mem) {
                model_vm_remove_at(vm, at);
                return true;
        }
        for (size_t i = 0; i < vm->n; i++)
                if (vm->v[i].mem == mem) {
                        model_vm_remove_at(vm, i);
                        return true;
                }
        return false;
}

/* ------------------------------------------------------------------ handles */

/* A handle of a context that is going away: out of every VM it was mapped in, then its memory dropped. */
void model_mem_destroy(ThunkModel *m, ModelCtx *c, ModelMem *mem)
{
        for (size_t g = 0; g < m->n_gpus; g++)
                if (mem->mapped & (1ULL << g)) {
                        if (c->pdd[g].file)
                                vm_remove_mem(&c->pdd[g].file->vm, mem);
                        mem->mapped &= ~(1ULL << g);
                }
        model_buf_unref(m, mem->buf);
        free(mem);
}

/* ------------------------------------------------------------------ memory ioctls */

int model_kfd_alloc_memory_of_gpu(Call *c)
{
        struct kfd_ioctl_alloc_memory_of_gpu_args *a = c->arg;
        ThunkModel *m = c->m;
        uint32_t flags = a->flags, type;
        uint64_t size = MODEL_PAGE_ALIGN(a->size);
        ModelCtx *svm_ctx = c->ctx->primary ? c->ctx : NULL;
        ModelMem *mem;
        ModelBuf *b = NULL;
        int idx, r;

        if (a->size == 0 || size < a->size)
                return -EINVAL;
        if (!c->ctx->primary && (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR))
                return -EOPNOTSUPP;
        if (svm_ctx && svm_ctx->n_svm) {
                r = model_svm_flush(m, svm_ctx);
                if (r < 0)
                        return r;
                if (model_svm_overlaps(svm_ctx, a->va_addr, a->va_addr + size))
                        return -EADDRINUSE;
                if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) &&
                    model_svm_overlaps(svm_ctx, a->mmap_offset, a->mmap_offset + size))
                        return -EADDRINUSE;
        }
        idx = model_gpu_index(m, a->gpu_id);
        if (idx < 0)
                return -EINVAL;
        if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC) && (flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM) &&
            !m->gpus[idx].large_bar)
                return -EINVAL;
        if (!c->ctx->pdd[idx].file)
                return -ENODEV;

        if (flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
                type = m->gpus[idx].apu ? KFD_IOC_ALLOC_MEM_FLAGS_GTT : KFD_IOC_ALLOC_MEM_FLAGS_VRAM;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT)
                type = KFD_IOC_ALLOC_MEM_FLAGS_GTT;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                type = KFD_IOC_ALLOC_MEM_FLAGS_USERPTR;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)
                type = KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                type = KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP;
        else
                return -EINVAL;

        if (type == KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL && a->size != MODEL_DOORBELL_SLICE)
                return -EINVAL;
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP && a->size != MODEL_PAGE)
                return -EINVAL;
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR &&
            (a->mmap_offset == 0 || (a->mmap_offset & (MODEL_PAGE - 1))))
                return -EINVAL;

        r = model_charge(m, idx, type, size);
        if (r < 0)
                return r;
        /* pinning the user pages fails if they are not mapped (a VMA walk, not a read of the maps file) */
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR &&
            !model_cpu_range_mapped(a->mmap_offset, a->mmap_offset + size)) {
                model_uncharge(m, idx, type, size);
                return -EFAULT;
        }
        r = buf_new(m, idx, type, flags, size, &b);
        if (r < 0) {
                model_uncharge(m, idx, type, size);
                return r;
        }
        b->charge = size;
        b->charge_type = type;
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                b->userptr = a->mmap_offset;
        mem = calloc(1, sizeof(*mem));
        if (!mem || model_buf_allow(b, c->ctx->pdd[idx].file) < 0 ||
            model_idr_alloc(&c->ctx->pdd[idx], mem) < 0) {
                free(mem);
                model_buf_unref(m, b);
                return -ENOMEM;
        }
        mem->buf = b;
        mem->va = a->va_addr;
        mem->flags = flags;
        mem->gpu = idx;
        a->handle = THUNK_KFD_HANDLE(a->gpu_id, mem->idr);
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                a->mmap_offset = THUNK_KFD_MMAP_TYPE_MMIO | THUNK_KFD_MMAP_GPU_ID(a->gpu_id);
        else
                a->mmap_offset = b->mmap_offset;
        return 0;
}

int model_kfd_free_memory_of_gpu(Call *c)
{
        struct kfd_ioctl_free_memory_of_gpu_args *a = c->arg;
        int idx = model_gpu_index(c->m, THUNK_KFD_HANDLE_GPU(a->handle));
        ModelMem *mem;

        if (idx < 0)
                return -EINVAL;
        mem = model_idr_find(&c->ctx->pdd[idx], THUNK_KFD_HANDLE_IDR(a->handle));
        if (!mem)
                return -EINVAL;
        if (model_is_event_page(c->ctx, a->handle))
                return -EPERM;
        if (mem->mapped)
                return -EBUSY;
        c->ctx->pdd[idx].idr[mem->idr] = NULL;
        if (mem->idr < c->ctx->pdd[idx].idr_hint)
                c->ctx->pdd[idx].idr_hint = mem->idr;
        model_buf_unref(c->m, mem->buf);
        free(mem);
        return 0;
}

/* May GPU @g reach @b's memory? Peer VRAM needs the same XGMI hive or the owner's large BAR. */
static bool peer_accessible(const ThunkModel *m, const ModelBuf *b, int g)
{
        const ModelGpu *own = &m->gpus[b->owner], *tgt = &m->gpus[g];

        if (b->owner == g || tgt->apu || b->foreign)
                return true;
        if (b->type != KFD_IOC_ALLOC_MEM_FLAGS_VRAM && b->type != KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL &&
            b->type != KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                return true;
        if (own->hive_id && own->hive_id == tgt->hive_id)
                return true;
        return own->large_bar;
}

static int map_common(Call *c, bool map)
{
        struct kfd_ioctl_map_memory_to_gpu_args *a = c->arg; /* unmap has the same layout */
        const uint32_t *ids = (const uint32_t *)(uintptr_t)a->device_ids_array_ptr;
        ThunkModel *m = c->m;
        ModelMem *mem;
        int idx, r;

        if (a->n_devices == 0 || a->n_success > a->n_devices)
                return -EINVAL;
        if (!ids)
                return -EFAULT;
        r = model_bind_pdd(c, THUNK_KFD_HANDLE_GPU(a->handle), &idx);
        if (r < 0)
                return r;
        mem = model_idr_find(&c->ctx->pdd[idx], THUNK_KFD_HANDLE_IDR(a->handle));
        if (!mem)
                return -ENOMEM;
        for (uint32_t i = a->n_success; i < a->n_devices; i++) {
                int g = model_gpu_index(m, ids[i]);
                ModelFile *f;

                if (g < 0)
                        return -EINVAL;
                f = c->ctx->pdd[g].file;
                if (!f)
                        return -ENODEV;
                if (map) {
                        if (!(mem->mapped & (1ULL << g))) {
                                ModelMapping mp = {.start = mem->va,
                                                   .end = mem->va + mem->buf->size,
                                                   .buf = mem->buf,
                                                   .mem = mem};

                                if (!peer_accessible(m, mem->buf, g))
                                        return -EINVAL;
                                if (mem->va == 0 || (mem->va & (MODEL_PAGE - 1)) || mp.end > MODEL_VM_END ||
                                    mp.end < mp.start)
                                        return -EINVAL;
                                r = model_vm_insert(&f->vm, &mp);
                                if (r < 0)
                                        return r;
                                mem->mapped |= 1ULL << g;
                        }
                } else {
                        if (!(mem->mapped & (1ULL << g)))
                                return -EINVAL;
                        vm_remove_mem(&f->vm, mem);
                        mem->mapped &= ~(1ULL << g);
                }
                a->n_success = i + 1;
        }
        return 0;
}

int model_kfd_map_memory_to_gpu(Call *c)
{
        return map_common(c, true);
}

int model_kfd_unmap_memory_from_gpu(Call *c)
{
        return map_common(c, false);
}

int model_kfd_get_dmabuf_info(Call *c)
{
        struct kfd_ioctl_get_dmabuf_info_args *a = c->arg;
        int err = 0;
        ModelBuf *b = model_buf_by_fd(c->m, (int)a->dmabuf_fd, &err);

        if (!b)
                return err;
        if (b->foreign || (b->type != KFD_IOC_ALLOC_MEM_FLAGS_VRAM && b->type != KFD_IOC_ALLOC_MEM_FLAGS_GTT))
                return -EINVAL;
        /* the model keeps no metadata: any buffer (even none) is large enough */
        a->metadata_size = 0;
        a->size = b->size;
        a->gpu_id = c->m->gpus[b->owner].gpu_id;
        a->flags = b->type;
        if (b->type == KFD_IOC_ALLOC_MEM_FLAGS_VRAM && (b->flags & KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC))
                a->flags |= KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC;
        return 0;
}

/* A memfd that is not one of ours: accepted like a foreign dmabuf on kernels that import through DRM
 * PRIME (ABI >= 15 in the model), as a GTT buffer of its size. */
static int import_foreign(ThunkModel *m, int fd, int owner, ModelBuf **ret)
{
        struct stat st;
        ModelBuf *b;
        int dup_fd;

        if (m->minor < 15 || fcntl(fd, F_GET_SEALS) < 0 || fstat(fd, &st) < 0 || st.st_size <= 0)
                return -EINVAL;
        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (dup_fd < 0) {
                free(b);
                return -errno;
        }
        b->memfd = dup_fd;
        b->dev = st.st_dev;
        b->ino = st.st_ino;
        b->refs = 1;
        b->size = MODEL_PAGE_ALIGN((uint64_t)st.st_size);
        b->type = KFD_IOC_ALLOC_MEM_FLAGS_GTT;
        b->flags = KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
        b->owner = owner;
        b->foreign = true;
        b->mmap_offset = m->next_mmap_offset;
        m->next_mmap_offset += b->size + MODEL_PAGE;
        buf_link(m, b);
        *ret = b;
        return 0;
}

int model_kfd_import_dmabuf(Call *c)
{
        struct kfd_ioctl_import_dmabuf_args *a = c->arg;
        ThunkModel *m = c->m;
        ModelBuf *b = NULL;
        ModelMem *mem;
        int idx, r, err = 0;

        r = model_bind_pdd(c, a->gpu_id, &idx);
        if (r < 0)
                return r;
        b = model_buf_by_fd(m, (int)a->dmabuf_fd, &err);
        if (!b) {
                if (err != -EINVAL)
                        return err;
                r = import_foreign(m, (int)a->dmabuf_fd, idx, &b);
                if (r < 0)
                        return r;
        } else {
                if (b->type != KFD_IOC_ALLOC_MEM_FLAGS_VRAM && b->type != KFD_IOC_ALLOC_MEM_FLAGS_GTT)
                        return -EINVAL;
                b->refs++;
        }
        mem = calloc(1, sizeof(*mem));
        if (!mem || model_buf_allow(b, c->ctx->pdd[idx].file) < 0 ||
            model_idr_alloc(&c->ctx->pdd[idx], mem) < 0) {
                free(mem);
                model_buf_unref(m, b);
                return -ENOMEM;
        }
        mem->buf = b;
        mem->va = a->va_addr;
        /* the kernel marks every import writable; the model keeps what the dmabuf file allows, so that a
         * read-only export stays read-only in every importer's GPU mappings */
        mem->flags = b->type | KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE;
        if (!model_fd_read_only((int)a->dmabuf_fd) &&
            (b->foreign || (b->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)))
                mem->flags |= KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
        mem->gpu = idx;
        mem->import = true;
        a->handle = THUNK_KFD_HANDLE(a->gpu_id, mem->idr);
        return 0;
}

int model_kfd_export_dmabuf(Call *c)
{
        struct kfd_ioctl_export_dmabuf_args *a = c->arg;
        int idx = model_gpu_index(c->m, THUNK_KFD_HANDLE_GPU(a->handle));
        ModelMem *mem;
        int fd, r;

        if (idx < 0)
                return -EINVAL;
        mem = model_idr_find(&c->ctx->pdd[idx], THUNK_KFD_HANDLE_IDR(a->handle));
        if (!mem)
                return -EINVAL;
        r = model_buf_export_fd(mem->buf, (mem->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE) != 0, a->flags,
                                &fd);
        if (r < 0)
                return r;
        a->dmabuf_fd = (uint32_t)fd;
        return 0;
}
int model_kfd_available_memory(Call *c)
{
        struct kfd_ioctl_get_available_memory_args *a = c->arg;
        int idx = model_gpu_index(c->m, a->gpu_id);

        if (idx < 0)
                return -EINVAL;
        a->available = available_memory(c->m, idx);
        return 0;
}
