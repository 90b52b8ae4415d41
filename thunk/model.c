/* The software KFD: objects, fds, accounting, dispatch, and the memory ioctls (see docs/thunk-model.md). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>
#include <linux/kfd_sysfs.h>

#include "kfd-compat.h"
#include "model-private.h"

/* ------------------------------------------------------------------ helpers */

int model_gpu_index(const ThunkModel *m, uint32_t gpu_id)
{
        for (size_t i = 0; i < m->n_gpus; i++)
                if (m->gpus[i].gpu_id == gpu_id)
                        return (int)i;
        return -1;
}

int model_grow(void **p, size_t *cap, size_t need, size_t elem)
{
        size_t n;
        void *q;

        if (need <= *cap)
                return 0;
        n = *cap ? *cap * 2 : 8;
        while (n < need)
                n *= 2;
        q = realloc(*p, n * elem);
        if (!q)
                return -ENOMEM;
        *p = q;
        *cap = n;
        return 0;
}

ModelFd *model_fd_lookup(ThunkModel *m, int fd)
{
        for (size_t i = 0; i < m->n_fds; i++)
                if (m->fds[i].fd == fd)
                        return &m->fds[i];
        return NULL;
}

/* ------------------------------------------------------------------ accounting (kfd-abi.md §6) */

static int charge(ThunkModel *m, int gpu, uint32_t type, uint64_t size)
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

static void uncharge(ThunkModel *m, int gpu, uint32_t type, uint64_t size)
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

static int buf_allow(ModelBuf *b, ModelFile *f)
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

static void buf_disallow(ThunkModel *m, ModelFile *f)
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

static void buf_unref(ThunkModel *m, ModelBuf *b)
{
        if (!b || --b->refs > 0)
                return;
        *b->pprev = b->next;
        if (b->next)
                b->next->pprev = b->pprev;
        if (b->charge_type)
                uncharge(m, b->owner, b->charge_type, b->charge);
        model_gpuvm_forget(m, b);
        if (b->memfd >= 0)
                close(b->memfd);
        free(b->allowed);
        free(b);
}

static ModelBuf *buf_by_fd(ThunkModel *m, int fd, int *err)
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
static bool fd_read_only(int fd)
{
        int fl = fcntl(fd, F_GETFL);
        return fl >= 0 && (fl & O_ACCMODE) == O_RDONLY;
}

/* A new open file of @b's memory: what a dmabuf fd is to its receiver. Read-only unless writable. */
static int buf_export_fd(ModelBuf *b, bool writable, uint32_t flags, int *ret_fd)
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
static size_t vm_lower(const ModelVm *vm, uint64_t start)
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

static bool vm_overlaps(const ModelVm *vm, uint64_t start, uint64_t end)
{
        size_t i = vm_lower(vm, start);

        return i < vm->n && vm->v[i].start < end;
}

static int vm_insert(ModelVm *vm, const ModelMapping *mp)
{
        size_t i;

        if (vm_overlaps(vm, mp->start, mp->end))
                return -EINVAL;
        if (model_grow((void **)&vm->v, &vm->cap, vm->n + 1, sizeof(*vm->v)) < 0)
                return -ENOMEM;
        i = vm_lower(vm, mp->start);
        memmove(&vm->v[i + 1], &vm->v[i], (vm->n - i) * sizeof(*vm->v));
        vm->v[i] = *mp;
        vm->n++;
        return 0;
}

static void vm_remove_at(ModelVm *vm, size_t i)
{
        memmove(&vm->v[i], &vm->v[i + 1], (vm->n - i - 1) * sizeof(*vm->v));
        vm->n--;
}

static bool vm_remove_mem(ModelVm *vm, const ModelMem *mem)
{
        /* a KFD mapping starts at its memory's VA: found by bisection, whatever the VM holds */
        size_t at = vm_lower(vm, mem->va);

        if (at < vm->n && vm->v[at].mem == mem) {
                vm_remove_at(vm, at);
                return true;
        }
        for (size_t i = 0; i < vm->n; i++)
                if (vm->v[i].mem == mem) {
                        vm_remove_at(vm, i);
                        return true;
                }
        return false;
}

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

        for (size_t k = f->vm.n; k-- > 0;)
                if (!f->vm.v[k].mem && f->vm.v[k].buf == b)
                        vm_remove_at(&f->vm, k);
        f->gems[i] = f->gems[--f->n_gems];
        buf_unref(m, b);
}

static void file_unref(ThunkModel *m, ModelFile *f)
{
        if (!f || --f->refs > 0)
                return;
        while (f->n_gems)
                file_gem_close_at(m, f, f->n_gems - 1);
        buf_disallow(m, f);
        for (ModelFile **p = &m->files; *p; p = &(*p)->next)
                if (*p == f) {
                        *p = f->next;
                        break;
                }
        free(f->gems);
        free(f->vm.v);
        free(f);
}

/* ------------------------------------------------------------------ contexts */

static void svm_uncharge_all(ThunkModel *m, ModelCtx *c);

static void mem_unmap_all(ThunkModel *m, ModelCtx *c, ModelMem *mem)
{
        for (size_t g = 0; g < m->n_gpus; g++)
                if (mem->mapped & (1ULL << g)) {
                        if (c->pdd[g].file)
                                vm_remove_mem(&c->pdd[g].file->vm, mem);
                        mem->mapped &= ~(1ULL << g);
                }
}

static void ctx_destroy(ThunkModel *m, ModelCtx *c)
{
        model_ctx_release_queues(m, c);
        for (size_t g = 0; g < m->n_gpus; g++) {
                ModelPdd *pdd = &c->pdd[g];

                for (size_t i = 0; i < pdd->cap_idr; i++) {
                        ModelMem *mem = pdd->idr[i];

                        if (!mem)
                                continue;
                        mem_unmap_all(m, c, mem);
                        buf_unref(m, mem->buf);
                        free(mem);
                }
                free(pdd->idr);
        }
        for (size_t g = 0; g < m->n_gpus; g++)
                if (c->pdd[g].file) {
                        c->pdd[g].file->compute_ctx = NULL;
                        file_unref(m, c->pdd[g].file);
                }
        svm_uncharge_all(m, c);
        free(c->svm);
        for (ModelCtx **p = &m->ctxs; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        free(c);
}

void model_ctx_unref(ThunkModel *m, ModelCtx *c)
{
        if (c && --c->refs == 0)
                ctx_destroy(m, c);
}

static ModelCtx *ctx_new(ThunkModel *m, bool primary)
{
        ModelCtx *c = calloc(1, sizeof(*c));

        if (!c)
                return NULL;
        c->primary = primary;
        c->xnack = m->xnack_default;
        c->refs = 1;
        c->next = m->ctxs;
        m->ctxs = c;
        return c;
}

static ModelCtx *ctx_primary(ThunkModel *m)
{
        for (ModelCtx *c = m->ctxs; c; c = c->next)
                if (c->primary)
                        return c;
        return NULL;
}

static int idr_alloc_mem(ModelPdd *pdd, ModelMem *mem)
{
        size_t i;

        /* no slot below the hint is free, so allocation does not rescan every live handle */
        for (i = pdd->idr_hint; i < pdd->cap_idr; i++)
                if (!pdd->idr[i])
                        break;
        if (i >= UINT32_MAX)
                return -ENOMEM;
        if (i == pdd->cap_idr) {
                size_t old = pdd->cap_idr;

                if (model_grow((void **)&pdd->idr, &pdd->cap_idr, i + 1, sizeof(*pdd->idr)) < 0)
                        return -ENOMEM;
                memset(&pdd->idr[old], 0, (pdd->cap_idr - old) * sizeof(*pdd->idr));
        }
        pdd->idr[i] = mem;
        pdd->idr_hint = i + 1;
        mem->idr = (uint32_t)i;
        return 0;
}

ModelMem *model_idr_find(ModelPdd *pdd, uint32_t id)
{
        return id < pdd->cap_idr ? pdd->idr[id] : NULL;
}

/* ------------------------------------------------------------------ SVM (kfd-abi.md §4) */

/* Mapped CPU address intervals of this process, from /proc/self/maps (what the kernel sees as VMAs). */
typedef struct CpuMaps {
        uint64_t (*iv)[2];
        size_t n;
        size_t cap;
} CpuMaps;

static int cpu_maps_load(CpuMaps *cm)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        int r = 0;

        if (!f)
                return -errno;
        cm->n = 0;
        while (fgets(line, sizeof(line), f)) {
                unsigned long long s, e;
                size_t len = strlen(line);

                if (sscanf(line, "%llx-%llx", &s, &e) == 2) {
                        if (cm->n && cm->iv[cm->n - 1][1] == s) {
                                cm->iv[cm->n - 1][1] = e;
                        } else {
                                if (model_grow((void **)&cm->iv, &cm->cap, cm->n + 1, sizeof(*cm->iv)) < 0) {
                                        r = -ENOMEM;
                                        break;
                                }
                                cm->iv[cm->n][0] = s;
                                cm->iv[cm->n][1] = e;
                                cm->n++;
                        }
                }
                /* skip the rest of an overlong line */
                while (len && line[len - 1] != '\n' && fgets(line, sizeof(line), f))
                        len = strlen(line);
        }
        fclose(f);
        return r;
}

/* The first unmapped stretch of [start, end), if any. */
static bool cpu_maps_gap(const CpuMaps *cm, uint64_t start, uint64_t end, uint64_t *gs, uint64_t *ge)
{
        uint64_t cur = start;

        for (size_t i = 0; i < cm->n && cur < end; i++) {
                if (cm->iv[i][1] <= cur)
                        continue;
                if (cm->iv[i][0] > cur) {
                        *gs = cur;
                        *ge = cm->iv[i][0] < end ? cm->iv[i][0] : end;
                        return true;
                }
                cur = cm->iv[i][1];
        }
        if (cur < end) {
                *gs = cur;
                *ge = end;
                return true;
        }
        return false;
}

static bool cpu_maps_cover(const CpuMaps *cm, uint64_t start, uint64_t end)
{
        uint64_t gs, ge;

        return !cpu_maps_gap(cm, start, end, &gs, &ge);
}

/*
 * Is [start, end) mapped throughout in this process? msync(MS_ASYNC) writes nothing back (a no-op since
 * Linux 2.6.19) but still walks the VMAs of the range and fails with ENOMEM at the first hole: an O(log n)
 * check where reading /proc/self/maps costs O(mappings) and a formatted read of each.
 */
static bool cpu_range_mapped(uint64_t start, uint64_t end)
{
        return end > start && msync((void *)(uintptr_t)start, end - start, MS_ASYNC) == 0;
}

/* Every SVM range of @c still fully mapped: nothing for the deferred-unmap flush to do. */
static bool svm_all_mapped(const ModelCtx *c)
{
        for (size_t i = 0; c && i < c->n_svm; i++)
                if (!cpu_range_mapped(c->svm[i].start * MODEL_PAGE, (c->svm[i].last + 1) * MODEL_PAGE))
                        return false;
        return true;
}

static void svm_set_defaults(const ThunkModel *m, const ModelCtx *c, SvmRange *r)
{
        r->preferred = KFD_IOCTL_SVM_LOCATION_UNDEFINED;
        r->prefetch = KFD_IOCTL_SVM_LOCATION_UNDEFINED;
        r->granularity = MODEL_SVM_DEFAULT_GRANULARITY;
        r->flags = KFD_IOCTL_SVM_FLAG_HOST_ACCESS | KFD_IOCTL_SVM_FLAG_COHERENT;
        r->access = c->xnack ? m->svm_supported : 0;
        r->in_place = 0;
}

static void svm_range_drop_charge(ThunkModel *m, SvmRange *r)
{
        if (r->charged) {
                uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, (r->last - r->start + 1) * MODEL_PAGE);
                r->charged = false;
        }
}

static void svm_uncharge_all(ThunkModel *m, ModelCtx *c)
{
        for (size_t i = 0; i < c->n_svm; i++)
                svm_range_drop_charge(m, &c->svm[i]);
        c->n_svm = 0;
}

static int svm_insert_at(ModelCtx *c, size_t i, const SvmRange *r)
{
        if (model_grow((void **)&c->svm, &c->cap_svm, c->n_svm + 1, sizeof(*c->svm)) < 0)
                return -ENOMEM;
        memmove(&c->svm[i + 1], &c->svm[i], (c->n_svm - i) * sizeof(*c->svm));
        c->svm[i] = *r;
        c->n_svm++;
        return 0;
}

/* Removes the pages [s, l] from every range (what the MMU notifier does on munmap), refunding charges. */
static int svm_remove_pages(ThunkModel *m, ModelCtx *c, uint64_t s, uint64_t l)
{
        for (size_t i = 0; i < c->n_svm;) {
                SvmRange *r = &c->svm[i];

                if (r->last < s || r->start > l) {
                        i++;
                        continue;
                }
                if (r->start < s && r->last > l) {
                        SvmRange tail = *r;

                        if (svm_insert_at(c, i + 1, &tail) < 0)
                                return -ENOMEM;
                        r = &c->svm[i];
                        c->svm[i + 1].start = l + 1;
                        r->last = s - 1;
                        if (r->charged)
                                uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, (l - s + 1) * MODEL_PAGE);
                        return 0;
                }
                if (r->start >= s && r->last <= l) {
                        svm_range_drop_charge(m, r);
                        memmove(&c->svm[i], &c->svm[i + 1], (c->n_svm - i - 1) * sizeof(*c->svm));
                        c->n_svm--;
                        continue;
                }
                if (r->start < s) {
                        if (r->charged)
                                uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
                                         (r->last - s + 1) * MODEL_PAGE);
                        r->last = s - 1;
                } else {
                        if (r->charged)
                                uncharge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
                                         (l - r->start + 1) * MODEL_PAGE);
                        r->start = l + 1;
                }
                i++;
        }
        return 0;
}

/* The deferred munmap work the kernel flushes before SVM and allocation ioctls: pages no longer mapped
 * in this process leave their ranges. */
static int svm_flush_unmapped(ThunkModel *m, ModelCtx *c, CpuMaps *cm)
{
        if (!c)
                return 0;
        for (size_t i = 0; i < c->n_svm;) {
                SvmRange *r = &c->svm[i];
                uint64_t gs, ge;

                if (!cpu_maps_gap(cm, r->start * MODEL_PAGE, (r->last + 1) * MODEL_PAGE, &gs, &ge)) {
                        i++;
                        continue;
                }
                /* cut the gap out; the array may change, so look at index i again */
                if (svm_remove_pages(m, c, gs / MODEL_PAGE, (ge - 1) / MODEL_PAGE) < 0)
                        return -ENOMEM;
        }
        return 0;
}

static int svm_flush(ThunkModel *m, ModelCtx *c)
{
        CpuMaps cm = {0};
        int r;

        if (!c || c->n_svm == 0 || svm_all_mapped(c))
                return 0;
        r = cpu_maps_load(&cm);
        if (r == 0)
                r = svm_flush_unmapped(m, c, &cm);
        free(cm.iv);
        return r;
}

static bool svm_overlaps(const ModelCtx *c, uint64_t start, uint64_t end)
{
        uint64_t s, l;

        if (!c || end <= start)
                return false;
        s = start / MODEL_PAGE;
        l = (end - 1) / MODEL_PAGE;
        for (size_t i = 0; i < c->n_svm; i++)
                if (c->svm[i].start <= l && c->svm[i].last >= s)
                        return true;
        return false;
}

static int svm_gpuidx(const ThunkModel *m, uint32_t gpu_id)
{
        return model_gpu_index(m, gpu_id);
}

static int svm_check_attr(const ThunkModel *m, uint32_t nattr, const struct kfd_ioctl_svm_attribute *a)
{
        for (uint32_t i = 0; i < nattr; i++) {
                uint32_t v = a[i].value;
                int idx = -1;

                switch (a[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                        if (v != KFD_IOCTL_SVM_LOCATION_SYSMEM && v != KFD_IOCTL_SVM_LOCATION_UNDEFINED) {
                                idx = svm_gpuidx(m, v);
                                if (idx < 0)
                                        return -EINVAL;
                        }
                        break;
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                        if (v != KFD_IOCTL_SVM_LOCATION_SYSMEM) {
                                idx = svm_gpuidx(m, v);
                                if (idx < 0)
                                        return -EINVAL;
                        }
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                case KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE:
                case KFD_IOCTL_SVM_ATTR_NO_ACCESS:
                        idx = svm_gpuidx(m, v);
                        if (idx < 0)
                                return -EINVAL;
                        break;
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        break;
                default:
                        return -EINVAL;
                }
                if (idx >= 0 && !(m->svm_supported & (1ULL << idx)))
                        return -EINVAL;
        }
        return 0;
}

static void svm_apply(const ThunkModel *m, SvmRange *r, uint32_t nattr,
                      const struct kfd_ioctl_svm_attribute *a)
{
        for (uint32_t i = 0; i < nattr; i++) {
                uint32_t v = a[i].value;
                int idx;

                switch (a[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                        r->preferred = v;
                        break;
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                        r->prefetch = v;
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                case KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE:
                case KFD_IOCTL_SVM_ATTR_NO_ACCESS:
                        idx = svm_gpuidx(m, v);
                        r->access &= ~(1ULL << idx);
                        r->in_place &= ~(1ULL << idx);
                        if (a[i].type == KFD_IOCTL_SVM_ATTR_ACCESS)
                                r->access |= 1ULL << idx;
                        else if (a[i].type == KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE)
                                r->in_place |= 1ULL << idx;
                        break;
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                        r->flags |= v;
                        break;
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                        r->flags &= ~v;
                        break;
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        r->granularity = (uint8_t)(v < 0x3F ? v : 0x3F);
                        break;
                default:
                        break;
                }
        }
}

/* True if [start, end) overlaps a mapping in any GPU VM of @c. */
static bool ctx_vm_overlaps(const ThunkModel *m, const ModelCtx *c, uint64_t start, uint64_t end)
{
        for (size_t g = 0; g < m->n_gpus; g++)
                if (c->pdd[g].file && vm_overlaps(&c->pdd[g].file->vm, start, end))
                        return true;
        return false;
}

static int svm_set(ThunkModel *m, ModelCtx *c, uint64_t s, uint64_t l, uint32_t nattr,
                   const struct kfd_ioctl_svm_attribute *a)
{
        SvmRange *nv;
        size_t n = 0, cap, gaps = 0;
        uint64_t charge_pages = 0;
        uint64_t p = s;

        /* Build the new range list off to the side so that a failure changes nothing. */
        for (size_t i = 0; i < c->n_svm; i++)
                if (c->svm[i].start <= l && c->svm[i].last >= s)
                        gaps++;
        cap = c->n_svm + 2 * gaps + 4;
        nv = calloc(cap, sizeof(*nv));
        if (!nv)
                return -ENOMEM;
        for (size_t i = 0; i < c->n_svm; i++) {
                SvmRange r = c->svm[i];

                if (r.last < s || r.start > l) {
                        if (r.start > l && p <= l) {
                                SvmRange fresh;

                                svm_set_defaults(m, c, &fresh);
                                fresh.start = p;
                                fresh.last = l;
                                fresh.charged = !c->xnack;
                                charge_pages += fresh.charged ? l - p + 1 : 0;
                                svm_apply(m, &fresh, nattr, a);
                                nv[n++] = fresh;
                                p = l + 1;
                        }
                        nv[n++] = r;
                        continue;
                }
                if (r.start < s) { /* head piece keeps its old attributes */
                        SvmRange head = r;

                        head.last = s - 1;
                        nv[n++] = head;
                        r.start = s;
                }
                if (r.start > p) { /* gap before this range */
                        SvmRange fresh;

                        svm_set_defaults(m, c, &fresh);
                        fresh.start = p;
                        fresh.last = r.start - 1;
                        fresh.charged = !c->xnack;
                        charge_pages += fresh.charged ? fresh.last - p + 1 : 0;
                        svm_apply(m, &fresh, nattr, a);
                        nv[n++] = fresh;
                }
                {
                        SvmRange mid = r;
                        SvmRange tail = r;
                        bool has_tail = r.last > l;

                        if (has_tail)
                                mid.last = l;
                        svm_apply(m, &mid, nattr, a);
                        nv[n++] = mid;
                        p = mid.last + 1;
                        if (has_tail) {
                                tail.start = l + 1;
                                nv[n++] = tail;
                        }
                }
        }
        if (p <= l && p >= s) {
                SvmRange fresh;

                svm_set_defaults(m, c, &fresh);
                fresh.start = p;
                fresh.last = l;
                fresh.charged = !c->xnack;
                charge_pages += fresh.charged ? l - p + 1 : 0;
                svm_apply(m, &fresh, nattr, a);
                nv[n++] = fresh;
        }
        if (charge_pages && charge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, charge_pages * MODEL_PAGE) < 0) {
                free(nv);
                return -ENOMEM;
        }
        free(c->svm);
        c->svm = nv;
        c->n_svm = n;
        c->cap_svm = cap;
        return 0;
}

static void svm_get(const ThunkModel *m, const ModelCtx *c, uint64_t s, uint64_t l, uint32_t nattr,
                    struct kfd_ioctl_svm_attribute *a)
{
        uint32_t loc = 0, pref = 0, flags_and = 0xffffffffu, flags_or = 0;
        uint64_t access = ~0ULL, in_place = ~0ULL;
        uint8_t gran = 0xff;
        bool first = true;

        for (size_t i = 0; i < c->n_svm; i++) {
                const SvmRange *r = &c->svm[i];

                if (r->last < s || r->start > l)
                        continue;
                if (first) {
                        loc = r->preferred;
                        pref = r->prefetch;
                        first = false;
                } else {
                        if (loc != r->preferred)
                                loc = KFD_IOCTL_SVM_LOCATION_UNDEFINED;
                        if (pref != r->prefetch)
                                pref = KFD_IOCTL_SVM_LOCATION_UNDEFINED;
                }
                flags_and &= r->flags;
                flags_or |= r->flags;
                access &= r->access;
                in_place &= r->in_place;
                if (r->granularity < gran)
                        gran = r->granularity;
        }
        if (first) {
                SvmRange d;

                svm_set_defaults(m, c, &d);
                loc = d.preferred;
                pref = d.prefetch;
                flags_and = flags_or = d.flags;
                gran = d.granularity;
                access = d.access;
                in_place = 0;
        }
        for (uint32_t i = 0; i < nattr; i++) {
                int idx;

                switch (a[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                        a[i].value = loc;
                        break;
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                        a[i].value = pref;
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                        idx = svm_gpuidx(m, a[i].value);
                        if (access & (1ULL << idx))
                                a[i].type = KFD_IOCTL_SVM_ATTR_ACCESS;
                        else if (in_place & (1ULL << idx))
                                a[i].type = KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE;
                        else
                                a[i].type = KFD_IOCTL_SVM_ATTR_NO_ACCESS;
                        break;
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                        a[i].value = flags_and;
                        break;
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                        a[i].value = ~flags_or;
                        break;
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        a[i].value = gran;
                        break;
                default:
                        break;
                }
        }
}

/* ------------------------------------------------------------------ KFD ioctl handlers */

static int kfd_get_version(Call *c)
{
        struct kfd_ioctl_get_version_args *a = c->arg;

        a->major_version = 1;
        a->minor_version = c->m->minor;
        return 0;
}

/* The per-GPU prerequisite of every memory op: the VM must have been acquired. */
int model_bind_pdd(Call *c, uint32_t gpu_id, int *ret_idx)
{
        int idx = model_gpu_index(c->m, gpu_id);

        if (idx < 0)
                return -EINVAL;
        if (!c->ctx->pdd[idx].file)
                return -ENODEV;
        *ret_idx = idx;
        return 0;
}

static int kfd_set_memory_policy(Call *c)
{
        struct kfd_ioctl_set_memory_policy_args *a = c->arg;
        int idx, r;

        if (a->default_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
            a->default_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT)
                return -EINVAL;
        if (a->alternate_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
            a->alternate_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT)
                return -EINVAL;
        r = model_bind_pdd(c, a->gpu_id, &idx);
        /* kfd_ioctl_set_memory_policy() words a failed bind -ESRCH, not the -ENODEV of the memory ioctls */
        return r == -ENODEV ? -ESRCH : r;
}

static void fill_apertures(const ThunkModel *m, size_t g, struct kfd_process_device_apertures *ap)
{
        memset(ap, 0, sizeof(*ap));
        ap->lds_base = 1ULL << 48;
        ap->lds_limit = ap->lds_base | 0xFFFFFFFFULL;
        ap->scratch_base = 2ULL << 48;
        ap->scratch_limit = ap->scratch_base | 0xFFFFFFFFULL;
        ap->gpuvm_base = MODEL_GPUVM_BASE;
        ap->gpuvm_limit = MODEL_GPUVM_LIMIT;
        ap->gpu_id = m->gpus[g].gpu_id;
}

static int kfd_get_process_apertures(Call *c)
{
        struct kfd_ioctl_get_process_apertures_args *a = c->arg;
        size_t n = c->m->n_gpus < NUM_OF_SUPPORTED_GPUS ? c->m->n_gpus : NUM_OF_SUPPORTED_GPUS;

        for (size_t g = 0; g < n; g++)
                fill_apertures(c->m, g, &a->process_apertures[g]);
        a->num_of_nodes = (uint32_t)n;
        return 0;
}

static int kfd_get_process_apertures_new(Call *c)
{
        struct kfd_ioctl_get_process_apertures_new_args *a = c->arg;
        struct kfd_process_device_apertures *out;
        uint32_t n;

        if (a->num_of_nodes == 0) {
                a->num_of_nodes = (uint32_t)c->m->n_gpus;
                return 0;
        }
        n = a->num_of_nodes < c->m->n_gpus ? a->num_of_nodes : (uint32_t)c->m->n_gpus;
        out = (struct kfd_process_device_apertures *)(uintptr_t)a->kfd_process_device_apertures_ptr;
        if (!out)
                return -EFAULT;
        for (uint32_t g = 0; g < n; g++)
                fill_apertures(c->m, g, &out[g]);
        a->num_of_nodes = n;
        return 0;
}

static int kfd_set_scratch_backing_va(Call *c)
{
        struct kfd_ioctl_set_scratch_backing_va_args *a = c->arg;
        int idx, r = model_bind_pdd(c, a->gpu_id, &idx);

        if (r < 0)
                return r;
        c->ctx->pdd[idx].scratch_va = a->va_addr;
        return 0;
}

static int kfd_acquire_vm(Call *c)
{
        struct kfd_ioctl_acquire_vm_args *a = c->arg;
        ModelFd *e = model_fd_lookup(c->m, (int)a->drm_fd);
        int idx = model_gpu_index(c->m, a->gpu_id);
        ModelPdd *pdd;
        ModelFile *f;

        /* the kernel takes a reference on any open file first, and only later finds it is no amdgpu VM */
        if (!e && fcntl((int)a->drm_fd, F_GETFD) < 0)
                return -EINVAL;
        if (idx < 0)
                return -EINVAL;
        pdd = &c->ctx->pdd[idx];
        f = e && e->kind == FD_RENDER ? e->file : NULL;
        if (pdd->file)
                return pdd->file == f ? 0 : -EBUSY;
        if (!f || f->gpu != idx || f->compute_ctx)
                return -EINVAL;
        f->compute_ctx = c->ctx;
        f->refs++;
        pdd->file = f;
        return 0;
}

static int kfd_alloc_memory_of_gpu(Call *c)
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
                r = svm_flush(m, svm_ctx);
                if (r < 0)
                        return r;
                if (svm_overlaps(svm_ctx, a->va_addr, a->va_addr + size))
                        return -EADDRINUSE;
                if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) &&
                    svm_overlaps(svm_ctx, a->mmap_offset, a->mmap_offset + size))
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
        /* kfd_ioctl_alloc_memory_of_gpu() applies USERPTR's, else DOORBELL's, else MMIO_REMAP's rule by
         * its bit, whatever domain the BO then gets (VRAM | DOORBELL is a VRAM BO of the doorbell size) */
        if (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                if (a->mmap_offset & (MODEL_PAGE - 1))
                        return -EINVAL;
        } else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL) {
                if (a->size != MODEL_DOORBELL_SLICE)
                        return -EINVAL;
        } else if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP) && a->size != MODEL_PAGE) {
                return -EINVAL;
        }

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

        /* the GPUVM allocator wants a user address only for what becomes a userptr BO */
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR && a->mmap_offset == 0)
                return -EINVAL;

        r = charge(m, idx, type, size);
        if (r < 0)
                return r;
        /* pinning the user pages fails if they are not mapped (a VMA walk, not a read of the maps file) */
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR &&
            !cpu_range_mapped(a->mmap_offset, a->mmap_offset + size)) {
                uncharge(m, idx, type, size);
                return -EFAULT;
        }
        r = buf_new(m, idx, type, flags, size, &b);
        if (r < 0) {
                uncharge(m, idx, type, size);
                return r;
        }
        b->charge = size;
        b->charge_type = type;
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                b->userptr = a->mmap_offset;
        mem = calloc(1, sizeof(*mem));
        if (!mem || buf_allow(b, c->ctx->pdd[idx].file) < 0 || idr_alloc_mem(&c->ctx->pdd[idx], mem) < 0) {
                free(mem);
                buf_unref(m, b);
                return -ENOMEM;
        }
        mem->buf = b;
        mem->va = a->va_addr;
        mem->flags = flags;
        mem->gpu = idx;
        a->handle = THUNK_KFD_HANDLE(a->gpu_id, mem->idr);
        if (flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                a->mmap_offset = THUNK_KFD_MMAP_TYPE_MMIO | THUNK_KFD_MMAP_GPU_ID(a->gpu_id);
        else
                a->mmap_offset = b->mmap_offset;
        return 0;
}

static int kfd_free_memory_of_gpu(Call *c)
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
        buf_unref(c->m, mem->buf);
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
        /* MAP binds the process to the handle's device and to each target; kfd_ioctl_unmap_memory_from_gpu()
         * binds none: a device without a VM just has nothing mapped */
        if (map) {
                r = model_bind_pdd(c, THUNK_KFD_HANDLE_GPU(a->handle), &idx);
                if (r < 0)
                        return r;
        } else {
                idx = model_gpu_index(m, THUNK_KFD_HANDLE_GPU(a->handle));
                if (idx < 0)
                        return -EINVAL;
        }
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
                        return map ? -ENODEV : -EINVAL;
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
                                r = vm_insert(&f->vm, &mp);
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

static int kfd_map_memory_to_gpu(Call *c)
{
        return map_common(c, true);
}

static int kfd_unmap_memory_from_gpu(Call *c)
{
        return map_common(c, false);
}

static int kfd_get_dmabuf_info(Call *c)
{
        struct kfd_ioctl_get_dmabuf_info_args *a = c->arg;
        int err = 0;
        ModelBuf *b = buf_by_fd(c->m, (int)a->dmabuf_fd, &err);

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

static int kfd_import_dmabuf(Call *c)
{
        struct kfd_ioctl_import_dmabuf_args *a = c->arg;
        ThunkModel *m = c->m;
        ModelBuf *b = NULL;
        ModelMem *mem;
        int idx, r, err = 0;

        r = model_bind_pdd(c, a->gpu_id, &idx);
        if (r < 0)
                return r;
        b = buf_by_fd(m, (int)a->dmabuf_fd, &err);
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
        if (!mem || buf_allow(b, c->ctx->pdd[idx].file) < 0 || idr_alloc_mem(&c->ctx->pdd[idx], mem) < 0) {
                free(mem);
                buf_unref(m, b);
                return -ENOMEM;
        }
        mem->buf = b;
        mem->va = a->va_addr;
        /* the kernel marks every import writable; the model keeps what the dmabuf file allows, so that a
         * read-only export stays read-only in every importer's GPU mappings */
        mem->flags = b->type | KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE;
        if (!fd_read_only((int)a->dmabuf_fd) && (b->foreign || (b->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)))
                mem->flags |= KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
        mem->gpu = idx;
        mem->import = true;
        a->handle = THUNK_KFD_HANDLE(a->gpu_id, mem->idr);
        return 0;
}

static int kfd_export_dmabuf(Call *c)
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
        r = buf_export_fd(mem->buf, (mem->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE) != 0, a->flags, &fd);
        if (r < 0)
                return r;
        a->dmabuf_fd = (uint32_t)fd;
        return 0;
}

static int kfd_svm(Call *c)
{
        struct kfd_ioctl_svm_args *a = c->arg;
        ThunkModel *m = c->m;
        uint64_t s, l;
        CpuMaps cm = {0};
        int r;

        if (!c->ctx->primary)
                return -EOPNOTSUPP;
        if (c->usize < sizeof(*a) + (size_t)a->nattr * sizeof(a->attrs[0]))
                return -EINVAL;
        if (!a->start_addr || !a->size || (a->start_addr & (MODEL_PAGE - 1)) || (a->size & (MODEL_PAGE - 1)))
                return -EINVAL;
        if (a->start_addr + a->size < a->start_addr)
                return -EOVERFLOW;
        if (a->op != KFD_IOCTL_SVM_OP_SET_ATTR && a->op != KFD_IOCTL_SVM_OP_GET_ATTR)
                return -EINVAL;
        s = a->start_addr / MODEL_PAGE;
        l = s + a->size / MODEL_PAGE - 1;
        if (a->op == KFD_IOCTL_SVM_OP_SET_ATTR) {
                r = svm_check_attr(m, a->nattr, a->attrs);
                if (r < 0)
                        return r;
        }
        /* the common case, everything still mapped, needs no walk of /proc/self/maps */
        if (!cpu_range_mapped(a->start_addr, a->start_addr + a->size) || !svm_all_mapped(c->ctx)) {
                r = cpu_maps_load(&cm);
                if (r == 0)
                        r = svm_flush_unmapped(m, c->ctx, &cm);
                if (r == 0 && !cpu_maps_cover(&cm, a->start_addr, a->start_addr + a->size))
                        r = -EFAULT;
                free(cm.iv);
                if (r < 0)
                        return r;
        }
        /* svm_range_is_valid(), for GET as for SET: no BO may be mapped in the range */
        if (ctx_vm_overlaps(m, c->ctx, a->start_addr, a->start_addr + a->size))
                return -EADDRINUSE;
        if (a->op == KFD_IOCTL_SVM_OP_SET_ATTR)
                return svm_set(m, c->ctx, s, l, a->nattr, a->attrs);
        /* GET checks its attributes only once the range is known valid (svm_range_get_attr) */
        for (uint32_t i = 0; i < a->nattr; i++) {
                switch (a->attrs[i].type) {
                case KFD_IOCTL_SVM_ATTR_PREFERRED_LOC:
                case KFD_IOCTL_SVM_ATTR_PREFETCH_LOC:
                case KFD_IOCTL_SVM_ATTR_SET_FLAGS:
                case KFD_IOCTL_SVM_ATTR_CLR_FLAGS:
                case KFD_IOCTL_SVM_ATTR_GRANULARITY:
                        break;
                case KFD_IOCTL_SVM_ATTR_ACCESS:
                        if (svm_gpuidx(m, a->attrs[i].value) < 0)
                                return -EINVAL;
                        break;
                default:
                        return -EINVAL;
                }
        }
        svm_get(m, c->ctx, s, l, a->nattr, a->attrs);
        return 0;
}

static int kfd_set_xnack_mode(Call *c)
{
        struct kfd_ioctl_set_xnack_mode_args *a = c->arg;
        ThunkModel *m = c->m;
        ModelCtx *ctx = c->ctx;
        bool on = a->xnack_enabled > 0;

        if (a->xnack_enabled < 0) {
                a->xnack_enabled = ctx->xnack;
                return 0;
        }
        /* kfd_ioctl_set_xnack_mode(): queues first, then "already so", and only then "cannot" */
        if (ctx->n_queues)
                return -EBUSY;
        if (on == ctx->xnack)
                return 0;
        if (!m->svm_supported)
                return -EPERM;
        if (on) {
                for (size_t g = 0; g < m->n_gpus; g++)
                        if (!m->gpus[g].xnack_capable)
                                return -EPERM;
                for (size_t i = 0; i < ctx->n_svm; i++)
                        svm_range_drop_charge(m, &ctx->svm[i]);
        } else {
                uint64_t pages = 0;

                for (size_t i = 0; i < ctx->n_svm; i++)
                        pages += ctx->svm[i].last - ctx->svm[i].start + 1;
                if (pages && charge(m, 0, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, pages * MODEL_PAGE) < 0)
                        return -ENOMEM;
                for (size_t i = 0; i < ctx->n_svm; i++)
                        ctx->svm[i].charged = true;
        }
        ctx->xnack = on;
        return 0;
}

static int kfd_available_memory(Call *c)
{
        struct kfd_ioctl_get_available_memory_args *a = c->arg;
        int idx = model_gpu_index(c->m, a->gpu_id);

        if (idx < 0)
                return -EINVAL;
        a->available = available_memory(c->m, idx);
        return 0;
}

static int kfd_runtime_enable(Call *c)
{
        struct kfd_ioctl_runtime_enable_args *a = c->arg;

        if (a->mode_mask & KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK) {
                if (c->ctx->runtime_enabled)
                        return -EBUSY;
                if (c->ctx->n_queues)
                        return -EEXIST;
                c->ctx->runtime_enabled = true;
                a->capabilities_mask = 0;
        } else {
                c->ctx->runtime_enabled = false;
        }
        return 0;
}

static int kfd_create_process(Call *c)
{
        ThunkModel *m = c->m;
        ModelCtx *sec;

        if (!c->ctx->primary)
                return -EINVAL;
        sec = ctx_new(m, false);
        if (!sec)
                return -ENOMEM;
        /* the calling fd now names the new context and no longer holds the primary */
        c->ent->ctx = sec;
        model_ctx_unref(m, c->ctx);
        c->ctx = sec;
        return 0;
}

/* ------------------------------------------------------------------ DRM handlers (render fds) */

static int drm_gem_close(Call *c)
{
        struct drm_gem_close *a = c->arg;

        for (size_t i = 0; i < c->file->n_gems; i++)
                if (c->file->gems[i].handle == a->handle) {
                        file_gem_close_at(c->m, c->file, i);
                        return 0;
                }
        return -EINVAL;
}

static int gem_handle_for(ModelFile *f, ModelBuf *b, bool read_only, uint32_t *ret)
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
        if (model_grow((void **)&f->gems, &f->cap_gems, f->n_gems + 1, sizeof(*f->gems)) < 0 ||
            buf_allow(b, f) < 0)
                return -ENOMEM;
        f->gems[f->n_gems].handle = h;
        f->gems[f->n_gems].buf = b;
        f->gems[f->n_gems].read_only = read_only;
        f->n_gems++;
        b->refs++;
        *ret = h;
        return 0;
}

static int drm_prime_fd_to_handle(Call *c)
{
        struct drm_prime_handle *a = c->arg;
        int err = 0;
        ModelBuf *b = buf_by_fd(c->m, a->fd, &err);

        if (!b)
                return err;
        return gem_handle_for(c->file, b, fd_read_only(a->fd), &a->handle);
}

static int drm_prime_handle_to_fd(Call *c)
{
        struct drm_prime_handle *a = c->arg;
        ModelGem *g = file_gem(c->file, a->handle);
        int fd, r;

        if (a->flags & ~(uint32_t)(DRM_CLOEXEC | DRM_RDWR))
                return -EINVAL;
        if (!g)
                return -ENOENT;
        r = buf_export_fd(g->buf, (a->flags & DRM_RDWR) != 0, a->flags, &fd);
        if (r < 0)
                return r;
        a->fd = fd;
        return 0;
}

static int drm_amdgpu_gem_mmap(Call *c)
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

static int drm_amdgpu_gem_va(Call *c)
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
                for (size_t i = 0; i < f->vm.n; i++)
                        if (!f->vm.v[i].mem && f->vm.v[i].buf == g->buf &&
                            f->vm.v[i].start == a->va_address) {
                                vm_remove_at(&f->vm, i);
                                return 0;
                        }
                return -ENOENT;
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
                for (size_t i = vm_lower(&f->vm, a->va_address); i < f->vm.n && f->vm.v[i].start < end; i++)
                        if (f->vm.v[i].mem)
                                return -EINVAL;
                for (size_t i = vm_lower(&f->vm, a->va_address); i < f->vm.n && f->vm.v[i].start < end;) {
                        ModelMapping *mp = &f->vm.v[i];

                        if (mp->start < a->va_address && mp->end > end) {
                                ModelMapping tail = *mp;

                                tail.offset += end - mp->start;
                                tail.start = end;
                                mp->end = a->va_address;
                                if (vm_insert(&f->vm, &tail) < 0)
                                        return -ENOMEM;
                                break;
                        }
                        if (mp->start >= a->va_address && mp->end <= end) {
                                vm_remove_at(&f->vm, i);
                                continue;
                        }
                        if (mp->start < a->va_address) {
                                mp->end = a->va_address;
                        } else {
                                mp->offset += end - mp->start;
                                mp->start = end;
                        }
                        i++;
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

                return vm_insert(&f->vm, &mp);
        }
}

/* ------------------------------------------------------------------ dispatch */

typedef struct IoctlDesc {
        unsigned long cmd; /* the driver's own request: direction and size */
        uint32_t min_minor;
        int (*fn)(Call *c);
} IoctlDesc;

#define KFD_NR(req) [_IOC_NR(req)]

static const IoctlDesc kfd_table[0x28] = {
        KFD_NR(AMDKFD_IOC_GET_VERSION) = {AMDKFD_IOC_GET_VERSION, 0, kfd_get_version},
        KFD_NR(AMDKFD_IOC_CREATE_QUEUE) = {AMDKFD_IOC_CREATE_QUEUE, 0, model_kfd_create_queue},
        KFD_NR(AMDKFD_IOC_DESTROY_QUEUE) = {AMDKFD_IOC_DESTROY_QUEUE, 0, model_kfd_destroy_queue},
        KFD_NR(AMDKFD_IOC_SET_MEMORY_POLICY) = {AMDKFD_IOC_SET_MEMORY_POLICY, 0, kfd_set_memory_policy},
        KFD_NR(AMDKFD_IOC_GET_CLOCK_COUNTERS) = {AMDKFD_IOC_GET_CLOCK_COUNTERS, 0,
                                                 model_kfd_get_clock_counters},
        KFD_NR(AMDKFD_IOC_UPDATE_QUEUE) = {AMDKFD_IOC_UPDATE_QUEUE, 0, model_kfd_update_queue},
        KFD_NR(AMDKFD_IOC_CREATE_EVENT) = {AMDKFD_IOC_CREATE_EVENT, 0, model_kfd_create_event},
        KFD_NR(AMDKFD_IOC_DESTROY_EVENT) = {AMDKFD_IOC_DESTROY_EVENT, 0, model_kfd_destroy_event},
        KFD_NR(AMDKFD_IOC_SET_EVENT) = {AMDKFD_IOC_SET_EVENT, 0, model_kfd_set_event},
        KFD_NR(AMDKFD_IOC_RESET_EVENT) = {AMDKFD_IOC_RESET_EVENT, 0, model_kfd_reset_event},
        KFD_NR(AMDKFD_IOC_WAIT_EVENTS) = {AMDKFD_IOC_WAIT_EVENTS, 0, model_kfd_wait_events},
        KFD_NR(AMDKFD_IOC_GET_TILE_CONFIG) = {AMDKFD_IOC_GET_TILE_CONFIG, 0, model_kfd_get_tile_config},
        KFD_NR(AMDKFD_IOC_SET_TRAP_HANDLER) = {AMDKFD_IOC_SET_TRAP_HANDLER, 0, model_kfd_set_trap_handler},
        KFD_NR(AMDKFD_IOC_GET_PROCESS_APERTURES) = {AMDKFD_IOC_GET_PROCESS_APERTURES, 0,
                                                    kfd_get_process_apertures},
        KFD_NR(AMDKFD_IOC_SET_SCRATCH_BACKING_VA) = {AMDKFD_IOC_SET_SCRATCH_BACKING_VA, 0,
                                                     kfd_set_scratch_backing_va},
        KFD_NR(AMDKFD_IOC_GET_PROCESS_APERTURES_NEW) = {AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, 0,
                                                        kfd_get_process_apertures_new},
        KFD_NR(AMDKFD_IOC_ACQUIRE_VM) = {AMDKFD_IOC_ACQUIRE_VM, 0, kfd_acquire_vm},
        KFD_NR(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU) = {AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 0, kfd_alloc_memory_of_gpu},
        KFD_NR(AMDKFD_IOC_FREE_MEMORY_OF_GPU) = {AMDKFD_IOC_FREE_MEMORY_OF_GPU, 0, kfd_free_memory_of_gpu},
        KFD_NR(AMDKFD_IOC_MAP_MEMORY_TO_GPU) = {AMDKFD_IOC_MAP_MEMORY_TO_GPU, 0, kfd_map_memory_to_gpu},
        KFD_NR(AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU) = {AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, 0,
                                                    kfd_unmap_memory_from_gpu},
        KFD_NR(AMDKFD_IOC_GET_DMABUF_INFO) = {AMDKFD_IOC_GET_DMABUF_INFO, 0, kfd_get_dmabuf_info},
        KFD_NR(AMDKFD_IOC_IMPORT_DMABUF) = {AMDKFD_IOC_IMPORT_DMABUF, 0, kfd_import_dmabuf},
        KFD_NR(AMDKFD_IOC_SVM) = {AMDKFD_IOC_SVM, 0, kfd_svm},
        KFD_NR(AMDKFD_IOC_SET_XNACK_MODE) = {AMDKFD_IOC_SET_XNACK_MODE, 0, kfd_set_xnack_mode},
        KFD_NR(AMDKFD_IOC_AVAILABLE_MEMORY) = {AMDKFD_IOC_AVAILABLE_MEMORY, 0, kfd_available_memory},
        KFD_NR(AMDKFD_IOC_EXPORT_DMABUF) = {AMDKFD_IOC_EXPORT_DMABUF, 12, kfd_export_dmabuf},
        KFD_NR(AMDKFD_IOC_RUNTIME_ENABLE) = {AMDKFD_IOC_RUNTIME_ENABLE, 13, kfd_runtime_enable},
        KFD_NR(AMDKFD_IOC_CREATE_PROCESS) = {AMDKFD_IOC_CREATE_PROCESS, 19, kfd_create_process},
};

static int drm_lookup(unsigned int nr, IoctlDesc *ret)
{
        switch (nr) {
        case _IOC_NR(DRM_IOCTL_GEM_CLOSE):
                *ret = (IoctlDesc){DRM_IOCTL_GEM_CLOSE, 0, drm_gem_close};
                return 0;
        case _IOC_NR(DRM_IOCTL_PRIME_HANDLE_TO_FD):
                *ret = (IoctlDesc){DRM_IOCTL_PRIME_HANDLE_TO_FD, 0, drm_prime_handle_to_fd};
                return 0;
        case _IOC_NR(DRM_IOCTL_PRIME_FD_TO_HANDLE):
                *ret = (IoctlDesc){DRM_IOCTL_PRIME_FD_TO_HANDLE, 0, drm_prime_fd_to_handle};
                return 0;
        case _IOC_NR(DRM_IOCTL_AMDGPU_GEM_MMAP):
                *ret = (IoctlDesc){DRM_IOCTL_AMDGPU_GEM_MMAP, 0, drm_amdgpu_gem_mmap};
                return 0;
        case _IOC_NR(DRM_IOCTL_AMDGPU_GEM_VA):
                *ret = (IoctlDesc){DRM_IOCTL_AMDGPU_GEM_VA, 0, drm_amdgpu_gem_va};
                return 0;
        default:
                return -EINVAL;
        }
}

static bool take_fault(ThunkModel *m, unsigned long request, int *err)
{
        bool hit = false;

        for (size_t i = 0; i < m->n_faults;) {
                ModelFault *f = &m->faults[i];

                if (f->type != _IOC_TYPE(request) || f->nr != _IOC_NR(request)) {
                        i++;
                        continue;
                }
                if (--f->remaining > 0) {
                        i++;
                        continue;
                }
                if (hit) {
                        /* two faults due on the same call: the second fires on the next one */
                        f->remaining = 1;
                        i++;
                        continue;
                }
                hit = true;
                *err = -f->err;
                m->faults[i] = m->faults[--m->n_faults];
        }
        return hit;
}

static int dispatch(ThunkModel *m, ModelFd *e, unsigned long request, void *arg)
{
        unsigned int nr = _IOC_NR(request);
        size_t usize = _IOC_SIZE(request), ksize, asize;
        uint64_t stackbuf[32];
        void *kbuf = stackbuf;
        IoctlDesc d;
        Call call = {.m = m, .ctx = e->ctx, .file = e->file, .ent = e, .usize = usize};
        int r, err = -EIO;

        if (e->kind == FD_KFD) {
                if (_IOC_TYPE(request) != AMDKFD_IOCTL_BASE)
                        return -ENOTTY;
                /* a number outside this version's table is no ioctl of the driver (kfd_ioctl: -ENOTTY) */
                if (nr < THUNK_KFD_COMMAND_START || nr >= thunk_kfd_command_end(m->minor) || nr >= 0x28 ||
                    kfd_table[nr].min_minor > m->minor)
                        return -ENOTTY;
                /* in the kernel's table, but queues, events, debugger, CRIU... are not modelled */
                if (!kfd_table[nr].fn)
                        return -EOPNOTSUPP;
                d = kfd_table[nr];
        } else {
                if (_IOC_TYPE(request) != DRM_IOCTL_BASE)
                        return -ENOTTY;
                r = drm_lookup(nr, &d);
                if (r < 0)
                        return r;
        }
        ksize = _IOC_SIZE(d.cmd);
        asize = usize > ksize ? usize : ksize;
        if ((_IOC_DIR(d.cmd) & (_IOC_READ | _IOC_WRITE)) && asize) {
                if (!arg && usize)
                        return -EFAULT;
                if (asize > sizeof(stackbuf)) {
                        kbuf = calloc(1, asize);
                        if (!kbuf)
                                return -ENOMEM;
                } else {
                        memset(stackbuf, 0, sizeof(stackbuf));
                }
                if ((_IOC_DIR(d.cmd) & _IOC_WRITE) && usize)
                        memcpy(kbuf, arg, usize);
        }
        call.arg = kbuf;
        if (take_fault(m, request, &err)) {
                r = err;
        } else {
                r = d.fn(&call);
        }
        if ((_IOC_DIR(d.cmd) & _IOC_READ) && usize)
                memcpy(arg, kbuf, usize);
        if (kbuf != stackbuf)
                free(kbuf);
        return r;
}

int thunk_model_ioctl(ThunkModel *m, int fd, unsigned long request, void *arg)
{
        ModelFd *e;
        int r;

        if (!m)
                return -EINVAL;
        pthread_mutex_lock(&m->lock);
        e = model_fd_lookup(m, fd);
        r = e ? dispatch(m, e, request, arg) : -EBADF;
        pthread_mutex_unlock(&m->lock);
        return r;
}

/* ------------------------------------------------------------------ fds */

static int fd_add(ThunkModel *m, int kind, ModelCtx *ctx, ModelFile *file, int *ret_fd)
{
        int fd;

        if (model_grow((void **)&m->fds, &m->cap_fds, m->n_fds + 1, sizeof(*m->fds)) < 0)
                return -ENOMEM;
        fd = fcntl(m->anchor, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        m->fds[m->n_fds++] = (ModelFd){.fd = fd, .kind = kind, .ctx = ctx, .file = file};
        *ret_fd = fd;
        return 0;
}

int thunk_model_open_kfd(ThunkModel *m, int *ret_fd)
{
        ModelCtx *c;
        bool created = false;
        int r;

        pthread_mutex_lock(&m->lock);
        c = ctx_primary(m);
        if (c) {
                c->refs++;
        } else {
                c = ctx_new(m, true);
                created = true;
        }
        if (!c) {
                r = -ENOMEM;
        } else {
                r = fd_add(m, FD_KFD, c, NULL, ret_fd);
                if (r < 0 && created)
                        ctx_destroy(m, c);
                else if (r < 0)
                        c->refs--;
        }
        pthread_mutex_unlock(&m->lock);
        return r;
}

int thunk_model_open_render(ThunkModel *m, uint32_t minor, int *ret_fd)
{
        ModelFile *f;
        int g = -1, r;

        pthread_mutex_lock(&m->lock);
        for (size_t i = 0; i < m->n_gpus; i++)
                if (m->gpus[i].minor == minor)
                        g = (int)i;
        if (g < 0) {
                r = -ENOENT;
                goto out;
        }
        f = calloc(1, sizeof(*f));
        if (!f) {
                r = -ENOMEM;
                goto out;
        }
        f->gpu = g;
        f->refs = 1;
        r = fd_add(m, FD_RENDER, NULL, f, ret_fd);
        if (r < 0) {
                free(f);
                goto out;
        }
        f->next = m->files;
        m->files = f;
out:
        pthread_mutex_unlock(&m->lock);
        return r;
}

static void fd_release(ThunkModel *m, size_t i)
{
        ModelFd e = m->fds[i];

        m->fds[i] = m->fds[--m->n_fds];
        close(e.fd);
        if (e.kind == FD_KFD)
                model_ctx_unref(m, e.ctx);
        else
                file_unref(m, e.file);
}

int thunk_model_close(ThunkModel *m, int fd)
{
        int r = -EBADF;

        pthread_mutex_lock(&m->lock);
        for (size_t i = 0; i < m->n_fds; i++)
                if (m->fds[i].fd == fd) {
                        fd_release(m, i);
                        r = 0;
                        break;
                }
        pthread_mutex_unlock(&m->lock);
        return r;
}

bool thunk_model_owns_fd(ThunkModel *m, int fd)
{
        bool r;

        pthread_mutex_lock(&m->lock);
        r = model_fd_lookup(m, fd) != NULL;
        pthread_mutex_unlock(&m->lock);
        return r;
}

int thunk_model_mmap(ThunkModel *m, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                     void **ret)
{
        ModelBuf *b = NULL;
        ModelFd *e;
        void *p;
        int r = 0, memfd = -1;

        pthread_mutex_lock(&m->lock);
        e = model_fd_lookup(m, fd);
        if (!e) {
                r = -EBADF;
                goto out;
        }
        if (len == 0) {
                r = -EINVAL;
                goto out;
        }
        if (e->kind == FD_KFD) {
                /* doorbells and events live in the device memfd; MMIO is the page of an MMIO_REMAP BO */
                int g = model_gpu_index(m, THUNK_KFD_MMAP_GET_GPU_ID(offset));

                r = model_kfd_mmap_dev(m, e->ctx, addr, len, prot, flags, offset, ret);
                if (r != -ENOENT)
                        goto out;

                r = -EINVAL;
                if ((offset & THUNK_KFD_MMAP_TYPE_MASK) != THUNK_KFD_MMAP_TYPE_MMIO || g < 0 ||
                    len != MODEL_PAGE)
                        goto out;
                for (size_t i = 0; i < e->ctx->pdd[g].cap_idr; i++) {
                        ModelMem *mem = e->ctx->pdd[g].idr[i];

                        if (mem && mem->buf->type == KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP) {
                                b = mem->buf;
                                break;
                        }
                }
                if (!b)
                        goto out;
                r = 0;
                memfd = b->memfd;
                offset = 0;
        } else {
                for (b = m->bufs; b; b = b->next)
                        if (b->mmap_offset == offset)
                                break;
                if (!b || len > b->size) {
                        r = -EINVAL;
                        goto out;
                }
                r = -EACCES;
                for (size_t i = 0; i < b->n_allowed; i++)
                        if (b->allowed[i] == e->file)
                                r = 0;
                if (r < 0)
                        goto out;
                if (b->memfd < 0) {
                        r = -EPERM;
                        goto out;
                }
                memfd = b->memfd;
                offset = 0;
        }
        p = mmap(addr, len, prot, flags, memfd, (off_t)offset);
        if (p == MAP_FAILED)
                r = -errno;
        else
                *ret = p;
out:
        pthread_mutex_unlock(&m->lock);
        return r;
}

/* ------------------------------------------------------------------ model */

static int seam_open_kfd(void *impl, int *ret_fd)
{
        return thunk_model_open_kfd(impl, ret_fd);
}

static int seam_open_render(void *impl, uint32_t minor, int *ret_fd)
{
        return thunk_model_open_render(impl, minor, ret_fd);
}

static int seam_ioctl(void *impl, int fd, unsigned long request, void *arg)
{
        return thunk_model_ioctl(impl, fd, request, arg);
}

static int seam_mmap(void *impl, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                     void **ret)
{
        return thunk_model_mmap(impl, addr, len, prot, flags, fd, offset, ret);
}

static int seam_close(void *impl, int fd)
{
        return thunk_model_close(impl, fd);
}

static const ThunkSeamOps model_ops = {
        .name = "model",
        .open_kfd = seam_open_kfd,
        .open_render = seam_open_render,
        .ioctl = seam_ioctl,
        .mmap = seam_mmap,
        .close = seam_close,
};

void thunk_model_seam(ThunkModel *m, ThunkSeam *ret)
{
        ret->ops = &model_ops;
        ret->impl = m;
}

static void gpu_from_node(ModelGpu *g, const ThunkNode *n)
{
        uint64_t pub = 0, priv = 0;

        g->gpu_id = n->gpu_id;
        g->minor = n->drm_render_minor;
        g->hive_id = n->hive_id;
        for (size_t b = 0; b < n->n_mem_banks; b++) {
                if (n->mem_banks[b].heap_type == HSA_MEM_HEAP_TYPE_FB_PUBLIC)
                        pub += n->mem_banks[b].size_in_bytes;
                else if (n->mem_banks[b].heap_type == HSA_MEM_HEAP_TYPE_FB_PRIVATE)
                        priv += n->mem_banks[b].size_in_bytes;
        }
        g->vram_size = pub + priv;
        if (!g->vram_size)
                g->vram_size = n->local_mem_size;
        g->apu = g->vram_size == 0;
        /* a small-BAR board reports its VRAM as private; an APU has no BAR limit */
        g->large_bar = g->apu || priv == 0;
        g->svm = (n->capability & HSA_CAP_SVMAPI_SUPPORTED) != 0;
        g->xnack_capable = n->gfx_target_version >= 90000 && n->gfx_target_version < 100000;
        g->gfx_target_version = n->gfx_target_version;
}

int thunk_model_new(const ThunkTopology *topo, const ThunkModelOptions *opts, ThunkModel **ret)
{
        ThunkModelOptions o = {0};
        ThunkModel *m;
        uint64_t ram = 0;

        if (opts)
                o = *opts;
        if (o.kfd_minor == 0)
                o.kfd_minor = THUNK_MODEL_KFD_MINOR_MAX;
        if (!topo || o.kfd_minor < THUNK_MODEL_KFD_MINOR_MIN || o.kfd_minor > THUNK_MODEL_KFD_MINOR_MAX)
                return -EINVAL;
        if (topo->n_gpus == 0 || topo->n_gpus > THUNK_MODEL_MAX_GPUS)
                return -EINVAL;
        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->minor = o.kfd_minor;
        m->xnack_default = o.xnack_enabled;
        m->next_mmap_offset = MODEL_MMAP_BASE;
        for (size_t i = 0; i < topo->n_nodes; i++) {
                const ThunkNode *n = &topo->nodes[i];

                if (n->is_gpu && n->gpu_id) {
                        if (m->n_gpus == THUNK_MODEL_MAX_GPUS) {
                                free(m);
                                return -EINVAL;
                        }
                        gpu_from_node(&m->gpus[m->n_gpus], n);
                        if (m->gpus[m->n_gpus].svm)
                                m->svm_supported |= 1ULL << m->n_gpus;
                        m->n_gpus++;
                }
                /* System memory is every SYSTEM heap, on CPU nodes and on APU nodes (CPU and GPU in one). */
                for (size_t b = 0; b < n->n_mem_banks; b++)
                        if (n->mem_banks[b].heap_type == HSA_MEM_HEAP_TYPE_SYSTEM)
                                ram += n->mem_banks[b].size_in_bytes;
        }
        if (m->n_gpus == 0) {
                free(m);
                return -EINVAL;
        }
        if (o.system_memory_bytes)
                ram = o.system_memory_bytes;
        if (!ram)
                ram = 16ULL << 30;
        m->system_ram = ram;
        m->system_limit = ram - (ram >> 6);
        if (m->system_limit < (3ULL << 30))
                m->system_limit >>= 1;
        else
                m->system_limit -= 3ULL << 29;
        m->ttm_limit = o.ttm_limit_bytes ? o.ttm_limit_bytes : ram / 2;
        m->pt_reserve = ram >> 14 > MODEL_PT_RESERVE_MIN ? ram >> 14 : MODEL_PT_RESERVE_MIN;
        m->anchor = memfd_create("gpumem-model-dev", MFD_CLOEXEC);
        if (m->anchor < 0) {
                int r = -errno;

                free(m);
                return r;
        }
        {
                pthread_condattr_t ca;

                pthread_condattr_init(&ca);
                pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
                pthread_cond_init(&m->event_cond, &ca);
                pthread_condattr_destroy(&ca);
        }
        pthread_cond_init(&m->cp_cond, NULL);
        pthread_mutex_init(&m->lock, NULL);
        *ret = m;
        return 0;
}

ThunkModel *thunk_model_free(ThunkModel *m)
{
        if (!m)
                return NULL;
        model_cp_stop(m);
        pthread_mutex_lock(&m->lock);
        /* render fds first keeps files alive only through contexts, which then release them */
        while (m->n_fds)
                fd_release(m, m->n_fds - 1);
        while (m->ctxs)
                ctx_destroy(m, m->ctxs);
        while (m->files) {
                m->files->refs = 1;
                file_unref(m, m->files);
        }
        while (m->bufs) {
                m->bufs->refs = 1;
                buf_unref(m, m->bufs);
        }
        free(m->fds);
        close(m->anchor);
        pthread_mutex_unlock(&m->lock);
        pthread_mutex_destroy(&m->lock);
        pthread_cond_destroy(&m->event_cond);
        pthread_cond_destroy(&m->cp_cond);
        free(m);
        return NULL;
}

void thunk_model_get_stats(ThunkModel *m, ThunkModelStats *ret)
{
        ThunkModelStats s;
        ModelCtx *primary;

        memset(&s, 0, sizeof(s));
        pthread_mutex_lock(&m->lock);
        primary = ctx_primary(m);
        (void)svm_flush(m, primary);
        for (size_t i = 0; i < m->n_fds; i++) {
                if (m->fds[i].kind == FD_KFD)
                        s.kfd_fds++;
                else
                        s.render_fds++;
        }
        for (ModelCtx *c = m->ctxs; c; c = c->next) {
                s.contexts++;
                s.svm_ranges += c->n_svm;
                s.queues += (uint32_t)c->n_queues;
                s.events += (uint32_t)c->n_events;
                for (size_t g = 0; g < m->n_gpus; g++)
                        for (size_t i = 0; i < c->pdd[g].cap_idr; i++)
                                if (c->pdd[g].idr[i]) {
                                        s.mems++;
                                        if (c->pdd[g].idr[i]->import)
                                                s.imports++;
                                }
        }
        for (ModelFile *f = m->files; f; f = f->next) {
                s.render_files++;
                s.mappings += f->vm.n;
                s.gem_handles += f->n_gems;
        }
        for (ModelBuf *b = m->bufs; b; b = b->next)
                s.bufs++;
        s.system_used = (uint64_t)m->system_used;
        s.ttm_used = (uint64_t)m->ttm_used;
        s.n_gpus = (uint32_t)m->n_gpus;
        for (size_t g = 0; g < m->n_gpus; g++)
                s.vram_used[g] = (uint64_t)m->gpus[g].vram_used;
        pthread_mutex_unlock(&m->lock);
        *ret = s;
}

int thunk_model_inject_fault(ThunkModel *m, unsigned long request, unsigned int nth_call, int err)
{
        int r = 0;

        if (nth_call == 0 || err <= 0)
                return -EINVAL;
        pthread_mutex_lock(&m->lock);
        if (m->n_faults == MODEL_MAX_FAULTS)
                r = -ENOSPC;
        else
                m->faults[m->n_faults++] = (ModelFault){.type = _IOC_TYPE(request),
                                                        .nr = _IOC_NR(request),
                                                        .remaining = nth_call,
                                                        .err = err};
        pthread_mutex_unlock(&m->lock);
        return r;
}

void thunk_model_clear_faults(ThunkModel *m)
{
        pthread_mutex_lock(&m->lock);
        m->n_faults = 0;
        pthread_mutex_unlock(&m->lock);
}
