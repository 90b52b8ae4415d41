/* The software KFD: process contexts, fds, ioctl dispatch, mmap and the seam (see docs/thunk-model.md). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>
#include <linux/kfd_sysfs.h>

#include "kfd-ioctls.h"
#include "model-private.h"

/* ------------------------------------------------------------------ helpers */

int model_gpu_index(const ThunkModel *m, uint32_t gpu_id)
{
        for (size_t i = 0; i < m->n_gpus; i++)
                if (m->gpus[i].gpu_id == gpu_id)
                        return (int)i;
        return -1;
}

ModelFd *model_fd_lookup(ThunkModel *m, int fd)
{
        for (size_t i = 0; i < m->n_fds; i++)
                if (m->fds[i].fd == fd)
                        return &m->fds[i];
        return NULL;
}

/* ------------------------------------------------------------------ the lock */

static void ctx_release(ThunkModel *m, ModelCtx *c);

void model_lock(ThunkModel *m)
{
        pthread_mutex_lock(&m->lock);
}

void model_unlock(ThunkModel *m)
{
        pthread_mutex_unlock(&m->lock);
}

void model_ctx_eng_lock(ModelCtx *c)
{
        __atomic_add_fetch(&c->eng_asked, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&c->eng);
        c->eng_served++;
        pthread_cond_broadcast(&c->eng_cond);
}

void model_ctx_enter(ThunkModel *m, ModelCtx *c)
{
        c->refs++;
        model_unlock(m);
        model_ctx_eng_lock(c);
        model_lock(m);
}

void model_ctx_leave(ThunkModel *m, ModelCtx *c)
{
        /* the last reference: released before the eng lock goes, so the engines never see it half gone */
        if (--c->refs == 0)
                ctx_release(m, c);
        pthread_mutex_unlock(&c->eng);
        if (c->refs == 0 && !c->pins)
                model_ctx_free(c);
}

/* ------------------------------------------------------------------ contexts */

/* Its last reference went: everything it holds goes, and it leaves the list; the memory stays while the
 * engines' thread holds a pin on it (model_ctx_free then). Under the model's lock, and its eng lock where
 * the engines' thread may run. */
static void ctx_release(ThunkModel *m, ModelCtx *c)
{
        model_ctx_release_queues(m, c);
        for (size_t g = 0; g < m->n_gpus; g++) {
                ModelPdd *pdd = &c->pdd[g];

                for (size_t i = 0; i < pdd->cap_idr; i++)
                        if (pdd->idr[i])
                                model_mem_destroy(m, c, pdd->idr[i]);
                free(pdd->idr);
        }
        for (size_t g = 0; g < m->n_gpus; g++) {
                c->pdd[g].idr = NULL;
                c->pdd[g].cap_idr = 0;
                if (c->pdd[g].file) {
                        c->pdd[g].file->compute_ctx = NULL;
                        model_file_unref(m, c->pdd[g].file);
                        c->pdd[g].file = NULL;
                }
        }
        model_svm_release(m, c);
        free(c->svm);
        free(c->svm_spare);
        c->svm = c->svm_spare = NULL;
        c->cap_svm = c->cap_svm_spare = 0;
        for (ModelCtx **p = &m->ctxs; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        MODEL_COUNT(m->cnt.contexts, -1);
        c->dead = true;
}

void model_ctx_free(ModelCtx *c)
{
        pthread_cond_destroy(&c->eng_cond);
        pthread_mutex_destroy(&c->eng);
        free(c);
}

void model_ctx_unref(ThunkModel *m, ModelCtx *c)
{
        if (c && --c->refs == 0) {
                ctx_release(m, c);
                if (!c->pins)
                        model_ctx_free(c);
        }
}

static ModelCtx *ctx_new(ThunkModel *m, bool primary)
{
        ModelCtx *c = calloc(1, sizeof(*c));

        if (!c)
                return NULL;
        c->primary = primary;
        c->xnack = m->xnack_default;
        c->refs = 1;
        pthread_mutex_init(&c->eng, NULL);
        pthread_cond_init(&c->eng_cond, NULL);
        c->next = m->ctxs;
        m->ctxs = c;
        MODEL_COUNT(m->cnt.contexts, 1);
        return c;
}

static ModelCtx *ctx_primary(ThunkModel *m)
{
        for (ModelCtx *c = m->ctxs; c; c = c->next)
                if (c->primary)
                        return c;
        return NULL;
}

int model_idr_alloc(ModelPdd *pdd, ModelMem *mem)
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

                if (ARRAY_RESERVE(pdd->idr, pdd->cap_idr, i + 1, 8) < 0)
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

/* ------------------------------------------------------------------ per-process KFD ioctls */

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

/* ------------------------------------------------------------------ dispatch */

/*
 * One table shape for both drivers. A row is what the kernel's own table holds for an ioctl: its number, the
 * size and direction of the driver's struct (the caller's request only says how much of it to copy), the ABI
 * minor that introduced it, and the handler. Rows are indexed by number; a row without a handler is a
 * number the driver knows but the model does not serve.
 */
typedef struct ModelIoctl {
        unsigned int nr;
        unsigned int size; /* _IOC_SIZE of the driver's own request */
        unsigned int dir;  /* _IOC_READ | _IOC_WRITE of it */
        uint32_t min_minor;
        int (*fn)(Call *c);
} ModelIoctl;

/*
 * The handler of each ioctl of the lists (kfd-ioctls.h), NULL where the model refuses it. Every entry is
 * named here: one added to the lists does not build until the model says what it does with it.
 */
#define MODEL_GET_VERSION               kfd_get_version
#define MODEL_CREATE_QUEUE              model_kfd_create_queue
#define MODEL_DESTROY_QUEUE             model_kfd_destroy_queue
#define MODEL_SET_MEMORY_POLICY         kfd_set_memory_policy
#define MODEL_GET_CLOCK_COUNTERS        model_kfd_get_clock_counters
#define MODEL_GET_PROCESS_APERTURES     kfd_get_process_apertures
#define MODEL_UPDATE_QUEUE              model_kfd_update_queue
#define MODEL_CREATE_EVENT              model_kfd_create_event
#define MODEL_DESTROY_EVENT             model_kfd_destroy_event
#define MODEL_SET_EVENT                 model_kfd_set_event
#define MODEL_RESET_EVENT               model_kfd_reset_event
#define MODEL_WAIT_EVENTS               model_kfd_wait_events
#define MODEL_DBG_REGISTER              NULL /* the old debugger interface */
#define MODEL_DBG_UNREGISTER            NULL
#define MODEL_DBG_ADDRESS_WATCH         NULL
#define MODEL_DBG_WAVE_CONTROL          NULL
#define MODEL_SET_SCRATCH_BACKING_VA    kfd_set_scratch_backing_va
#define MODEL_GET_TILE_CONFIG           model_kfd_get_tile_config
#define MODEL_SET_TRAP_HANDLER          model_kfd_set_trap_handler
#define MODEL_GET_PROCESS_APERTURES_NEW kfd_get_process_apertures_new
#define MODEL_ACQUIRE_VM                kfd_acquire_vm
#define MODEL_ALLOC_MEMORY_OF_GPU       model_kfd_alloc_memory_of_gpu
#define MODEL_FREE_MEMORY_OF_GPU        model_kfd_free_memory_of_gpu
#define MODEL_MAP_MEMORY_TO_GPU         model_kfd_map_memory_to_gpu
#define MODEL_UNMAP_MEMORY_FROM_GPU     model_kfd_unmap_memory_from_gpu
#define MODEL_SET_CU_MASK               NULL /* queue tuning, wave state, GWS: not modelled */
#define MODEL_GET_QUEUE_WAVE_STATE      NULL
#define MODEL_GET_DMABUF_INFO           model_kfd_get_dmabuf_info
#define MODEL_IMPORT_DMABUF             model_kfd_import_dmabuf
#define MODEL_ALLOC_QUEUE_GWS           NULL
#define MODEL_SMI_EVENTS                NULL /* the profiler's events, CRIU: not modelled */
#define MODEL_SVM                       model_kfd_svm
#define MODEL_SET_XNACK_MODE            model_kfd_set_xnack_mode
#define MODEL_CRIU_OP                   NULL
#define MODEL_AVAILABLE_MEMORY          model_kfd_available_memory
#define MODEL_EXPORT_DMABUF             model_kfd_export_dmabuf
#define MODEL_RUNTIME_ENABLE            kfd_runtime_enable
#define MODEL_DBG_TRAP                  NULL /* the debugger */
#define MODEL_CREATE_PROCESS            kfd_create_process
#define MODEL_DRM_VERSION               NULL /* libdrm's queries: the DRM core's answer to any unserved ioctl */
#define MODEL_DRM_GET_CLIENT            NULL
#define MODEL_DRM_GEM_CLOSE             model_drm_gem_close
#define MODEL_DRM_PRIME_HANDLE_TO_FD    model_drm_prime_handle_to_fd
#define MODEL_DRM_PRIME_FD_TO_HANDLE    model_drm_prime_fd_to_handle
#define MODEL_AMDGPU_GEM_MMAP           model_drm_amdgpu_gem_mmap
#define MODEL_AMDGPU_INFO               NULL
#define MODEL_AMDGPU_GEM_VA             model_drm_amdgpu_gem_va

#define MODEL_ROW(name, req, args, minor)                                                                    \
        [_IOC_NR(req)] = {_IOC_NR(req), _IOC_SIZE(req), _IOC_DIR(req), minor, MODEL_##name},

static const ModelIoctl kfd_rows[] = {THUNK_KFD_IOCTLS(MODEL_ROW)};
static const ModelIoctl drm_rows[] = {THUNK_DRM_IOCTLS(MODEL_ROW)};

/* What an fd's driver serves, and how it answers numbers outside that. */
typedef struct ModelDriver {
        unsigned int type; /* the _IOC_TYPE its requests carry */
        const ModelIoctl *rows;
        unsigned int n_rows;
        unsigned int first;                  /* the lowest number of its table */
        unsigned int (*end)(uint32_t minor); /* one past its last number at an ABI minor; NULL: the table's */
        int outside;                         /* a number outside its table at this minor */
        int unserved;                        /* a number in its table that has no handler here */
} ModelDriver;

static const ModelDriver kfd_driver = {
        .type = AMDKFD_IOCTL_BASE,
        .rows = kfd_rows,
        .n_rows = sizeof(kfd_rows) / sizeof(kfd_rows[0]),
        .first = AMDKFD_COMMAND_START,
        .end = thunk_kfd_command_end,
        /* kfd_ioctl() answers a number past its table or outside [COMMAND_START, COMMAND_END) -ENOTTY, so
         * that user space can tell an ioctl the running kernel lacks from a bad argument; at a lower minor
         * the ioctls introduced later are not in the table */
        .outside = -ENOTTY,
        /* in the kernel's table, but the debugger, CRIU, SMI... are not modelled */
        .unserved = -EOPNOTSUPP,
};

static const ModelDriver drm_driver = {
        .type = DRM_IOCTL_BASE,
        .rows = drm_rows,
        .n_rows = sizeof(drm_rows) / sizeof(drm_rows[0]),
        .first = 0,
        .end = NULL,
        /* the DRM core answers every number it has no handler for alike, inside its tables or not */
        .outside = -EINVAL,
        .unserved = -EINVAL,
};

/* The row serving @request on @drv at ABI @minor: -ENOTTY for another driver's request (the model does
 * not run an unrelated handler), drv->outside outside the table at this minor (a row's minor above it is
 * outside too), drv->unserved for a hole. */
static int ioctl_lookup(const ModelDriver *drv, uint32_t minor, unsigned long request, const ModelIoctl **ret)
{
        unsigned int nr = _IOC_NR(request), end = drv->n_rows;
        const ModelIoctl *row;

        if (_IOC_TYPE(request) != drv->type)
                return -ENOTTY;
        if (drv->end && drv->end(minor) < end)
                end = drv->end(minor);
        if (nr < drv->first || nr >= end)
                return drv->outside;
        row = &drv->rows[nr];
        if (row->min_minor > minor)
                return drv->outside;
        if (!row->fn)
                return drv->unserved;
        *ret = row;
        return 0;
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
        size_t usize = _IOC_SIZE(request), asize;
        uint64_t stackbuf[32];
        void *kbuf = stackbuf;
        const ModelIoctl *d = NULL;
        Call call = {.m = m, .ctx = e->ctx, .file = e->file, .ent = e, .usize = usize};
        int r, err = -EIO;

        r = ioctl_lookup(e->kind == FD_KFD ? &kfd_driver : &drm_driver, m->minor, request, &d);
        if (r < 0)
                return r;
        asize = usize > d->size ? usize : d->size;
        if ((d->dir & (_IOC_READ | _IOC_WRITE)) && asize) {
                if (!arg && usize)
                        return -EFAULT;
                if (asize > sizeof(stackbuf)) {
                        kbuf = calloc(1, asize);
                        if (!kbuf)
                                return -ENOMEM;
                        if ((d->dir & _IOC_WRITE) && usize)
                                memcpy(kbuf, arg, usize);
                } else if ((d->dir & _IOC_WRITE) && usize) {
                        /* what the caller's struct does not cover reads as zero, as the kernel's copy */
                        memcpy(kbuf, arg, usize);
                        memset((uint8_t *)kbuf + usize, 0, asize - usize);
                } else {
                        memset(kbuf, 0, asize);
                }
        }
        call.arg = kbuf;
        if (take_fault(m, request, &err)) {
                r = err;
        } else {
                r = d->fn(&call);
        }
        if ((d->dir & _IOC_READ) && usize)
                memcpy(arg, kbuf, usize);
        if (kbuf != stackbuf)
                free(kbuf);
        return r;
}

/* The context whose engines read what a call on @e may change: a kfd fd's, or the one that acquired a render
 * file's VM; NULL for a render file no context acquired. */
static ModelCtx *fd_engines(const ModelFd *e)
{
        return e->kind == FD_KFD ? e->ctx : e->file->compute_ctx;
}

/*
 * Under the model's lock: the entry @fd (NULL if none) in *@ret_e, with the eng lock of the context whose
 * engines read what a call on it may change taken first (model_ctx_enter): that context, to be left with
 * model_ctx_leave(), or NULL.
 */
static ModelCtx *fd_enter(ThunkModel *m, int fd, ModelFd **ret_e)
{
        for (;;) {
                ModelFd *e = model_fd_lookup(m, fd);
                ModelCtx *c = e ? fd_engines(e) : NULL;

                *ret_e = e;
                if (!c)
                        return NULL;
                model_ctx_enter(m, c);
                /* the model's lock was let go meanwhile: the fd may be gone or its VM acquired since */
                e = model_fd_lookup(m, fd);
                if (e && fd_engines(e) == c) {
                        *ret_e = e;
                        return c;
                }
                model_ctx_leave(m, c);
        }
}

int thunk_model_ioctl(ThunkModel *m, int fd, unsigned long request, void *arg)
{
        ModelCtx *owner;
        ModelFd *e;
        int r;

        if (!m)
                return -EINVAL;
        model_lock(m);
        owner = fd_enter(m, fd, &e);
        r = e ? dispatch(m, e, request, arg) : -EBADF;
        if (owner)
                model_ctx_leave(m, owner);
        model_unlock(m);
        return r;
}

/* ------------------------------------------------------------------ fds */

static int fd_add(ThunkModel *m, int kind, ModelCtx *ctx, ModelFile *file, int *ret_fd)
{
        int fd;

        if (ARRAY_RESERVE(m->fds, m->cap_fds, m->n_fds + 1, 8) < 0)
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
        int r;

        model_lock(m);
        c = ctx_primary(m);
        if (c)
                c->refs++;
        else
                c = ctx_new(m, true);
        if (!c) {
                r = -ENOMEM;
        } else {
                r = fd_add(m, FD_KFD, c, NULL, ret_fd);
                if (r < 0)
                        model_ctx_unref(m, c); /* a new one goes: no engine knew it */
        }
        model_unlock(m);
        return r;
}

int thunk_model_open_render(ThunkModel *m, uint32_t minor, int *ret_fd)
{
        ModelFile *f;
        int g = -1, r;

        model_lock(m);
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
        f->vm.total = &m->cnt.mappings;
        r = fd_add(m, FD_RENDER, NULL, f, ret_fd);
        if (r < 0) {
                free(f);
                goto out;
        }
        f->next = m->files;
        m->files = f;
out:
        model_unlock(m);
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
                model_file_unref(m, e.file);
}

int thunk_model_close(ThunkModel *m, int fd)
{
        ModelCtx *owner;
        ModelFd *e;
        int r = -EBADF;

        model_lock(m);
        /* a context whose last fd this is goes when it is left, under its eng lock no more */
        owner = fd_enter(m, fd, &e);
        if (e) {
                fd_release(m, (size_t)(e - m->fds));
                r = 0;
        }
        if (owner)
                model_ctx_leave(m, owner);
        model_unlock(m);
        return r;
}

bool thunk_model_owns_fd(ThunkModel *m, int fd)
{
        bool r;

        model_lock(m);
        r = model_fd_lookup(m, fd) != NULL;
        model_unlock(m);
        return r;
}

int thunk_model_mmap(ThunkModel *m, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                     void **ret)
{
        ModelBuf *b = NULL;
        ModelCtx *owner;
        ModelFd *e;
        int r = 0;

        model_lock(m);
        owner = fd_enter(m, fd, &e);
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
        } else {
                /* as in DRM: the exact start of an object, no longer than it, on a file allowed to see it */
                b = model_buf_at_offset(m, offset);
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
        }
        r = model_buf_mmap(b, addr, len, prot, flags, ret);
out:
        if (owner)
                model_ctx_leave(m, owner);
        model_unlock(m);
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

static int seam_munmap(void *impl, void *addr, size_t len)
{
        return thunk_model_munmap(impl, addr, len);
}

static const ThunkSeamOps model_ops = {
        .name = "model",
        .open_kfd = seam_open_kfd,
        .open_render = seam_open_render,
        .ioctl = seam_ioctl,
        .mmap = seam_mmap,
        .close = seam_close,
        .munmap = seam_munmap,
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
        m->file_per_buffer = o.file_per_buffer;
        m->doorbells = o.doorbells;
        m->doorbell_kicks = o.doorbells && o.doorbell_kicks;
        m->unmap_notices = o.unmap_notices;
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
                int r = model_heaps_init(m);

                if (r < 0) {
                        close(m->anchor);
                        free(m);
                        return r;
                }
        }
        {
                pthread_condattr_t ca;

                pthread_condattr_init(&ca);
                pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
                pthread_cond_init(&m->event_cond, &ca);
                pthread_condattr_destroy(&ca);
        }
        pthread_cond_init(&m->cp_cond, NULL);
        pthread_mutex_init(&m->views_mu, NULL);
        pthread_mutex_init(&m->event_mu, NULL);
        pthread_mutex_init(&m->lock, NULL);
        *ret = m;
        return 0;
}

ThunkModel *thunk_model_free(ThunkModel *m)
{
        if (!m)
                return NULL;
        model_cp_stop(m);
        model_lock(m);
        /* render fds first keeps files alive only through contexts, which then release them */
        while (m->n_fds)
                fd_release(m, m->n_fds - 1);
        while (m->ctxs) { /* the engines stopped: nothing pins them */
                ModelCtx *c = m->ctxs;

                ctx_release(m, c);
                model_ctx_free(c);
        }
        while (m->files) {
                m->files->refs = 1;
                model_file_unref(m, m->files);
        }
        while (m->bufs) {
                m->bufs->refs = 1;
                model_buf_unref(m, m->bufs);
        }
        free(m->fds);
        model_heaps_done(m);
        hashmap_done(&m->by_offset);
        hashmap_done(&m->by_ino);
        close(m->anchor);
        model_unlock(m);
        pthread_mutex_destroy(&m->lock);
        pthread_cond_destroy(&m->event_cond);
        pthread_cond_destroy(&m->cp_cond);
        pthread_mutex_destroy(&m->views_mu);
        pthread_mutex_destroy(&m->event_mu);
        free(m);
        return NULL;
}

void thunk_model_get_stats(ThunkModel *m, ThunkModelStats *ret)
{
        ThunkModelStats s;
        ModelCtx *primary;

        memset(&s, 0, sizeof(s));
        model_lock(m);
        primary = ctx_primary(m);
        if (primary) {
                model_ctx_enter(m, primary);
                (void)model_svm_flush(m, primary);
                model_ctx_leave(m, primary);
        }
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
        s.bufs = m->n_bufs;
        model_heaps_stats(m, &s);
        s.system_used = (uint64_t)m->system_used;
        s.ttm_used = (uint64_t)m->ttm_used;
        s.n_gpus = (uint32_t)m->n_gpus;
        for (size_t g = 0; g < m->n_gpus; g++)
                s.vram_used[g] = (uint64_t)m->gpus[g].vram_used;
        model_unlock(m);
        *ret = s;
}

void thunk_model_peek_stats(ThunkModel *m, ThunkModelStats *ret)
{
        ThunkModelStats s;

        memset(&s, 0, sizeof(s));
        s.contexts = (uint32_t)__atomic_load_n(&m->cnt.contexts, __ATOMIC_RELAXED);
        s.mems = __atomic_load_n(&m->cnt.mems, __ATOMIC_RELAXED);
        s.imports = __atomic_load_n(&m->cnt.imports, __ATOMIC_RELAXED);
        s.mappings = __atomic_load_n(&m->cnt.mappings, __ATOMIC_RELAXED);
        s.gem_handles = __atomic_load_n(&m->cnt.gem_handles, __ATOMIC_RELAXED);
        s.svm_ranges = __atomic_load_n(&m->cnt.svm_ranges, __ATOMIC_RELAXED);
        s.queues = __atomic_load_n(&m->n_queues, __ATOMIC_RELAXED);
        s.bufs = __atomic_load_n(&m->n_bufs, __ATOMIC_RELAXED);
        s.system_used = (uint64_t)__atomic_load_n(&m->system_used, __ATOMIC_RELAXED);
        s.ttm_used = (uint64_t)__atomic_load_n(&m->ttm_used, __ATOMIC_RELAXED);
        s.n_gpus = (uint32_t)m->n_gpus; /* fixed at the model's start */
        for (size_t g = 0; g < m->n_gpus; g++)
                s.vram_used[g] = (uint64_t)__atomic_load_n(&m->gpus[g].vram_used, __ATOMIC_RELAXED);
        *ret = s;
}

uint64_t thunk_model_engine_rounds(ThunkModel *m)
{
        return __atomic_load_n(&m->cnt.engine_rounds, __ATOMIC_RELAXED);
}

int thunk_model_inject_fault(ThunkModel *m, unsigned long request, unsigned int nth_call, int err)
{
        int r = 0;

        if (nth_call == 0 || err <= 0)
                return -EINVAL;
        model_lock(m);
        if (m->n_faults == MODEL_MAX_FAULTS)
                r = -ENOSPC;
        else
                m->faults[m->n_faults++] = (ModelFault){.type = _IOC_TYPE(request),
                                                        .nr = _IOC_NR(request),
                                                        .remaining = nth_call,
                                                        .err = err};
        model_unlock(m);
        return r;
}

void thunk_model_clear_faults(ThunkModel *m)
{
        model_lock(m);
        m->n_faults = 0;
        model_unlock(m);
}
