/* Query ops: the topology (decoded, or every raw property), and its sysfs files as each client gets them. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kfd_sysfs.h>

#include "broker/broker.h"
#include "server/class-state.h"
#include "server/core.h"
#include "request.h"
#include "frame.h"
#include "topology.h"

typedef struct TopoBufs {
        Gpumem__TopologyNode *nodes;
        Gpumem__TopologyNode **node_ptrs;
        Gpumem__Prop *props;
        Gpumem__Prop **prop_ptrs;
        Gpumem__IoLink *links;
        Gpumem__IoLink **link_ptrs;
} TopoBufs;

static void topo_bufs_done(TopoBufs *b)
{
        free(b->nodes);
        free(b->node_ptrs);
        free(b->props);
        free(b->prop_ptrs);
        free(b->links);
        free(b->link_ptrs);
}

/* Pack the topology reply (with or without every raw property) into a new buffer. */
static int topology_pack(const ThunkTopology *t, bool with_props, uint8_t **ret, size_t *ret_len)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status st = GPUMEM__STATUS__INIT;
        Gpumem__TopologyReply tr = GPUMEM__TOPOLOGY_REPLY__INIT;
        TopoBufs b = {0};
        size_t n_props = 0, n_links = 0, pi = 0, li = 0;
        uint8_t *buf;
        size_t len;

        for (size_t i = 0; i < t->n_nodes; i++) {
                n_props += with_props ? t->nodes[i].props.n : 0;
                n_links += t->nodes[i].n_io_links;
        }
        b.nodes = calloc(t->n_nodes ? t->n_nodes : 1, sizeof(*b.nodes));
        b.node_ptrs = calloc(t->n_nodes ? t->n_nodes : 1, sizeof(*b.node_ptrs));
        b.props = calloc(n_props ? n_props : 1, sizeof(*b.props));
        b.prop_ptrs = calloc(n_props ? n_props : 1, sizeof(*b.prop_ptrs));
        b.links = calloc(n_links ? n_links : 1, sizeof(*b.links));
        b.link_ptrs = calloc(n_links ? n_links : 1, sizeof(*b.link_ptrs));
        if (!b.nodes || !b.node_ptrs || !b.props || !b.prop_ptrs || !b.links || !b.link_ptrs) {
                topo_bufs_done(&b);
                return -ENOMEM;
        }

        for (size_t i = 0; i < t->n_nodes; i++) {
                const ThunkNode *n = &t->nodes[i];
                Gpumem__TopologyNode *o = &b.nodes[i];
                uint64_t sysmem = thunk_node_system_bytes(n);
                bool large_bar = thunk_node_has_public_vram(n);

                /* Bin-packed by hand: clang-format puts a designated initializer one member to a line. */
                // clang-format off
                *o = (Gpumem__TopologyNode){
                        MSG_INIT(gpumem__topology_node), OPT(node_id, n->node_id), OPT(gpu_id, n->gpu_id),
                        OPT(is_gpu, n->is_gpu), .name = (char *)n->name, OPT(cpu_cores, n->cpu_cores_count),
                        OPT(simd_count, n->simd_count), OPT(local_mem_size, n->local_mem_size),
                        OPT(gfx_target_version, n->gfx_target_version), OPT(vendor_id, n->vendor_id),
                        OPT(device_id, n->device_id), OPT(pci_domain, n->domain),
                        OPT(pci_location, n->location_id), OPT(drm_render_minor, n->drm_render_minor),
                        OPT(hive_id, n->hive_id), OPT(numa_node, n->numa_node), OPT(capability, n->capability),
                        .has_large_bar = n->is_gpu, .large_bar = large_bar,
                        .has_system_mem_size = sysmem != 0, .system_mem_size = sysmem
                };
                // clang-format on
                b.node_ptrs[i] = o;
                if (with_props) {
                        o->properties = &b.prop_ptrs[pi];
                        o->n_properties = n->props.n;
                        for (size_t k = 0; k < n->props.n; k++, pi++) {
                                gpumem__prop__init(&b.props[pi]);
                                b.props[pi].key = (char *)n->props.items[k].key;
                                b.props[pi].has_value = true;
                                b.props[pi].value = n->props.items[k].value;
                                b.prop_ptrs[pi] = &b.props[pi];
                        }
                }
                o->io_links = &b.link_ptrs[li];
                o->n_io_links = n->n_io_links;
                for (size_t k = 0; k < n->n_io_links; k++, li++) {
                        const ThunkIoLink *l = &n->io_links[k];
                        Gpumem__IoLink *ol = &b.links[li];
                        gpumem__io_link__init(ol);
                        ol->has_type = ol->has_node_from = ol->has_node_to = ol->has_weight = true;
                        ol->type = l->type;
                        ol->node_from = l->node_from;
                        ol->node_to = l->node_to;
                        ol->weight = l->weight;
                        ol->has_min_bandwidth = ol->has_max_bandwidth = true;
                        ol->min_bandwidth = l->min_bandwidth;
                        ol->max_bandwidth = l->max_bandwidth;
                        b.link_ptrs[li] = ol;
                }
        }
        tr.has_generation_id = true;
        tr.generation_id = t->generation_id;
        tr.n_nodes = t->n_nodes;
        tr.nodes = b.node_ptrs;
        st.has_code = true;
        reply.status = &st;
        reply.result_case = GPUMEM__REPLY__RESULT_TOPOLOGY;
        reply.topology = &tr;
        len = gpumem__reply__get_packed_size(&reply);
        buf = malloc(len ? len : 1);
        if (buf)
                gpumem__reply__pack(&reply, buf);
        topo_bufs_done(&b);
        if (!buf)
                return -ENOMEM;
        *ret = buf;
        *ret_len = len;
        return 0;
}

int op_topology(ReqCtx *r, const Gpumem__Request *req)
{
        const Manager *m = r->m;
        int with_props = req->topology->has_with_properties && req->topology->with_properties;

        /* every client asks at start, and the answer never changes: packed once, at start
         * (manager_new), and read by every loop without the lock */
        return reply_ok_packed(r, m->topology_reply[with_props], m->topology_reply_len[with_props]);
}

int op_tile_config(ReqCtx *r, const Gpumem__Request *req)
{
        uint32_t gpu_id = req->tile_config->gpu_id;
        DriverTileConfig t;
        int err;

        if (broker_gpu_index(r->m->broker, gpu_id) < 0)
                return reply_fail(r, -ENODEV, "no GPU with id %u", gpu_id);
        err = driver_tile_config(r->m->drv, gpu_id, &t);
        if (err < 0)
                return reply_fail(r, err, "the driver cannot report GPU %u's tiling: %s", gpu_id,
                                  strerror(-err));
        /* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
        // clang-format off
        Gpumem__TileConfigReply tr = {
                MSG_INIT(gpumem__tile_config_reply), OPT(gb_addr_config, t.gb_addr_config),
                OPT(num_banks, t.num_banks), OPT(num_ranks, t.num_ranks), .n_tile_config = t.n_tile,
                .tile_config = t.tile, .n_macro_tile_config = t.n_macro, .macro_tile_config = t.macro
        };
        // clang-format on
        return reply_result(r, &tr);
}

/* Files of a reply at most: what fits well inside one frame (the daemon's topology files are small). */
#define TOPOLOGY_FILES_PER_REPLY 256
#define TOPOLOGY_FILES_BYTES     (GM_FRAME_BODY_MAX - 4096)

/*
 * ROCm 5.2.3's runtime takes one 2 MiB block of VRAM for itself as HIP starts, which HIP does not count:
 * HIP's free memory is its GPU's VRAM bank less HIP's own allocations. A bank that is the class's limit is
 * served that much smaller, so that what hipMemGetInfo calls free can be allocated under the limit.
 */
#define ROCM_RUNTIME_VRAM (2ull << 20)

/*
 * What the connection's class lets it hold of each GPU's VRAM (broker_vram_allowance), less the runtime's
 * block where that is the class's limit rather than the GPU's size, kept in the connection: its topology
 * files give that as the GPU's VRAM, and mem_info never answers more. Taken again when a client reads the
 * files from the start, so the pages of one read agree.
 */
static int vram_told_take(ReqCtx *r, bool again)
{
        Conn *c = r->c;
        Broker *b = r->m->broker;
        size_t n = broker_gpu_count(b);

        if (c->vram_told && !again)
                return 0;
        if (!c->vram_told) {
                c->vram_told = calloc(n ? n : 1, sizeof(*c->vram_told));
                if (!c->vram_told)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                uint64_t allow = broker_vram_allowance(b, c->cls ? &c->cls->acct : NULL, i);
                if (allow < broker_vram_allowance(b, NULL, i))
                        allow = allow > ROCM_RUNTIME_VRAM ? allow - ROCM_RUNTIME_VRAM : 0;
                c->vram_told[i] = allow;
        }
        return 0;
}

static bool heap_is_vram(uint32_t heap_type)
{
        return heap_type == HSA_MEM_HEAP_TYPE_FB_PUBLIC || heap_type == HSA_MEM_HEAP_TYPE_FB_PRIVATE;
}

typedef struct MadeFile {
        char *content;
        size_t len;
} MadeFile;

static int made_file_take(void *ctx, const char *rel, const char *content, size_t len)
{
        MadeFile *f = ctx;

        (void)rel;
        f->content = malloc(len ? len : 1);
        if (!f->content)
                return -ENOMEM;
        memcpy(f->content, content, len);
        f->len = len;
        return 0;
}

/*
 * @f as this client is served it: a GPU's local_mem_size and its VRAM banks (in bank order, together) no
 * larger than @told of that GPU. Sets @out->content to a new file when it differs from the daemon's, else
 * leaves it NULL.
 */
static int topology_file_for(const Manager *m, const uint64_t *told, const struct TopologyFile *f,
                             MadeFile *out)
{
        const ThunkTopology *t = driver_topology(m->drv);
        const ThunkNode *n;
        uint64_t allow, before = 0, size;
        int gi;

        out->content = NULL;
        if (f->node < 0 || (size_t)f->node >= t->n_nodes)
                return 0;
        n = &t->nodes[f->node];
        if (!n->is_gpu || (gi = broker_gpu_index(m->broker, n->gpu_id)) < 0)
                return 0;
        allow = told[gi];
        if (f->bank < 0)
                return n->local_mem_size <= allow ? 0
                                                  : thunk_props_write(&n->props, f->path, "local_mem_size",
                                                                      allow, made_file_take, out);
        if ((size_t)f->bank >= n->n_mem_banks || !heap_is_vram(n->mem_banks[f->bank].heap_type))
                return 0;
        for (int k = 0; k < f->bank; k++)
                if (heap_is_vram(n->mem_banks[k].heap_type))
                        before += n->mem_banks[k].size_in_bytes < allow - before
                                          ? n->mem_banks[k].size_in_bytes
                                          : allow - before;
        size = n->mem_banks[f->bank].size_in_bytes;
        if (size <= allow - before)
                return 0;
        return thunk_props_write(&n->mem_banks[f->bank].props, f->path, "size_in_bytes", allow - before,
                                 made_file_take, out);
}

int op_topology_files(ReqCtx *r, const Gpumem__Request *req)
{
        const Manager *m = r->m;
        Gpumem__TopologyFilesReply tr = GPUMEM__TOPOLOGY_FILES_REPLY__INIT;
        Gpumem__TopologyFile items[TOPOLOGY_FILES_PER_REPLY], *ptrs[TOPOLOGY_FILES_PER_REPLY];
        MadeFile made[TOPOLOGY_FILES_PER_REPLY];
        uint32_t from = req->topology_files->has_from ? req->topology_files->from : 0;
        size_t n = 0, bytes = 0;
        int err;

        if (from > m->n_topology_files)
                return reply_fail(r, -EINVAL, "file %u is past the topology's %zu files", from,
                                  m->n_topology_files);
        err = vram_told_take(r, from == 0);
        if (err < 0)
                return reply_fail(r, err, "out of memory");
        /* the daemon's files are made at start and never changed; a client's VRAM sizes are its class's */
        while (from + n < m->n_topology_files && n < TOPOLOGY_FILES_PER_REPLY) {
                const struct TopologyFile *f = &m->topology_files[from + n];
                size_t cost = strlen(f->path) + f->len + 16;
                if (n > 0 && bytes + cost > TOPOLOGY_FILES_BYTES)
                        break;
                err = topology_file_for(m, r->c->vram_told, f, &made[n]);
                if (err < 0)
                        break;
                gpumem__topology_file__init(&items[n]);
                items[n].path = f->path;
                items[n].has_content = true;
                items[n].content.data = (uint8_t *)(made[n].content ? made[n].content : f->content);
                items[n].content.len = made[n].content ? made[n].len : f->len;
                ptrs[n] = &items[n];
                bytes += cost;
                n++;
        }
        if (err >= 0) {
                tr.n_files = n;
                tr.files = ptrs;
                tr.has_next = tr.has_total = true;
                tr.next = from + n < m->n_topology_files ? from + (uint32_t)n : 0;
                tr.total = (uint32_t)m->n_topology_files;
                err = reply_result(r, &tr);
        } else {
                err = reply_fail(r, err, "out of memory");
        }
        for (size_t i = 0; i < n; i++)
                free(made[i].content);
        return err;
}

static int add_topology_file(void *ctx, const char *rel, const char *content, size_t len)
{
        Manager *m = ctx;
        struct TopologyFile *files = realloc(m->topology_files, (m->n_topology_files + 1) * sizeof(*files));
        struct TopologyFile *f;
        unsigned node, bank;
        int end = 0;

        if (!files)
                return -ENOMEM;
        m->topology_files = files;
        f = &files[m->n_topology_files];
        f->path = strdup(rel);
        f->content = malloc(len ? len : 1);
        if (!f->path || !f->content) {
                free(f->path);
                free(f->content);
                return -ENOMEM;
        }
        memcpy(f->content, content, len);
        f->len = len;
        f->node = f->bank = -1;
        if (sscanf(rel, "nodes/%u/properties%n", &node, &end) == 1 && rel[end] == '\0' && node <= INT_MAX) {
                f->node = (int)node;
        } else if (sscanf(rel, "nodes/%u/mem_banks/%u/properties%n", &node, &bank, &end) == 2 &&
                   rel[end] == '\0' && node <= INT_MAX && bank <= INT_MAX) {
                f->node = (int)node;
                f->bank = (int)bank;
        }
        m->n_topology_files++;
        return 0;
}

int op_topology_prepare(Manager *m)
{
        for (int with_props = 0; with_props < 2; with_props++) {
                int r = topology_pack(driver_topology(m->drv), with_props, &m->topology_reply[with_props],
                                      &m->topology_reply_len[with_props]);
                if (r < 0)
                        return r;
        }
        return thunk_topology_write(driver_topology(m->drv), add_topology_file, m);
}
