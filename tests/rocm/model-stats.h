/* The KFD model's counters as the preload library reports them (gpumem_preload_stats), for the rocm tests. */
#pragma once

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct ModelCounts {
        unsigned long long contexts, kfd_fds, mems, bufs, mappings, system_used, ttm_used, vram_used, queues,
                events;
} ModelCounts;

/* 0, or -1 if the preload library is not loaded or has no model yet. */
static inline int model_counts(ModelCounts *c)
{
        int (*fn)(char *, size_t) = (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "gpumem_preload_stats");
        char line[512];
        const char *p;

        memset(c, 0, sizeof(*c));
        if (!fn || fn(line, sizeof(line)) < 0)
                return -1;
#define FIELD(name)                                                                                          \
        p = strstr(line, #name "=");                                                                         \
        if (!p || sscanf(p + strlen(#name "="), "%llu", &c->name) != 1)                                      \
                return -1;
        FIELD(contexts)
        FIELD(kfd_fds)
        FIELD(mems)
        FIELD(bufs)
        FIELD(mappings)
        FIELD(system_used)
        FIELD(ttm_used)
        FIELD(vram_used)
        FIELD(queues)
        FIELD(events)
#undef FIELD
        return 0;
}
