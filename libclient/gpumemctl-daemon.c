/* gpumemctl's commands on the daemon itself and its clients: status, topology, clients, disconnect, metrics,
 * log-level, ping. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumemctl.h"

/* The status's counts, and the model's (model_<name> in gm_status), under their field names. */
#define STATUS_COUNTS(X) X(pid), X(uptime_usec), X(started_usec), X(clients), X(gpus), X(allocations)
#define MODEL_COUNTS(X)                                                                                      \
        X(contexts), X(buffers), X(handles), X(imports), X(mappings), X(gem_handles), X(svm_ranges),         \
                X(system_bytes), X(vram_bytes)
#define MODEL_U64(f) ju64(m, #f, s->model_##f)

static void status_json(const gm_status *s)
{
        json_object *j = jdoc(), *k = json_object_new_object(), *b = json_object_new_object();

        J_STR(server_version), J_U64(protocol_version), J_STR(backend);
        jbool(j, "simulated", s->preset[0] != '\0');
        J_STR(preset);
        ju64(k, "major", s->kfd_major);
        ju64(k, "minor", s->kfd_minor);
        json_object_object_add(j, "kfd_version", k);
        if (s->has_private_gpu_vm)
                jbool(j, "private_gpu_vm", s->private_gpu_vm);
        STATUS_COUNTS(J_U64);
        ju64(b, "device", s->bytes_device);
        ju64(b, "host", s->bytes_host);
        ju64(b, "managed", s->bytes_managed);
        json_object_object_add(j, "bytes", b);
        J_U64(requests), J_U64(protocol_errors), J_U64(va_windows);
        if (s->has_model) {
                json_object *m = json_object_new_object();
                MODEL_COUNTS(MODEL_U64);
                json_object_object_add(j, "model", m);
        }
        jprint(j, JSON_C_TO_STRING_PLAIN);
}

static void status_text(const gm_status *s)
{
        char b1[32], b2[32], b3[32];

        printf("gpumemd %s (protocol %u), pid %u\n", s->server_version, s->protocol_version, s->pid);
        /* the driver's interface version: KFD's ioctl ABI, or the CUDA driver's version */
        printf("  backend:   %s%s%s%s, %s %u.%u\n", s->backend,
               s->preset[0] ? " (SIMULATED GPUs, no hardware)" : "", s->preset[0] ? ", preset " : "",
               s->preset, strcmp(s->backend, "cuda") == 0 ? "CUDA driver" : "KFD ABI", s->kfd_major,
               s->kfd_minor);
        if (s->has_private_gpu_vm && strcmp(s->backend, "cuda") != 0)
                printf("  isolation: %s\n",
                       s->private_gpu_vm ? "a GPU VM per client (KFD secondary contexts)"
                                         : "one GPU VM for all clients (this KFD has no secondary contexts): "
                                           "user-mode queues only for classes with shared-gpu-context = yes");
        printf("  uptime:    %.1f s\n", (double)s->uptime_usec / 1e6);
        printf("  GPUs:      %u\n", s->gpus);
        printf("  clients:   %u\n", s->clients);
        printf("  requests:  %" PRIu64 " (%" PRIu64 " protocol errors)\n", s->requests, s->protocol_errors);
        printf("  memory:    %" PRIu64 " allocations; device %s, host %s, managed %s\n", s->allocations,
               human_bytes(s->bytes_device, b1, sizeof(b1)), human_bytes(s->bytes_host, b2, sizeof(b2)),
               human_bytes(s->bytes_managed, b3, sizeof(b3)));
        if (s->has_model)
                printf("  model:     %u contexts, %" PRIu64 " buffers, %" PRIu64 " GPU mappings, %" PRIu64
                       " SVM ranges; VRAM %s, system %s\n",
                       s->model_contexts, s->model_buffers, s->model_mappings, s->model_svm_ranges,
                       human_bytes(s->model_vram_bytes, b1, sizeof(b1)),
                       human_bytes(s->model_system_bytes, b2, sizeof(b2)));
}

int cmd_status(Ctl *ctl, int argc, char **argv)
{
        gm_status *s = NULL;
        int r = gm_admin_status(ctl->c, &s);

        if (r < 0)
                return fail(ctl, "status", r);
        if (ctl->json)
                status_json(s);
        else
                status_text(s);
        gm_status_free(s);
        return EXIT_SUCCESS;
}

static const char *link_type(uint32_t t, char *buf, size_t len)
{
        switch (t) {
        case 1:
                return "HT";
        case 2:
                return "PCIe";
        case 5:
                return "QPI";
        case 11:
                return "XGMI";
        default:
                snprintf(buf, len, "type%u", t);
                return buf;
        }
}

static const char *gfx_name(uint32_t v, char *buf, size_t len)
{
        /* gfx_target_version is major*10000 + minor*100 + stepping, printed as gfx<major><minor><stepping:x>
         */
        if (!v)
                return "-";
        snprintf(buf, len, "gfx%u%u%x", v / 10000, (v / 100) % 100, v % 100);
        return buf;
}

static const char topology_columns[] =
        "NODE:4r KIND:4 GPU_ID:6r TARGET:8 VRAM:10r SYSMEM:10r NUMA:4r RENDER:6 LINKS:0.3w "
        "| NAME:0.1t PCI:12 SIMDS:5r CORES:5r VENDOR:6 DEVICE:6 HIVE:18 LARGE_BAR:3";

/* The nodes; with --properties, a second table of every node's raw properties (NODE PROPERTY VALUE). */
static int print_topology(Ctl *ctl, const gm_topology *t, bool props)
{
        Table tb;
        char b1[32], b2[32], gfx[16], tl[16], links[1024];
        int r = table_new(ctl, &tb, "topology", topology_columns);

        if (r)
                return r;
        for (size_t i = 0; i < t->n_nodes; i++) {
                const gm_topology_node *n = &t->nodes[i];
                size_t off = 0;
                table_row(&tb);
                table_cell(&tb, "NODE", "%u", n->node_id);
                table_cell(&tb, "KIND", "%s", n->is_gpu ? (n->cpu_cores ? "APU" : "GPU") : "CPU");
                table_cell(&tb, "NAME", "%s", n->name ? n->name : "");
                table_cell(&tb, "CORES", "%u", n->cpu_cores);
                if (n->local_mem_size)
                        table_cell(&tb, "VRAM", "%s", human_bytes(n->local_mem_size, b1, sizeof(b1)));
                if (n->system_mem_size)
                        table_cell(&tb, "SYSMEM", "%s", human_bytes(n->system_mem_size, b2, sizeof(b2)));
                if (n->numa_node >= 0)
                        table_cell(&tb, "NUMA", "%d", n->numa_node);
                if (n->is_gpu) {
                        table_cell(&tb, "GPU_ID", "%u", n->gpu_id);
                        table_cell(&tb, "TARGET", "%s", gfx_name(n->gfx_target_version, gfx, sizeof(gfx)));
                        table_cell(&tb, "RENDER", "D%u", n->drm_render_minor);
                        table_cell(&tb, "PCI", "%04x:%02x:%02x.%x", n->pci_domain, n->pci_location >> 8,
                                   (n->pci_location >> 3) & 0x1f, n->pci_location & 7);
                        table_cell(&tb, "SIMDS", "%u", n->simd_count);
                        table_cell(&tb, "VENDOR", "0x%04x", n->vendor_id);
                        table_cell(&tb, "DEVICE", "0x%04x", n->device_id);
                        if (n->hive_id)
                                table_cell(&tb, "HIVE", "0x%016" PRIx64, n->hive_id);
                        table_cell(&tb, "LARGE_BAR", "%s", n->large_bar ? "yes" : "no");
                }
                links[0] = '\0';
                for (size_t k = 0; k < n->n_io_links && off < sizeof(links); k++)
                        off += (size_t)snprintf(links + off, sizeof(links) - off, "%s%s->%u", k ? "," : "",
                                                link_type(n->io_links[k].type, tl, sizeof(tl)),
                                                n->io_links[k].node_to);
                table_cell(&tb, "LINKS", "%s", links);
        }
        r = table_print(&tb);
        if (r || !props)
                return r;
        /* the properties: their own table, which -o does not shape */
        struct libscols_table *pt = scols_new_table();
        if (!pt)
                return command_error(-ENOMEM, "topology", "out of memory");
        scols_table_set_stream(pt, stdout);
        scols_table_enable_noheadings(pt, ctl->noheadings);
        scols_table_enable_raw(pt, ctl->raw);
        if (!scols_table_new_column(pt, "NODE", 4, SCOLS_FL_RIGHT) ||
            !scols_table_new_column(pt, "PROPERTY", 32, 0) || !scols_table_new_column(pt, "VALUE", 20, 0)) {
                scols_unref_table(pt);
                return command_error(-ENOMEM, "topology", "out of memory");
        }
        for (size_t i = 0; i < t->n_nodes; i++)
                for (size_t k = 0; k < t->nodes[i].n_properties; k++) {
                        struct libscols_line *l = scols_table_new_line(pt, NULL);
                        char v[32], id[16];
                        snprintf(id, sizeof(id), "%u", t->nodes[i].node_id);
                        snprintf(v, sizeof(v), "%" PRIu64, t->nodes[i].properties[k].value);
                        if (!l || scols_line_set_data(l, 0, id) < 0 ||
                            scols_line_set_data(l, 1, t->nodes[i].properties[k].key) < 0 ||
                            scols_line_set_data(l, 2, v) < 0) {
                                scols_unref_table(pt);
                                return command_error(-ENOMEM, "topology", "out of memory");
                        }
                }
        putchar('\n');
        r = scols_print_table(pt);
        scols_unref_table(pt);
        return r < 0 ? command_error(r, "topology", "cannot print the table") : EXIT_SUCCESS;
}

/* What a node says of its GPU, under the field names. */
#define NODE_IDS(X)                                                                                          \
        X(gfx_target_version), X(vendor_id), X(device_id), X(pci_domain), X(pci_location),                   \
                X(drm_render_minor), X(hive_id)

static void link_json(json_object *j, const gm_io_link *s)
{
        char tb[16];

        jstr(j, "type", link_type(s->type, tb, sizeof(tb)));
        ju64(j, "from", s->node_from);
        ju64(j, "to", s->node_to);
        J_U64(weight), J_U64(min_bandwidth), J_U64(max_bandwidth);
}

static json_object *node_json(const gm_topology_node *s, bool props)
{
        json_object *j = json_object_new_object(), *links;

        J_U64(node_id);
        jstr(j, "kind", s->is_gpu ? (s->cpu_cores ? "apu" : "gpu") : "cpu");
        J_U64(gpu_id), J_STR(name), J_U64(cpu_cores), J_U64(simd_count);
        ju64(j, "vram_bytes", s->local_mem_size);
        ju64(j, "system_mem_bytes", s->system_mem_size);
        NODE_IDS(J_U64);
        ji64(j, "numa_node", s->numa_node);
        jbool(j, "large_bar", s->large_bar);
        J_U64(capability);
        links = jarray(j, "io_links");
        for (size_t k = 0; k < s->n_io_links; k++) {
                json_object *lo = json_object_new_object();
                link_json(lo, &s->io_links[k]);
                json_object_array_add(links, lo);
        }
        if (props) {
                json_object *po = json_object_new_object();
                for (size_t k = 0; k < s->n_properties; k++)
                        ju64(po, s->properties[k].key, s->properties[k].value);
                json_object_object_add(j, "properties", po);
        }
        return j;
}

static int topology_json(const gm_topology *t, bool props)
{
        json_object *o = jdoc(), *nodes;

        ju64(o, "generation_id", t->generation_id);
        nodes = jarray(o, "nodes");
        for (size_t i = 0; i < t->n_nodes; i++)
                json_object_array_add(nodes, node_json(&t->nodes[i], props));
        jprint(o, JSON_C_TO_STRING_PLAIN);
        return EXIT_SUCCESS;
}

int cmd_topology(Ctl *ctl, int argc, char **argv)
{
        bool props = false;
        gm_topology *t = NULL;
        int r;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--properties") == 0)
                        props = true;
                else {
                        return usage_error("topology: unknown argument '%s'", argv[i]);
                }
        }
        r = gm_topology_get(ctl->c, props, &t);
        if (r < 0)
                return fail(ctl, "topology", r);
        r = ctl->json ? topology_json(t, props) : print_topology(ctl, t, props);
        gm_topology_free(t);
        return r;
}

static const char client_columns[] = "ID:4r PID:7r UID:5r CLASS:0.1t NAME:0.1t CONTAINER:0.15t CONNECTED:20 "
                                     "HANDLES:7r VRAM:10r HOST:10r MANAGED:10r "
                                     "| GID:5r POD:36 CGROUP:0.3t REQUESTS:8r FDS:4r ADMIN:3";

static int print_clients(Ctl *ctl, const gm_client_info *infos, size_t n)
{
        Table tb;
        char when[32], b[32];
        int r = table_new(ctl, &tb, "clients", client_columns);

        if (r)
                return r;
        for (size_t i = 0; i < n; i++) {
                const gm_client_info *c = &infos[i];
                uint64_t vram = 0;
                for (size_t k = 0; k < c->n_usage; k++)
                        vram += c->usage[k].vram_bytes;
                fmt_time(c->connected_usec, when, sizeof(when));
                table_row(&tb);
                table_cell(&tb, "ID", "%" PRIu64, c->client_id);
                table_cell(&tb, "PID", "%u", c->pid);
                table_cell(&tb, "UID", "%u", c->uid);
                table_cell(&tb, "GID", "%u", c->gid);
                table_cell(&tb, "CLASS", "%s", c->class_name);
                table_cell(&tb, "NAME", "%s", c->name);
                table_cell(&tb, "CONTAINER", "%s", c->container);
                table_cell(&tb, "POD", "%s", c->pod);
                table_cell(&tb, "CGROUP", "%s", c->cgroup);
                table_cell(&tb, "CONNECTED", "%s", when);
                table_cell(&tb, "HANDLES", "%u", c->handles);
                table_cell(&tb, "VRAM", "%s", human_bytes(vram, b, sizeof(b)));
                table_cell(&tb, "HOST", "%s", human_bytes(c->host_bytes, b, sizeof(b)));
                table_cell(&tb, "MANAGED", "%s", human_bytes(c->managed_bytes, b, sizeof(b)));
                table_cell(&tb, "REQUESTS", "%" PRIu64, c->requests);
                table_cell(&tb, "FDS", "%u", c->fds);
                table_cell(&tb, "ADMIN", "%s", c->admin ? "yes" : "no");
        }
        return table_print(&tb);
}

#define CLIENT_COUNTS(X) X(connected_usec), X(requests), X(handles), X(fds), X(host_bytes), X(managed_bytes)

static void client_json(json_object *j, const void *item)
{
        const gm_client_info *s = item;
        json_object *vram;

        ju64(j, "id", s->client_id);
        J_U64(pid), J_U64(uid), J_U64(gid), J_STR(name), J_STR(cgroup), J_STR(container);
        jstr(j, "class", s->class_name);
        J_STR(pod);
        jbool(j, "admin", s->admin);
        CLIENT_COUNTS(J_U64);
        vram = jarray(j, "vram");
        for (size_t k = 0; k < s->n_usage; k++) {
                json_object *u = json_object_new_object();
                ju64(u, "gpu_id", s->usage[k].gpu_id);
                ju64(u, "bytes", s->usage[k].vram_bytes);
                json_object_array_add(vram, u);
        }
}

int cmd_clients(Ctl *ctl, int argc, char **argv)
{
        gm_client_info *infos = NULL;
        size_t n = 0;
        int r = gm_admin_clients(ctl->c, &infos, &n);

        if (r < 0)
                return fail(ctl, "clients", r);
        r = ctl->json ? jlist("clients", infos, n, sizeof(*infos), client_json)
                      : print_clients(ctl, infos, n);
        gm_client_info_free(infos, n);
        return r;
}

int cmd_disconnect(Ctl *ctl, int argc, char **argv)
{
        char *end;
        unsigned long long id;
        int r;

        if (argc != 2) {
                return usage_error("usage: disconnect CLIENT_ID");
        }
        errno = 0;
        id = strtoull(argv[1], &end, 10);
        if (errno || *end || !argv[1][0]) {
                return usage_error("disconnect: '%s' is not a client id", argv[1]);
        }
        r = gm_admin_disconnect(ctl->c, id);
        if (r < 0)
                return fail(ctl, "disconnect", r);
        return print_done(ctl, "disconnected", json_object_new_uint64(id), "client %llu disconnected\n", id);
}

int cmd_metrics(Ctl *ctl, int argc, char **argv)
{
        char *text = NULL;
        int r = gm_admin_metrics(ctl->c, &text);

        if (r < 0)
                return fail(ctl, "metrics", r);
        r = print_done(ctl, "prometheus", json_object_new_string(text), "%s", text);
        gm_free(text);
        return r;
}

int cmd_log_level(Ctl *ctl, int argc, char **argv)
{
        int r;

        if (argc != 2) {
                return usage_error("usage: log-level err|warning|notice|info|debug");
        }
        r = gm_admin_set_log_level(ctl->c, argv[1]);
        if (r < 0)
                return fail(ctl, "log-level", r);
        return print_done(ctl, "log_level", json_object_new_string(argv[1]), NULL);
}

int cmd_ping(Ctl *ctl, int argc, char **argv)
{
        struct timespec a, b;
        int r;

        clock_gettime(CLOCK_MONOTONIC, &a);
        r = gm_ping(ctl->c);
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (r < 0)
                return fail(ctl, "ping", r);
        double us = (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
        char t[32];
        snprintf(t, sizeof(t), "%.1f", us); /* printed as measured, to 0.1 us */
        return print_done(ctl, "round_trip_usec", json_object_new_double_s(us, t),
                          "gpumemd answered in %.1f us\n", us);
}
