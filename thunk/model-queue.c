/* The software KFD: events, user-mode queues, the thread that runs their engines, the small per-process
 * ioctls. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "macro.h"
#include "model-clock.h"
#include "model-engines.h"

#define MODEL_ENOTSUPP            524 /* the kernel's internal ENOTSUPP, which reaches user space as is */
#define MODEL_MAX_QUEUES          1024
#define MODEL_MAX_QUEUE_PERCENT   100
#define MODEL_MAX_QUEUE_PRIORITY  15
#define MODEL_USER_END            0x00007FFFFFFFF000ULL /* TASK_SIZE on x86-64: the end of access_ok() */
#define MODEL_EVENT_PAGE_SIZE     (KFD_SIGNAL_EVENT_LIMIT * 8ULL)
#define MODEL_SLOT_UNSIGNALED     (~0ULL)
#define MODEL_FIRST_NONSIGNAL_ID  0x40000000u /* (INT_MAX >> 1) + 1 */
#define MODEL_LAST_NONSIGNAL_ID   0x7fffffffu
#define MODEL_TIMEOUT_INFINITE    0xffffffffu
#define MODEL_GB_ADDR_CONFIG_GFX9 0x2a114042u /* gfx9 golden value: 256-byte pipe interleave */

static bool user_range_ok(uint64_t addr, uint64_t size)
{
        return addr <= MODEL_USER_END && size <= MODEL_USER_END - addr;
}

static uint64_t now_ns(clockid_t id)
{
        struct timespec ts;

        clock_gettime(id, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* @ns from now on clock @id, as a condition variable's wait takes its deadline. */
static struct timespec deadline_after(clockid_t id, uint64_t ns)
{
        uint64_t t = now_ns(id) + ns;

        return (struct timespec){.tv_sec = (time_t)(t / 1000000000ULL), .tv_nsec = (long)(t % 1000000000ULL)};
}

/* ------------------------------------------------------------------ device memory (doorbells, events) */

/* Space in the device memfd, which the kfd fds are duplicates of: real shared pages behind the doorbell
 * and event offsets. Sparse: nothing is allocated until it is touched. */
static int dev_alloc(ThunkModel *m, uint64_t size, uint64_t *ret_off)
{
        uint64_t off = m->dev_size;

        if (ftruncate(m->anchor, (off_t)(off + size)) < 0)
                return -errno;
        m->dev_size = off + size;
        *ret_off = off;
        return 0;
}

static void dev_release(ThunkModel *m, uint64_t off, uint64_t size)
{
        /* give the pages back; the range itself is never reused */
        (void)fallocate(m->anchor, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)size);
}

static int ctx_doorbell(ThunkModel *m, ModelCtx *c, int g, uint64_t *ret_off)
{
        ModelPdd *pdd = &c->pdd[g];
        uint64_t off = 0;
        int r;

        if (!pdd->doorbell_off) {
                r = dev_alloc(m, MODEL_DOORBELL_SLICE, &off);
                if (r < 0)
                        return r;
                if (m->doorbells) {
                        /* what the engines read: the pages the process's doorbell mappings write */
                        void *p = mmap(NULL, MODEL_DOORBELL_SLICE, PROT_READ | PROT_WRITE, MAP_SHARED,
                                       m->anchor, (off_t)off);
                        if (p == MAP_FAILED) {
                                r = -errno;
                                dev_release(m, off, MODEL_DOORBELL_SLICE);
                                return r;
                        }
                        pdd->doorbells = p;
                }
                pdd->doorbell_off = off + 1;
        }
        *ret_off = pdd->doorbell_off - 1;
        return 0;
}

int model_queue_wptr(ModelEngine *e, uint64_t *ret)
{
        const ModelQueue *q = e->q;
        const volatile uint64_t *db = e->ctx->pdd[q->gpu].doorbells;
        uint64_t v;

        if (!e->m->doorbells)
                return model_vm_load64(e, q->wptr, ret);
        if (!db) {
                *ret = 0;
                return 0;
        }
        v = __atomic_load_n(&db[q->db_slot], __ATOMIC_ACQUIRE);
        /* an AQL doorbell holds the id of the last packet written: unrung (UINT64_MAX) is nothing */
        *ret = q->type == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL ? v + 1 : v;
        return 0;
}

/* ------------------------------------------------------------------ events */

static ModelEvent *event_find(ModelCtx *c, uint32_t id)
{
        return ARRAY_FIND(c->events, c->n_events, id, id);
}

static bool is_signal_type(uint32_t type)
{
        return type == KFD_IOC_EVENT_SIGNAL || type == KFD_IOC_EVENT_DEBUG_EVENT;
}

static void event_page_release(ThunkModel *m, ModelCtx *c)
{
        ModelEventPage *p = &c->evpage;

        if (p->slots && p->unmap)
                munmap(p->slots, p->size);
        if (p->slots && !p->handle)
                dev_release(m, p->dev_off, p->size);
        memset(p, 0, sizeof(*p));
}

/* The signal page from a user BO named by @handle (what libhsakmt does on dGPUs). */
static int event_page_from_bo(Call *c, uint64_t handle)
{
        ModelCtx *ctx = c->ctx;
        int g = model_gpu_index(c->m, THUNK_KFD_HANDLE_GPU(handle));
        ModelMem *mem;
        void *p;

        if (g < 0 || !ctx->pdd[g].file)
                return -EINVAL;
        mem = model_idr_find(&ctx->pdd[g], THUNK_KFD_HANDLE_IDR(handle));
        if (!mem)
                return -EINVAL;
        if (mem->buf->type != KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                int r = model_buf_mmap(mem->buf, NULL, mem->buf->size, PROT_READ | PROT_WRITE, MAP_SHARED,
                                       &p);

                if (r < 0)
                        return r;
                ctx->evpage.unmap = true;
        } else if (mem->buf->userptr) {
                /* the GPU reaches a userptr BO's pages at their CPU address: so does the model */
                p = (void *)(uintptr_t)mem->buf->userptr;
                ctx->evpage.unmap = false;
        } else {
                return -EINVAL;
        }
        ctx->evpage.slots = p;
        ctx->evpage.size = mem->buf->size;
        ctx->evpage.handle = handle;
        return 0;
}

/* The signal page the driver allocates itself when user space gives none (mapped through the kfd fd). */
static int event_page_alloc(ThunkModel *m, ModelCtx *ctx)
{
        uint64_t off = 0;
        void *p;
        int r = dev_alloc(m, MODEL_EVENT_PAGE_SIZE, &off);

        if (r < 0)
                return r;
        p = mmap(NULL, MODEL_EVENT_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, m->anchor, (off_t)off);
        if (p == MAP_FAILED) {
                r = -errno;
                dev_release(m, off, MODEL_EVENT_PAGE_SIZE);
                return r;
        }
        memset(p, 0xff, MODEL_EVENT_PAGE_SIZE);
        ctx->evpage.slots = p;
        ctx->evpage.size = MODEL_EVENT_PAGE_SIZE;
        ctx->evpage.unmap = true;
        ctx->evpage.dev_off = off;
        ctx->evpage.handle = 0;
        return 0;
}

bool model_is_event_page(const ModelCtx *c, uint64_t handle)
{
        return c->evpage.slots && c->evpage.handle == handle;
}

static uint32_t event_new_id(ModelCtx *c, bool signal, uint32_t limit, int *err)
{
        uint32_t first = signal ? 0 : MODEL_FIRST_NONSIGNAL_ID;
        uint32_t last = signal ? limit - 1 : MODEL_LAST_NONSIGNAL_ID;

        for (uint32_t id = first; id <= last && id >= first; id++)
                if (!event_find(c, id))
                        return id;
        *err = -ENOSPC;
        return 0;
}

int model_kfd_create_event(Call *c)
{
        struct kfd_ioctl_create_event_args *a = c->arg;
        ModelCtx *ctx = c->ctx;
        bool signal = is_signal_type(a->event_type);
        bool page_new = false;
        uint32_t id, limit = 0;
        int r = 0;

        if (a->event_page_offset) {
                if (ctx->evpage.slots)
                        return -EINVAL;
                r = event_page_from_bo(c, a->event_page_offset);
                if (r < 0)
                        return r;
                page_new = true;
        }
        if (signal && !ctx->evpage.slots) {
                r = event_page_alloc(c->m, ctx);
                if (r < 0)
                        return r;
                page_new = true;
        }
        if (signal) {
                limit = (uint32_t)(ctx->evpage.size / 8);
                if (limit > KFD_SIGNAL_EVENT_LIMIT)
                        limit = KFD_SIGNAL_EVENT_LIMIT;
        }
        id = event_new_id(ctx, signal, limit, &r);
        if (r == 0 && ARRAY_RESERVE(ctx->events, ctx->cap_events, ctx->n_events + 1, 8) < 0)
                r = -ENOMEM;
        if (r < 0) {
                if (page_new)
                        event_page_release(c->m, ctx);
                return r;
        }
        ctx->events[ctx->n_events++] = (ModelEvent){
                .id = id, .type = a->event_type, .auto_reset = a->auto_reset != 0, .signaled = false};
        if (signal) {
                __atomic_store_n(&ctx->evpage.slots[id], MODEL_SLOT_UNSIGNALED, __ATOMIC_RELEASE);
                a->event_page_offset = THUNK_KFD_MMAP_TYPE_EVENTS;
                a->event_slot_index = id;
        }
        a->event_id = id;
        a->event_trigger_data = id;
        return 0;
}

int model_kfd_destroy_event(Call *c)
{
        struct kfd_ioctl_destroy_event_args *a = c->arg;
        ModelCtx *ctx = c->ctx;
        ModelEvent *ev = event_find(ctx, a->event_id);

        if (!ev)
                return -EINVAL;
        *ev = ctx->events[--ctx->n_events];
        /* a waiter on the destroyed event must notice */
        model_events_changed(c->m);
        return 0;
}

static void event_set(ThunkModel *m, ModelEvent *ev)
{
        ev->signaled = true;
        model_events_changed(m);
}

int model_kfd_set_event(Call *c)
{
        struct kfd_ioctl_set_event_args *a = c->arg;
        ModelEvent *ev = event_find(c->ctx, a->event_id);

        if (!ev || ev->type != KFD_IOC_EVENT_SIGNAL)
                return -EINVAL;
        event_set(c->m, ev);
        return 0;
}

int model_kfd_reset_event(Call *c)
{
        struct kfd_ioctl_reset_event_args *a = c->arg;
        ModelEvent *ev = event_find(c->ctx, a->event_id);

        if (!ev)
                return -EINVAL;
        ev->signaled = false;
        return 0;
}

/* What the kernel does for an event an interrupt names (set_event_from_interrupt): only events the GPU
 * may signal, their slot re-armed. */
static void event_from_interrupt(ThunkModel *m, ModelCtx *ctx, ModelEvent *ev)
{
        if (!ev || !is_signal_type(ev->type))
                return;
        __atomic_store_n(&ctx->evpage.slots[ev->id], MODEL_SLOT_UNSIGNALED, __ATOMIC_RELEASE);
        event_set(m, ev);
}

static bool slot_signaled(const ModelCtx *ctx, uint32_t id)
{
        return id < ctx->evpage.size / 8 &&
               __atomic_load_n(&ctx->evpage.slots[id], __ATOMIC_ACQUIRE) != MODEL_SLOT_UNSIGNALED;
}

/*
 * An interrupt from the GPU (kfd_signal_event_interrupt): the engine wrote an event id into the event's
 * slot, then interrupted with @partial_id, of which @valid_bits are significant (32 from the CP's
 * end-of-pipe, 28 from an SDMA trap). With enough bits the id names the event directly; with fewer the
 * kernel tries every id that matches; when that finds nothing it sets every event whose slot is
 * signalled, which is how ROCr's SDMA traps (context 0) reach their events.
 */
void model_event_interrupt(ThunkModel *m, ModelCtx *ctx, uint32_t partial_id, unsigned int valid_bits)
{
        ModelEvent *ev = NULL;

        if (!ctx->evpage.slots)
                return;
        if (valid_bits > 31 || (1ULL << valid_bits) >= KFD_SIGNAL_EVENT_LIMIT) {
                if (slot_signaled(ctx, partial_id))
                        ev = event_find(ctx, partial_id);
        } else if (valid_bits) {
                for (uint64_t id = partial_id; id < KFD_SIGNAL_EVENT_LIMIT && !ev; id += 1ULL << valid_bits)
                        if (slot_signaled(ctx, (uint32_t)id))
                                ev = event_find(ctx, (uint32_t)id);
        }
        if (ev) {
                event_from_interrupt(m, ctx, ev);
                return;
        }
        for (size_t i = 0; i < ctx->n_events; i++)
                if (ctx->events[i].id < KFD_SIGNAL_EVENT_LIMIT && slot_signaled(ctx, ctx->events[i].id))
                        event_from_interrupt(m, ctx, &ctx->events[i]);
}

/*
 * A GPU VM fault (the kernel's VMC fault interrupt): kfd_dqm_evict_pasid() stops every queue of the
 * process and nothing restores them, and kfd_signal_vm_fault_event() hands the fault to every memory
 * event of the process: the page, NotPresent for an invalid page, ReadOnly for a write to a read-only one,
 * NoExecute for an instruction fetch from a non-executable one.
 */
void model_vm_fault_raise(ThunkModel *m, ModelCtx *ctx, int g, const ModelVmFault *f)
{
        ctx->vm_fault = true;
        for (size_t i = 0; i < ctx->n_queues; i++)
                ctx->queues[i].stopped = true;
        for (size_t i = 0; i < ctx->n_events; i++) {
                ModelEvent *ev = &ctx->events[i];

                if (ev->type != KFD_IOC_EVENT_MEMORY)
                        continue;
                memset(&ev->mem_exc, 0, sizeof(ev->mem_exc));
                ev->mem_exc.gpu_id = m->gpus[g].gpu_id;
                ev->mem_exc.va = f->va;
                ev->mem_exc.failure.NotPresent = f->not_present;
                ev->mem_exc.failure.ReadOnly = f->read_only;
                ev->mem_exc.failure.NoExecute = f->no_execute;
                ev->mem_exc.failure.imprecise = 0;
                ev->mem_exc.ErrorType = KFD_MEM_ERR_NO_RAS;
                event_set(m, ev);
        }
}

void model_events_changed(ThunkModel *m)
{
        pthread_mutex_lock(&m->event_mu);
        m->event_gen++;
        pthread_cond_broadcast(&m->event_cond);
        pthread_mutex_unlock(&m->event_mu);
}

/*
 * Sleeps until events change or @deadline (NULL: none) passes, which returns true. Called under @ctx's eng
 * lock and the model's lock; it sleeps without either, under event_mu alone (the engines must run @ctx's
 * queues meanwhile to signal it), and takes both again in their order.
 */
static bool events_wait(ThunkModel *m, ModelCtx *ctx, const struct timespec *deadline)
{
        uint64_t gen = m->event_gen;
        int w = 0;

        model_unlock(m);
        pthread_mutex_unlock(&ctx->eng);
        pthread_mutex_lock(&m->event_mu);
        while (m->event_gen == gen && w != ETIMEDOUT)
                w = deadline ? pthread_cond_timedwait(&m->event_cond, &m->event_mu, deadline)
                             : pthread_cond_wait(&m->event_cond, &m->event_mu);
        pthread_mutex_unlock(&m->event_mu);
        model_ctx_eng_lock(ctx);
        model_lock(m);
        return w == ETIMEDOUT;
}

/* -1: an event is gone; 1: the wait is satisfied; 0: keep waiting. */
static int wait_check(ModelCtx *ctx, const struct kfd_event_data *d, uint32_t n, bool all)
{
        uint32_t hits = 0;

        for (uint32_t i = 0; i < n; i++) {
                ModelEvent *ev = event_find(ctx, d[i].event_id);

                if (!ev)
                        return -1;
                if (ev->signaled)
                        hits++;
        }
        return all ? hits == n : hits > 0 || n == 0;
}

int model_kfd_wait_events(Call *c)
{
        struct kfd_ioctl_wait_events_args *a = c->arg;
        struct kfd_event_data *d = (struct kfd_event_data *)(uintptr_t)a->events_ptr;
        ThunkModel *m = c->m;
        ModelCtx *ctx = c->ctx;
        struct timespec deadline;
        bool all = a->wait_for_all != 0;
        int st, r = 0;

        if (a->num_events && !d)
                return -EFAULT;
        st = wait_check(ctx, d, a->num_events, all);
        if (st < 0)
                return -EINVAL;
        if (a->timeout != MODEL_TIMEOUT_INFINITE)
                deadline = deadline_after(CLOCK_MONOTONIC, (uint64_t)a->timeout * 1000000ULL);
        /* the context must outlive the wait even if its last fd is closed meanwhile */
        ctx->refs++;
        while (st == 0 && a->timeout != 0) {
                bool timed_out = events_wait(m, ctx, a->timeout == MODEL_TIMEOUT_INFINITE ? NULL : &deadline);

                st = wait_check(ctx, d, a->num_events, all);
                if (timed_out)
                        break;
        }
        if (st < 0) {
                r = -EINVAL;
        } else if (st == 0) {
                a->wait_result = KFD_IOC_WAIT_RESULT_TIMEOUT;
        } else {
                /* auto-reset events are consumed by the waiter they release; a memory event that released
                 * it hands over its fault (copy_signaled_event_data) */
                for (uint32_t i = 0; i < a->num_events; i++) {
                        ModelEvent *ev = event_find(ctx, d[i].event_id);

                        if (!ev || !ev->signaled)
                                continue;
                        if (ev->type == KFD_IOC_EVENT_MEMORY)
                                d[i].memory_exception_data = ev->mem_exc;
                        if (ev->auto_reset)
                                ev->signaled = false;
                }
                a->wait_result = KFD_IOC_WAIT_RESULT_COMPLETE;
        }
        /* if the last fd went while we waited, this finishes what its close began */
        model_ctx_unref(m, ctx);
        return r;
}

/* ------------------------------------------------------------------ queues */

static ModelQueue *queue_find(ModelCtx *c, uint32_t id)
{
        for (size_t i = 0; i < c->n_queues; i++)
                if (c->queues[i].id == id)
                        return &c->queues[i];
        return NULL;
}

static bool is_pow2_or_zero(uint64_t v)
{
        return (v & (v - 1)) == 0;
}

static void *cp_main(void *arg);

static int cp_start(ThunkModel *m)
{
        sigset_t all, old;
        int r;

        if (m->cp_running)
                return 0;
        /* the processor must never take the process's signals */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&m->cp_thread, NULL, cp_main, m);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0)
                return -r;
        /* named, so that its CPU time shows apart from its creator's in the process's threads */
        (void)pthread_setname_np(m->cp_thread, "kfd-model-cp");
        m->cp_running = true;
        __atomic_store_n(&m->cp_stop, false, __ATOMIC_RELAXED);
        return 0;
}

void model_cp_stop(ThunkModel *m)
{
        bool running;

        model_lock(m);
        running = m->cp_running;
        __atomic_store_n(&m->cp_stop, true, __ATOMIC_RELAXED); /* the engines look without the lock */
        pthread_cond_broadcast(&m->cp_cond);
        model_unlock(m);
        if (running)
                pthread_join(m->cp_thread, NULL);
        /* only the engines used the buffer views; they are the model's, under its lock like the rest */
        model_lock(m);
        m->cp_running = false;
        model_gpuvm_release(m);
        model_unlock(m);
}

/* What CREATE_QUEUE and UPDATE_QUEUE both take, checked as the kernel checks it (the percentage and
 * priority, then the ring). */
static int ring_props_check(uint32_t percentage, uint32_t priority, uint64_t ring_base, uint64_t ring_size)
{
        if (percentage > MODEL_MAX_QUEUE_PERCENT || priority > MODEL_MAX_QUEUE_PRIORITY)
                return -EINVAL;
        if (ring_base && !user_range_ok(ring_base, ring_size))
                return -EFAULT;
        if (!is_pow2_or_zero(ring_size))
                return -EINVAL;
        return 0;
}

int model_kfd_create_queue(Call *c)
{
        struct kfd_ioctl_create_queue_args *a = c->arg;
        ThunkModel *m = c->m;
        ModelCtx *ctx = c->ctx;
        uint64_t db;
        uint32_t id;
        int g, r;

        /* the kernel's order: queue properties first, then the device, then the slot */
        r = ring_props_check(a->queue_percentage, a->queue_priority, a->ring_base_address, a->ring_size);
        if (r < 0)
                return r;
        if (!user_range_ok(a->read_pointer_address, sizeof(uint64_t)) ||
            !user_range_ok(a->write_pointer_address, sizeof(uint64_t)))
                return -EFAULT;
        if (a->eop_buffer_address && !user_range_ok(a->eop_buffer_address, sizeof(uint32_t)))
                return -EFAULT;
        if (a->ctx_save_restore_address && !user_range_ok(a->ctx_save_restore_address, sizeof(uint32_t)))
                return -EFAULT;
        switch (a->queue_type) {
        case KFD_IOC_QUEUE_TYPE_COMPUTE:
        case KFD_IOC_QUEUE_TYPE_SDMA:
        case KFD_IOC_QUEUE_TYPE_COMPUTE_AQL:
        case KFD_IOC_QUEUE_TYPE_SDMA_XGMI:
                break;
        default:
                return -MODEL_ENOTSUPP;
        }
        g = model_gpu_index(m, a->gpu_id);
        if (g < 0)
                return -EINVAL;
        if (!ctx->pdd[g].file)
                return -ESRCH;
        for (id = 0; id < MODEL_MAX_QUEUES && queue_find(ctx, id); id++)
                ;
        if (id == MODEL_MAX_QUEUES)
                return -ENOMEM;
        if (ARRAY_RESERVE(ctx->queues, ctx->cap_queues, ctx->n_queues + 1, 8) < 0)
                return -ENOMEM;
        r = ctx_doorbell(m, ctx, g, &db);
        if (r < 0)
                return r;
        r = cp_start(m);
        if (r < 0)
                return r;
        ctx->queues[ctx->n_queues++] = (ModelQueue){.id = id,
                                                    .type = a->queue_type,
                                                    .gpu = g,
                                                    .ring_base = a->ring_base_address,
                                                    .ring_size = a->ring_size,
                                                    .rptr = a->read_pointer_address,
                                                    .wptr = a->write_pointer_address,
                                                    .percentage = a->queue_percentage,
                                                    .priority = a->queue_priority,
                                                    .db_slot = id,
                                                    /* after a VM fault the process's queues stay evicted */
                                                    .stopped = ctx->vm_fault};
        /* a new queue's doorbell is unrung: nothing written yet */
        if (ctx->pdd[g].doorbells)
                __atomic_store_n(&ctx->pdd[g].doorbells[id],
                                 a->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL ? UINT64_MAX : 0,
                                 __ATOMIC_RELEASE);
        MODEL_COUNT(m->n_queues, 1);
        pthread_cond_broadcast(&m->cp_cond);
        a->queue_id = id;
        /* SOC15 GPUs (gfx9 on) allocate doorbells per device: the byte offset inside the process's slice
         * travels in the low bits; older ones derive it from the queue id */
        a->doorbell_offset = THUNK_KFD_MMAP_TYPE_DOORBELL | THUNK_KFD_MMAP_GPU_ID(a->gpu_id);
        if (m->gpus[g].gfx_target_version >= 90000)
                a->doorbell_offset |= (uint64_t)id * sizeof(uint64_t);
        return 0;
}

static void queue_remove(ThunkModel *m, ModelCtx *ctx, ModelQueue *q)
{
        *q = ctx->queues[--ctx->n_queues];
        MODEL_COUNT(m->n_queues, -1);
}

int model_kfd_destroy_queue(Call *c)
{
        struct kfd_ioctl_destroy_queue_args *a = c->arg;
        ModelQueue *q = queue_find(c->ctx, a->queue_id);

        if (!q)
                return -EINVAL;
        queue_remove(c->m, c->ctx, q);
        return 0;
}

int model_kfd_update_queue(Call *c)
{
        struct kfd_ioctl_update_queue_args *a = c->arg;
        ModelQueue *q;
        int r = ring_props_check(a->queue_percentage, a->queue_priority, a->ring_base_address, a->ring_size);

        if (r < 0)
                return r;
        q = queue_find(c->ctx, a->queue_id);
        if (!q)
                return -EFAULT;
        q->ring_base = a->ring_base_address;
        q->ring_size = a->ring_size;
        q->percentage = a->queue_percentage;
        q->priority = a->queue_priority;
        /* a new ring may hold work: the engines look again even where they wait for doorbell kicks */
        pthread_cond_broadcast(&c->m->cp_cond);
        return 0;
}

void model_ctx_release_queues(ThunkModel *m, ModelCtx *c)
{
        while (c->n_queues)
                queue_remove(m, c, &c->queues[c->n_queues - 1]);
        free(c->queues);
        c->queues = NULL;
        c->cap_queues = 0;
        c->n_events = 0;
        free(c->events);
        c->events = NULL;
        c->cap_events = 0;
        event_page_release(m, c);
        for (size_t g = 0; g < m->n_gpus; g++)
                if (c->pdd[g].doorbell_off) {
                        if (c->pdd[g].doorbells)
                                munmap((void *)(uintptr_t)c->pdd[g].doorbells, MODEL_DOORBELL_SLICE);
                        c->pdd[g].doorbells = NULL;
                        dev_release(m, c->pdd[g].doorbell_off - 1, MODEL_DOORBELL_SLICE);
                        c->pdd[g].doorbell_off = 0;
                }
        model_events_changed(m);
}

/* ------------------------------------------------------------------ the engines' thread */

uint64_t model_gpu_clock(void)
{
        return model_gpu_clock_now();
}

uint64_t model_sys_clock(void)
{
        return now_ns(CLOCK_BOOTTIME);
}

/* Runs one queue's engine as far as it can go now (a run: at most MODEL_ENGINE_PACKETS packets and
 * MODEL_ENGINE_BYTES bytes); returns the number of packets it retired. */
static unsigned int queue_run(ThunkModel *m, ModelCtx *ctx, ModelQueue *q)
{
        ModelEngine e;
        unsigned int done;

        q->busy = false;
        if (q->stopped || !q->ring_base || !q->ring_size)
                return 0;
        model_engine_init(&e, m, ctx, q);
        switch (q->type) {
        case KFD_IOC_QUEUE_TYPE_COMPUTE_AQL:
                done = model_aql_run(&e);
                break;
        case KFD_IOC_QUEUE_TYPE_SDMA:
        case KFD_IOC_QUEUE_TYPE_SDMA_XGMI:
                done = model_sdma_run(&e);
                break;
        case KFD_IOC_QUEUE_TYPE_COMPUTE:
                done = model_pm4_run(&e);
                break;
        default:
                return 0;
        }
        if (e.faulted)
                model_vm_fault_raise(m, ctx, q->gpu, &e.fault);
        if (q->stopped)
                q->busy = false;
        return done;
}

/*
 * One round: every queue's engine once. Called and returns under the model's lock, which it lets go while a
 * context's queues run: they run under that context's eng lock alone, so another context's calls never
 * wait for them, and its own wait for one queue's run at most (the engines let them in between queues).
 * *@ret_busy: a queue has work left.
 */
static unsigned int cp_round(ThunkModel *m, bool *ret_busy)
{
        unsigned int done = 0;
        ModelCtx *c = m->ctxs;

        *ret_busy = false;
        if (c)
                c->pins++; /* its memory stays, and while it lives it stays in the list, until unpinned */
        while (c) {
                ModelCtx *next;

                model_unlock(m);
                pthread_mutex_lock(&c->eng);
                for (size_t i = 0;; i++) {
                        uint64_t asked = __atomic_load_n(&c->eng_asked, __ATOMIC_SEQ_CST);

                        /* between two queues: every call that asked for the context meanwhile goes first */
                        while (c->eng_served < asked)
                                pthread_cond_wait(&c->eng_cond, &c->eng);
                        if (c->dead || i >= c->n_queues || __atomic_load_n(&m->cp_stop, __ATOMIC_RELAXED))
                                break;
                        done += queue_run(m, c, &c->queues[i]);
                        *ret_busy |= c->queues[i].busy;
                }
                pthread_mutex_unlock(&c->eng);
                model_lock(m);
                /* a context released meanwhile left the list: the round ends there, the next starts over */
                next = m->cp_stop || c->dead ? NULL : c->next;
                if (c->dead)
                        *ret_busy = true;
                if (next)
                        next->pins++;
                if (--c->pins == 0 && c->dead)
                        model_ctx_free(c);
                c = next;
        }
        return done;
}

unsigned int thunk_model_run_engines(ThunkModel *m)
{
        unsigned int done;
        bool busy;

        model_lock(m);
        done = cp_round(m, &busy);
        model_gpuvm_trim(m);
        model_unlock(m);
        return done;
}

void thunk_model_doorbell_kick(ThunkModel *m)
{
        model_lock(m);
        m->cp_kicked = true;
        pthread_cond_broadcast(&m->cp_cond);
        model_unlock(m);
}

static void *cp_main(void *arg)
{
        ThunkModel *m = arg;
        unsigned int idle_us = 0;

        pthread_mutex_lock(&m->lock);
        while (!m->cp_stop) {
                struct timespec t;
                bool busy;

                if (m->n_queues == 0) {
                        pthread_cond_wait(&m->cp_cond, &m->lock);
                        continue;
                }
                m->cp_kicked = false;
                MODEL_COUNT(m->cnt.engine_rounds, 1);
                bool progressed = cp_round(m, &busy);

                model_gpuvm_trim(m); /* no engine is inside a buffer between rounds */
                if (progressed) {
                        idle_us = 0;
                        continue;
                }
                if (m->cp_stop || m->cp_kicked)
                        continue;
                if (m->doorbell_kicks && !busy) {
                        /* every queue is drained, and new work comes with a kick: sleep until one, a new or
                         * changed queue, or the model's end */
                        idle_us = 0;
                        pthread_cond_wait(&m->cp_cond, &m->lock);
                        continue;
                }
                /* a queue waits (a poll, a barrier), or a write pointer or doorbell may move unseen (a memory
                 * write the model cannot watch): back off from 20 us to 1 ms between looks; a new queue, a
                 * kick or the model's end wakes it at once */
                idle_us = idle_us ? (idle_us * 2 > 1000 ? 1000 : idle_us * 2) : 20;
                t = deadline_after(CLOCK_REALTIME, (uint64_t)idle_us * 1000);
                pthread_cond_timedwait(&m->cp_cond, &m->lock, &t);
        }
        pthread_mutex_unlock(&m->lock);
        return NULL;
}

/* ------------------------------------------------------------------ mmap of device offsets */

int model_kfd_mmap_dev(ThunkModel *m, ModelCtx *ctx, void *addr, size_t len, int prot, int flags,
                       uint64_t offset, void **ret)
{
        uint64_t type = offset & THUNK_KFD_MMAP_TYPE_MASK, off;
        int fd = m->anchor, g, r;
        void *p;

        if (type == THUNK_KFD_MMAP_TYPE_DOORBELL) {
                g = model_gpu_index(m, THUNK_KFD_MMAP_GET_GPU_ID(offset));
                if (g < 0 || len != MODEL_DOORBELL_SLICE)
                        return -EINVAL;
                r = ctx_doorbell(m, ctx, g, &off);
                if (r < 0)
                        return r;
        } else if (type == THUNK_KFD_MMAP_TYPE_EVENTS) {
                if (!ctx->evpage.slots || len > ctx->evpage.size)
                        return -EINVAL;
                if (ctx->evpage.handle) {
                        ModelMem *mem = NULL;

                        g = model_gpu_index(m, THUNK_KFD_HANDLE_GPU(ctx->evpage.handle));
                        if (g >= 0)
                                mem = model_idr_find(&ctx->pdd[g], THUNK_KFD_HANDLE_IDR(ctx->evpage.handle));
                        if (!mem || mem->buf->type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                                return -EINVAL;
                        return model_buf_mmap(mem->buf, addr, len, prot, flags, ret);
                } else {
                        off = ctx->evpage.dev_off;
                }
        } else {
                return -ENOENT;
        }
        p = mmap(addr, len, prot, flags, fd, (off_t)off);
        if (p == MAP_FAILED)
                return -errno;
        *ret = p;
        return 0;
}

/* ------------------------------------------------------------------ the remaining per-process ioctls */

int model_kfd_get_clock_counters(Call *c)
{
        struct kfd_ioctl_get_clock_counters_args *a = c->arg;
        /* an unknown gpu_id (0 included) is no error: there is just no GPU counter to read */
        a->gpu_clock_counter = model_gpu_index(c->m, a->gpu_id) >= 0 ? model_gpu_clock() : 0;
        a->cpu_clock_counter = now_ns(CLOCK_MONOTONIC_RAW);
        a->system_clock_counter = model_sys_clock();
        a->system_clock_freq = 1000000000ULL;
        return 0;
}

int model_kfd_get_tile_config(Call *c)
{
        struct kfd_ioctl_get_tile_config_args *a = c->arg;
        /* GFX9 and later keep no tiling tables: the arrays amdgpu reports are all zero */
        const uint32_t n_tile = 32, n_macro = 16;
        int g = model_gpu_index(c->m, a->gpu_id);

        if (g < 0)
                return -EINVAL;
        a->gb_addr_config = MODEL_GB_ADDR_CONFIG_GFX9;
        a->num_banks = 0;
        a->num_ranks = 0;
        if (a->num_tile_configs > n_tile)
                a->num_tile_configs = n_tile;
        if (a->num_tile_configs) {
                if (!a->tile_config_ptr) {
                        a->num_tile_configs = 0;
                        return -EFAULT;
                }
                memset((void *)(uintptr_t)a->tile_config_ptr, 0, a->num_tile_configs * sizeof(uint32_t));
        }
        if (a->num_macro_tile_configs > n_macro)
                a->num_macro_tile_configs = n_macro;
        if (a->num_macro_tile_configs) {
                if (!a->macro_tile_config_ptr) {
                        a->num_macro_tile_configs = 0;
                        return -EFAULT;
                }
                memset((void *)(uintptr_t)a->macro_tile_config_ptr, 0,
                       a->num_macro_tile_configs * sizeof(uint32_t));
        }
        return 0;
}

int model_kfd_set_trap_handler(Call *c)
{
        struct kfd_ioctl_set_trap_handler_args *a = c->arg;
        int g = model_gpu_index(c->m, a->gpu_id);

        if (g < 0)
                return -EINVAL;
        if (!c->ctx->pdd[g].file)
                return -ESRCH;
        c->ctx->pdd[g].tba = a->tba_addr;
        c->ctx->pdd[g].tma = a->tma_addr;
        return 0;
}
