/* Thunk device tests: open/close per preset, version gating, the KFD backend and seam without /dev/kfd. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seam.h"
#include "thunk-test.h"

static const char *presets_root;

static void test_open_close(const char *name)
{
        ThunkDevice *d = open_model(presets_root, name, 0);
        const ThunkTopology *t = thunk_device_topology(d);
        ThunkContext *pc = thunk_device_primary_context(d);
        ThunkModelStats s = model_stats(d);
        uint64_t base, limit;
        uint32_t major = 0, minor = 0;

        ASSERT(t);
        ASSERT(strcmp(thunk_device_backend_name(d), "model") == 0);
        thunk_device_version(d, &major, &minor);
        ASSERT(major == 1 && minor == 19);

        ASSERT(thunk_device_gpu_count(d) == t->n_gpus);
        ASSERT(thunk_device_gpu_count(d) > 0);
        ASSERT(s.contexts == 1);
        ASSERT(s.kfd_fds == 1);
        ASSERT(s.render_fds == thunk_device_gpu_count(d));
        ASSERT(s.n_gpus == thunk_device_gpu_count(d));
        ASSERT(s.mems == 0 && s.mappings == 0);

        ASSERT(pc && thunk_context_is_primary(pc) && thunk_context_device(pc) == d);
        ASSERT(thunk_context_kfd_fd(pc) >= 0);
        ASSERT(fcntl(thunk_context_kfd_fd(pc), F_GETFD) & FD_CLOEXEC);

        thunk_device_svm_aperture(d, &base, &limit);
        ASSERT(base < limit);
        for (size_t i = 0; i < thunk_device_gpu_count(d); i++) {
                const ThunkGpu *g = thunk_device_gpu(d, i);
                const ThunkNode *n = thunk_topology_gpu_by_id(t, g->gpu_id);
                int fd = thunk_context_render_fd(pc, g->gpu_id);

                ASSERT(n && n->node_id == g->node_id && n->drm_render_minor == g->drm_render_minor);
                ASSERT(thunk_device_gpu_by_id(d, g->gpu_id) == g);
                ASSERT(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
                ASSERT(g->apertures.gpuvm_base <= base && g->apertures.gpuvm_limit >= limit);
                ASSERT(g->apertures.lds_base != 0 && g->apertures.scratch_base != 0);
        }
        ASSERT(thunk_device_gpu(d, thunk_device_gpu_count(d)) == NULL);
        ASSERT(thunk_device_gpu_by_id(d, 0) == NULL);
        ASSERT_RC(thunk_context_render_fd(pc, 0), -ENODEV);
        /* The primary context is the device's: freeing it is a no-op. */
        ASSERT(thunk_context_free(pc) == NULL);
        ASSERT(thunk_device_primary_context(d) == pc);
        {
                ThunkModelStats s2 = model_stats(d);

                ASSERT_STATS_EQUAL(&s, &s2);
        }

        ASSERT(thunk_device_close(d) == NULL);
        ASSERT(thunk_device_close(NULL) == NULL);
}

/* Every feature is on exactly from the minor that introduced it, and the calls behind it say so. */
static void test_version_gating(const char *name)
{
        for (uint32_t minor = 11; minor <= 19; minor++) {
                ThunkDevice *d = open_model(presets_root, name, minor);
                ThunkContext *pc = thunk_device_primary_context(d);
                const ThunkGpu *g = thunk_device_gpu(d, 0);
                ThunkModelStats s0 = model_stats(d);
                ThunkAllocArgs a = {.kind = THUNK_MEM_VRAM,
                                    .gpu_id = g->gpu_id,
                                    .flags = THUNK_MEM_WRITABLE | THUNK_MEM_CONTIGUOUS,
                                    .size = 1 << 21};
                ThunkContext *c = NULL;
                ThunkBo *bo = NULL;
                uint32_t v_minor;
                int fd = -1, r;

                thunk_device_version(d, NULL, &v_minor);
                ASSERT(v_minor == minor);
                for (ThunkFeature f = 0; f < _THUNK_FEATURE_MAX; f++) {
                        ASSERT(thunk_feature_name(f));
                        ASSERT(thunk_device_has(d, f) == (minor >= thunk_feature_min_minor(f)));
                }
                ASSERT(!thunk_device_has(d, _THUNK_FEATURE_MAX));

                /* CONTIGUOUS (1.16) */
                r = thunk_bo_alloc(pc, &a, &bo);
                if (minor >= 16) {
                        ASSERT_RC(r, 0);
                        ASSERT_RC(thunk_bo_free(bo), 0);
                } else {
                        ASSERT_RC(r, -EOPNOTSUPP);
                }

                /* EXPORT_DMABUF (1.12) */
                a.flags = THUNK_MEM_WRITABLE;
                ASSERT_RC(thunk_bo_alloc(pc, &a, &bo), 0);
                r = thunk_bo_export_dmabuf(bo, &fd);
                if (minor >= 12) {
                        ASSERT_RC(r, 0);
                        ASSERT(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
                        close(fd);
                } else {
                        ASSERT_RC(r, -EOPNOTSUPP);
                }

                /* GEM_VA (1.15) */
                {
                        ThunkGemMapping *m = NULL;

                        r = thunk_gem_map_bo(pc, bo, g->gpu_id, test_va(d, 0), 0, 1 << 21,
                                             THUNK_GEM_VA_READABLE | THUNK_GEM_VA_WRITEABLE, &m);
                        if (minor >= 15) {
                                ASSERT_RC(r, 0);
                                ASSERT_RC(thunk_gem_unmap(m), 0);
                        } else {
                                ASSERT_RC(r, -EOPNOTSUPP);
                        }
                }
                ASSERT_RC(thunk_bo_free(bo), 0);

                /* CREATE_PROCESS (1.19) */
                r = thunk_context_new(d, &c);
                if (minor >= 19) {
                        ASSERT_RC(r, 0);
                        ASSERT(!thunk_context_is_primary(c));
                        ASSERT(model_stats(d).contexts == 2);
                        ASSERT(thunk_context_free(c) == NULL);
                } else {
                        ASSERT_RC(r, -EOPNOTSUPP);
                        ASSERT(c == NULL);
                }

                /* AVAILABLE_MEMORY (1.9) and SVM (1.5) predate every supported minor. */
                {
                        uint64_t avail = 0;
                        bool xnack;

                        ASSERT_RC(thunk_context_available_memory(pc, g->gpu_id, &avail), 0);
                        ASSERT(avail > 0);
                        ASSERT_RC(thunk_context_get_xnack(pc, &xnack), 0);
                }
                {
                        ThunkModelStats s1 = model_stats(d);

                        ASSERT_STATS_EQUAL(&s0, &s1);
                }
                thunk_device_close(d);
        }
}

static void test_bad_options(void)
{
        char err[256];
        ThunkDevice *d = NULL;
        ThunkOptions o = {.backend = THUNK_BACKEND_MODEL, .topology_root = NULL};

        ASSERT_RC(thunk_device_open(NULL, &d, err, sizeof(err)), -EINVAL);
        ASSERT_RC(thunk_device_open(&o, &d, err, sizeof(err)), -EINVAL);
        ASSERT(strstr(err, "topology"));
        o.backend = (ThunkBackend)42;
        ASSERT_RC(thunk_device_open(&o, &d, err, sizeof(err)), -EINVAL);
        ASSERT(strstr(err, "backend"));

        o.backend = THUNK_BACKEND_MODEL;
        o.topology_root = "/nonexistent/gpumemd-preset";
        err[0] = '\0';
        ASSERT(thunk_device_open(&o, &d, err, sizeof(err)) < 0);
        ASSERT(err[0] != '\0');
        /* An unsupported model minor is refused by the model and reported. */
        {
                char path[4096];

                preset_path(path, sizeof(path), presets_root, "workstation");
                o.topology_root = path;
                o.model_kfd_minor = 3;
                err[0] = '\0';
                ASSERT_RC(thunk_device_open(&o, &d, err, sizeof(err)), -EINVAL);
                ASSERT(strstr(err, "model"));
        }
        ASSERT(d == NULL);
        /* errbuf is optional. */
        ASSERT_RC(thunk_device_open(NULL, &d, NULL, 0), -EINVAL);
}

/* This machine has no /dev/kfd: the KFD backend must fail with a message that says why. */
static int test_kfd_backend(void)
{
        char err[512], path[4096];
        ThunkDevice *d = NULL;
        ThunkOptions o = {.backend = THUNK_BACKEND_KFD};
        struct stat st;
        int r;

        if (stat("/dev/kfd", &st) == 0)
                return TEST_SKIP;

        /* Default topology root: absent without amdkfd. */
        err[0] = '\0';
        r = thunk_device_open(&o, &d, err, sizeof(err));
        ASSERT(r < 0);
        ASSERT(err[0] != '\0');
        ASSERT(d == NULL);

        /* With a topology supplied, the failure is the device itself. */
        preset_path(path, sizeof(path), presets_root, "workstation");
        o.topology_root = path;
        err[0] = '\0';
        ASSERT_RC(thunk_device_open(&o, &d, err, sizeof(err)), -ENOENT);
        ASSERT(strstr(err, "/dev/kfd"));
        ASSERT(d == NULL);
        return 0;
}

static int test_kernel_seam(void)
{
        const ThunkSeamOps *ops = &thunk_seam_kernel_ops;
        struct stat st;
        void *p = NULL;
        int fd = -1;

        ASSERT(strcmp(ops->name, "kfd") == 0);
        if (stat("/dev/kfd", &st) == 0)
                return TEST_SKIP;
        ASSERT_RC(ops->open_kfd(NULL, &fd), -ENOENT);
        ASSERT(fd == -1);
        if (stat("/dev/dri/renderD250", &st) != 0)
                ASSERT_RC(ops->open_render(NULL, 250, &fd), -ENOENT);
        ASSERT(fd == -1);
        ASSERT_RC(ops->ioctl(NULL, -1, 0xc0104b01, &st), -EBADF);
        ASSERT_RC(ops->close(NULL, -1), -EBADF);

        /* mmap and close go straight to the kernel. */
        ASSERT_RC(ops->mmap(NULL, NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &p),
                  0);
        ASSERT(p != NULL);
        ((volatile char *)p)[0] = 1;
        munmap(p, 4096);
        ASSERT_RC(ops->mmap(NULL, NULL, 4096, PROT_READ, MAP_SHARED, -1, 0, &p), -EBADF);
        fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        ASSERT(fd >= 0);
        ASSERT_RC(ops->close(NULL, fd), 0);
        ASSERT(fcntl(fd, F_GETFD) < 0 && errno == EBADF);
        return 0;
}

/* Two devices (two models) in one process know nothing of each other. */
static void test_two_devices(void)
{
        ThunkDevice *a = open_model(presets_root, "mi300x", 0);
        ThunkDevice *b = open_model(presets_root, "workstation", 0);
        ThunkModelStats sa = model_stats(a), sb = model_stats(b);
        ThunkAllocArgs args = {.kind = THUNK_MEM_VRAM, .flags = THUNK_MEM_WRITABLE, .size = 4 << 20};
        const ThunkGpu *ga = thunk_device_gpu(a, 0), *gb = thunk_device_gpu(b, 0);
        ThunkBo *boa, *bob;
        uint32_t ida, idb;

        ASSERT(thunk_device_model(a) != thunk_device_model(b));
        args.gpu_id = ga->gpu_id;
        args.va = test_va(a, 1);
        ASSERT_RC(thunk_bo_alloc(thunk_device_primary_context(a), &args, &boa), 0);
        args.gpu_id = gb->gpu_id;
        args.va = test_va(b, 1);
        ASSERT_RC(thunk_bo_alloc(thunk_device_primary_context(b), &args, &bob), 0);
        ida = ga->gpu_id;
        idb = gb->gpu_id;
        ASSERT_RC(thunk_bo_map(boa, &ida, 1), 0);
        ASSERT_RC(thunk_bo_map(bob, &idb, 1), 0);
        ASSERT(model_stats(a).mems == sa.mems + 1 && model_stats(a).mappings == sa.mappings + 1);
        ASSERT(model_stats(b).mems == sb.mems + 1 && model_stats(b).mappings == sb.mappings + 1);

        /* Closing one leaves the other whole. */
        thunk_device_close(a);
        ASSERT_RC(thunk_bo_unmap(bob, &idb, 1), 0);
        ASSERT_RC(thunk_bo_free(bob), 0);
        {
                ThunkModelStats s = model_stats(b);

                ASSERT_STATS_EQUAL(&sb, &s);
        }
        thunk_device_close(b);
}

int main(int argc, char **argv)
{
        int r, skipped = 0, fds0 = count_fds(0);

        if (argc < 3) {
                fprintf(stderr, "usage: %s PRESETS_DIR PRESET...\n", argv[0]);
                return 2;
        }
        presets_root = argv[1];
        for (int i = 2; i < argc; i++) {
                RUN(test_open_close, argv[i]);
                RUN(test_version_gating, argv[i]);
        }
        RUN(test_bad_options);
        RUN(test_two_devices);
        ASSERT(count_fds(0) == fds0);
        r = test_kfd_backend();
        printf("%s test_kfd_backend\n", r == TEST_SKIP ? "skip" : "ok");
        skipped += r == TEST_SKIP;
        r = test_kernel_seam();
        printf("%s test_kernel_seam\n", r == TEST_SKIP ? "skip" : "ok");
        skipped += r == TEST_SKIP;
        return skipped == 2 ? TEST_SKIP : 0;
}
