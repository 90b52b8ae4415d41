/* The examples' way to pick GPUs: the first ones gpumemd serves, from its topology. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem-client.h"

/*
 * The ids of the first @want GPUs into @ids, in the topology's order; where there are fewer, the first
 * stands in for the rest (a one-GPU machine runs every example). -ENODEV without a GPU, or the topology
 * call's error.
 */
static inline int example_gpus(gm_client *c, uint32_t *ids, size_t want)
{
        gm_topology *t = NULL;
        size_t n = 0;
        int r = gm_topology_get(c, false, &t);

        if (r < 0)
                return r;
        for (size_t i = 0; i < t->n_nodes && n < want; i++)
                if (t->nodes[i].is_gpu)
                        ids[n++] = t->nodes[i].gpu_id;
        gm_topology_free(t);
        if (n == 0)
                return -ENODEV;
        for (; n < want; n++)
                ids[n] = ids[0];
        return 0;
}
