/* Helpers shared by the thunk tests: model devices and model stats comparison (checks: ../common/check.h). */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "model.h"
#include "thunk.h"

#define TEST_SKIP 77

#define RUN(fn, ...)                                                                                         \
        do {                                                                                                 \
                fn(__VA_ARGS__);                                                                             \
                printf("ok %s\n", #fn);                                                                      \
        } while (0)

static inline void preset_path(char *buf, size_t len, const char *root, const char *name)
{
        int n = snprintf(buf, len, "%s/%s", root, name);

        ASSERT(n > 0 && (size_t)n < len);
}

/* A MODEL device on preset @name under @root reporting KFD minor @minor (0 = model default). */
static inline ThunkDevice *open_model(const char *root, const char *name, uint32_t minor)
{
        char path[4096], err[512];
        ThunkOptions o = {.backend = THUNK_BACKEND_MODEL, .topology_root = path, .model_kfd_minor = minor};
        ThunkDevice *d = NULL;
        int r;

        preset_path(path, sizeof(path), root, name);
        r = thunk_device_open(&o, &d, err, sizeof(err));
        if (r < 0) {
                fprintf(stderr, "open model %s (minor %u): %s: %s\n", name, minor, strerror(-r), err);
                exit(1);
        }
        ASSERT(d);
        return d;
}

static inline ThunkModelStats model_stats(ThunkDevice *d)
{
        ThunkModelStats s;

        memset(&s, 0, sizeof(s));
        ASSERT(thunk_device_model(d));
        thunk_model_get_stats(thunk_device_model(d), &s);
        return s;
}

/* Every counter of @b equals @a's: nothing leaked, nothing lost (the program exits if not). */
static inline void check_stats_equal_at(const ThunkModelStats *a, const ThunkModelStats *b, const char *file,
                                        int line)
{
        bool ok = a->contexts == b->contexts && a->kfd_fds == b->kfd_fds && a->render_fds == b->render_fds &&
                  a->render_files == b->render_files && a->mems == b->mems && a->bufs == b->bufs &&
                  a->imports == b->imports && a->mappings == b->mappings &&
                  a->gem_handles == b->gem_handles && a->svm_ranges == b->svm_ranges &&
                  a->system_used == b->system_used && a->ttm_used == b->ttm_used && a->n_gpus == b->n_gpus;

        for (uint32_t i = 0; ok && i < a->n_gpus && i < THUNK_MODEL_MAX_GPUS; i++)
                ok = a->vram_used[i] == b->vram_used[i];
        if (!ok) {
                check_failed(
                        file, line,
                        "model stats differ:\n"
                        "  contexts %u/%u kfd_fds %u/%u render_fds %u/%u render_files %u/%u\n"
                        "  mems %llu/%llu bufs %llu/%llu imports %llu/%llu mappings %llu/%llu gem %llu/%llu\n"
                        "  svm %llu/%llu system %llu/%llu ttm %llu/%llu",
                        a->contexts, b->contexts, a->kfd_fds, b->kfd_fds, a->render_fds, b->render_fds,
                        a->render_files, b->render_files, (unsigned long long)a->mems,
                        (unsigned long long)b->mems, (unsigned long long)a->bufs, (unsigned long long)b->bufs,
                        (unsigned long long)a->imports, (unsigned long long)b->imports,
                        (unsigned long long)a->mappings, (unsigned long long)b->mappings,
                        (unsigned long long)a->gem_handles, (unsigned long long)b->gem_handles,
                        (unsigned long long)a->svm_ranges, (unsigned long long)b->svm_ranges,
                        (unsigned long long)a->system_used, (unsigned long long)b->system_used,
                        (unsigned long long)a->ttm_used, (unsigned long long)b->ttm_used);
                exit(EXIT_FAILURE);
        }
}

#define ASSERT_STATS_EQUAL(a, b) check_stats_equal_at((a), (b), __FILE__, __LINE__)

static inline uint64_t align_up(uint64_t v, uint64_t a)
{
        return (v + a - 1) & ~(a - 1);
}

/* A GPU VA inside the device's SVM aperture, @slot 2 MiB-aligned 64 MiB windows above its base. */
static inline uint64_t test_va(const ThunkDevice *d, unsigned slot)
{
        uint64_t base, limit, va;

        thunk_device_svm_aperture(d, &base, &limit);
        va = align_up(base, 1ull << 21) + (1ull << 30) + (uint64_t)slot * (64ull << 20);
        ASSERT(va + (64ull << 20) - 1 <= limit);
        return va;
}
