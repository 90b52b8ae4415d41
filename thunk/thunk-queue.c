/* The thunk's user-mode queues (CREATE/DESTROY/UPDATE_QUEUE), their doorbells, and KFD events. */
#include <errno.h>
#include <stdlib.h>
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

int thunk_event_create(ThunkContext *c, uint32_t type, bool auto_reset, const ThunkBo *page, uint32_t *ret_id)
{
        struct kfd_ioctl_create_event_args a = {.event_type = type, .auto_reset = auto_reset ? 1 : 0};
        int r;

        if (!c || !ret_id || (page && page->ctx != c))
                return -EINVAL;
        if (page)
                a.event_page_offset = page->info.handle; /* the BO's KFD handle names it */
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_CREATE_EVENT, &a);
        if (r == 0)
                *ret_id = a.event_id;
        return r;
}

int thunk_event_destroy(ThunkContext *c, uint32_t id)
{
        struct kfd_ioctl_destroy_event_args a = {.event_id = id};

        return c ? thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_DESTROY_EVENT, &a) : -EINVAL;
}

int thunk_event_set(ThunkContext *c, uint32_t id)
{
        struct kfd_ioctl_set_event_args a = {.event_id = id};

        return c ? thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_SET_EVENT, &a) : -EINVAL;
}

int thunk_event_reset(ThunkContext *c, uint32_t id)
{
        struct kfd_ioctl_reset_event_args a = {.event_id = id};

        return c ? thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_RESET_EVENT, &a) : -EINVAL;
}

int thunk_event_wait(ThunkContext *c, ThunkEventWait *ev, size_t n, bool all, uint32_t timeout_ms,
                     bool *ret_done)
{
        struct kfd_event_data small[8], *d = small;
        struct kfd_ioctl_wait_events_args a;
        int r;

        if (!c || !ev || !n || n > UINT32_MAX || !ret_done)
                return -EINVAL;
        if (n > sizeof(small) / sizeof(small[0]) && !(d = calloc(n, sizeof(*d))))
                return -ENOMEM;
        memset(d, 0, (n > 8 ? n : 8) * sizeof(*d));
        for (size_t i = 0; i < n; i++)
                d[i].event_id = ev[i].id;
        a = (struct kfd_ioctl_wait_events_args){.events_ptr = (uintptr_t)d,
                                                .num_events = (uint32_t)n,
                                                .wait_for_all = all ? 1 : 0,
                                                .timeout = timeout_ms};
        r = thunk_ioctl(c->dev, c->kfd_fd, AMDKFD_IOC_WAIT_EVENTS, &a);
        if (r == 0 && a.wait_result == KFD_IOC_WAIT_RESULT_FAIL)
                r = -EIO;
        if (r == 0) {
                *ret_done = a.wait_result == KFD_IOC_WAIT_RESULT_COMPLETE;
                for (size_t i = 0; i < n; i++) {
                        const struct kfd_hsa_memory_exception_data *m = &d[i].memory_exception_data;
                        /* only a memory event that fired carries a fault: a page or a reason */
                        ev[i].faulted = *ret_done && (m->va || m->gpu_id || m->failure.NotPresent ||
                                                      m->failure.ReadOnly || m->failure.NoExecute);
                        ev[i].gpu_id = m->gpu_id;
                        ev[i].va = m->va;
                        ev[i].not_present = m->failure.NotPresent != 0;
                        ev[i].read_only = m->failure.ReadOnly != 0;
                        ev[i].no_execute = m->failure.NoExecute != 0;
                }
        }
        if (d != small)
                free(d);
        return r;
}
