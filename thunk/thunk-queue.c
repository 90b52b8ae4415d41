/* The thunk's user-mode queues (CREATE/DESTROY/UPDATE_QUEUE) and the context's interrupt hook. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

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

/* A process's doorbell slice on a SOC15 GPU: 1024 queues x 8-byte doorbells (kfd_doorbell_process_slice) */
#define THUNK_DOORBELL_SLICE 8192ULL

int thunk_queue_doorbell(ThunkContext *c, uint32_t gpu_id, uint64_t doorbell_offset, volatile uint64_t **ret)
{
        const ThunkNode *n;
        int i, r = 0;

        if (!c || !ret)
                return -EINVAL;
        i = thunk_gpu_index(c->dev, gpu_id);
        n = i < 0 ? NULL : thunk_topology_gpu_by_index(c->dev->topo, (size_t)i);
        if (!n)
                return -ENODEV;
        if (n->gfx_target_version < 90000)
                return -EOPNOTSUPP; /* 32-bit doorbells, placed by queue id */
        pthread_mutex_lock(&c->lock);
        if (!c->doorbells[i]) {
                void *p = NULL;

                r = c->dev->seam.ops->mmap(c->dev->seam.impl, NULL, THUNK_DOORBELL_SLICE,
                                           PROT_READ | PROT_WRITE, MAP_SHARED, c->kfd_fd,
                                           doorbell_offset & ~(THUNK_DOORBELL_SLICE - 1), &p);
                if (r == 0)
                        c->doorbells[i] = p;
        }
        if (r == 0)
                *ret = (volatile uint64_t *)((char *)c->doorbells[i] +
                                             (doorbell_offset & (THUNK_DOORBELL_SLICE - 1) & ~7ULL));
        pthread_mutex_unlock(&c->lock);
        return r;
}

void thunk_context_unmap_doorbells(ThunkContext *c)
{
        for (size_t i = 0; c->doorbells && i < c->dev->n_gpus; i++) {
                if (c->doorbells[i])
                        munmap(c->doorbells[i], THUNK_DOORBELL_SLICE);
                c->doorbells[i] = NULL;
        }
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
