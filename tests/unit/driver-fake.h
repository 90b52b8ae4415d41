/* A driver for tests of the broker alone: its own books of what it was asked, memfds for files, failures on
 * demand. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drivers/driver.h"

/*
 * The fake keeps every object the broker asked for (memory, grants, managed ranges, contexts) in books a test
 * can read, and notes each breach of driver.h's contracts it sees (memory freed while mapped, an object used
 * after its free, two objects at one VA of a context...). The memory of a buffer is a memfd once it can be
 * shared (host visible from its allocation, other VRAM from its first export or grant), so that the files
 * the broker hands out live and die as the kernel's would: an import holds a copy of the fd it was given.
 * It is handed to broker_new() directly; no backend lists it.
 */

#define FAKE_MAX_GPUS 8

/* The operations a test can make fail, one counter each. */
typedef enum FakeOp {
        FAKE_OP_CTX_NEW,
        FAKE_OP_AVAILABLE,
        FAKE_OP_ALLOC_VRAM,
        FAKE_OP_REGISTER_HOST,
        FAKE_OP_ALLOC_GTT,
        FAKE_OP_IMPORT,
        FAKE_OP_ADOPT,
        FAKE_OP_FREE,
        FAKE_OP_MAP,
        FAKE_OP_UNMAP,
        FAKE_OP_UNMAP_ALL,
        FAKE_OP_EXPORT,
        FAKE_OP_GRANT,
        FAKE_OP_REVOKE,
        FAKE_OP_MANAGED_REGISTER,
        FAKE_OP_CPU_UNMAP,
        FAKE_OP_SVM_SET,
        FAKE_OP_SVM_GET,
        _FAKE_OP_MAX,
} FakeOp;

typedef struct FakeConfig {
        unsigned caps; /* DRIVER_CAP_*; queues, events and doorbells are never offered */
        size_t n_gpus;
        uint32_t gpu_ids[FAKE_MAX_GPUS];
        uint64_t vram_bytes;  /* each GPU's */
        uint64_t granularity; /* DriverGpu.alloc_granularity (0: the page) */
} FakeConfig;

typedef enum FakeMemKind {
        FAKE_MEM_VRAM, /* allocated or taken back after a restart */
        FAKE_MEM_HOST, /* the daemon's pages, registered */
        FAKE_MEM_GTT,
        FAKE_MEM_IMPORT,
        _FAKE_MEM_KIND_MAX,
} FakeMemKind;

/* What lives in the driver now. */
typedef struct FakeCounts {
        uint64_t mems[_FAKE_MEM_KIND_MAX];
        uint64_t grants;
        uint64_t managed;  /* managed ranges */
        uint64_t contexts; /* client contexts (the primary one is not counted) */
        uint64_t files;    /* memory files the driver holds */
        uint64_t vram_used[FAKE_MAX_GPUS];
} FakeCounts;

typedef struct FakeMemInfo {
        FakeMemKind kind;
        unsigned ctx; /* its context's id (0: the primary one) */
        uint32_t gpu_id;
        uint64_t va, size;
        uint32_t flags;
        uint64_t mapped; /* bit i: mapped on GPU i */
        unsigned grants;
        bool has_file;
        bool read_only; /* an import of a file opened read-only */
} FakeMemInfo;

int fake_driver_new(const FakeConfig *cfg, Driver **ret);
/* Between two uses by a broker that holds nothing of it: other capabilities, and the books of what was freed
 * forgotten (a pointer to it is no longer told from one never made). */
void fake_set_caps(Driver *d, unsigned caps);
void fake_forget_freed(Driver *d);

/* The @nth call of @op from now (1: the next one) fails with @err (negative) and changes nothing. One entry
 * per operation: arming it again replaces it. */
void fake_fail(Driver *d, FakeOp op, unsigned nth, int err);
void fake_fail_clear(Driver *d);
/* Failures injected so far, and calls of @op so far. */
uint64_t fake_faults_fired(const Driver *d);
uint64_t fake_calls(const Driver *d, FakeOp op);
const char *fake_op_name(FakeOp op);

void fake_counts(const Driver *d, FakeCounts *ret);
/* The memory placed at exactly @va in any context; -ENOENT. */
int fake_mem_at(const Driver *d, uint64_t va, FakeMemInfo *ret);
/* The SVM attributes last set on the managed range that starts at @va, a value per type
 * (DRIVER_SVM_ATTR_*, FAKE_SVM_ATTRS of them); -ENOENT. */
#define FAKE_SVM_ATTRS (DRIVER_SVM_ATTR_GRANULARITY + 1)
int fake_managed_attrs(const Driver *d, uint64_t va, uint32_t ret[FAKE_SVM_ATTRS]);
/* Memory, grants and managed ranges of context @ctx, and those whose VA lies in [lo, hi). */
size_t fake_objects_in_ctx(const Driver *d, unsigned ctx);
size_t fake_objects_in_range(const Driver *d, uint64_t lo, uint64_t hi);
/* The id of the newest client context (0: none yet), and whether context @id still lives. */
unsigned fake_ctx_last(const Driver *d);
bool fake_ctx_alive(const Driver *d, unsigned id);
/* Objects a context still held when it was freed (driver_ctx_free releases them). */
uint64_t fake_released_with_ctx(const Driver *d);

/* The first breach of driver.h's contracts seen (NULL: none), and how many there were. */
const char *fake_violation(const Driver *d);
uint64_t fake_violations(const Driver *d);

/* Is @fd a file of a fake driver's memory (of any instance: what a restarted daemon's driver takes back)? */
bool fake_file_is_own(int fd);
