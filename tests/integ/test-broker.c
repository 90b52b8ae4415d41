/* Broker integration tests: every memory family end to end through a real gpumemd on the KFD model. */
#include <errno.h>
#include <fcntl.h>
#include <numaif.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static const char *preset = "mi300x";
static unsigned kfd_minor = 19;
static uint32_t gpus[16];
static size_t n_gpus;
static gm_status base; /* the daemon's state with no client holding anything */
static int base_fds;

/*
 * The daemon's status, from a client of its own whose one window is what the base state counts. Its window
 * is small, and below 1 TiB where the daemon has room: a window the client cannot reserve (its address
 * space is not the daemon's) is refused and replaced, and the refused one is counted too until the client
 * goes. Above 1 TiB that happens under ThreadSanitizer, whose reservations leave little room there, depending
 * on where each process's libraries landed.
 */
static gm_status *status_now(void)
{
        gm_client_options o = {.struct_size = sizeof(o),
                               .socket_path = dmn.sock,
                               .name = "status",
                               .window_size = 2ull << 20,
                               .low_window = true};
        gm_client *c = NULL;
        gm_status *s = NULL;
        char err[256];

        /* a daemon with no room below 1 TiB (AddressSanitizer's shadow lies there) has none to give */
        if (gm_client_open_with(&o, &c, err, sizeof(err)) < 0) {
                o.low_window = false;
                CHECK_EQ(gm_client_open_with(&o, &c, err, sizeof(err)), 0);
        }
        if (c) {
                CHECK_EQ(gm_admin_status(c, &s), 0);
                gm_client_close(c);
        }
        return s;
}

/* After a test: the daemon and the model hold exactly what they held before it (clients leave async). */
static void check_back_to_base(const char *what)
{
        gm_status *s = NULL;

        for (int i = 0; i < 200; i++) {
                gm_status_free(s);
                s = status_now();
                if (!s)
                        return;
                if (s->allocations == 0 && s->va_windows == 1 /* the status client's own */ &&
                    s->model_gem_handles == base.model_gem_handles &&
                    s->model_buffers == base.model_buffers && s->model_mappings == base.model_mappings &&
                    s->model_svm_ranges == base.model_svm_ranges &&
                    s->model_contexts == base.model_contexts && daemon_fd_count(&dmn) == base_fds)
                        break;
                usleep(20000);
        }
        if (s->allocations != 0 || s->model_buffers != base.model_buffers ||
            s->model_mappings != base.model_mappings || s->model_svm_ranges != base.model_svm_ranges ||
            s->model_contexts != base.model_contexts)
                fprintf(stderr,
                        "%s: allocations %llu, model buffers %llu/%llu mappings %llu/%llu svm %llu/%llu "
                        "contexts %u/%u gem %llu, fds %d/%d\n",
                        what, (unsigned long long)s->allocations, (unsigned long long)s->model_buffers,
                        (unsigned long long)base.model_buffers, (unsigned long long)s->model_mappings,
                        (unsigned long long)base.model_mappings, (unsigned long long)s->model_svm_ranges,
                        (unsigned long long)base.model_svm_ranges, s->model_contexts, base.model_contexts,
                        (unsigned long long)s->model_gem_handles, daemon_fd_count(&dmn), base_fds);
        CHECK_EQ(s->allocations, 0);
        CHECK_EQ(s->bytes_device, 0);
        CHECK_EQ(s->bytes_host, 0);
        CHECK_EQ(s->bytes_managed, 0);
        CHECK_EQ(s->model_buffers, base.model_buffers);
        CHECK_EQ(s->model_handles, base.model_handles);
        CHECK_EQ(s->model_mappings, base.model_mappings);
        CHECK_EQ(s->model_gem_handles, base.model_gem_handles);
        CHECK_EQ(s->model_svm_ranges, base.model_svm_ranges);
        CHECK_EQ(s->model_contexts, base.model_contexts);
        CHECK_EQ(s->model_system_bytes, base.model_system_bytes);
        CHECK_EQ(s->model_vram_bytes, base.model_vram_bytes);
        CHECK_EQ(s->va_windows, 1);
        CHECK_EQ(daemon_fd_count(&dmn), base_fds);
        gm_status_free(s);
}

/* Snapshot of a client's effect on the daemon, to prove that a failed call changed nothing. */
typedef struct Snap {
        uint64_t allocations, device, host, managed, buffers, mappings, svm, gem;
} Snap;

static Snap snap(gm_client *c)
{
        gm_status *s = NULL;
        Snap n = {0};
        if (gm_admin_status(c, &s) == 0) {
                n = (Snap){s->allocations,   s->bytes_device,   s->bytes_host,       s->bytes_managed,
                           s->model_buffers, s->model_mappings, s->model_svm_ranges, s->model_gem_handles};
                gm_status_free(s);
        }
        return n;
}

/* Wait until the daemon holds @n objects in all (clients that left are torn down after they go). */
static void wait_objects(gm_client *c, uint64_t n)
{
        for (int i = 0; i < 250 && snap(c).allocations != n; i++)
                usleep(20000);
        CHECK_EQ(snap(c).allocations, n);
}

static bool snap_eq(Snap a, Snap b)
{
        return memcmp(&a, &b, sizeof(a)) == 0;
}

/* A snapshot once memory a free left to the client's unmap has been refunded: the daemon learns of it from
 * the kernel a moment after the free returned. Two equal readings 2 ms apart. */
static Snap snap_settled(gm_client *c)
{
        Snap a = snap(c), b;

        for (int i = 0; i < 500; i++) {
                usleep(2000);
                b = snap(c);
                if (snap_eq(a, b))
                        break;
                a = b;
        }
        return a;
}

/* A call that must fail with @want and leave the daemon as it was. */
#define CHECK_FAILS_CLEAN(c, call, want)                                                                     \
        do {                                                                                                 \
                Snap _before = snap_settled(c);                                                              \
                int _r = (call);                                                                             \
                char _m[256];                                                                                \
                if (_r != (want))                                                                            \
                        check_failed(__FILE__, __LINE__, "%s -> %d (%s), want %d", #call, _r,                \
                                     gm_strerror(c, _r, _m, sizeof(_m)), want);                              \
                gm_strerror(c, _r, _m, sizeof(_m));                                                          \
                CHECK(strchr(_m, ':') != NULL); /* a reason follows the errno's text */                      \
                CHECK(snap_eq(_before, snap(c)));                                                            \
        } while (0)

static void fill(void *p, size_t n, unsigned seed)
{
        unsigned char *b = p;
        for (size_t i = 0; i < n; i++)
                b[i] = (unsigned char)(seed + i * 7);
}

static bool same(const void *p, size_t n, unsigned seed)
{
        const unsigned char *b = p;
        for (size_t i = 0; i < n; i++)
                if (b[i] != (unsigned char)(seed + i * 7))
                        return false;
        return true;
}

/* ---- device memory ----------------------------------------------------------------------------------- */

static void test_device(void)
{
        gm_client *c = daemon_client(&dmn, "device");
        void *p = NULL, *q = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        size_t fr0 = 0, tot = 0, fr1 = 0;
        uint64_t base_va, size;

        if (!c)
                return;
        gm_client_window(c, &base_va, &size);
        CHECK_EQ(gm_mem_get_info(c, gpus[0], &fr0, &tot), 0);
        CHECK(tot > 0 && fr0 <= tot);
        CHECK_EQ(gm_malloc(c, 8 * MiB, gpus[0], GM_MEM_HOST_VISIBLE | GM_MEM_COHERENT, &p), 0);
        CHECK((uint64_t)(uintptr_t)p >= base_va && (uint64_t)(uintptr_t)p + 8 * MiB <= base_va + size);
        CHECK_EQ((uintptr_t)p % (2 * MiB), 0); /* large buffers get large alignment */
        fill(p, 8 * MiB, 3);
        CHECK(same(p, 8 * MiB, 3));
        CHECK_EQ(gm_mem_get_info(c, gpus[0], &fr1, NULL), 0);
        CHECK(fr1 <= fr0 - 8 * MiB);

        CHECK_EQ(gm_pointer_get_attributes(c, (char *)p + 12345, &pa), 0);
        CHECK_EQ(pa.kind, GM_KIND_DEVICE);
        CHECK_EQ(pa.gpu_id, gpus[0]);
        CHECK(pa.base == p);
        CHECK_EQ(pa.size, 8 * MiB);
        CHECK(pa.cpu_accessible);
        CHECK_EQ(pa.n_mapped_gpus, 1);
        CHECK(pa.handle != 0);

        /* map on more GPUs, unmap some, and errors */
        if (n_gpus >= 3) {
                uint32_t more[2] = {gpus[1], gpus[2]};
                CHECK_EQ(gm_mem_map_gpus(c, p, more, 2), 0);
                CHECK_EQ(gm_pointer_get_attributes(c, p, &pa), 0);
                CHECK_EQ(pa.n_mapped_gpus, 3);
                CHECK_EQ(gm_mem_unmap_gpus(c, p, &gpus[1], 1), 0);
                CHECK_FAILS_CLEAN(c, gm_mem_unmap_gpus(c, p, &gpus[1], 1), -EINVAL); /* not mapped there */
                uint32_t dup[2] = {gpus[2], gpus[2]};
                CHECK_FAILS_CLEAN(c, gm_mem_map_gpus(c, p, dup, 2), -EINVAL);
        }
        uint32_t nosuch = 4242;
        CHECK_FAILS_CLEAN(c, gm_mem_map_gpus(c, p, &nosuch, 1), -ENODEV);

        /* bad input: each a specific error, nothing changed */
        CHECK_FAILS_CLEAN(c, gm_malloc(c, 0, gpus[0], 0, &q), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_malloc(c, 1 * MiB, 4242, 0, &q), -ENODEV);
        CHECK_FAILS_CLEAN(c, gm_malloc(c, 1 * MiB, gpus[0], 1u << 20, &q), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_malloc(c, 1 * MiB, gpus[0], GM_MEM_EXT_COHERENT, &q), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_malloc(c, SIZE_MAX - 10, gpus[0], 0, &q), -EOVERFLOW);
        CHECK_FAILS_CLEAN(c, gm_malloc(c, size + 4096, gpus[0], 0, &q), -ENOMEM);  /* beyond the window */
        CHECK_FAILS_CLEAN(c, gm_malloc(c, 1ull << 40, gpus[0], 0, &q), -ENOMEM);   /* beyond the window */
        CHECK_FAILS_CLEAN(c, gm_malloc(c, 256ull << 30, gpus[0], 0, &q), -ENOMEM); /* beyond VRAM or window */
        {
                gm_alloc_desc d = {.kind = GM_KIND_DEVICE,
                                   .size = MiB,
                                   .gpu_id = gpus[0],
                                   .numa_node = -1,
                                   .alignment = 3 * 4096};
                CHECK_FAILS_CLEAN(c, gm_malloc_desc(c, &d, &q), -EINVAL);
                d.alignment = 0;
                d.fixed_addr = p; /* taken */
                CHECK_FAILS_CLEAN(c, gm_malloc_desc(c, &d, &q), -EADDRINUSE);
                d.fixed_addr = (void *)(uintptr_t)(base_va - 2 * MiB); /* outside the window */
                CHECK_FAILS_CLEAN(c, gm_malloc_desc(c, &d, &q), -EINVAL);
                d.fixed_addr = (void *)(uintptr_t)(base_va + size - MiB); /* straddles the end */
                CHECK_FAILS_CLEAN(c, gm_malloc_desc(c, &d, &q), -EINVAL);
                d.fixed_addr = (void *)(uintptr_t)(base_va + size / 2);
                CHECK_EQ(gm_malloc_desc(c, &d, &q), 0);
                CHECK(q == d.fixed_addr);
                CHECK_EQ(gm_mem_free(c, q), 0);
        }
        /* unaligned sizes are rounded up to the page, as hipMalloc does */
        CHECK_EQ(gm_malloc(c, 12345, gpus[0], 0, &q), 0);
        CHECK_EQ(gm_pointer_get_attributes(c, q, &pa), 0);
        CHECK_EQ(pa.size, 16384);
        CHECK_EQ(gm_mem_free(c, q), 0);

        /* free unmaps from every GPU first; a freed pointer is unknown; the window is reserved again */
        CHECK_EQ(gm_mem_free(c, p), 0);
        CHECK_FAILS_CLEAN(c, gm_mem_free(c, p), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_pointer_get_attributes(c, p, &pa), -ENOENT);
        void *probe = mmap(p, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(probe == MAP_FAILED && errno == EEXIST);
        gm_client_close(c);
        check_back_to_base("device");
}

/* Device memory that is not host visible is carved out of the model's file per GPU: however many
 * allocations a client holds, the daemon's fd count stays where it was, until one is exported. */
static void test_device_fds(void)
{
        enum { N = 2000 };
        gm_client *c = daemon_client(&dmn, "device-fds");
        static void *p[N];
        int before, fd = -1;

        if (!c)
                return;
        /* the first allocation makes the client's GPU VMs where it has its own (a kfd and render fds) */
        CHECK_EQ(gm_malloc(c, 4096, gpus[0], 0, &p[0]), 0);
        before = daemon_quiet_fd_count(&dmn);
        for (int i = 1; i < N; i++)
                CHECK_EQ(gm_malloc(c, 4096, gpus[0], 0, &p[i]), 0);
        CHECK_EQ(daemon_quiet_fd_count(&dmn), before);
        /* an export gives that one buffer a memory file of its own in the daemon */
        {
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};

                CHECK_EQ(gm_pointer_get_attributes(c, p[7], &pa), 0);
                CHECK_EQ(gm_mem_export(c, pa.handle, &fd, NULL), 0);
                close(fd);
                CHECK_EQ(daemon_quiet_fd_count(&dmn), before + 1);
        }
        for (int i = 0; i < N; i++)
                CHECK_EQ(gm_mem_free(c, p[i]), 0);
        gm_client_close(c);
        check_back_to_base("device fds");
}

/* ---- host memory --------------------------------------------------------------------------------------- */

static void test_host(void)
{
        gm_client *c = daemon_client(&dmn, "host");
        void *h = NULL, *q = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int node = -1;

        if (!c)
                return;
        CHECK_EQ(gm_host_malloc(c, 3 * MiB + 5, gpus[0], 0, GM_MEM_COHERENT, &h), 0);
        fill(h, 3 * MiB, 9);
        CHECK(same(h, 3 * MiB, 9));
        /* placed on the NUMA node asked for: the page's node as the kernel reports it */
        CHECK_EQ(get_mempolicy(&node, NULL, 0, h, MPOL_F_NODE | MPOL_F_ADDR), 0);
        CHECK_EQ(node, 0);
        CHECK_EQ(gm_pointer_get_attributes(c, h, &pa), 0);
        CHECK_EQ(pa.kind, GM_KIND_HOST);
        CHECK_EQ(pa.size, 3 * MiB + 4096);
        CHECK_EQ(pa.n_mapped_gpus, n_gpus); /* visible to every GPU */
        CHECK(pa.cpu_accessible);
        CHECK_FAILS_CLEAN(c, gm_host_malloc(c, MiB, gpus[0], 99, 0, &q), -EINVAL); /* no such NUMA node */
        CHECK_FAILS_CLEAN(c, gm_host_malloc(c, MiB, 4242, -1, 0, &q), -ENODEV);
        CHECK_FAILS_CLEAN(c, gm_host_malloc(c, MiB, gpus[0], -1, GM_MEM_CONTIGUOUS, &q), -EINVAL);
        /* nearest node of the GPU (or none when the preset's nodes are not this host's) */
        CHECK_EQ(gm_host_malloc(c, MiB, 0, -1, 0, &q), 0);
        CHECK_EQ(gm_mem_free(c, q), 0);
        CHECK_EQ(gm_mem_free(c, h), 0);
        gm_client_close(c);
        check_back_to_base("host");
}

/* ---- managed memory ------------------------------------------------------------------------------------ */

static void test_managed(void)
{
        gm_client *c = daemon_client(&dmn, "managed");
        void *m = NULL, *d = NULL;
        gm_svm_attr q[4];

        if (!c)
                return;
        CHECK_EQ(gm_malloc_managed(c, 8 * MiB, GM_MEM_COHERENT, &m), 0);
        fill(m, 8 * MiB, 5);
        CHECK(same(m, 8 * MiB, 5));
        /* advice on the first half only: the range as a whole then has mixed sub-ranges */
        CHECK_EQ(gm_mem_advise(c, m, 4 * MiB, GM_ADVISE_SET_PREFERRED_LOCATION, gpus[0]), 0);
        CHECK_EQ(gm_mem_advise(c, m, 4 * MiB, GM_ADVISE_SET_READ_MOSTLY, 0), 0);
        q[0] = (gm_svm_attr){GM_SVM_ATTR_PREFERRED_LOC, 0};
        q[1] = (gm_svm_attr){GM_SVM_ATTR_SET_FLAGS, 0};
        CHECK_EQ(gm_svm_get_attributes(c, m, 4 * MiB, q, 2), 0);
        CHECK_EQ(q[0].value, gpus[0]);
        CHECK(q[1].value & GM_SVM_FLAG_GPU_READ_MOSTLY);
        CHECK(q[1].value & GM_SVM_FLAG_COHERENT);
        q[0] = (gm_svm_attr){GM_SVM_ATTR_PREFERRED_LOC, 0};
        q[1] = (gm_svm_attr){GM_SVM_ATTR_SET_FLAGS, 0};
        q[2] = (gm_svm_attr){GM_SVM_ATTR_CLR_FLAGS, 0};
        CHECK_EQ(gm_svm_get_attributes(c, m, 8 * MiB, q, 3), 0);
        CHECK_EQ(q[0].value, GM_SVM_LOCATION_UNDEFINED);    /* differs across sub-ranges */
        CHECK(!(q[1].value & GM_SVM_FLAG_GPU_READ_MOSTLY)); /* not on every sub-range */
        CHECK(!(q[2].value & GM_SVM_FLAG_GPU_READ_MOSTLY)); /* but on some */
        CHECK_EQ(gm_mem_advise(c, m, 4 * MiB, GM_ADVISE_UNSET_READ_MOSTLY, 0), 0);
        CHECK_EQ(gm_mem_advise(c, m, 4 * MiB, GM_ADVISE_UNSET_PREFERRED_LOCATION, 0), 0);
        CHECK_EQ(gm_mem_advise(c, m, 8 * MiB, GM_ADVISE_SET_ACCESSED_BY, gpus[0]), 0);
        q[0] = (gm_svm_attr){GM_SVM_ATTR_ACCESS, gpus[0]};
        CHECK_EQ(gm_svm_get_attributes(c, m, 8 * MiB, q, 1), 0);
        CHECK_EQ(q[0].type, GM_SVM_ATTR_ACCESS_IN_PLACE);
        CHECK_EQ(gm_mem_advise(c, m, 8 * MiB, GM_ADVISE_UNSET_ACCESSED_BY, gpus[0]), 0);
        q[0] = (gm_svm_attr){GM_SVM_ATTR_ACCESS, gpus[0]};
        CHECK_EQ(gm_svm_get_attributes(c, m, 8 * MiB, q, 1), 0);
        CHECK_EQ(q[0].type, GM_SVM_ATTR_ACCESS);
        CHECK_EQ(gm_mem_advise(c, m, 8 * MiB, GM_ADVISE_SET_ACCESSED_BY, GM_LOCATION_CPU), 0);
        CHECK_EQ(gm_mem_advise(c, m, 8 * MiB, GM_ADVISE_SET_COARSE_GRAIN, 0), 0);
        q[0] = (gm_svm_attr){GM_SVM_ATTR_CLR_FLAGS, 0};
        CHECK_EQ(gm_svm_get_attributes(c, m, 8 * MiB, q, 1), 0);
        CHECK(q[0].value & GM_SVM_FLAG_COHERENT);
        CHECK_EQ(gm_mem_advise(c, m, 8 * MiB, GM_ADVISE_UNSET_COARSE_GRAIN, 0), 0);
        CHECK_EQ(gm_mem_prefetch(c, (char *)m + 2 * MiB, 2 * MiB, gpus[n_gpus - 1]), 0);
        q[0] = (gm_svm_attr){GM_SVM_ATTR_PREFETCH_LOC, 0};
        CHECK_EQ(gm_svm_get_attributes(c, (char *)m + 2 * MiB, 2 * MiB, q, 1), 0);
        CHECK_EQ(q[0].value, gpus[n_gpus - 1]);
        CHECK_EQ(gm_mem_prefetch(c, m, 8 * MiB, GM_LOCATION_CPU), 0);
        /* raw attributes: every kind the issue lists */
        {
                gm_svm_attr set[] = {
                        {GM_SVM_ATTR_PREFERRED_LOC, GM_LOCATION_CPU},
                        {GM_SVM_ATTR_ACCESS, gpus[0]},
                        {GM_SVM_ATTR_NO_ACCESS, gpus[n_gpus - 1]},
                        {GM_SVM_ATTR_SET_FLAGS,
                         GM_SVM_FLAG_GPU_RO | GM_SVM_FLAG_GPU_EXEC | GM_SVM_FLAG_GPU_ALWAYS_MAPPED},
                        {GM_SVM_ATTR_GRANULARITY, 4},
                };
                CHECK_EQ(gm_svm_set_attributes(c, m, 8 * MiB, set, ARRAY_SIZE(set)), 0);
                q[0] = (gm_svm_attr){GM_SVM_ATTR_GRANULARITY, 0};
                q[1] = (gm_svm_attr){GM_SVM_ATTR_SET_FLAGS, 0};
                q[2] = (gm_svm_attr){GM_SVM_ATTR_ACCESS, gpus[n_gpus - 1]};
                CHECK_EQ(gm_svm_get_attributes(c, m, 8 * MiB, q, 3), 0);
                CHECK_EQ(q[0].value, 4);
                CHECK((q[1].value & (GM_SVM_FLAG_GPU_RO | GM_SVM_FLAG_GPU_EXEC)) ==
                      (GM_SVM_FLAG_GPU_RO | GM_SVM_FLAG_GPU_EXEC));
                CHECK_EQ(q[2].type, GM_SVM_ATTR_NO_ACCESS);
        }
        /* bad attribute lists and ranges */
        {
                gm_svm_attr dup[] = {{GM_SVM_ATTR_GRANULARITY, 2}, {GM_SVM_ATTR_GRANULARITY, 3}};
                gm_svm_attr dup_gpu[] = {{GM_SVM_ATTR_ACCESS, gpus[0]}, {GM_SVM_ATTR_NO_ACCESS, gpus[0]}};
                gm_svm_attr unknown[] = {{99, 0}};
                gm_svm_attr bad_loc[] = {{GM_SVM_ATTR_PREFERRED_LOC, 4242}};
                gm_svm_attr bad_gran[] = {{GM_SVM_ATTR_GRANULARITY, 64}};
                gm_svm_attr bad_flags[] = {{GM_SVM_ATTR_SET_FLAGS, 0x100}};
                gm_svm_attr undef_prefetch[] = {{GM_SVM_ATTR_PREFETCH_LOC, GM_SVM_LOCATION_UNDEFINED}};
                gm_svm_attr ok[] = {{GM_SVM_ATTR_GRANULARITY, 2}};
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, dup, 2), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, dup_gpu, 2), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, unknown, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, bad_loc, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, bad_gran, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, bad_flags, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, undef_prefetch, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 8 * MiB, ok, 0), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, (char *)m + 1, 4096, ok, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 9 * MiB, ok, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, 0, ok, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, m, (size_t)0 - 4096, ok, 1), -EOVERFLOW);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, (void *)0x10000, 4096, ok, 1), -EFAULT);
                /* device memory is not managed memory */
                CHECK_EQ(gm_malloc(c, MiB, gpus[0], 0, &d), 0);
                CHECK_FAILS_CLEAN(c, gm_svm_set_attributes(c, d, MiB, ok, 1), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_mem_advise(c, m, 8 * MiB, 77, 0), -EINVAL);
                CHECK_EQ(gm_mem_free(c, d), 0);
        }
        CHECK(same(m, 8 * MiB, 5)); /* attributes never touched the data */
        CHECK_EQ(gm_mem_free(c, m), 0);
        gm_client_close(c);
        check_back_to_base("managed");
}

/* ---- VMM ----------------------------------------------------------------------------------------------- */

static void test_vmm(void)
{
        gm_client *c = daemon_client(&dmn, "vmm");
        void *res = NULL, *res2 = NULL, *q = NULL;
        gm_handle h1 = 0, h2 = 0, h3 = 0, r1 = 0;
        size_t gmin = 0, grec = 0;
        int acc = -1;
        gm_access_desc rw[2] = {{gpus[0], GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};

        if (!c)
                return;
        CHECK_EQ(gm_mem_get_allocation_granularity(c, gpus[0], GM_GRANULARITY_MINIMUM, &gmin), 0);
        CHECK_EQ(gm_mem_get_allocation_granularity(c, gpus[0], GM_GRANULARITY_RECOMMENDED, &grec), 0);
        CHECK_EQ(gmin, 4096);
        CHECK_EQ(grec, 2 * MiB);
        CHECK_FAILS_CLEAN(c, gm_mem_get_allocation_granularity(c, 4242, 0, &gmin), -ENODEV);

        /* grow a buffer in place: one reservation, handles mapped one after another */
        CHECK_EQ(gm_mem_address_reserve(c, 64 * MiB, 0, NULL, 0, &res), 0);
        CHECK_EQ((uintptr_t)res % (2 * MiB), 0);
        CHECK_EQ(gm_mem_create(c, 4 * MiB, gpus[0], 0, &h1), 0);
        CHECK_EQ(gm_mem_map(c, res, 4 * MiB, 0, h1), 0);
        CHECK_EQ(gm_mem_set_access(c, res, 4 * MiB, rw, 2), 0);
        fill(res, 4 * MiB, 1);
        CHECK_EQ(gm_mem_create(c, 4 * MiB, n_gpus > 1 ? gpus[1] : gpus[0], 0, &h2), 0);
        CHECK_EQ(gm_mem_map(c, (char *)res + 4 * MiB, 4 * MiB, 0, h2), 0);
        CHECK_EQ(gm_mem_set_access(c, (char *)res + 4 * MiB, 4 * MiB, rw, 2), 0);
        fill((char *)res + 4 * MiB, 4 * MiB, 2);
        CHECK(same(res, 4 * MiB, 1));
        CHECK(same((char *)res + 4 * MiB, 4 * MiB, 2));
        /* access over both mappings at once (whole mappings), read-only for another GPU */
        if (n_gpus > 2) {
                gm_access_desc ro = {gpus[2], GM_ACCESS_READ};
                CHECK_EQ(gm_mem_set_access(c, res, 8 * MiB, &ro, 1), 0);
                CHECK_EQ(gm_mem_get_access(c, (char *)res + 5 * MiB, gpus[2], &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_READ);
        }
        CHECK_EQ(gm_mem_get_access(c, res, gpus[0], &acc), 0);
        CHECK_EQ(acc, GM_ACCESS_READ_WRITE);
        CHECK_EQ(gm_mem_get_access(c, res, GM_LOCATION_CPU, &acc), 0);
        CHECK_EQ(acc, GM_ACCESS_READ_WRITE);
        if (n_gpus > 3) {
                CHECK_EQ(gm_mem_get_access(c, res, gpus[3], &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_NONE);
        }

        /* one handle in two places: the same bytes */
        CHECK_EQ(gm_mem_address_reserve(c, 4 * MiB, 0, NULL, 0, &res2), 0);
        CHECK_EQ(gm_mem_map(c, res2, 2 * MiB, 2 * MiB, h1), 0);
        CHECK_EQ(gm_mem_set_access(c, res2, 2 * MiB, rw, 2), 0);
        CHECK(memcmp(res2, (char *)res + 2 * MiB, 2 * MiB) == 0);

        /* retain gives the same handle; properties */
        CHECK_EQ(gm_mem_retain_allocation_handle(c, (char *)res + 100, &r1), 0);
        CHECK_EQ(r1, h1);
        CHECK_EQ(gm_mem_release(c, r1), 0);
        {
                gm_allocation_prop p = {.struct_size = sizeof(p)};
                CHECK_EQ(gm_mem_get_allocation_properties(c, h2, &p), 0);
                CHECK_EQ(p.kind, GM_KIND_VMM);
                CHECK_EQ(p.size, 4 * MiB);
                CHECK_EQ(p.gpu_id, n_gpus > 1 ? gpus[1] : gpus[0]);
        }

        /* the rules HIP users rely on */
        CHECK_FAILS_CLEAN(c, gm_mem_create(c, 12345, gpus[0], 0, &h3), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_create(c, 0, gpus[0], 0, &h3), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_create(c, MiB, 4242, 0, &h3), -ENODEV);
        CHECK_FAILS_CLEAN(c, gm_mem_address_reserve(c, 12345, 0, NULL, 0, &q), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_address_reserve(c, MiB, 3 * 4096, NULL, 0, &q), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_address_reserve(c, MiB, 0, res, 0, &q), -EADDRINUSE);
        CHECK_FAILS_CLEAN(c, gm_mem_address_reserve(c, MiB, 0, NULL, 1, &q), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_map(c, (char *)res + 2 * MiB, 4 * MiB, 0, h2), -EADDRINUSE); /* overlap */
        CHECK_FAILS_CLEAN(c, gm_mem_map(c, (char *)res + 8 * MiB, 4 * MiB, 4096 * 3 + 1, h2), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_map(c, (char *)res + 8 * MiB, 8 * MiB, 0, h2),
                          -EINVAL); /* beyond handle */
        CHECK_FAILS_CLEAN(c, gm_mem_map(c, (char *)res + 62 * MiB, 4 * MiB, 0, h2),
                          -EINVAL); /* past the end */
        CHECK_FAILS_CLEAN(c, gm_mem_map(c, (char *)res + 8 * MiB, 4 * MiB, 0, 0xdeadbeef), -ENOENT);
        CHECK_FAILS_CLEAN(c, gm_mem_set_access(c, (char *)res + MiB, 2 * MiB, rw, 2), -EINVAL); /* cuts one */
        CHECK_FAILS_CLEAN(c, gm_mem_set_access(c, (char *)res + 8 * MiB, 2 * MiB, rw, 2),
                          -EINVAL); /* nothing */
        {
                gm_access_desc bad[2] = {{gpus[0], 2}, {gpus[0], GM_ACCESS_READ}};
                CHECK_FAILS_CLEAN(c, gm_mem_set_access(c, res, 4 * MiB, bad, 1), -EINVAL);
                bad[0].access = GM_ACCESS_READ;
                CHECK_FAILS_CLEAN(c, gm_mem_set_access(c, res, 4 * MiB, bad, 2), -EINVAL); /* twice */
                bad[0].gpu_id = 4242;
                CHECK_FAILS_CLEAN(c, gm_mem_set_access(c, res, 4 * MiB, bad, 1), -ENODEV);
        }
        CHECK_FAILS_CLEAN(c, gm_mem_unmap(c, (char *)res + MiB, 4 * MiB), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_address_free(c, res, 64 * MiB), -EBUSY);
        CHECK_FAILS_CLEAN(c, gm_mem_address_free(c, res, 32 * MiB), -EINVAL);
        CHECK_FAILS_CLEAN(c, gm_mem_address_free(c, (char *)res + 4096, 64 * MiB), -ENOENT);
        CHECK_FAILS_CLEAN(c, gm_mem_release(c, 0x1234), -ENOENT);
        CHECK_FAILS_CLEAN(c, gm_mem_free(c, res), -EINVAL);

        /* release while mapped: the memory lives on until the last mapping goes */
        CHECK_EQ(gm_mem_release(c, h1), 0);
        CHECK_FAILS_CLEAN(c, gm_mem_release(c, h1), -ENOENT);
        CHECK(same(res, 4 * MiB - 2 * MiB, 1));
        CHECK_EQ(gm_mem_retain_allocation_handle(c, res, &r1), 0); /* nameable again through a mapping */
        CHECK_EQ(r1, h1);
        CHECK_EQ(gm_mem_release(c, r1), 0);
        /* CPU access revoked: the range is PROT_NONE again in this process */
        {
                gm_access_desc none = {GM_LOCATION_CPU, GM_ACCESS_NONE};
                CHECK_EQ(gm_mem_set_access(c, res2, 2 * MiB, &none, 1), 0);
                CHECK_EQ(gm_mem_get_access(c, res2, GM_LOCATION_CPU, &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_NONE);
                CHECK_EQ(mincore(res2, 4096, (unsigned char[1]){0}), 0); /* mapped, but not readable: */
                void *probe =
                        mmap(res2, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
                CHECK(probe == MAP_FAILED); /* still reserved */
        }
        CHECK_EQ(gm_mem_unmap(c, res2, 2 * MiB), 0);
        CHECK_EQ(gm_mem_address_free(c, res2, 4 * MiB), 0);
        CHECK_EQ(gm_mem_unmap(c, res, 8 * MiB), 0); /* both mappings at once */
        CHECK_EQ(gm_mem_release(c, h2), 0);
        CHECK_EQ(gm_mem_address_free(c, res, 64 * MiB), 0);
        gm_client_close(c);
        check_back_to_base("vmm");
}

/* ---- sharing between processes ------------------------------------------------------------------------ */

/* The importer: a separate client process that maps what it was sent and checks the bytes. */
static int importer(int sock, uint32_t gpu, size_t size, unsigned seed, bool wait_for_exporter_free)
{
        gm_client *c = NULL;
        gm_handle h = 0;
        size_t got = 0;
        void *res = NULL;
        gm_access_desc rw[2] = {{gpu, GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
        char ok = 0;
        int fd = recv_one_fd(sock, 0);

        if (fd < 0 || gm_client_connect(dmn.sock, "importer", &c) < 0)
                return 10;
        if (gm_mem_import(c, fd, gpu, &h, &got) < 0 || got != size)
                return 11;
        close(fd);
        if (gm_mem_address_reserve(c, size, 0, NULL, 0, &res) < 0 || gm_mem_map(c, res, size, 0, h) < 0 ||
            gm_mem_set_access(c, res, size, rw, 2) < 0)
                return 12;
        if (!same(res, size, seed))
                return 13;
        if (wait_for_exporter_free) {
                (void)!write(sock, "r", 1);
                if (read(sock, &ok, 1) != 1) /* the exporter has freed its side meanwhile */
                        return 14;
                if (!same(res, size, seed))
                        return 15;
        }
        fill(res, size, seed + 1); /* written here, seen by the exporter */
        (void)!write(sock, "w", 1);
        if (read(sock, &ok, 1) != 1)
                return 16;
        gm_client_close(c); /* everything is torn down by the daemon */
        return 0;
}

static void test_sharing(void)
{
        gm_client *c = daemon_client(&dmn, "exporter");
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        void *p = NULL, *h = NULL;
        int sv[2], fd = -1, status;
        size_t size = 0;
        char ch;
        pid_t pid;

        if (!c)
                return;
        /* device memory written by this client, read and written by another process */
        CHECK_EQ(gm_malloc(c, 4 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &p), 0);
        fill(p, 4 * MiB, 40);
        CHECK_EQ(gm_pointer_get_attributes(c, p, &pa), 0);
        CHECK_EQ(gm_mem_export(c, pa.handle, &fd, &size), 0);
        CHECK_EQ(size, 4 * MiB);
        /* whoever holds the fd can map it but never resize it under the others */
        CHECK(ftruncate(fd, 0) < 0 && errno == EPERM);
        CHECK(ftruncate(fd, 8 * MiB) < 0 && errno == EPERM);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        pid = fork();
        if (pid == 0) {
                close(sv[0]);
                _exit(importer(sv[1], n_gpus > 1 ? gpus[1] : gpus[0], 4 * MiB, 40, false));
        }
        close(sv[1]);
        CHECK_EQ(send_one_fd(sv[0], fd), 0);
        close(fd);
        CHECK_EQ(read(sv[0], &ch, 1), 1);
        CHECK(same(p, 4 * MiB, 41)); /* the importer's writes */
        (void)!write(sv[0], "k", 1);
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(sv[0]);
        CHECK_EQ(gm_mem_free(c, p), 0);

        /* host memory shared the same way; the exporter frees first and the importer keeps the memory */
        CHECK_EQ(gm_host_malloc(c, 2 * MiB, 0, -1, 0, &h), 0);
        fill(h, 2 * MiB, 60);
        CHECK_EQ(gm_pointer_get_attributes(c, h, &pa), 0);
        CHECK_EQ(gm_mem_export(c, pa.handle, &fd, &size), 0);
        CHECK(ftruncate(fd, 0) < 0 && errno == EPERM);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        pid = fork();
        if (pid == 0) {
                close(sv[0]);
                _exit(importer(sv[1], gpus[0], 2 * MiB, 60, true));
        }
        close(sv[1]);
        CHECK_EQ(send_one_fd(sv[0], fd), 0);
        close(fd);
        CHECK_EQ(read(sv[0], &ch, 1), 1);
        CHECK_EQ(gm_mem_free(c, h), 0);
        (void)!write(sv[0], "f", 1);
        CHECK_EQ(read(sv[0], &ch, 1), 1);
        (void)!write(sv[0], "k", 1);
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(sv[0]);

        /* fds that are not dmabufs */
        wait_objects(c, 0); /* the importer's teardown is over */
        {
                gm_handle x;
                int pfd[2], s2[2];
                CHECK_EQ(pipe2(pfd, O_CLOEXEC), 0);
                CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s2), 0);
                int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                int file = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
                if (file < 0)
                        file = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
                CHECK_FAILS_CLEAN(c, gm_mem_import(c, pfd[0], gpus[0], &x, NULL), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_mem_import(c, s2[0], gpus[0], &x, NULL), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_mem_import(c, dir, gpus[0], &x, NULL), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_mem_import(c, file, gpus[0], &x, NULL), -EINVAL);
                CHECK_FAILS_CLEAN(c, gm_mem_export(c, 0x5555, &fd, NULL), -ENOENT);
                close(pfd[0]);
                close(pfd[1]);
                close(s2[0]);
                close(s2[1]);
                close(dir);
                close(file);
        }
        gm_client_close(c);
        check_back_to_base("sharing");
}

/* ---- isolation between clients ------------------------------------------------------------------------- */

static void test_isolation(void)
{
        gm_client *a = daemon_client(&dmn, "alice"), *b = daemon_client(&dmn, "bob");
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        void *p = NULL, *q = NULL, *res = NULL;
        gm_handle vh = 0, got;
        int fd;
        uint64_t bb, bs;

        if (!a || !b) {
                gm_client_close(a);
                gm_client_close(b);
                return;
        }
        CHECK_EQ(gm_malloc(a, 2 * MiB, gpus[0], 0, &p), 0);
        CHECK_EQ(gm_pointer_get_attributes(a, p, &pa), 0);
        CHECK_EQ(gm_mem_create(a, 2 * MiB, gpus[0], 0, &vh), 0);
        CHECK_EQ(gm_mem_address_reserve(a, 2 * MiB, 0, NULL, 0, &res), 0);
        CHECK_EQ(gm_mem_map(a, res, 2 * MiB, 0, vh), 0);
        gm_client_window(b, &bb, &bs);
        /* bob cannot name alice's objects, nor reach her addresses */
        CHECK_FAILS_CLEAN(b, gm_mem_export(b, pa.handle, &fd, NULL), -ENOENT);
        CHECK_FAILS_CLEAN(b, gm_mem_export(b, vh, &fd, NULL), -ENOENT);
        CHECK_FAILS_CLEAN(b, gm_mem_release(b, vh), -ENOENT);
        CHECK_FAILS_CLEAN(b, gm_mem_map(b, res, 2 * MiB, 0, vh), -ENOENT);
        CHECK_FAILS_CLEAN(b, gm_pointer_get_attributes(b, p, &pa), -EFAULT);
        CHECK_FAILS_CLEAN(b, gm_mem_retain_allocation_handle(b, res, &got), -EINVAL);
        CHECK_FAILS_CLEAN(b, gm_mem_unmap(b, res, 2 * MiB), -EINVAL);
        {
                gm_alloc_desc d = {.kind = GM_KIND_DEVICE,
                                   .size = MiB,
                                   .gpu_id = gpus[0],
                                   .numa_node = -1,
                                   .fixed_addr = p};
                CHECK_FAILS_CLEAN(b, gm_malloc_desc(b, &d, &q),
                                  -EINVAL); /* alice's VA is outside bob's window */
        }
        CHECK((uint64_t)(uintptr_t)p + 2 * MiB <= bb || (uint64_t)(uintptr_t)p >= bb + bs);
        CHECK_EQ(gm_mem_unmap(a, res, 2 * MiB), 0);
        CHECK_EQ(gm_mem_release(a, vh), 0);
        CHECK_EQ(gm_mem_address_free(a, res, 2 * MiB), 0);
        CHECK_EQ(gm_mem_free(a, p), 0);
        gm_client_close(a);
        gm_client_close(b);
        check_back_to_base("isolation");
}

/* With secondary contexts each client that allocates device memory gets a GPU VM of its own. */
static void test_private_vm(void)
{
        gm_client *a = daemon_client(&dmn, "vm-a"), *b = daemon_client(&dmn, "vm-b");
        gm_status *s = NULL;
        void *p = NULL, *q = NULL;

        if (!a || !b) {
                gm_client_close(a);
                gm_client_close(b);
                return;
        }
        CHECK_EQ(gm_malloc(a, MiB, gpus[0], 0, &p), 0);
        CHECK_EQ(gm_malloc(b, MiB, gpus[0], 0, &q), 0);
        CHECK_EQ(gm_admin_status(a, &s), 0);
        if (s)
                CHECK_EQ(s->model_contexts, base.model_contexts + (kfd_minor >= 19 ? 2 : 0));
        gm_status_free(s);
        gm_client_close(a);
        gm_client_close(b);
        check_back_to_base("private vm");
}

/* A doomed client's sequence: objects of every kind, again and again, ready after the third round. */
static void leave_objects_forever(gm_client *c, int ready, void *arg)
{
        for (int step = 0;; step++) {
                client_leave_objects(c, gpus[0], gpus[n_gpus - 1], gpus[0], false);
                if (step == 2)
                        (void)!write(ready, "x", 1);
        }
}

/* A client killed in the middle of a multi-step sequence leaves nothing behind. */
static void test_killed_mid_sequence(void)
{
        for (int round = 0; round < 6; round++) {
                pid_t pid = fork_doomed(&dmn, leave_objects_forever, NULL);

                CHECK(pid > 0);
                usleep(1000 * (unsigned)(round * 3));
                kill_and_reap(&pid);
        }
        check_back_to_base("killed mid-sequence");
}

/* The class's usage of @res (all GPUs), or its limit (@limit), read over a connection of its own. */
static uint64_t class_get(const char *cls, int res, bool limit)
{
        uint64_t used, lim;

        CHECK_RC(daemon_class_quota(&dmn, cls, res, 0, &used, &lim), 0);
        return limit ? lim : used;
}

static uint64_t class_used(const char *cls, int res)
{
        return class_get(cls, res, false);
}

/* Reap the @n client processes @pids: each exited 0. */
static void check_children_ok(const pid_t *pids, int n)
{
        for (int i = 0; i < n; i++)
                CHECK_EQ(child_status(pids[i]), 0);
}

/*
 * Clients of one class allocating and freeing at once, spread over the daemon's loops: while they hold
 * what they kept, the class's account holds exactly that; once they are gone, nothing.
 */
static void test_concurrent_accounts(void)
{
        enum { CLIENTS = 8, ROUNDS = 200 };
        uint64_t vram0 = class_used("default", GM_RESOURCE_VRAM);
        uint64_t host0 = class_used("default", GM_RESOURCE_HOST);
        uint64_t handles0 = class_used("default", GM_RESOURCE_HANDLES);
        uint64_t want_vram = 0, want_host = 0, want_handles = 0;
        int ready[2], go[2];
        pid_t pids[CLIENTS];

        CHECK_EQ(pipe2(ready, O_CLOEXEC), 0);
        CHECK_EQ(pipe2(go, O_CLOEXEC), 0);
        for (int i = 0; i < CLIENTS; i++) {
                want_vram += (uint64_t)(i % 3 + 1) * 2 * MiB;
                want_host += (uint64_t)(i % 2 + 1) * MiB;
                want_handles += (uint64_t)(i % 3 + 1) + (uint64_t)(i % 2 + 1);
                pids[i] = fork();
                if (pids[i] == 0) {
                        gm_client *c = NULL;
                        void *d[4], *h[4];
                        char ch = 'x';
                        close(ready[0]);
                        close(go[1]);
                        if (gm_client_connect(dmn.sock, "concurrent", &c) < 0)
                                _exit(1);
                        for (int round = 0; round < ROUNDS; round++) {
                                if (gm_malloc(c, 2 * MiB, gpus[round % n_gpus], 0, &d[0]) < 0 ||
                                    gm_host_malloc(c, MiB, 0, -1, 0, &h[0]) < 0 || gm_mem_free(c, d[0]) < 0 ||
                                    gm_mem_free(c, h[0]) < 0)
                                        _exit(2);
                        }
                        for (int k = 0; k < i % 3 + 1; k++)
                                if (gm_malloc(c, 2 * MiB, gpus[k % n_gpus], 0, &d[k]) < 0)
                                        _exit(3);
                        for (int k = 0; k < i % 2 + 1; k++)
                                if (gm_host_malloc(c, MiB, 0, -1, 0, &h[k]) < 0)
                                        _exit(4);
                        if (write(ready[1], &ch, 1) != 1 || read(go[0], &ch, 1) < 0)
                                _exit(5);
                        gm_client_close(c); /* what it kept goes with its connection */
                        _exit(0);
                }
        }
        close(ready[1]);
        close(go[0]);
        for (int i = 0; i < CLIENTS; i++) {
                char ch;
                CHECK_EQ(read(ready[0], &ch, 1), 1);
        }
        CHECK_EQ(class_used("default", GM_RESOURCE_VRAM) - vram0, want_vram);
        CHECK_EQ(class_used("default", GM_RESOURCE_HOST) - host0, want_host);
        CHECK_EQ(class_used("default", GM_RESOURCE_HANDLES) - handles0, want_handles);
        close(go[1]); /* all of them go at once */
        check_children_ok(pids, CLIENTS);
        close(ready[0]);
        check_back_to_base("concurrent clients");
        CHECK_EQ(class_used("default", GM_RESOURCE_VRAM), vram0);
        CHECK_EQ(class_used("default", GM_RESOURCE_HOST), host0);
        CHECK_EQ(class_used("default", GM_RESOURCE_HANDLES), handles0);
}

/*
 * Clients of one class racing for the last of its VRAM on several loops: together they get exactly what the
 * limit leaves, never more, and each refusal says why.
 */
static void test_concurrent_limit(void)
{
        enum { CLIENTS = 8, TRIES = 6, ROOM = 10 };
        uint64_t vram0 = class_used("default", GM_RESOURCE_VRAM);
        uint64_t limit0 = class_get("default", GM_RESOURCE_VRAM, true);
        gm_client *adm = daemon_client(&dmn, "quota-admin");
        int ready[2], go[2], got[2], done[2];
        pid_t pids[CLIENTS];
        unsigned total = 0;

        if (!adm)
                return;
        CHECK_EQ(gm_admin_quota_set(adm, "default", GM_RESOURCE_VRAM, 0, vram0 + ROOM * 2 * MiB, false), 0);
        CHECK_EQ(pipe2(ready, O_CLOEXEC), 0);
        CHECK_EQ(pipe2(go, O_CLOEXEC), 0);
        CHECK_EQ(pipe2(got, O_CLOEXEC), 0);
        CHECK_EQ(pipe2(done, O_CLOEXEC), 0);
        for (int i = 0; i < CLIENTS; i++) {
                pids[i] = fork();
                if (pids[i] == 0) {
                        gm_client *c = NULL;
                        void *d[TRIES];
                        unsigned char n = 0;
                        char ch = 'x';
                        close(ready[0]);
                        close(go[1]);
                        close(got[0]);
                        close(done[1]);
                        if (gm_client_connect(dmn.sock, "racer", &c) < 0)
                                _exit(1);
                        /* all connected before any allocates */
                        if (write(ready[1], &ch, 1) != 1 || read(go[0], &ch, 1) < 0)
                                _exit(2);
                        for (int k = 0; k < TRIES; k++) {
                                int r = gm_malloc(c, 2 * MiB, gpus[(i + k) % n_gpus], 0, &d[k]);
                                if (r == 0)
                                        n++;
                                else if (r != -EDQUOT)
                                        _exit(3);
                        }
                        /* hold them until the parent has counted */
                        if (write(got[1], &n, 1) != 1 || read(done[0], &ch, 1) < 0)
                                _exit(4);
                        gm_client_close(c);
                        _exit(0);
                }
        }
        close(ready[1]);
        close(go[0]);
        close(got[1]);
        close(done[0]);
        for (int i = 0; i < CLIENTS; i++) {
                char ch;
                CHECK_EQ(read(ready[0], &ch, 1), 1);
        }
        CHECK_EQ(write(go[1], "gggggggg", CLIENTS), CLIENTS);
        for (int i = 0; i < CLIENTS; i++) {
                unsigned char n = 0;
                CHECK_EQ(read(got[0], &n, 1), 1);
                total += n;
        }
        CHECK_EQ(total, (unsigned)ROOM);
        CHECK_EQ(class_used("default", GM_RESOURCE_VRAM), vram0 + ROOM * 2 * MiB);
        close(done[1]); /* all of them go at once */
        check_children_ok(pids, CLIENTS);
        close(ready[0]);
        close(got[0]);
        close(go[1]);
        CHECK_EQ(gm_admin_quota_set(adm, "default", GM_RESOURCE_VRAM, 0, limit0, false), 0);
        gm_client_close(adm);
        check_back_to_base("racing clients");
        CHECK_EQ(class_used("default", GM_RESOURCE_VRAM), vram0);
}

int main(int argc, char **argv)
{
        static const TestCase cases[] = {
                {"device memory", test_device},
                {"device memory costs the daemon no fd", test_device_fds},
                {"host memory", test_host},
                {"managed memory", test_managed},
                {"VMM", test_vmm},
                {"dmabuf sharing between processes", test_sharing},
                {"isolation between clients", test_isolation},
                {"GPU VMs per client", test_private_vm},
                {"clients SIGKILLed mid-sequence", test_killed_mid_sequence},
                {"concurrent clients of one class keep its account exact", test_concurrent_accounts},
                {"concurrent clients of one class never pass its limit together", test_concurrent_limit},
        };
        char minor[16];
        const char *extra[] = {"--model-kfd-minor", minor, NULL};
        gm_topology *t = NULL;
        gm_client *c;
        gm_status *s;
        int r;

        if (argc > 1)
                preset = argv[1];
        if (argc > 2)
                kfd_minor = (unsigned)atoi(argv[2]);
        snprintf(minor, sizeof(minor), "%u", kfd_minor);
        signal(SIGPIPE, SIG_IGN);
        /* more loops than this machine may have CPUs: clients land on different loops */
        if (daemon_setup(&dmn, preset, "[daemon]\nlog-level = warning\nloops = 4\n", extra, NULL, 0) < 0)
                return EXIT_FAILURE;
        base_fds = daemon_quiet_fd_count(&dmn); /* no client yet */
        c = daemon_client(&dmn, "setup");
        if (!c || gm_topology_get(c, false, &t) < 0) {
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < t->n_nodes && n_gpus < ARRAY_SIZE(gpus); i++)
                if (t->nodes[i].is_gpu)
                        gpus[n_gpus++] = t->nodes[i].gpu_id;
        gm_topology_free(t);
        CHECK_EQ(gm_admin_status(c, &s), 0);
        base = *s;
        base.server_version = base.backend = base.preset = NULL;
        CHECK(s->has_model);
        gm_status_free(s);
        gm_client_close(c);
        r = run_tests(cases, ARRAY_SIZE(cases));
        return daemon_finish(&dmn, r);
}
