/* libgpumem_client: topology and administration calls, decoded into the public structs. */
#include "client-private.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static char *xstrdup(const char *s)
{
        return strdup(s ? s : "");
}

void gm_topology_free(gm_topology *t)
{
        if (!t)
                return;
        for (size_t i = 0; i < t->n_nodes; i++) {
                gm_topology_node *n = &t->nodes[i];
                free(n->name);
                free(n->io_links);
                for (size_t k = 0; k < n->n_properties; k++)
                        free(n->properties[k].key);
                free(n->properties);
        }
        free(t->nodes);
        free(t);
}

/* What a topology node and a link say as the daemon's messages say it. */
#define NODE_FIELDS(X)                                                                                       \
        X(node_id), X(gpu_id), X(is_gpu), X(cpu_cores), X(simd_count), X(local_mem_size),                    \
                X(gfx_target_version), X(vendor_id), X(device_id), X(pci_domain), X(pci_location),           \
                X(drm_render_minor), X(hive_id), X(large_bar), X(capability), X(system_mem_size)
#define LINK_FIELDS(X) X(type), X(node_from), X(node_to), X(weight), X(min_bandwidth), X(max_bandwidth)

static void link_take(gm_io_link *dst, const Gpumem__IoLink *src)
{
        LINK_FIELDS(GM_COPY_FIELD);
}

/* One node, its links and its properties; false when out of memory (what it holds then is freed with it). */
static bool node_take(gm_topology_node *dst, const Gpumem__TopologyNode *src)
{
        NODE_FIELDS(GM_COPY_FIELD);
        dst->name = xstrdup(src->name);
        dst->numa_node = src->has_numa_node ? src->numa_node : -1;
        dst->io_links = calloc(src->n_io_links ? src->n_io_links : 1, sizeof(*dst->io_links));
        dst->properties = calloc(src->n_properties ? src->n_properties : 1, sizeof(*dst->properties));
        if (!dst->name || !dst->io_links || !dst->properties)
                return false;
        for (size_t k = 0; k < src->n_io_links; k++)
                link_take(&dst->io_links[k], src->io_links[k]);
        dst->n_io_links = src->n_io_links;
        for (size_t k = 0; k < src->n_properties; k++) {
                dst->properties[k].key = xstrdup(src->properties[k]->key);
                dst->properties[k].value = src->properties[k]->value;
                dst->n_properties = k + 1;
                if (!dst->properties[k].key)
                        return false;
        }
        return true;
}

/* The topology's answer as the public struct, into *(gm_topology **)@ctx (a GmTakeFn). */
static int topology_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__TopologyReply *tr = result;
        gm_topology **ret = ctx;
        gm_topology *t = calloc(1, sizeof(*t));
        bool ok = t && (t->nodes = calloc(tr->n_nodes ? tr->n_nodes : 1, sizeof(*t->nodes)));

        for (size_t i = 0; ok && i < tr->n_nodes; i++) {
                t->n_nodes = i + 1; /* what the node holds is freed with it, should it fail part way */
                ok = node_take(&t->nodes[i], tr->nodes[i]);
        }
        if (!ok) {
                gm_topology_free(t);
                return gm_set_reason(c, -ENOMEM, "out of memory");
        }
        t->generation_id = tr->generation_id;
        *ret = t;
        return 0;
}

int gm_topology_get(gm_client *c, bool with_properties, gm_topology **ret)
{
        if (!c || !ret)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_TOPOLOGY, with_properties,
                              GPUMEM__REPLY__RESULT_TOPOLOGY, topology_take, ret);
}

void gm_topology_files_free(gm_topology_file *files, size_t n)
{
        for (size_t i = 0; files && i < n; i++) {
                free(files[i].path);
                free(files[i].content);
        }
        free(files);
}

/* Append the files of one page to the GmPages @ctx. */
static int topology_files_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__TopologyFilesReply *tr = result;
        GmPages *o = ctx;
        gm_topology_file *more;

        o->next = tr->has_next ? tr->next : 0;
        if (tr->n_files == 0)
                return 0;
        more = realloc(o->items, (o->n + tr->n_files) * sizeof(*more));
        if (!more)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        o->items = more;
        for (size_t i = 0; i < tr->n_files; i++) {
                const Gpumem__TopologyFile *f = tr->files[i];
                gm_topology_file *d = &more[o->n];
                size_t len = f->has_content ? f->content.len : 0;
                d->path = strdup(f->path ? f->path : "");
                d->content = malloc(len + 1);
                if (!d->path || !d->content) {
                        free(d->path);
                        free(d->content);
                        return gm_set_reason(c, -ENOMEM, "out of memory");
                }
                if (len)
                        memcpy(d->content, f->content.data, len);
                d->content[len] = '\0';
                d->len = len;
                o->n++;
        }
        return 0;
}

int gm_topology_files(gm_client *c, gm_topology_file **ret, size_t *ret_n)
{
        GmPages out = {NULL, 0, 0};
        uint32_t from = 0;
        int r = 0;

        if (!c || !ret || !ret_n)
                return BAD_ARGS(c);
        do {
                r = gm_request_num(c, GPUMEM__REQUEST__OP_TOPOLOGY_FILES, from,
                                   GPUMEM__REPLY__RESULT_TOPOLOGY_FILES, topology_files_take, &out);
                if (r < 0)
                        break;
                /* the daemon moves forward or says it is done; anything else is not a reply of it */
                if (out.next != 0 && out.next <= from) {
                        r = gm_set_reason(c, -EPROTO, "the topology's next file %u does not follow %u",
                                          out.next, from);
                        break;
                }
                from = out.next;
        } while (from != 0);
        if (r < 0) {
                gm_topology_files_free(out.items, out.n);
                return r;
        }
        *ret = out.items;
        *ret_n = out.n;
        return 0;
}

static int tile_config_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__TileConfigReply *t = result;
        gm_tile_config *ret = ctx;

        (void)c;
        memset(ret, 0, sizeof(*ret));
        ret->gb_addr_config = t->gb_addr_config;
        ret->num_banks = t->num_banks;
        ret->num_ranks = t->num_ranks;
        ret->n_tile = t->n_tile_config < 32 ? (uint32_t)t->n_tile_config : 32;
        ret->n_macro = t->n_macro_tile_config < 16 ? (uint32_t)t->n_macro_tile_config : 16;
        memcpy(ret->tile, t->tile_config, ret->n_tile * sizeof(uint32_t));
        memcpy(ret->macro, t->macro_tile_config, ret->n_macro * sizeof(uint32_t));
        return 0;
}

int gm_tile_config_get(gm_client *c, uint32_t gpu_id, gm_tile_config *ret)
{
        if (!c || !ret)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_TILE_CONFIG, gpu_id, GPUMEM__REPLY__RESULT_TILE_CONFIG,
                              tile_config_take, ret);
}

/* What the status says as the daemon's message says it; and the model's counts, each as model_<name>. */
#define STATUS_FIELDS(X)                                                                                     \
        X(protocol_version), X(kfd_major), X(kfd_minor), X(uptime_usec), X(started_usec), X(pid),            \
                X(clients), X(gpus), X(allocations), X(bytes_device), X(bytes_host), X(bytes_managed),       \
                X(requests), X(protocol_errors), X(va_windows)
#define STATUS_STRINGS(X) X(server_version), X(backend), X(preset)
#define MODEL_FIELDS(X)                                                                                      \
        X(contexts), X(buffers), X(handles), X(imports), X(mappings), X(gem_handles), X(svm_ranges),         \
                X(system_bytes), X(vram_bytes)
#define DUP_FIELD(f)   (dst->f = xstrdup(src->f))
#define MODEL_FIELD(f) (dst->model_##f = src->model->f)

static int status_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__AdminStatusReply *src = result;
        gm_status **ret = ctx;
        gm_status *dst = calloc(1, sizeof(*dst));

        if (dst) {
                STATUS_STRINGS(DUP_FIELD);
                STATUS_FIELDS(GM_COPY_FIELD);
                dst->has_model = src->model != NULL;
                dst->has_private_gpu_vm = src->has_private_gpu_vm;
                dst->private_gpu_vm = src->private_gpu_vm;
                if (src->model)
                        MODEL_FIELDS(MODEL_FIELD);
        }
        if (!dst || !dst->server_version || !dst->backend || !dst->preset) {
                gm_status_free(dst);
                return gm_set_reason(c, -ENOMEM, "out of memory");
        }
        *ret = dst;
        return 0;
}

void gm_status_free(gm_status *s)
{
        if (!s)
                return;
        free(s->server_version);
        free(s->backend);
        free(s->preset);
        free(s);
}

int gm_admin_status(gm_client *c, gm_status **ret)
{
        if (!c || !ret)
                return BAD_ARGS(c);
        return gm_request_none(c, GPUMEM__REQUEST__OP_ADMIN_STATUS, GPUMEM__REPLY__RESULT_ADMIN_STATUS,
                               status_take, ret);
}

void gm_client_info_free(gm_client_info *infos, size_t n)
{
        if (!infos)
                return;
        for (size_t i = 0; i < n; i++) {
                free(infos[i].cgroup);
                free(infos[i].container);
                free(infos[i].name);
                free(infos[i].class_name);
                free(infos[i].usage);
                free(infos[i].pod);
        }
        free(infos);
}

/* Where a list goes: the array and its length (gm_admin_clients, gm_admin_allocations, gm_admin_quota_get).
 */
typedef struct ListOut {
        void *items;
        size_t n;
        uint64_t *cursor; /* gm_admin_allocations: where the next page starts */
} ListOut;

/* What a client's entry says as the daemon's message says it. */
#define CLIENT_FIELDS(X)                                                                                     \
        X(client_id), X(pid), X(uid), X(gid), X(connected_usec), X(host_bytes), X(managed_bytes),            \
                X(handles), X(fds), X(requests), X(admin)
#define CLIENT_STRINGS(X) X(cgroup), X(container), X(name), X(class_name), X(pod)

/* One client's entry; false when out of memory (what it holds then is freed with it). */
static bool client_take(gm_client_info *dst, const Gpumem__ClientInfo *src)
{
        CLIENT_FIELDS(GM_COPY_FIELD);
        CLIENT_STRINGS(DUP_FIELD);
        dst->usage = calloc(src->n_usage ? src->n_usage : 1, sizeof(*dst->usage));
        if (!dst->cgroup || !dst->container || !dst->name || !dst->class_name || !dst->usage || !dst->pod)
                return false;
        for (size_t k = 0; k < src->n_usage; k++)
                dst->usage[k] = (gm_gpu_usage){src->usage[k]->gpu_id, src->usage[k]->vram_bytes};
        dst->n_usage = src->n_usage;
        return true;
}

/* The clients of one page, appended to the ListOut @ctx; where the next page starts in its cursor. */
static int clients_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__AdminClientsReply *a = result;
        ListOut *out = ctx;
        gm_client_info *infos = realloc(out->items, (out->n + a->n_clients + 1) * sizeof(*infos));

        if (!infos)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        out->items = infos;
        *out->cursor = a->has_next ? a->next : 0;
        for (size_t i = 0; i < a->n_clients; i++) {
                gm_client_info *dst = &infos[out->n++]; /* counted first: a half-made entry is freed too */
                memset(dst, 0, sizeof(*dst));
                if (!client_take(dst, a->clients[i]))
                        return gm_set_reason(c, -ENOMEM, "out of memory");
        }
        return 0;
}

/* Where a paged list or text goes on: the daemon moves forward or says it is done (0); anything else is no
 * reply of it. */
static int page_follows(gm_client *c, const char *what, uint64_t next, uint64_t from)
{
        if (next != 0 && next <= from)
                return gm_set_reason(c, -EPROTO, "the %s's next page %llu does not follow %llu", what,
                                     (unsigned long long)next, (unsigned long long)from);
        return 0;
}

int gm_admin_clients(gm_client *c, gm_client_info **ret, size_t *ret_n)
{
        uint64_t from = 0, next = 0;
        ListOut out = {NULL, 0, &next};
        int r;

        if (!c || !ret || !ret_n)
                return BAD_ARGS(c);
        /* a page at a time (a daemon that pages nothing answers all at once, with no next) */
        do {
                r = gm_request_num(c, GPUMEM__REQUEST__OP_ADMIN_CLIENTS, from,
                                   GPUMEM__REPLY__RESULT_ADMIN_CLIENTS, clients_take, &out);
                if (r == 0)
                        r = page_follows(c, "client list", next, from);
                from = next;
        } while (r == 0 && from != 0);
        if (r < 0) {
                gm_client_info_free(out.items, out.n);
                return r;
        }
        *ret = out.items;
        *ret_n = out.n;
        return 0;
}

int gm_admin_disconnect(gm_client *c, uint64_t client_id)
{
        if (!c)
                return BAD_ARGS(c);
        return gm_request_num(c, GPUMEM__REQUEST__OP_ADMIN_DISCONNECT, client_id, GPUMEM__REPLY__RESULT_EMPTY,
                              NULL, NULL);
}

/* The metrics' text as it comes, part by part. */
typedef struct TextOut {
        char *text;
        size_t len;
        uint64_t next; /* the daemon's cursor of the next part; 0: that was the end */
} TextOut;

static int metrics_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__AdminMetricsReply *mr = result;
        TextOut *o = ctx;
        size_t n = mr->text ? strlen(mr->text) : 0;
        char *t = realloc(o->text, o->len + n + 1);

        if (!t)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        if (n)
                memcpy(t + o->len, mr->text, n);
        o->len += n;
        t[o->len] = '\0';
        o->text = t;
        o->next = mr->has_next ? mr->next : 0;
        return 0;
}

int gm_admin_metrics(gm_client *c, char **ret_text)
{
        TextOut out = {NULL, 0, 0};
        uint64_t cursor = 0;
        int r;

        if (!c || !ret_text)
                return BAD_ARGS(c);
        /* part by part from one rendering of the text (a daemon that pages nothing answers it whole) */
        do {
                r = gm_request_num(c, GPUMEM__REQUEST__OP_ADMIN_METRICS, cursor,
                                   GPUMEM__REPLY__RESULT_ADMIN_METRICS, metrics_take, &out);
                if (r == 0)
                        r = page_follows(c, "metrics", out.next, cursor);
                cursor = out.next;
        } while (r == 0 && cursor != 0);
        if (r < 0) {
                free(out.text);
                return r;
        }
        *ret_text = out.text;
        return 0;
}

int gm_admin_set_log_level(gm_client *c, const char *level)
{
        Gpumem__AdminSetLogLevel ll = GPUMEM__ADMIN_SET_LOG_LEVEL__INIT;

        if (!c || !level)
                return BAD_ARGS(c);
        ll.level = (char *)level;
        return gm_request(c, GPUMEM__REQUEST__OP_ADMIN_SET_LOG_LEVEL, &ll, GPUMEM__REPLY__RESULT_EMPTY, NULL);
}

void gm_alloc_info_free(gm_alloc_info *a, size_t n)
{
        (void)n;
        free(a);
}

#define ALLOCATION_FIELDS(X) X(client_id), X(id), X(kind), X(size), X(gpu_id), X(va), X(exports)

static int allocations_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__AdminAllocationsReply *ar = result;
        ListOut *o = ctx;
        gm_alloc_info *out = calloc(ar->n_allocations ? ar->n_allocations : 1, sizeof(*out));

        if (!out)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        for (size_t i = 0; i < ar->n_allocations; i++) {
                const Gpumem__AllocationInfo *src = ar->allocations[i];
                gm_alloc_info *dst = &out[i];
                ALLOCATION_FIELDS(GM_COPY_FIELD);
                dst->n_mapped_gpus = src->n_mapped_gpus < 64 ? src->n_mapped_gpus : 64;
                if (dst->n_mapped_gpus) /* an object mapped on no GPU has no array: no memcpy from NULL */
                        memcpy(dst->mapped_gpus, src->mapped_gpus, dst->n_mapped_gpus * sizeof(uint32_t));
        }
        o->items = out;
        o->n = ar->n_allocations;
        *o->cursor = ar->next_cursor;
        return 0;
}

int gm_admin_allocations(gm_client *c, uint64_t client_id, unsigned limit, uint64_t *cursor,
                         gm_alloc_info **ret, size_t *ret_n)
{
        Gpumem__AdminAllocations aa = GPUMEM__ADMIN_ALLOCATIONS__INIT;
        ListOut out = {.cursor = cursor};
        int r;

        if (!c || !cursor || !ret || !ret_n)
                return c ? gm_set_reason(c, -EINVAL, "gm_admin_allocations: a required argument is missing")
                         : -EINVAL;
        aa.has_client_id = aa.has_cursor = aa.has_limit = true;
        aa.client_id = client_id;
        aa.cursor = *cursor;
        aa.limit = limit;
        r = gm_request_take(c, GPUMEM__REQUEST__OP_ADMIN_ALLOCATIONS, &aa,
                            GPUMEM__REPLY__RESULT_ADMIN_ALLOCATIONS, allocations_take, &out);
        if (r == 0) {
                *ret_n = out.n;
                *ret = out.items;
        }
        return r;
}

void gm_quota_free(gm_quota *q, size_t n)
{
        if (!q)
                return;
        for (size_t i = 0; i < n; i++)
                free(q[i].class_name);
        free(q);
}

static int quota_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__AdminQuotaGetReply *qr = result;
        ListOut *o = ctx;
        size_t n = 0, k = 0;
        gm_quota *out;

        for (size_t i = 0; i < qr->n_classes; i++)
                n += qr->classes[i]->n_entries;
        out = calloc(n ? n : 1, sizeof(*out));
        for (size_t i = 0; out && i < qr->n_classes; i++)
                for (size_t e = 0; e < qr->classes[i]->n_entries; e++) {
                        const Gpumem__QuotaEntry *q = qr->classes[i]->entries[e];
                        out[k].class_name = xstrdup(qr->classes[i]->class_name);
                        out[k].resource = q->resource;
                        out[k].gpu_id = q->gpu_id;
                        out[k].limit = q->limit;
                        out[k].used = q->used;
                        if (!out[k++].class_name) {
                                gm_quota_free(out, k);
                                out = NULL;
                                break;
                        }
                }
        if (!out)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        *o = (ListOut){out, n, NULL};
        return 0;
}

int gm_admin_quota_get(gm_client *c, const char *class_name, gm_quota **ret, size_t *ret_n)
{
        Gpumem__AdminQuotaGet qg = GPUMEM__ADMIN_QUOTA_GET__INIT;
        ListOut out;
        int r;

        if (!c || !ret || !ret_n)
                return c ? gm_set_reason(c, -EINVAL, "gm_admin_quota_get: a required argument is missing")
                         : -EINVAL;
        qg.class_name = (char *)(class_name ? class_name : "");
        r = gm_request_take(c, GPUMEM__REQUEST__OP_ADMIN_QUOTA_GET, &qg,
                            GPUMEM__REPLY__RESULT_ADMIN_QUOTA_GET, quota_take, &out);
        if (r == 0) {
                *ret = out.items;
                *ret_n = out.n;
        }
        return r;
}

int gm_quota_get(gm_client *c, gm_quota **ret, size_t *ret_n)
{
        ListOut out;
        int r;

        if (!c || !ret || !ret_n)
                return c ? gm_set_reason(c, -EINVAL, "gm_quota_get: a required argument is missing")
                         : -EINVAL;
        if (c->protocol_version < 4)
                return gm_set_reason(c, -EOPNOTSUPP,
                                     "gpumemd speaks protocol %u; a client's own quota needs 4",
                                     c->protocol_version);
        r = gm_request_none(c, GPUMEM__REQUEST__OP_QUOTA, GPUMEM__REPLY__RESULT_QUOTA, quota_take, &out);
        if (r == 0) {
                *ret = out.items;
                *ret_n = out.n;
        }
        return r;
}

int gm_admin_quota_set(gm_client *c, const char *class_name, int resource, uint32_t gpu_id, uint64_t limit,
                       bool force)
{
        Gpumem__AdminQuotaSet qs = GPUMEM__ADMIN_QUOTA_SET__INIT;

        if (!c || !class_name)
                return c ? gm_set_reason(c, -EINVAL, "gm_admin_quota_set: no class named") : -EINVAL;
        qs.class_name = (char *)class_name;
        qs.has_resource = qs.has_gpu_id = qs.has_limit = qs.has_force = true;
        qs.resource = (Gpumem__Resource)resource;
        qs.gpu_id = gpu_id;
        qs.limit = limit;
        qs.force = force;
        return gm_request(c, GPUMEM__REQUEST__OP_ADMIN_QUOTA_SET, &qs, GPUMEM__REPLY__RESULT_EMPTY, NULL);
}
