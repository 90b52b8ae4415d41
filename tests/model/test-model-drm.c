/* Tests of the KFD model's render nodes: PRIME, GEM_VA, GEM_MMAP and GEM handles, read-only imports. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "model-fixture.h"

/* The ROCr VMM path: VA-less VRAM handle, export, import into the render fd, GEM_VA map, CPU map. */
int test_gem_va(void)
{
        static const uint32_t minors[] = {11, 15};

        for (size_t i = 0; i < 2; i++) {
                Fx f;
                uint64_t h = 0, hk = 0;
                struct kfd_ioctl_export_dmabuf_args ex;
                struct drm_prime_handle ph = {0};
                union drm_amdgpu_gem_mmap mm = {0};
                ThunkModelStats s;
                unsigned char *p = NULL;
                uint32_t ids[] = {G0};

                REQUIRE_RC(fx_setup(&f, minors[i] < 12 ? 12 : minors[i]), 0);
                REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, 4 * PAGE, VRAM_RW, &h, NULL), 0);
                ex = (struct kfd_ioctl_export_dmabuf_args){.handle = h, .flags = O_CLOEXEC};
                REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
                ph.fd = (int)ex.dmabuf_fd;
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph), 0);
                REQUIRE(ph.handle == 1);
                {
                        struct drm_prime_handle again = {.fd = (int)ex.dmabuf_fd};

                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_FD_TO_HANDLE, &again), 0);
                        REQUIRE(again.handle == ph.handle); /* one handle per object per file */
                }
                close((int)ex.dmabuf_fd);
                if (minors[i] < 15) {
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x200000, 0, 4 * PAGE),
                                -EINVAL);
                } else {
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x200000, PAGE,
                                          2 * PAGE),
                                   0);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x201000, 0, PAGE),
                                   -EINVAL);
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x300000, 0, 5 * PAGE),
                                -EINVAL);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x300001, 0, PAGE),
                                   -EINVAL);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x1000, 0, PAGE),
                                   -EINVAL);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, 77, 0x300000, 0, PAGE), -ENOENT);
                        REQUIRE_RC(gem_va(&f, f.render[0], 9, ph.handle, 0x300000, 0, PAGE), -EINVAL);
                        /* a KFD mapping and a GEM_VA mapping share the VM */
                        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0x201000, PAGE, VRAM_RW, &hk, NULL), 0);
                        REQUIRE_RC(map_bo(&f, f.kfd, true, hk, ids, 1, NULL), -EINVAL);
                        REQUIRE_RC(free_bo(&f, f.kfd, hk), 0);
                        /* SVM over a GEM_VA mapping is refused too: checked via the VM */
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == 1 && s.gem_handles == 1);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_UNMAP, ph.handle, 0x300000, 0, PAGE),
                                   -ENOENT);
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_UNMAP, ph.handle, 0x200000, 0, 2 * PAGE),
                                0);
                        /* CLEAR trims, REPLACE maps over */
                        REQUIRE_RC(
                                gem_va(&f, f.render[0], AMDGPU_VA_OP_MAP, ph.handle, 0x400000, 0, 4 * PAGE),
                                0);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_CLEAR, 0, 0x401000, 0, PAGE), 0);
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == 2);
                        REQUIRE_RC(gem_va(&f, f.render[0], AMDGPU_VA_OP_REPLACE, ph.handle, 0x400000, 0,
                                          4 * PAGE),
                                   0);
                        thunk_model_get_stats(f.m, &s);
                        REQUIRE(s.mappings == 1);
                }
                /* CPU view through GEM_MMAP on the same render fd */
                mm.in.handle = ph.handle;
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_MMAP, &mm), 0);
                REQUIRE_RC(f.seam.ops->mmap(f.seam.impl, NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                                            f.render[0], mm.out.addr_ptr, (void **)&p),
                           0);
                p[3] = 9;
                REQUIRE(munmap(p, 4 * PAGE) == 0);
                mm.in.handle = 55;
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_MMAP, &mm), -ENOENT);
                /* HANDLE_TO_FD exports the same pages */
                {
                        struct drm_prime_handle out = {.handle = ph.handle, .flags = DRM_CLOEXEC | DRM_RDWR};

                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_HANDLE_TO_FD, &out), 0);
                        p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, out.fd, 0);
                        REQUIRE(p != MAP_FAILED && p[3] == 9);
                        munmap(p, PAGE);
                        close(out.fd);
                        out.handle = 55;
                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_HANDLE_TO_FD, &out), -ENOENT);
                        out.flags = 0x4;
                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_HANDLE_TO_FD, &out), -EINVAL);
                }
                /* the GEM handle keeps the pages after FREE; GEM_CLOSE takes its mappings along */
                REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.bufs == 1);
                {
                        struct drm_gem_close gc = {.handle = ph.handle};

                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_GEM_CLOSE, &gc), 0);
                        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_GEM_CLOSE, &gc), -EINVAL);
                }
                thunk_model_get_stats(f.m, &s);
                REQUIRE(s.bufs == 0 && s.mappings == 0 && s.gem_handles == 0 && s.vram_used[0] == 0);
                REQUIRE_RC(fx_teardown(&f), 0);
        }
        return 0;
}

/* A read-only dmabuf file stays read-only in whatever imports it: the KFD import is not writable (its export
 * is read-only again) and GEM_VA refuses a writable mapping of it, as amdgpu does for a read-only BO. */
int test_read_only_import(void)
{
        Fx f;
        uint64_t h = 0;
        struct kfd_ioctl_export_dmabuf_args ex;
        struct kfd_ioctl_import_dmabuf_args im;
        struct drm_prime_handle ph = {0};
        struct drm_amdgpu_gem_va va = {0};
        char path[64];
        int ro;

        REQUIRE_RC(fx_setup(&f, 15), 0);
        REQUIRE_RC(alloc_bo(&f, f.kfd, G0, 0, 4 * PAGE, VRAM_RW, &h, NULL), 0);
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = h, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", (int)ex.dmabuf_fd);
        ro = open(path, O_RDONLY | O_CLOEXEC);
        REQUIRE(ro >= 0);
        close((int)ex.dmabuf_fd);
        /* the KFD import of the read-only file exports read-only */
        im = (struct kfd_ioctl_import_dmabuf_args){
                .va_addr = 0x400000, .gpu_id = G0, .dmabuf_fd = (uint32_t)ro};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_IMPORT_DMABUF, &im), 0);
        ex = (struct kfd_ioctl_export_dmabuf_args){.handle = im.handle, .flags = O_CLOEXEC};
        REQUIRE_RC(io(&f, f.kfd, AMDKFD_IOC_EXPORT_DMABUF, &ex), 0);
        REQUIRE((fcntl((int)ex.dmabuf_fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
        close((int)ex.dmabuf_fd);
        REQUIRE_RC(free_bo(&f, f.kfd, im.handle), 0);
        /* GEM_VA: read-only yes, writable no */
        ph.fd = ro;
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph), 0);
        va = (struct drm_amdgpu_gem_va){.handle = ph.handle,
                                        .operation = AMDGPU_VA_OP_MAP,
                                        .flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
                                        .va_address = 0x200000,
                                        .map_size = 4 * PAGE};
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_VA, &va), -EPERM);
        va.flags = AMDGPU_VM_PAGE_READABLE;
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_VA, &va), 0);
        va.operation = AMDGPU_VA_OP_UNMAP;
        REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_AMDGPU_GEM_VA, &va), 0);
        {
                struct drm_gem_close gc = {.handle = ph.handle};
                REQUIRE_RC(io(&f, f.render[0], DRM_IOCTL_GEM_CLOSE, &gc), 0);
        }
        close(ro);
        REQUIRE_RC(free_bo(&f, f.kfd, h), 0);
        REQUIRE_RC(fx_teardown(&f), 0);
        return 0;
}
