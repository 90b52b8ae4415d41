/* The CUDA driver without a GPU: its topology, its gpu ids, its errors, and opening where there is no
 * driver library or an unusable one. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "cuda-api.h"
#include "drivers/driver-cuda.h"
#include "topology.h"

static void two_gpus(DriverCudaGpuDesc g[2], DriverCudaHostDesc *h)
{
        memset(g, 0, 2 * sizeof(*g));
        memset(h, 0, sizeof(*h));
        h->n_numa_nodes = 2;
        h->cpu_cores[0] = h->cpu_cores[1] = 8;
        h->mem_bytes[0] = h->mem_bytes[1] = 64ull << 30;
        for (int i = 0; i < 2; i++) {
                snprintf(g[i].name, sizeof(g[i].name), "NVIDIA H200");
                g[i].gpu_id = 0x1000u + (uint32_t)i;
                g[i].vram_bytes = 150109880320ull;
                g[i].sm_count = 132;
                g[i].cc_major = 9;
                g[i].pci_bus = 0x18u + 0x20u * (uint32_t)i;
                g[i].pci_device_id = 0x2335;
                g[i].numa_node = i;
        }
        /* NVLink between them: peer access, native atomics */
        g[0].peer_rank[1] = g[1].peer_rank[0] = 1;
        g[0].peer_atomics[1] = g[1].peer_atomics[0] = 1;
}

static void topology_shape(void)
{
        DriverCudaGpuDesc g[2];
        DriverCudaHostDesc h;
        ThunkTopology *t = NULL;
        char err[256] = "";

        two_gpus(g, &h);
        CHECK_RC(driver_cuda_topology(g, 2, &h, &t, err, sizeof(err)), 0);
        if (!t) {
                fprintf(stderr, "%s\n", err);
                return;
        }
        CHECK_EQ(t->n_nodes, 4);
        CHECK_EQ(t->n_gpus, 2);
        for (size_t i = 0; i < 2; i++) {
                const ThunkNode *n = thunk_topology_gpu_by_index(t, i);
                CHECK(n != NULL);
                if (!n)
                        continue;
                CHECK_EQ(n->gpu_id, g[i].gpu_id);
                CHECK_EQ(n->vendor_id, 0x10de);
                CHECK_EQ(n->device_id, 0x2335);
                CHECK_EQ(n->simd_count, 132);
                CHECK_EQ(n->local_mem_size, g[i].vram_bytes);
                CHECK_EQ(n->location_id, g[i].pci_bus << 8);
                CHECK_EQ(n->numa_node, (int)i); /* by its PCIe link to its NUMA node's CPU node */
                CHECK_EQ(n->n_io_links, 2);     /* the CPU, and the peer */
                CHECK_EQ(n->io_links[0].type, 2);
                CHECK_EQ(n->io_links[1].type, 16);
                CHECK_EQ(n->io_links[1].node_to, 2 + (1 - i));
                CHECK_STR_CONTAINS(n->name, "H200");
        }
        CHECK_EQ(t->nodes[0].cpu_cores_count, 8);
        CHECK_EQ(thunk_node_system_bytes(&t->nodes[1]), 64ull << 30);
        thunk_topology_free(t);

        /* without peers, one NUMA node unknown: both GPUs hang off node 0 */
        g[0].peer_rank[1] = g[1].peer_rank[0] = 0;
        g[0].numa_node = g[1].numa_node = -1;
        h.n_numa_nodes = 1;
        CHECK_RC(driver_cuda_topology(g, 2, &h, &t, err, sizeof(err)), 0);
        if (t) {
                CHECK_EQ(t->n_nodes, 3);
                CHECK_EQ(t->nodes[0].n_io_links, 2);
                CHECK_EQ(thunk_topology_gpu_by_index(t, 1)->n_io_links, 1);
                CHECK_EQ(thunk_topology_gpu_by_index(t, 1)->numa_node, 0);
                thunk_topology_free(t);
        }
}

static void gpu_ids(void)
{
        unsigned char a[16] = {0xb5, 0x29, 0x07, 0x77, 0x9b, 0xdc, 0xac, 0xac,
                               0x27, 0xfa, 0xc8, 0xcb, 0xda, 0x2d, 0xfb, 0x44};
        unsigned char b[16] = {0};
        uint32_t id = driver_cuda_gpu_id(a);

        CHECK(id != 0 && id <= 0xffff);
        CHECK_EQ(driver_cuda_gpu_id(a), id); /* the same GPU keeps its id across restarts */
        CHECK(driver_cuda_gpu_id(b) != 0);
        b[15] = 1;
        CHECK(driver_cuda_gpu_id(b) != driver_cuda_gpu_id(a));
}

static void errors(void)
{
        char buf[32];

        CHECK_EQ(cuda_errno(CUDA_SUCCESS), 0);
        CHECK_EQ(cuda_errno(CUDA_ERROR_OUT_OF_MEMORY), -ENOMEM);
        CHECK_EQ(cuda_errno(CUDA_ERROR_INVALID_VALUE), -EINVAL);
        CHECK_EQ(cuda_errno(CUDA_ERROR_NOT_SUPPORTED), -EOPNOTSUPP);
        CHECK_EQ(cuda_errno(CUDA_ERROR_NO_DEVICE), -ENODEV);
        CHECK_EQ(cuda_errno(CUDA_ERROR_UNKNOWN), -EIO);
        CHECK_STR_CONTAINS(cuda_error_name(NULL, 801, buf, sizeof(buf)), "CUDA error 801");
}

static void no_library(void)
{
        const DriverBackend *be = driver_backend_find("cuda");
        DriverOpenArgs oa = {0};
        Driver *d = NULL;
        char err[512] = "";
        CudaApi api;

        CHECK(be != NULL);
        if (!be)
                return;
        setenv("GPUMEMD_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
        CHECK_RC(be->open(&oa, &d, err, sizeof(err)), -ENOENT);
        CHECK(d == NULL);
        CHECK_STR_CONTAINS(err, "cannot load /nonexistent/libcuda.so.1");
        /* a library that is not the CUDA driver: the first missing entry point is named */
        setenv("GPUMEMD_CUDA_LIBRARY", "libm.so.6", 1);
        CHECK_RC(be->open(&oa, &d, err, sizeof(err)), -ENOSYS);
        CHECK_STR_CONTAINS(err, "has no cuInit");
        unsetenv("GPUMEMD_CUDA_LIBRARY");
        CHECK_RC(cuda_api_load(&api, "/nonexistent/libcuda.so.1", NULL, 0), -ENOENT);
        CHECK_RC(cuda_api_load(NULL, NULL, NULL, 0), -EINVAL);
}

int main(void)
{
        static const TestCase cases[] = {
                {"topology", topology_shape},
                {"gpu ids", gpu_ids},
                {"errors", errors},
                {"no library", no_library},
        };
        return run_tests(cases, ARRAY_SIZE(cases));
}
