/* The AQL packet processor of the KFD model: barriers wait, dispatches retire unexecuted, all through the GPU
 * VM. */
#include <errno.h>
#include <string.h>

#include "model-engines.h"

/* AQL (HSA system architecture, hsa.h) packet and AMD signal (amd_hsa_signal.h) layouts: the parts the
 * command processor touches. */
#define AQL_PACKET_SIZE         64
#define AQL_TYPE_VENDOR         0
#define AQL_TYPE_INVALID        1
#define AQL_TYPE_KERNEL         2
#define AQL_TYPE_BARRIER_AND    3
#define AQL_TYPE_AGENT          4
#define AQL_TYPE_BARRIER_OR     5
#define AQL_DEP_SIGNALS         8 /* barrier packets: five dependency signals from byte 8 */
#define AQL_N_DEPS              5
#define AQL_KERNEL_OBJECT       32 /* kernel dispatch: the kernel descriptor's address */
#define AQL_KERNARG             40 /* kernel dispatch: the kernel arguments' address */
#define AQL_COMPLETION          56 /* every packet type: the completion signal */
#define AMD_VENDOR_FORMAT       2  /* vendor packets: AMD's format byte */
#define AMD_BARRIER_VALUE       2
#define AMD_BV_SIGNAL           8
#define AMD_BV_VALUE            16
#define AMD_BV_MASK             24
#define AMD_BV_COND             32
#define SIGNAL_VALUE            8 /* amd_signal_t: value, event mailbox address, event id */
#define SIGNAL_MAILBOX          16
#define SIGNAL_EVENT_ID         24
#define KD_SIZE                 64 /* the code object v3+ kernel descriptor (amdhsa kernel_descriptor_t) */
#define KD_KERNARG_SIZE         8
#define KD_ENTRY_OFFSET         16
#define AQL_INTERRUPT_VALID_IDS 32 /* the CP's end-of-pipe interrupt carries a whole event id */

static int signal_value(ModelEngine *e, uint64_t sig, int64_t *ret)
{
        uint64_t v = 0;
        int r = model_vm_load64(e, sig + SIGNAL_VALUE, &v);

        *ret = (int64_t)v;
        return r;
}

/* Completes @sig as the command processor does: decrement the value, then, if the signal has an event
 * mailbox, write the event id there and raise the interrupt. */
static int signal_complete(ModelEngine *e, uint64_t sig)
{
        uint64_t mailbox = 0, old;
        uint32_t id = 0;
        int r;

        if (!sig)
                return 0;
        r = model_vm_atomic(e, sig + SIGNAL_VALUE, 0x2f /* TC_OP_ATOMIC_ADD_RTN_64 */, (uint64_t)-1, 0, &old);
        if (r == 0)
                r = model_vm_load64(e, sig + SIGNAL_MAILBOX, &mailbox);
        if (r == 0 && mailbox)
                r = model_vm_load32(e, sig + SIGNAL_EVENT_ID, &id);
        if (r == 0 && mailbox)
                r = model_vm_store64(e, mailbox, id);
        if (r == 0 && mailbox)
                model_event_interrupt(e->m, e->ctx, id, AQL_INTERRUPT_VALID_IDS);
        return r;
}

static int barrier_value_met(ModelEngine *e, const uint8_t *pkt, bool *ret)
{
        uint64_t sig, want, mask;
        uint32_t cond;
        int64_t v;
        int r;

        memcpy(&sig, pkt + AMD_BV_SIGNAL, 8);
        memcpy(&want, pkt + AMD_BV_VALUE, 8);
        memcpy(&mask, pkt + AMD_BV_MASK, 8);
        memcpy(&cond, pkt + AMD_BV_COND, 4);
        if (!sig) {
                *ret = true;
                return 0;
        }
        r = signal_value(e, sig, &v);
        if (r < 0)
                return r;
        v &= (int64_t)mask;
        switch (cond) {
        case 0: /* equal */
                *ret = v == (int64_t)want;
                break;
        case 1: /* not equal */
                *ret = v != (int64_t)want;
                break;
        case 2: /* less than */
                *ret = v < (int64_t)want;
                break;
        default: /* greater or equal */
                *ret = v >= (int64_t)want;
                break;
        }
        return 0;
}

/* What the command processor and the shader would touch to start a kernel: its descriptor, the first
 * instruction, and its arguments. The kernel does not run, but an address it could not reach faults as
 * it would on the GPU. */
static int dispatch_check(ModelEngine *e, const uint8_t *pkt)
{
        uint64_t kobj, kernarg;
        uint8_t kd[KD_SIZE];
        uint32_t kernarg_size;
        int64_t entry;
        int r;

        memcpy(&kobj, pkt + AQL_KERNEL_OBJECT, 8);
        memcpy(&kernarg, pkt + AQL_KERNARG, 8);
        r = model_vm_read(e, kobj, kd, sizeof(kd));
        if (r < 0)
                return r;
        memcpy(&kernarg_size, kd + KD_KERNARG_SIZE, 4);
        memcpy(&entry, kd + KD_ENTRY_OFFSET, 8);
        r = model_vm_check(e, kobj + (uint64_t)entry, 4, MODEL_VM_READ);
        if (r == 0 && kernarg_size)
                r = model_vm_check(e, kernarg, kernarg_size, MODEL_VM_READ);
        return r;
}

/* May the packet retire now? Barriers wait for their dependencies; everything else retires at once,
 * since kernels are not executed. -EFAULT if something it names is out of the VM. */
static int packet_ready(ModelEngine *e, const uint8_t *pkt, uint8_t type, bool *ret)
{
        bool any = false, all = true, none = true;

        *ret = true;
        if (type == AQL_TYPE_VENDOR)
                return pkt[AMD_VENDOR_FORMAT] == AMD_BARRIER_VALUE ? barrier_value_met(e, pkt, ret) : 0;
        if (type == AQL_TYPE_KERNEL)
                return dispatch_check(e, pkt);
        if (type != AQL_TYPE_BARRIER_AND && type != AQL_TYPE_BARRIER_OR)
                return 0;
        for (int i = 0; i < AQL_N_DEPS; i++) {
                uint64_t dep;
                int64_t v;
                int r;

                memcpy(&dep, pkt + AQL_DEP_SIGNALS + 8 * i, 8);
                if (!dep)
                        continue;
                none = false;
                r = signal_value(e, dep, &v);
                if (r < 0)
                        return r;
                if (v == 0)
                        any = true;
                else
                        all = false;
        }
        *ret = type == AQL_TYPE_BARRIER_AND ? all : none || any;
        return 0;
}

unsigned int model_aql_run(ModelEngine *e)
{
        ModelQueue *q = e->q;
        uint64_t slots = q->ring_size / AQL_PACKET_SIZE, rd, wr;
        unsigned int done = 0;

        if (slots == 0 || model_vm_load64(e, q->rptr, &rd) < 0 || model_queue_wptr(e, &wr) < 0)
                return 0;
        while (rd < wr && done < slots && done < MODEL_ENGINE_PACKETS) {
                uint64_t at = q->ring_base + (rd % slots) * AQL_PACKET_SIZE, sig;
                uint8_t pkt[AQL_PACKET_SIZE], type;
                uint16_t hdr;
                bool ready;

                /* the producer publishes a packet by writing its header last */
                if (model_vm_read(e, at, pkt, sizeof(pkt)) < 0)
                        break;
                memcpy(&hdr, pkt, 2);
                type = (uint8_t)(hdr & 0xff);
                if (type == AQL_TYPE_INVALID)
                        break;
                if (packet_ready(e, pkt, type, &ready) < 0 || !ready)
                        break;
                memcpy(&sig, pkt + AQL_COMPLETION, 8);
                if (sig && model_vm_check(e, sig, 32, MODEL_VM_READ | MODEL_VM_WRITE) < 0)
                        break;
                hdr = (uint16_t)((hdr & ~0xffu) | AQL_TYPE_INVALID);
                if (model_vm_write(e, at, &hdr, 2) < 0)
                        break;
                rd++;
                if (model_vm_store64(e, q->rptr, rd) < 0 || signal_complete(e, sig) < 0)
                        break;
                done++;
        }
        q->busy = rd < wr; /* a barrier unmet, a packet not published yet, or the budget */
        return done;
}
