/* The CUDA driver: gpumemd's device and VMM memory on NVIDIA GPUs, through the CUDA driver API's VMM calls.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "topology.h"

/* The backend: libcuda.so.1 (GPUMEMD_CUDA_LIBRARY names another), loaded when gpumemd starts. */
extern const DriverBackend driver_cuda_backend;

/* What the topology is made of, per GPU: what the CUDA driver and sysfs tell of it. */
typedef struct DriverCudaGpuDesc {
        char name[64];
        uint32_t gpu_id;
        uint64_t vram_bytes;
        uint32_t sm_count;
        uint32_t cc_major, cc_minor; /* compute capability */
        uint32_t pci_domain, pci_bus, pci_device, pci_function;
        uint32_t pci_device_id; /* the PCI product id (sysfs), 0 unknown */
        uint32_t clock_mhz;
        int numa_node; /* -1 unknown */
        uint64_t unique_id;
        /* peer[k]: the CUDA driver's performance rank of the link to GPU k plus one, 0: no peer access */
        uint32_t peer_rank[64];
        uint8_t peer_atomics[64]; /* native atomics over that link (NVLink) */
} DriverCudaGpuDesc;

typedef struct DriverCudaHostDesc {
        unsigned n_numa_nodes; /* at least 1 */
        uint32_t cpu_cores[64];
        uint64_t mem_bytes[64];
} DriverCudaHostDesc;

/*
 * The topology the daemon reports for these GPUs, in the KFD's shape that its protocol and gpumemctl
 * speak: a CPU node per NUMA node, then a node per GPU (vendor 0x10de, one "SIMD" per multiprocessor,
 * its VRAM as one memory bank), PCIe links between each GPU and its NUMA node's CPU node, and a link of
 * type 16 (other) between peers, weighted by the CUDA driver's rank. Pure: GPU-free tests call it.
 */
int driver_cuda_topology(const DriverCudaGpuDesc *gpus, size_t n_gpus, const DriverCudaHostDesc *host,
                         ThunkTopology **ret, char *errbuf, size_t errlen);

/* A gpu_id for a GPU's UUID: 16 bits, never 0, as KFD's are; the caller moves past a collision. */
uint32_t driver_cuda_gpu_id(const unsigned char uuid[16]);
