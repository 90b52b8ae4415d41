/* The few CUDA driver API types and entry points gpumemd and its client library use, loaded at run time. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * Nothing here comes from NVIDIA's headers: the types, constants and signatures below are the driver
 * API's published ABI (cuda.h), declared for what gpumemd calls, so the project builds everywhere and
 * runs with whatever libcuda.so.1 the machine has. Each entry point is resolved by its versioned name
 * (cuMemGetInfo_v2, ...), as cuda.h's macros would name it.
 */

typedef int CUresult; /* CUDA_SUCCESS 0, else a CUDA_ERROR_* */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_DEINITIALIZED = 4,
        CUDA_ERROR_NO_DEVICE = 100,
        CUDA_ERROR_INVALID_DEVICE = 101,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_INVALID_HANDLE = 400,
        CUDA_ERROR_NOT_FOUND = 500,
        CUDA_ERROR_ILLEGAL_ADDRESS = 700,
        CUDA_ERROR_ALREADY_MAPPED = 208,
        CUDA_ERROR_NOT_PERMITTED = 800,
        CUDA_ERROR_NOT_SUPPORTED = 801,
        CUDA_ERROR_UNKNOWN = 999,
};

/* cuDeviceGetAttribute */
enum {
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
        CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
};

/* cuDeviceGetP2PAttribute */
enum {
        CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK = 1,
        CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED = 2,
};

enum {
        CU_MEM_ALLOCATION_TYPE_PINNED = 1,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
        CU_MEM_LOCATION_TYPE_DEVICE = 1,
        CU_MEM_LOCATION_TYPE_HOST = 2,
        CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
        CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
        CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
        CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
        CU_MEMHOSTREGISTER_PORTABLE = 1,
        CU_MEMHOSTREGISTER_DEVICEMAP = 2,
};

typedef struct CUmemLocation {
        int type; /* CU_MEM_LOCATION_TYPE_* */
        int id;   /* a device ordinal, or a NUMA node */
} CUmemLocation;

typedef struct CUmemAllocationProp {
        int type;                 /* CU_MEM_ALLOCATION_TYPE_* */
        int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_* bits */
        CUmemLocation location;
        void *win32HandleMetaData;
        struct {
                unsigned char compressionType;
                unsigned char gpuDirectRDMACapable;
                unsigned short usage;
                unsigned char reserved[4];
        } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
        CUmemLocation location;
        int flags; /* CU_MEM_ACCESS_FLAGS_* */
} CUmemAccessDesc;

/* The entry points, resolved by cuda_api_load(); the optional ones may be NULL. */
typedef struct CudaApi {
        void *lib;
        int version; /* cuDriverGetVersion: 1000 * major + 10 * minor */
        CUresult (*Init)(unsigned flags);
        CUresult (*DriverGetVersion)(int *ret);
        CUresult (*GetErrorName)(CUresult r, const char **ret);
        CUresult (*DeviceGetCount)(int *ret);
        CUresult (*DeviceGet)(CUdevice *ret, int ordinal);
        CUresult (*DeviceGetName)(char *buf, int len, CUdevice d);
        CUresult (*DeviceTotalMem)(size_t *ret, CUdevice d);
        CUresult (*DeviceGetAttribute)(int *ret, int attr, CUdevice d);
        CUresult (*DeviceGetPCIBusId)(char *buf, int len, CUdevice d);
        CUresult (*DeviceGetByPCIBusId)(CUdevice *ret, const char *bus_id);
        CUresult (*DeviceGetUuid)(unsigned char uuid[16], CUdevice d);
        CUresult (*DeviceCanAccessPeer)(int *ret, CUdevice d, CUdevice peer);
        CUresult (*DeviceGetP2PAttribute)(int *ret, int attr, CUdevice src, CUdevice dst);
        CUresult (*DevicePrimaryCtxRetain)(CUcontext *ret, CUdevice d);
        CUresult (*DevicePrimaryCtxRelease)(CUdevice d);
        CUresult (*CtxSetCurrent)(CUcontext ctx);
        CUresult (*CtxSynchronize)(void);
        CUresult (*MemGetInfo)(size_t *ret_free, size_t *ret_total);
        CUresult (*MemGetAllocationGranularity)(size_t *ret, const CUmemAllocationProp *prop, int option);
        CUresult (*MemCreate)(CUmemGenericAllocationHandle *ret, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags);
        CUresult (*MemRelease)(CUmemGenericAllocationHandle h);
        CUresult (*MemExportToShareableHandle)(void *ret, CUmemGenericAllocationHandle h, int type,
                                               unsigned long long flags);
        CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *ret, void *os_handle,
                                                 int type);
        CUresult (*MemAddressReserve)(CUdeviceptr *ret, size_t size, size_t alignment, CUdeviceptr addr,
                                      unsigned long long flags);
        CUresult (*MemAddressFree)(CUdeviceptr p, size_t size);
        CUresult (*MemMap)(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                           unsigned long long flags);
        CUresult (*MemUnmap)(CUdeviceptr p, size_t size);
        CUresult (*MemSetAccess)(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t n);
        CUresult (*MemHostRegister)(void *p, size_t size, unsigned flags);
        CUresult (*MemHostUnregister)(void *p);
        CUresult (*MemHostGetDevicePointer)(CUdeviceptr *ret, void *p, unsigned flags);
        /* for programs that run kernels (examples, tests, benchmarks) */
        CUresult (*ModuleLoadData)(CUmodule *ret, const void *image);
        CUresult (*ModuleUnload)(CUmodule m);
        CUresult (*ModuleGetFunction)(CUfunction *ret, CUmodule m, const char *name);
        CUresult (*LaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared_bytes, CUstream s, void **params,
                                 void **extra);
        CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);
        CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);
} CudaApi;

/*
 * Load @path (NULL: "libcuda.so.1") and resolve every entry point above, then cuInit(0). Returns 0, or a
 * negative errno with the reason in @errbuf: -ENOENT when the library is not there (no NVIDIA driver),
 * -ENOSYS when it lacks an entry point (a driver older than CUDA 11.3), -ENODEV when cuInit finds no GPU.
 */
int cuda_api_load(CudaApi *api, const char *path, char *errbuf, size_t errlen);
/* Forget the library. It stays loaded: the CUDA driver keeps threads and handlers that outlive an unload. */
void cuda_api_unload(CudaApi *api);

/* A CUresult as a negative errno (0 for CUDA_SUCCESS). */
int cuda_errno(CUresult r);
/* "CUDA_ERROR_OUT_OF_MEMORY", or "CUDA error N" where the library does not know it. */
const char *cuda_error_name(const CudaApi *api, CUresult r, char *buf, size_t len);
