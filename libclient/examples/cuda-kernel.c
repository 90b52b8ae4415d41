/* Example: on NVIDIA GPUs, memory from gpumemd is ordinary CUDA memory. A kernel writes it, a second process
 * opens the same memory from an fd and answers; --host: pinned host memory; --refusals: what CUDA cannot do;
 * --hold MIB: memory held until the process is killed. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda-api.h"
#include "gpumem-client.h"

/* fill(p, n, v): p[i] = v + i. PTX, which the CUDA driver compiles for whatever GPU it runs on. */
static const char fill_ptx[] =
        ".version 7.0\n.target sm_75\n.address_size 64\n"
        ".visible .entry fill(.param .u64 p, .param .u32 n, .param .u32 v)\n{\n"
        ".reg .pred %p<2>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<5>;\n"
        "ld.param.u64 %rd1, [p];\nld.param.u32 %r1, [n];\nld.param.u32 %r2, [v];\n"
        "mov.u32 %r3, %ctaid.x;\nmov.u32 %r4, %ntid.x;\nmov.u32 %r5, %tid.x;\n"
        "mad.lo.s32 %r6, %r3, %r4, %r5;\nsetp.ge.u32 %p1, %r6, %r1;\n@%p1 bra DONE;\n"
        "cvta.to.global.u64 %rd2, %rd1;\nmul.wide.u32 %rd3, %r6, 4;\n"
        "add.s64 %rd4, %rd2, %rd3;\nadd.u32 %r7, %r2, %r6;\nst.global.u32 [%rd4], %r7;\n"
        "DONE:\nret;\n}\n";

typedef struct Gpu {
        CudaApi api;
        CUdevice dev;
        CUcontext ctx;
        CUfunction fill;
        uint32_t gpu_id;
} Gpu;

static int cuda_die(const Gpu *g, CUresult r, const char *what)
{
        char buf[32];
        fprintf(stderr, "cuda-kernel: %s: %s\n", what, cuda_error_name(&g->api, r, buf, sizeof(buf)));
        return 1;
}

static int gm_die(gm_client *c, int r, const char *what)
{
        char buf[256];
        fprintf(stderr, "cuda-kernel: %s: %s\n", what, gm_strerror(c, r, buf, sizeof(buf)));
        return 1;
}

/* The first GPU gpumemd serves, as this process's CUDA sees it, with its primary context current. */
static int gpu_open(gm_client *c, Gpu *g)
{
        char err[256], bus[32];
        gm_topology *t = NULL;
        CUmodule mod;
        CUresult cr;
        int r;

        r = cuda_api_load(&g->api, NULL, err, sizeof(err));
        if (r < 0) {
                fprintf(stderr, "cuda-kernel: %s\n", err);
                return 1;
        }
        r = gm_topology_get(c, false, &t);
        if (r < 0)
                return gm_die(c, r, "topology");
        g->gpu_id = 0;
        for (size_t i = 0; i < t->n_nodes && !g->gpu_id; i++) {
                const gm_topology_node *n = &t->nodes[i];
                if (!n->is_gpu)
                        continue;
                snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%x", n->pci_domain, n->pci_location >> 8,
                         (n->pci_location >> 3) & 0x1f, n->pci_location & 7);
                if (g->api.DeviceGetByPCIBusId(&g->dev, bus) == CUDA_SUCCESS)
                        g->gpu_id = n->gpu_id;
        }
        gm_topology_free(t);
        if (!g->gpu_id) {
                fprintf(stderr, "cuda-kernel: no GPU of gpumemd's is visible to CUDA here\n");
                return 1;
        }
        if ((cr = g->api.DevicePrimaryCtxRetain(&g->ctx, g->dev)) != CUDA_SUCCESS ||
            (cr = g->api.CtxSetCurrent(g->ctx)) != CUDA_SUCCESS)
                return cuda_die(g, cr, "context");
        if ((cr = g->api.ModuleLoadData(&mod, fill_ptx)) != CUDA_SUCCESS ||
            (cr = g->api.ModuleGetFunction(&g->fill, mod, "fill")) != CUDA_SUCCESS)
                return cuda_die(g, cr, "loading the kernel");
        return 0;
}

/* A client of its own (@name) and its GPU, for the helper processes: 0, or 1 after saying why. */
static int gpu_connect(const char *sock, const char *name, gm_client **ret_c, Gpu *g)
{
        int r = gm_client_connect(sock, name, ret_c);

        if (r < 0)
                return gm_die(*ret_c, r, "connect");
        return gpu_open(*ret_c, g);
}

static CUresult fill(const Gpu *g, void *p, unsigned n, unsigned v)
{
        CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
        void *args[] = {&d, &n, &v};
        CUresult r = g->api.LaunchKernel(g->fill, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
        if (r == CUDA_SUCCESS)
                r = g->api.CtxSynchronize();
        if (r != CUDA_SUCCESS)
                (void)cuda_die(g, r, "the kernel");
        return r;
}

/* How many of the @n words at @p are not v + i (copied back to the host); -1 if the copy failed. */
static long wrong(const Gpu *g, void *p, unsigned n, unsigned v)
{
        uint32_t *h = malloc((size_t)n * 4);
        long bad = 0;

        if (!h || g->api.MemcpyDtoH(h, (CUdeviceptr)(uintptr_t)p, (size_t)n * 4) != CUDA_SUCCESS) {
                free(h);
                return -1;
        }
        for (unsigned i = 0; i < n; i++)
                bad += h[i] != v + i;
        free(h);
        return bad;
}

/* The second process: open the memory behind @fd, check what the first wrote, and answer. */
static int reader(const char *sock, int fd, unsigned words)
{
        gm_client *c = NULL;
        gm_handle h;
        size_t size = 0;
        void *p = NULL;
        Gpu g;
        int r;

        if (gpu_connect(sock, "cuda-kernel-reader", &c, &g))
                return 1;
        r = gm_mem_import(c, fd, g.gpu_id, &h, &size);
        if (r < 0)
                return gm_die(c, r, "import");
        printf("reader: imported %zu bytes from fd %d\n", size, fd);
        gm_access_desc d = {.gpu_id = g.gpu_id, .access = GM_ACCESS_READ_WRITE};
        if ((r = gm_mem_address_reserve(c, size, 0, NULL, 0, &p)) < 0 ||
            (r = gm_mem_map(c, p, size, 0, h)) < 0 || (r = gm_mem_set_access(c, p, size, &d, 1)) < 0)
                return gm_die(c, r, "map");
        long bad = wrong(&g, p, words, 1000);
        printf("reader: %ld of %u words differ from what the first process's kernel wrote\n", bad, words);
        if (bad != 0)
                return 1;
        if (fill(&g, p, words, 2000) != CUDA_SUCCESS)
                return 1;
        printf("reader: answered with a kernel of its own\n");
        if ((r = gm_mem_unmap(c, p, size)) < 0 || (r = gm_mem_release(c, h)) < 0 ||
            (r = gm_mem_address_free(c, p, size)) < 0)
                return gm_die(c, r, "unmap");
        gm_client_close(c);
        return 0;
}

/* Pinned host memory from gpumemd: a kernel writes it through the same address the CPU reads. */
static int host(const char *sock)
{
        const unsigned words = 1u << 18; /* 1 MiB */
        gm_client *c = NULL;
        uint32_t *p;
        long bad = 0;
        Gpu g;
        int r;

        if (gpu_connect(sock, "cuda-kernel-host", &c, &g))
                return 1;
        r = gm_host_malloc(c, (size_t)words * 4, g.gpu_id, -1, 0, (void **)&p);
        if (r < 0)
                return gm_die(c, r, "host allocation");
        if (fill(&g, p, words, 3000) != CUDA_SUCCESS)
                return 1;
        for (unsigned i = 0; i < words; i++)
                bad += p[i] != 3000 + i;
        printf("host: a kernel wrote %u words of pinned host memory at %p, %ld differ as the CPU reads "
               "them\n",
               words, (void *)p, bad);
        r = gm_mem_free(c, p);
        if (r < 0)
                return gm_die(c, r, "free");
        gm_client_close(c);
        return bad != 0;
}

/* What CUDA cannot do is refused, each with its errno and reason. */
static int refusals(const char *sock)
{
        gm_client *c = NULL;
        char why[256];
        gm_handle h;
        void *p = NULL;
        int pipefd[2], r, wrong = 0;
        Gpu g;

        if (gpu_connect(sock, "cuda-kernel-refusals", &c, &g))

                return 1;
#define EXPECT(call, want, what)                                                                             \
        do {                                                                                                 \
                int got_ = (call);                                                                           \
                printf("refused: %s: %d (%s)\n", what, got_,                                                 \
                       got_ < 0 ? gm_strerror(c, got_, why, sizeof(why)) : "no");                            \
                wrong += got_ != (want);                                                                     \
        } while (0)
        EXPECT(gm_malloc_managed(c, 4u << 20, 0, &p), -EOPNOTSUPP, "managed memory");
        EXPECT(gm_malloc(c, 4u << 20, g.gpu_id, GM_MEM_HOST_VISIBLE, &p), -EINVAL,
               "host-visible device memory");
        EXPECT(gm_malloc(c, 4u << 20, g.gpu_id, GM_MEM_COHERENT, &p), -EOPNOTSUPP,
               "fine-grained device memory");
        if (pipe(pipefd) == 0) {
                EXPECT(gm_mem_import(c, pipefd[0], g.gpu_id, &h, NULL), -EINVAL, "importing a pipe");
                close(pipefd[0]);
                close(pipefd[1]);
        }
        /* device files the daemon did not hand out: not memory of gpumemd's, whatever their kind */
        for (int i = 0; i < 2; i++) {
                const char *path = i ? "/dev/nvidiactl" : "/dev/null";
                int dfd = open(path, O_RDWR | O_CLOEXEC);
                if (dfd < 0)
                        continue;
                EXPECT(gm_mem_import(c, dfd, g.gpu_id, &h, NULL), -EINVAL, path);
                close(dfd);
        }
        {
                size_t gran = 0;
                r = gm_mem_get_allocation_granularity(c, g.gpu_id, GM_GRANULARITY_MINIMUM, &gran);
                if (r < 0)
                        return gm_die(c, r, "granularity");
                /* the driver's granularity, not the page: a VMM handle of less is refused */
                if (gran > 4096)
                        EXPECT(gm_mem_create(c, gran / 2, g.gpu_id, 0, &h), -EINVAL,
                               "a VMM handle of half the granularity");
        }
        r = gm_mem_create(c, 4u << 20, g.gpu_id, 0, &h);
        if (r < 0)
                return gm_die(c, r, "VMM handle");
        r = gm_mem_address_reserve(c, 4u << 20, 0, NULL, 0, &p);
        if (r < 0)
                return gm_die(c, r, "VMM reservation");
        EXPECT(gm_share_publish(c, h, "cuda-kernel-refusals", 0, NULL), -EOPNOTSUPP, "publishing by name");
        EXPECT(gm_mem_map(c, p, 2u << 20, 0, h), -EOPNOTSUPP, "mapping half of a handle");
        EXPECT(gm_mem_map(c, p, 4u << 20, 0, h), 0, "mapping the whole handle");
        gm_access_desc cpu = {.gpu_id = GM_LOCATION_CPU, .access = GM_ACCESS_READ_WRITE};
        EXPECT(gm_mem_set_access(c, p, 4u << 20, &cpu, 1), -EOPNOTSUPP, "CPU access to VMM memory");
        EXPECT(gm_mem_unmap(c, p, 4u << 20), 0, "unmapping");
        EXPECT(gm_mem_release(c, h), 0, "releasing");
        EXPECT(gm_mem_address_free(c, p, 4u << 20), 0, "freeing the reservation");
#undef EXPECT
        printf("refusals: %d not as expected\n", wrong);
        gm_client_close(c);
        return wrong != 0;
}

/* The third: hold @mib MiB until killed. */
static int holder(const char *sock, unsigned mib)
{
        gm_client *c = NULL;
        void *p;
        Gpu g;
        int r;

        if (gpu_connect(sock, "cuda-kernel-holder", &c, &g))
                return 1;
        r = gm_malloc(c, (size_t)mib << 20, g.gpu_id, 0, &p);
        if (r < 0)
                return gm_die(c, r, "allocation");
        if (fill(&g, p, (unsigned)((size_t)mib << 18), 7) != CUDA_SUCCESS)
                return 1;
        printf("holder: %u MiB at %p, written by a kernel; waiting to be killed\n", mib, p);
        fflush(stdout);
        for (;;)
                pause();
}

int main(int argc, char **argv)
{
        const char *sock = getenv("GPUMEM_SOCKET");
        const unsigned words = 1u << 20; /* 4 MiB of the 64 */
        gm_pointer_attributes a = {.struct_size = sizeof(a)};
        gm_client *c = NULL;
        char fdarg[16], words_arg[16];
        int r, fd = -1, status;
        size_t size = 0;
        void *p;
        pid_t pid;
        Gpu g;

        if (argc >= 4 && strcmp(argv[1], "--reader") == 0)
                return reader(sock, atoi(argv[2]), (unsigned)strtoul(argv[3], NULL, 0));
        if (argc >= 2 && strcmp(argv[1], "--host") == 0)
                return host(sock);
        if (argc >= 2 && strcmp(argv[1], "--refusals") == 0)
                return refusals(sock);
        if (argc >= 3 && strcmp(argv[1], "--hold") == 0)
                return holder(sock, (unsigned)strtoul(argv[2], NULL, 0));

        r = gm_client_connect(sock, "cuda-kernel", &c);
        if (r < 0)
                return gm_die(c, r, "connect");
        if (strcmp(gm_client_backend(c), "cuda") != 0) {
                fprintf(stderr, "cuda-kernel: gpumemd serves backend '%s', not cuda\n", gm_client_backend(c));
                return 1;
        }
        if (gpu_open(c, &g))
                return 1;
        r = gm_malloc(c, 64u << 20, g.gpu_id, 0, &p);
        if (r < 0)
                return gm_die(c, r, "allocation");
        printf("first: 64 MiB from gpumemd on GPU %u at %p\n", g.gpu_id, p);
        if (fill(&g, p, words, 1000) != CUDA_SUCCESS || wrong(&g, p, words, 1000) != 0)
                return 1;
        printf("first: a kernel wrote it and the host read it back\n");
        r = gm_pointer_get_attributes(c, p, &a);
        if (r == 0)
                r = gm_mem_export(c, a.handle, &fd, &size);
        if (r < 0)
                return gm_die(c, r, "export");
        printf("first: exported it as fd %d\n", fd);
        fflush(stdout);
        /* CUDA does not survive fork(): the second process is a new program, handed the fd */
        pid = fork();
        if (pid == 0) {
                (void)fcntl(fd, F_SETFD, 0);
                snprintf(fdarg, sizeof(fdarg), "%d", fd);
                snprintf(words_arg, sizeof(words_arg), "%u", words);
                execl("/proc/self/exe", argv[0], "--reader", fdarg, words_arg, (char *)NULL);
                _exit(127);
        }
        close(fd);
        if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "cuda-kernel: the second process failed\n");
                return 1;
        }
        long bad = wrong(&g, p, words, 2000);
        printf("first: %ld words differ from the second process's answer\n", bad);
        if (bad != 0)
                return 1;
        r = gm_mem_free(c, p);
        if (r < 0)
                return gm_die(c, r, "free");
        printf("first: freed; done\n");
        gm_client_close(c);
        return 0;
}
