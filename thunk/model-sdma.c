/* The SDMA engines of the KFD model: SDMA v4 (gfx9) packets from a user-mode ring, every address through the
 * GPU VM. */
#include <errno.h>
#include <string.h>

#include "model-engines.h"

/* Opcodes and field positions: the kernel's vega10_sdma_pkt_open.h and ROCr's sdma_registers.h. */
#define SDMA_OP_NOP              0
#define SDMA_OP_COPY             1
#define SDMA_OP_WRITE            2
#define SDMA_OP_INDIRECT         4
#define SDMA_OP_FENCE            5
#define SDMA_OP_TRAP             6
#define SDMA_OP_POLL_REGMEM      8
#define SDMA_OP_ATOMIC           10
#define SDMA_OP_CONST_FILL       11
#define SDMA_OP_TIMESTAMP        13
#define SDMA_SUBOP_COPY_LINEAR   0
#define SDMA_SUBOP_COPY_SUBWIN   4 /* LINEAR_SUB_WIND */
#define SDMA_SUBOP_WRITE_LINEAR  0
#define SDMA_SUBOP_TS_SET        0
#define SDMA_SUBOP_TS_GET        1
#define SDMA_SUBOP_TS_GET_GLOBAL 2

#define SDMA_TRAP_VALID_IDS  28    /* the trap interrupt carries 28 bits of context */
#define SDMA_POLL_FOREVER    0xfff /* a POLL_REGMEM retry count that never gives up */
#define SDMA_IB_PACKET_BYTES 24
#define SDMA_MAX_FIXED       8 /* dwords of the longest fixed-size packet the model runs (ATOMIC) */
#define SDMA_WRITE_CHUNK     256
#define SDMA_SUBWIN_DWORDS   13
#define SDMA_SUBWIN_MAX_ELEM 4    /* elements of 1 to 16 bytes; larger sizes are not defined */
#define SDMA_SUBWIN_ROW_COST 1024 /* budget a row costs at least: its translation, whatever its bytes */

#define TC_OP_CMPSWAP_MASK 0x1f
#define TC_OP_CMPSWAP      0x08

/* WRITE linear: count + 1 dwords of data follow the four header dwords, and may be many. */
static int sdma_write(ModelEngine *e, const ModelSrc *s, const uint32_t *p, uint32_t *len)
{
        uint64_t dst = model_addr64(p[1] & ~3u, p[2]), ndw = (uint64_t)(p[3] & 0xfffff) + 1;
        uint32_t buf[SDMA_WRITE_CHUNK];

        if (4 + ndw > s->avail)
                return STEP_SHORT;
        *len = (uint32_t)(4 + ndw);
        if (model_vm_check(e, dst, ndw * 4, MODEL_VM_WRITE) < 0)
                return STEP_STOP;
        for (uint64_t i = 0; i < ndw;) {
                uint64_t n = ndw - i < SDMA_WRITE_CHUNK ? ndw - i : SDMA_WRITE_CHUNK;

                if (model_src_read(e, s, 4 + i, buf, n) < 0 || model_vm_write(e, dst + i * 4, buf, n * 4) < 0)
                        return STEP_STOP;
                i += n;
        }
        e->budget = e->budget > ndw * 4 ? e->budget - ndw * 4 : 0;
        return STEP_DONE;
}

/* One side of a sub-window copy: the surface's base, the window's start in elements, and the pitches. */
typedef struct SubwinSide {
        uint64_t base;
        uint64_t x, y, z;
        uint64_t pitch; /* elements per row */
        uint64_t slice; /* elements per slice */
} SubwinSide;

/* DW_3..5 (source) or DW_8..10 (destination) after the address: x and y of 14 bits, z of 11, the pitch
 * minus one in bits 31:13 (19 bits), the slice pitch minus one in 28 bits. */
static SubwinSide subwin_side(const uint32_t *p)
{
        return (SubwinSide){.base = model_addr64(p[0], p[1]),
                            .x = p[2] & 0x3fff,
                            .y = (p[2] >> 16) & 0x3fff,
                            .z = p[3] & 0x7ff,
                            .pitch = (uint64_t)(p[3] >> 13) + 1,
                            .slice = (uint64_t)(p[4] & 0xfffffff) + 1};
}

/* The GPU VA of row @y of slice @z of the window, or -EFAULT (recorded) if it lies past the end of the
 * address space. The element offset is below 2^41 and fits once shifted by up to 4. */
static int subwin_row(ModelEngine *e, const SubwinSide *sd, unsigned int shift, uint64_t y, uint64_t z,
                      uint64_t *ret)
{
        uint64_t off = (sd->x + (sd->y + y) * sd->pitch + (sd->z + z) * sd->slice) << shift;

        if (off > UINT64_MAX - sd->base)
                return model_vm_fault(e, 0, true, false, false);
        *ret = sd->base + off;
        return 0;
}

/*
 * COPY LINEAR_SUB_WIND: RECT_X + 1 elements of 2^ELEMENTSIZE bytes per row, RECT_Y + 1 rows, RECT_Z + 1
 * slices, from the source window to the destination window; element (x, y, z) of a window lies at
 * base + ((X + x) + (Y + y) * pitch + (Z + z) * slice_pitch) * element size. Each row is a linear copy
 * through the VM, checked whole before it moves. Up to 2^25 rows: the work is cut into runs by the
 * engine's budget, the rows done kept with the queue, so the packet retires in a later run.
 */
static int sdma_subwin(ModelEngine *e, const ModelSrc *s, const uint32_t *h, uint32_t *len, uint64_t at)
{
        uint32_t p[SDMA_SUBWIN_DWORDS];
        unsigned int shift = (h[0] >> 29) & 7;
        SubwinSide src, dst;
        uint64_t width, rows, ry, row, cost;
        ModelQueue *q = e->q;

        *len = SDMA_SUBWIN_DWORDS;
        if (s->avail < SDMA_SUBWIN_DWORDS)
                return STEP_SHORT;
        if (shift > SDMA_SUBWIN_MAX_ELEM)
                return STEP_STOP;
        if (model_src_read(e, s, 0, p, SDMA_SUBWIN_DWORDS) < 0)
                return STEP_STOP;
        src = subwin_side(&p[1]);
        dst = subwin_side(&p[6]);
        width = (uint64_t)((p[11] & 0x3fff) + 1) << shift;
        ry = ((p[11] >> 16) & 0x3fff) + 1;
        rows = ry * ((p[12] & 0x7ff) + 1);
        cost = width > SDMA_SUBWIN_ROW_COST ? width : SDMA_SUBWIN_ROW_COST;
        /* the rows an earlier run did of this packet */
        row = q->part_at == at && q->part_rows < rows ? q->part_rows : 0;
        q->part_rows = 0;
        for (uint64_t first = row; row < rows; row++) {
                uint64_t sva = 0, dva = 0; /* set by subwin_row, which GCC at -O2 cannot see */

                if (row > first && e->budget == 0) {
                        q->part_at = at;
                        q->part_rows = (uint32_t)row;
                        return STEP_WAIT;
                }
                if (subwin_row(e, &src, shift, row % ry, row / ry, &sva) < 0 ||
                    subwin_row(e, &dst, shift, row % ry, row / ry, &dva) < 0 ||
                    model_vm_copy(e, dva, sva, width) < 0)
                        return STEP_STOP;
                e->budget = e->budget > cost ? e->budget - cost : 0;
        }
        return STEP_DONE;
}

static int sdma_poll(ModelEngine *e, const uint32_t *p)
{
        unsigned int func = (p[0] >> 28) & 7, retry = (p[5] >> 16) & 0xfff;
        bool mem = (p[0] >> 31) & 1;
        uint32_t v;

        /* a register poll (the HDP flush handshake among them): registers are not modelled and every
         * compare on them holds */
        if (!mem)
                return STEP_DONE;
        if (model_vm_load32(e, model_addr64(p[1] & ~3u, p[2]), &v) < 0)
                return STEP_STOP;
        if (model_poll_met(func, v, p[4], p[3])) {
                e->q->poll_tries = 0;
                return STEP_DONE;
        }
        /* a finite retry count gives up and moves on (the poll-timeout interrupt KFD does not forward) */
        if (retry != SDMA_POLL_FOREVER && ++e->q->poll_tries > retry) {
                e->q->poll_tries = 0;
                return STEP_DONE;
        }
        return STEP_WAIT;
}

static int sdma_atomic(ModelEngine *e, const uint32_t *p)
{
        unsigned int op = (p[0] >> 25) & 0x7f;
        bool loop = (p[0] >> 16) & 1, wide = (op & 0x20) != 0;
        uint64_t cmp = model_addr64(p[5], p[6]), old = 0;
        int r = model_vm_atomic(e, model_addr64(p[1], p[2]), op, model_addr64(p[3], p[4]), cmp, &old);

        if (r < 0)
                return STEP_STOP; /* a fault, or an operation the engine does not have */
        /* "loop": a compare-and-swap that failed is tried again until it succeeds */
        if (loop && (op & TC_OP_CMPSWAP_MASK) == TC_OP_CMPSWAP && old != (wide ? cmp : (uint32_t)cmp))
                return STEP_WAIT;
        return STEP_DONE;
}

static int sdma_fill(ModelEngine *e, const uint32_t *p)
{
        /* FILLSIZE selects elements of 1, 2 or 4 bytes of the data dword (3 is taken as 4); COUNT is the
         * byte count minus one, so (count >> log2(size)) + 1 elements, which is what both ROCr's
         * (dwords - 1) * 4 and amdgpu's bytes - 1 encodings mean */
        unsigned int shift = (p[0] >> 30) & 3;
        uint32_t count = p[4] & 0x3fffff;
        uint64_t n;

        if (shift > 2)
                shift = 2;
        n = (uint64_t)(count >> shift) + 1;
        if (model_vm_fill(e, model_addr64(p[1], p[2]), p[3], 1u << shift, n) < 0)
                return STEP_STOP;
        e->budget = e->budget > (n << shift) ? e->budget - (n << shift) : 0;
        return STEP_DONE;
}

/* The length of the fixed-size packet @op/@sub in dwords, 0 if the engine does not run it. */
static uint32_t sdma_fixed_len(unsigned int op, unsigned int sub)
{
        switch (op) {
        case SDMA_OP_COPY:
                return sub == SDMA_SUBOP_COPY_LINEAR ? 7 : 0;
        case SDMA_OP_INDIRECT:
                return 6;
        case SDMA_OP_FENCE:
                return 4;
        case SDMA_OP_TRAP:
                return 2;
        case SDMA_OP_POLL_REGMEM:
                return 6;
        case SDMA_OP_ATOMIC:
                return 8;
        case SDMA_OP_CONST_FILL:
                return 5;
        case SDMA_OP_TIMESTAMP:
                return sub <= SDMA_SUBOP_TS_GET_GLOBAL ? 3 : 0;
        default:
                return 0;
        }
}

/* Runs the packet at the source's position. @h holds its first dwords (as many as are available, up to
 * SDMA_MAX_FIXED); *len gets its length in dwords when it completes. */
static int sdma_step(ModelEngine *e, const ModelSrc *s, const uint32_t *h, uint32_t *len)
{
        unsigned int op = h[0] & 0xff, sub = (h[0] >> 8) & 0xff;
        uint32_t p[SDMA_MAX_FIXED];
        uint64_t bytes;

        if (op == SDMA_OP_NOP) {
                /* COUNT more dwords belong to it; ROCr pads with runs of zero dwords, taken together */
                uint32_t n = 1 + ((h[0] >> 16) & 0x3fff);

                if (n > s->avail)
                        return STEP_SHORT;
                if (n == 1)
                        while (n < s->avail && n < SDMA_MAX_FIXED && h[n] == 0)
                                n++;
                *len = n;
                return STEP_DONE;
        }
        if (op == SDMA_OP_COPY && sub == SDMA_SUBOP_COPY_SUBWIN)
                return sdma_subwin(e, s, h, len, s->ib ? s->base + s->pos * 4 : s->pos);
        if (op == SDMA_OP_WRITE && sub == SDMA_SUBOP_WRITE_LINEAR) {
                if (s->avail < 4)
                        return STEP_SHORT;
                return sdma_write(e, s, h, len);
        }
        *len = sdma_fixed_len(op, sub);
        if (*len == 0)
                return STEP_STOP; /* an illegal packet stops the queue, and the process hears of it */
        if (*len > s->avail)
                return STEP_SHORT;
        memcpy(p, h, *len * 4);
        switch (op) {
        case SDMA_OP_COPY:
                bytes = (uint64_t)(p[1] & 0x3fffff) + 1;
                if (model_vm_copy(e, model_addr64(p[5], p[6]), model_addr64(p[3], p[4]), bytes) < 0)
                        return STEP_STOP;
                e->budget = e->budget > bytes ? e->budget - bytes : 0;
                return STEP_DONE;
        case SDMA_OP_INDIRECT:
                /* an IB may not hold another one */
                if (s->ib)
                        return STEP_STOP;
                e->q->ib_base = model_addr64(p[1] & ~0x1fu, p[2]);
                e->q->ib_dwords = p[3] & 0xfffff;
                e->q->ib_pos = 0;
                return STEP_ENTER_IB;
        case SDMA_OP_FENCE:
                return model_vm_store32(e, model_addr64(p[1] & ~3u, p[2]), p[3]) < 0 ? STEP_STOP : STEP_DONE;
        case SDMA_OP_TRAP:
                model_event_interrupt(e->m, e->ctx, p[1] & 0x0fffffff, SDMA_TRAP_VALID_IDS);
                return STEP_DONE;
        case SDMA_OP_POLL_REGMEM:
                return sdma_poll(e, p);
        case SDMA_OP_ATOMIC:
                return sdma_atomic(e, p);
        case SDMA_OP_CONST_FILL:
                return sdma_fill(e, p);
        case SDMA_OP_TIMESTAMP:
                /* the local and the global timestamp are both the GPU's reference clock; SET is ignored */
                if (sub == SDMA_SUBOP_TS_SET)
                        return STEP_DONE;
                return model_vm_store64(e, model_addr64(p[1], p[2]), model_gpu_clock()) < 0 ? STEP_STOP
                                                                                            : STEP_DONE;
        default:
                return STEP_STOP;
        }
}

/*
 * The ring and its pointers as KFD sets up an SDMA queue on SOC15: the ring in dwords, the read and write
 * pointers 64-bit byte offsets that only grow (the engine wraps them into the ring), the read pointer
 * written back as the engine moves past each packet. ROCr (BlitSdma<uint64_t, true, -1>) and libhsakmt
 * users rely on exactly that.
 */
static int sdma_start(ModelEngine *e, uint64_t *ret_ring_size, uint64_t *ret_wptr)
{
        if (e->q->ring_size < 4 || model_queue_wptr(e, ret_wptr) < 0)
                return -EINVAL;
        *ret_ring_size = e->q->ring_size;
        return 0;
}

static uint64_t sdma_rptr(const ModelQueue *q)
{
        return q->hw_rptr;
}

static uint64_t sdma_avail(const ModelQueue *q, uint64_t wptr)
{
        return (wptr - q->hw_rptr) / 4;
}

static int sdma_advance(ModelEngine *e, uint64_t dwords)
{
        e->q->hw_rptr += dwords * 4;
        return model_vm_store64(e, e->q->rptr, e->q->hw_rptr);
}

_Static_assert(SDMA_MAX_FIXED <= MODEL_RING_HEAD_MAX, "a packet's head fits the ring walk's");

static const ModelRing sdma_ring = {
        .head_dwords = SDMA_MAX_FIXED,
        .ib_packet_dwords = SDMA_IB_PACKET_BYTES / 4,
        .start = sdma_start,
        .rptr = sdma_rptr,
        .avail = sdma_avail,
        .advance = sdma_advance,
        .step = sdma_step,
};

unsigned int model_sdma_run(ModelEngine *e)
{
        return model_ring_run(e, &sdma_ring);
}
