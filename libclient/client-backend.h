/* libgpumem_client's backend seam: what a backend does in this process around the generic calls. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem-client.h"

/*
 * The generic calls ask the daemon, which allocates, maps and frees; on most backends ("kfd", "model") the
 * daemon's mappings are the process's own, and nothing more is done here: the default row, whose pointers
 * are the daemon's VAs. A backend whose GPU driver keeps its mappings per process (NVIDIA's CUDA contexts)
 * takes what the daemon answered into this process as well: one row of this table, in a file of its own.
 * The generic calls call every operation of the row they hold (gm_client's bk, chosen by the daemon's
 * backend name at connect), never test which backend it is.
 *
 * Every operation takes and returns the daemon's VAs, except the two translations. Those that can fail
 * return 0 or a negative errno with the reason recorded (gm_set_reason).
 */

/* What a backend keeps of one allocation, in the client's table (all zero: nothing). */
typedef struct GmBackendMem {
        uint64_t handle; /* the backend's own handle of the memory it mapped, or 0 */
        bool host;       /* host memory it registered at the allocation's address */
} GmBackendMem;

/* New memory the daemon answered: an allocation it placed at @va, or a VMM handle it made or imported (@va
 * 0: gm_mem_map places it later). */
typedef struct GmBackendNew {
        gm_handle handle; /* the daemon's */
        int kind;         /* GM_KIND_*; GM_KIND_DEVICE for a VMM handle */
        uint64_t va, size;
        uint32_t gpu_id;      /* where it lies (0: the daemon's choice) */
        const uint32_t *gpus; /* an allocation: the GPUs it is mapped on, with @access */
        size_t n_gpus;
        int access; /* GM_ACCESS_* */
        int fd;     /* its export, for this process to import, or -1 when the daemon sent none */
} GmBackendNew;

typedef struct GmBackend {
        const char *name; /* the daemon's backend name this row serves (NULL: the default row) */
        /* At connect, once the window is reserved; the row's state goes in gm_client's bk_data. */
        int (*open)(gm_client *c);
        /* At close, or when open failed part way: let go of everything (no other call runs). */
        void (*close)(gm_client *c);
        /* A pointer the caller holds → the daemon's VA, and back (identity outside what the row maps). */
        uint64_t (*to_va)(const gm_client *c, uint64_t ptr);
        uint64_t (*to_ptr)(const gm_client *c, uint64_t va);
        /* Take new memory into this process: an allocation's state goes in *@ret; a VMM handle's (@ret
         * NULL) the row keeps by the daemon's handle. On failure nothing is left here; the caller gives
         * the daemon its memory back. */
        int (*map_new)(gm_client *c, const GmBackendNew *n, GmBackendMem *ret);
        /* An allocation's teardown, before the daemon frees it: what map_new left in *@m, zeroed after. */
        void (*unmap_alloc)(gm_client *c, GmBackendMem *m, uint64_t va, uint64_t size);
        /* A VMM handle the daemon released: the row's import of it goes. */
        void (*release)(gm_client *c, gm_handle handle);
        /* gm_mem_map, after the daemon mapped @handle at @va; on failure the caller unmaps it there too. */
        int (*map)(gm_client *c, uint64_t va, uint64_t size, uint64_t offset, gm_handle handle);
        /* gm_mem_unmap, before the daemon unmaps: whatever the row mapped in the range. */
        int (*unmap)(gm_client *c, uint64_t va, uint64_t size);
        /* GPU @gpu_id's access to the range, which the daemon allowed: of an allocation (@m, its state:
         * nothing to do where the row mapped none) or of a VMM range (@m NULL). */
        int (*access)(gm_client *c, const GmBackendMem *m, uint64_t va, uint64_t size, uint32_t gpu_id,
                      int access);
} GmBackend;

/*
 * A row of a backend whose functions are named PREFIX_open, PREFIX_close, PREFIX_to_va ... PREFIX_access
 * after GmBackend's members: the members are listed here once, and a backend that lacks one does not build.
 */
#define GM_BACKEND_ROW(label, prefix)                                                                        \
        {                                                                                                    \
                .name = (label), .open = prefix##_open, .close = prefix##_close, .to_va = prefix##_to_va,    \
                .to_ptr = prefix##_to_ptr, .map_new = prefix##_map_new, .unmap_alloc = prefix##_unmap_alloc, \
                .release = prefix##_release, .map = prefix##_map, .unmap = prefix##_unmap,                   \
                .access = prefix##_access,                                                                   \
        }

/* The rows: "cuda" (client-cuda.c). */
extern const GmBackend gm_backend_cuda;

/* The row for the daemon's backend @name: its own, or the default row. */
const GmBackend *gm_backend_find(const char *name);
/* The default row, which a client holds until a backend's open succeeds. */
extern const GmBackend gm_backend_default;
