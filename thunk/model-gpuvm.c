/* GPU-VM access for the model's engines: every address goes through the queue's VM, its mappings and rights.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <amdgpu_drm.h>

#include "model-engines.h"

/* A CPU view of one buffer's bytes, made the first time an engine touches the buffer and dropped when the
 * buffer goes or moves to a file of its own (model_gpuvm_forget): engines look at rings and signals many
 * times a millisecond, and an mmap per access would cost more than the access. */
typedef struct ModelView {
        ModelBuf *buf;
        uint8_t *base;
        uint64_t size;
        bool writable;
        bool held; /* model_gpuvm_hold()'s: kept by model_gpuvm_trim() */
} ModelView;

struct ModelViews {
        ModelView *v;
        size_t n;
        size_t cap;
        size_t n_held; /* of them model_gpuvm_hold()'s, which model_gpuvm_trim() keeps */
        size_t last;   /* the last hit: engines touch one buffer many times in a row */
};

static ModelView *view_find(struct ModelViews *vs, const ModelBuf *b)
{
        if (vs->last < vs->n && vs->v[vs->last].buf == b)
                return &vs->v[vs->last];
        for (size_t i = 0; i < vs->n; i++)
                if (vs->v[i].buf == b) {
                        vs->last = i;
                        return &vs->v[i];
                }
        return NULL;
}

/*
 * The engines' one way to a buffer's bytes: a CPU pointer to the start of @b, NULL if the model cannot
 * reach them with @access. A userptr BO's pages are the process's own, at their CPU address; any other
 * buffer is reached through a shared mapping made by model_buf_mmap(): of its range of the GPU's backing
 * file while it is carved, of its own file once it has one. Either sees exactly what the CPU mappings of
 * the buffer and its exported dmabufs see. The view counts as a CPU mapping of a carve-out, so a carved
 * buffer's move to a file of its own (its first export) drops it first (model_gpuvm_forget), and the next
 * access maps the new file.
 */
static uint8_t *buf_view(ThunkModel *m, ModelBuf *b, unsigned int access)
{
        struct ModelViews *vs = m->views;
        ModelView *v;
        void *p;
        bool writable = true;
        int r;

        if (!vs) {
                vs = calloc(1, sizeof(*vs));
                if (!vs)
                        return NULL;
                m->views = vs;
        }
        v = view_find(vs, b);
        if (!v) {
                if (ARRAY_RESERVE(vs->v, vs->cap, vs->n + 1, 8) < 0)
                        return NULL;
                r = model_buf_mmap(b, NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, &p);
                if (r == -EACCES || r == -EPERM) {
                        /* an import of a read-only file, or a file sealed against new writable mappings
                         * before the engines first touched it: the engines may only read it */
                        writable = false;
                        r = model_buf_mmap(b, NULL, b->size, PROT_READ, MAP_SHARED, &p);
                }
                if (r < 0)
                        return NULL;
                vs->last = vs->n;
                v = &vs->v[vs->n++];
                *v = (ModelView){.buf = b, .base = p, .size = b->size, .writable = writable};
        }
        if ((access & MODEL_VM_WRITE) && !v->writable)
                return NULL;
        return v->base;
}

/*
 * The views are the model's, shared by every context's engines and by the calls that drop them, under
 * views_mu. A view stays mapped while its buffer is mapped in the VM whose engines use it: a buffer goes
 * only once no VM maps it, and a carved buffer, which moves, is reached by its own context's VMs alone,
 * whose engines its export (under that context's eng lock) keeps out.
 */
static uint8_t *model_buf_bytes(ThunkModel *m, ModelBuf *b, unsigned int access)
{
        uint8_t *p;

        if (b->type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                return b->userptr ? (uint8_t *)(uintptr_t)b->userptr : NULL;
        pthread_mutex_lock(&m->views_mu);
        p = buf_view(m, b, access);
        pthread_mutex_unlock(&m->views_mu);
        return p;
}

/* The engines' view of @b made now if it is not yet, writable if its file allows it: a file about to be
 * sealed against new writable mappings keeps the ones made before (thunk_model_seal). */
int model_gpuvm_hold(ThunkModel *m, ModelBuf *b)
{
        uint8_t *p;

        if (b->type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                return 0;
        pthread_mutex_lock(&m->views_mu);
        p = buf_view(m, b, 0);
        if (p) { /* kept by model_gpuvm_trim: once the file is sealed, no writable view can be made again */
                ModelView *v = view_find(m->views, b);
                m->views->n_held += !v->held;
                v->held = true;
        }
        pthread_mutex_unlock(&m->views_mu);
        return p ? 0 : -ENOMEM;
}

void model_gpuvm_forget(ThunkModel *m, ModelBuf *b)
{
        struct ModelViews *vs;
        ModelView *v;

        pthread_mutex_lock(&m->views_mu);
        vs = m->views;
        v = vs ? view_find(vs, b) : NULL;
        if (v) {
                munmap(v->base, v->size);
                vs->n_held -= v->held;
                *v = vs->v[--vs->n];
        }
        pthread_mutex_unlock(&m->views_mu);
}

/*
 * Between rounds, when no engine holds a pointer into a view: past MODEL_VIEWS_KEEP views, drop them all
 * but the held ones. Each is an entry of the process's memory map, and a client touching one buffer after
 * another with fences would otherwise keep one per buffer it ever touched, up to vm.max_map_count, where
 * every mmap of the process fails, other clients' included. The views in use come back at their next
 * access. Held views do not count towards the bound, so that many of them do not make every round drop
 * the others.
 */
void model_gpuvm_trim(ThunkModel *m)
{
        struct ModelViews *vs;
        size_t kept = 0;

        pthread_mutex_lock(&m->views_mu);
        vs = m->views;
        if (vs && vs->n - vs->n_held > MODEL_VIEWS_KEEP) {
                for (size_t i = 0; i < vs->n; i++) {
                        if (vs->v[i].held)
                                vs->v[kept++] = vs->v[i];
                        else
                                munmap(vs->v[i].base, vs->v[i].size);
                }
                vs->n = kept;
                vs->last = 0;
        }
        pthread_mutex_unlock(&m->views_mu);
}

void model_gpuvm_release(ThunkModel *m)
{
        struct ModelViews *vs;

        pthread_mutex_lock(&m->views_mu);
        vs = m->views;
        m->views = NULL;
        pthread_mutex_unlock(&m->views_mu);
        if (!vs)
                return;
        for (size_t i = 0; i < vs->n; i++)
                munmap(vs->v[i].base, vs->v[i].size);
        free(vs->v);
        free(vs);
}

/* ------------------------------------------------------------------ translation */

void model_engine_init(ModelEngine *e, ThunkModel *m, ModelCtx *ctx, ModelQueue *q)
{
        ModelFile *f = ctx->pdd[q->gpu].file;

        *e = (ModelEngine){.m = m, .ctx = ctx, .q = q, .vm = f ? &f->vm : NULL, .budget = MODEL_ENGINE_BYTES};
}

static int vm_fault(ModelEngine *e, uint64_t va, bool not_present, bool read_only, bool no_execute)
{
        if (!e->faulted) {
                e->faulted = true;
                e->fault = (ModelVmFault){.va = va & ~(MODEL_PAGE - 1),
                                          .not_present = not_present,
                                          .read_only = read_only,
                                          .no_execute = no_execute};
        }
        return -EFAULT;
}

int model_vm_fault(ModelEngine *e, uint64_t va, bool not_present, bool read_only, bool no_execute)
{
        return vm_fault(e, va, not_present, read_only, no_execute);
}

/* The mapping holding @va, or NULL: mappings never overlap, so it is the first one to end after @va, if
 * that one starts at or below it. */
static const ModelMapping *vm_lookup(const ModelVm *vm, uint64_t va)
{
        const ModelMapping *mp = vm ? model_vm_first_after(vm, va) : NULL;

        return mp && mp->start <= va ? mp : NULL;
}

/*
 * An SVM range of the queue's context holding @va that its GPU may reach (the range's ACCESS or
 * ACCESS_IN_PLACE names the GPU; with XNACK on, every GPU the context may use has it), or NULL. Its pages are
 * the process's own at the same address: the GPU reaches them as the kernel's SVM maps them, in place.
 */
static const SvmRange *svm_lookup(const ModelEngine *e, uint64_t va)
{
        uint64_t page = va / MODEL_PAGE, bit = 1ull << e->q->gpu;

        for (size_t i = 0; i < e->ctx->n_svm; i++) {
                const SvmRange *r = &e->ctx->svm[i];
                if (r->start <= page && page <= r->last)
                        return (r->at.access | r->at.in_place) & bit ? r : NULL;
        }
        return NULL;
}

/* [va, va + len) as far as SVM range @r holds it, with @access: the process's pages, checked as mapped. */
static int svm_span(ModelEngine *e, const SvmRange *r, uint64_t va, uint64_t len, unsigned int access,
                    uint8_t **ret, uint64_t *ret_len)
{
        uint64_t end = (r->last + 1) * MODEL_PAGE, n = end - va < len ? end - va : len;

        if ((access & MODEL_VM_WRITE) && (r->at.flags & KFD_IOCTL_SVM_FLAG_GPU_RO))
                return vm_fault(e, va, false, true, false);
        if ((access & MODEL_VM_EXEC) && !(r->at.flags & KFD_IOCTL_SVM_FLAG_GPU_EXEC))
                return vm_fault(e, va, false, false, true);
        /* pages the process unmapped: the kernel's MMU notifier would have dropped them from the GPU */
        if (!model_cpu_range_mapped(va & ~(MODEL_PAGE - 1), MODEL_PAGE_ALIGN(va + n)))
                return vm_fault(e, va, true, false, false);
        *ret = (uint8_t *)(uintptr_t)va;
        *ret_len = n;
        return 0;
}

/* The longest run of [va, va + len) that one mapping covers with @access: a CPU pointer to it and its
 * length. A KFD mapping has the rights of its allocation (always readable, WRITABLE, EXECUTABLE); a
 * GEM_VA mapping those it was made with. */
static int vm_span(ModelEngine *e, uint64_t va, uint64_t len, unsigned int access, uint8_t **ret,
                   uint64_t *ret_len)
{
        const ModelMapping *mp = vm_lookup(e->vm, va);
        const SvmRange *svm;
        bool readable, writable, exec;
        uint64_t off, n;
        uint8_t *base;

        if (!mp && (svm = svm_lookup(e, va)) != NULL)
                return svm_span(e, svm, va, len, access, ret, ret_len);
        if (!mp)
                return vm_fault(e, va, true, false, false);
        if (mp->mem) {
                readable = true;
                writable = mp->mem->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
                exec = mp->mem->flags & KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE;
        } else {
                readable = mp->gem_flags & AMDGPU_VM_PAGE_READABLE;
                writable = mp->gem_flags & AMDGPU_VM_PAGE_WRITEABLE;
                exec = mp->gem_flags & AMDGPU_VM_PAGE_EXECUTABLE;
        }
        /* the kernel words a fault by the protection bits the memory controller reports: a write to a
         * read-only page is ReadOnly, an instruction fetch from a non-executable one NoExecute, and a read
         * of an unreadable one sets neither */
        if ((access & MODEL_VM_WRITE) && !writable)
                return vm_fault(e, va, false, true, false);
        if ((access & MODEL_VM_EXEC) && !exec)
                return vm_fault(e, va, false, false, true);
        if ((access & MODEL_VM_READ) && !readable)
                return vm_fault(e, va, false, false, false);
        off = mp->offset + (va - mp->start);
        base = off < mp->buf->size ? model_buf_bytes(e->m, mp->buf, access) : NULL;
        if (!base)
                return vm_fault(e, va, !(access & MODEL_VM_WRITE), (access & MODEL_VM_WRITE) != 0, false);
        n = mp->end - va;
        if (n > mp->buf->size - off)
                n = mp->buf->size - off;
        if (n > len)
                n = len;
        /* A userptr BO's pages are the process's: ones it unmapped while the BO stayed mapped on the GPU
         * (the kernel's MMU notifier would evict the BO) are not present to the GPU, and touching them here
         * would fault the model's own thread. Pages unmapped by another thread between this check and the
         * access are not covered: the process races with itself there, as it does on the hardware. */
        if (mp->buf->type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                uint64_t cpu = (uint64_t)(uintptr_t)(base + off);
                uint64_t lo = cpu & ~(MODEL_PAGE - 1);
                uint64_t hi = MODEL_PAGE_ALIGN(cpu + n);
                if (!model_cpu_range_mapped(lo, hi))
                        return vm_fault(e, va, true, false, false);
        }
        *ret = base + off;
        *ret_len = n;
        return 0;
}

int model_vm_check(ModelEngine *e, uint64_t va, uint64_t len, unsigned int access)
{
        uint8_t *p;
        uint64_t n;

        if (len && va + len - 1 < va)
                return vm_fault(e, 0, true, false, false);
        while (len) {
                int r = vm_span(e, va, len, access, &p, &n);

                if (r < 0)
                        return r;
                va += n;
                len -= n;
        }
        return 0;
}

/* Moves @len bytes between the VM at @va and the process: out of the VM into @out, or (@out NULL) into it
 * from @in. */
static int vm_xfer(ModelEngine *e, uint64_t va, uint64_t len, uint8_t *out, const uint8_t *in)
{
        unsigned int access = out ? MODEL_VM_READ : MODEL_VM_WRITE;
        uint8_t *p;
        uint64_t n;
        int r = model_vm_check(e, va, len, access);

        while (r == 0 && len) {
                r = vm_span(e, va, len, access, &p, &n);
                if (r < 0)
                        break;
                if (out) {
                        memcpy(out, p, n);
                        out += n;
                } else {
                        memcpy(p, in, n);
                        in += n;
                }
                va += n;
                len -= n;
        }
        return r;
}

int model_vm_read(ModelEngine *e, uint64_t va, void *dst, uint64_t len)
{
        return vm_xfer(e, va, len, dst, NULL);
}

int model_vm_write(ModelEngine *e, uint64_t va, const void *src, uint64_t len)
{
        return vm_xfer(e, va, len, NULL, src);
}

int model_vm_copy(ModelEngine *e, uint64_t dst, uint64_t src, uint64_t len)
{
        uint8_t *d, *s;
        uint64_t nd, ns;
        int r;

        /* the source is read before anything is written: a fault on either side moves no byte */
        r = model_vm_check(e, src, len, MODEL_VM_READ);
        if (r == 0)
                r = model_vm_check(e, dst, len, MODEL_VM_WRITE);
        while (r == 0 && len) {
                r = vm_span(e, src, len, MODEL_VM_READ, &s, &ns);
                if (r == 0)
                        r = vm_span(e, dst, ns, MODEL_VM_WRITE, &d, &nd);
                if (r == 0) {
                        memmove(d, s, nd);
                        src += nd;
                        dst += nd;
                        len -= nd;
                }
        }
        return r;
}

int model_vm_fill(ModelEngine *e, uint64_t va, uint64_t value, unsigned int size, uint64_t n)
{
        /* 4 KiB of the pattern: a whole number of elements of every size, so a run starting at byte k of
         * an element is pat + k */
        uint8_t pat[4096 + 8];
        uint64_t len = n * size, pos = 0, got;
        uint8_t *p;
        int r;

        if (size == 0 || size > 8 || (size & (size - 1)) || (n && len / size != n))
                return -EINVAL;
        for (size_t i = 0; i < sizeof(pat); i++)
                pat[i] = (uint8_t)(value >> (8 * (i % size)));
        r = model_vm_check(e, va, len, MODEL_VM_WRITE);
        while (r == 0 && pos < len) {
                r = vm_span(e, va + pos, len - pos, MODEL_VM_WRITE, &p, &got);
                for (uint64_t done = 0; r == 0 && done < got;) {
                        uint64_t k = (pos + done) % size, c = got - done < 4096 ? got - done : 4096;

                        memcpy(p + done, pat + k, c);
                        done += c;
                }
                if (r == 0)
                        pos += got;
        }
        return r;
}

/* A pointer for a single access of @size bytes, if one mapping covers it and it is naturally aligned
 * (then the access can be atomic); NULL with 0 if it must go byte by byte, NULL with the fault else. */
static uint8_t *vm_word(ModelEngine *e, uint64_t va, unsigned int size, unsigned int access, int *err)
{
        uint8_t *p;
        uint64_t n;

        *err = model_vm_check(e, va, size, access);
        if (*err < 0 || (va & (size - 1)))
                return NULL;
        *err = vm_span(e, va, size, access, &p, &n);
        return *err == 0 && n == size && ((uintptr_t)p & (size - 1)) == 0 ? p : NULL;
}

/* A naturally aligned 32- or 64-bit load or store, atomic where one mapping holds the word (as the
 * hardware's are), else byte by byte. */
static int vm_load(ModelEngine *e, uint64_t va, unsigned int size, void *ret)
{
        int r;
        uint8_t *p = vm_word(e, va, size, MODEL_VM_READ, &r);

        if (!p)
                return r < 0 ? r : model_vm_read(e, va, ret, size);
        if (size == 4)
                *(uint32_t *)ret = __atomic_load_n((uint32_t *)p, __ATOMIC_ACQUIRE);
        else
                *(uint64_t *)ret = __atomic_load_n((uint64_t *)p, __ATOMIC_ACQUIRE);
        return 0;
}

static int vm_store(ModelEngine *e, uint64_t va, unsigned int size, const void *v)
{
        int r;
        uint8_t *p = vm_word(e, va, size, MODEL_VM_WRITE, &r);

        if (!p)
                return r < 0 ? r : model_vm_write(e, va, v, size);
        if (size == 4)
                __atomic_store_n((uint32_t *)p, *(const uint32_t *)v, __ATOMIC_RELEASE);
        else
                __atomic_store_n((uint64_t *)p, *(const uint64_t *)v, __ATOMIC_RELEASE);
        return 0;
}

int model_vm_load32(ModelEngine *e, uint64_t va, uint32_t *ret)
{
        return vm_load(e, va, sizeof(*ret), ret);
}

int model_vm_load64(ModelEngine *e, uint64_t va, uint64_t *ret)
{
        return vm_load(e, va, sizeof(*ret), ret);
}

int model_vm_store32(ModelEngine *e, uint64_t va, uint32_t v)
{
        return vm_store(e, va, sizeof(v), &v);
}

int model_vm_store64(ModelEngine *e, uint64_t va, uint64_t v)
{
        return vm_store(e, va, sizeof(v), &v);
}

/* TC_OP_ATOMIC_* (gfx9): bit 5 selects 64-bit, bit 6 "no return"; the low five bits are the operation. */
enum {
        TC_ATOMIC_SWAP = 0x07,
        TC_ATOMIC_CMPSWAP = 0x08,
        TC_ATOMIC_ADD = 0x0f,
        TC_ATOMIC_SUB = 0x10,
        TC_ATOMIC_SMIN = 0x11,
        TC_ATOMIC_UMIN = 0x12,
        TC_ATOMIC_SMAX = 0x13,
        TC_ATOMIC_UMAX = 0x14,
        TC_ATOMIC_AND = 0x15,
        TC_ATOMIC_OR = 0x16,
        TC_ATOMIC_XOR = 0x17,
        TC_ATOMIC_INC = 0x18,
        TC_ATOMIC_DEC = 0x19,
};

/* The new value of an atomic on @old; false if it leaves memory alone (a failed compare-and-swap). */
static bool atomic_apply(unsigned int kind, bool wide, uint64_t old, uint64_t src, uint64_t cmp,
                         uint64_t *ret)
{
        uint64_t mask = wide ? ~0ULL : 0xffffffffULL;
        int64_t so = wide ? (int64_t)old : (int64_t)(int32_t)old,
                ss = wide ? (int64_t)src : (int64_t)(int32_t)src;

        old &= mask;
        src &= mask;
        switch (kind) {
        case TC_ATOMIC_SWAP:
                *ret = src;
                return true;
        case TC_ATOMIC_CMPSWAP:
                *ret = src;
                return old == (cmp & mask);
        case TC_ATOMIC_ADD:
                *ret = (old + src) & mask;
                return true;
        case TC_ATOMIC_SUB:
                *ret = (old - src) & mask;
                return true;
        case TC_ATOMIC_SMIN:
                *ret = (uint64_t)(so < ss ? so : ss) & mask;
                return true;
        case TC_ATOMIC_UMIN:
                *ret = old < src ? old : src;
                return true;
        case TC_ATOMIC_SMAX:
                *ret = (uint64_t)(so > ss ? so : ss) & mask;
                return true;
        case TC_ATOMIC_UMAX:
                *ret = old > src ? old : src;
                return true;
        case TC_ATOMIC_AND:
                *ret = old & src;
                return true;
        case TC_ATOMIC_OR:
                *ret = old | src;
                return true;
        case TC_ATOMIC_XOR:
                *ret = old ^ src;
                return true;
        case TC_ATOMIC_INC: /* wraps to 0 past the source value */
                *ret = old >= src ? 0 : old + 1;
                return true;
        case TC_ATOMIC_DEC: /* wraps to the source value below 0 or above it */
                *ret = (old == 0 || old > src) ? src : old - 1;
                return true;
        default:
                return false;
        }
}

static bool atomic_known(unsigned int op)
{
        unsigned int kind = op & 0x1f;

        return op < 0x80 && (kind == TC_ATOMIC_SWAP || kind == TC_ATOMIC_CMPSWAP ||
                             (kind >= TC_ATOMIC_ADD && kind <= TC_ATOMIC_DEC));
}

int model_vm_atomic(ModelEngine *e, uint64_t va, unsigned int op, uint64_t src, uint64_t cmp,
                    uint64_t *ret_old)
{
        bool wide = (op & 0x20) != 0;
        unsigned int size = wide ? 8 : 4, kind = op & 0x1f;
        uint64_t old = 0, nv;
        uint8_t *p;
        int r;

        if (!atomic_known(op))
                return -EINVAL;
        p = vm_word(e, va, size, MODEL_VM_READ | MODEL_VM_WRITE, &r);
        if (!p) {
                /* unaligned or split across mappings: no atomicity to be had, as on the GPU */
                if (r < 0)
                        return r;
                r = model_vm_read(e, va, &old, size);
                if (r == 0 && atomic_apply(kind, wide, old, src, cmp, &nv))
                        r = model_vm_write(e, va, &nv, size);
                *ret_old = old;
                return r;
        }
        if (wide) {
                uint64_t cur = __atomic_load_n((uint64_t *)p, __ATOMIC_ACQUIRE);

                do {
                        old = cur;
                        if (!atomic_apply(kind, true, old, src, cmp, &nv))
                                break;
                } while (!__atomic_compare_exchange_n((uint64_t *)p, &cur, nv, false, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_ACQUIRE));
        } else {
                uint32_t cur = __atomic_load_n((uint32_t *)p, __ATOMIC_ACQUIRE);

                do {
                        old = cur;
                        if (!atomic_apply(kind, false, old, src, cmp, &nv))
                                break;
                } while (!__atomic_compare_exchange_n((uint32_t *)p, &cur, (uint32_t)nv, false,
                                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
        }
        *ret_old = old;
        return 0;
}
