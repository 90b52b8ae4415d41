/* A driver for tests of the broker alone: its own books of what it was asked, memfds for files, failures on
 * demand. */
#include "driver-fake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "macro.h"

#define FAKE_PAGE 4096ull
/* the names of its memory files: what tells them from any other file, in this driver or the next one */
#define FAKE_FILE_PREFIX "fake-"

typedef struct FakeCtx {
        unsigned id; /* 0: the primary one */
        bool live;
} FakeCtx;

struct DriverMem {
        FakeMemKind kind;
        FakeCtx *ctx;
        uint32_t gpu_id;
        uint64_t va, size;
        uint32_t flags;
        uint64_t mapped;
        unsigned grants;
        int fd; /* its memory's file, -1 until it needs one; an import's copy of the fd it was given */
        bool read_only;
        bool live;
};

struct DriverGrant {
        DriverMem *m;
        FakeCtx *ctx;
        uint32_t gpu_id;
        uint64_t va, size;
        bool live;
};

typedef struct FakeRange {
        uint64_t va, size;
        uint32_t flags;
        uint32_t attrs[FAKE_SVM_ATTRS]; /* the last value set of each type */
} FakeRange;

typedef struct FakeFault {
        unsigned nth; /* 0: none armed */
        int err;
} FakeFault;

typedef struct FakeDriver {
        Driver base;
        FakeConfig cfg;
        FakeCtx primary;
        /* everything made, live or not: a pointer the broker passes is checked against these (freed ones are
         * kept until the driver closes, so that a use after free is seen, not undefined) */
        FakeCtx **ctxs;
        size_t n_ctxs;
        DriverMem **mems;
        size_t n_mems;
        DriverGrant **grants;
        size_t n_grants;
        FakeRange *ranges;
        size_t n_ranges;
        unsigned next_ctx;
        uint64_t released_with_ctx;
        uint64_t calls[_FAKE_OP_MAX];
        FakeFault faults[_FAKE_OP_MAX];
        uint64_t faults_fired;
        uint64_t violations;
        char violation[256];
} FakeDriver;

static const char *const op_names[_FAKE_OP_MAX] = {
        [FAKE_OP_CTX_NEW] = "ctx_new",
        [FAKE_OP_AVAILABLE] = "available_memory",
        [FAKE_OP_ALLOC_VRAM] = "alloc_vram",
        [FAKE_OP_REGISTER_HOST] = "register_host",
        [FAKE_OP_ALLOC_GTT] = "alloc_gtt",
        [FAKE_OP_IMPORT] = "import",
        [FAKE_OP_ADOPT] = "adopt",
        [FAKE_OP_FREE] = "free",
        [FAKE_OP_MAP] = "map",
        [FAKE_OP_UNMAP] = "unmap",
        [FAKE_OP_UNMAP_ALL] = "unmap_all",
        [FAKE_OP_EXPORT] = "export",
        [FAKE_OP_GRANT] = "grant",
        [FAKE_OP_REVOKE] = "revoke",
        [FAKE_OP_MANAGED_REGISTER] = "managed_register",
        [FAKE_OP_CPU_UNMAP] = "cpu_unmap",
        [FAKE_OP_SVM_SET] = "svm_set",
        [FAKE_OP_SVM_GET] = "svm_get",
};

static FakeDriver *fk(Driver *d)
{
        return (FakeDriver *)d;
}

static const FakeDriver *cfk(const Driver *d)
{
        return (const FakeDriver *)d;
}

/* A breach of the seam's contract by the caller: counted, the first one kept for the test to show. */
static void breach(FakeDriver *f, const char *fmt, ...) _printf_(2, 3);
static void breach(FakeDriver *f, const char *fmt, ...)
{
        va_list ap;

        if (f->violations++ == 0) {
                va_start(ap, fmt);
                vsnprintf(f->violation, sizeof(f->violation), fmt, ap);
                va_end(ap);
        }
}

/* Every operation starts here: counted, and failed when a test armed this call. */
static int enter(FakeDriver *f, FakeOp op)
{
        FakeFault *ft = &f->faults[op];

        f->calls[op]++;
        if (ft->nth && --ft->nth == 0) {
                f->faults_fired++;
                return ft->err;
        }
        return 0;
}

static int gpu_index(const FakeDriver *f, uint32_t gpu_id)
{
        for (size_t i = 0; i < f->cfg.n_gpus; i++)
                if (f->cfg.gpu_ids[i] == gpu_id)
                        return (int)i;
        return -1;
}

static bool append(void *arrayp, size_t *n, void *item)
{
        void ***a = arrayp;
        void **more = realloc(*a, (*n + 1) * sizeof(**a));

        if (!more)
                return false;
        more[(*n)++] = item;
        *a = more;
        return true;
}

static bool ctx_known(const FakeDriver *f, const FakeCtx *c)
{
        if (c == &f->primary)
                return true;
        for (size_t i = 0; i < f->n_ctxs; i++)
                if (f->ctxs[i] == c)
                        return c->live;
        return false;
}

/* Is @m memory this driver made and has not freed? A breach otherwise, named after @what. */
static bool mem_ok(FakeDriver *f, const DriverMem *m, const char *what)
{
        for (size_t i = 0; i < f->n_mems; i++)
                if (f->mems[i] == m) {
                        if (!m->live)
                                breach(f, "%s of memory freed already", what);
                        return m->live;
                }
        breach(f, "%s of memory this driver never made", what);
        return false;
}

static bool overlaps(uint64_t a, uint64_t as, uint64_t b, uint64_t bs)
{
        return a < b + bs && b < a + as;
}

/* A new memory file of @size bytes, named as this driver's. */
static int file_new(const char *kind, uint64_t size)
{
        char name[32];
        int fd;

        snprintf(name, sizeof(name), FAKE_FILE_PREFIX "%s", kind);
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING); /* a read-only export seals it */
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t)size) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

bool fake_file_is_own(int fd)
{
        char path[64], target[256];
        ssize_t n;

        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = readlink(path, target, sizeof(target) - 1);
        if (n < 0)
                return false;
        target[n] = 0;
        return strncmp(target, "/memfd:" FAKE_FILE_PREFIX, strlen("/memfd:" FAKE_FILE_PREFIX)) == 0;
}

/* Check a placement at [va, va+size) of @ctx: two live objects of one context never share an address. */
static void check_place(FakeDriver *f, const FakeCtx *ctx, uint64_t va, uint64_t size)
{
        if (!va)
                return;
        if (va % FAKE_PAGE || size % FAKE_PAGE)
                breach(f, "memory placed at 0x%llx+0x%llx, not in pages", (unsigned long long)va,
                       (unsigned long long)size);
        for (size_t i = 0; i < f->n_mems; i++) {
                const DriverMem *o = f->mems[i];
                if (o->live && o->ctx == ctx && o->va && overlaps(va, size, o->va, o->size))
                        breach(f, "memory placed at 0x%llx+0x%llx over memory at 0x%llx+0x%llx of context %u",
                               (unsigned long long)va, (unsigned long long)size, (unsigned long long)o->va,
                               (unsigned long long)o->size, ctx->id);
        }
}

static DriverMem *mem_new(FakeDriver *f, FakeMemKind kind, FakeCtx *ctx, uint32_t gpu_id, uint64_t va,
                          uint64_t size, uint32_t flags)
{
        DriverMem *m = calloc(1, sizeof(*m));

        if (!m)
                return NULL;
        *m = (DriverMem){.kind = kind,
                         .ctx = ctx,
                         .gpu_id = gpu_id,
                         .va = va,
                         .size = size,
                         .flags = flags,
                         .fd = -1,
                         .live = true};
        if (!append(&f->mems, &f->n_mems, m)) {
                free(m);
                return NULL;
        }
        return m;
}

static uint64_t vram_used(const FakeDriver *f, uint32_t gpu_id)
{
        uint64_t used = 0;

        for (size_t i = 0; i < f->n_mems; i++) {
                const DriverMem *m = f->mems[i];
                if (m->live && m->kind == FAKE_MEM_VRAM && m->gpu_id == gpu_id)
                        used += m->size;
        }
        return used;
}

/* ---- the seam ---------------------------------------------------------------------------------------- */

static Driver *f_close(Driver *d)
{
        FakeDriver *f = fk(d);

        for (size_t i = 0; i < f->n_mems; i++) {
                safe_close(f->mems[i]->fd);
                free(f->mems[i]);
        }
        for (size_t i = 0; i < f->n_grants; i++)
                free(f->grants[i]);
        for (size_t i = 0; i < f->n_ctxs; i++)
                free(f->ctxs[i]);
        free(f->mems);
        free(f->grants);
        free(f->ctxs);
        free(f->ranges);
        free(f);
        return NULL;
}

static void f_version(const Driver *d, uint32_t *ret_major, uint32_t *ret_minor)
{
        (void)d;
        *ret_major = 1;
        *ret_minor = 0;
}

static unsigned f_caps(const Driver *d)
{
        return cfk(d)->cfg.caps;
}

/* Nothing of a topology is asked of a driver the broker alone uses. */
static const ThunkTopology *f_topology(const Driver *d)
{
        (void)d;
        return NULL;
}

static size_t f_gpu_count(const Driver *d)
{
        return cfk(d)->cfg.n_gpus;
}

static int f_gpu(const Driver *d, size_t index, DriverGpu *ret)
{
        const FakeDriver *f = cfk(d);

        if (index >= f->cfg.n_gpus)
                return -ENODEV;
        *ret = (DriverGpu){.gpu_id = f->cfg.gpu_ids[index],
                           .vram_bytes = f->cfg.vram_bytes,
                           .numa_node = -1,
                           .alloc_granularity = f->cfg.granularity};
        return 0;
}

static void f_svm_aperture(const Driver *d, uint64_t *ret_base, uint64_t *ret_limit)
{
        (void)d;
        *ret_base = FAKE_PAGE;
        *ret_limit = (1ull << 47) - 1;
}

static DriverCtx *f_ctx_primary(Driver *d)
{
        return (DriverCtx *)(void *)&fk(d)->primary;
}

static int f_ctx_new(Driver *d, DriverCtx **ret)
{
        FakeDriver *f = fk(d);
        FakeCtx *c;
        int r;

        if ((r = enter(f, FAKE_OP_CTX_NEW)) < 0)
                return r;
        if (!(f->cfg.caps & DRIVER_CAP_PRIVATE_VM))
                return -EOPNOTSUPP;
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->id = ++f->next_ctx;
        c->live = true;
        if (!append(&f->ctxs, &f->n_ctxs, c)) {
                free(c);
                return -ENOMEM;
        }
        *ret = (DriverCtx *)(void *)c;
        return 0;
}

static void grant_drop(DriverGrant *g)
{
        g->live = false;
        g->m->grants--;
}

static void mem_drop(DriverMem *m)
{
        m->live = false;
        m->fd = safe_close(m->fd);
}

/* What the context still holds goes with it, as a KFD process's memory goes when its fd closes. */
static void f_ctx_free(Driver *d, DriverCtx *ctx)
{
        FakeDriver *f = fk(d);
        FakeCtx *c = (FakeCtx *)(void *)ctx;

        if (!c || c == &f->primary)
                return;
        if (!ctx_known(f, c)) {
                breach(f, "free of a context that is not one");
                return;
        }
        for (size_t i = 0; i < f->n_grants; i++)
                if (f->grants[i]->live && f->grants[i]->ctx == c) {
                        grant_drop(f->grants[i]);
                        f->released_with_ctx++;
                }
        for (size_t i = 0; i < f->n_mems; i++)
                if (f->mems[i]->live && f->mems[i]->ctx == c) {
                        /* its grants in other contexts go with it */
                        for (size_t k = 0; k < f->n_grants; k++)
                                if (f->grants[k]->live && f->grants[k]->m == f->mems[i]) {
                                        grant_drop(f->grants[k]);
                                        f->released_with_ctx++;
                                }
                        mem_drop(f->mems[i]);
                        f->released_with_ctx++;
                }
        c->live = false;
}

static int f_available_memory(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t *ret_bytes)
{
        FakeDriver *f = fk(d);
        uint64_t used;
        int r;

        if ((r = enter(f, FAKE_OP_AVAILABLE)) < 0)
                return r;
        if (ctx && !ctx_known(f, (FakeCtx *)(void *)ctx))
                breach(f, "available memory of a context that is not one");
        if (gpu_index(f, gpu_id) < 0)
                return -EINVAL;
        used = vram_used(f, gpu_id);
        *ret_bytes = used < f->cfg.vram_bytes ? f->cfg.vram_bytes - used : 0;
        return 0;
}

/* Device memory or GTT in @ctx: its file from the allocation where it is host visible. */
static int alloc_in(FakeDriver *f, FakeMemKind kind, DriverCtx *ctx, uint32_t gpu_id, uint64_t va,
                    uint64_t size, uint32_t flags, DriverMem **ret)
{
        FakeCtx *c = (FakeCtx *)(void *)ctx;
        DriverMem *m;

        if (!ctx_known(f, c)) {
                breach(f, "allocation in a context that is not one");
                return -EINVAL;
        }
        if (gpu_index(f, gpu_id) < 0 || size == 0 || size % FAKE_PAGE)
                return -EINVAL;
        if (kind == FAKE_MEM_VRAM && vram_used(f, gpu_id) + size > f->cfg.vram_bytes)
                return -ENOMEM;
        check_place(f, c, va, size);
        m = mem_new(f, kind, c, gpu_id, va, size, flags);
        if (!m)
                return -ENOMEM;
        if (kind == FAKE_MEM_GTT || (flags & DRIVER_MEM_HOST_VISIBLE)) {
                m->fd = file_new(kind == FAKE_MEM_GTT ? "gtt" : "vram", size);
                if (m->fd < 0) {
                        int r = m->fd;
                        mem_drop(m);
                        return r;
                }
        }
        *ret = m;
        return 0;
}

static int f_mem_alloc_vram(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                            uint32_t flags, DriverMem **ret)
{
        FakeDriver *f = fk(d);
        int r;

        if ((r = enter(f, FAKE_OP_ALLOC_VRAM)) < 0)
                return r;
        return alloc_in(f, FAKE_MEM_VRAM, ctx, gpu_id, va, size, flags, ret);
}

static int f_mem_register_host(Driver *d, uint32_t gpu_id, uint64_t va, uint64_t size, uint32_t flags,
                               DriverMem **ret)
{
        FakeDriver *f = fk(d);
        unsigned char vec;
        DriverMem *m;
        int r;

        if ((r = enter(f, FAKE_OP_REGISTER_HOST)) < 0)
                return r;
        if (gpu_index(f, gpu_id) < 0 || !va || size == 0 || size % FAKE_PAGE)
                return -EINVAL;
        /* the daemon's own pages, mapped there and populated */
        if (mincore((void *)(uintptr_t)va, FAKE_PAGE, &vec) < 0 || !(vec & 1))
                breach(f, "host memory at 0x%llx registered without its pages", (unsigned long long)va);
        check_place(f, &f->primary, va, size);
        m = mem_new(f, FAKE_MEM_HOST, &f->primary, gpu_id, va, size, flags);
        if (!m)
                return -ENOMEM;
        *ret = m;
        return 0;
}

static int f_mem_alloc_gtt(Driver *d, DriverCtx *ctx, uint32_t gpu_id, uint64_t va, uint64_t size,
                           uint32_t flags, DriverMem **ret)
{
        FakeDriver *f = fk(d);
        int r;

        if ((r = enter(f, FAKE_OP_ALLOC_GTT)) < 0)
                return r;
        return alloc_in(f, FAKE_MEM_GTT, ctx, gpu_id, va, size, flags, ret);
}

/* A copy of @fd for memory that holds it: its size in pages, read-only when the fd is. */
static int hold_file(int fd, int *ret_fd, uint64_t *ret_size, bool *ret_read_only)
{
        struct stat st;
        int fl, copy;

        if (fstat(fd, &st) < 0 || (fl = fcntl(fd, F_GETFL)) < 0)
                return -EBADF;
        if (!S_ISREG(st.st_mode) || st.st_size <= 0)
                return -EINVAL;
        copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (copy < 0)
                return -errno;
        *ret_fd = copy;
        *ret_size = ((uint64_t)st.st_size + FAKE_PAGE - 1) & ~(FAKE_PAGE - 1);
        *ret_read_only = (fl & O_ACCMODE) == O_RDONLY;
        return 0;
}

static int f_mem_import(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, DriverMem **ret)
{
        FakeDriver *f = fk(d);
        FakeCtx *c = (FakeCtx *)(void *)ctx;
        uint64_t size = 0;
        bool ro = false;
        DriverMem *m;
        int fd = -1, r;

        if ((r = enter(f, FAKE_OP_IMPORT)) < 0)
                return r;
        if (!ctx_known(f, c)) {
                breach(f, "import into a context that is not one");
                return -EINVAL;
        }
        if (gpu_index(f, gpu_id) < 0)
                return -EINVAL;
        if ((r = hold_file(dmabuf_fd, &fd, &size, &ro)) < 0)
                return r;
        m = mem_new(f, FAKE_MEM_IMPORT, c, gpu_id, 0, size, ro ? DRIVER_MEM_READ_ONLY : 0);
        if (!m) {
                close(fd);
                return -ENOMEM;
        }
        m->fd = fd;
        m->read_only = ro;
        *ret = m;
        return 0;
}

/* After a restart: a file of this driver's kind, of the size it was, taken back at @va. */
static int adopt(FakeDriver *f, FakeMemKind kind, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                 uint64_t size, uint32_t flags, DriverMem **ret)
{
        FakeCtx *c = (FakeCtx *)(void *)ctx;
        uint64_t fsize = 0;
        bool ro = false;
        DriverMem *m;
        int fd = -1, r;

        if ((r = enter(f, FAKE_OP_ADOPT)) < 0)
                return r;
        if (!ctx_known(f, c)) {
                breach(f, "memory taken back into a context that is not one");
                return -EINVAL;
        }
        if (gpu_index(f, gpu_id) < 0 || !fake_file_is_own(dmabuf_fd))
                return -EINVAL;
        if ((r = hold_file(dmabuf_fd, &fd, &fsize, &ro)) < 0)
                return r;
        if (fsize != size) {
                close(fd);
                return -EINVAL;
        }
        check_place(f, c, va, size);
        m = mem_new(f, kind, c, gpu_id, va, size, flags);
        if (!m) {
                close(fd);
                return -ENOMEM;
        }
        m->fd = fd;
        *ret = m;
        return 0;
}

static int f_mem_adopt_vram(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                            uint64_t size, uint32_t flags, DriverMem **ret)
{
        return adopt(fk(d), FAKE_MEM_VRAM, ctx, dmabuf_fd, gpu_id, va, size, flags, ret);
}

static int f_mem_adopt_gtt(Driver *d, DriverCtx *ctx, int dmabuf_fd, uint32_t gpu_id, uint64_t va,
                           uint64_t size, uint32_t flags, DriverMem **ret)
{
        return adopt(fk(d), FAKE_MEM_GTT, ctx, dmabuf_fd, gpu_id, va, size, flags, ret);
}

static int f_mem_free(Driver *d, DriverMem *m)
{
        FakeDriver *f = fk(d);
        int r;

        if (!mem_ok(f, m, "free"))
                return -EINVAL;
        if ((r = enter(f, FAKE_OP_FREE)) < 0)
                return r;
        /* "Free memory no GPU maps any more" */
        if (m->mapped)
                breach(f, "free of memory at 0x%llx still mapped on GPUs 0x%llx", (unsigned long long)m->va,
                       (unsigned long long)m->mapped);
        if (m->grants)
                breach(f, "free of memory with %u grants in force", m->grants);
        mem_drop(m);
        return 0;
}

static uint64_t f_mem_size(const Driver *d, const DriverMem *m)
{
        (void)d;
        return m->size;
}

/* The GPUs listed, as a mask; -EINVAL for one the driver has not. */
static int gpu_mask(const FakeDriver *f, const uint32_t *gpu_ids, size_t n, uint64_t *ret)
{
        uint64_t mask = 0;

        for (size_t i = 0; i < n; i++) {
                int gi = gpu_index(f, gpu_ids[i]);
                if (gi < 0)
                        return -EINVAL;
                mask |= 1ull << gi;
        }
        *ret = mask;
        return 0;
}

static int f_mem_map(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        FakeDriver *f = fk(d);
        uint64_t mask;
        int r;

        if (!mem_ok(f, m, "map"))
                return -EINVAL;
        if ((r = enter(f, FAKE_OP_MAP)) < 0)
                return r;
        if (m->kind == FAKE_MEM_IMPORT || !m->va)
                breach(f, "map of memory that has no VA of its own");
        if ((r = gpu_mask(f, gpu_ids, n, &mask)) < 0)
                return r;
        m->mapped |= mask;
        return 0;
}

static int f_mem_unmap(Driver *d, DriverMem *m, const uint32_t *gpu_ids, size_t n)
{
        FakeDriver *f = fk(d);
        uint64_t mask;
        int r;

        if (!mem_ok(f, m, "unmap"))
                return -EINVAL;
        if ((r = enter(f, FAKE_OP_UNMAP)) < 0)
                return r;
        if ((r = gpu_mask(f, gpu_ids, n, &mask)) < 0)
                return r;
        if ((m->mapped & mask) != mask)
                return -EINVAL; /* as KFD: not mapped there */
        m->mapped &= ~mask;
        return 0;
}

static int f_mem_unmap_all(Driver *d, DriverMem *m)
{
        FakeDriver *f = fk(d);
        int r;

        if (!mem_ok(f, m, "unmap"))
                return -EINVAL;
        if ((r = enter(f, FAKE_OP_UNMAP_ALL)) < 0)
                return r;
        m->mapped = 0;
        return 0;
}

static bool f_mem_is_mapped(const Driver *d, const DriverMem *m, uint32_t gpu_id)
{
        int gi = gpu_index(cfk(d), gpu_id);
        return gi >= 0 && (m->mapped & (1ull << gi));
}

static uint64_t f_mem_mapped_mask(const Driver *d, const DriverMem *m)
{
        (void)d;
        return m->mapped;
}

/* The file of device memory that can be shared: made the first time it is needed. */
static int mem_file(DriverMem *m)
{
        if (m->fd < 0 && m->kind == FAKE_MEM_VRAM)
                m->fd = file_new("vram", m->size);
        return m->fd < 0 ? (m->kind == FAKE_MEM_HOST ? -EINVAL : m->fd) : 0;
}

static int f_mem_export(Driver *d, DriverMem *m, int *ret_fd)
{
        FakeDriver *f = fk(d);
        int r;

        if (!mem_ok(f, m, "export"))
                return -EINVAL;
        if ((r = enter(f, FAKE_OP_EXPORT)) < 0)
                return r;
        if (m->kind == FAKE_MEM_HOST)
                return -EINVAL; /* registered pages are the daemon's: it has their file */
        if ((r = mem_file(m)) < 0)
                return r;
        return fd_dup_into(m->fd, ret_fd);
}

/* As the model: the seal is taken through a writable fd of the driver's own of that file, if it has one
 * (the caller's may be read-only); it maps nothing itself. */
static int f_file_seal(Driver *d, int fd)
{
        FakeDriver *f = fk(d);
        struct stat st, mst;

        if (fstat(fd, &st) < 0)
                return -errno;
        for (size_t i = 0; i < f->n_mems; i++) {
                const DriverMem *m = f->mems[i];
                if (m->live && m->fd >= 0 && fstat(m->fd, &mst) == 0 && mst.st_ino == st.st_ino &&
                    mst.st_dev == st.st_dev &&
                    fcntl(m->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) == 0)
                        break;
        }
        return 0;
}

static bool f_dmabuf_is_own(Driver *d, DriverCtx *ctx, int dmabuf_fd)
{
        (void)d;
        (void)ctx;
        return fake_file_is_own(dmabuf_fd);
}

static int f_grant(Driver *d, DriverCtx *ctx, DriverMem *m, uint32_t gpu_id, uint64_t va, uint64_t offset,
                   uint64_t size, int access, bool executable, DriverGrant **ret)
{
        FakeDriver *f = fk(d);
        FakeCtx *c = (FakeCtx *)(void *)ctx;
        DriverGrant *g;
        int r;

        (void)executable;
        if (!mem_ok(f, m, "grant"))
                return -EINVAL;
        if ((r = enter(f, FAKE_OP_GRANT)) < 0)
                return r;
        if (!(f->cfg.caps & DRIVER_CAP_VA_GRANTS))
                return -EOPNOTSUPP;
        if (!ctx_known(f, c)) {
                breach(f, "grant in a context that is not one");
                return -EINVAL;
        }
        if (gpu_index(f, gpu_id) < 0 || !va || va % FAKE_PAGE || !size || size % FAKE_PAGE ||
            offset % FAKE_PAGE || offset > m->size || size > m->size - offset ||
            (access != DRIVER_ACCESS_READ && access != DRIVER_ACCESS_READ_WRITE))
                return -EINVAL;
        if (access == DRIVER_ACCESS_READ_WRITE && (m->read_only || (m->flags & DRIVER_MEM_READ_ONLY))) {
                breach(f, "a writable grant of read-only memory at 0x%llx", (unsigned long long)va);
                return -EPERM;
        }
        for (size_t i = 0; i < f->n_grants; i++) {
                const DriverGrant *o = f->grants[i];
                if (o->live && o->ctx == c && o->gpu_id == gpu_id && overlaps(va, size, o->va, o->size))
                        breach(f, "grant at 0x%llx+0x%llx on GPU %u over another", (unsigned long long)va,
                               (unsigned long long)size, gpu_id);
        }
        /* a grant goes through a dmabuf of the memory */
        if ((r = mem_file(m)) < 0)
                return r;
        g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        *g = (DriverGrant){.m = m, .ctx = c, .gpu_id = gpu_id, .va = va, .size = size, .live = true};
        if (!append(&f->grants, &f->n_grants, g)) {
                free(g);
                return -ENOMEM;
        }
        m->grants++;
        *ret = g;
        return 0;
}

static int f_revoke(Driver *d, DriverGrant *g)
{
        FakeDriver *f = fk(d);
        bool known = false;
        int r;

        for (size_t i = 0; i < f->n_grants; i++)
                known |= f->grants[i] == g;
        if (!known || !g->live) {
                breach(f, known ? "revoke of a grant revoked already" : "revoke of a grant never made");
                return -EINVAL;
        }
        if ((r = enter(f, FAKE_OP_REVOKE)) < 0)
                return r;
        grant_drop(g);
        return 0;
}

static int f_managed_register(Driver *d, uint64_t va, uint64_t size, uint32_t flags)
{
        FakeDriver *f = fk(d);
        FakeRange *more;
        int r;

        if ((r = enter(f, FAKE_OP_MANAGED_REGISTER)) < 0)
                return r;
        if (!(f->cfg.caps & DRIVER_CAP_MANAGED))
                return -EOPNOTSUPP;
        if (!va || va % FAKE_PAGE || !size || size % FAKE_PAGE)
                return -EINVAL;
        for (size_t i = 0; i < f->n_ranges; i++)
                if (overlaps(va, size, f->ranges[i].va, f->ranges[i].size))
                        breach(f, "managed range 0x%llx+0x%llx over another", (unsigned long long)va,
                               (unsigned long long)size);
        more = realloc(f->ranges, (f->n_ranges + 1) * sizeof(*more));
        if (!more)
                return -ENOMEM;
        f->ranges = more;
        f->ranges[f->n_ranges++] = (FakeRange){.va = va, .size = size, .flags = flags};
        return 0;
}

/* The pages go: the managed ranges in them end, as the kernel's MMU notifier ends them. */
static int f_cpu_unmap(Driver *d, uint64_t va, uint64_t size)
{
        FakeDriver *f = fk(d);
        size_t kept = 0;
        int r;

        if ((r = enter(f, FAKE_OP_CPU_UNMAP)) < 0)
                return r;
        for (size_t i = 0; i < f->n_ranges; i++) {
                FakeRange *g = &f->ranges[i];
                if (!overlaps(va, size, g->va, g->size)) {
                        f->ranges[kept++] = *g;
                        continue;
                }
                if (g->va < va || g->va + g->size > va + size)
                        breach(f, "unmap of 0x%llx+0x%llx cuts the managed range 0x%llx+0x%llx",
                               (unsigned long long)va, (unsigned long long)size, (unsigned long long)g->va,
                               (unsigned long long)g->size);
        }
        f->n_ranges = kept;
        return 0;
}

/* The managed range [va, va+size) lies in, or NULL. */
static FakeRange *range_of(FakeDriver *f, uint64_t va, uint64_t size)
{
        for (size_t i = 0; i < f->n_ranges; i++) {
                FakeRange *g = &f->ranges[i];
                if (va >= g->va && size <= g->size && va - g->va <= g->size - size)
                        return g;
        }
        return NULL;
}

/* An SVM call on [va, va+size): it lies in one managed range, *@ret, and names known attributes. */
static int svm_call(FakeDriver *f, FakeOp op, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n,
                    FakeRange **ret)
{
        int r = enter(f, op);

        if (r < 0)
                return r;
        *ret = range_of(f, va, size);
        if (!*ret) {
                breach(f, "%s of 0x%llx+0x%llx, no managed range", op_names[op], (unsigned long long)va,
                       (unsigned long long)size);
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++)
                if (a[i].type > DRIVER_SVM_ATTR_GRANULARITY)
                        return -EINVAL;
        return 0;
}

static int f_svm_set(Driver *d, uint64_t va, uint64_t size, const DriverSvmAttr *a, size_t n)
{
        FakeRange *g;
        int r = svm_call(fk(d), FAKE_OP_SVM_SET, va, size, a, n, &g);

        for (size_t i = 0; r == 0 && i < n; i++)
                g->attrs[a[i].type] = a[i].value;
        return r;
}

static int f_svm_get(Driver *d, uint64_t va, uint64_t size, DriverSvmAttr *a, size_t n)
{
        FakeRange *g;
        int r = svm_call(fk(d), FAKE_OP_SVM_GET, va, size, a, n, &g);

        /* the access kinds answer for the GPU named in the value: left as asked */
        for (size_t i = 0; r == 0 && i < n; i++)
                if (a[i].type != DRIVER_SVM_ATTR_ACCESS)
                        a[i].value = g->attrs[a[i].type];
        return r;
}

static int f_stats(const Driver *d, DriverStats *ret)
{
        const FakeDriver *f = cfk(d);
        FakeCounts k;

        if (!(f->cfg.caps & DRIVER_CAP_BACKEND_STATS))
                return -EOPNOTSUPP;
        fake_counts(d, &k);
        memset(ret, 0, sizeof(*ret));
        ret->contexts = k.contexts;
        ret->buffers = k.mems[FAKE_MEM_VRAM] + k.mems[FAKE_MEM_HOST] + k.mems[FAKE_MEM_GTT];
        ret->imports = k.mems[FAKE_MEM_IMPORT];
        ret->gem_handles = k.grants;
        ret->svm_ranges = k.managed;
        for (size_t i = 0; i < f->cfg.n_gpus; i++)
                ret->vram_bytes += k.vram_used[i];
        return 0;
}

/* "OPERATION NTH ERRNO" a line, as the model's fault files; ERRNO positive or negative. */
static int f_test_faults(Driver *d, const char *path, char *errbuf, size_t errlen)
{
        FakeDriver *f = fk(d);
        char name[64];
        unsigned nth;
        int err, n = 0;
        FILE *in;

        if (!(f->cfg.caps & DRIVER_CAP_TEST_FAULTS))
                return -EOPNOTSUPP;
        in = fopen(path, "re");
        if (!in) {
                int r = -errno;
                snprintf(errbuf, errlen, "cannot read %s: %s", path, strerror(-r));
                return r;
        }
        while (fscanf(in, "%63s %u %d", name, &nth, &err) == 3) {
                FakeOp op = _FAKE_OP_MAX;
                for (int i = 0; i < _FAKE_OP_MAX; i++)
                        if (strcmp(name, op_names[i]) == 0)
                                op = (FakeOp)i;
                if (op == _FAKE_OP_MAX || nth == 0 || err == 0) {
                        snprintf(errbuf, errlen, "bad entry '%s %u %d'", name, nth, err);
                        fclose(in);
                        return -EINVAL;
                }
                fake_fail(d, op, nth, err < 0 ? err : -err);
                n++;
        }
        fclose(in);
        return n;
}

static const DriverOps fake_ops = {
        .close = f_close,
        .version = f_version,
        .caps = f_caps,
        .topology = f_topology,
        .gpu_count = f_gpu_count,
        .gpu = f_gpu,
        .svm_aperture = f_svm_aperture,
        .ctx_primary = f_ctx_primary,
        .ctx_new = f_ctx_new,
        .ctx_free = f_ctx_free,
        .available_memory = f_available_memory,
        .mem_alloc_vram = f_mem_alloc_vram,
        .mem_register_host = f_mem_register_host,
        .mem_alloc_gtt = f_mem_alloc_gtt,
        .mem_import = f_mem_import,
        .mem_adopt_vram = f_mem_adopt_vram,
        .mem_adopt_gtt = f_mem_adopt_gtt,
        .mem_free = f_mem_free,
        .mem_size = f_mem_size,
        .mem_map = f_mem_map,
        .mem_unmap = f_mem_unmap,
        .mem_unmap_all = f_mem_unmap_all,
        .mem_is_mapped = f_mem_is_mapped,
        .mem_mapped_mask = f_mem_mapped_mask,
        .mem_export = f_mem_export,
        .dmabuf_is_own = f_dmabuf_is_own,
        .file_seal = f_file_seal,
        .grant = f_grant,
        .revoke = f_revoke,
        .managed_register = f_managed_register,
        .cpu_unmap = f_cpu_unmap,
        .svm_set = f_svm_set,
        .svm_get = f_svm_get,
        .stats = f_stats,
        .test_faults = f_test_faults,
};

int fake_driver_new(const FakeConfig *cfg, Driver **ret)
{
        /* what a driver offers beyond its memory: none of it is the fake's */
        const unsigned never = DRIVER_CAP_DOORBELL_RELAY | DRIVER_CAP_EVENT_MIRROR | DRIVER_CAP_THREADED_SVM;
        FakeDriver *f;

        if (cfg->n_gpus == 0 || cfg->n_gpus > FAKE_MAX_GPUS || (cfg->caps & never))
                return -EINVAL;
        f = calloc(1, sizeof(*f));
        if (!f)
                return -ENOMEM;
        f->base.ops = &fake_ops;
        f->base.name = "fake";
        f->cfg = *cfg;
        f->primary.live = true;
        *ret = &f->base;
        return 0;
}

void fake_set_caps(Driver *d, unsigned caps)
{
        fk(d)->cfg.caps = caps;
}

void fake_forget_freed(Driver *d)
{
        FakeDriver *f = fk(d);
        size_t kept = 0;

        for (size_t i = 0; i < f->n_grants; i++)
                if (f->grants[i]->live)
                        f->grants[kept++] = f->grants[i];
                else
                        free(f->grants[i]);
        f->n_grants = kept;
        kept = 0;
        for (size_t i = 0; i < f->n_mems; i++) {
                bool held = f->mems[i]->live;
                /* a grant left in force after a breach still names its memory */
                for (size_t g = 0; g < f->n_grants && !held; g++)
                        held = f->grants[g]->m == f->mems[i];
                if (held)
                        f->mems[kept++] = f->mems[i];
                else
                        free(f->mems[i]);
        }
        f->n_mems = kept;
        kept = 0;
        for (size_t i = 0; i < f->n_ctxs; i++)
                if (f->ctxs[i]->live)
                        f->ctxs[kept++] = f->ctxs[i];
                else
                        free(f->ctxs[i]);
        f->n_ctxs = kept;
}

void fake_fail(Driver *d, FakeOp op, unsigned nth, int err)
{
        fk(d)->faults[op] = (FakeFault){nth, err};
}

void fake_fail_clear(Driver *d)
{
        memset(fk(d)->faults, 0, sizeof(fk(d)->faults));
}

uint64_t fake_faults_fired(const Driver *d)
{
        return cfk(d)->faults_fired;
}

uint64_t fake_calls(const Driver *d, FakeOp op)
{
        return cfk(d)->calls[op];
}

const char *fake_op_name(FakeOp op)
{
        return op < _FAKE_OP_MAX ? op_names[op] : "?";
}

void fake_counts(const Driver *d, FakeCounts *ret)
{
        const FakeDriver *f = cfk(d);

        memset(ret, 0, sizeof(*ret));
        for (size_t i = 0; i < f->n_mems; i++) {
                const DriverMem *m = f->mems[i];
                if (!m->live)
                        continue;
                ret->mems[m->kind]++;
                ret->files += m->fd >= 0;
                if (m->kind == FAKE_MEM_VRAM)
                        ret->vram_used[gpu_index(f, m->gpu_id)] += m->size;
        }
        for (size_t i = 0; i < f->n_grants; i++)
                ret->grants += f->grants[i]->live;
        for (size_t i = 0; i < f->n_ctxs; i++)
                ret->contexts += f->ctxs[i]->live;
        ret->managed = f->n_ranges;
}

static FakeMemInfo mem_info(const DriverMem *m)
{
        return (FakeMemInfo){.kind = m->kind,
                             .ctx = m->ctx->id,
                             .gpu_id = m->gpu_id,
                             .va = m->va,
                             .size = m->size,
                             .flags = m->flags,
                             .mapped = m->mapped,
                             .grants = m->grants,
                             .has_file = m->fd >= 0,
                             .read_only = m->read_only};
}

int fake_mem_at(const Driver *d, uint64_t va, FakeMemInfo *ret)
{
        const FakeDriver *f = cfk(d);

        for (size_t i = 0; va && i < f->n_mems; i++)
                if (f->mems[i]->live && f->mems[i]->va == va) {
                        *ret = mem_info(f->mems[i]);
                        return 0;
                }
        return -ENOENT;
}

int fake_managed_attrs(const Driver *d, uint64_t va, uint32_t ret[FAKE_SVM_ATTRS])
{
        const FakeDriver *f = cfk(d);

        for (size_t i = 0; i < f->n_ranges; i++)
                if (f->ranges[i].va == va) {
                        memcpy(ret, f->ranges[i].attrs, sizeof(f->ranges[i].attrs));
                        return 0;
                }
        return -ENOENT;
}

size_t fake_objects_in_ctx(const Driver *d, unsigned ctx)
{
        const FakeDriver *f = cfk(d);
        size_t n = 0;

        for (size_t i = 0; i < f->n_mems; i++)
                n += f->mems[i]->live && f->mems[i]->ctx->id == ctx;
        for (size_t i = 0; i < f->n_grants; i++)
                n += f->grants[i]->live && f->grants[i]->ctx->id == ctx;
        return n;
}

size_t fake_objects_in_range(const Driver *d, uint64_t lo, uint64_t hi)
{
        const FakeDriver *f = cfk(d);
        size_t n = 0;

        for (size_t i = 0; i < f->n_mems; i++)
                n += f->mems[i]->live && f->mems[i]->va &&
                     overlaps(f->mems[i]->va, f->mems[i]->size, lo, hi - lo);
        for (size_t i = 0; i < f->n_grants; i++)
                n += f->grants[i]->live && overlaps(f->grants[i]->va, f->grants[i]->size, lo, hi - lo);
        for (size_t i = 0; i < f->n_ranges; i++)
                n += overlaps(f->ranges[i].va, f->ranges[i].size, lo, hi - lo);
        return n;
}

unsigned fake_ctx_last(const Driver *d)
{
        return cfk(d)->next_ctx;
}

bool fake_ctx_alive(const Driver *d, unsigned id)
{
        const FakeDriver *f = cfk(d);

        for (size_t i = 0; i < f->n_ctxs; i++)
                if (f->ctxs[i]->id == id)
                        return f->ctxs[i]->live;
        return id == 0;
}

uint64_t fake_released_with_ctx(const Driver *d)
{
        return cfk(d)->released_with_ctx;
}

const char *fake_violation(const Driver *d)
{
        return cfk(d)->violations ? cfk(d)->violation : NULL;
}

uint64_t fake_violations(const Driver *d)
{
        return cfk(d)->violations;
}
