/* The KFD driver: the driver seam over the thunk, on the kernel's /dev/kfd or the built-in KFD model. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"

typedef struct DriverKfdOptions {
        bool model;                /* the built-in KFD model instead of /dev/kfd */
        const char *topology_root; /* the KFD sysfs topology, or the model preset's directory; NULL: sysfs */
        uint32_t model_kfd_minor;  /* the KFD ABI minor version the model reports (0: its newest) */
        /* the model's queues run up to their doorbells, as the kernel's do, and the driver rings them from
         * the write pointers as it must on the kernel (DRIVER_CAP_DOORBELL_RELAY) */
        bool model_doorbells;
        uint32_t max_listeners; /* event threads for client contexts at once (0: DRIVER_MAX_LISTENERS) */
} DriverKfdOptions;

/* Open the device: topology, KFD version, apertures, a GPU VM on every GPU. @errbuf gets the reason. */
int driver_kfd_open(const DriverKfdOptions *o, Driver **ret, char *errbuf, size_t errlen);

/* The two backends of this driver: the kernel's /dev/kfd, and the built-in KFD model. */
extern const DriverBackend driver_kfd_backend;
extern const DriverBackend driver_model_backend;

/* The KFD ABI minor versions the model can report (--model-kfd-minor). */
void driver_kfd_model_minor_range(uint32_t *ret_min, uint32_t *ret_max);

/* For tests that look under the driver: the thunk device, and the model when it is one (else NULL). */
struct ThunkDevice *driver_kfd_device(Driver *d);
struct ThunkModel *driver_kfd_model(Driver *d);
