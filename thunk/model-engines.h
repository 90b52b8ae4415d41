/* The KFD model's GPU engines: GPU-VM access for them, and the SDMA, PM4 and AQL packet processors. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "model-private.h"

/* What an access needs from a GPU VM mapping. */
enum {
        MODEL_VM_READ = 1,
        MODEL_VM_WRITE = 2,
        MODEL_VM_EXEC = 4,
};

/* A GPU VM fault as the memory controller reports it: the faulting page and why. */
typedef struct ModelVmFault {
        uint64_t va; /* page address, as the kernel reports page_addr << PAGE_SHIFT */
        bool not_present;
        bool read_only;
        bool no_execute;
} ModelVmFault;

/* One engine's run over one queue: the process, the queue and the GPU VM every address goes through. */
typedef struct ModelEngine {
        ThunkModel *m;
        ModelCtx *ctx;
        ModelQueue *q;
        const ModelVm *vm;
        bool faulted; /* the first fault is in @fault; the queue stops */
        ModelVmFault fault;
        uint64_t budget; /* bytes the engine may still move before it lets other queues run */
} ModelEngine;

/* Per run: how many packets an engine may retire, and how many bytes it may move, before the processor
 * looks at the other queues and lets ioctls in. */
#define MODEL_ENGINE_PACKETS 256
#define MODEL_ENGINE_BYTES   (4ULL << 20) /* a run is what any caller of the model's lock may wait for */

/* ---- model-gpuvm.c: every byte an engine touches goes through these ---- */

/* Prepares @e for a run on @q of @ctx (the VM is the queue's GPU's acquired VM). */
void model_engine_init(ModelEngine *e, ThunkModel *m, ModelCtx *ctx, ModelQueue *q);
/* Is [va, va + len) mapped in @e's VM with @access? 0, or -EFAULT with the fault recorded in @e. */
int model_vm_check(ModelEngine *e, uint64_t va, uint64_t len, unsigned int access);
/* Records a fault at @va's page for the reasons given (only the run's first is kept); returns -EFAULT. */
int model_vm_fault(ModelEngine *e, uint64_t va, bool not_present, bool read_only, bool no_execute);
/* Reads or writes @len bytes at @va; checked whole first, so a faulting access touches nothing. */
int model_vm_read(ModelEngine *e, uint64_t va, void *dst, uint64_t len);
int model_vm_write(ModelEngine *e, uint64_t va, const void *src, uint64_t len);
/* Copies @len bytes from @src to @dst inside the VM (overlap allowed); both ranges are checked first. */
int model_vm_copy(ModelEngine *e, uint64_t dst, uint64_t src, uint64_t len);
/* Writes @n elements of @size bytes (1, 2, 4 or 8), each the low bytes of @value, from @va. */
int model_vm_fill(ModelEngine *e, uint64_t va, uint64_t value, unsigned int size, uint64_t n);
/* Single naturally aligned 32/64-bit accesses, atomic where the hardware's are. */
int model_vm_load32(ModelEngine *e, uint64_t va, uint32_t *ret);
int model_vm_load64(ModelEngine *e, uint64_t va, uint64_t *ret);
int model_vm_store32(ModelEngine *e, uint64_t va, uint32_t v);
int model_vm_store64(ModelEngine *e, uint64_t va, uint64_t v);
/* An atomic read-modify-write: TC_OP_ATOMIC_* @op (the RTN/NORTN, 32/64-bit encodings), returning the
 * old value in @ret_old. -EINVAL for an operation the model does not know (nothing touched). */
int model_vm_atomic(ModelEngine *e, uint64_t va, unsigned int op, uint64_t src, uint64_t cmp,
                    uint64_t *ret_old);

/* ---- model-queue.c: what engines raise ---- */

/* How far the producer says the queue's ring is written, as the engine sees it: the write pointer in
 * memory, or in doorbell mode what the queue's doorbell was last rung with (AQL: the last packet's id + 1;
 * SDMA bytes, PM4 dwords). 0, or -EFAULT with a VM fault recorded in @e. */
int model_queue_wptr(ModelEngine *e, uint64_t *ret);

/* An interrupt carrying @partial_id with @valid_bits significant bits, as kfd_signal_event_interrupt()
 * takes it: the event whose slot is signalled, else every signalled slot. */
void model_event_interrupt(ThunkModel *m, ModelCtx *ctx, uint32_t partial_id, unsigned int valid_bits);
/* A GPU VM fault on GPU @g: the process's queues stop for good and its memory events fire. */
void model_vm_fault_raise(ThunkModel *m, ModelCtx *ctx, int g, const ModelVmFault *f);
/* The GPU's clock counter (100 MHz) and the system counter (ns), as GET_CLOCK_COUNTERS reads them. */
uint64_t model_gpu_clock(void);
uint64_t model_sys_clock(void);

/* ---- model-ring.c: the ring and indirect-buffer walk of the SDMA and PM4 processors ---- */

/* What a packet did: retired, waits (a poll), stopped the engine, began an IB, or is not all there yet. */
enum { STEP_DONE, STEP_WAIT, STEP_STOP, STEP_ENTER_IB, STEP_SHORT };

/* Where the packets come from: the ring (positions in bytes, wrapping) or an indirect buffer (dwords). */
typedef struct ModelSrc {
        bool ib;
        uint64_t base;
        uint64_t pos;
        uint64_t ring_size; /* bytes */
        uint64_t avail;     /* dwords that may be read from pos */
} ModelSrc;

/* Reads @n dwords from @idx dwords past the source's position, across the ring's end. */
int model_src_read(ModelEngine *e, const ModelSrc *s, uint64_t idx, uint32_t *out, uint64_t n);

/* The most dwords of a packet read before its processor looks at it. */
#define MODEL_RING_HEAD_MAX 8

/* A processor's ring: how its pointers count, and what runs its packets. */
typedef struct ModelRing {
        uint32_t head_dwords;      /* read of each packet first: its longest fixed-size one's, at most 8 */
        uint32_t ib_packet_dwords; /* the ring's packet that names an IB, passed once the IB is done */
        /* At a run's start: the ring's size in bytes and the write pointer; < 0, nothing to run. */
        int (*start)(ModelEngine *e, uint64_t *ret_ring_size, uint64_t *ret_wptr);
        /* The read pointer's byte position in the ring, and the dwords written past it up to @wptr. */
        uint64_t (*rptr)(const ModelQueue *q);
        uint64_t (*avail)(const ModelQueue *q, uint64_t wptr);
        /* Moves the read pointer past @dwords of the ring and writes it back (< 0: that write faulted). */
        int (*advance)(ModelEngine *e, uint64_t dwords);
        /* Runs the packet at @s's position: @h holds its first head_dwords (zero past what is available);
         * *len gets its length in dwords. STEP_*. */
        int (*step)(ModelEngine *e, const ModelSrc *s, const uint32_t *h, uint32_t *len);
} ModelRing;

/* Runs what it can of @e's queue: packets from the ring and the IBs they name, until the ring is drained,
 * a packet waits or stops the engine, or the run's budget is spent. Returns how many packets retired. */
unsigned int model_ring_run(ModelEngine *e, const ModelRing *ring);

static inline uint64_t model_addr64(uint32_t lo, uint32_t hi)
{
        return (uint64_t)hi << 32 | lo;
}

/* ---- the packet processors: each runs what it can of one queue; returns how many packets retired ---- */

unsigned int model_sdma_run(ModelEngine *e);
unsigned int model_pm4_run(ModelEngine *e);
unsigned int model_aql_run(ModelEngine *e);

/* The compare of a poll (SDMA POLL_REGMEM, PM4 WAIT_REG_MEM): function 0 always, 1 <, 2 <=, 3 ==, 4 !=,
 * 5 >=, 6 >, of the masked value against the reference; 7 is reserved and taken as "always". */
static inline bool model_poll_met(unsigned int func, uint32_t value, uint32_t mask, uint32_t ref)
{
        value &= mask;
        switch (func) {
        case 1:
                return value < ref;
        case 2:
                return value <= ref;
        case 3:
                return value == ref;
        case 4:
                return value != ref;
        case 5:
                return value >= ref;
        case 6:
                return value > ref;
        default:
                return true;
        }
}
