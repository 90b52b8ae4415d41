/* The walk over a user-mode ring and its indirect buffers that the KFD model's SDMA and PM4 engines share. */
#include "model-engines.h"

int model_src_read(ModelEngine *e, const ModelSrc *s, uint64_t idx, uint32_t *out, uint64_t n)
{
        uint64_t off, first;
        int r;

        if (s->ib)
                return model_vm_read(e, s->base + (s->pos + idx) * 4, out, n * 4);
        off = (s->pos + idx * 4) % s->ring_size;
        first = s->ring_size - off;
        if (first >= n * 4)
                return model_vm_read(e, s->base + off, out, n * 4);
        /* the packet wraps around the end of the ring */
        r = model_vm_read(e, s->base + off, out, first);
        return r < 0 ? r : model_vm_read(e, s->base, (uint8_t *)out + first, n * 4 - first);
}

/* The GPU VA of the packet at @s's position. */
static uint64_t packet_va(const ModelSrc *s)
{
        return s->ib ? s->base + s->pos * 4 : s->base + s->pos % s->ring_size;
}

unsigned int model_ring_run(ModelEngine *e, const ModelRing *ring)
{
        ModelQueue *q = e->q;
        uint64_t ring_size, wptr;
        unsigned int done = 0;

        q->busy = false;
        if (ring->start(e, &ring_size, &wptr) < 0)
                return 0;
        while (done < MODEL_ENGINE_PACKETS && e->budget) {
                ModelSrc s = {.ring_size = ring_size};
                uint32_t h[MODEL_RING_HEAD_MAX] = {0}, len = 0;
                int step;

                if (q->in_ib) {
                        s.ib = true;
                        s.base = q->ib_base;
                        s.pos = q->ib_pos;
                        s.avail = q->ib_dwords - q->ib_pos;
                        if (s.avail == 0) {
                                /* the IB is done: so is the packet in the ring that named it */
                                q->in_ib = false;
                                if (ring->advance(e, ring->ib_packet_dwords) < 0)
                                        break;
                                done++;
                                continue;
                        }
                } else {
                        s.base = q->ring_base;
                        s.pos = ring->rptr(q);
                        s.avail = ring->avail(q, wptr);
                        if (s.avail == 0)
                                break;
                }
                if (model_src_read(e, &s, 0, h, s.avail < ring->head_dwords ? s.avail : ring->head_dwords) <
                    0)
                        break;
                step = ring->step(e, &s, h, &len);
                /* the rest of a packet may still come to the ring, never to an IB */
                if (step == STEP_SHORT)
                        step = s.ib ? STEP_STOP : STEP_WAIT;
                if (step == STEP_WAIT)
                        break;
                if (step == STEP_STOP) {
                        /* a packet the engine cannot run (not a fault of its own): the process must hear of
                         * it, or whoever waits for the queue waits for ever */
                        if (!e->faulted)
                                model_vm_fault(e, packet_va(&s), false, false, false);
                        q->stopped = true;
                        break;
                }
                if (step == STEP_ENTER_IB) {
                        /* a chained IB replaces the one running; the ring moves on when the last ends. It
                         * counts as a packet: IBs chained in a loop run forever, a run at a time */
                        q->in_ib = true;
                        done++;
                        continue;
                }
                if (q->in_ib)
                        q->ib_pos += len;
                else if (ring->advance(e, len) < 0)
                        break;
                done++;
        }
        /* work left: an IB, or ring packets past the read pointer (a poll, the budget, a packet not all
         * there yet); a stopped queue has none */
        q->busy = !q->stopped && (q->in_ib || ring->avail(q, wptr) != 0);
        return done;
}
