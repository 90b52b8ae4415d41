/* gpumem-cuda-bench: device memory through gpumemd on an NVIDIA GPU beside the same CUDA calls made by the
 * client itself, at 2 MiB, 64 MiB and 1 GiB (docs/performance.md, docs/nvidia.md). Needs a GPU and a
 * gpumemd --backend cuda on the socket given. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda-api.h"
#include "gpumem-client.h"

static double now_us(void)
{
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* The daemon's own time for @op so far, from its metrics (an administrator's call): sum in us and count. */
static void daemon_time(gm_client *c, const char *op, double *ret_sum_us, double *ret_count)
{
        char key[96], *text = NULL, *p;

        *ret_sum_us = *ret_count = 0;
        if (gm_admin_metrics(c, &text) < 0)
                return;
        snprintf(key, sizeof(key), "gpumemd_operation_duration_seconds_sum{op=\"%s\"} ", op);
        if ((p = strstr(text, key)))
                *ret_sum_us = strtod(p + strlen(key), NULL) * 1e6;
        snprintf(key, sizeof(key), "gpumemd_operation_duration_seconds_count{op=\"%s\"} ", op);
        if ((p = strstr(text, key)))
                *ret_count = strtod(p + strlen(key), NULL);
        gm_free(text);
}

static int cmp(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
        qsort(v, (size_t)n, sizeof(*v), cmp);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define CU(x)                                                                                                \
        do {                                                                                                 \
                CUresult r_ = (x);                                                                           \
                if (r_ != CUDA_SUCCESS) {                                                                    \
                        fprintf(stderr, "%s: CUDA error %d\n", #x, r_);                                      \
                        exit(1);                                                                             \
                }                                                                                            \
        } while (0)

/* What a client does on its own: create, export, import, reserve, map, grant; then close the export's fd,
 * unmap, release both handles and the range. @tm gets the time before each step and after the last. */
static void direct_cycle(const CudaApi *api, CUdevice dev, size_t size, double tm[12])
{
        CUmemAllocationProp p = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                 .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}};
        CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUmemGenericAllocationHandle h, ih;
        CUdeviceptr va;
        int fd = -1;

        tm[0] = now_us();
        CU(api->MemCreate(&h, size, &p, 0));
        tm[1] = now_us();
        CU(api->MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        tm[2] = now_us();
        CU(api->MemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        tm[3] = now_us();
        CU(api->MemAddressReserve(&va, size, 2u << 20, 0, 0));
        tm[4] = now_us();
        CU(api->MemMap(va, size, 0, ih, 0));
        tm[5] = now_us();
        CU(api->MemSetAccess(va, size, &d, 1));
        tm[6] = now_us();
        close(fd);
        tm[7] = now_us();
        CU(api->MemUnmap(va, size));
        tm[8] = now_us();
        CU(api->MemRelease(ih));
        tm[9] = now_us();
        CU(api->MemRelease(h));
        tm[10] = now_us();
        CU(api->MemAddressFree(va, size));
        tm[11] = now_us();
}

/* The same through gpumemd: gm_malloc and gm_mem_free, each timed. */
static int gm_cycle(gm_client *c, size_t size, uint32_t gpu_id, double *ret_alloc, double *ret_free)
{
        char err[256];
        void *ptr;
        double t0 = now_us();
        int r = gm_malloc(c, size, gpu_id, 0, &ptr);

        *ret_alloc = now_us() - t0;
        if (r < 0) {
                fprintf(stderr, "gm_malloc: %s\n", gm_strerror(c, r, err, sizeof(err)));
                return r;
        }
        t0 = now_us();
        r = gm_mem_free(c, ptr);
        *ret_free = now_us() - t0;
        return r;
}

int main(int argc, char **argv)
{
        const char *sock = argc > 1 ? argv[1] : getenv("GPUMEM_SOCKET");
        const size_t sizes[] = {2u << 20, 64u << 20, 1u << 30};
        const int reps[] = {200, 100, 30};
        gm_client *c = NULL;
        gm_topology *t = NULL;
        char err[256], bus[32] = "";
        uint32_t gpu_id = 0;
        CUdevice dev = 0;
        CUcontext ctx;
        CudaApi api;
        int r;

        r = cuda_api_load(&api, NULL, err, sizeof(err));
        if (r < 0) {
                fprintf(stderr, "gpumem-cuda-bench: %s\n", err);
                return 77;
        }
        r = gm_client_connect(sock, "cuda-bench", &c);
        if (r < 0 || gm_topology_get(c, false, &t) < 0) {
                fprintf(stderr, "gpumem-cuda-bench: cannot reach gpumemd at %s: %s\n",
                        sock ? sock : "(default)", strerror(-r));
                return 1;
        }
        for (size_t i = 0; i < t->n_nodes && !gpu_id; i++) {
                if (!t->nodes[i].is_gpu)
                        continue;
                snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%x", t->nodes[i].pci_domain,
                         t->nodes[i].pci_location >> 8, (t->nodes[i].pci_location >> 3) & 0x1f,
                         t->nodes[i].pci_location & 7);
                if (api.DeviceGetByPCIBusId(&dev, bus) == CUDA_SUCCESS)
                        gpu_id = t->nodes[i].gpu_id;
        }
        gm_topology_free(t);
        if (!gpu_id) {
                fprintf(stderr, "gpumem-cuda-bench: no GPU of gpumemd's is visible to CUDA\n");
                return 1;
        }
        CU(api.DevicePrimaryCtxRetain(&ctx, dev));
        CU(api.CtxSetCurrent(ctx));

        double *a = calloc(200, sizeof(double)), *f = calloc(200, sizeof(double));
        double *da = calloc(200, sizeof(double)), *df = calloc(200, sizeof(double));
        double *pa = calloc(200, sizeof(double));
        double *st[11];
        for (int i = 0; i < 11; i++)
                st[i] = calloc(200, sizeof(double));
        if (!a || !f || !da || !df || !pa || !st[10])
                return 1;
        for (int k = 0; k < 200; k++) {
                double t0 = now_us();
                (void)gm_ping(c);
                pa[k] = now_us() - t0;
        }
        printf("gpumemd ping p50 %.1f us (%s)\n", median(pa, 200), bus);
        printf("Each op alone (the driver idle before it: 3 ms between cycles), p50:\n");
        printf("%-8s %14s %14s %8s   %14s %14s %8s   %s\n", "size", "alloc direct", "alloc gpumemd", "ratio",
               "free direct", "free gpumemd", "ratio",
               "direct by step (us): create export import reserve map access | close unmap release release "
               "free");
        for (int s = 0; s < 3; s++) {
                size_t size = sizes[s];
                int n = reps[s];
                double as0, ac0, fs0, fc0, as1, ac1, fs1, fc1, tm[12];
                for (int k = 0; k < n; k++) {
                        direct_cycle(&api, dev, size, tm);
                        da[k] = tm[6] - tm[0];
                        df[k] = tm[11] - tm[6];
                        for (int i = 0; i < 11; i++)
                                st[i][k] = tm[i + 1] - tm[i];
                        usleep(3000);
                }
                daemon_time(c, "alloc", &as0, &ac0);
                daemon_time(c, "free", &fs0, &fc0);
                for (int k = 0; k < n; k++) {
                        if (gm_cycle(c, size, gpu_id, &a[k], &f[k]) < 0)
                                return 1;
                        usleep(3000);
                }
                daemon_time(c, "alloc", &as1, &ac1);
                daemon_time(c, "free", &fs1, &fc1);
                double mda = median(da, n), ma = median(a, n), mdf = median(df, n), mf = median(f, n);
                printf("%5zu MiB %11.1f us %11.1f us %8.3f   %11.1f us %11.1f us %8.3f  ", size >> 20, mda,
                       ma, ma / mda, mdf, mf, mf / mdf);
                for (int i = 0; i < 11; i++)
                        printf(" %.1f", median(st[i], n));
                /* a VMM handle: the daemon's create and export and this process's import, no mapping */
                for (int k = 0; k < n; k++) {
                        gm_handle h;
                        double t0 = now_us();
                        r = gm_mem_create(c, size, gpu_id, 0, &h);
                        a[k] = now_us() - t0;
                        if (r < 0 || gm_mem_release(c, h) < 0)
                                return 1;
                        usleep(3000);
                }
                /* the import of the daemon's export in this process, alone */
                for (int k = 0; k < n; k++) {
                        gm_pointer_attributes pa_ = {.struct_size = sizeof(pa_)};
                        CUmemGenericAllocationHandle ih;
                        void *ptr;
                        int fd = -1;
                        if (gm_malloc(c, size, gpu_id, 0, &ptr) < 0 ||
                            gm_pointer_get_attributes(c, ptr, &pa_) < 0 ||
                            gm_mem_export(c, pa_.handle, &fd, NULL) < 0)
                                return 1;
                        usleep(3000);
                        double t0 = now_us();
                        CU(api.MemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd,
                                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
                        f[k] = now_us() - t0;
                        CU(api.MemRelease(ih));
                        /* closing one of several fds of the export's file, as the client does after its
                         * import */
                        int dupfd = dup(fd);
                        t0 = now_us();
                        close(dupfd);
                        da[k] = now_us() - t0;
                        close(fd);
                        if (gm_mem_free(c, ptr) < 0)
                                return 1;
                        usleep(3000);
                }
                printf("\n         in the daemon (mean): alloc %.1f us, free %.1f us; gm_mem_create (no map) "
                       "p50 "
                       "%.1f us; import of the daemon's export here p50 %.1f us, closing a second fd of it "
                       "%.1f us\n",
                       ac1 > ac0 ? (as1 - as0) / (ac1 - ac0) : 0, fc1 > fc0 ? (fs1 - fs0) / (fc1 - fc0) : 0,
                       median(a, n), median(f, n), median(da, n));
        }
        /* back to back: what an allocation and its free cost together, whatever runs late */
        printf("Allocation and free back to back, mean per cycle:\n");
        for (int s = 0; s < 3; s++) {
                size_t size = sizes[s];
                int n = reps[s];
                double tm[12], x, y, t0 = now_us();
                for (int k = 0; k < n; k++)
                        direct_cycle(&api, dev, size, tm);
                x = (now_us() - t0) / n;
                usleep(20000);
                t0 = now_us();
                for (int k = 0; k < n; k++)
                        if (gm_cycle(c, size, gpu_id, &a[k], &f[k]) < 0)
                                return 1;
                y = (now_us() - t0) / n;
                usleep(20000);
                printf("%5zu MiB  direct %9.1f us  gpumemd %9.1f us  ratio %.3f\n", size >> 20, x, y, y / x);
        }
        gm_client_close(c);
        return 0;
}
