/* Loading the CUDA driver library and naming its errors (cuda-api.h). */
#include "cuda-api.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

typedef struct Entry {
        const char *name; /* the symbol libcuda exports */
        size_t offset;    /* of the pointer in CudaApi */
        int optional;
} Entry;

#define E(field, symbol)                                                                                     \
        {                                                                                                    \
                symbol, offsetof(CudaApi, field), 0                                                          \
        }
#define EO(field, symbol)                                                                                    \
        {                                                                                                    \
                symbol, offsetof(CudaApi, field), 1                                                          \
        }

static const Entry entries[] = {
        E(Init, "cuInit"),
        E(DriverGetVersion, "cuDriverGetVersion"),
        E(GetErrorName, "cuGetErrorName"),
        E(DeviceGetCount, "cuDeviceGetCount"),
        E(DeviceGet, "cuDeviceGet"),
        E(DeviceGetName, "cuDeviceGetName"),
        E(DeviceTotalMem, "cuDeviceTotalMem_v2"),
        E(DeviceGetAttribute, "cuDeviceGetAttribute"),
        E(DeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
        E(DeviceGetByPCIBusId, "cuDeviceGetByPCIBusId"),
        EO(DeviceGetUuid, "cuDeviceGetUuid_v2"),
        E(DeviceCanAccessPeer, "cuDeviceCanAccessPeer"),
        EO(DeviceGetP2PAttribute, "cuDeviceGetP2PAttribute"),
        E(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        E(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        E(CtxSetCurrent, "cuCtxSetCurrent"),
        E(CtxSynchronize, "cuCtxSynchronize"),
        E(MemGetInfo, "cuMemGetInfo_v2"),
        E(MemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
        E(MemCreate, "cuMemCreate"),
        E(MemRelease, "cuMemRelease"),
        E(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
        E(MemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
        E(MemAddressReserve, "cuMemAddressReserve"),
        E(MemAddressFree, "cuMemAddressFree"),
        E(MemMap, "cuMemMap"),
        E(MemUnmap, "cuMemUnmap"),
        E(MemSetAccess, "cuMemSetAccess"),
        E(MemHostRegister, "cuMemHostRegister_v2"),
        E(MemHostUnregister, "cuMemHostUnregister"),
        E(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
        E(ModuleLoadData, "cuModuleLoadData"),
        E(ModuleUnload, "cuModuleUnload"),
        E(ModuleGetFunction, "cuModuleGetFunction"),
        E(LaunchKernel, "cuLaunchKernel"),
        E(MemcpyHtoD, "cuMemcpyHtoD_v2"),
        E(MemcpyDtoH, "cuMemcpyDtoH_v2"),
};

int cuda_api_load(CudaApi *api, const char *path, char *errbuf, size_t errlen)
{
        char name[64];
        CUresult cr;

        if (!api)
                return -EINVAL;
        memset(api, 0, sizeof(*api));
        if (!path)
                path = "libcuda.so.1";
        api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!api->lib) {
                const char *why = dlerror();
                if (errbuf)
                        snprintf(errbuf, errlen, "cannot load %s (no NVIDIA driver here?): %s", path,
                                 why ? why : "unknown error");
                return -ENOENT;
        }
        for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
                void *sym = dlsym(api->lib, entries[i].name);
                if (!sym && !entries[i].optional) {
                        if (errbuf)
                                snprintf(errbuf, errlen, "%s has no %s: the NVIDIA driver is too old", path,
                                         entries[i].name);
                        memset(api, 0, sizeof(*api));
                        return -ENOSYS;
                }
                /* POSIX: a function pointer converts to and from void * (dlsym's contract) */
                memcpy((char *)api + entries[i].offset, &sym, sizeof(sym));
        }
        cr = api->Init(0);
        if (cr != CUDA_SUCCESS) {
                if (errbuf)
                        snprintf(errbuf, errlen, "cuInit: %s", cuda_error_name(api, cr, name, sizeof(name)));
                int r = cr == CUDA_ERROR_NO_DEVICE ? -ENODEV : cuda_errno(cr);
                memset(api, 0, sizeof(*api));
                return r;
        }
        if (api->DriverGetVersion(&api->version) != CUDA_SUCCESS)
                api->version = 0;
        return 0;
}

void cuda_api_unload(CudaApi *api)
{
        if (api)
                memset(api, 0, sizeof(*api));
}

int cuda_errno(CUresult r)
{
        switch (r) {
        case CUDA_SUCCESS:
                return 0;
        case CUDA_ERROR_INVALID_VALUE:
        case CUDA_ERROR_INVALID_HANDLE:
        case CUDA_ERROR_INVALID_CONTEXT:
                return -EINVAL;
        case CUDA_ERROR_OUT_OF_MEMORY:
                return -ENOMEM;
        case CUDA_ERROR_NOT_INITIALIZED:
        case CUDA_ERROR_DEINITIALIZED:
                return -ENXIO;
        case CUDA_ERROR_NO_DEVICE:
        case CUDA_ERROR_INVALID_DEVICE:
                return -ENODEV;
        case CUDA_ERROR_NOT_FOUND:
                return -ENOENT;
        case CUDA_ERROR_ALREADY_MAPPED:
                return -EADDRINUSE;
        case CUDA_ERROR_NOT_PERMITTED:
                return -EPERM;
        case CUDA_ERROR_NOT_SUPPORTED:
                return -EOPNOTSUPP;
        case CUDA_ERROR_ILLEGAL_ADDRESS:
                return -EFAULT;
        default:
                return -EIO;
        }
}

const char *cuda_error_name(const CudaApi *api, CUresult r, char *buf, size_t len)
{
        const char *s = NULL;

        if (api && api->GetErrorName && api->GetErrorName(r, &s) == CUDA_SUCCESS && s)
                return s;
        snprintf(buf, len, "CUDA error %d", r);
        return buf;
}
