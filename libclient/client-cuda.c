/* libgpumem_client's row for the cuda backend (client-backend.h): the memory gpumemd allocates is imported
 * and mapped in this process's own CUDA context. */
#include "client-private.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda-api.h"

/*
 * A CUDA context belongs to the process that made it, so the daemon allocates and exports, and this
 * library imports each export, maps it and sets its access (docs/nvidia.md). CUDA chooses the addresses
 * of its own VA space, so the library reserves one range there as large as the client's window, its
 * image: memory the daemon placed at va in the window is mapped at image + (va - window base), and the
 * pointers the caller sees are those. Host memory stays at its window address, which CUDA registers.
 */

#define GM_CUDA_MAX_GPUS 64

typedef struct CudaGpuRef {
        uint32_t gpu_id;
        CUdevice dev;
        CUcontext ctx; /* the device's primary context, retained */
} CudaGpuRef;

typedef struct GmCuda {
        CudaApi api;
        CUresult (*ctx_get)(CUcontext *ret); /* cuCtxGetCurrent, to leave the caller's context as it was */
        CUdeviceptr image;
        uint64_t image_size;
        size_t n_gpus;
        CudaGpuRef gpus[GM_CUDA_MAX_GPUS];
        pthread_mutex_t lock; /* handles, maps */
        HashMap handles;      /* the daemon's handle → the CUDA handle of this process's import */
        HashMap maps;         /* the daemon's VA of each mapping made here → its size */
} GmCuda;

static const CudaGpuRef *gpu_ref(const GmCuda *g, uint32_t gpu_id)
{
        for (size_t i = 0; i < g->n_gpus; i++)
                if (g->gpus[i].gpu_id == gpu_id)
                        return &g->gpus[i];
        return NULL;
}

static GmCuda *cuda_of(const gm_client *c)
{
        return c->bk_data;
}

static int cuda_fail(gm_client *c, CUresult cr, const char *what)
{
        char buf[32];
        return gm_set_reason(c, cuda_errno(cr), "%s: %s", what,
                             cuda_error_name(&cuda_of(c)->api, cr, buf, sizeof(buf)));
}

/* Run with @gpu's context current, then put the caller's back. */
#define WITH_CTX(g, ref, expr)                                                                               \
        ({                                                                                                   \
                CUcontext _old = NULL;                                                                       \
                CUresult _r;                                                                                 \
                if ((g)->ctx_get)                                                                            \
                        (void)(g)->ctx_get(&_old);                                                           \
                _r = (g)->api.CtxSetCurrent((ref)->ctx);                                                     \
                if (_r == CUDA_SUCCESS)                                                                      \
                        _r = (expr);                                                                         \
                if (_old != (ref)->ctx)                                                                      \
                        (void)(g)->api.CtxSetCurrent(_old);                                                  \
                _r;                                                                                          \
        })

static uint64_t cuda_to_va(const gm_client *c, uint64_t ptr)
{
        const GmCuda *g = cuda_of(c);
        if (g && ptr >= g->image && ptr - g->image < g->image_size)
                return c->window_base + (ptr - g->image);
        return ptr;
}

static uint64_t cuda_to_ptr(const gm_client *c, uint64_t va)
{
        const GmCuda *g = cuda_of(c);
        if (g && va >= c->window_base && va - c->window_base < g->image_size)
                return g->image + (va - c->window_base);
        return va;
}

static void cuda_close(gm_client *c);

static int cuda_open(gm_client *c)
{
        const char *lib = getenv("GPUMEM_CUDA_LIBRARY");
        gm_topology *t = NULL;
        char err[256];
        GmCuda *g;
        CUresult cr;
        int r;

        g = calloc(1, sizeof(*g));
        if (!g)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        pthread_mutex_init(&g->lock, NULL);
        r = cuda_api_load(&g->api, lib && *lib ? lib : NULL, err, sizeof(err));
        if (r < 0) {
                pthread_mutex_destroy(&g->lock);
                free(g);
                return gm_set_reason(c, r, "gpumemd serves NVIDIA GPUs, but %s", err);
        }
        /* optional: resolved here, so that cuda-api.h need not carry what only this file uses */
        {
                void *sym = dlsym(g->api.lib, "cuCtxGetCurrent");
                memcpy(&g->ctx_get, &sym, sizeof(sym));
        }
        c->bk_data = g;
        r = gm_topology_get(c, false, &t);
        if (r < 0)
                goto fail;
        for (size_t i = 0; i < t->n_nodes && g->n_gpus < GM_CUDA_MAX_GPUS; i++) {
                const gm_topology_node *n = &t->nodes[i];
                CudaGpuRef *ref = &g->gpus[g->n_gpus];
                char bus[32];
                if (!n->is_gpu)
                        continue;
                snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%x", n->pci_domain, n->pci_location >> 8,
                         (n->pci_location >> 3) & 0x1f, n->pci_location & 7);
                /* a GPU of the daemon's that this container cannot see is one it cannot use */
                if (g->api.DeviceGetByPCIBusId(&ref->dev, bus) != CUDA_SUCCESS)
                        continue;
                cr = g->api.DevicePrimaryCtxRetain(&ref->ctx, ref->dev);
                if (cr != CUDA_SUCCESS) {
                        r = cuda_fail(c, cr, "cuDevicePrimaryCtxRetain");
                        goto fail;
                }
                ref->gpu_id = n->gpu_id;
                g->n_gpus++;
        }
        gm_topology_free(t);
        t = NULL;
        if (g->n_gpus == 0) {
                r = gm_set_reason(c, -ENODEV, "none of gpumemd's GPUs is visible to CUDA in this process");
                goto fail;
        }
        g->image_size = c->window_size;
        cr = WITH_CTX(g, &g->gpus[0], g->api.MemAddressReserve(&g->image, g->image_size, 2u << 20, 0, 0));
        if (cr != CUDA_SUCCESS) {
                r = cuda_fail(c, cr, "cannot reserve CUDA address space for the window");
                g->image = 0;
                goto fail;
        }
        return 0;
fail:
        gm_topology_free(t);
        cuda_close(c);
        return r;
}

static void cuda_close(gm_client *c)
{
        GmCuda *g = cuda_of(c);
        size_t it = 0;
        uint64_t key;
        void *v;

        if (!g)
                return;
        /* what the caller left mapped goes with the connection: the daemon frees it now */
        while (hashmap_next(&g->maps, &it, &key, &v))
                (void)g->api.MemUnmap(cuda_to_ptr(c, key), (size_t)(uintptr_t)v);
        hashmap_done(&g->maps);
        it = 0;
        while (hashmap_next(&g->handles, &it, &key, &v))
                (void)g->api.MemRelease((CUmemGenericAllocationHandle)(uintptr_t)v);
        hashmap_done(&g->handles);
        if (g->image)
                (void)g->api.MemAddressFree(g->image, g->image_size);
        for (size_t i = 0; i < g->n_gpus; i++)
                (void)g->api.DevicePrimaryCtxRelease(g->gpus[i].dev);
        cuda_api_unload(&g->api);
        pthread_mutex_destroy(&g->lock);
        free(g);
        c->bk_data = NULL;
}

static int cuda_import(gm_client *c, int fd, uint32_t gpu_id, uint64_t *ret_h)
{
        GmCuda *g = cuda_of(c);
        const CudaGpuRef *ref = gpu_id ? gpu_ref(g, gpu_id) : &g->gpus[0];
        CUmemGenericAllocationHandle h = 0;
        CUresult cr;

        if (!ref)
                return gm_set_reason(c, -ENODEV, "GPU %u is not visible to CUDA in this process", gpu_id);
        cr = WITH_CTX(g, ref,
                      g->api.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        if (cr != CUDA_SUCCESS)
                return cuda_fail(c, cr, "cuMemImportFromShareableHandle");
        *ret_h = h;
        return 0;
}

static void cuda_release_import(gm_client *c, uint64_t h)
{
        if (h)
                (void)cuda_of(c)->api.MemRelease(h);
}

static int cuda_map_at(gm_client *c, uint64_t va, uint64_t size, uint64_t offset, uint64_t h)
{
        GmCuda *g = cuda_of(c);
        CUresult cr;
        int r;

        if (va - c->window_base >= g->image_size || size > g->image_size - (va - c->window_base))
                return gm_set_reason(c, -EINVAL, "0x%llx+0x%llx is not in the window", (unsigned long long)va,
                                     (unsigned long long)size);
        cr = WITH_CTX(g, &g->gpus[0], g->api.MemMap(cuda_to_ptr(c, va), size, offset, h, 0));
        if (cr == CUDA_ERROR_NOT_SUPPORTED)
                return gm_set_reason(c, -EOPNOTSUPP, "CUDA maps only whole allocations, at offset 0");
        if (cr != CUDA_SUCCESS)
                return cuda_fail(c, cr, "cuMemMap");
        pthread_mutex_lock(&g->lock);
        r = hashmap_put(&g->maps, va, (void *)(uintptr_t)size);
        pthread_mutex_unlock(&g->lock);
        if (r < 0) {
                (void)WITH_CTX(g, &g->gpus[0], g->api.MemUnmap(cuda_to_ptr(c, va), size));
                return gm_set_reason(c, r, "cannot record the mapping");
        }
        return 0;
}

static int cuda_unmap(gm_client *c, uint64_t va, uint64_t size)
{
        GmCuda *g = cuda_of(c);
        uint64_t key;
        size_t it = 0;
        void *v;
        int r = 0;

        /* each whole mapping in the range, as cuMemUnmap takes them */
        pthread_mutex_lock(&g->lock);
        while (hashmap_next(&g->maps, &it, &key, &v)) {
                uint64_t len = (uint64_t)(uintptr_t)v;
                CUresult cr;
                if (key < va || key - va >= size)
                        continue;
                cr = WITH_CTX(g, &g->gpus[0], g->api.MemUnmap(cuda_to_ptr(c, key), len));
                if (cr != CUDA_SUCCESS) {
                        r = cuda_fail(c, cr, "cuMemUnmap");
                        continue;
                }
                (void)hashmap_remove(&g->maps, key);
                it = 0; /* removal may move entries: start over */
        }
        pthread_mutex_unlock(&g->lock);
        return r;
}

static int cuda_access_gpu(gm_client *c, uint64_t va, uint64_t size, uint32_t gpu_id, int access)
{
        GmCuda *g = cuda_of(c);
        const CudaGpuRef *ref = gpu_ref(g, gpu_id);
        CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, 0};
        CUresult cr;

        if (!ref)
                return gm_set_reason(c, -ENODEV, "GPU %u is not visible to CUDA in this process", gpu_id);
        d.location.id = ref->dev;
        d.flags = access == GM_ACCESS_READ_WRITE ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                  : access == GM_ACCESS_READ     ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                                 : CU_MEM_ACCESS_FLAGS_PROT_NONE;
        cr = WITH_CTX(g, ref, g->api.MemSetAccess(cuda_to_ptr(c, va), size, &d, 1));
        return cr == CUDA_SUCCESS ? 0 : cuda_fail(c, cr, "cuMemSetAccess");
}

static int cuda_host_register(gm_client *c, uint64_t va, uint64_t size)
{
        GmCuda *g = cuda_of(c);
        CUdeviceptr dp = 0;
        CUresult cr =
                WITH_CTX(g, &g->gpus[0],
                         g->api.MemHostRegister((void *)(uintptr_t)va, size,
                                                CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
        if (cr != CUDA_SUCCESS)
                return cuda_fail(c, cr, "cuMemHostRegister");
        /* the caller's pointer is the window's address: the GPUs must see the memory there too */
        cr = WITH_CTX(g, &g->gpus[0], g->api.MemHostGetDevicePointer(&dp, (void *)(uintptr_t)va, 0));
        if (cr != CUDA_SUCCESS || dp != va) {
                (void)WITH_CTX(g, &g->gpus[0], g->api.MemHostUnregister((void *)(uintptr_t)va));
                if (cr != CUDA_SUCCESS)
                        return cuda_fail(c, cr, "cuMemHostGetDevicePointer");
                return gm_set_reason(
                        c, -EOPNOTSUPP,
                        "CUDA maps the host memory at 0x%llx for the GPUs, not at its address 0x%llx",
                        (unsigned long long)dp, (unsigned long long)va);
        }
        return 0;
}

static void cuda_host_unregister(gm_client *c, uint64_t va)
{
        GmCuda *g = cuda_of(c);
        (void)WITH_CTX(g, &g->gpus[0], g->api.MemHostUnregister((void *)(uintptr_t)va));
}

static int cuda_handle_put(gm_client *c, gm_handle handle, uint64_t h)
{
        int r;
        pthread_mutex_lock(&cuda_of(c)->lock);
        r = hashmap_put(&cuda_of(c)->handles, handle, (void *)(uintptr_t)h);
        pthread_mutex_unlock(&cuda_of(c)->lock);
        return r < 0 ? gm_set_reason(c, r, "cannot record the CUDA handle") : 0;
}

/* The CUDA handle of this process's import of the daemon's @handle (0: none), forgotten if @take. */
static uint64_t cuda_handle_find(gm_client *c, gm_handle handle, bool take)
{
        void *v;
        pthread_mutex_lock(&cuda_of(c)->lock);
        v = take ? hashmap_remove(&cuda_of(c)->handles, handle) : hashmap_get(&cuda_of(c)->handles, handle);
        pthread_mutex_unlock(&cuda_of(c)->lock);
        return (uint64_t)(uintptr_t)v;
}

/* ---- the row ----------------------------------------------------------------------------------------- */

/*
 * New memory the daemon answered. Device memory comes with its export, which this process imports and maps
 * at the window's image, for every GPU it was mapped on; host memory is registered with CUDA where it is
 * mapped. A VMM handle's export is imported only, for gm_mem_map to map.
 */
static int cuda_map_new(gm_client *c, const GmBackendNew *n, GmBackendMem *ret)
{
        uint64_t cu = 0;
        int r;

        if (!ret) {
                r = n->fd >= 0 ? cuda_import(c, n->fd, n->gpu_id, &cu)
                               : gm_set_reason(c, -EPROTO, "gpumemd sent no export of the handle to map");
                if (r == 0 && (r = cuda_handle_put(c, n->handle, cu)) < 0)
                        cuda_release_import(c, cu);
                return r;
        }
        if (n->kind == GM_KIND_HOST) {
                r = cuda_host_register(c, n->va, n->size);
                ret->host = r == 0;
                return r;
        }
        if (n->kind != GM_KIND_DEVICE)
                return 0;
        if (n->fd < 0)
                return gm_set_reason(c, -EPROTO, "gpumemd sent no export of the memory to map");
        r = cuda_import(c, n->fd, n->gpu_id, &ret->handle);
        if (r < 0)
                return r;
        r = cuda_map_at(c, n->va, n->size, 0, ret->handle);
        if (r < 0) {
                cuda_release_import(c, ret->handle);
                ret->handle = 0;
                return r;
        }
        for (size_t i = 0; i < n->n_gpus && r == 0; i++)
                r = cuda_access_gpu(c, n->va, n->size, n->gpus[i], n->access);
        if (r < 0) {
                (void)cuda_unmap(c, n->va, n->size);
                cuda_release_import(c, ret->handle);
                ret->handle = 0;
        }
        return r;
}

/* Before the daemon's free: this process's mapping alone would keep the memory alive after it. */
static void cuda_unmap_alloc(gm_client *c, GmBackendMem *m, uint64_t va, uint64_t size)
{
        if (m->handle) {
                (void)cuda_unmap(c, va, size);
                cuda_release_import(c, m->handle);
                m->handle = 0;
        }
        if (m->host) {
                cuda_host_unregister(c, va);
                m->host = false;
        }
}

/* CUDA keeps the memory while it is mapped here, as the daemon keeps it while mapped there. */
static void cuda_release(gm_client *c, gm_handle handle)
{
        cuda_release_import(c, cuda_handle_find(c, handle, true));
}

static int cuda_map(gm_client *c, uint64_t va, uint64_t size, uint64_t offset, gm_handle handle)
{
        uint64_t cu = cuda_handle_find(c, handle, false);

        return cu ? cuda_map_at(c, va, size, offset, cu)
                  : gm_set_reason(c, -ENOENT, "handle 0x%llx has no CUDA import in this process",
                                  (unsigned long long)handle);
}

/* The access the daemon allowed is set here too, in this process's context. */
static int cuda_access(gm_client *c, const GmBackendMem *m, uint64_t va, uint64_t size, uint32_t gpu_id,
                       int access)
{
        if (m && !m->handle) /* an allocation this process did not map: host or managed memory */
                return 0;
        return cuda_access_gpu(c, va, size, gpu_id, access);
}

const GmBackend gm_backend_cuda = GM_BACKEND_ROW("cuda", cuda);
