/* Pages the process registers, swapped for a GTT buffer of its context in gpumemd and back (swap.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "gpumem-client.h"

/*
 * The process's pages at @cpu_va become a GTT buffer of its context at @gpu_va (in the window), made on
 * @gpu_id with @flags (GM_MEM_*). *@ret_kept: where the process's own pages wait for the way back (0: none).
 * 0 or a negative errno, the pages unchanged then. Lines for the log go to @host (NULL: none).
 */
int registered_swap_in(gm_client *c, const PreloadHost *host, uint64_t cpu_va, uint64_t gpu_va, uint64_t size,
                       uint32_t gpu_id, unsigned flags, uint64_t *ret_kept);

/* The pages back to being the process's own, and the buffer freed. *@freed: the daemon let go of it.
 * *@kept is 0 once the pages kept aside are the range's again or gone (a failure may leave them kept). */
int registered_swap_out(gm_client *c, const PreloadHost *host, uint64_t cpu_va, uint64_t gpu_va,
                        uint64_t size, uint64_t *kept, bool *freed);
