/* The seam between the KFD interposition layer (shim.c) and what serves it: the in-process model or gpumemd.
 */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seam.h"

/* What the layer offers a backend. */
typedef struct PreloadHost {
        /* A line for the layer's log (@level: 0 always, 1 calls, 2 details). */
        void (*log)(void *ctx, int level, const char *msg);
        void *ctx;
} PreloadHost;

/*
 * A backend stands in for the KFD of the whole process: one is linked into each library (the model's
 * backend-model.c, gpumemd's backend-broker.c) as `preload_backend`. Calls return 0 (or the ioctl's
 * non-negative result) or a negative errno, which the layer turns into errno. The layer calls start() once,
 * under its lock, before anything else; every other call may come from any thread.
 */
typedef struct PreloadBackend {
        const char *log_name;   /* prefix of its log lines ("gpumem-kfd") */
        const char *env_prefix; /* of its variables: PREFIX LOG, LOG_FILE, STATS */
        const char *stats_tag;  /* first word of the STATS line */
        /*
         * Set up; fill @topology_dir with a directory laid out as the KFD sysfs topology, and @ret_seam with
         * the device seam (seam.h) that serves /dev/kfd and the render nodes: the layer opens them through
         * it, and sends it every ioctl, mmap and close of the fds it hands out and nothing else (not
         * munmap: see below). On failure a message for the user in @msg (naming what is missing); on
         * success @msg may hold a line for the log.
         */
        int (*start)(const PreloadHost *host, ThunkSeam *ret_seam, char *topology_dir, size_t len, char *msg,
                     size_t msglen);
        /*
         * Optional, for a backend that holds address space of the process's (gpumemd's VA window): an
         * anonymous mmap the process asks for at @addr (with MAP_FIXED or without, not MAP_FIXED_NOREPLACE),
         * and a munmap. 1 when the backend did it (the mmap's address in *@ret), 0 when the call goes on to
         * the kernel, or a negative errno. Once the backend started, they keep coming in a child after
         * fork(), before its restart too.
         */
        int (*mmap_anon)(void *addr, size_t len, int prot, int flags, void **ret);
        int (*munmap)(void *addr, size_t len);
        /* Optional: sigaction() as the process calls it; 1 when the backend answered it (0: on to libc). */
        int (*sigaction)(int sig, const struct sigaction *act, struct sigaction *old);
        /* One line describing what it holds (snprintf rules). */
        int (*stats)(char *buf, size_t len);
        /*
         * A child after fork() has a KFD of its own, as on the kernel: the layer starts the backend again at
         * the child's first open (start() once more, in the child). The backend's own fork handlers have let
         * go of the parent's state by then; the inherited fds stay the backend's, to answer as it decides.
         */
        bool restart_after_fork;
        /*
         * Optional: the names of the memfds that stand for the kernel's dmabufs (and BOs) in this backend,
         * NULL ended. A kernel's dmabuf takes no seals: F_GET_SEALS and F_ADD_SEALS on such a memfd answer
         * EINVAL to the process, as on the kernel, while the backend's own calls (inside a device call) see
         * the memfd as it is.
         */
        const char *const *dmabuf_memfds;
} PreloadBackend;

extern const PreloadBackend preload_backend;
