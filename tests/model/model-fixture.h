/* What the KFD model tests share: hand-made topologies, a model with its fds, ioctl helpers, the cases. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <linux/kfd_sysfs.h>

#include "../common/check.h"
#include "kfd-compat.h"
#include "model.h"

#define PAGE 4096ULL
#define MiB  (1ULL << 20)
#define GiB  (1ULL << 30)

/* ------------------------------------------------------------------ hand-made topologies */

typedef struct GpuSpec {
        uint32_t gpu_id;
        uint64_t vram;
        uint32_t heap; /* FB_PUBLIC (large BAR) or FB_PRIVATE (small BAR); 0 with vram 0 = APU */
        uint64_t hive;
        uint32_t gfx;
        bool svm;
} GpuSpec;

void topo_free(ThunkTopology *t);
/* A CPU node with @ram bytes and one GPU node per spec of @g. */
ThunkTopology *topo_make(size_t n, const GpuSpec *g, uint64_t ram);

/* Two large-BAR GPUs (one hive), one small-BAR GPU, all SVM capable; 64 GiB RAM. */
extern const GpuSpec std_gpus[3];
#define G0 0x1111u
#define G1 0x2222u
#define G2 0x3333u

/* ------------------------------------------------------------------ fixture */

typedef struct Fx {
        ThunkModel *m;
        ThunkSeam seam;
        int kfd;
        int render[3];
        size_t n_gpus;
        ThunkModelStats empty;
} Fx;

int io(Fx *f, int fd, unsigned long req, void *arg);
int fx_acquire(Fx *f, int kfd, int render, uint32_t gpu_id);
/* A model over @t (freed here), a kfd fd, one render fd per GPU, every VM acquired if @acquire. */
int fx_setup_topo(Fx *f, ThunkTopology *t, uint32_t minor, bool acquire);
/* The same with the model's options @o. */
int fx_setup_opts(Fx *f, ThunkTopology *t, const ThunkModelOptions *o, bool acquire);
/* fx_setup_topo() on std_gpus, every VM acquired. */
int fx_setup(Fx *f, uint32_t minor);
/* Closes everything and checks the model is back to its empty state. */
int fx_teardown(Fx *f);

/* The memory ioctls; @offset and @n_success are read and written back, as the kernel does. */
int alloc_bo(Fx *f, int kfd, uint32_t gpu, uint64_t va, uint64_t size, uint32_t flags, uint64_t *handle,
             uint64_t *offset);
int free_bo(Fx *f, int kfd, uint64_t handle);
int map_bo(Fx *f, int kfd, bool map, uint64_t handle, const uint32_t *ids, uint32_t n, uint32_t *n_success);
/* AMDKFD_IOC_SVM with @n attributes, which come back as the model left them. */
int svm_call(Fx *f, int kfd, uint32_t op, uint64_t start, uint64_t size, struct kfd_ioctl_svm_attribute *at,
             uint32_t n);
/* DRM_IOCTL_AMDGPU_GEM_VA, readable and writable. */
int gem_va(Fx *f, int fd, uint32_t op, uint32_t handle, uint64_t va, uint64_t off, uint64_t size);

#define VRAM_RW (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)
#define GTT_RW  (KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)

/* ------------------------------------------------------------------ the cases, run by test-model.c */

/* test-model.c: objects and dispatch */
int test_version(void);
int test_dispatch(void);
int test_struct_sizes(void);
int test_apertures(void);
int test_acquire_vm(void);
int test_secondary(void);
int test_faults(void);
int test_two_models(void);
int test_teardown(void);
int test_presets(void);
int test_threads(void);
/* test-model-mem.c: memory, dmabufs, carved buffers */
int test_alloc_errors(void);
int test_handles(void);
int test_free_errors(void);
int test_map_errors(void);
int test_map_resume(void);
int test_available_and_limits(void);
int test_mmap_data(void);
int test_dmabuf(void);
int test_dmabuf_foreign(void);
int test_carve(void);
int test_carve_free(void);
int test_carve_export(void);
int test_carve_fds(void);
/* test-model-svm.c */
int test_svm(void);
int test_svm_limits(void);
int test_xnack(void);
int test_svm_unmap_notices(void);
/* test-model-drm.c: render nodes */
int test_gem_va(void);
int test_read_only_import(void);
/* test-model-queue.c: events and queues */
int test_events(void);
int test_queues(void);
