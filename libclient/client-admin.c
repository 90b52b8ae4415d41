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

static int topology_convert(const Gpumem__TopologyReply *tr, gm_topology **ret)
{
        gm_topology *t = calloc(1, sizeof(*t));

        if (!t)
                return -ENOMEM;
        t->generation_id = tr->generation_id;
        t->nodes = calloc(tr->n_nodes ? tr->n_nodes : 1, sizeof(*t->nodes));
        if (!t->nodes)
                goto oom;
        for (size_t i = 0; i < tr->n_nodes; i++) {
                const Gpumem__TopologyNode *s = tr->nodes[i];
                gm_topology_node *n = &t->nodes[i];

                t->n_nodes = i + 1;
                n->node_id = s->node_id;
                n->gpu_id = s->gpu_id;
                n->name = xstrdup(s->name);
                n->is_gpu = s->is_gpu;
                n->cpu_cores = s->cpu_cores;
                n->simd_count = s->simd_count;
                n->local_mem_size = s->local_mem_size;
                n->gfx_target_version = s->gfx_target_version;
                n->vendor_id = s->vendor_id;
                n->device_id = s->device_id;
                n->pci_domain = s->pci_domain;
                n->pci_location = s->pci_location;
                n->drm_render_minor = s->drm_render_minor;
                n->hive_id = s->hive_id;
                n->numa_node = s->has_numa_node ? s->numa_node : -1;
                n->large_bar = s->large_bar;
                n->capability = s->capability;
                n->system_mem_size = s->system_mem_size;
                if (!n->name)
                        goto oom;
                n->io_links = calloc(s->n_io_links ? s->n_io_links : 1, sizeof(*n->io_links));
                n->properties = calloc(s->n_properties ? s->n_properties : 1, sizeof(*n->properties));
                if (!n->io_links || !n->properties)
                        goto oom;
                for (size_t k = 0; k < s->n_io_links; k++) {
                        const Gpumem__IoLink *l = s->io_links[k];
                        n->io_links[k] = (gm_io_link){
                                .type = l->type,
                                .node_from = l->node_from,
                                .node_to = l->node_to,
                                .weight = l->weight,
                                .min_bandwidth = l->min_bandwidth,
                                .max_bandwidth = l->max_bandwidth,
                        };
                }
                n->n_io_links = s->n_io_links;
                for (size_t k = 0; k < s->n_properties; k++) {
                        n->properties[k].key = xstrdup(s->properties[k]->key);
                        n->properties[k].value = s->properties[k]->value;
                        n->n_properties = k + 1;
                        if (!n->properties[k].key)
                                goto oom;
                }
        }
        *ret = t;
        return 0;
oom:
        gm_topology_free(t);
        return -ENOMEM;
}

int gm_topology_get(gm_client *c, bool with_properties, gm_topology **ret)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__TopologyGet tg = GPUMEM__TOPOLOGY_GET__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !ret)
                return BAD_ARGS(c);
        tg.has_with_properties = true;
        tg.with_properties = with_properties;
        req.op_case = GPUMEM__REQUEST__OP_TOPOLOGY;
        req.topology = &tg;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_TOPOLOGY, &reply);
        if (r < 0)
                return r;
        r = topology_convert(reply->topology, ret);
        gm_reply_free(c, reply);
        return r < 0 ? gm_set_reason(c, r, "out of memory") : 0;
}

void gm_topology_files_free(gm_topology_file *files, size_t n)
{
        for (size_t i = 0; files && i < n; i++) {
                free(files[i].path);
                free(files[i].content);
        }
        free(files);
}

/* Append the files of one reply to *@files. */
static int topology_files_take(const Gpumem__TopologyFilesReply *tr, gm_topology_file **files, size_t *n)
{
        gm_topology_file *more;

        if (tr->n_files == 0)
                return 0;
        more = realloc(*files, (*n + tr->n_files) * sizeof(*more));
        if (!more)
                return -ENOMEM;
        *files = more;
        for (size_t i = 0; i < tr->n_files; i++) {
                const Gpumem__TopologyFile *f = tr->files[i];
                gm_topology_file *d = &more[*n];
                size_t len = f->has_content ? f->content.len : 0;
                d->path = strdup(f->path ? f->path : "");
                d->content = malloc(len + 1);
                if (!d->path || !d->content) {
                        free(d->path);
                        free(d->content);
                        return -ENOMEM;
                }
                if (len)
                        memcpy(d->content, f->content.data, len);
                d->content[len] = '\0';
                d->len = len;
                (*n)++;
        }
        return 0;
}

int gm_topology_files(gm_client *c, gm_topology_file **ret, size_t *ret_n)
{
        gm_topology_file *files = NULL;
        uint32_t from = 0;
        size_t n = 0;
        int r = 0;

        if (!c || !ret || !ret_n)
                return BAD_ARGS(c);
        do {
                Gpumem__Request req = GPUMEM__REQUEST__INIT;
                Gpumem__TopologyFilesGet tg = GPUMEM__TOPOLOGY_FILES_GET__INIT;
                Gpumem__Reply *reply = NULL;
                uint32_t next;

                tg.has_from = true;
                tg.from = from;
                req.op_case = GPUMEM__REQUEST__OP_TOPOLOGY_FILES;
                req.topology_files = &tg;
                r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_TOPOLOGY_FILES, &reply);
                if (r < 0)
                        break;
                next = reply->topology_files->has_next ? reply->topology_files->next : 0;
                r = topology_files_take(reply->topology_files, &files, &n);
                gm_reply_free(c, reply);
                if (r < 0) {
                        r = gm_set_reason(c, r, "out of memory");
                        break;
                }
                /* the daemon moves forward or says it is done; anything else is not a reply of it */
                if (next != 0 && next <= from) {
                        r = gm_set_reason(c, -EPROTO, "the topology's next file %u does not follow %u", next,
                                          from);
                        break;
                }
                from = next;
        } while (from != 0);
        if (r < 0) {
                gm_topology_files_free(files, n);
                return r;
        }
        *ret = files;
        *ret_n = n;
        return 0;
}

int gm_tile_config_get(gm_client *c, uint32_t gpu_id, gm_tile_config *ret)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__TileConfigGet tg = GPUMEM__TILE_CONFIG_GET__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__TileConfigReply *t;
        int r;

        if (!c || !ret)
                return BAD_ARGS(c);
        tg.has_gpu_id = true;
        tg.gpu_id = gpu_id;
        req.op_case = GPUMEM__REQUEST__OP_TILE_CONFIG;
        req.tile_config = &tg;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_TILE_CONFIG, &reply);
        if (r < 0)
                return r;
        t = reply->tile_config;
        memset(ret, 0, sizeof(*ret));
        ret->gb_addr_config = t->gb_addr_config;
        ret->num_banks = t->num_banks;
        ret->num_ranks = t->num_ranks;
        ret->n_tile = t->n_tile_config < 32 ? (uint32_t)t->n_tile_config : 32;
        ret->n_macro = t->n_macro_tile_config < 16 ? (uint32_t)t->n_macro_tile_config : 16;
        memcpy(ret->tile, t->tile_config, ret->n_tile * sizeof(uint32_t));
        memcpy(ret->macro, t->macro_tile_config, ret->n_macro * sizeof(uint32_t));
        gm_reply_free(c, reply);
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
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminStatus as = GPUMEM__ADMIN_STATUS__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__AdminStatusReply *a;
        gm_status *s;
        int r;

        if (!c || !ret)
                return BAD_ARGS(c);
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_STATUS;
        req.admin_status = &as;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_ADMIN_STATUS, &reply);
        if (r < 0)
                return r;
        a = reply->admin_status;
        s = calloc(1, sizeof(*s));
        if (s) {
                s->server_version = xstrdup(a->server_version);
                s->backend = xstrdup(a->backend);
                s->preset = xstrdup(a->preset);
                s->protocol_version = a->protocol_version;
                s->kfd_major = a->kfd_major;
                s->kfd_minor = a->kfd_minor;
                s->uptime_usec = a->uptime_usec;
                s->started_usec = a->started_usec;
                s->pid = a->pid;
                s->clients = a->clients;
                s->gpus = a->gpus;
                s->allocations = a->allocations;
                s->bytes_device = a->bytes_device;
                s->bytes_host = a->bytes_host;
                s->bytes_managed = a->bytes_managed;
                s->requests = a->requests;
                s->protocol_errors = a->protocol_errors;
                s->va_windows = a->va_windows;
                if (a->model) {
                        s->has_model = true;
                        s->model_contexts = a->model->contexts;
                        s->model_buffers = a->model->buffers;
                        s->model_handles = a->model->handles;
                        s->model_imports = a->model->imports;
                        s->model_mappings = a->model->mappings;
                        s->model_gem_handles = a->model->gem_handles;
                        s->model_svm_ranges = a->model->svm_ranges;
                        s->model_system_bytes = a->model->system_bytes;
                        s->model_vram_bytes = a->model->vram_bytes;
                }
        }
        gm_reply_free(c, reply);
        if (!s || !s->server_version || !s->backend || !s->preset) {
                gm_status_free(s);
                return gm_set_reason(c, -ENOMEM, "out of memory");
        }
        *ret = s;
        return 0;
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

int gm_admin_clients(gm_client *c, gm_client_info **ret, size_t *ret_n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminClients ac = GPUMEM__ADMIN_CLIENTS__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__AdminClientsReply *a;
        gm_client_info *infos;
        size_t n = 0;
        bool oom = false;
        int r;

        if (!c || !ret || !ret_n)
                return BAD_ARGS(c);
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_CLIENTS;
        req.admin_clients = &ac;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_ADMIN_CLIENTS, &reply);
        if (r < 0)
                return r;
        a = reply->admin_clients;
        infos = calloc(a->n_clients ? a->n_clients : 1, sizeof(*infos));
        oom = !infos;
        for (size_t i = 0; !oom && i < a->n_clients; i++) {
                const Gpumem__ClientInfo *s = a->clients[i];
                gm_client_info *d = &infos[i];
                n = i + 1;
                d->client_id = s->client_id;
                d->pid = s->pid;
                d->uid = s->uid;
                d->gid = s->gid;
                d->cgroup = xstrdup(s->cgroup);
                d->container = xstrdup(s->container);
                d->name = xstrdup(s->name);
                d->class_name = xstrdup(s->class_name);
                d->pod = xstrdup(s->pod);
                d->connected_usec = s->connected_usec;
                d->host_bytes = s->host_bytes;
                d->managed_bytes = s->managed_bytes;
                d->handles = s->handles;
                d->fds = s->fds;
                d->requests = s->requests;
                d->admin = s->admin;
                d->usage = calloc(s->n_usage ? s->n_usage : 1, sizeof(*d->usage));
                if (!d->cgroup || !d->container || !d->name || !d->class_name || !d->usage || !d->pod) {
                        oom = true;
                        break;
                }
                for (size_t k = 0; k < s->n_usage; k++)
                        d->usage[k] = (gm_gpu_usage){s->usage[k]->gpu_id, s->usage[k]->vram_bytes};
                d->n_usage = s->n_usage;
        }
        gm_reply_free(c, reply);
        if (oom) {
                gm_client_info_free(infos, n);
                return gm_set_reason(c, -ENOMEM, "out of memory");
        }
        *ret = infos;
        *ret_n = n;
        return 0;
}

int gm_admin_disconnect(gm_client *c, uint64_t client_id)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminDisconnect ad = GPUMEM__ADMIN_DISCONNECT__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c)
                return BAD_ARGS(c);
        ad.has_client_id = true;
        ad.client_id = client_id;
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_DISCONNECT;
        req.admin_disconnect = &ad;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_EMPTY, &reply);
        if (r < 0)
                return r;
        gm_reply_free(c, reply);
        return 0;
}

int gm_admin_metrics(gm_client *c, char **ret_text)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminMetrics am = GPUMEM__ADMIN_METRICS__INIT;
        Gpumem__Reply *reply = NULL;
        char *text;
        int r;

        if (!c || !ret_text)
                return BAD_ARGS(c);
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_METRICS;
        req.admin_metrics = &am;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_ADMIN_METRICS, &reply);
        if (r < 0)
                return r;
        text = xstrdup(reply->admin_metrics->text);
        gm_reply_free(c, reply);
        if (!text)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        *ret_text = text;
        return 0;
}

int gm_admin_set_log_level(gm_client *c, const char *level)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminSetLogLevel ll = GPUMEM__ADMIN_SET_LOG_LEVEL__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !level)
                return BAD_ARGS(c);
        ll.level = (char *)level;
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_SET_LOG_LEVEL;
        req.admin_set_log_level = &ll;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_EMPTY, &reply);
        if (r < 0)
                return r;
        gm_reply_free(c, reply);
        return 0;
}

void gm_alloc_info_free(gm_alloc_info *a, size_t n)
{
        (void)n;
        free(a);
}

int gm_admin_allocations(gm_client *c, uint64_t client_id, unsigned limit, uint64_t *cursor,
                         gm_alloc_info **ret, size_t *ret_n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminAllocations aa = GPUMEM__ADMIN_ALLOCATIONS__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__AdminAllocationsReply *ar;
        gm_alloc_info *out;
        int r;

        if (!c || !cursor || !ret || !ret_n)
                return c ? gm_set_reason(c, -EINVAL, "gm_admin_allocations: a required argument is missing")
                         : -EINVAL;
        aa.has_client_id = aa.has_cursor = aa.has_limit = true;
        aa.client_id = client_id;
        aa.cursor = *cursor;
        aa.limit = limit;
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_ALLOCATIONS;
        req.admin_allocations = &aa;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_ADMIN_ALLOCATIONS, &reply);
        if (r < 0)
                return r;
        ar = reply->admin_allocations;
        out = calloc(ar->n_allocations ? ar->n_allocations : 1, sizeof(*out));
        if (!out) {
                gm_reply_free(c, reply);
                return gm_set_reason(c, -ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < ar->n_allocations; i++) {
                const Gpumem__AllocationInfo *s = ar->allocations[i];
                out[i].client_id = s->client_id;
                out[i].id = s->id;
                out[i].kind = s->kind;
                out[i].size = s->size;
                out[i].gpu_id = s->gpu_id;
                out[i].va = s->va;
                out[i].n_mapped_gpus = s->n_mapped_gpus < 64 ? s->n_mapped_gpus : 64;
                if (out[i].n_mapped_gpus) /* an object mapped on no GPU has no array: no memcpy from NULL */
                        memcpy(out[i].mapped_gpus, s->mapped_gpus, out[i].n_mapped_gpus * sizeof(uint32_t));
                out[i].exports = s->exports;
        }
        *ret_n = ar->n_allocations;
        *cursor = ar->next_cursor;
        *ret = out;
        gm_reply_free(c, reply);
        return 0;
}

void gm_quota_free(gm_quota *q, size_t n)
{
        if (!q)
                return;
        for (size_t i = 0; i < n; i++)
                free(q[i].class_name);
        free(q);
}

int gm_admin_quota_get(gm_client *c, const char *class_name, gm_quota **ret, size_t *ret_n)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminQuotaGet qg = GPUMEM__ADMIN_QUOTA_GET__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__AdminQuotaGetReply *qr;
        gm_quota *out;
        size_t n = 0, k = 0;
        int r;

        if (!c || !ret || !ret_n)
                return c ? gm_set_reason(c, -EINVAL, "gm_admin_quota_get: a required argument is missing")
                         : -EINVAL;
        qg.class_name = (char *)(class_name ? class_name : "");
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_QUOTA_GET;
        req.admin_quota_get = &qg;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_ADMIN_QUOTA_GET, &reply);
        if (r < 0)
                return r;
        qr = reply->admin_quota_get;
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
        gm_reply_free(c, reply);
        if (!out)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        *ret = out;
        *ret_n = n;
        return 0;
}

int gm_admin_quota_set(gm_client *c, const char *class_name, int resource, uint32_t gpu_id, uint64_t limit,
                       bool force)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__AdminQuotaSet qs = GPUMEM__ADMIN_QUOTA_SET__INIT;
        Gpumem__Reply *reply = NULL;
        int r;

        if (!c || !class_name)
                return c ? gm_set_reason(c, -EINVAL, "gm_admin_quota_set: no class named") : -EINVAL;
        qs.class_name = (char *)class_name;
        qs.has_resource = qs.has_gpu_id = qs.has_limit = qs.has_force = true;
        qs.resource = (Gpumem__Resource)resource;
        qs.gpu_id = gpu_id;
        qs.limit = limit;
        qs.force = force;
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_QUOTA_SET;
        req.admin_quota_set = &qs;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_EMPTY, &reply);
        if (r < 0)
                return r;
        gm_reply_free(c, reply);
        return 0;
}
