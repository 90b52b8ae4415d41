/* Tests of the KFD model's objects and dispatch (contexts, fds, the ioctl table, faults, presets), driven
 * through the seam with the kernel's ioctl structs; and the runner of every model case. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "config.h"
#include "model-fixture.h"

int test_version(void)
{
        static const uint32_t minors[] = {11, 15, 19, 0};

        for (size_t i = 0; i < 4; i++) {
                Fx f;
                struct kfd_ioctl_get_version_args v;

                REQUIRE_RC(fx_setup(&f, minors[i]), 0);
                memset(&v, 0xff, sizeof(v));
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_VERSION, &v), 0);
                REQUIRE(v.major_version == 1);
                REQUIRE(v.minor_version == (minors[i] ? minors[i] : 19));
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        {
                ThunkModel *m = NULL;
                ThunkTopology *t = topo_make(1, std_gpus, 8 * GiB);
                ThunkModelOptions o = {.kfd_minor = 10};

                REQUIRE_RC(thunk_model_new(t, &o, &m), -EINVAL);
                o.kfd_minor = 20;
                REQUIRE_RC(thunk_model_new(t, &o, &m), -EINVAL);
                REQUIRE(m == NULL);
                t->n_gpus = 0;
                REQUIRE_RC(thunk_model_new(t, NULL, &m), -EINVAL);
                topo_free(t);
        }
        return 0;
}

int test_dispatch(void)
{
        Fx f;
        struct kfd_ioctl_export_dmabuf_args ex = {0};
        uint64_t buf[4] = {0};

        REQUIRE_RC(fx_setup(&f, 11), 0);
        /* outside the table: -ENOTTY, as kfd_ioctl answers since it says which ioctls a kernel lacks */
        REQUIRE_RC(io(&f, f.kfd, _IOWR('K', 0x60, uint64_t), buf), -ENOTTY);
        REQUIRE_RC(io(&f, f.kfd, _IOWR('K', 0x00, uint64_t), buf), -ENOTTY);
        REQUIRE_RC(io(&f, f.kfd, _IOWR('K', 0x82, uint64_t[5]), buf), -ENOTTY);
        /* in the table but not modelled (the old debugger interface) */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_DBG_REGISTER_DEPRECATED, buf), -EOPNOTSUPP);
        /* 1.11 has no EXPORT_DMABUF, RUNTIME_ENABLE, CREATE_PROCESS */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), -ENOTTY);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_PROCESS, NULL), -ENOTTY);
        /* another driver's request on the kfd fd, a KFD request on a render fd */
        REQUIRE_RC(io(&f, f.kfd, DRM_IOCTL_GEM_CLOSE, buf), -ENOTTY);
        REQUIRE_RC(io(&f, f.render[0], AMDKFD_IOC_GET_VERSION, buf), -ENOTTY);
        /* unknown DRM request: -EINVAL like the DRM core */
        REQUIRE_RC(io(&f, f.render[0], DRM_IOWR(0x7e, uint64_t), buf), -EINVAL);
        /* fds the model does not know */
        REQUIRE_RC(io(&f, 0, AMDKFD_IOC_GET_VERSION, buf), -EBADF);
        REQUIRE_RC(io(&f, 12345, AMDKFD_IOC_GET_VERSION, buf), -EBADF);
        REQUIRE(thunk_model_owns_fd(f.m, f.kfd));
        REQUIRE(!thunk_model_owns_fd(f.m, 1));
        REQUIRE(f.kfd > 2 && (fcntl(f.kfd, F_GETFD) & FD_CLOEXEC));
        REQUIRE(f.render[0] > 2 && (fcntl(f.render[0], F_GETFD) & FD_CLOEXEC));
        /* an unknown render minor does not exist */
        {
                int fd = -1;

                REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 200, &fd), -ENOENT);
                REQUIRE(fd == -1);
        }
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, 12345), -EBADF);
        REQUIRE_RC(fx_teardown(&f), 0);

        REQUIRE_RC(fx_setup(&f, 15), 0);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_CREATE_PROCESS, NULL), -ENOTTY);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* _IOC_SIZE decides how much is copied: smaller structs are zero-extended, larger ones partly ignored. */
int test_struct_sizes(void)
{
        Fx f;
        unsigned char b[64];
        struct kfd_ioctl_get_available_memory_args *am = (void *)b;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        /* a 24-byte GET_VERSION: only 8 bytes are answered, the rest stays as the caller left it */
        memset(b, 0xab, sizeof(b));
        REQUIRE_RC(io(&f, f.kfd, _IOC(_IOC_READ, 'K', 0x01, 24), b), 0);
        REQUIRE(((uint32_t *)b)[0] == 1 && ((uint32_t *)b)[1] == 19);
        REQUIRE(b[8] == 0 && b[23] == 0 && b[24] == 0xab);
        /* a 12-byte AVAILABLE_MEMORY (no pad): copy-out stops at 12 bytes */
        memset(b, 0xcd, sizeof(b));
        am->gpu_id = G0;
        REQUIRE_RC(io(&f, f.kfd, _IOC(_IOC_READ | _IOC_WRITE, 'K', 0x23, 12), b), 0);
        REQUIRE(am->available > 0 && am->gpu_id == G0);
        REQUIRE(b[12] == 0xcd);
        /* a 4-byte ALLOC: everything past the va is zero, so size 0 -> -EINVAL */
        REQUIRE_RC(io(&f, f.kfd, _IOC(_IOC_READ | _IOC_WRITE, 'K', 0x16, 4), b), -EINVAL);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_VERSION, NULL), -EFAULT);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_apertures(void)
{
        Fx f;
        struct kfd_process_device_apertures ap[4];
        struct kfd_ioctl_get_process_apertures_new_args a = {0};
        struct kfd_ioctl_get_process_apertures_args old;

        REQUIRE_RC(fx_setup_topo(&f, topo_make(3, std_gpus, 64 * GiB), 19, false), 0);
        /* works before ACQUIRE_VM; 0 nodes = count only */
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), 0);
        REQUIRE(a.num_of_nodes == 3);
        memset(ap, 0xee, sizeof(ap));
        a.kfd_process_device_apertures_ptr = (uintptr_t)ap;
        a.num_of_nodes = 2;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), 0);
        REQUIRE(a.num_of_nodes == 2);
        REQUIRE(ap[0].gpu_id == G0 && ap[1].gpu_id == G1);
        REQUIRE(ap[2].gpu_id == 0xeeeeeeee);
        REQUIRE(ap[0].lds_base == 1ULL << 48 && ap[0].lds_limit == ((1ULL << 48) | 0xffffffffULL));
        REQUIRE(ap[0].scratch_base == 2ULL << 48 && ap[0].scratch_limit == ((2ULL << 48) | 0xffffffffULL));
        REQUIRE(ap[0].gpuvm_base == 64 * 1024 && ap[0].gpuvm_limit == 0x7FFFFFFFFFFFULL);
        a.num_of_nodes = 8;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), 0);
        REQUIRE(a.num_of_nodes == 3 && ap[2].gpu_id == G2);
        a.kfd_process_device_apertures_ptr = 0;
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &a), -EFAULT);
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_GET_PROCESS_APERTURES, &old), 0);
        REQUIRE(old.num_of_nodes == 3 && old.process_apertures[1].gpu_id == G1);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_acquire_vm(void)
{
        Fx f;
        int other = -1, kfd2 = -1;

        REQUIRE_RC(fx_setup_topo(&f, topo_make(3, std_gpus, 64 * GiB), 19, false), 0);
        /* before the VM: SET_MEMORY_POLICY cannot bind the process to the GPU (-ESRCH, not -ENODEV) */
        {
                struct kfd_ioctl_set_memory_policy_args mp = {.gpu_id = G0};

                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_MEMORY_POLICY, &mp), -ESRCH);
                mp.gpu_id = 0x9999;
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_SET_MEMORY_POLICY, &mp), -EINVAL);
        }
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], 0x9999), -EINVAL);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.kfd, G0), -EINVAL);       /* not a render fd */
        REQUIRE_RC(fx_acquire(&f, f.kfd, 1, G0), -EINVAL);           /* not ours at all */
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[1], G0), -EINVAL); /* another GPU's node */
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], G0), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, f.render[0], G0), 0); /* same file: idempotent */
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 128, &other), 0);
        REQUIRE_RC(fx_acquire(&f, f.kfd, other, G0), -EBUSY);
        /* a second kfd fd of the process is the same context */
        REQUIRE_RC(f.seam.ops->open_kfd(f.seam.impl, &kfd2), 0);
        REQUIRE_RC(fx_acquire(&f, kfd2, f.render[0], G0), 0);
        /* a secondary context cannot take a VM that is already a compute VM */
        REQUIRE_RC(io(&f, kfd2, AMDKFD_IOC_CREATE_PROCESS, NULL), 0);
        REQUIRE_RC(fx_acquire(&f, kfd2, f.render[0], G0), -EINVAL);
        REQUIRE_RC(fx_acquire(&f, kfd2, other, G0), 0);
        /* the acquired file outlives its fd */
        {
                ThunkModelStats s;

                REQUIRE_RC(f.seam.ops->close(f.seam.impl, other), 0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.render_fds == 3 && s.render_files == 4 && s.contexts == 2 && s.kfd_fds == 2);
        }
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, kfd2), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_secondary(void)
{
        Fx f;
        int kfd2 = -1, r0 = -1, r1 = -1;
        uint64_t h1 = 0, h2 = 0, off = 0;
        uint32_t ids[] = {G0};
        ThunkModelStats s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(f.seam.ops->open_kfd(f.seam.impl, &kfd2), 0);
        REQUIRE_RC(io(&f, kfd2, AMDKFD_IOC_CREATE_PROCESS, NULL), 0);
        REQUIRE_RC(io(&f, kfd2, AMDKFD_IOC_CREATE_PROCESS, NULL), -EINVAL); /* already secondary */
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.contexts == 2);
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 128, &r0), 0);
        REQUIRE_RC(f.seam.ops->open_render(f.seam.impl, 129, &r1), 0);
        REQUIRE_RC(alloc_bo(&f, kfd2, G0, 0x100000, PAGE, VRAM_RW, &h2, NULL), -ENODEV);
        REQUIRE_RC(fx_acquire(&f, kfd2, r0, G0), 0);
        /* own handles from 0, own VM: the same VA maps in both contexts */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h1, NULL), 0);
        REQUIRE_RC(alloc_bo(&f, kfd2, G0, 0x100000, PAGE, VRAM_RW, &h2, NULL), 0);
        REQUIRE(h1 == h2 && h2 == ((uint64_t)G0 << 32));
        REQUIRE_RC(map_bo(&f, f.kfd, true, h1, ids, 1, NULL), 0);
        REQUIRE_RC(map_bo(&f, kfd2, true, h2, ids, 1, NULL), 0);
        /* SVM and USERPTR stay with the primary context */
        {
                struct kfd_ioctl_svm_attribute at = {KFD_IOCTL_SVM_ATTR_SET_FLAGS, 0};
                void *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

                REQUIRE(p != MAP_FAILED);
                REQUIRE_RC(svm_call(&f, kfd2, KFD_IOCTL_SVM_OP_SET_ATTR, (uintptr_t)p, PAGE, &at, 1),
                           -EOPNOTSUPP);
                off = (uintptr_t)p;
                REQUIRE_RC(alloc_bo(&f, kfd2, G0, 0x300000, PAGE, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, &h2, &off),
                           -EOPNOTSUPP);
                munmap(p, PAGE);
        }
        /* closing the secondary fd releases its context and everything in it */
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, kfd2), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.contexts == 1 && s.mems == 1 && s.mappings == 1 && s.render_files == 5);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, r0), 0);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, r1), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, false, h1, ids, 1, NULL), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h1), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_faults(void)
{
        Fx f;
        uint64_t h[3] = {0};
        ThunkModelStats s0, s;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 0, ENOMEM), -EINVAL);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 1, 0), -EINVAL);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, 2, ENOSPC), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, PAGE, VRAM_RW, &h[0], NULL), 0);
        thunk_model_get_stats(f.m, &s0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, PAGE, VRAM_RW, &h[1], NULL), -ENOSPC);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(memcmp(&s, &s0, sizeof(s)) == 0); /* nothing changed */
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x200000, PAGE, VRAM_RW, &h[1], NULL), 0);
        REQUIRE(h[1] == h[0] + 1);
        /* any size variant of the request counts; FREE -EBUSY injected keeps the handle */
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_FREE_MEMORY_OF_GPU, 1, EBUSY), 0);
        REQUIRE_RC(free_bo(&f, f.kfd, h[1]), -EBUSY);
        REQUIRE_RC(free_bo(&f, f.kfd, h[1]), 0);
        /* DRM requests too, and clearing forgets pending faults */
        REQUIRE_RC(thunk_model_inject_fault(f.m, DRM_IOCTL_AMDGPU_GEM_VA, 1, EIO), 0);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_MAP_MEMORY_TO_GPU, 1, EINTR), 0);
        {
                uint32_t ids[] = {G0};

                REQUIRE_RC(map_bo(&f, f.kfd, true, h[0], ids, 1, NULL), -EINTR);
                REQUIRE_RC(map_bo(&f, f.kfd, true, h[0], ids, 1, NULL), 0);
                REQUIRE_RC(map_bo(&f, f.kfd, false, h[0], ids, 1, NULL), 0);
        }
        thunk_model_clear_faults(f.m);
        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, 5, 0x200000, 0, PAGE), -ENOENT);
        for (int i = 0; i < 16; i++)
                REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_SVM, 100, EIO), 0);
        REQUIRE_RC(thunk_model_inject_fault(f.m, AMDKFD_IOC_SVM, 100, EIO), -ENOSPC);
        thunk_model_clear_faults(f.m);
        REQUIRE_RC(free_bo(&f, f.kfd, h[0]), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

int test_two_models(void)
{
        Fx a, b;
        uint64_t ha = 0, hb = 0;
        struct kfd_ioctl_export_dmabuf_args ex;
        struct kfd_ioctl_import_dmabuf_args im;

        REQUIRE_RC(fx_setup(&a, 19), 0);
        REQUIRE_RC(fx_setup(&b, 11), 0);
        REQUIRE(a.kfd != b.kfd);
        REQUIRE_RC(alloc_bo(&a, a.kfd, G0, 0x100000, PAGE, VRAM_RW, &ha, NULL), 0);
        REQUIRE_RC(alloc_bo(&b, b.kfd, G0, 0x100000, PAGE, VRAM_RW, &hb, NULL), 0);
        REQUIRE(ha == hb);
        /* each model knows only its own fds */
        REQUIRE_RC(io(&a, b.kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &hb), -EBADF);
        REQUIRE_RC(fx_acquire(&a, a.kfd, b.render[1], G1), -EBUSY);
        /* the other model's dmabuf is foreign (1.11: refused) */
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = ha, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&a, a.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        im = (struct kfd_ioctl_import_dmabuf_args){
                .va_addr = 0x200000, .gpu_id = G0, .dmabuf_fd = ex.dmabuf_fd};
        REQUIRE_RC(io(&b, b.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), -EINVAL);
        close((int)ex.dmabuf_fd);
        REQUIRE_RC(free_bo(&a, a.kfd, ha), 0);
        REQUIRE_RC(free_bo(&b, b.kfd, hb), 0);
        REQUIRE_RC(fx_teardown(&b), 0);
        REQUIRE_RC(fx_teardown(&a), 0);
        return 0;
}

/* Closing the last kfd fd tears the context down like a process exit; freeing the model closes the rest. */
int test_teardown(void)
{
        Fx f;
        uint64_t h = 0, h2 = 0, off = 0;
        uint32_t ids[] = {G0, G1};
        ThunkModelStats s;
        int fd;

        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, MiB, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G1, 0x300000, MiB, GTT_RW, &h2, &off), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h2, ids, 2, NULL), 0);
        REQUIRE_RC(f.seam.ops->close(f.seam.impl, f.kfd), 0);
        thunk_model_get_stats(f.m, &s);
        REQUIRE(s.contexts == 0 && s.mems == 0 && s.bufs == 0 && s.mappings == 0 && s.system_used == 0);
        REQUIRE(s.vram_used[0] == 0 && s.render_files == 3);
        REQUIRE_RC(f.seam.ops->open_kfd(f.seam.impl, &f.kfd), 0);
        REQUIRE_RC(fx_teardown(&f), 0);

        /* thunk_model_free with everything still open */
        REQUIRE_RC(fx_setup(&f, 19), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x100000, MiB, VRAM_RW, &h, NULL), 0);
        REQUIRE_RC(map_bo(&f, f.kfd, true, h, ids, 2, NULL), 0);
        fd = f.kfd;
        f.m = thunk_model_free(f.m);
        REQUIRE(f.m == NULL);
        REQUIRE(fcntl(fd, F_GETFD) < 0 && errno == EBADF);
        return 0;
}

/* The presets load and behave: the workstation's small BAR refuses PUBLIC VRAM. */
int test_presets(void)
{
        static const char *names[] = {"mi300x", "mi100", "workstation", "apu", "gfx908"};

        for (size_t i = 0; i < 5; i++) {
                char path[512], err[256] = "";
                ThunkTopology *t = NULL;
                ThunkModel *m = NULL;
                ThunkSeam seam;
                ThunkModelStats s0, s;
                struct kfd_ioctl_get_process_apertures_new_args ap = {0};
                struct kfd_process_device_apertures aps[16];
                int kfd, render;
                const ThunkNode *g;

                snprintf(path, sizeof(path), "%s/%s", GPUMEMD_SOURCE_PRESETDIR, names[i]);
                if (thunk_topology_load(path, &t, err, sizeof(err)) < 0) {
                        fprintf(stderr, "preset %s: %s\n", names[i], err);
                        return 1;
                }
                REQUIRE_RC(thunk_model_new(t, NULL, &m), 0);
                g = thunk_topology_gpu_by_index(t, 0);
                REQUIRE(g != NULL);
                thunk_model_seam(m, &seam);
                thunk_model_get_stats(m, &s0);
                REQUIRE(s0.n_gpus == t->n_gpus);
                REQUIRE_RC(seam.ops->open_kfd(seam.impl, &kfd), 0);
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &ap), 0);
                REQUIRE(ap.num_of_nodes == t->n_gpus && ap.num_of_nodes <= 16);
                ap.kfd_process_device_apertures_ptr = (uintptr_t)aps;
                REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &ap), 0);
                REQUIRE(aps[0].gpu_id == g->gpu_id);
                REQUIRE_RC(seam.ops->open_render(seam.impl, g->drm_render_minor, &render), 0);
                {
                        struct kfd_ioctl_acquire_vm_args acq = {.drm_fd = (uint32_t)render,
                                                                .gpu_id = g->gpu_id};
                        struct kfd_ioctl_alloc_memory_of_gpu_args al = {
                                .va_addr = 0x100000,
                                .size = 2 * MiB,
                                .gpu_id = g->gpu_id,
                                .flags = VRAM_RW | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC};
                        struct kfd_ioctl_get_available_memory_args am = {.gpu_id = g->gpu_id};
                        int want = strcmp(names[i], "workstation") == 0 ? -EINVAL : 0;

                        REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ACQUIRE_VM, &acq), 0);
                        REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_AVAILABLE_MEMORY, &am), 0);
                        REQUIRE(am.available > 0);
                        /* The APU's memory is its node's SYSTEM heap (32 GiB): half of it is the TTM limit,
                         * the smallest of the APU's three limits. */
                        if (strcmp(names[i], "apu") == 0)
                                REQUIRE(am.available == 16 * GiB);
                        REQUIRE_RC(seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al),
                                   want);
                        if (want == 0) {
                                struct kfd_ioctl_free_memory_of_gpu_args fr = {.handle = al.handle};

                                REQUIRE_RC(
                                        seam.ops->ioctl(seam.impl, kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &fr),
                                        0);
                        }
                }
                REQUIRE_RC(seam.ops->close(seam.impl, render), 0);
                REQUIRE_RC(seam.ops->close(seam.impl, kfd), 0);
                thunk_model_get_stats(m, &s);
                REQUIRE(memcmp(&s, &s0, sizeof(s)) == 0);
                thunk_model_free(m);
                thunk_topology_free(t);
        }
        return 0;
}

/* Concurrent callers on one model: the lock keeps the books straight. */
static void *thread_body(void *p)
{
        Fx *f = p;
        uintptr_t bad = 0;

        for (int i = 0; i < 200; i++) {
                uint64_t h = 0;
                uint32_t ids[] = {G1};

                if (alloc_bo(f, f->kfd, G1, 0, PAGE, GTT_RW, &h, NULL) < 0)
                        bad++;
                else if (free_bo(f, f->kfd, h) < 0)
                        bad++;
                (void)ids;
        }
        return (void *)bad;
}

int test_threads(void)
{
        Fx f;
        pthread_t th[4];

        REQUIRE_RC(fx_setup(&f, 19), 0);
        for (int i = 0; i < 4; i++)
                REQUIRE(pthread_create(&th[i], NULL, thread_body, &f) == 0);
        for (int i = 0; i < 4; i++) {
                void *r;

                REQUIRE(pthread_join(th[i], &r) == 0);
                REQUIRE(r == NULL);
        }
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}

/* ------------------------------------------------------------------ runner */

static const RcTestCase tests[] = {
        {"version", test_version},
        {"dispatch", test_dispatch},
        {"struct-sizes", test_struct_sizes},
        {"apertures", test_apertures},
        {"acquire-vm", test_acquire_vm},
        {"alloc-errors", test_alloc_errors},
        {"handles", test_handles},
        {"free-errors", test_free_errors},
        {"map-errors", test_map_errors},
        {"map-resume", test_map_resume},
        {"available-limits", test_available_and_limits},
        {"mmap-data", test_mmap_data},
        {"dmabuf", test_dmabuf},
        {"dmabuf-foreign", test_dmabuf_foreign},
        {"svm", test_svm},
        {"svm-limits", test_svm_limits},
        {"xnack", test_xnack},
        {"svm-unmap-notices", test_svm_unmap_notices},
        {"secondary", test_secondary},
        {"gem-va", test_gem_va},
        {"read-only-import", test_read_only_import},
        {"faults", test_faults},
        {"two-models", test_two_models},
        {"teardown", test_teardown},
        {"presets", test_presets},
        {"threads", test_threads},
        {"events", test_events},
        {"queues", test_queues},
        {"carve", test_carve},
        {"carve-free", test_carve_free},
        {"carve-export", test_carve_export},
        {"carve-fds", test_carve_fds},
};

int main(int argc, char **argv)
{
        return run_rc_tests(tests, ARRAY_SIZE(tests), argc > 1 ? argv[1] : NULL);
}
