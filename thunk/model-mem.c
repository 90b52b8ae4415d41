/* The software KFD's memory: accounting, buffers, GPU VMs and the memory ioctls (see docs/thunk-model.md). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "kfd-compat.h"
#include "model-private.h"

/* ------------------------------------------------------------------ accounting (kfd-abi.md §6) */

int model_charge(ThunkModel *m, int gpu, uint32_t type, uint64_t size)
{
        uint64_t sys = 0, ttm = 0, vram = 0;

        if (type == KFD_IOC_ALLOC_MEM_FLAGS_GTT) {
                sys = size;
                ttm = size;
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_VRAM) {
                vram = size;
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                sys = size;
        }
        if ((uint64_t)m->system_used + sys > m->system_limit || (uint64_t)m->ttm_used + ttm > m->ttm_limit)
                return -ENOMEM;
        if (vram) {
                ModelGpu *g = &m->gpus[gpu];
                uint64_t limit = g->vram_size > m->pt_reserve ? g->vram_size - m->pt_reserve : 0;

                if ((uint64_t)g->vram_used + vram > limit)
                        return -ENOMEM;
                MODEL_COUNT(g->vram_used, vram);
                g->vram_used_aligned += (vram + MODEL_2M - 1) & ~(MODEL_2M - 1);
        }
        MODEL_COUNT(m->system_used, sys);
        MODEL_COUNT(m->ttm_used, ttm);
        return 0;
}

void model_uncharge(ThunkModel *m, int gpu, uint32_t type, uint64_t size)
{
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_GTT) {
                MODEL_COUNT(m->system_used, -size);
                MODEL_COUNT(m->ttm_used, -size);
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_VRAM) {
                MODEL_COUNT(m->gpus[gpu].vram_used, -size);
                m->gpus[gpu].vram_used_aligned -= (size + MODEL_2M - 1) & ~(MODEL_2M - 1);
        } else if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                MODEL_COUNT(m->system_used, -size);
        }
}

static uint64_t available_memory(const ThunkModel *m, int gpu)
{
        const ModelGpu *g = &m->gpus[gpu];
        int64_t avail;

        if (g->apu) {
                int64_t sys = (int64_t)m->system_limit - m->system_used;
                int64_t ttm = (int64_t)m->ttm_limit - m->ttm_used;

                avail = sys < ttm ? sys : ttm;
                if (avail < 0)
                        return 0;
                return (uint64_t)avail & ~(MODEL_PAGE - 1);
        }
        avail = (int64_t)g->vram_size - (int64_t)g->vram_used_aligned - (int64_t)m->pt_reserve;
        if (avail < 0)
                return 0;
        return (uint64_t)avail & ~(MODEL_2M - 1);
}

/* ------------------------------------------------------------------ backing files */

/*
 * Buffers that are never shared live in their GPU's backing file, a memfd the model never hands out. Its
 * offsets are given out in blocks of 2^k pages, one free stack per k; a freed block goes back on its stack
 * with its pages punched out, so its memory is released at once. Blocks are not merged: what is left over
 * is offset space of a sparse file, which costs nothing, and a file with no buffer left is emptied. Each
 * stack is kept able to take back every block of its order that buffers hold, so a free never needs memory.
 */

static int heap_order(uint64_t size, unsigned int *ret)
{
        uint64_t pages = size / MODEL_PAGE;
        unsigned int k = 0;

        while (k < MODEL_HEAP_ORDERS && (1ULL << k) < pages)
                k++;
        if (k == MODEL_HEAP_ORDERS)
                return -ENOMEM;
        *ret = k;
        return 0;
}

static int heap_init(ModelHeap *h)
{
        struct stat st;

        memset(h, 0, sizeof(*h));
        h->fd = memfd_create("gpumem-heap", MFD_CLOEXEC);
        if (h->fd < 0)
                return -errno;
        if (fstat(h->fd, &st) < 0) {
                int r = -errno;

                close(h->fd);
                h->fd = -1;
                return r;
        }
        h->dev = st.st_dev;
        h->ino = st.st_ino;
        return 0;
}

static void heap_done(ModelHeap *h)
{
        if (h->fd >= 0)
                close(h->fd);
        for (size_t k = 0; k < MODEL_HEAP_ORDERS; k++)
                free(h->orders[k].free);
        memset(h, 0, sizeof(*h));
        h->fd = -1;
}

/* A block for @size bytes: its byte offset in the file. */
static int heap_alloc(ModelHeap *h, uint64_t size, uint64_t *ret_off)
{
        ModelHeapOrder *o;
        unsigned int k;
        uint64_t page;
        int r = heap_order(size, &k);

        if (r < 0)
                return r;
        o = &h->orders[k];
        if (o->n_free) {
                page = o->free[--o->n_free];
        } else {
                uint64_t end = h->end + (1ULL << k);

                if (end > (1ULL << MODEL_HEAP_ORDERS))
                        return -ENOMEM;
                /* room on the stack for this block's return, before anything changes */
                if (ARRAY_RESERVE(o->free, o->cap, o->n_free + o->held + 1, 8) < 0)
                        return -ENOMEM;
                if (end > h->size) {
                        uint64_t want = h->size ? h->size : 512; /* 2 MiB */

                        while (want < end)
                                want *= 2;
                        if (ftruncate(h->fd, (off_t)(want * MODEL_PAGE)) < 0)
                                return -errno;
                        h->size = want;
                }
                page = h->end;
                h->end = end;
        }
        o->held++;
        h->used += (1ULL << k) * MODEL_PAGE;
        *ret_off = page * MODEL_PAGE;
        return 0;
}

/* Gives back the block at @off that held @size bytes; @touched: its pages may hold memory (were mapped). */
static void heap_free(ModelHeap *h, uint64_t off, uint64_t size, bool touched)
{
        unsigned int k = 0;
        ModelHeapOrder *o;

        (void)heap_order(size, &k); /* it was allocated, so it has an order */
        o = &h->orders[k];
        if (touched)
                (void)fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                                (off_t)((1ULL << k) * MODEL_PAGE));
        o->held--;
        o->free[o->n_free++] = off / MODEL_PAGE;
        h->used -= (1ULL << k) * MODEL_PAGE;
        if (h->used == 0 && h->size) {
                /* nothing left in it: start again from an empty file */
                for (size_t i = 0; i < MODEL_HEAP_ORDERS; i++)
                        h->orders[i].n_free = 0;
                h->end = 0;
                h->size = 0;
                (void)ftruncate(h->fd, 0);
        }
}

/*
 * Does any mapping of this process still show [off, off+len) of @h? /proc/self/maps names each mapping's
 * file (device, inode) and offset. Only asked of a buffer that was mapped once, when it must move.
 */
static int heap_range_mapped(const ModelHeap *h, uint64_t off, uint64_t len, bool *ret)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];

        if (!f)
                return -errno;
        *ret = false;
        while (!*ret && fgets(line, sizeof(line), f)) {
                unsigned long long s, e, foff, ino;
                unsigned int dmaj, dmin;
                size_t n = strlen(line);

                if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu", &s, &e, &foff, &dmaj, &dmin, &ino) == 6 &&
                    ino == (unsigned long long)h->ino && dmaj == major(h->dev) && dmin == minor(h->dev) &&
                    foff < off + len && foff + (e - s) > off)
                        *ret = true;
                /* skip the rest of an overlong line */
                while (n && line[n - 1] != '\n' && fgets(line, sizeof(line), f))
                        n = strlen(line);
        }
        fclose(f);
        return 0;
}

/* ------------------------------------------------------------------ buffers */

/*
 * The sharing rule (docs/thunk-model.md). An fd of a buffer shows the whole file behind it, so a buffer
 * must have a file of its own before any fd of it is handed out; a carved buffer that must become
 * shareable moves to one, which only works while no CPU mapping of its carve-out is left (such a mapping
 * would go on showing the old pages). Host-visible memory (GTT, PUBLIC VRAM) is what user space maps,
 * usually right after allocation, and maps before it exports: it gets its file at allocation. Everything
 * else (VRAM that is not host visible, doorbells, MMIO) is carved, and moves on its first export.
 */
static bool buf_born_shareable(const ThunkModel *m, uint32_t flags)
{
        return m->file_per_buffer || (flags & (KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC));
}

static uint64_t ino_key(ino_t ino)
{
        /* never 0 (no inode is) nor the hash map's tombstone */
        return (uint64_t)ino == UINT64_MAX ? UINT64_MAX - 1 : (uint64_t)ino;
}

/* Enters @b, whose memfd is set, in the index that finds a buffer from an fd of its file. */
static int buf_index_file(ThunkModel *m, ModelBuf *b)
{
        ModelBuf *first = hashmap_get(&m->by_ino, ino_key(b->ino));

        if (first) { /* another file with the same inode number, on another device */
                b->ino_next = first->ino_next;
                first->ino_next = b;
                return 0;
        }
        b->ino_next = NULL;
        return hashmap_put(&m->by_ino, ino_key(b->ino), b);
}

static void buf_unindex_file(ThunkModel *m, ModelBuf *b)
{
        ModelBuf *first = hashmap_get(&m->by_ino, ino_key(b->ino));

        if (first == b) {
                if (b->ino_next)
                        hashmap_replace(&m->by_ino, ino_key(b->ino), b->ino_next);
                else
                        hashmap_remove(&m->by_ino, ino_key(b->ino));
                return;
        }
        for (ModelBuf *p = first; p; p = p->ino_next)
                if (p->ino_next == b) {
                        p->ino_next = b->ino_next;
                        return;
                }
}

/* A memfd of @size bytes for one buffer, sealed at its size: whoever holds an exported fd can map it,
 * never resize it under the others (a shrink would turn their pages into SIGBUS). */
static int buf_file_new(uint64_t size, int *ret_fd, struct stat *ret_st)
{
        int fd = memfd_create("gpumem-bo", MFD_CLOEXEC | MFD_ALLOW_SEALING), r;

        if (fd < 0)
                return -errno;
        /* mode 0400: a memfd is created 0777, and whoever holds an fd of it read-only could open it again
         * writable through /proc (its fds are opened again only to make read-only ones); not sealed against
         * more seals: what hands it out read-only seals it against writes (broker_seal_read_only) */
        if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
            fchmod(fd, 0400) < 0 || fstat(fd, ret_st) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

/* Gives @b the file @fd (owned from here on) and enters it in the file index. */
static int buf_take_file(ThunkModel *m, ModelBuf *b, int fd, const struct stat *st)
{
        int r;

        b->memfd = fd;
        b->dev = st->st_dev;
        b->ino = st->st_ino;
        r = buf_index_file(m, b);
        if (r < 0) {
                b->memfd = -1;
                return r;
        }
        m->n_buffer_files++;
        return 0;
}

/* Copies @len bytes of @src from @off to @dst from 0, skipping holes (what was never written stays one). */
static int copy_data(int src, uint64_t off, int dst, uint64_t len)
{
        const size_t chunk = 1 << 16;
        char *buf = malloc(chunk);
        uint64_t pos = 0;
        int r = 0;

        if (!buf)
                return -ENOMEM;
        while (pos < len) {
                off_t data = lseek(src, (off_t)(off + pos), SEEK_DATA), hole;

                if (data < 0 && errno == ENXIO)
                        break;  /* no data past this point */
                if (data < 0) { /* no hole map: copy all of it */
                        data = (off_t)(off + pos);
                        hole = (off_t)(off + len);
                } else {
                        if ((uint64_t)data >= off + len)
                                break;
                        hole = lseek(src, data, SEEK_HOLE);
                        if (hole < 0 || (uint64_t)hole > off + len)
                                hole = (off_t)(off + len);
                }
                for (off_t p = data; p < hole;) {
                        size_t n = (size_t)(hole - p) < chunk ? (size_t)(hole - p) : chunk;
                        ssize_t got = pread(src, buf, n, p), put;

                        if (got <= 0) {
                                r = got < 0 ? -errno : -EIO;
                                goto out;
                        }
                        put = pwrite(dst, buf, (size_t)got, p - (off_t)off);
                        if (put != got) {
                                r = put < 0 ? -errno : -EIO;
                                goto out;
                        }
                        p += got;
                }
                pos = (uint64_t)hole - off;
        }
out:
        free(buf);
        return r;
}

/*
 * Moves carved @b to a file of its own, with its bytes: -EBUSY while a CPU mapping of its carve-out is left
 * in this process, which would not follow the move. Nothing changes on failure, but for the engines' view
 * of the carve-out, which goes first: it is the model's own and is made again, of the new file, on the
 * engines' next access.
 */
static int buf_make_shareable(ThunkModel *m, ModelBuf *b)
{
        struct stat st;
        bool mapped = false;
        int fd, r;

        model_gpuvm_forget(m, b);
        if (b->cpu_mapped) {
                r = heap_range_mapped(b->heap, b->heap_off, b->size, &mapped);
                if (r < 0)
                        return r;
                if (mapped)
                        return -EBUSY;
        }
        r = buf_file_new(b->size, &fd, &st);
        if (r < 0)
                return r;
        /* never mapped: never written, all zeros, like the new file */
        if (b->cpu_mapped && (r = copy_data(b->heap->fd, b->heap_off, fd, b->size)) < 0) {
                close(fd);
                return r;
        }
        r = buf_take_file(m, b, fd, &st);
        if (r < 0) {
                close(fd);
                return r;
        }
        heap_free(b->heap, b->heap_off, b->size, b->cpu_mapped);
        b->heap = NULL;
        b->heap_off = 0;
        b->cpu_mapped = false;
        return 0;
}

int model_buf_file(const ModelBuf *b, int *ret_fd, uint64_t *ret_off)
{
        if (b->heap) {
                *ret_fd = b->heap->fd;
                *ret_off = b->heap_off;
                return 0;
        }
        if (b->memfd < 0)
                return -EPERM;
        *ret_fd = b->memfd;
        *ret_off = 0;
        return 0;
}

int model_buf_mmap(ModelBuf *b, void *addr, size_t len, int prot, int flags, void **ret)
{
        uint64_t off = 0;
        void *p;
        int fd = -1, r = model_buf_file(b, &fd, &off);

        if (r < 0)
                return r;
        if (len > b->size)
                return -EINVAL;
        p = mmap(addr, len, prot, flags, fd, (off_t)off);
        if (p == MAP_FAILED)
                return -errno;
        /* from now on its pages may hold data, and a move must look for mappings left */
        if (b->heap)
                b->cpu_mapped = true;
        *ret = p;
        return 0;
}

int model_buf_allow(ModelBuf *b, ModelFile *f)
{
        ModelFile **n;

        for (size_t i = 0; i < b->n_allowed; i++)
                if (b->allowed[i] == f)
                        return 0;
        n = realloc(b->allowed, (b->n_allowed + 1) * sizeof(*n));
        if (!n)
                return -ENOMEM;
        n[b->n_allowed++] = f;
        b->allowed = n;
        return 0;
}

void model_buf_disallow(ThunkModel *m, ModelFile *f)
{
        for (ModelBuf *b = m->bufs; b; b = b->next)
                for (size_t i = 0; i < b->n_allowed; i++)
                        if (b->allowed[i] == f) {
                                b->allowed[i] = b->allowed[--b->n_allowed];
                                break;
                        }
}

/* Gives @b its DRM-style fake offset and links it in; -ENOMEM. */
static int buf_link(ThunkModel *m, ModelBuf *b)
{
        b->mmap_offset = m->next_mmap_offset;
        if (hashmap_put(&m->by_offset, b->mmap_offset, b) < 0)
                return -ENOMEM;
        m->next_mmap_offset += b->size + MODEL_PAGE; /* one page of space between objects */
        b->next = m->bufs;
        if (b->next)
                b->next->pprev = &b->next;
        b->pprev = &m->bufs;
        m->bufs = b;
        MODEL_COUNT(m->n_bufs, 1);
        return 0;
}

ModelBuf *model_buf_at_offset(ThunkModel *m, uint64_t mmap_offset)
{
        return mmap_offset ? hashmap_get(&m->by_offset, mmap_offset) : NULL;
}

static int buf_new(ThunkModel *m, int owner, uint32_t type, uint32_t flags, uint64_t size, ModelBuf **ret)
{
        ModelBuf *b = calloc(1, sizeof(*b));
        struct stat st;
        int fd = -1, r;

        if (!b)
                return -ENOMEM;
        b->memfd = -1;
        b->refs = 1;
        b->size = size;
        b->type = type;
        b->flags = flags;
        b->owner = owner;
        /* VRAM comes wiped: a carve-out was punched when it was last freed, a new file is empty */
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                /* the process's own pages: nothing of the model's */
        } else if (buf_born_shareable(m, flags)) {
                r = buf_file_new(size, &fd, &st);
                if (r < 0)
                        goto fail;
                r = buf_take_file(m, b, fd, &st);
                if (r < 0) {
                        close(fd);
                        goto fail;
                }
        } else {
                r = heap_alloc(&m->heaps[owner], size, &b->heap_off);
                if (r < 0)
                        goto fail;
                b->heap = &m->heaps[owner];
        }
        r = buf_link(m, b);
        if (r < 0)
                goto fail;
        *ret = b;
        return 0;
fail:
        if (b->heap)
                heap_free(b->heap, b->heap_off, b->size, false);
        if (b->memfd >= 0) {
                buf_unindex_file(m, b);
                m->n_buffer_files--;
                close(b->memfd);
        }
        free(b);
        return r;
}

void model_buf_unref(ThunkModel *m, ModelBuf *b)
{
        if (!b || --b->refs > 0)
                return;
        *b->pprev = b->next;
        if (b->next)
                b->next->pprev = b->pprev;
        hashmap_remove(&m->by_offset, b->mmap_offset);
        MODEL_COUNT(m->n_bufs, -1);
        if (b->charge_type)
                model_uncharge(m, b->owner, b->charge_type, b->charge);
        /* the engines' CPU view of it goes before its pages are punched out */
        model_gpuvm_forget(m, b);
        if (b->heap)
                heap_free(b->heap, b->heap_off, b->size, b->cpu_mapped);
        if (b->memfd >= 0) {
                buf_unindex_file(m, b);
                m->n_buffer_files--;
                close(b->memfd);
        }
        free(b->allowed);
        free(b);
}

ModelBuf *model_buf_by_fd(ThunkModel *m, int fd, int *err)
{
        struct stat st;

        if (fd < 0 || fstat(fd, &st) < 0) {
                *err = -EBADF;
                return NULL;
        }
        /* only buffers with a file of their own: no fd of a backing file ever leaves the model */
        for (ModelBuf *b = hashmap_get(&m->by_ino, ino_key(st.st_ino)); b; b = b->ino_next)
                if (b->dev == st.st_dev && b->ino == st.st_ino)
                        return b;
        *err = -EINVAL;
        return NULL;
}

/* Was @fd opened read-only? Then what imports it may only read, whatever the exporter could. */
bool model_fd_read_only(int fd)
{
        int fl = fcntl(fd, F_GETFL);
        return fl >= 0 && (fl & O_ACCMODE) == O_RDONLY;
}

/* A new open file of @b's memory: what a dmabuf fd is to its receiver. Read-only unless writable. */
int model_buf_export_fd(ThunkModel *m, ModelBuf *b, bool writable, uint32_t flags, int *ret_fd)
{
        char path[64];
        int fd, r;

        if (b->heap) {
                r = buf_make_shareable(m, b);
                if (r < 0)
                        return r;
        }
        if (b->memfd < 0)
                return -EPERM;
        if (writable) {
                /* like the kernel's exports of one dmabuf: another fd of the same open file */
                fd = fcntl(b->memfd, (flags & O_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 3);
                if (fd < 0)
                        return -errno;
                *ret_fd = fd;
                return 0;
        }
        /* read-only: a file of its own opened read-only, so the holder cannot map it writable */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", b->memfd);
        fd = open(path, (writable ? O_RDWR : O_RDONLY) | ((flags & O_CLOEXEC) ? O_CLOEXEC : 0));
        if (fd < 0)
                return -errno;
        *ret_fd = fd;
        return 0;
}

int model_heaps_init(ThunkModel *m)
{
        m->heaps = calloc(m->n_gpus, sizeof(*m->heaps));
        if (!m->heaps)
                return -ENOMEM;
        for (size_t g = 0; g < m->n_gpus; g++) {
                int r = heap_init(&m->heaps[g]);

                if (r < 0) {
                        while (g-- > 0)
                                heap_done(&m->heaps[g]);
                        free(m->heaps);
                        m->heaps = NULL;
                        return r;
                }
        }
        return 0;
}

void model_heaps_done(ThunkModel *m)
{
        for (size_t g = 0; m->heaps && g < m->n_gpus; g++)
                heap_done(&m->heaps[g]);
        free(m->heaps);
        m->heaps = NULL;
}

void model_heaps_stats(const ThunkModel *m, ThunkModelStats *s)
{
        for (size_t g = 0; g < m->n_gpus; g++) {
                const ModelHeap *h = &m->heaps[g];
                struct stat st;

                s->backing_files++;
                s->carved_bytes += h->used;
                s->backing_extent_bytes += h->end * MODEL_PAGE;
                if (fstat(h->fd, &st) == 0)
                        s->backing_resident_bytes += (uint64_t)st.st_blocks * 512;
        }
        s->buffer_files = m->n_buffer_files;
}

/* ------------------------------------------------------------------ GPU VMs */

static int vm_height(const ModelMapping *n)
{
        return n ? n->height : 0;
}

static ModelMapping *vm_fix(ModelMapping *n)
{
        int l = vm_height(n->left), r = vm_height(n->right);

        n->height = (l > r ? l : r) + 1;
        return n;
}

static ModelMapping *vm_rotate_right(ModelMapping *n)
{
        ModelMapping *l = n->left;

        n->left = l->right;
        l->right = vm_fix(n);
        return vm_fix(l);
}

static ModelMapping *vm_rotate_left(ModelMapping *n)
{
        ModelMapping *r = n->right;

        n->right = r->left;
        r->left = vm_fix(n);
        return vm_fix(r);
}

static ModelMapping *vm_balance(ModelMapping *n)
{
        int b = vm_height(n->left) - vm_height(n->right);

        if (b > 1) {
                if (vm_height(n->left->left) < vm_height(n->left->right))
                        n->left = vm_rotate_left(n->left);
                return vm_rotate_right(n);
        }
        if (b < -1) {
                if (vm_height(n->right->right) < vm_height(n->right->left))
                        n->right = vm_rotate_right(n->right);
                return vm_rotate_left(n);
        }
        return vm_fix(n);
}

static ModelMapping *vm_link(ModelMapping *n, ModelMapping *x)
{
        if (!n)
                return x;
        if (x->start < n->start)
                n->left = vm_link(n->left, x);
        else
                n->right = vm_link(n->right, x);
        return vm_balance(n);
}

/* Takes the leftmost node out of @n into *ret_min. Nodes are relinked, never copied: pointers stay good. */
static ModelMapping *vm_unlink_min(ModelMapping *n, ModelMapping **ret_min)
{
        if (!n->left) {
                *ret_min = n;
                return n->right;
        }
        n->left = vm_unlink_min(n->left, ret_min);
        return vm_balance(n);
}

static ModelMapping *vm_unlink(ModelMapping *n, const ModelMapping *x)
{
        ModelMapping *m = NULL, *r;

        if (!n)
                return NULL;
        if (x->start < n->start) {
                n->left = vm_unlink(n->left, x);
                return vm_balance(n);
        }
        if (x->start > n->start) {
                n->right = vm_unlink(n->right, x);
                return vm_balance(n);
        }
        /* starts are unique: mappings never overlap and are never empty */
        if (!n->right)
                return n->left;
        r = vm_unlink_min(n->right, &m);
        m->left = n->left;
        m->right = r;
        return vm_balance(m);
}

ModelMapping *model_vm_first_after(const ModelVm *vm, uint64_t addr)
{
        ModelMapping *best = NULL;

        for (ModelMapping *n = vm->root; n;) {
                if (n->end > addr) {
                        best = n;
                        n = n->left;
                } else {
                        n = n->right;
                }
        }
        return best;
}

ModelMapping *model_vm_next(const ModelVm *vm, const ModelMapping *mp)
{
        return model_vm_first_after(vm, mp->end);
}

bool model_vm_overlaps(const ModelVm *vm, uint64_t start, uint64_t end)
{
        const ModelMapping *mp = model_vm_first_after(vm, start);

        return mp && mp->start < end;
}

int model_vm_insert(ModelVm *vm, const ModelMapping *mp)
{
        ModelMapping *x;

        if (mp->end <= mp->start || model_vm_overlaps(vm, mp->start, mp->end))
                return -EINVAL;
        x = malloc(sizeof(*x));
        if (!x)
                return -ENOMEM;
        *x = *mp;
        x->left = x->right = NULL;
        x->height = 1;
        vm->root = vm_link(vm->root, x);
        vm->n++;
        if (vm->total)
                MODEL_COUNT(*vm->total, 1);
        return 0;
}

void model_vm_remove(ModelVm *vm, ModelMapping *mp)
{
        vm->root = vm_unlink(vm->root, mp);
        vm->n--;
        if (vm->total)
                MODEL_COUNT(*vm->total, -1);
        free(mp);
}

static void vm_free(ModelMapping *n)
{
        if (!n)
                return;
        vm_free(n->left);
        vm_free(n->right);
        free(n);
}

void model_vm_clear(ModelVm *vm)
{
        vm_free(vm->root);
        vm->root = NULL;
        if (vm->total)
                MODEL_COUNT(*vm->total, -(uint64_t)vm->n);
        vm->n = 0;
}

static bool vm_remove_mem(ModelVm *vm, const ModelMem *mem)
{
        /* a KFD mapping starts at its memory's VA: the first one to end after it */
        ModelMapping *mp = model_vm_first_after(vm, mem->va);

        if (mp && mp->mem == mem) {
                model_vm_remove(vm, mp);
                return true;
        }
        for (mp = model_vm_first_after(vm, 0); mp; mp = model_vm_next(vm, mp))
                if (mp->mem == mem) {
                        model_vm_remove(vm, mp);
                        return true;
                }
        return false;
}

/* ------------------------------------------------------------------ handles */

/* A handle of a context that is going away: out of every VM it was mapped in, then its memory dropped. */
void model_mem_destroy(ThunkModel *m, ModelCtx *c, ModelMem *mem)
{
        for (size_t g = 0; g < m->n_gpus; g++)
                if (mem->mapped & (1ULL << g)) {
                        if (c->pdd[g].file)
                                vm_remove_mem(&c->pdd[g].file->vm, mem);
                        mem->mapped &= ~(1ULL << g);
                }
        MODEL_COUNT(m->cnt.mems, -1);
        if (mem->import)
                MODEL_COUNT(m->cnt.imports, -1);
        model_buf_unref(m, mem->buf);
        free(mem);
}

/* ------------------------------------------------------------------ memory ioctls */

/* A handle of @b (one reference of it, taken over) in the process's table for GPU @idx: the render file may
 * then reach the buffer. On failure the reference is dropped. */
static int mem_new(Call *c, int idx, ModelBuf *b, ModelMem **ret)
{
        ModelMem *mem = calloc(1, sizeof(*mem));

        if (!mem || model_buf_allow(b, c->ctx->pdd[idx].file) < 0 ||
            model_idr_alloc(&c->ctx->pdd[idx], mem) < 0) {
                free(mem);
                model_buf_unref(c->m, b);
                return -ENOMEM;
        }
        MODEL_COUNT(c->m->cnt.mems, 1);
        *ret = mem;
        return 0;
}

int model_kfd_alloc_memory_of_gpu(Call *c)
{
        struct kfd_ioctl_alloc_memory_of_gpu_args *a = c->arg;
        ThunkModel *m = c->m;
        uint32_t flags = a->flags, type;
        uint64_t size = MODEL_PAGE_ALIGN(a->size);
        ModelCtx *svm_ctx = c->ctx->primary ? c->ctx : NULL;
        ModelMem *mem;
        ModelBuf *b = NULL;
        int idx, r;

        if (a->size == 0 || size < a->size)
                return -EINVAL;
        if (!c->ctx->primary && (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR))
                return -EOPNOTSUPP;
        if (svm_ctx && svm_ctx->n_svm) {
                r = model_svm_flush(m, svm_ctx);
                if (r < 0)
                        return r;
                if (model_svm_overlaps(svm_ctx, a->va_addr, a->va_addr + size))
                        return -EADDRINUSE;
                if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) &&
                    model_svm_overlaps(svm_ctx, a->mmap_offset, a->mmap_offset + size))
                        return -EADDRINUSE;
        }
        idx = model_gpu_index(m, a->gpu_id);
        if (idx < 0)
                return -EINVAL;
        if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC) && (flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM) &&
            !m->gpus[idx].large_bar)
                return -EINVAL;
        if (!c->ctx->pdd[idx].file)
                return -ENODEV;
        /* kfd_ioctl_alloc_memory_of_gpu() applies USERPTR's, else DOORBELL's, else MMIO_REMAP's rule by
         * its bit, whatever domain the BO then gets (VRAM | DOORBELL is a VRAM BO of the doorbell size) */
        if (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                if (a->mmap_offset & (MODEL_PAGE - 1))
                        return -EINVAL;
        } else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL) {
                if (a->size != MODEL_DOORBELL_SLICE)
                        return -EINVAL;
        } else if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP) && a->size != MODEL_PAGE) {
                return -EINVAL;
        }

        if (flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
                type = m->gpus[idx].apu ? KFD_IOC_ALLOC_MEM_FLAGS_GTT : KFD_IOC_ALLOC_MEM_FLAGS_VRAM;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT)
                type = KFD_IOC_ALLOC_MEM_FLAGS_GTT;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                type = KFD_IOC_ALLOC_MEM_FLAGS_USERPTR;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)
                type = KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL;
        else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                type = KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP;
        else
                return -EINVAL;

        /* the GPUVM allocator wants a user address only for what becomes a userptr BO */
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR && a->mmap_offset == 0)
                return -EINVAL;

        r = model_charge(m, idx, type, size);
        if (r < 0)
                return r;
        /* pinning the user pages fails if they are not mapped (a VMA walk, not a read of the maps file) */
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR &&
            !model_cpu_range_mapped(a->mmap_offset, a->mmap_offset + size)) {
                model_uncharge(m, idx, type, size);
                return -EFAULT;
        }
        r = buf_new(m, idx, type, flags, size, &b);
        if (r < 0) {
                model_uncharge(m, idx, type, size);
                return r;
        }
        b->charge = size;
        b->charge_type = type;
        if (type == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
                b->userptr = a->mmap_offset;
        r = mem_new(c, idx, b, &mem);
        if (r < 0)
                return r;
        mem->buf = b;
        mem->va = a->va_addr;
        mem->flags = flags;
        mem->gpu = idx;
        a->handle = THUNK_KFD_HANDLE(a->gpu_id, mem->idr);
        if (flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                a->mmap_offset = THUNK_KFD_MMAP_TYPE_MMIO | THUNK_KFD_MMAP_GPU_ID(a->gpu_id);
        else
                a->mmap_offset = b->mmap_offset;
        return 0;
}

int model_kfd_free_memory_of_gpu(Call *c)
{
        struct kfd_ioctl_free_memory_of_gpu_args *a = c->arg;
        int idx = model_gpu_index(c->m, THUNK_KFD_HANDLE_GPU(a->handle));
        ModelMem *mem;

        if (idx < 0)
                return -EINVAL;
        mem = model_idr_find(&c->ctx->pdd[idx], THUNK_KFD_HANDLE_IDR(a->handle));
        if (!mem)
                return -EINVAL;
        if (model_is_event_page(c->ctx, a->handle))
                return -EPERM;
        if (mem->mapped)
                return -EBUSY;
        c->ctx->pdd[idx].idr[mem->idr] = NULL;
        MODEL_COUNT(c->m->cnt.mems, -1);
        if (mem->import)
                MODEL_COUNT(c->m->cnt.imports, -1);
        if (mem->idr < c->ctx->pdd[idx].idr_hint)
                c->ctx->pdd[idx].idr_hint = mem->idr;
        model_buf_unref(c->m, mem->buf);
        free(mem);
        return 0;
}

/* May GPU @g reach @b's memory? Peer VRAM needs the same XGMI hive or the owner's large BAR. */
static bool peer_accessible(const ThunkModel *m, const ModelBuf *b, int g)
{
        const ModelGpu *own = &m->gpus[b->owner], *tgt = &m->gpus[g];

        if (b->owner == g || tgt->apu || b->foreign)
                return true;
        if (b->type != KFD_IOC_ALLOC_MEM_FLAGS_VRAM && b->type != KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL &&
            b->type != KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                return true;
        if (own->hive_id && own->hive_id == tgt->hive_id)
                return true;
        return own->large_bar;
}

static int map_common(Call *c, bool map)
{
        struct kfd_ioctl_map_memory_to_gpu_args *a = c->arg; /* unmap has the same layout */
        const uint32_t *ids = (const uint32_t *)(uintptr_t)a->device_ids_array_ptr;
        ThunkModel *m = c->m;
        ModelMem *mem;
        int idx, r;

        if (a->n_devices == 0 || a->n_success > a->n_devices)
                return -EINVAL;
        if (!ids)
                return -EFAULT;
        /* MAP binds the process to the handle's device and to each target; kfd_ioctl_unmap_memory_from_gpu()
         * binds none: a device without a VM just has nothing mapped */
        if (map) {
                r = model_bind_pdd(c, THUNK_KFD_HANDLE_GPU(a->handle), &idx);
                if (r < 0)
                        return r;
        } else {
                idx = model_gpu_index(m, THUNK_KFD_HANDLE_GPU(a->handle));
                if (idx < 0)
                        return -EINVAL;
        }
        mem = model_idr_find(&c->ctx->pdd[idx], THUNK_KFD_HANDLE_IDR(a->handle));
        if (!mem)
                return -ENOMEM;
        for (uint32_t i = a->n_success; i < a->n_devices; i++) {
                int g = model_gpu_index(m, ids[i]);
                ModelFile *f;

                if (g < 0)
                        return -EINVAL;
                f = c->ctx->pdd[g].file;
                if (!f)
                        return map ? -ENODEV : -EINVAL;
                if (map) {
                        if (!(mem->mapped & (1ULL << g))) {
                                ModelMapping mp = {.start = mem->va,
                                                   .end = mem->va + mem->buf->size,
                                                   .buf = mem->buf,
                                                   .mem = mem};

                                if (!peer_accessible(m, mem->buf, g))
                                        return -EINVAL;
                                if (mem->va == 0 || (mem->va & (MODEL_PAGE - 1)) || mp.end > MODEL_VM_END ||
                                    mp.end < mp.start)
                                        return -EINVAL;
                                r = model_vm_insert(&f->vm, &mp);
                                if (r < 0)
                                        return r;
                                mem->mapped |= 1ULL << g;
                        }
                } else {
                        if (!(mem->mapped & (1ULL << g)))
                                return -EINVAL;
                        vm_remove_mem(&f->vm, mem);
                        mem->mapped &= ~(1ULL << g);
                }
                a->n_success = i + 1;
        }
        return 0;
}

int model_kfd_map_memory_to_gpu(Call *c)
{
        return map_common(c, true);
}

int model_kfd_unmap_memory_from_gpu(Call *c)
{
        return map_common(c, false);
}

int model_kfd_get_dmabuf_info(Call *c)
{
        struct kfd_ioctl_get_dmabuf_info_args *a = c->arg;
        int err = 0;
        ModelBuf *b = model_buf_by_fd(c->m, (int)a->dmabuf_fd, &err);

        if (!b)
                return err;
        if (b->foreign || (b->type != KFD_IOC_ALLOC_MEM_FLAGS_VRAM && b->type != KFD_IOC_ALLOC_MEM_FLAGS_GTT))
                return -EINVAL;
        /* the model keeps no metadata: any buffer (even none) is large enough */
        a->metadata_size = 0;
        a->size = b->size;
        a->gpu_id = c->m->gpus[b->owner].gpu_id;
        a->flags = b->type;
        if (b->type == KFD_IOC_ALLOC_MEM_FLAGS_VRAM && (b->flags & KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC))
                a->flags |= KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC;
        return 0;
}

/* A memfd that is not one of ours: accepted like a foreign dmabuf on kernels that import through DRM
 * PRIME (ABI >= 15 in the model), as a GTT buffer of its size. */
static int import_foreign(ThunkModel *m, int fd, int owner, ModelBuf **ret)
{
        struct stat st;
        ModelBuf *b;
        int dup_fd, r;

        if (m->minor < 15 || fcntl(fd, F_GET_SEALS) < 0 || fstat(fd, &st) < 0 || st.st_size <= 0)
                return -EINVAL;
        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (dup_fd < 0) {
                free(b);
                return -errno;
        }
        b->refs = 1;
        b->size = MODEL_PAGE_ALIGN((uint64_t)st.st_size);
        b->type = KFD_IOC_ALLOC_MEM_FLAGS_GTT;
        b->flags = KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
        b->owner = owner;
        b->foreign = true;
        r = buf_take_file(m, b, dup_fd, &st);
        if (r < 0) {
                close(dup_fd);
                free(b);
                return r;
        }
        r = buf_link(m, b);
        if (r < 0) {
                buf_unindex_file(m, b);
                m->n_buffer_files--;
                close(dup_fd);
                free(b);
                return r;
        }
        *ret = b;
        return 0;
}

int model_kfd_import_dmabuf(Call *c)
{
        struct kfd_ioctl_import_dmabuf_args *a = c->arg;
        ThunkModel *m = c->m;
        ModelBuf *b = NULL;
        ModelMem *mem;
        int idx, r, err = 0;

        r = model_bind_pdd(c, a->gpu_id, &idx);
        if (r < 0)
                return r;
        b = model_buf_by_fd(m, (int)a->dmabuf_fd, &err);
        if (!b) {
                if (err != -EINVAL)
                        return err;
                r = import_foreign(m, (int)a->dmabuf_fd, idx, &b);
                if (r < 0)
                        return r;
        } else {
                if (b->type != KFD_IOC_ALLOC_MEM_FLAGS_VRAM && b->type != KFD_IOC_ALLOC_MEM_FLAGS_GTT)
                        return -EINVAL;
                b->refs++;
        }
        r = mem_new(c, idx, b, &mem);
        if (r < 0)
                return r;
        mem->buf = b;
        mem->va = a->va_addr;
        /* the kernel marks every import writable; the model keeps what the dmabuf file allows, so that a
         * read-only export stays read-only in every importer's GPU mappings */
        mem->flags = b->type | KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE;
        if (!model_fd_read_only((int)a->dmabuf_fd) &&
            (b->foreign || (b->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)))
                mem->flags |= KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
        mem->gpu = idx;
        mem->import = true;
        MODEL_COUNT(c->m->cnt.imports, 1);
        a->handle = THUNK_KFD_HANDLE(a->gpu_id, mem->idr);
        return 0;
}

int thunk_model_adopt(ThunkModel *m, int fd, uint32_t gpu_id, uint32_t kfd_flags)
{
        const int needed = F_SEAL_SHRINK | F_SEAL_GROW;
        ModelBuf *b = NULL;
        struct stat st;
        int idx, seals, dup_fd, err = 0, r;
        uint32_t type;

        model_lock(m);
        idx = model_gpu_index(m, gpu_id);
        seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
        r = idx < 0 || seals < 0 || (seals & needed) != needed || fstat(fd, &st) < 0 ||
                            !S_ISREG(st.st_mode) || st.st_size <= 0 || (st.st_size & (MODEL_PAGE - 1))
                    ? -EINVAL
                    : 0;
        if (r == 0 && model_buf_by_fd(m, fd, &err))
                r = -EEXIST;
        if (r < 0)
                goto out;
        /* GTT when asked for, else the GPU's own memory (GTT on an APU) */
        type = (kfd_flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT) || m->gpus[idx].apu ? KFD_IOC_ALLOC_MEM_FLAGS_GTT
                                                                             : KFD_IOC_ALLOC_MEM_FLAGS_VRAM;
        r = model_charge(m, idx, type, (uint64_t)st.st_size);
        if (r < 0)
                goto out;
        b = calloc(1, sizeof(*b));
        dup_fd = b ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;
        if (dup_fd < 0) {
                r = b ? -errno : -ENOMEM;
                free(b);
                model_uncharge(m, idx, type, (uint64_t)st.st_size);
                goto out;
        }
        b->refs = 1;
        b->adopted = true;
        b->size = (uint64_t)st.st_size;
        b->type = type;
        b->flags =
                (kfd_flags & ~(uint32_t)(KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)) | type;
        b->owner = idx;
        b->charge = b->size;
        b->charge_type = type;
        r = buf_take_file(m, b, dup_fd, &st);
        if (r == 0) {
                r = buf_link(m, b);
                if (r < 0) {
                        buf_unindex_file(m, b);
                        m->n_buffer_files--;
                }
        }
        if (r < 0) {
                close(dup_fd);
                free(b);
                model_uncharge(m, idx, type, (uint64_t)st.st_size);
        }
out:
        model_unlock(m);
        return r;
}

void thunk_model_adopt_release(ThunkModel *m, int fd)
{
        int err = 0;
        ModelBuf *b;

        model_lock(m);
        b = model_buf_by_fd(m, fd, &err);
        if (b && b->adopted) {
                b->adopted = false;
                model_buf_unref(m, b);
        }
        model_unlock(m);
}

int thunk_model_seal(ThunkModel *m, int fd)
{
        struct stat st;
        int r = 0;

        if (fstat(fd, &st) < 0)
                return -errno;
        pthread_mutex_lock(&m->lock);
        for (ModelBuf *b = hashmap_get(&m->by_ino, ino_key(st.st_ino)); b && r == 0; b = b->ino_next)
                if (b->dev == st.st_dev && b->ino == st.st_ino)
                        r = model_gpuvm_hold(m, b);
        /* then sealed through the model's own fd, which is writable where the caller's may not be (the
         * fd of a read-only allocation is opened read-only) */
        for (ModelBuf *b = hashmap_get(&m->by_ino, ino_key(st.st_ino)); b && r == 0; b = b->ino_next)
                if (b->dev == st.st_dev && b->ino == st.st_ino &&
                    fcntl(b->memfd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) == 0)
                        break;
        pthread_mutex_unlock(&m->lock);
        return r;
}

int model_kfd_export_dmabuf(Call *c)
{
        struct kfd_ioctl_export_dmabuf_args *a = c->arg;
        int idx = model_gpu_index(c->m, THUNK_KFD_HANDLE_GPU(a->handle));
        ModelMem *mem;
        int fd, r;

        if (idx < 0)
                return -EINVAL;
        mem = model_idr_find(&c->ctx->pdd[idx], THUNK_KFD_HANDLE_IDR(a->handle));
        if (!mem)
                return -EINVAL;
        r = model_buf_export_fd(c->m, mem->buf, (mem->flags & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE) != 0,
                                a->flags, &fd);
        if (r < 0)
                return r;
        a->dmabuf_fd = (uint32_t)fd;
        return 0;
}
int model_kfd_available_memory(Call *c)
{
        struct kfd_ioctl_get_available_memory_args *a = c->arg;
        int idx = model_gpu_index(c->m, a->gpu_id);

        if (idx < 0)
                return -EINVAL;
        a->available = available_memory(c->m, idx);
        return 0;
}
