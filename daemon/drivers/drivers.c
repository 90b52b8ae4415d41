/* The backends gpumemd can run on: one row per driver file, found by the name the settings give. */
#include <string.h>

#include "driver-cuda.h"
#include "driver-kfd.h"
#include "driver.h"
#include "macro.h"

static const DriverBackend *const backends[] = {
        &driver_kfd_backend,
        &driver_model_backend,
        &driver_cuda_backend,
};

const DriverBackend *driver_backend_find(const char *name)
{
        for (size_t i = 0; name && i < ARRAY_SIZE(backends); i++)
                if (strcmp(backends[i]->name, name) == 0)
                        return backends[i];
        return NULL;
}

const DriverBackend *driver_backend_at(size_t index)
{
        return index < ARRAY_SIZE(backends) ? backends[index] : NULL;
}
