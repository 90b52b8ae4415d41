/* The thunk's user-mode queues (CREATE/DESTROY/UPDATE_QUEUE) and the context's interrupt hook. */
#include <errno.h>
#include <string.h>

#include "kfd-compat.h"
#include "model.h"
#include "thunk-private.h"

_Static_assert(THUNK_QUEUE_COMPUTE == KFD_IOC_QUEUE_TYPE_COMPUTE, "queue type");
_Static_assert(THUNK_QUEUE_SDMA == KFD_IOC_QUEUE_TYPE_SDMA, "queue type");
_Static_assert(THUNK_QUEUE_COMPUTE_AQL == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, "queue type");
_Static_assert(THUNK_QUEUE_SDMA_XGMI == KFD_IOC_QUEUE_TYPE_SDMA_XGMI, "queue type");

int thunk_queue_create(ThunkContext *c, const ThunkQueueArgs *q, uint32_t *ret_id,
                       uint64_t *ret_doorbell_offset)
{
        struct kfd_ioctl_create_queue_args a;
        int r;

        if (!c || !q || !ret_id || !ret_doorbell_offset)
                return -EINVAL;
        if (q->ring_size > UINT32_MAX || q->ctx_save_size > UINT32_MAX || q->ctl_stack_size > UINT32_MAX)
                return -EINVAL;
        if (!thunk_device_gpu_by_id(c->dev, q->gpu_id))
                return -ENODEV;
        memset(&a, 0, sizeof(a));
        a.gpu_id = q->gpu_id;
        a.queue_type = q->type;
        a.queue_percentage = q->percentage;
        a.queue_priority = q->priority;
        a.ring_base_address = q->ring_va;
        a.ring_size = (uint32_t)q->ring_size;
        a.read_pointer_address = q->rptr_va;
        a.write_pointer_address = q->wptr_va;
        a.eop_buffer_address = q->eop_va;
        a.eop_buffer_size = q->eop_size;
        a.ctx_save_restore_address = q->ctx_save_va;
        a.ctx_save_restore_size = (uint32_t)q->ctx_save_size;
        a.ctl_stack_size = (uint32_t)q->ctl_stack_size;
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_CREATE_QUEUE, &a);
        if (r < 0)
                return r;
        *ret_id = a.queue_id;
        *ret_doorbell_offset = a.doorbell_offset;
        return 0;
}

int thunk_queue_destroy(ThunkContext *c, uint32_t queue_id)
{
        struct kfd_ioctl_destroy_queue_args a = {.queue_id = queue_id};

        if (!c)
                return -EINVAL;
        return thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_DESTROY_QUEUE, &a);
}

int thunk_queue_update(ThunkContext *c, uint32_t queue_id, uint64_t ring_va, uint64_t ring_size,
                       uint32_t percentage, uint32_t priority)
{
        struct kfd_ioctl_update_queue_args a = {.ring_base_address = ring_va,
                                                .queue_id = queue_id,
                                                .ring_size = (uint32_t)ring_size,
                                                .queue_percentage = percentage,
                                                .queue_priority = priority};

        if (!c || ring_size > UINT32_MAX)
                return -EINVAL;
        return thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_UPDATE_QUEUE, &a);
}

int thunk_context_set_interrupt(ThunkContext *c, ThunkInterruptFn fn, void *arg)
{
        ThunkModel *m;

        if (!c)
                return -EINVAL;
        m = thunk_device_model(c->dev);
        if (!m)
                return -EOPNOTSUPP; /* the kernel delivers a context's interrupts only to its waits */
        return thunk_model_set_interrupt(m, c->kfd_fd, fn, arg);
}
