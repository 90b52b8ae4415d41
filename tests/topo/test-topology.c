/* Tests of the topology parser: every preset, a real-world fixture, and malformed trees. */
#include "../common/check.h"
#include "config.h"
#include "topology.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef TOPO_DATA_DIR
#error "TOPO_DATA_DIR must point at tests/topo/data"
#endif

#define GIB (1ULL << 30)

static ThunkTopology *load_ok(const char *root)
{
        char err[512] = "";
        ThunkTopology *t = NULL;
        int r = thunk_topology_load(root, &t, err, sizeof(err));
        if (r != 0) {
                fprintf(stderr, "loading %s failed: %d %s\n", root, r, err);
                check_failures++;
                return NULL;
        }
        return t;
}

static ThunkTopology *load_preset(const char *name)
{
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", GPUMEMD_SOURCE_PRESETDIR, name);
        return load_ok(path);
}

/* Properties every node and link of a preset must satisfy, whatever the preset. */
static void check_consistent(const ThunkTopology *t)
{
        size_t gpus = 0;
        for (size_t i = 0; i < t->n_nodes; i++) {
                const ThunkNode *n = &t->nodes[i];
                uint64_t v;
                CHECK_EQ(n->node_id, i);
                CHECK(thunk_props_get(&n->props, "mem_banks_count", &v) && v == n->n_mem_banks);
                CHECK(thunk_props_get(&n->props, "caches_count", &v) && v == n->n_caches);
                CHECK(thunk_props_get(&n->props, "io_links_count", &v) && v == n->n_io_links);
                CHECK(n->n_mem_banks >= 1);
                CHECK(n->n_caches >= 1);
                if (n->is_gpu) {
                        gpus++;
                        CHECK(n->gpu_id != 0 && n->gpu_id <= 0xFFFF);
                        CHECK(n->drm_render_minor >= 128);
                        CHECK_EQ(n->vendor_id, 0x1002);
                        CHECK(n->capability & 0x08000000); /* SVM API */
                        CHECK(!(n->capability & 0x20000000));
                        CHECK(n->numa_node >= 0);
                        CHECK(thunk_topology_gpu_by_id(t, n->gpu_id) == n);
                        for (size_t c = 0; c < n->n_caches; c++)
                                if (n->caches[c].processor_id_low >= 0x80000000u)
                                        CHECK(n->caches[c].type & 0x8); /* HSACU */
                } else {
                        CHECK_EQ(n->gpu_id, 0);
                        CHECK(n->cpu_cores_count > 0);
                        CHECK_EQ(n->mem_banks[0].heap_type, 0);
                        for (size_t c = 0; c < n->n_caches; c++)
                                CHECK(n->caches[c].type & 0x4); /* CPU */
                }
                for (size_t l = 0; l < n->n_io_links; l++) {
                        const ThunkIoLink *k = &n->io_links[l];
                        CHECK_EQ(k->node_from, i);
                        CHECK(k->node_to < t->n_nodes && k->node_to != i);
                        /* Every link has its way back. */
                        const ThunkNode *peer = &t->nodes[k->node_to];
                        bool back = false;
                        for (size_t m = 0; m < peer->n_io_links; m++)
                                back |= peer->io_links[m].node_to == i && peer->io_links[m].type == k->type;
                        CHECK(back);
                }
        }
        CHECK_EQ(gpus, t->n_gpus);
        CHECK(thunk_topology_gpu_by_index(t, t->n_gpus) == NULL);
        CHECK(thunk_topology_gpu_by_id(t, 0) == NULL);
        CHECK_EQ(t->generation_id, 1);
        CHECK(t->platform_oem != 0);
}

static void test_mi300x(void)
{
        ThunkTopology *t = load_preset("mi300x");
        if (!t)
                return;
        check_consistent(t);
        CHECK_EQ(t->n_nodes, 10);
        CHECK_EQ(t->n_gpus, 8);
        uint64_t sys = 0;
        for (size_t i = 0; i < t->n_nodes; i++)
                if (!t->nodes[i].is_gpu)
                        sys += t->nodes[i].mem_banks[0].size_in_bytes;
        CHECK_EQ(sys, 1536 * GIB);
        /* the helpers the daemon describes memory with, from the heap types */
        CHECK_EQ(thunk_node_system_bytes(&t->nodes[0]) + thunk_node_system_bytes(&t->nodes[1]), 1536 * GIB);
        CHECK(!thunk_node_has_public_vram(&t->nodes[0]));
        CHECK_EQ(thunk_node_system_bytes(&t->nodes[2]), 0);
        CHECK(thunk_node_has_public_vram(&t->nodes[2]));
        uint64_t hive = t->nodes[2].hive_id;
        CHECK(hive != 0);
        for (size_t g = 0; g < 8; g++) {
                const ThunkNode *n = thunk_topology_gpu_by_index(t, g);
                CHECK(n != NULL);
                if (!n)
                        continue;
                CHECK_EQ(n->gfx_target_version, 90402);
                CHECK_EQ(n->local_mem_size, 192 * GIB);
                CHECK_EQ(n->n_mem_banks, 1);
                CHECK_EQ(n->mem_banks[0].heap_type, 1); /* FB_PUBLIC: large BAR */
                CHECK_EQ(n->mem_banks[0].size_in_bytes, 192 * GIB);
                CHECK_EQ(n->hive_id, hive);
                CHECK_EQ(n->num_xcc, 8);
                CHECK_EQ(n->numa_node, g < 4 ? 0 : 1);
                CHECK_EQ(thunk_topology_numa_of(t, n), n->numa_node);
                CHECK_EQ(n->drm_render_minor, 128 + g);
                /* Full XGMI mesh: one XGMI link to each of the 7 peers, weight 15, and one PCIe link. */
                size_t xgmi = 0, pcie = 0;
                for (size_t l = 0; l < n->n_io_links; l++) {
                        if (n->io_links[l].type == 11) {
                                xgmi++;
                                CHECK_EQ(n->io_links[l].weight, 15);
                                CHECK(t->nodes[n->io_links[l].node_to].is_gpu);
                        } else if (n->io_links[l].type == 2) {
                                pcie++;
                                CHECK_EQ(n->io_links[l].weight, 20);
                        }
                }
                CHECK_EQ(xgmi, 7);
                CHECK_EQ(pcie, 1);
                for (size_t h = 0; h < g; h++)
                        CHECK(thunk_topology_gpu_by_index(t, h)->gpu_id != n->gpu_id);
        }
        CHECK(thunk_topology_free(t) == NULL);
}

static void test_mi100(void)
{
        ThunkTopology *t = load_preset("mi100");
        if (!t)
                return;
        check_consistent(t);
        CHECK_EQ(t->n_gpus, 4);
        for (size_t g = 0; g < 4; g++) {
                const ThunkNode *n = thunk_topology_gpu_by_index(t, g);
                CHECK_EQ(n->gfx_target_version, 90008);
                CHECK_EQ(n->mem_banks[0].size_in_bytes, 32 * GIB);
                CHECK_EQ(n->mem_banks[0].heap_type, 1);
                CHECK_EQ(n->hive_id, 0);
                CHECK_EQ(n->numa_node, g < 2 ? 0 : 1);
                for (size_t l = 0; l < n->n_io_links; l++)
                        CHECK_EQ(n->io_links[l].type, 2);
                /* PCIe peers are reported as indirect p2p links, heavier across sockets. */
                CHECK_EQ(n->n_p2p_links, 3);
                for (size_t l = 0; l < n->n_p2p_links; l++) {
                        const ThunkNode *peer = &t->nodes[n->p2p_links[l].node_to];
                        CHECK(peer->is_gpu);
                        CHECK_EQ(n->p2p_links[l].weight, peer->numa_node == n->numa_node ? 40 : 72);
                }
        }
        CHECK(thunk_topology_free(t) == NULL);
}

static void test_workstation(void)
{
        ThunkTopology *t = load_preset("workstation");
        if (!t)
                return;
        check_consistent(t);
        CHECK_EQ(t->n_nodes, 3);
        CHECK_EQ(t->n_gpus, 2);
        for (size_t g = 0; g < 2; g++) {
                const ThunkNode *n = thunk_topology_gpu_by_index(t, g);
                CHECK_EQ(n->mem_banks[0].heap_type, 2); /* FB_PRIVATE: small BAR */
                CHECK_EQ(n->mem_banks[0].size_in_bytes, 16 * GIB);
                CHECK_EQ(n->gfx_target_version, 100300);
                CHECK_EQ(n->wave_front_size, 32);
                CHECK_EQ(n->numa_node, 0);
                CHECK_EQ(n->n_p2p_links, 0);
        }
        /* The CPU's links to small-BAR GPUs carry NO_PEER_TO_PEER_DMA. */
        for (size_t l = 0; l < t->nodes[0].n_io_links; l++)
                CHECK(t->nodes[0].io_links[l].flags & 0x10);
        CHECK(thunk_topology_free(t) == NULL);
}

static void test_apu(void)
{
        ThunkTopology *t = load_preset("apu");
        if (!t)
                return;
        check_consistent(t);
        CHECK_EQ(t->n_nodes, 1);
        CHECK_EQ(t->n_gpus, 1);
        const ThunkNode *n = thunk_topology_gpu_by_index(t, 0);
        CHECK(n && n->cpu_cores_count > 0 && n->simd_count > 0);
        CHECK_EQ(n->local_mem_size, 0);
        CHECK_EQ(n->mem_banks[0].heap_type, 0);
        CHECK(n->mem_banks[0].size_in_bytes > 0);
        CHECK_EQ(n->gfx_target_version, 90012);
        CHECK_EQ(n->numa_node, 0);
        CHECK(strcmp(n->name, "renoir") == 0);
        CHECK(thunk_topology_free(t) == NULL);
}

static void test_gfx908(void)
{
        ThunkTopology *t = load_preset("gfx908");
        if (!t)
                return;
        check_consistent(t);
        CHECK_EQ(t->n_nodes, 2);
        const ThunkNode *n = thunk_topology_gpu_by_index(t, 0);
        CHECK(n == &t->nodes[1]);
        CHECK_EQ(n->device_id, 0x738c);
        CHECK_EQ(n->gfx_target_version, 90008);
        CHECK_EQ(n->simd_count, 480);
        CHECK_EQ(n->wave_front_size, 64);
        CHECK_EQ(n->lds_size_in_kb, 64);
        CHECK_EQ(n->max_engine_clk_fcompute, 1502);
        CHECK_EQ(n->location_id, 0x300);
        CHECK(strcmp(n->name, "arcturus") == 0);
        CHECK(strcmp(t->nodes[0].name, "") == 0);
        CHECK(thunk_topology_gpu_by_id(t, n->gpu_id) == n);
        CHECK(thunk_topology_gpu_by_id(t, n->gpu_id ^ 1) == NULL);
        /* Caches: L1 and L2 data caches of type DATA|HSACU. */
        bool l1 = false, l2 = false;
        for (size_t c = 0; c < n->n_caches; c++) {
                l1 |= n->caches[c].level == 1 && n->caches[c].type == 0x9;
                l2 |= n->caches[c].level == 2 && n->caches[c].type == 0x9 && n->caches[c].size_kib == 8192;
        }
        CHECK(l1 && l2);
        CHECK_EQ(n->n_io_links, 1);
        CHECK_EQ(t->nodes[0].n_io_links, 1);
        /* The properties are kept whole and in file order. */
        CHECK(strcmp(n->props.items[0].key, "cpu_cores_count") == 0);
        CHECK(strcmp(n->props.items[n->props.n - 1].key, "max_engine_clk_ccompute") == 0);
        uint64_t v = 0;
        CHECK(thunk_props_get(&n->props, "num_cp_queues", &v) && v == 24);
        CHECK(!thunk_props_get(&n->props, "no_such_key", &v));
        CHECK(thunk_props_get(&t->system_props, "platform_rev", &v) && v == 1);
        CHECK(thunk_topology_free(t) == NULL);
}

/* A trimmed dump of a real Ryzen + RX 7900 XTX machine (kernel-written keys, values and newlines). */
static void test_real_fixture(void)
{
        ThunkTopology *t = load_ok(TOPO_DATA_DIR "/rx7900xtx");
        if (!t)
                return;
        CHECK_EQ(t->generation_id, 5);
        CHECK_EQ(t->platform_id, 5785802528398729537ULL);
        CHECK_EQ(t->n_nodes, 2);
        CHECK_EQ(t->n_gpus, 1);
        const ThunkNode *c = &t->nodes[0], *g = &t->nodes[1];
        CHECK(!c->is_gpu && c->cpu_cores_count == 32 && c->n_caches == 0);
        CHECK(strcmp(c->name, "") == 0);
        CHECK(g->is_gpu && g->gpu_id == 48461);
        CHECK(strcmp(g->name, "ip discovery") == 0);
        CHECK_EQ(g->unique_id, 12876390612719219747ULL); /* above 2^63 */
        CHECK_EQ(g->capability, 671588992);
        CHECK_EQ(g->local_mem_size, 0);
        CHECK_EQ(g->mem_banks[0].size_in_bytes, 25753026560ULL);
        CHECK_EQ(g->mem_banks[0].heap_type, 1);
        CHECK_EQ(g->n_caches, 6);
        CHECK_EQ(g->caches[5].size_kib, 98304);
        CHECK_EQ(g->caches[3].type, 10);
        /* sibling_map is a list: validated, not kept as a number. */
        CHECK(!thunk_props_get(&g->caches[4].props, "sibling_map", NULL));
        CHECK_EQ(g->caches[4].props.n, 8);
        /* A single-entry sibling_map is a plain number and is kept. */
        uint64_t v = 0;
        CHECK(thunk_props_get(&g->caches[0].props, "sibling_map", &v) && v == 1);
        CHECK_EQ(g->numa_node, 0);
        CHECK_EQ(g->io_links[0].max_bandwidth, 64000);
        CHECK(thunk_topology_free(t) == NULL);
}

/* ---- malformed trees ---- */

static char tmpl[] = "/tmp/topo-test-XXXXXX";
static char *tmproot;

__attribute__((format(printf, 2, 3))) static void put(const char *rel, const char *fmt, ...)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", tmproot, rel);
        for (char *s = path + strlen(tmproot) + 1; (s = strchr(s, '/')); s++) {
                *s = '\0';
                (void)mkdir(path, 0755);
                *s = '/';
        }
        FILE *f = fopen(path, "w");
        if (!f) {
                perror(path);
                exit(2);
        }
        va_list ap;
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fclose(f);
}

static void del(const char *rel)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", tmproot, rel);
        (void)unlink(path);
}

/* Remove @dir/0 .. @dir/n-1 with their properties files. */
static void rm_children(const char *dir, int n)
{
        char rel[256];
        for (int i = 0; i < n; i++) {
                snprintf(rel, sizeof(rel), "%s/%d/properties", dir, i);
                del(rel);
                snprintf(rel, sizeof(rel), "%s/%s/%d", tmproot, dir, i);
                (void)rmdir(rel);
        }
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        return remove(p);
}

static void rm_tree(void)
{
        (void)nftw(tmproot, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* The GPU node's properties with @simd as simd_count and @banks as mem_banks_count (string literals). */
#define GPU_PROPS(simd, banks)                                                                               \
        "cpu_cores_count 0\nsimd_count " simd "\nmem_banks_count " banks "\ncaches_count 1\n"                \
        "io_links_count 1\ncapability 134217728\ndrm_render_minor 128\n"

/* A minimal valid tree: CPU node 0, GPU node 1 (gpu_id 4660), one bank, one cache, links both ways. */
static void make_valid(void)
{
        rm_tree();
        (void)mkdir(tmproot, 0700);
        put("generation_id", "1\n");
        put("system_properties", "platform_oem 1\nplatform_id 2\nplatform_rev 3\n");
        put("nodes/0/gpu_id", "0\n");
        put("nodes/0/name", "\n");
        put("nodes/0/properties", "cpu_cores_count 4\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n"
                                  "io_links_count 1\n");
        put("nodes/0/mem_banks/0/properties", "heap_type 0\nsize_in_bytes 1073741824\n");
        put("nodes/0/io_links/0/properties", "type 2\nnode_from 0\nnode_to 1\nweight 20\n");
        put("nodes/1/gpu_id", "4660\n");
        put("nodes/1/name", "arcturus\n");
        put("nodes/1/properties", "%s", GPU_PROPS("16", "1"));
        put("nodes/1/mem_banks/0/properties", "heap_type 1\nsize_in_bytes 1073741824\n");
        put("nodes/1/caches/0/properties", "level 1\nsize 16\ntype 9\n");
        put("nodes/1/io_links/0/properties", "type 2\nnode_from 1\nnode_to 0\nweight 20\n");
}

/* Load the temporary tree and expect @err with every @needles substring in the message. */
static void expect_fail(int line, int err, const char *needle1, const char *needle2)
{
        char msg[512] = "";
        ThunkTopology *sentinel = (ThunkTopology *)&msg, *t = sentinel;
        int r = thunk_topology_load(tmproot, &t, msg, sizeof(msg));
        if (r != err || t != sentinel || (needle1 && !strstr(msg, needle1)) ||
            (needle2 && !strstr(msg, needle2))) {
                check_failed(__FILE__, line, "expected %d with '%s' '%s', got %d '%s'", err,
                             needle1 ? needle1 : "", needle2 ? needle2 : "", r, msg);
                if (r == 0 && t != sentinel)
                        thunk_topology_free(t);
        }
}

#define EXPECT_FAIL(err, n1, n2) expect_fail(__LINE__, err, n1, n2)

/*
 * A tree that must be refused: the valid one (@fresh) or the tree the case before left, with @path written
 * as @text or deleted (@text NULL), and with @path2 changed the same way when it is set. The load fails with
 * @err, and its message names @where and @what (when set).
 */
typedef struct BadTree {
        int line;
        bool fresh;
        const char *path, *text, *path2, *text2;
        int err;
        const char *where, *what;
} BadTree;
#define DELETED NULL
#define BAD(fresh, path, text, err, where, what)                                                             \
        {                                                                                                    \
                __LINE__, fresh, path, text, NULL, NULL, err, where, what                                    \
        }
#define BAD2(path, text, path2, text2, err, where, what)                                                     \
        {                                                                                                    \
                __LINE__, true, path, text, path2, text2, err, where, what                                   \
        }

static const BadTree bad_trees[] = {
        /* Values (the tree the NUMA cases left, its GPU node's properties rewritten) */
        BAD(false, "nodes/1/properties", GPU_PROPS("abc", "1"), -EINVAL,
            "nodes/1/properties:2:", "not a number"),
        BAD(false, "nodes/1/properties", GPU_PROPS("-3", "1"), -EINVAL,
            "nodes/1/properties:2:", "not a number"),
        BAD(false, "nodes/1/properties", GPU_PROPS("0x10", "1"), -EINVAL, "nodes/1/properties:2:", NULL),
        BAD(false, "nodes/1/properties", GPU_PROPS("16 17", "1"), -EINVAL, "nodes/1/properties:2:", NULL),
        BAD(false, "nodes/1/properties", GPU_PROPS("18446744073709551616", "1"), -ERANGE,
            "nodes/1/properties:2:", "64 bits"),
        BAD(false, "nodes/1/properties", GPU_PROPS("4294967296", "1"), -ERANGE,
            "nodes/1/properties:2:", "32 bits"),
        BAD(false, "nodes/1/properties", "cpu_cores_count 0\nsimd_count\n", -EINVAL,
            "nodes/1/properties:2:", "no value"),
        BAD(false, "nodes/1/properties", "cpu_cores_count 0\n\nsimd-count 16\n", -EINVAL,
            "nodes/1/properties:3:", "malformed key"),
        BAD(false, "nodes/1/properties", "simd_count 16\nsimd_count 16\n", -EINVAL,
            "nodes/1/properties:2:", "repeats line 1"),
        BAD(false, "nodes/1/properties", "a_key_that_is_far_too_long_to_be_any_real_kfd_property 1\n", -E2BIG,
            "nodes/1/properties:1:", NULL),
        BAD(true, "nodes/1/mem_banks/0/properties", "heap_type 1\nsize_in_bytes 1,2,x\n", -EINVAL,
            "nodes/1/mem_banks/0/properties:2:", NULL),

        /* Single-number files */
        BAD(true, "nodes/1/gpu_id", "12ab\n", -EINVAL, "nodes/1/gpu_id:1:", NULL),
        BAD(false, "nodes/1/gpu_id", "", -EINVAL, "nodes/1/gpu_id", NULL), /* an empty file */
        BAD(false, "nodes/1/gpu_id", "4294967296\n", -ERANGE, "nodes/1/gpu_id", NULL),
        BAD(true, "generation_id", "x\n", -EINVAL, "generation_id:1:", NULL),
        BAD(true, "nodes/1/name",
            "a_name_that_is_longer_than_sixty_three_characters_which_the_kernel_never_writes\n", -E2BIG,
            "nodes/1/name", NULL),

        /* Missing files */
        BAD(true, "nodes/1/properties", DELETED, -ENOENT, "nodes/1/properties", "missing"),
        BAD(true, "nodes/1/gpu_id", DELETED, -ENOENT, "nodes/1/gpu_id", "missing"),
        BAD(true, "system_properties", DELETED, -ENOENT, "system_properties", "missing"),
        BAD(true, "nodes/1/caches/0/properties", DELETED, -ENOENT, "nodes/1/caches/0/properties", "missing"),

        /* Numbering and counts */
        BAD(true, "nodes/foo/gpu_id", "0\n", -EINVAL, "nodes", "unexpected entry 'foo'"),
        BAD(true, "nodes/01/gpu_id", "0\n", -EINVAL, "nodes", "unexpected entry '01'"),
        BAD(true, "nodes/256/gpu_id", "0\n", -E2BIG, "nodes", "limit of 256"),
        BAD(true, "nodes/1/properties", GPU_PROPS("16", "2"), -EINVAL,
            "nodes/1/properties:3:", "mem_banks_count is 2 but nodes/1/mem_banks/ has 1"),
        BAD(true, "nodes/1/mem_banks/1/properties", "heap_type 1\n", -EINVAL,
            "nodes/1/properties:3:", "mem_banks_count is 1"),
        BAD(true, "nodes/1/caches/4096/properties", "level 1\n", -E2BIG, "nodes/1/caches", "limit of 4096"),

        /* Cross-node rules */
        BAD(true, "nodes/1/gpu_id", "0\n", -EINVAL, "nodes/1/properties:2:", "gpu_id is 0"),
        BAD(true, "nodes/0/gpu_id", "7\n", -EINVAL, "nodes/0/properties", "no SIMDs"),
        BAD2("nodes/0/properties", "cpu_cores_count 0\nsimd_count 8\nmem_banks_count 1\nio_links_count 1\n",
             "nodes/0/gpu_id", "4660\n", -EINVAL, "nodes/1/gpu_id:1:", "already used by node 0"),
        BAD(true, "nodes/1/io_links/0/properties", "type 2\nnode_from 1\nnode_to 5\nweight 20\n", -EINVAL,
            "nodes/1/io_links/0/properties", "node_to 5"),
        BAD(true, "nodes/1/io_links/0/properties", "type 2\nnode_from 0\nnode_to 0\nweight 20\n", -EINVAL,
            "nodes/1/io_links/0/properties:2:", "node_from is 0"),
        BAD(true, "nodes/1/io_links/0/properties", "type 2\nweight 20\n", -EINVAL,
            "nodes/1/io_links/0/properties", "node_to"),

        /* Files and directories in each other's places: the step that failed is named */
        BAD2("nodes/1/gpu_id", DELETED, "nodes/1/gpu_id/x", "1\n", -EISDIR,
             "nodes/1/gpu_id: read failed: ", NULL),
};

static void change(const char *path, const char *text)
{
        if (text)
                put(path, "%s", text);
        else
                del(path);
}

static void test_malformed(void)
{
        tmproot = mkdtemp(tmpl);
        if (!tmproot) {
                perror("mkdtemp");
                check_failures++;
                return;
        }

        make_valid();
        ThunkTopology *t = load_ok(tmproot);
        CHECK(t && t->n_gpus == 1 && t->nodes[1].numa_node == 0);
        thunk_topology_free(t);

        /* NUMA rule: the lowest-weight link to a CPU-bearing node wins, the first one on a tie. */
        make_valid();
        put("nodes/1/properties", "cpu_cores_count 0\nsimd_count 16\nio_links_count 3\n");
        put("nodes/1/io_links/0/properties", "type 2\nnode_from 1\nnode_to 0\nweight 32\n");
        put("nodes/1/io_links/1/properties", "type 2\nnode_from 1\nnode_to 2\nweight 20\n");
        put("nodes/1/io_links/2/properties", "type 2\nnode_from 1\nnode_to 3\nweight 20\n");
        put("nodes/2/gpu_id", "0\n");
        put("nodes/2/properties", "cpu_cores_count 8\n");
        put("nodes/3/gpu_id", "0\n");
        put("nodes/3/properties", "cpu_cores_count 8\n");
        t = load_ok(tmproot);
        CHECK(t && t->nodes[1].numa_node == 1 && t->nodes[2].numa_node == 1 && t->nodes[3].numa_node == 2);
        thunk_topology_free(t);
        put("nodes/1/io_links/0/properties", "type 2\nnode_from 1\nnode_to 0\nweight 20\n");
        t = load_ok(tmproot);
        CHECK(t && t->nodes[1].numa_node == 0);
        thunk_topology_free(t);
        put("nodes/1/properties", "cpu_cores_count 0\nsimd_count 16\nio_links_count 0\n");
        rm_children("nodes/1/io_links", 3);
        t = load_ok(tmproot);
        CHECK(t && t->nodes[1].numa_node == -1);
        thunk_topology_free(t);

        for (size_t i = 0; i < ARRAY_SIZE(bad_trees); i++) {
                const BadTree *b = &bad_trees[i];

                if (b->fresh)
                        make_valid();
                change(b->path, b->text);
                if (b->path2)
                        change(b->path2, b->text2);
                expect_fail(b->line, b->err, b->where, b->what);
        }
        {
                char *longline = malloc(THUNK_TOPOLOGY_MAX_LINE + 64);
                memset(longline, '1', THUNK_TOPOLOGY_MAX_LINE + 10);
                longline[THUNK_TOPOLOGY_MAX_LINE + 10] = '\0';
                make_valid();
                put("nodes/1/caches/0/properties", "level 1\nsibling_map %s\n", longline);
                EXPECT_FAIL(-E2BIG, "nodes/1/caches/0/properties:2:", "line longer");
                free(longline);
        }
        make_valid();
        del("nodes/0/name"); /* optional */
        t = load_ok(tmproot);
        thunk_topology_free(t);
        make_valid();
        put("nodes/2/gpu_id", "0\n");
        {
                char from[1024], to[1024];
                snprintf(from, sizeof(from), "%s/nodes/2", tmproot);
                snprintf(to, sizeof(to), "%s/nodes/3", tmproot);
                CHECK(rename(from, to) == 0);
        }
        EXPECT_FAIL(-EINVAL, "nodes", "2 is missing");
        make_valid();
        rm_children("nodes/1/caches", 1);
        {
                char dir[1024];
                snprintf(dir, sizeof(dir), "%s/nodes/1/caches", tmproot);
                CHECK(rmdir(dir) == 0);
        }
        put("nodes/1/caches", "level 1\n");
        EXPECT_FAIL(-ENOTDIR, "nodes/1/caches: cannot open directory: ", NULL);

        /* Root and arguments */
        {
                char msg[256] = "";
                ThunkTopology *out = NULL;
                CHECK_EQ(thunk_topology_load("/nonexistent/topology", &out, msg, sizeof(msg)), -ENOENT);
                CHECK(strstr(msg, "/nonexistent/topology") != NULL);
                CHECK(out == NULL);
                CHECK_EQ(thunk_topology_load(tmproot, NULL, NULL, 0), -EINVAL);
                make_valid();
                put("nodes/1/gpu_id", "zz\n");
                CHECK_EQ(thunk_topology_load(tmproot, &out, NULL, 0), -EINVAL); /* no message buffer */
                char tiny[8];
                CHECK_EQ(thunk_topology_load(tmproot, &out, tiny, sizeof(tiny)), -EINVAL);
                CHECK(strlen(tiny) == 7);
                CHECK(out == NULL);
        }
        CHECK(thunk_topology_free(NULL) == NULL);
        rm_tree();
}

/* ---- the source seam: a tree in memory ---- */

/* A file of the tree; a NULL content makes an empty directory. Other directories follow from the paths. */
typedef struct MemFile {
        const char *path;
        const char *content;
} MemFile;

typedef struct MemSource {
        const MemFile *files;
        size_t n;
        const char *fail_path; /* reading or listing this path fails with fail_err and fail_what */
        int fail_err;
        const char *fail_what;
        bool ignore_stop; /* list_dir goes on when @each says stop, and returns 0 */
} MemSource;

/* @path is @dir or under it: 1 for @dir itself, 2 for below it (the child's name at *child), else 0. */
static int mem_under(const char *path, const char *dir, const char **child)
{
        size_t l = strlen(dir);
        if (strncmp(path, dir, l) != 0)
                return 0;
        if (path[l] == '\0')
                return 1;
        if (path[l] != '/')
                return 0;
        *child = path + l + 1;
        return 2;
}

static int mem_read_file(void *ctx, const char *rel, char *buf, size_t cap, size_t *ret_len,
                         const char **ret_what)
{
        const MemSource *m = ctx;
        const char *child;
        if (m->fail_path && strcmp(rel, m->fail_path) == 0) {
                *ret_what = m->fail_what;
                return m->fail_err;
        }
        for (size_t i = 0; i < m->n; i++) {
                int u = mem_under(m->files[i].path, rel, &child);
                if (u == 2 || (u == 1 && !m->files[i].content))
                        return -EISDIR;
                if (u == 1) {
                        size_t len = strlen(m->files[i].content);
                        if (len > cap)
                                return -E2BIG;
                        memcpy(buf, m->files[i].content, len);
                        *ret_len = len;
                        return 0;
                }
        }
        return -ENOENT;
}

static int mem_list_dir(void *ctx, const char *rel, int (*each)(void *each_ctx, const char *name),
                        void *each_ctx, const char **ret_what)
{
        const MemSource *m = ctx;
        const char *child, *prev;
        bool exists = false;
        int r = 0;
        if (m->fail_path && strcmp(rel, m->fail_path) == 0) {
                *ret_what = m->fail_what;
                return m->fail_err;
        }
        for (size_t i = 0; i < m->n; i++) {
                int u = mem_under(m->files[i].path, rel, &child);
                if (u == 1 && m->files[i].content)
                        return -ENOTDIR;
                exists = exists || u != 0;
        }
        if (!exists)
                return -ENOENT;
        const char *dots[] = {".", "..", ".hidden"}; /* ignored by the parser */
        for (size_t i = 0; i < 3; i++)
                if (each(each_ctx, dots[i]) < 0)
                        return -EBADE; /* the parser stopped on a dot name */
        for (size_t i = 0; i < m->n && (r == 0 || m->ignore_stop); i++) {
                if (mem_under(m->files[i].path, rel, &child) != 2)
                        continue;
                char name[64];
                size_t l = strcspn(child, "/");
                bool again = false;
                for (size_t j = 0; j < i && !again; j++) /* each name once */
                        again = mem_under(m->files[j].path, rel, &prev) == 2 &&
                                strncmp(prev, child, l) == 0 && (prev[l] == '/' || prev[l] == '\0');
                if (again || l >= sizeof(name))
                        continue;
                memcpy(name, child, l);
                name[l] = '\0';
                int q = each(each_ctx, name);
                if (r == 0)
                        r = q;
        }
        return m->ignore_stop ? 0 : r;
}

/* make_valid()'s tree, and an empty directory that is not part of the layout's numbering */
static MemFile mem_valid[] = {
        {"generation_id", "1\n"},
        {"system_properties", "platform_oem 1\nplatform_id 2\nplatform_rev 3\n"},
        {"nodes/0/gpu_id", "0\n"},
        {"nodes/0/name", "\n"},
        {"nodes/0/properties", "cpu_cores_count 4\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n"
                               "io_links_count 1\n"},
        {"nodes/0/mem_banks/0/properties", "heap_type 0\nsize_in_bytes 1073741824\n"},
        {"nodes/0/io_links/0/properties", "type 2\nnode_from 0\nnode_to 1\nweight 20\n"},
        {"nodes/1/gpu_id", "4660\n"},
        {"nodes/1/name", "arcturus\n"},
        {"nodes/1/properties", "cpu_cores_count 0\nsimd_count 16\nmem_banks_count 1\ncaches_count 1\n"
                               "io_links_count 1\ncapability 134217728\ndrm_render_minor 128\n"},
        {"nodes/1/mem_banks/0/properties", "heap_type 1\nsize_in_bytes 1073741824\n"},
        {"nodes/1/caches/0/properties", "level 1\nsize 16\ntype 9\n"},
        {"nodes/1/io_links/0/properties", "type 2\nnode_from 1\nnode_to 0\nweight 20\n"},
        {"nodes/0/p2p_links", NULL},
};

#define MEM_N (sizeof(mem_valid) / sizeof(mem_valid[0]))

static void expect_source_fail(int line, MemSource *m, int err, const char *msg_expected)
{
        ThunkTopologySource src = {.ctx = m, .read_file = mem_read_file, .list_dir = mem_list_dir};
        char msg[512] = "";
        ThunkTopology *sentinel = (ThunkTopology *)&msg, *t = sentinel;
        int r = thunk_topology_load_source(&src, "memory", &t, msg, sizeof(msg));
        if (r != err || t != sentinel || strcmp(msg, msg_expected) != 0) {
                check_failed(__FILE__, line, "expected %d '%s', got %d '%s'", err, msg_expected, r, msg);
                if (r == 0 && t != sentinel)
                        thunk_topology_free(t);
        }
}

#define EXPECT_SOURCE_FAIL(m, err, msg) expect_source_fail(__LINE__, m, err, msg)

static void test_source(void)
{
        MemSource m = {.files = mem_valid, .n = MEM_N};
        ThunkTopologySource src = {.ctx = &m, .read_file = mem_read_file, .list_dir = mem_list_dir};
        ThunkTopology *t = NULL;
        char msg[512] = "";

        CHECK_EQ(thunk_topology_load_source(&src, "broker:topology", &t, msg, sizeof(msg)), 0);
        if (t) {
                CHECK(strcmp(t->root, "broker:topology") == 0);
                CHECK_EQ(t->generation_id, 1);
                CHECK_EQ(t->platform_rev, 3);
                CHECK_EQ(t->n_nodes, 2);
                CHECK_EQ(t->n_gpus, 1);
                CHECK(strcmp(t->nodes[1].name, "arcturus") == 0);
                CHECK_EQ(t->nodes[1].gpu_id, 4660);
                CHECK_EQ(t->nodes[1].numa_node, 0);
                CHECK_EQ(t->nodes[1].n_caches, 1);
                CHECK_EQ(t->nodes[0].n_p2p_links, 0);
                thunk_topology_free(t);
        }

        /* The source's errors, with its phrase or the parser's own */
        m.fail_path = "nodes/1/properties";
        m.fail_err = -EIO;
        EXPECT_SOURCE_FAIL(&m, -EIO, "nodes/1/properties: cannot read: Input/output error");
        m.fail_what = "fetch failed";
        EXPECT_SOURCE_FAIL(&m, -EIO, "nodes/1/properties: fetch failed: Input/output error");
        m.fail_err = -E2BIG;
        EXPECT_SOURCE_FAIL(&m, -E2BIG, "nodes/1/properties: file larger than 65536 bytes");
        m.fail_path = "nodes/1/caches";
        m.fail_err = -EIO;
        m.fail_what = NULL;
        EXPECT_SOURCE_FAIL(&m, -EIO, "nodes/1/caches: cannot read directory: Input/output error");
        m.fail_path = "nodes/0/name"; /* an optional file: missing is fine */
        m.fail_err = -ENOENT;
        t = NULL;
        CHECK_EQ(thunk_topology_load_source(&src, "memory", &t, msg, sizeof(msg)), 0);
        CHECK(t && t->nodes[0].name[0] == '\0');
        thunk_topology_free(t);
        m.fail_path = "nodes/1/gpu_id";
        EXPECT_SOURCE_FAIL(&m, -ENOENT, "nodes/1/gpu_id: missing");
        m.fail_path = NULL;

        /* The tree's own faults */
        MemFile files[MEM_N];
        memcpy(files, mem_valid, sizeof(mem_valid));
        m.files = files;
        files[2] = (MemFile){"nodes/0/gpu_id/0", "0\n"}; /* gpu_id is a directory */
        EXPECT_SOURCE_FAIL(&m, -EISDIR, "nodes/0/gpu_id: cannot read: Is a directory");
        memcpy(files, mem_valid, sizeof(mem_valid));
        files[MEM_N - 1] = (MemFile){"nodes/1/io_links/x", "1\n"};
        EXPECT_SOURCE_FAIL(&m, -EINVAL,
                           "nodes/1/io_links: unexpected entry 'x' (entries are numbered 0..n-1)");
        m.ignore_stop = true; /* a source that goes on after the parser said stop: the refusal stands */
        EXPECT_SOURCE_FAIL(&m, -EINVAL,
                           "nodes/1/io_links: unexpected entry 'x' (entries are numbered 0..n-1)");
        m.ignore_stop = false;
        memcpy(files, mem_valid, sizeof(mem_valid));
        files[10] = (MemFile){"nodes/1/mem_banks", "heap_type 1\n"}; /* a file where a directory belongs */
        EXPECT_SOURCE_FAIL(&m, -ENOTDIR, "nodes/1/mem_banks: cannot read directory: Not a directory");
        memcpy(files, mem_valid, sizeof(mem_valid));
        char *big = malloc(THUNK_TOPOLOGY_MAX_FILE + 2);
        if (big) {
                memset(big, '\n', THUNK_TOPOLOGY_MAX_FILE + 1);
                big[THUNK_TOPOLOGY_MAX_FILE + 1] = '\0';
                files[0].content = big;
                EXPECT_SOURCE_FAIL(&m, -E2BIG, "generation_id: file larger than 65536 bytes");
                big[THUNK_TOPOLOGY_MAX_FILE] = '\0'; /* exactly the limit: read, then refused as empty */
                EXPECT_SOURCE_FAIL(&m, -EINVAL, "generation_id:1: '' is not a number");
                free(big);
        }
        m.files = mem_valid;

        /* Arguments: -EINVAL without a message, the result untouched */
        ThunkTopology *sentinel = (ThunkTopology *)&msg;
        ThunkTopologySource no_read = src, no_list = src;
        no_read.read_file = NULL;
        no_list.list_dir = NULL;
        t = sentinel;
        msg[0] = '\0';
        CHECK_EQ(thunk_topology_load_source(NULL, "memory", &t, msg, sizeof(msg)), -EINVAL);
        CHECK_EQ(thunk_topology_load_source(&no_read, "memory", &t, msg, sizeof(msg)), -EINVAL);
        CHECK_EQ(thunk_topology_load_source(&no_list, "memory", &t, msg, sizeof(msg)), -EINVAL);
        CHECK_EQ(thunk_topology_load_source(&src, NULL, &t, msg, sizeof(msg)), -EINVAL);
        CHECK_EQ(thunk_topology_load_source(&src, "memory", NULL, msg, sizeof(msg)), -EINVAL);
        CHECK(t == sentinel && msg[0] == '\0');
}

/* ---- writing a tree out and reading it back ---- */

typedef struct DirWriter {
        char root[256];
        int err;
} DirWriter;

static int write_into_dir(void *ctx, const char *rel, const char *content, size_t len)
{
        DirWriter *w = ctx;
        char path[512];
        int fd;

        snprintf(path, sizeof(path), "%s/%s", w->root, rel);
        for (char *p = path + strlen(w->root) + 1; (p = strchr(p, '/')); p++) {
                *p = '\0';
                (void)mkdir(path, 0700);
                *p = '/';
        }
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, content, len) != (ssize_t)len) {
                w->err = -errno;
                if (fd >= 0)
                        close(fd);
                return w->err;
        }
        close(fd);
        return 0;
}

static void check_props_equal(const ThunkProps *a, const ThunkProps *b, const char *what)
{
        CHECK_EQ(a->n, b->n);
        for (size_t i = 0; i < a->n && i < b->n; i++) {
                if (strcmp(a->items[i].key, b->items[i].key) != 0 || a->items[i].value != b->items[i].value) {
                        fprintf(stderr, "%s: property %zu differs: %s %llu vs %s %llu\n", what, i,
                                a->items[i].key, (unsigned long long)a->items[i].value, b->items[i].key,
                                (unsigned long long)b->items[i].value);
                        check_failures++;
                        return;
                }
        }
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        return remove(path);
}

/* Every preset, written out and parsed again, is the same topology (what a client-side KFD serves). */
static void test_write_round_trip(void)
{
        static const char *const presets[] = {"mi300x", "mi100", "workstation", "apu", "gfx908"};

        for (size_t k = 0; k < sizeof(presets) / sizeof(presets[0]); k++) {
                ThunkTopology *a = load_preset(presets[k]), *b;
                DirWriter w = {.err = 0};

                if (!a)
                        continue;
                snprintf(w.root, sizeof(w.root), "/tmp/gpumem-topo-XXXXXX");
                ASSERT(mkdtemp(w.root));
                CHECK_EQ(thunk_topology_write(a, write_into_dir, &w), 0);
                CHECK_EQ(w.err, 0);
                b = load_ok(w.root);
                if (b) {
                        CHECK_EQ(b->generation_id, a->generation_id);
                        CHECK_EQ(b->n_nodes, a->n_nodes);
                        check_props_equal(&a->system_props, &b->system_props, "system_properties");
                        for (size_t i = 0; i < a->n_nodes && i < b->n_nodes; i++) {
                                const ThunkNode *x = &a->nodes[i], *y = &b->nodes[i];
                                CHECK_EQ(y->gpu_id, x->gpu_id);
                                CHECK(strcmp(y->name, x->name) == 0);
                                check_props_equal(&x->props, &y->props, "node");
                                CHECK_EQ(y->n_mem_banks, x->n_mem_banks);
                                CHECK_EQ(y->n_caches, x->n_caches);
                                CHECK_EQ(y->n_io_links, x->n_io_links);
                                CHECK_EQ(y->n_p2p_links, x->n_p2p_links);
                                for (size_t j = 0; j < x->n_mem_banks && j < y->n_mem_banks; j++)
                                        check_props_equal(&x->mem_banks[j].props, &y->mem_banks[j].props,
                                                          "mem bank");
                                for (size_t j = 0; j < x->n_caches && j < y->n_caches; j++)
                                        check_props_equal(&x->caches[j].props, &y->caches[j].props, "cache");
                                for (size_t j = 0; j < x->n_io_links && j < y->n_io_links; j++)
                                        check_props_equal(&x->io_links[j].props, &y->io_links[j].props,
                                                          "io link");
                        }
                        thunk_topology_free(b);
                }
                nftw(w.root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
                thunk_topology_free(a);
        }
        CHECK_EQ(thunk_topology_write(NULL, write_into_dir, NULL), -EINVAL);
}

int main(void)
{
        int fds = count_fds(0);
        test_mi300x();
        test_mi100();
        test_workstation();
        test_apu();
        test_gfx908();
        test_real_fixture();
        test_malformed();
        test_source();
        test_write_round_trip();
        CHECK_EQ(count_fds(0), fds); /* every error path closed what it opened */
        if (check_failures) {
                fprintf(stderr, "%d check(s) failed\n", check_failures);
                return 1;
        }
        printf("topology: all checks passed\n");
        return 0;
}
