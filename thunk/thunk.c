/* The thunk's device and context layer: topology, backend choice, KFD version gating, apertures, GPU VMs. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xf86drm.h>

#include "kfd-compat.h"
#include "model.h"
#include "thunk-private.h"

static const struct {
        const char *name;
        uint32_t minor;
} feature_table[_THUNK_FEATURE_MAX] = {
        [THUNK_FEATURE_SVM] = {"svm", 5},
        [THUNK_FEATURE_AVAILABLE_MEMORY] = {"available-memory", 9},
        [THUNK_FEATURE_EXPORT_DMABUF] = {"export-dmabuf", 12},
        [THUNK_FEATURE_GEM_VA] = {"gem-va", 15},
        [THUNK_FEATURE_CONTIGUOUS] = {"contiguous", 16},
        [THUNK_FEATURE_CREATE_PROCESS] = {"create-process", 19},
};

uint32_t thunk_feature_min_minor(ThunkFeature f)
{
        if ((unsigned)f >= _THUNK_FEATURE_MAX)
                return 0;
        return feature_table[f].minor;
}

const char *thunk_feature_name(ThunkFeature f)
{
        if ((unsigned)f >= _THUNK_FEATURE_MAX)
                return NULL;
        return feature_table[f].name;
}

bool thunk_device_has(const ThunkDevice *d, ThunkFeature f)
{
        if (!d || (unsigned)f >= _THUNK_FEATURE_MAX)
                return false;
        return d->major == 1 && d->minor >= feature_table[f].minor;
}

__attribute__((format(printf, 4, 5))) static int set_error(char *errbuf, size_t errlen, int r,
                                                           const char *fmt, ...)
{
        va_list ap;

        if (errbuf && errlen > 0) {
                va_start(ap, fmt);
                vsnprintf(errbuf, errlen, fmt, ap);
                va_end(ap);
        }
        return r;
}

int thunk_gpu_index(const ThunkDevice *d, uint32_t gpu_id)
{
        for (size_t i = 0; i < d->n_gpus; i++)
                if (d->gpus[i].gpu_id == gpu_id)
                        return (int)i;
        return -ENODEV;
}

/* ---- contexts ------------------------------------------------------------------------------------- */

static void context_close_fds(ThunkContext *c)
{
        ThunkDevice *d = c->dev;

        /* The KFD fd first: the process it names holds its own references on the render nodes' files. */
        if (c->kfd_fd >= 0)
                (void)thunk_close_fd(d, c->kfd_fd);
        c->kfd_fd = -1;
        for (size_t i = 0; c->render_fds && i < d->n_gpus; i++) {
                if (c->render_fds[i] >= 0)
                        (void)thunk_close_fd(d, c->render_fds[i]);
                c->render_fds[i] = -1;
        }
}

static void context_destroy(ThunkContext *c)
{
        if (!c)
                return;
        thunk_context_unmap_doorbells(c);
        context_close_fds(c);
        thunk_context_drop_objects(c);
        pthread_mutex_destroy(&c->lock);
        free(c->render_fds);
        free(c->gem_refs);
        free(c->doorbells);
        free(c);
}

static int context_alloc(ThunkDevice *d, bool primary, ThunkContext **ret)
{
        ThunkContext *c;

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->dev = d;
        c->primary = primary;
        c->kfd_fd = -1;
        c->render_fds = calloc(d->n_gpus ? d->n_gpus : 1, sizeof(*c->render_fds));
        c->gem_refs = calloc(d->n_gpus ? d->n_gpus : 1, sizeof(*c->gem_refs));
        c->doorbells = calloc(d->n_gpus ? d->n_gpus : 1, sizeof(*c->doorbells));
        if (!c->render_fds || !c->gem_refs || !c->doorbells) {
                free(c->render_fds);
                free(c->gem_refs);
                free(c->doorbells);
                free(c);
                return -ENOMEM;
        }
        for (size_t i = 0; i < d->n_gpus; i++)
                c->render_fds[i] = -1;
        pthread_mutex_init(&c->lock, NULL);
        *ret = c;
        return 0;
}

/*
 * Give the context's KFD process a GPU VM on every GPU: a fresh DRM file per render node (a DRM file's VM
 * can become the compute VM of one KFD process only), handed to ACQUIRE_VM. The fds are kept for the
 * context's lifetime: the kernel's process holds the file, and GEM_VA calls must reach the same VM.
 */
static int context_acquire_vms(ThunkContext *c, char *errbuf, size_t errlen)
{
        ThunkDevice *d = c->dev;
        int r;

        for (size_t i = 0; i < d->n_gpus; i++) {
                const ThunkGpu *g = &d->gpus[i];
                struct kfd_ioctl_acquire_vm_args acq = {0};

                r = d->seam.ops->open_render(d->seam.impl, g->drm_render_minor, &c->render_fds[i]);
                if (r < 0)
                        return set_error(errbuf, errlen, r,
                                         "GPU %u (node %u): cannot open /dev/dri/renderD%u: %s", g->gpu_id,
                                         g->node_id, g->drm_render_minor, strerror(-r));
                acq.drm_fd = (uint32_t)c->render_fds[i];
                acq.gpu_id = g->gpu_id;
                r = thunk_ioctl(d, c->kfd_fd, AMDKFD_IOC_ACQUIRE_VM, &acq);
                if (r < 0)
                        return set_error(errbuf, errlen, r,
                                         "GPU %u (node %u): ACQUIRE_VM on renderD%u failed: %s", g->gpu_id,
                                         g->node_id, g->drm_render_minor, strerror(-r));
        }
        return 0;
}

ThunkContext *thunk_device_primary_context(ThunkDevice *d)
{
        return d ? d->primary : NULL;
}

int thunk_context_new(ThunkDevice *d, ThunkContext **ret)
{
        ThunkContext *c = NULL;
        int r;

        if (!d || !ret)
                return -EINVAL;
        if (!thunk_device_has(d, THUNK_FEATURE_CREATE_PROCESS))
                return -EOPNOTSUPP;

        r = context_alloc(d, false, &c);
        if (r < 0)
                return r;
        r = d->seam.ops->open_kfd(d->seam.impl, &c->kfd_fd);
        if (r < 0)
                goto fail;
        /* Without this the new fd would name the process's primary KFD context again. */
        r = thunk_ioctl(d, c->kfd_fd, AMDKFD_IOC_CREATE_PROCESS, NULL);
        if (r < 0)
                goto fail;
        r = context_acquire_vms(c, NULL, 0);
        if (r < 0)
                goto fail;

        pthread_mutex_lock(&d->ctx_lock);
        THUNK_LIST_PUSH(d->contexts, c);
        pthread_mutex_unlock(&d->ctx_lock);
        *ret = c;
        return 0;
fail:
        context_destroy(c);
        return r;
}

ThunkContext *thunk_context_free(ThunkContext *c)
{
        ThunkDevice *d;

        if (!c || c->primary)
                return NULL;
        d = c->dev;
        pthread_mutex_lock(&d->ctx_lock);
        THUNK_LIST_UNLINK(d->contexts, c);
        pthread_mutex_unlock(&d->ctx_lock);
        context_destroy(c);
        return NULL;
}

bool thunk_context_is_primary(const ThunkContext *c)
{
        return c && c->primary;
}

ThunkDevice *thunk_context_device(const ThunkContext *c)
{
        return c ? c->dev : NULL;
}

int thunk_context_kfd_fd(const ThunkContext *c)
{
        return c ? c->kfd_fd : -EINVAL;
}

int thunk_context_render_fd(const ThunkContext *c, uint32_t gpu_id)
{
        int i;

        if (!c)
                return -EINVAL;
        i = thunk_gpu_index(c->dev, gpu_id);
        if (i < 0)
                return i;
        return c->render_fds[i];
}

/* ---- device --------------------------------------------------------------------------------------- */

/*
 * On the real KFD the render node of a GPU is named by the topology's drm_render_minor. Kernels that do
 * not report it (0) are served by looking the GPU's PCI address up among libdrm's devices.
 */
static int resolve_render_minor_from_drm(ThunkGpu *g)
{
        drmDevicePtr devs[64];
        int n, r = -ENODEV;

        n = drmGetDevices2(0, devs, (int)(sizeof(devs) / sizeof(devs[0])));
        if (n < 0)
                return n;
        for (int i = 0; i < n; i++) {
                const drmDevicePtr dev = devs[i];
                unsigned minor;

                if (dev->bustype != DRM_BUS_PCI || !(dev->available_nodes & (1 << DRM_NODE_RENDER)))
                        continue;
                if (dev->businfo.pci->domain != g->pci_domain || dev->businfo.pci->bus != g->pci_bus ||
                    dev->businfo.pci->dev != g->pci_dev || dev->businfo.pci->func != g->pci_func)
                        continue;
                if (sscanf(dev->nodes[DRM_NODE_RENDER], "/dev/dri/renderD%u", &minor) == 1) {
                        g->drm_render_minor = minor;
                        r = 0;
                }
                break;
        }
        drmFreeDevices(devs, n);
        return r;
}

static int device_collect_gpus(ThunkDevice *d, char *errbuf, size_t errlen)
{
        const ThunkTopology *t = d->topo;

        d->gpus = calloc(t->n_gpus ? t->n_gpus : 1, sizeof(*d->gpus));
        if (!d->gpus)
                return set_error(errbuf, errlen, -ENOMEM, "out of memory");
        for (size_t i = 0; i < t->n_gpus; i++) {
                const ThunkNode *n = thunk_topology_gpu_by_index(t, i);
                ThunkGpu *g = &d->gpus[d->n_gpus];

                if (!n)
                        return set_error(errbuf, errlen, -EINVAL, "%s: GPU %zu missing from the topology",
                                         t->root, i);
                if (n->gpu_id == 0)
                        return set_error(errbuf, errlen, -EINVAL, "%s: node %u is a GPU without a gpu_id",
                                         t->root, n->node_id);
                g->gpu_id = n->gpu_id;
                g->node_id = n->node_id;
                g->drm_render_minor = n->drm_render_minor;
                g->pci_domain = n->domain;
                g->pci_bus = (n->location_id >> 8) & 0xff;
                g->pci_dev = (n->location_id >> 3) & 0x1f;
                g->pci_func = n->location_id & 0x7;
                if (g->drm_render_minor == 0 && d->backend == THUNK_BACKEND_KFD)
                        (void)resolve_render_minor_from_drm(g);
                if (g->drm_render_minor == 0)
                        return set_error(errbuf, errlen, -ENODEV,
                                         "GPU %u (node %u, PCI %04x:%02x:%02x.%u) has no render node",
                                         g->gpu_id, g->node_id, g->pci_domain, g->pci_bus, g->pci_dev,
                                         g->pci_func);
                d->n_gpus++;
        }
        return 0;
}

static int device_query_apertures(ThunkDevice *d, char *errbuf, size_t errlen)
{
        struct kfd_ioctl_get_process_apertures_new_args args = {0};
        struct kfd_process_device_apertures *ap;
        int r;

        d->svm_base = 0;
        d->svm_limit = 0;
        if (d->n_gpus == 0)
                return 0;

        ap = calloc(d->n_gpus, sizeof(*ap));
        if (!ap)
                return set_error(errbuf, errlen, -ENOMEM, "out of memory");
        args.kfd_process_device_apertures_ptr = (uint64_t)(uintptr_t)ap;
        args.num_of_nodes = (uint32_t)d->n_gpus;
        r = thunk_ioctl(d, d->primary->kfd_fd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &args);
        if (r < 0) {
                free(ap);
                return set_error(errbuf, errlen, r, "GET_PROCESS_APERTURES_NEW failed: %s", strerror(-r));
        }

        for (size_t i = 0; i < d->n_gpus; i++) {
                ThunkGpu *g = &d->gpus[i];
                size_t k;

                for (k = 0; k < args.num_of_nodes && k < d->n_gpus; k++)
                        if (ap[k].gpu_id == g->gpu_id)
                                break;
                if (k >= args.num_of_nodes || k >= d->n_gpus) {
                        free(ap);
                        return set_error(
                                errbuf, errlen, -ENODEV,
                                "GPU %u (node %u) is in the topology but the KFD reports no apertures "
                                "for it",
                                g->gpu_id, g->node_id);
                }
                g->apertures = (ThunkApertures){
                        .lds_base = ap[k].lds_base,
                        .lds_limit = ap[k].lds_limit,
                        .scratch_base = ap[k].scratch_base,
                        .scratch_limit = ap[k].scratch_limit,
                        .gpuvm_base = ap[k].gpuvm_base,
                        .gpuvm_limit = ap[k].gpuvm_limit,
                };
                if (i == 0 || g->apertures.gpuvm_base > d->svm_base)
                        d->svm_base = g->apertures.gpuvm_base;
                if (i == 0 || g->apertures.gpuvm_limit < d->svm_limit)
                        d->svm_limit = g->apertures.gpuvm_limit;
        }
        free(ap);
        if (d->svm_base >= d->svm_limit)
                return set_error(errbuf, errlen, -ERANGE, "the GPUs' GPUVM apertures do not intersect");
        return 0;
}

int thunk_device_open(const ThunkOptions *opts, ThunkDevice **ret, char *errbuf, size_t errlen)
{
        struct kfd_ioctl_get_version_args ver = {0};
        ThunkDevice *d;
        int r;

        if (errbuf && errlen > 0)
                errbuf[0] = '\0';
        if (!opts || !ret)
                return set_error(errbuf, errlen, -EINVAL, "invalid arguments");
        if (opts->backend != THUNK_BACKEND_KFD && opts->backend != THUNK_BACKEND_MODEL)
                return set_error(errbuf, errlen, -EINVAL, "unknown backend %d", (int)opts->backend);
        if (opts->backend == THUNK_BACKEND_MODEL && !opts->topology_root)
                return set_error(errbuf, errlen, -EINVAL,
                                 "the model backend needs a topology (preset) directory");

        d = calloc(1, sizeof(*d));
        if (!d)
                return set_error(errbuf, errlen, -ENOMEM, "out of memory");
        d->backend = opts->backend;
        pthread_mutex_init(&d->ctx_lock, NULL);
        d->page_size = (size_t)sysconf(_SC_PAGESIZE);

        r = thunk_topology_load(opts->topology_root, &d->topo, errbuf, errlen);
        if (r < 0)
                goto fail;
        r = device_collect_gpus(d, errbuf, errlen);
        if (r < 0)
                goto fail;

        if (opts->backend == THUNK_BACKEND_MODEL) {
                ThunkModelOptions mo = {0};

                mo.kfd_minor = opts->model_kfd_minor;
                mo.doorbells = opts->model_doorbells;
                mo.doorbell_kicks = opts->model_doorbell_kicks;
                mo.unmap_notices = opts->model_unmap_notices;
                r = thunk_model_new(d->topo, &mo, &d->model);
                if (r < 0) {
                        set_error(errbuf, errlen, r, "cannot create the KFD model on %s: %s", d->topo->root,
                                  strerror(-r));
                        goto fail;
                }
                thunk_model_seam(d->model, &d->seam);
        } else {
                d->seam = (ThunkSeam){.ops = &thunk_seam_kernel_ops, .impl = NULL};
        }

        r = context_alloc(d, true, &d->primary);
        if (r < 0) {
                set_error(errbuf, errlen, r, "out of memory");
                goto fail;
        }
        r = d->seam.ops->open_kfd(d->seam.impl, &d->primary->kfd_fd);
        if (r < 0) {
                set_error(errbuf, errlen, r, "cannot open /dev/kfd (%s backend): %s", d->seam.ops->name,
                          strerror(-r));
                goto fail;
        }
        r = thunk_ioctl(d, d->primary->kfd_fd, AMDKFD_IOC_GET_VERSION, &ver);
        if (r < 0) {
                set_error(errbuf, errlen, r, "GET_VERSION failed: %s", strerror(-r));
                goto fail;
        }
        if (ver.major_version != 1) {
                r = set_error(errbuf, errlen, -EPROTO, "unsupported KFD ABI %u.%u (need 1.x)",
                              ver.major_version, ver.minor_version);
                goto fail;
        }
        d->major = ver.major_version;
        d->minor = ver.minor_version;

        r = device_query_apertures(d, errbuf, errlen);
        if (r < 0)
                goto fail;
        r = context_acquire_vms(d->primary, errbuf, errlen);
        if (r < 0)
                goto fail;

        *ret = d;
        return 0;
fail:
        thunk_device_close(d);
        return r;
}

ThunkDevice *thunk_device_close(ThunkDevice *d)
{
        if (!d)
                return NULL;
        while (d->contexts)
                thunk_context_free(d->contexts);
        context_destroy(d->primary);
        d->primary = NULL;
        if (d->model)
                d->model = thunk_model_free(d->model);
        thunk_topology_free(d->topo);
        free(d->gpus);
        pthread_mutex_destroy(&d->ctx_lock);
        free(d);
        return NULL;
}

const ThunkTopology *thunk_device_topology(const ThunkDevice *d)
{
        return d ? d->topo : NULL;
}

void thunk_device_version(const ThunkDevice *d, uint32_t *ret_major, uint32_t *ret_minor)
{
        if (ret_major)
                *ret_major = d ? d->major : 0;
        if (ret_minor)
                *ret_minor = d ? d->minor : 0;
}

const char *thunk_device_backend_name(const ThunkDevice *d)
{
        if (!d)
                return NULL;
        return d->backend == THUNK_BACKEND_MODEL ? "model" : "kfd";
}

void *thunk_device_model(const ThunkDevice *d)
{
        return d ? d->model : NULL;
}

size_t thunk_device_gpu_count(const ThunkDevice *d)
{
        return d ? d->n_gpus : 0;
}

const ThunkGpu *thunk_device_gpu(const ThunkDevice *d, size_t index)
{
        if (!d || index >= d->n_gpus)
                return NULL;
        return &d->gpus[index];
}

const ThunkGpu *thunk_device_gpu_by_id(const ThunkDevice *d, uint32_t gpu_id)
{
        int i;

        if (!d)
                return NULL;
        i = thunk_gpu_index(d, gpu_id);
        return i < 0 ? NULL : &d->gpus[i];
}

void thunk_device_svm_aperture(const ThunkDevice *d, uint64_t *ret_base, uint64_t *ret_limit)
{
        if (ret_base)
                *ret_base = d ? d->svm_base : 0;
        if (ret_limit)
                *ret_limit = d ? d->svm_limit : 0;
}
