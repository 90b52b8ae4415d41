/* gpumem-ab-bench: two builds of libgpumem_client and gpumemd, compared in one process, block by block. */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "gpumem-client.h"

/*
 * On a machine whose speed changes in steps (a VM moved by its host), two builds measured one after the
 * other can land in different states, and their difference drowns. Here one process loads both client
 * libraries, each in a namespace of its own (dlmopen: the same soname twice), connects each to its own
 * daemon, and alternates between them in blocks of calls (which build goes first alternates too), so both
 * see the same machine. Run both daemons and this program on one CPU, as the broker section pins:
 *   taskset -c 3 A/gpumemd --socket /tmp/a.sock ... &   taskset -c 3 B/gpumemd --socket /tmp/b.sock ... &
 *   gpumem-ab-bench A/libgpumem_client.so.1 /tmp/a.sock B/libgpumem_client.so.1 /tmp/b.sock 3 20 5000
 * Prints each op's p50 over all blocks for A and B, and B over A.
 */

typedef struct Build {
        int (*open)(const char *, const char *, gm_client **, char *, size_t);
        void (*close)(gm_client *);
        int (*ping)(gm_client *);
        int (*pointer)(gm_client *, const void *, gm_pointer_attributes *);
        int (*svm_get)(gm_client *, const void *, size_t, gm_svm_attr *, size_t);
        int (*svm_set)(gm_client *, const void *, size_t, const gm_svm_attr *, size_t);
        int (*alloc)(gm_client *, size_t, uint32_t, uint32_t, void **);
        int (*alloc_managed)(gm_client *, size_t, uint32_t, void **);
        int (*topology)(gm_client *, bool, gm_topology **);
        void (*topology_free)(gm_topology *);
        gm_client *c;
        void *dev, *managed;
        uint32_t gpu[2];
} Build;

enum { N_OPS = 4, MIB2 = 2 << 20 };
static const char *const op_names[N_OPS] = {"ping", "pointer query", "svm get", "svm set"};

static void die(const char *what, const char *why)
{
        fprintf(stderr, "gpumem-ab-bench: %s: %s\n", what, why);
        exit(1);
}

static void *sym(void *h, const char *name)
{
        void *p = dlsym(h, name);

        if (!p)
                die(name, dlerror());
        return p;
}

static void build_open(Build *b, const char *lib, const char *sock)
{
        void *h = dlmopen(LM_ID_NEWLM, lib, RTLD_NOW | RTLD_LOCAL);
        char err[256];
        gm_topology *t = NULL;
        size_t n = 0;
        int r;

        if (!h)
                die(lib, dlerror());
        *(void **)&b->open = sym(h, "gm_client_open");
        *(void **)&b->close = sym(h, "gm_client_close");
        *(void **)&b->ping = sym(h, "gm_ping");
        *(void **)&b->pointer = sym(h, "gm_pointer_get_attributes");
        *(void **)&b->svm_get = sym(h, "gm_svm_get_attributes");
        *(void **)&b->svm_set = sym(h, "gm_svm_set_attributes");
        *(void **)&b->alloc = sym(h, "gm_malloc");
        *(void **)&b->alloc_managed = sym(h, "gm_malloc_managed");
        *(void **)&b->topology = sym(h, "gm_topology_get");
        *(void **)&b->topology_free = sym(h, "gm_topology_free");
        if (b->open(sock, "ab-bench", &b->c, err, sizeof(err)) < 0)
                die(sock, err);
        if ((r = b->topology(b->c, false, &t)) < 0)
                die("topology", strerror(-r));
        for (size_t i = 0; i < t->n_nodes && n < 2; i++)
                if (t->nodes[i].is_gpu)
                        b->gpu[n++] = t->nodes[i].gpu_id;
        b->topology_free(t);
        if (n == 0)
                die(sock, "no GPU");
        if (n == 1)
                b->gpu[1] = b->gpu[0];
        if ((r = b->alloc(b->c, MIB2, b->gpu[0], 0, &b->dev)) < 0 ||
            (r = b->alloc_managed(b->c, MIB2, 0, &b->managed)) < 0)
                die("allocation", strerror(-r));
}

/* The calls the broker section times (bench-ops.c), made through @b. */
static int call(Build *b, int op, size_t i)
{
        switch (op) {
        case 0:
                return b->ping(b->c);
        case 1: {
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                return b->pointer(b->c, (char *)b->dev + 100, &pa);
        }
        case 2: {
                gm_svm_attr a[2] = {{GM_SVM_ATTR_PREFERRED_LOC, 0}, {GM_SVM_ATTR_ACCESS, b->gpu[0]}};
                return b->svm_get(b->c, b->managed, MIB2, a, 2);
        }
        default: {
                gm_svm_attr a = {GM_SVM_ATTR_PREFERRED_LOC, b->gpu[i & 1]};
                return b->svm_set(b->c, b->managed, MIB2, &a, 1);
        }
        }
}

int main(int argc, char **argv)
{
        Build b[2];
        uint64_t *v[2][N_OPS];
        size_t blocks, len;
        cpu_set_t set;

        if (argc != 8) {
                fprintf(stderr,
                        "usage: gpumem-ab-bench LIB_A SOCKET_A LIB_B SOCKET_B CPU BLOCKS CALLS_PER_BLOCK\n");
                return 2;
        }
        blocks = strtoul(argv[6], NULL, 0);
        len = strtoul(argv[7], NULL, 0);
        if (blocks == 0 || len == 0)
                die("blocks and calls", "must be positive");
        CPU_ZERO(&set);
        CPU_SET(atoi(argv[5]), &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
                die("sched_setaffinity", strerror(errno));
        memset(b, 0, sizeof(b));
        build_open(&b[0], argv[1], argv[2]);
        build_open(&b[1], argv[3], argv[4]);
        for (int k = 0; k < 2; k++)
                for (int op = 0; op < N_OPS; op++)
                        if (!(v[k][op] = malloc(blocks * len * sizeof(uint64_t))))
                                die("samples", strerror(ENOMEM));
        for (size_t blk = 0; blk < blocks; blk++)
                for (int op = 0; op < N_OPS; op++)
                        for (int turn = 0; turn < 2; turn++) {
                                int k = (blk & 1) ? 1 - turn : turn;
                                for (size_t i = 0; i < len / 10; i++) /* warm: the other build ran last */
                                        (void)call(&b[k], op, i);
                                for (size_t i = 0; i < len; i++) {
                                        uint64_t t0 = bench_now_ns();
                                        int r = call(&b[k], op, i);
                                        if (r < 0)
                                                die(op_names[op], strerror(-r));
                                        v[k][op][blk * len + i] = bench_now_ns() - t0;
                                }
                        }
        printf("%zu blocks of %zu calls per op and build, alternating; p50 over all of a build's calls\n",
               blocks, len);
        for (int op = 0; op < N_OPS; op++) {
                double p[2];
                for (int k = 0; k < 2; k++) {
                        qsort(v[k][op], blocks * len, sizeof(uint64_t), bench_cmp_u64);
                        p[k] = (double)v[k][op][blocks * len / 2] / 1e3;
                        free(v[k][op]);
                }
                printf("  %-14s A %7.2f us  B %7.2f us  B/A %.3f\n", op_names[op], p[0], p[1], p[1] / p[0]);
        }
        b[0].close(b[0].c);
        b[1].close(b[1].c);
        return 0;
}
