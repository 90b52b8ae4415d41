/* The CUDA driver (driver-cuda.h): the broker's device, VMM and pinned host memory on NVIDIA GPUs. */
#include "driver-cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/kcmp.h>
#include <numa.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda-api.h"
#include "macro.h"

/*
 * How it maps the seam onto CUDA (docs/nvidia.md):
 * - Memory lives in the client's own CUDA context, never in the daemon's: the daemon creates physical
 *   memory (cuMemCreate, exportable as a POSIX fd) and hands the client that fd, which it imports, maps
 *   and grants itself (DRIVER_CAP_CLIENT_MAPS). The daemon keeps the handle, so the memory is charged
 *   and freed here; CUDA frees it when the daemon's handle and the client's mappings are gone.
 * - One context per GPU, the device's primary context, made current on the calling thread for each call
 *   (the loops and workers are different threads).
 * - Imports: CUDA cannot tell an imported handle's size, and each import makes a new handle. The driver
 *   keeps the file of each buffer's first export, and knows an fd as its own when it is that file
 *   (kcmp(2)); memory exported by anyone else cannot be imported through gpumemd.
 * - No managed memory, SVM attributes, GTT or queues: the broker refuses them (the caps).
 */

#define CUDA_MAX_GPUS 64
/* Where the broker may place clients' windows: only numbers in the broker's books here, since every
 * client maps its memory in its own CUDA VA space (the client library translates). */
#define CUDA_APERTURE_BASE  (1ull << 40)
#define CUDA_APERTURE_LIMIT ((1ull << 47) - 1)

typedef struct CudaGpu {
        CUdevice dev;
        CUcontext ctx;
        uint32_t gpu_id;
        uint64_t vram_bytes;
        uint64_t granularity;
        int numa_node;
} CudaGpu;

struct DriverCtx {
        int unused; /* the daemon's one GPU VM: the CUDA contexts are per GPU, held by the driver */
};

struct DriverMem {
        size_t gpu; /* index in CudaDriver.gpus */
        CUmemGenericAllocationHandle h;
        uint64_t size;
        uint64_t host_va; /* registered host pages (h unused), else 0 */
        uint64_t granted; /* bit i: the client may map it on gpus[i] (it maps it itself) */
        int export_fd;    /* the file of its first export, kept to know the fd again; -1 */
        DriverMem *next_exported;
};

struct DriverGrant {
        DriverMem *m;
        size_t gpu;
};

/*
 * Closing a buffer's export file is where the NVIDIA driver lets the memory go: 0.5-0.8 ms on an H200,
 * more than the rest of a free. A thread of the driver's closes them, so that a free is answered first.
 */
typedef struct Closer {
        pthread_t thread;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        int *fds;
        size_t n, cap;
        bool stop, started;
} Closer;

typedef struct CudaDriver {
        Driver base;
        CudaApi api;
        ThunkTopology *topo;
        DriverCtx primary;
        Closer closer;
        pthread_mutex_t exports_lock; /* exported and each DriverMem.next_exported */
        DriverMem *exported;
        size_t n_gpus;
        CudaGpu gpus[CUDA_MAX_GPUS];
} CudaDriver;

static CudaDriver *cd(const Driver *d)
{
        return (CudaDriver *)(uintptr_t)d;
}

static int gpu_of(const CudaDriver *k, uint32_t gpu_id)
{
        for (size_t i = 0; i < k->n_gpus; i++)
                if (k->gpus[i].gpu_id == gpu_id)
                        return (int)i;
        return -ENODEV;
}

/* Make @gpu's context current on this thread: every call below needs one. */
static int use_gpu(CudaDriver *k, size_t gpu)
{
        return cuda_errno(k->api.CtxSetCurrent(k->gpus[gpu].ctx));
}

static int kcmp_file(int a, int b)
{
        pid_t self = getpid();
        return (int)syscall(SYS_kcmp, self, self, KCMP_FILE, a, b);
}

static void *closer_main(void *arg)
{
        Closer *q = arg;

        pthread_mutex_lock(&q->lock);
        for (;;) {
                while (q->n) {
                        int fd = q->fds[--q->n];
                        pthread_mutex_unlock(&q->lock);
                        close(fd);
                        pthread_mutex_lock(&q->lock);
                }
                if (q->stop)
                        break;
                pthread_cond_wait(&q->cond, &q->lock);
        }
        pthread_mutex_unlock(&q->lock);
        return NULL;
}

static int closer_start(Closer *q)
{
        pthread_mutex_init(&q->lock, NULL);
        pthread_cond_init(&q->cond, NULL);
        q->started = pthread_create(&q->thread, NULL, closer_main, q) == 0;
        return q->started ? 0 : -EAGAIN;
}

/* Close @fd on the closer's thread (here when it cannot take it). */
static void closer_put(Closer *q, int fd)
{
        pthread_mutex_lock(&q->lock);
        if (q->started && q->n == q->cap) {
                size_t cap = q->cap ? 2 * q->cap : 64;
                int *fds = realloc(q->fds, cap * sizeof(*fds));
                if (fds) {
                        q->fds = fds;
                        q->cap = cap;
                }
        }
        if (q->started && q->n < q->cap) {
                q->fds[q->n++] = fd;
                pthread_cond_signal(&q->cond);
                fd = -1;
        }
        pthread_mutex_unlock(&q->lock);
        if (fd >= 0)
                close(fd);
}

/* Close what is queued and end the thread. */
static void closer_stop(Closer *q)
{
        if (q->started) {
                pthread_mutex_lock(&q->lock);
                q->stop = true;
                pthread_cond_signal(&q->cond);
                pthread_mutex_unlock(&q->lock);
                pthread_join(q->thread, NULL);
        }
        free(q->fds);
        pthread_cond_destroy(&q->cond);
        pthread_mutex_destroy(&q->lock);
}

/* ---- the topology ------------------------------------------------------------------------------------ */

uint32_t driver_cuda_gpu_id(const unsigned char uuid[16])
{
        uint32_t h = 2166136261u; /* FNV-1a, folded to 16 bits */
        for (int i = 0; i < 16; i++)
                h = (h ^ uuid[i]) * 16777619u;
        h = (h >> 16) ^ (h & 0xffff);
        return h ? h : 1;
}

/* A tree of files in memory, served to the topology parser. */
typedef struct TreeFile {
        char path[64];
        char *text;
        size_t len;
} TreeFile;

typedef struct Tree {
        TreeFile *files;
        size_t n, cap;
        int err;
} Tree;

static void __attribute__((format(printf, 3, 4))) tree_add(Tree *t, const char *path, const char *fmt, ...)
{
        va_list ap;
        char *text = NULL;
        int len;

        if (t->err)
                return;
        if (t->n == t->cap) {
                size_t cap = t->cap ? 2 * t->cap : 64;
                TreeFile *f = realloc(t->files, cap * sizeof(*f));
                if (!f) {
                        t->err = -ENOMEM;
                        return;
                }
                t->files = f;
                t->cap = cap;
        }
        va_start(ap, fmt);
        len = vasprintf(&text, fmt, ap);
        va_end(ap);
        if (len < 0) {
                t->err = -ENOMEM;
                return;
        }
        snprintf(t->files[t->n].path, sizeof(t->files[t->n].path), "%s", path);
        t->files[t->n].text = text;
        t->files[t->n].len = (size_t)len;
        t->n++;
}

static void tree_free(Tree *t)
{
        for (size_t i = 0; i < t->n; i++)
                free(t->files[i].text);
        free(t->files);
}

static int tree_read(void *ctx, const char *rel, char *buf, size_t cap, size_t *ret_len,
                     const char **ret_what)
{
        const Tree *t = ctx;
        (void)ret_what;
        for (size_t i = 0; i < t->n; i++) {
                if (strcmp(t->files[i].path, rel) != 0)
                        continue;
                if (t->files[i].len > cap)
                        return -E2BIG;
                memcpy(buf, t->files[i].text, t->files[i].len);
                *ret_len = t->files[i].len;
                return 0;
        }
        for (size_t i = 0, l = strlen(rel); i < t->n; i++)
                if (strncmp(t->files[i].path, rel, l) == 0 && t->files[i].path[l] == '/')
                        return -EISDIR;
        return -ENOENT;
}

static int tree_list(void *ctx, const char *rel, int (*each)(void *each_ctx, const char *name),
                     void *each_ctx, const char **ret_what)
{
        const Tree *t = ctx;
        size_t l = strlen(rel);
        bool any = false;
        (void)ret_what;
        for (size_t i = 0; i < t->n; i++) {
                const char *p = t->files[i].path;
                char name[64];
                bool seen = false;
                if (strncmp(p, rel, l) != 0 || p[l] != '/')
                        continue;
                any = true;
                snprintf(name, sizeof(name), "%.*s", (int)strcspn(p + l + 1, "/"), p + l + 1);
                /* each name once: files of one directory are added together */
                for (size_t k = 0; k < i && !seen; k++) {
                        const char *q = t->files[k].path;
                        seen = strncmp(q, rel, l) == 0 && q[l] == '/' &&
                               strncmp(q + l + 1, name, strlen(name)) == 0 &&
                               (q[l + 1 + strlen(name)] == '/' || q[l + 1 + strlen(name)] == 0);
                }
                if (!seen) {
                        int r = each(each_ctx, name);
                        if (r < 0)
                                return r;
                }
        }
        return any ? 0 : -ENOENT;
}

int driver_cuda_topology(const DriverCudaGpuDesc *gpus, size_t n_gpus, const DriverCudaHostDesc *host,
                         ThunkTopology **ret, char *errbuf, size_t errlen)
{
        ThunkTopologySource src = {.read_file = tree_read, .list_dir = tree_list};
        unsigned n_cpu = host && host->n_numa_nodes ? host->n_numa_nodes : 1;
        Tree t = {0};
        char path[64];
        int r;

        if (n_gpus > CUDA_MAX_GPUS || n_cpu > 64) {
                snprintf(errbuf, errlen, "more than 64 GPUs or NUMA nodes");
                return -E2BIG;
        }
        tree_add(&t, "generation_id", "1\n");
        tree_add(&t, "system_properties", "platform_oem 0\nplatform_id 0\nplatform_rev 0\n");
        for (unsigned c = 0; c < n_cpu; c++) {
                unsigned links = 0;
                for (size_t g = 0; g < n_gpus; g++)
                        links += (unsigned)(gpus[g].numa_node < 0 ? 0 : gpus[g].numa_node) == c;
                snprintf(path, sizeof(path), "nodes/%u/gpu_id", c);
                tree_add(&t, path, "0\n");
                snprintf(path, sizeof(path), "nodes/%u/name", c);
                tree_add(&t, path, "\n");
                snprintf(path, sizeof(path), "nodes/%u/properties", c);
                tree_add(&t, path,
                         "cpu_cores_count %u\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n"
                         "io_links_count %u\np2p_links_count 0\nvendor_id 0\ndevice_id 0\n",
                         host ? host->cpu_cores[c] : 0, links);
                snprintf(path, sizeof(path), "nodes/%u/mem_banks/0/properties", c);
                /* heap type 0: system memory */
                tree_add(&t, path,
                         "heap_type 0\nsize_in_bytes %" PRIu64 "\nflags 0\nwidth 0\nmem_clk_max 0\n",
                         host ? host->mem_bytes[c] : 0);
                links = 0;
                for (size_t g = 0; g < n_gpus; g++) {
                        if ((unsigned)(gpus[g].numa_node < 0 ? 0 : gpus[g].numa_node) != c)
                                continue;
                        snprintf(path, sizeof(path), "nodes/%u/io_links/%u/properties", c, links++);
                        tree_add(&t, path, "type 2\nnode_from %u\nnode_to %zu\nweight 20\n", c, n_cpu + g);
                }
        }
        for (size_t g = 0; g < n_gpus; g++) {
                const DriverCudaGpuDesc *d = &gpus[g];
                unsigned node = (unsigned)(n_cpu + g), links = 1;
                for (size_t p = 0; p < n_gpus; p++)
                        links += p != g && d->peer_rank[p];
                snprintf(path, sizeof(path), "nodes/%u/gpu_id", node);
                tree_add(&t, path, "%u\n", d->gpu_id);
                snprintf(path, sizeof(path), "nodes/%u/name", node);
                tree_add(&t, path, "%s\n", d->name);
                snprintf(path, sizeof(path), "nodes/%u/properties", node);
                /* KFD's location_id: bus << 8 | device << 3 | function; vendor 0x10de is NVIDIA's */
                tree_add(&t, path,
                         "cpu_cores_count 0\nsimd_count %u\nmem_banks_count 1\ncaches_count 0\n"
                         "io_links_count %u\np2p_links_count 0\nvendor_id 4318\ndevice_id %u\n"
                         "location_id %u\ndomain %u\nlocal_mem_size %" PRIu64 "\nmax_engine_clk_fcompute %u\n"
                         "unique_id %" PRIu64 "\nwave_front_size 32\ngfx_target_version 0\n"
                         "cuda_compute_capability %u\n",
                         d->sm_count ? d->sm_count : 1, links, d->pci_device_id,
                         d->pci_bus << 8 | d->pci_device << 3 | d->pci_function, d->pci_domain, d->vram_bytes,
                         d->clock_mhz, d->unique_id, d->cc_major * 10 + d->cc_minor);
                snprintf(path, sizeof(path), "nodes/%u/mem_banks/0/properties", node);
                /* heap type 1: VRAM the CPU cannot reach (FB_PRIVATE) */
                tree_add(&t, path,
                         "heap_type 1\nsize_in_bytes %" PRIu64 "\nflags 0\nwidth 0\nmem_clk_max 0\n",
                         d->vram_bytes);
                snprintf(path, sizeof(path), "nodes/%u/io_links/0/properties", node);
                tree_add(&t, path, "type 2\nnode_from %u\nnode_to %d\nweight 20\n", node,
                         d->numa_node < 0 || (unsigned)d->numa_node >= n_cpu ? 0 : d->numa_node);
                links = 1;
                for (size_t p = 0; p < n_gpus; p++) {
                        if (p == g || !d->peer_rank[p])
                                continue;
                        snprintf(path, sizeof(path), "nodes/%u/io_links/%u/properties", node, links++);
                        tree_add(&t, path,
                                 "type 16\nnode_from %u\nnode_to %zu\nweight %u\nnative_atomics %u\n", node,
                                 n_cpu + p, 10 + d->peer_rank[p], d->peer_atomics[p]);
                }
        }
        if (t.err) {
                tree_free(&t);
                snprintf(errbuf, errlen, "out of memory");
                return t.err;
        }
        src.ctx = &t;
        r = thunk_topology_load_source(&src, "cuda", ret, errbuf, errlen);
        tree_free(&t);
        return r;
}

/* What sysfs says of the PCI function at @bus_id: its product id and NUMA node. */
static void pci_facts(const char *bus_id, uint32_t *ret_device_id, int *ret_numa)
{
        char path[128], buf[32];
        FILE *f;

        *ret_device_id = 0;
        *ret_numa = -1;
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", bus_id);
        f = fopen(path, "re");
        if (f) {
                if (fgets(buf, sizeof(buf), f))
                        *ret_device_id = (uint32_t)strtoul(buf, NULL, 16);
                fclose(f);
        }
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus_id);
        f = fopen(path, "re");
        if (f) {
                if (fgets(buf, sizeof(buf), f))
                        *ret_numa = atoi(buf);
                fclose(f);
        }
}

static void host_facts(DriverCudaHostDesc *h)
{
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

        memset(h, 0, sizeof(*h));
        h->n_numa_nodes = 1;
        h->cpu_cores[0] = cpus > 0 ? (uint32_t)cpus : 0;
        h->mem_bytes[0] = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
        if (numa_available() < 0 || numa_max_node() < 1)
                return;
        h->n_numa_nodes = numa_max_node() + 1 < 64 ? (unsigned)numa_max_node() + 1 : 64;
        for (unsigned n = 0; n < h->n_numa_nodes; n++) {
                struct bitmask *cpu = numa_allocate_cpumask();
                long long size = numa_node_size64((int)n, NULL);
                h->mem_bytes[n] = size > 0 ? (uint64_t)size : 0;
                h->cpu_cores[n] = 0;
                if (cpu && numa_node_to_cpus((int)n, cpu) == 0)
                        h->cpu_cores[n] = numa_bitmask_weight(cpu);
                if (cpu)
                        numa_free_cpumask(cpu);
        }
}

/* ---- the driver -------------------------------------------------------------------------------------- */

static Driver *c_close(Driver *d)
{
        CudaDriver *k = cd(d);

        closer_stop(&k->closer);
        for (size_t i = 0; i < k->n_gpus; i++)
                if (k->gpus[i].ctx)
                        (void)k->api.DevicePrimaryCtxRelease(k->gpus[i].dev);
        thunk_topology_free(k->topo);
        pthread_mutex_destroy(&k->exports_lock);
        cuda_api_unload(&k->api);
        free(k);
        return NULL;
}

static void c_version(const Driver *d, uint32_t *ret_major, uint32_t *ret_minor)
{
        *ret_major = (uint32_t)cd(d)->api.version / 1000;
        *ret_minor = (uint32_t)cd(d)->api.version % 1000 / 10;
}

static unsigned c_caps(const Driver *d)
{
        (void)d;
        /* an fd per buffer: the file of its first export, which every device allocation has */
        return DRIVER_CAP_EXPORT | DRIVER_CAP_VA_GRANTS | DRIVER_CAP_CLIENT_MAPS |
               DRIVER_CAP_FD_PER_SHARED_BUFFER;
}

static const ThunkTopology *c_topology(const Driver *d)
{
        return cd(d)->topo;
}

static size_t c_gpu_count(const Driver *d)
{
        return cd(d)->n_gpus;
}

static int c_gpu(const Driver *d, size_t index, DriverGpu *ret)
{
        const CudaDriver *k = cd(d);

        if (index >= k->n_gpus)
                return -ENODEV;
        ret->gpu_id = k->gpus[index].gpu_id;
        ret->vram_bytes = k->gpus[index].vram_bytes;
        ret->numa_node = k->gpus[index].numa_node;
        ret->alloc_granularity = k->gpus[index].granularity;
        return 0;
}

static void c_svm_aperture(const Driver *d, uint64_t *ret_base, uint64_t *ret_limit)
{
        (void)d;
        *ret_base = CUDA_APERTURE_BASE;
        *ret_limit = CUDA_APERTURE_LIMIT;
}

static DriverCtx *c_ctx_primary(Driver *d)
{
        return &cd(d)->primary;
}

static int c_ctx_new(Driver *d, DriverCtx **ret)
{
        (void)d;
        (void)ret;
        return -EOPNOTSUPP;
}

static void c_ctx_free(Driver *d, DriverCtx *ctx)
{
        (void)d;
        (void)ctx;
}

static int c_available_memory(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t *ret_bytes)
{
        CudaDriver *k = cd(d);
        int g = gpu_of(k, gpu_id), r;
        size_t free_bytes = 0, total = 0;

        (void)ctx;
        if (g < 0)
                return g;
        r = use_gpu(k, (size_t)g);
        if (r == 0)
                r = cuda_errno(k->api.MemGetInfo(&free_bytes, &total));
        if (r == 0)
                *ret_bytes = free_bytes;
        return r;
}

static CUmemAllocationProp device_prop(const CudaDriver *k, size_t gpu)
{
        CUmemAllocationProp p = {0};
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = k->gpus[gpu].dev;
        return p;
}

static DriverMem *mem_new(size_t gpu, uint64_t size)
{
        DriverMem *m = calloc(1, sizeof(*m));
        if (m) {
                m->gpu = gpu;
                m->size = size;
                m->export_fd = -1;
        }
        return m;
}

static int c_mem_alloc_vram(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                            uint32_t flags, DriverMem **ret)
{
        CudaDriver *k = cd(d);
        int g = gpu_of(k, gpu_id), r;
        CUmemAllocationProp p;
        DriverMem *m;

        (void)ctx;
        (void)va; /* the client maps it in its own VA space */
        if (g < 0)
                return g;
        /* the client cannot reach CUDA VMM device memory from the CPU, and there is no fine-grained or
         * contiguous kind of it */
        if (flags & DRIVER_MEM_HOST_VISIBLE)
                return -EINVAL;
        if (flags &
            (DRIVER_MEM_COHERENT | DRIVER_MEM_UNCACHED | DRIVER_MEM_CONTIGUOUS | DRIVER_MEM_EXT_COHERENT))
                return -EOPNOTSUPP;
        if (size % k->gpus[g].granularity)
                return -EINVAL;
        m = mem_new((size_t)g, size);
        if (!m)
                return -ENOMEM;
        p = device_prop(k, (size_t)g);
        r = use_gpu(k, (size_t)g);
        if (r == 0)
                r = cuda_errno(k->api.MemCreate(&m->h, size, &p, 0));
        if (r < 0) {
                free(m);
                return r;
        }
        *ret = m;
        return 0;
}

static int c_mem_register_host(Driver *d, uint32_t gpu_id, uint64_t va, uint64_t size, uint32_t flags,
                               DriverMem **ret)
{
        CudaDriver *k = cd(d);
        int g = gpu_of(k, gpu_id), r;
        DriverMem *m;

        (void)flags;
        if (g < 0)
                return g;
        m = mem_new((size_t)g, size);
        if (!m)
                return -ENOMEM;
        /* pinned by the daemon, which holds the pages: what the quota counts is locked here */
        r = use_gpu(k, (size_t)g);
        if (r == 0)
                r = cuda_errno(
                        k->api.MemHostRegister((void *)(uintptr_t)va, size,
                                               CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
        if (r < 0) {
                free(m);
                return r;
        }
        m->host_va = va;
        *ret = m;
        return 0;
}

/*
 * Is @fd the first export of a live buffer? Its GPU and size are copied out under the lock: the buffer is
 * another client's, which another loop may free at any time.
 */
static bool exported_as(CudaDriver *k, int fd, size_t *ret_gpu, uint64_t *ret_size)
{
        const DriverMem *m;

        pthread_mutex_lock(&k->exports_lock);
        for (m = k->exported; m; m = m->next_exported)
                if (kcmp_file(fd, m->export_fd) == 0)
                        break;
        if (m && ret_gpu) {
                *ret_gpu = m->gpu;
                *ret_size = m->size;
        }
        pthread_mutex_unlock(&k->exports_lock);
        return m != NULL;
}

static int c_mem_import(Driver *d, DriverCtx *ctx, int fd, uint32_t gpu_id, DriverMem **ret)
{
        CudaDriver *k = cd(d);
        int g = gpu_of(k, gpu_id), r;
        uint64_t size = 0;
        size_t gpu = 0;
        DriverMem *m;

        (void)ctx;
        if (g < 0)
                return g;
        if (!exported_as(k, fd, &gpu, &size))
                return -EINVAL;
        m = mem_new(gpu, size);
        if (!m)
                return -ENOMEM;
        r = use_gpu(k, gpu);
        if (r == 0)
                r = cuda_errno(k->api.MemImportFromShareableHandle(&m->h, (void *)(uintptr_t)fd,
                                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        if (r < 0) {
                free(m);
                return r;
        }
        *ret = m;
        return 0;
}

static int c_mem_free(Driver *d, DriverMem *m)
{
        CudaDriver *k = cd(d);
        int r;

        if (!m)
                return 0;
        r = use_gpu(k, m->gpu);
        if (r == 0)
                r = cuda_errno(m->host_va ? k->api.MemHostUnregister((void *)(uintptr_t)m->host_va)
                                          : k->api.MemRelease(m->h));
        if (r < 0)
                return r;
        if (m->export_fd >= 0) {
                pthread_mutex_lock(&k->exports_lock);
                for (DriverMem **pp = &k->exported; *pp; pp = &(*pp)->next_exported) {
                        if (*pp == m) {
                                *pp = m->next_exported;
                                break;
                        }
                }
                pthread_mutex_unlock(&k->exports_lock);
                closer_put(&k->closer, m->export_fd);
        }
        free(m);
        return 0;
}

static uint64_t c_mem_size(const Driver *d, const DriverMem *m)
{
        (void)d;
        return m->size;
}

/* The broker let the client map @m on these GPUs; the client maps it in its own context. */
static int c_mem_map(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        CudaDriver *k = cd(d);
        uint64_t bits = 0;

        for (size_t i = 0; i < n; i++) {
                int g = gpu_of(k, gpu_ids[i]);
                if (g < 0)
                        return g;
                bits |= 1ull << g;
        }
        m->granted |= bits;
        return 0;
}

static int c_mem_unmap(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        CudaDriver *k = cd(d);

        for (size_t i = 0; i < n; i++) {
                int g = gpu_of(k, gpu_ids[i]);
                if (g >= 0)
                        m->granted &= ~(1ull << g);
        }
        return 0;
}

static int c_mem_unmap_all(Driver *d, DriverMem *m)
{
        (void)d;
        m->granted = 0;
        return 0;
}

static uint64_t c_mem_mapped_mask(const Driver *d, const DriverMem *m)
{
        return m->granted; /* bit g: GPU g of the driver's list */
}

static bool c_mem_is_mapped(const Driver *d, const DriverMem *m, uint32_t gpu_id)
{
        int g = gpu_of(cd(d), gpu_id);
        return g >= 0 && (m->granted & (1ull << g));
}

static int c_mem_export(Driver *d, DriverMem *m, int *ret_fd)
{
        CudaDriver *k = cd(d);
        int r, fd = -1;

        if (m->host_va)
                return -EINVAL; /* host memory is shared through its memfd */
        if (m->export_fd < 0) {
                r = use_gpu(k, m->gpu);
                if (r == 0)
                        r = cuda_errno(k->api.MemExportToShareableHandle(
                                &fd, m->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
                if (r < 0)
                        return r;
                m->export_fd = fd;
                pthread_mutex_lock(&k->exports_lock);
                m->next_exported = k->exported;
                k->exported = m;
                pthread_mutex_unlock(&k->exports_lock);
        }
        return fd_dup_into(m->export_fd, ret_fd);
}

static bool c_dmabuf_is_own(Driver *d, DriverCtx *ctx, int fd)
{
        (void)ctx;
        return exported_as(cd(d), fd, NULL, NULL);
}

static int c_grant(Driver *d, DriverCtx *ctx, DriverMem *m, uint32_t gpu_id, uint64_t va, uint64_t offset,
                   uint64_t size, int access, bool executable, DriverGrant **ret)
{
        CudaDriver *k = cd(d);
        int g = gpu_of(k, gpu_id);
        DriverGrant *gr;

        (void)ctx;
        (void)va;
        (void)access;
        (void)executable;
        if (g < 0)
                return g;
        /* CUDA maps whole allocations only (cuMemMap: CUDA_ERROR_NOT_SUPPORTED otherwise) */
        if (offset != 0 || size != m->size || m->host_va)
                return -EOPNOTSUPP;
        gr = calloc(1, sizeof(*gr));
        if (!gr)
                return -ENOMEM;
        gr->m = m;
        gr->gpu = (size_t)g;
        *ret = gr;
        return 0;
}

static int c_revoke(Driver *d, DriverGrant *g)
{
        (void)d;
        free(g);
        return 0;
}

static int c_managed_register(Driver *d, uint64_t va, uint64_t size, uint32_t flags)
{
        (void)d;
        (void)va;
        (void)size;
        (void)flags;
        return -EOPNOTSUPP;
}

static int c_cpu_unmap(Driver *d, uint64_t va, uint64_t size)
{
        /* nothing to tell: no SVM range holds the daemon's pages */
        (void)d;
        (void)va;
        (void)size;
        return 0;
}

static int c_svm(Driver *d, uint64_t va, uint64_t size, DriverSvmAttr *a, size_t n)
{
        (void)d;
        (void)va;
        (void)size;
        (void)a;
        (void)n;
        return -EOPNOTSUPP;
}

static int c_svm_set(Driver *d, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n)
{
        (void)a;
        return c_svm(d, va, size, NULL, n);
}

static int c_stats(const Driver *d, DriverStats *ret)
{
        (void)d;
        (void)ret;
        return -EOPNOTSUPP;
}

static int c_test_faults(Driver *d, const char *path, char *errbuf, size_t errlen)
{
        (void)d;
        (void)path;
        snprintf(errbuf, errlen, "the cuda driver has no fault injection");
        return -EOPNOTSUPP;
}

/* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
// clang-format off
static const DriverOps cuda_ops = {
        /* the driver and its GPUs */
        .close = c_close, .version = c_version, .caps = c_caps, .topology = c_topology,
        .gpu_count = c_gpu_count, .gpu = c_gpu, .svm_aperture = c_svm_aperture,
        /* GPU contexts */
        .ctx_primary = c_ctx_primary, .ctx_new = c_ctx_new, .ctx_free = c_ctx_free,
        .available_memory = c_available_memory,
        /* memory */
        .mem_alloc_vram = c_mem_alloc_vram, .mem_register_host = c_mem_register_host,
        .mem_import = c_mem_import, .mem_free = c_mem_free, .mem_size = c_mem_size, .mem_map = c_mem_map,
        .mem_unmap = c_mem_unmap, .mem_unmap_all = c_mem_unmap_all, .mem_is_mapped = c_mem_is_mapped,
        .mem_mapped_mask = c_mem_mapped_mask, .mem_export = c_mem_export, .dmabuf_is_own = c_dmabuf_is_own,
        /* another context's access, managed memory */
        .grant = c_grant, .revoke = c_revoke, .managed_register = c_managed_register,
        .cpu_unmap = c_cpu_unmap, .svm_set = c_svm_set, .svm_get = c_svm,
        /* the rest */
        .stats = c_stats, .test_faults = c_test_faults
};
// clang-format on

/* Describe GPU @ordinal and take its primary context. */
static int open_gpu(CudaDriver *k, int ordinal, DriverCudaGpuDesc *desc, char *errbuf, size_t errlen)
{
        CudaApi *a = &k->api;
        CudaGpu *g = &k->gpus[k->n_gpus];
        unsigned char uuid[16] = {0};
        char bus_id[32] = "", why[64];
        int vmm = 0, posix = 0, v = 0;
        unsigned dom = 0, bus = 0, dev = 0, fn = 0;
        size_t total = 0, gran = 0;
        CUmemAllocationProp p;
        CUresult cr;

        cr = a->DeviceGet(&g->dev, ordinal);
        if (cr == CUDA_SUCCESS)
                cr = a->DeviceGetName(desc->name, sizeof(desc->name), g->dev);
        if (cr == CUDA_SUCCESS)
                cr = a->DeviceTotalMem(&total, g->dev);
        if (cr == CUDA_SUCCESS)
                cr = a->DeviceGetPCIBusId(bus_id, sizeof(bus_id), g->dev);
        if (cr != CUDA_SUCCESS) {
                snprintf(errbuf, errlen, "GPU %d: %s", ordinal, cuda_error_name(a, cr, why, sizeof(why)));
                return cuda_errno(cr);
        }
        (void)a->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, g->dev);
        (void)a->DeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                    g->dev);
        if (!vmm || !posix) {
                snprintf(errbuf, errlen,
                         "GPU %d (%s) has no virtual memory management with POSIX file descriptors, which "
                         "gpumemd hands its memory out as",
                         ordinal, desc->name);
                return -EOPNOTSUPP;
        }
        p = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                  .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                  .location = {CU_MEM_LOCATION_TYPE_DEVICE, g->dev}};
        cr = a->MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (cr == CUDA_SUCCESS)
                cr = a->DevicePrimaryCtxRetain(&g->ctx, g->dev);
        if (cr != CUDA_SUCCESS) {
                g->ctx = NULL;
                snprintf(errbuf, errlen, "GPU %d: %s", ordinal, cuda_error_name(a, cr, why, sizeof(why)));
                return cuda_errno(cr);
        }
        k->n_gpus++;
        g->vram_bytes = total;
        g->granularity = gran ? gran : 4096;
        if (a->DeviceGetUuid)
                (void)a->DeviceGetUuid(uuid, g->dev);
        else
                memcpy(uuid, &ordinal, sizeof(ordinal));
        g->gpu_id = driver_cuda_gpu_id(uuid);
        while (gpu_of(k, g->gpu_id) != (int)(k->n_gpus - 1))
                g->gpu_id = (g->gpu_id + 1) & 0xffff ? (g->gpu_id + 1) & 0xffff : 1;
        desc->gpu_id = g->gpu_id;
        desc->vram_bytes = total;
        if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g->dev) == CUDA_SUCCESS)
                desc->sm_count = (uint32_t)v;
        if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g->dev) == CUDA_SUCCESS)
                desc->cc_major = (uint32_t)v;
        if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g->dev) == CUDA_SUCCESS)
                desc->cc_minor = (uint32_t)v;
        if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, g->dev) == CUDA_SUCCESS)
                desc->clock_mhz = (uint32_t)v / 1000;
        if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) {
                desc->pci_domain = dom;
                desc->pci_bus = bus;
                desc->pci_device = dev;
                desc->pci_function = fn;
        }
        for (size_t i = 0; bus_id[i]; i++)
                bus_id[i] = (char)(bus_id[i] >= 'A' && bus_id[i] <= 'F' ? bus_id[i] - 'A' + 'a' : bus_id[i]);
        pci_facts(bus_id, &desc->pci_device_id, &g->numa_node);
        desc->numa_node = g->numa_node;
        memcpy(&desc->unique_id, uuid, sizeof(desc->unique_id));
        return 0;
}

static int cuda_open(const DriverOpenArgs *oa, Driver **ret, char *errbuf, size_t errlen)
{
        const char *lib = getenv("GPUMEMD_CUDA_LIBRARY");
        DriverCudaGpuDesc *desc = NULL;
        DriverCudaHostDesc host;
        CudaDriver *k;
        char why[64];
        int n = 0, r;
        CUresult cr;

        (void)oa;
        k = calloc(1, sizeof(*k));
        if (!k)
                return -ENOMEM;
        k->base.ops = &cuda_ops;
        k->base.name = "cuda";
        pthread_mutex_init(&k->exports_lock, NULL);
        r = cuda_api_load(&k->api, lib && *lib ? lib : NULL, errbuf, errlen);
        if (r < 0) {
                pthread_mutex_destroy(&k->exports_lock);
                free(k);
                return r;
        }
        /* without the thread, the frees close the files themselves */
        (void)closer_start(&k->closer);
        cr = k->api.DeviceGetCount(&n);
        if (cr != CUDA_SUCCESS || n <= 0) {
                snprintf(errbuf, errlen, "the CUDA driver sees no GPU (%s)",
                         cr ? cuda_error_name(&k->api, cr, why, sizeof(why)) : "0 devices");
                c_close(&k->base);
                return -ENODEV;
        }
        if (n > CUDA_MAX_GPUS)
                n = CUDA_MAX_GPUS;
        desc = calloc((size_t)n, sizeof(*desc));
        if (!desc) {
                c_close(&k->base);
                return -ENOMEM;
        }
        for (int i = 0; i < n; i++) {
                r = open_gpu(k, i, &desc[i], errbuf, errlen);
                if (r < 0)
                        goto fail;
        }
        for (int i = 0; i < n; i++) {
                for (int p = 0; p < n; p++) {
                        int access = 0, rank = 0, atomics = 0;
                        if (p == i || k->api.DeviceCanAccessPeer(&access, k->gpus[i].dev, k->gpus[p].dev) ||
                            !access)
                                continue;
                        if (k->api.DeviceGetP2PAttribute) {
                                (void)k->api.DeviceGetP2PAttribute(&rank,
                                                                   CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                                                                   k->gpus[i].dev, k->gpus[p].dev);
                                (void)k->api.DeviceGetP2PAttribute(&atomics, 3 /* NATIVE_ATOMIC_SUPPORTED */,
                                                                   k->gpus[i].dev, k->gpus[p].dev);
                        }
                        desc[i].peer_rank[p] = (uint32_t)rank + 1;
                        desc[i].peer_atomics[p] = atomics != 0;
                }
        }
        host_facts(&host);
        r = driver_cuda_topology(desc, (size_t)n, &host, &k->topo, errbuf, errlen);
        if (r < 0)
                goto fail;
        free(desc);
        *ret = &k->base;
        return 0;
fail:
        free(desc);
        c_close(&k->base);
        return r;
}

const DriverBackend driver_cuda_backend = {
        .name = "cuda",
        .summary = "NVIDIA GPUs through the CUDA driver's VMM API (libcuda.so.1)",
        .open = cuda_open,
};
