/* The compute command processor of the KFD model: gfx9 PM4 packets from a user-mode ring, through the GPU VM.
 */
#include <errno.h>
#include <string.h>

#include "model-engines.h"

/* Packet encodings: the kernel's soc15d.h (headers, opcodes, fields) and kfd_pm4_headers_ai.h (RELEASE_MEM
 * ordinals and selects). */
#define PM4_TYPE(h)             ((h) >> 30)
#define PM4_COUNT(h)            (((h) >> 16) & 0x3fff)
#define PM4_OPCODE(h)           (((h) >> 8) & 0xff)
#define PM4_NOP                 0x10
#define PM4_WRITE_DATA          0x37
#define PM4_WAIT_REG_MEM        0x3c
#define PM4_INDIRECT_BUFFER     0x3f
#define PM4_EVENT_WRITE         0x46
#define PM4_RELEASE_MEM         0x49
#define PM4_ACQUIRE_MEM         0x58
#define PM4_NOP_ONE_DWORD       0x3fff /* a type-3 NOP with this count is a single dword */
#define PM4_WD_DST_MEM_SYNC     1
#define PM4_WD_DST_TC_L2        2
#define PM4_WD_DST_MEM          5
#define PM4_RM_DATA_32          1
#define PM4_RM_DATA_64          2
#define PM4_RM_DATA_GPU_CLOCK   3
#define PM4_RM_DATA_PERFCOUNTER 4
#define PM4_RM_DST_MC           0
#define PM4_RM_DST_TC_L2        1
#define PM4_EOP_VALID_IDS       32 /* the end-of-pipe interrupt carries the whole context id */
#define PM4_MAX_FIXED           8
#define PM4_IB_PACKET_DWORDS    4
#define PM4_WRITE_CHUNK         256

/* WRITE_DATA: to memory (DST_SEL 1, 2, 5) the data dwords land from the address, or all on it with
 * WR_ONE_ADDR; registers and GDS are not modelled and left alone. */
static int pm4_write_data(ModelEngine *e, const ModelSrc *s, const uint32_t *p, uint32_t len)
{
        unsigned int dst_sel = (p[1] >> 8) & 0xf;
        bool one_addr = (p[1] >> 16) & 1;
        uint64_t dst = model_addr64(p[2] & ~3u, p[3]), ndw = len - 4;
        uint32_t buf[PM4_WRITE_CHUNK];

        if (len < 4)
                return STEP_STOP;
        if (dst_sel != PM4_WD_DST_MEM_SYNC && dst_sel != PM4_WD_DST_TC_L2 && dst_sel != PM4_WD_DST_MEM)
                return STEP_DONE;
        if (model_vm_check(e, dst, one_addr ? 4 : ndw * 4, MODEL_VM_WRITE) < 0)
                return STEP_STOP;
        for (uint64_t i = 0; i < ndw;) {
                uint64_t n = ndw - i < PM4_WRITE_CHUNK ? ndw - i : PM4_WRITE_CHUNK;

                if (model_src_read(e, s, 4 + i, buf, n) < 0)
                        return STEP_STOP;
                if (one_addr) {
                        for (uint64_t k = 0; k < n; k++)
                                if (model_vm_store32(e, dst, buf[k]) < 0)
                                        return STEP_STOP;
                } else if (model_vm_write(e, dst + i * 4, buf, n * 4) < 0) {
                        return STEP_STOP;
                }
                i += n;
        }
        e->budget = e->budget > ndw * 4 ? e->budget - ndw * 4 : 0;
        return STEP_DONE;
}

static int pm4_wait_reg_mem(ModelEngine *e, const uint32_t *p)
{
        unsigned int func = p[1] & 7, space = (p[1] >> 4) & 3;
        uint32_t v;

        /* registers are not modelled: a wait on one holds at once */
        if (space != 1)
                return STEP_DONE;
        if (model_vm_load32(e, model_addr64(p[2] & ~3u, p[3]), &v) < 0)
                return STEP_STOP;
        return model_poll_met(func, v, p[5], p[4]) ? STEP_DONE : STEP_WAIT;
}

/* RELEASE_MEM: everything before it has finished (the engine runs in order), so the end-of-pipe data is
 * written now and the interrupt, if asked for, follows it with INT_CTXID as the context. */
static int pm4_release_mem(ModelEngine *e, const uint32_t *p)
{
        unsigned int dst_sel = (p[2] >> 16) & 3, int_sel = (p[2] >> 24) & 7, data_sel = (p[2] >> 29) & 7;
        uint64_t addr = model_addr64(p[3], p[4]);
        int r = 0;

        /* the queue write pointer selects target CP registers, not memory */
        if (dst_sel == PM4_RM_DST_MC || dst_sel == PM4_RM_DST_TC_L2) {
                switch (data_sel) {
                case PM4_RM_DATA_32:
                        r = model_vm_store32(e, addr & ~3ULL, p[5]);
                        break;
                case PM4_RM_DATA_64:
                        r = model_vm_store64(e, addr & ~7ULL, model_addr64(p[5], p[6]));
                        break;
                case PM4_RM_DATA_GPU_CLOCK:
                case PM4_RM_DATA_PERFCOUNTER: /* no performance counters: the clock stands in */
                        r = model_vm_store64(e, addr & ~7ULL, model_gpu_clock());
                        break;
                default: /* none, or GDS, which is not modelled */
                        break;
                }
        }
        if (r < 0)
                return STEP_STOP;
        if (int_sel)
                model_event_interrupt(e->m, e->ctx, p[7], PM4_EOP_VALID_IDS);
        return STEP_DONE;
}

static int pm4_indirect(ModelEngine *e, const ModelSrc *s, const uint32_t *p)
{
        bool chain = (p[3] >> 20) & 1;

        /* compute queues run one level of IBs; an IB may only chain to the next */
        if (s->ib && !chain)
                return STEP_STOP;
        e->q->ib_base = model_addr64(p[1] & ~3u, p[2] & 0xffff);
        e->q->ib_dwords = p[3] & 0xfffff;
        e->q->ib_pos = 0;
        return STEP_ENTER_IB;
}

/* Runs the packet at the source's position; @h holds its first PM4_MAX_FIXED dwords (zero past what is
 * available), *len gets its length in dwords. */
static int pm4_step(ModelEngine *e, const ModelSrc *s, const uint32_t *h, uint32_t *len)
{
        unsigned int type = PM4_TYPE(h[0]), op = PM4_OPCODE(h[0]);

        switch (type) {
        case 2: /* filler */
                *len = 1;
                return STEP_DONE;
        case 0: /* register writes: registers are not modelled */
                *len = PM4_COUNT(h[0]) + 2;
                return *len > s->avail ? STEP_SHORT : STEP_DONE;
        case 1: /* reserved: a bad opcode halts the CP */
                return STEP_STOP;
        default:
                break;
        }
        if (op == PM4_NOP && PM4_COUNT(h[0]) == PM4_NOP_ONE_DWORD) {
                *len = 1;
                return STEP_DONE;
        }
        *len = PM4_COUNT(h[0]) + 2;
        if (*len > s->avail)
                return STEP_SHORT;
        switch (op) {
        case PM4_WRITE_DATA:
                return pm4_write_data(e, s, h, *len);
        case PM4_WAIT_REG_MEM:
                return *len < 7 ? STEP_STOP : pm4_wait_reg_mem(e, h);
        case PM4_RELEASE_MEM:
                return *len < 8 ? STEP_STOP : pm4_release_mem(e, h);
        case PM4_INDIRECT_BUFFER:
                return *len < PM4_IB_PACKET_DWORDS ? STEP_STOP : pm4_indirect(e, s, h);
        default:
                break;
        }
        /* NOP, ACQUIRE_MEM and EVENT_WRITE (caches and pipeline events: nothing to do in order), and every
         * packet the model does not run (state, dispatches), pass */
        return STEP_DONE;
}

/*
 * The ring and its pointers as KFD sets up a compute (PM4) queue on SOC15: the ring in dwords, the write
 * pointer a 64-bit dword count that only grows (taken modulo the ring), the read pointer the CP reports a
 * 32-bit dword offset into the ring, written back as it moves past each packet.
 */
static int pm4_start(ModelEngine *e, uint64_t *ret_ring_size, uint64_t *ret_wptr)
{
        ModelQueue *q = e->q;
        uint64_t ring_dwords = q->ring_size / 4;

        if (ring_dwords == 0 || model_queue_wptr(e, ret_wptr) < 0)
                return -EINVAL;
        *ret_wptr %= ring_dwords;
        q->hw_rptr %= ring_dwords;
        *ret_ring_size = ring_dwords * 4;
        return 0;
}

static uint64_t pm4_rptr(const ModelQueue *q)
{
        return q->hw_rptr * 4;
}

static uint64_t pm4_avail(const ModelQueue *q, uint64_t wptr)
{
        uint64_t ring_dwords = q->ring_size / 4;

        return (wptr + ring_dwords - q->hw_rptr) % ring_dwords;
}

static int pm4_advance(ModelEngine *e, uint64_t dwords)
{
        ModelQueue *q = e->q;

        q->hw_rptr = (q->hw_rptr + dwords) % (q->ring_size / 4);
        return model_vm_store32(e, q->rptr, (uint32_t)q->hw_rptr);
}

_Static_assert(PM4_MAX_FIXED <= MODEL_RING_HEAD_MAX, "a packet's head fits the ring walk's");

static const ModelRing pm4_ring = {
        .head_dwords = PM4_MAX_FIXED,
        .ib_packet_dwords = PM4_IB_PACKET_DWORDS,
        .start = pm4_start,
        .rptr = pm4_rptr,
        .avail = pm4_avail,
        .advance = pm4_advance,
        .step = pm4_step,
};

unsigned int model_pm4_run(ModelEngine *e)
{
        return model_ring_run(e, &pm4_ring);
}
