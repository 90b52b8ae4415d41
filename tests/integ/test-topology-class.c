/* The KFD topology files a client is served: each GPU's VRAM as its class allows it, the daemon's own as it
 * is. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)
/* what the daemon keeps back of a limited bank for ROCm's runtime (docs/policy.md) */
#define RUNTIME_VRAM (2 * MiB)

static Daemon dmn;
static uint32_t gpus[8];
static int n_gpus;
static uint64_t real_vram; /* each GPU's VRAM, as the daemon's own topology has it */

typedef struct Served {
        uint64_t banks;     /* size_in_bytes of its VRAM banks (heap type 1 or 2), summed */
        unsigned n_banks;   /* how many there are */
        uint64_t local_mem; /* local_mem_size of its node */
} Served;

static const gm_topology_file *file_named(const gm_topology_file *f, size_t n, const char *path)
{
        for (size_t i = 0; i < n; i++)
                if (strcmp(f[i].path, path) == 0)
                        return &f[i];
        return NULL;
}

/* The value of @key in the properties file @f, or UINT64_MAX. */
static uint64_t prop(const gm_topology_file *f, const char *key)
{
        const char *p = f ? f->content : "";
        unsigned long long v;
        char k[64];
        int used;

        while (sscanf(p, "%63s %llu\n%n", k, &v, &used) == 2) {
                if (strcmp(k, key) == 0)
                        return v;
                p += used;
        }
        return UINT64_MAX;
}

/* What a new client of the daemon is served as GPU @gpu's VRAM. */
static int served(uint32_t gpu, Served *ret)
{
        gm_client *c = daemon_client(&dmn, "topology-class");
        gm_topology_file *f = NULL;
        size_t n = 0;
        char path[96];
        int node = -1, r;

        memset(ret, 0, sizeof(*ret));
        if (!c)
                return -ENOTCONN;
        r = gm_topology_files(c, &f, &n);
        gm_client_close(c);
        if (r < 0)
                return r;
        for (unsigned k = 0; node < 0 && k < 256; k++) {
                snprintf(path, sizeof(path), "nodes/%u/gpu_id", k);
                const gm_topology_file *g = file_named(f, n, path);
                if (g && strtoul(g->content, NULL, 10) == gpu)
                        node = (int)k;
        }
        if (node >= 0) {
                snprintf(path, sizeof(path), "nodes/%d/properties", node);
                ret->local_mem = prop(file_named(f, n, path), "local_mem_size");
                for (unsigned b = 0; b < 256; b++) {
                        snprintf(path, sizeof(path), "nodes/%d/mem_banks/%u/properties", node, b);
                        const gm_topology_file *m = file_named(f, n, path);
                        uint64_t heap = prop(m, "heap_type");
                        if (!m)
                                break;
                        if (heap == 1 || heap == 2) {
                                ret->banks += prop(m, "size_in_bytes");
                                ret->n_banks++;
                        }
                }
        }
        gm_topology_files_free(f, n);
        return node >= 0 ? 0 : -ENODEV;
}

static void reload(const char *classes)
{
        char text[1024];

        snprintf(text, sizeof(text), "[daemon]\nlog-level = warning\n%s", classes);
        CHECK_EQ(daemon_write_config(&dmn, text), 0);
        kill(dmn.pid, SIGHUP);
        usleep(300000); /* the daemon reads it on its loop; new clients are matched against it after */
}

static void check_served(uint32_t gpu, uint64_t want)
{
        Served s;

        CHECK_EQ(served(gpu, &s), 0);
        CHECK_EQ(s.n_banks, 1);
        CHECK_EQ(s.banks, want);
        CHECK_EQ(s.local_mem, want);
}

/* A class with no VRAM limit: every GPU as it is. */
static void test_unlimited(void)
{
        reload("[class all]\nmatch-all = yes\n");
        for (int i = 0; i < n_gpus; i++)
                check_served(gpus[i], real_vram);
}

/*
 * vram = 1G, and 512M on one GPU: each bank is what the class may hold there (the smaller of the two
 * limits), less the runtime's block; the daemon's own topology, what administrators see, stays the GPU's.
 */
static void test_limited(void)
{
        char classes[256];
        gm_client *c;
        gm_topology *t = NULL;

        snprintf(classes, sizeof(classes), "[class small]\nmatch-all = yes\nvram = 1G\nvram.%u = 512M\n",
                 gpus[1]);
        reload(classes);
        check_served(gpus[0], GiB - RUNTIME_VRAM);
        check_served(gpus[1], 512 * MiB - RUNTIME_VRAM);
        for (int i = 2; i < n_gpus; i++)
                check_served(gpus[i], GiB - RUNTIME_VRAM);

        c = daemon_client(&dmn, "topology-class");
        if (c && gm_topology_get(c, true, &t) == 0) {
                for (size_t i = 0; i < t->n_nodes; i++)
                        if (t->nodes[i].is_gpu)
                                CHECK_EQ(t->nodes[i].local_mem_size, real_vram);
                gm_topology_free(t);
        }
        gm_client_close(c);
}

/* A limit above the GPU's VRAM: the GPU as it is, nothing kept back. */
static void test_above_device(void)
{
        reload("[class big]\nmatch-all = yes\nvram = 1T\n");
        for (int i = 0; i < n_gpus; i++)
                check_served(gpus[i], real_vram);
}

/*
 * A client that read its files never hears from mem_info of more than they gave it, even once its class
 * allows more (AVAILABLE_MEMORY is answered from mem_info).
 */
static void test_mem_info_agrees(void)
{
        gm_client *c;
        gm_topology_file *f = NULL;
        size_t n = 0, free_b = 0, total = 0;

        reload("[class small]\nmatch-all = yes\nvram = 64M\n");
        c = daemon_client(&dmn, "topology-class");
        if (!c)
                return;
        CHECK_EQ(gm_topology_files(c, &f, &n), 0);
        gm_topology_files_free(f, n);
        CHECK_EQ(gm_mem_get_info(c, gpus[0], &free_b, &total), 0);
        CHECK_EQ(total, 64 * MiB - RUNTIME_VRAM);
        CHECK_EQ(free_b, 64 * MiB - RUNTIME_VRAM);
        reload("[class small]\nmatch-all = yes\nvram = 8G\n");
        CHECK_EQ(gm_mem_get_info(c, gpus[0], &free_b, &total), 0);
        CHECK_EQ(total, 64 * MiB - RUNTIME_VRAM);
        CHECK_EQ(free_b, 64 * MiB - RUNTIME_VRAM);
        gm_client_close(c);
        /* a client that never read the files sees the class's allowance, as before */
        c = daemon_client(&dmn, "mem-info");
        if (c) {
                CHECK_EQ(gm_mem_get_info(c, gpus[0], &free_b, &total), 0);
                CHECK_EQ(total, 8 * GiB);
        }
        gm_client_close(c);
}

int main(void)
{
        static const TestCase cases[] = {
                {"a class without a VRAM limit is served every GPU's VRAM", test_unlimited},
                {"a class with vram = 1G is served banks of its allowance", test_limited},
                {"a limit above the GPU's VRAM serves the GPU as it is", test_above_device},
                {"mem_info never answers more than the served bank", test_mem_info_agrees},
        };
        gm_client *c;
        gm_topology *t = NULL;
        int r;

        signal(SIGPIPE, SIG_IGN);
        n_gpus = daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, gpus, 8);
        if (n_gpus < 2)
                return n_gpus < 0 ? EXIT_FAILURE : 77;
        c = daemon_client(&dmn, "admin");
        if (!c || gm_topology_get(c, false, &t) < 0) {
                gm_client_close(c);
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < t->n_nodes; i++)
                if (t->nodes[i].is_gpu && !real_vram)
                        real_vram = t->nodes[i].local_mem_size;
        gm_topology_free(t);
        gm_client_close(c);
        r = run_tests(cases, sizeof(cases) / sizeof(cases[0]));
        return daemon_finish(&dmn, r);
}
