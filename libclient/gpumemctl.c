/* gpumemctl: the administrators' CLI for gpumemd (tables for people, stable JSON with --json). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>
#include <libsmartcols/libsmartcols.h>

#include "config.h"
#include "gpumem-client.h"

#define GPUMEMCTL_JSON_SCHEMA 1
#define ARRAY_SIZE(a)         (sizeof(a) / sizeof((a)[0]))

typedef struct Ctl {
        gm_client *c;
        bool json;
        const char *socket;
        const char *columns; /* -o: the table's columns, or "+A,B" for its defaults and these */
        bool noheadings;     /* -n */
        bool raw;            /* -r: one space between columns, unaligned, spaces escaped */
} Ctl;

/* Exit statuses (gpumemctl(1)): scripts tell these apart. */
enum {
        EXIT_FAILED = 1,      /* the daemon refused or failed the request */
        EXIT_USAGE = 2,       /* bad command line: nothing was asked of the daemon */
        EXIT_UNREACHABLE = 3, /* no daemon answered at the socket */
        EXIT_DENIED = 4,      /* the daemon refused: not allowed (EPERM, EACCES) */
        EXIT_NOT_FOUND = 5,   /* no such client, class or object (ENOENT, ESRCH) */
};

/* --json: what failed, as one JSON object on stdout, so that a script reading stdout sees it; main()
 * prints it in place of whatever the command began to print */
static bool json_errors;
static char json_error_buf[4096]; /* a reason (512) and a path (PATH_MAX), escaped */

/* JSON is built with json-c and printed one document per line (PLAIN: no spaces, '/' unescaped). */
static json_object *jdoc(void)
{
        json_object *o = json_object_new_object();
        json_object_object_add(o, "schema", json_object_new_int(GPUMEMCTL_JSON_SCHEMA));
        return o;
}

static void jstr(json_object *o, const char *key, const char *v)
{
        json_object_object_add(o, key, json_object_new_string(v ? v : ""));
}

static void ju64(json_object *o, const char *key, uint64_t v)
{
        json_object_object_add(o, key, json_object_new_uint64(v));
}

static void ji64(json_object *o, const char *key, int64_t v)
{
        json_object_object_add(o, key, json_object_new_int64(v));
}

static void jbool(json_object *o, const char *key, bool v)
{
        json_object_object_add(o, key, json_object_new_boolean(v));
}

/* A limit: null for none. */
static void jlimit(json_object *o, const char *key, uint64_t v)
{
        json_object_object_add(o, key, v == GM_UNLIMITED ? NULL : json_object_new_uint64(v));
}

static json_object *jarray(json_object *o, const char *key)
{
        json_object *a = json_object_new_array();
        json_object_object_add(o, key, a);
        return a;
}

/* Prints @o on one line and frees it. */
static void jprint(json_object *o, int flags)
{
        puts(json_object_to_json_string_ext(o, flags | JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
}

/* -b: sizes as exact byte counts, for scripts (tables only; JSON always has bytes) */
static bool exact_bytes;

static const char *human_bytes(uint64_t v, char *buf, size_t len)
{
        static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
        double d = (double)v;
        size_t u = 0;

        if (exact_bytes) {
                snprintf(buf, len, "%" PRIu64, v);
                return buf;
        }

        while (d >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
                d /= 1024.0;
                u++;
        }
        if (u == 0)
                snprintf(buf, len, "%" PRIu64 " B", v);
        else
                snprintf(buf, len, "%.1f %s", d, units[u]);
        return buf;
}

/* The error as JSON on stdout: {"schema":1,"error":{"errno":-22,"name":"EINVAL","reason":"..."},...}. */
static void json_error(int err, const char *what, const char *reason, int status)
{
        const char *name = strerrorname_np(-err);
        json_object *o = jdoc(), *e = json_object_new_object();

        ji64(e, "errno", err);
        jstr(e, "name", name ? name : "");
        jstr(e, "what", what);
        jstr(e, "reason", reason);
        json_object_object_add(o, "error", e);
        ji64(o, "exit_status", status);
        snprintf(json_error_buf, sizeof(json_error_buf), "%s\n",
                 json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
}

/* Prints the error a command left (JSON mode), or nothing. */
static void json_error_flush(void)
{
        if (json_error_buf[0])
                fputs(json_error_buf, stdout);
        json_error_buf[0] = '\0';
}

static int exit_status_of(int err)
{
        switch (err) {
        case -EPERM:
        case -EACCES:
                return EXIT_DENIED;
        case -ENOENT:
        case -ESRCH:
                return EXIT_NOT_FOUND;
        default:
                return EXIT_FAILED;
        }
}

static int fail(Ctl *ctl, const char *what, int err)
{
        char buf[512];
        int status = exit_status_of(err);

        gm_strerror(ctl->c, err, buf, sizeof(buf));
        fprintf(stderr, "gpumemctl: %s: %s\n", what, buf);
        if (json_errors)
                json_error(err, what, buf, status);
        return status;
}

/* A failure found here, not by the daemon: as fail() does, with its own reason. */
__attribute__((format(printf, 3, 4))) static int command_error(int err, const char *what, const char *fmt,
                                                               ...)
{
        char buf[512];
        va_list ap;
        int status = exit_status_of(err);

        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        fprintf(stderr, "gpumemctl: %s: %s\n", what, buf);
        if (json_errors)
                json_error(err, what, buf, status);
        return status;
}

/* A bad command line: the message on stderr (and as JSON with --json); exit status 2. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
        char buf[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        fprintf(stderr, "gpumemctl: %s\n", buf);
        if (json_errors)
                json_error(-EINVAL, "usage", buf, EXIT_USAGE);
        return EXIT_USAGE;
}

/*
 * Tables, printed with libsmartcols (util-linux's table printer: widths, truncation, raw output), so that
 * every table takes the same -o, -n and -r as lsblk or findmnt do.
 */
typedef struct ColumnSpec {
        const char *name;
        double whint; /* width hint: < 1 a fraction of the terminal, else columns */
        int flags;    /* SCOLS_FL_* */
        bool shown;   /* one of the table's default columns */
} ColumnSpec;

#define TABLE_MAX_COLUMNS 32

typedef struct Table {
        struct libscols_table *tb;
        struct libscols_line *line;
        const ColumnSpec *spec;
        size_t n_spec;
        int cell[TABLE_MAX_COLUMNS]; /* per spec column: its place in the table, or -1 when not shown */
        bool oom;                    /* a row or a cell could not be made: the table is not printed */
} Table;

/* Out of memory while making the table: nothing printed, the table let go. */
static int table_fail(Table *t, const char *what)
{
        scols_unref_table(t->tb);
        t->tb = NULL;
        return command_error(-ENOMEM, what, "out of memory");
}

static int table_add_column(Table *t, size_t k, size_t *placed)
{
        if (t->cell[k] >= 0)
                return 0; /* asked for twice: shown once */
        if (!scols_table_new_column(t->tb, t->spec[k].name, t->spec[k].whint, t->spec[k].flags))
                return -ENOMEM;
        t->cell[k] = (int)(*placed)++;
        return 0;
}

/* The columns -o names (case does not matter), in its order, or the defaults; EXIT_USAGE for a name the
 * table does not have, listing those it has. */
static int table_new(Ctl *ctl, Table *t, const char *what, const ColumnSpec *spec, size_t n_spec)
{
        const char *list = ctl->columns;
        size_t placed = 0;

        memset(t, 0, sizeof(*t));
        t->spec = spec;
        t->n_spec = n_spec < TABLE_MAX_COLUMNS ? n_spec : TABLE_MAX_COLUMNS;
        for (size_t k = 0; k < TABLE_MAX_COLUMNS; k++)
                t->cell[k] = -1;
        t->tb = scols_new_table();
        if (!t->tb)
                return command_error(-ENOMEM, what, "out of memory");
        scols_table_set_stream(t->tb, stdout);
        scols_table_enable_noheadings(t->tb, ctl->noheadings);
        scols_table_enable_raw(t->tb, ctl->raw);
        if (!list || *list == '+') {
                for (size_t k = 0; k < t->n_spec; k++)
                        if (spec[k].shown && table_add_column(t, k, &placed) < 0)
                                return table_fail(t, what);
                if (list)
                        list++;
        }
        while (list && *list) {
                size_t len = strcspn(list, ","), k;
                for (k = 0; k < t->n_spec; k++)
                        if (strlen(spec[k].name) == len && strncasecmp(spec[k].name, list, len) == 0)
                                break;
                if (k == t->n_spec) {
                        char names[512] = "";
                        for (size_t i = 0; i < t->n_spec; i++)
                                snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                                         i ? "," : "", spec[i].name);
                        scols_unref_table(t->tb);
                        t->tb = NULL;
                        return usage_error("%s has no column '%.*s' (its columns: %s)", what, (int)len, list,
                                           names);
                }
                if (table_add_column(t, k, &placed) < 0)
                        return table_fail(t, what);
                list += len;
                if (*list == ',')
                        list++;
        }
        return 0;
}

/* A new row, every cell "-" until set: a raw table's rows then always have every field. */
static void table_row(Table *t)
{
        t->line = scols_table_new_line(t->tb, NULL);
        t->oom |= !t->line;
        for (size_t k = 0; t->line && k < t->n_spec; k++)
                if (t->cell[k] >= 0)
                        t->oom |= scols_line_set_data(t->line, (size_t)t->cell[k], "-") < 0;
}

/* Cell @k of the current row, if that column is shown; "-" stands for nothing. */
static void table_cell(Table *t, size_t k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void table_cell(Table *t, size_t k, const char *fmt, ...)
{
        char buf[1024];
        va_list ap;

        if (!t->line || k >= t->n_spec || t->cell[k] < 0)
                return;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        t->oom |= scols_line_set_data(t->line, (size_t)t->cell[k], buf[0] ? buf : "-") < 0;
}

static int table_print(Table *t)
{
        if (t->oom)
                return table_fail(t, "table");
        int r = scols_print_table(t->tb);
        scols_unref_table(t->tb);
        t->tb = NULL;
        return r < 0 ? command_error(r, "table", "cannot print it") : EXIT_SUCCESS;
}

static int cmd_status(Ctl *ctl, int argc, char **argv)
{
        gm_status *s = NULL;
        char b1[32], b2[32], b3[32];
        int r;

        if (argc > 1) {
                return usage_error("status takes no arguments");
        }
        r = gm_admin_status(ctl->c, &s);
        if (r < 0)
                return fail(ctl, "status", r);
        if (ctl->json) {
                json_object *o = jdoc(), *k = json_object_new_object(), *b = json_object_new_object();
                jstr(o, "server_version", s->server_version);
                ju64(o, "protocol_version", s->protocol_version);
                jstr(o, "backend", s->backend);
                jbool(o, "simulated", s->preset[0] != '\0');
                jstr(o, "preset", s->preset);
                ju64(k, "major", s->kfd_major);
                ju64(k, "minor", s->kfd_minor);
                json_object_object_add(o, "kfd_version", k);
                ju64(o, "pid", s->pid);
                ju64(o, "uptime_usec", s->uptime_usec);
                ju64(o, "started_usec", s->started_usec);
                ju64(o, "clients", s->clients);
                ju64(o, "gpus", s->gpus);
                ju64(o, "allocations", s->allocations);
                ju64(b, "device", s->bytes_device);
                ju64(b, "host", s->bytes_host);
                ju64(b, "managed", s->bytes_managed);
                json_object_object_add(o, "bytes", b);
                ju64(o, "requests", s->requests);
                ju64(o, "protocol_errors", s->protocol_errors);
                ju64(o, "va_windows", s->va_windows);
                if (s->has_model) {
                        json_object *m = json_object_new_object();
                        ju64(m, "contexts", s->model_contexts);
                        ju64(m, "buffers", s->model_buffers);
                        ju64(m, "handles", s->model_handles);
                        ju64(m, "imports", s->model_imports);
                        ju64(m, "mappings", s->model_mappings);
                        ju64(m, "gem_handles", s->model_gem_handles);
                        ju64(m, "svm_ranges", s->model_svm_ranges);
                        ju64(m, "system_bytes", s->model_system_bytes);
                        ju64(m, "vram_bytes", s->model_vram_bytes);
                        json_object_object_add(o, "model", m);
                }
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else {
                printf("gpumemd %s (protocol %u), pid %u\n", s->server_version, s->protocol_version, s->pid);
                /* the driver's interface version: KFD's ioctl ABI, or the CUDA driver's version */
                printf("  backend:   %s%s%s%s, %s %u.%u\n", s->backend,
                       s->preset[0] ? " (SIMULATED GPUs, no hardware)" : "", s->preset[0] ? ", preset " : "",
                       s->preset, strcmp(s->backend, "cuda") == 0 ? "CUDA driver" : "KFD ABI", s->kfd_major,
                       s->kfd_minor);
                printf("  uptime:    %.1f s\n", (double)s->uptime_usec / 1e6);
                printf("  GPUs:      %u\n", s->gpus);
                printf("  clients:   %u\n", s->clients);
                printf("  requests:  %" PRIu64 " (%" PRIu64 " protocol errors)\n", s->requests,
                       s->protocol_errors);
                printf("  memory:    %" PRIu64 " allocations; device %s, host %s, managed %s\n",
                       s->allocations, human_bytes(s->bytes_device, b1, sizeof(b1)),
                       human_bytes(s->bytes_host, b2, sizeof(b2)),
                       human_bytes(s->bytes_managed, b3, sizeof(b3)));
                if (s->has_model)
                        printf("  model:     %u contexts, %" PRIu64 " buffers, %" PRIu64
                               " GPU mappings, %" PRIu64 " SVM ranges; VRAM %s, system %s\n",
                               s->model_contexts, s->model_buffers, s->model_mappings, s->model_svm_ranges,
                               human_bytes(s->model_vram_bytes, b1, sizeof(b1)),
                               human_bytes(s->model_system_bytes, b2, sizeof(b2)));
        }
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

enum {
        TC_NODE,
        TC_KIND,
        TC_GPU_ID,
        TC_TARGET,
        TC_VRAM,
        TC_SYSMEM,
        TC_NUMA,
        TC_RENDER,
        TC_LINKS,
        TC_NAME,
        TC_PCI,
        TC_SIMDS,
        TC_CORES,
        TC_VENDOR,
        TC_DEVICE,
        TC_HIVE,
        TC_LARGE_BAR,
};
static const ColumnSpec topology_columns[] = {
        [TC_NODE] = {"NODE", 4, SCOLS_FL_RIGHT, true},
        [TC_KIND] = {"KIND", 4, 0, true},
        [TC_GPU_ID] = {"GPU_ID", 6, SCOLS_FL_RIGHT, true},
        [TC_TARGET] = {"TARGET", 8, 0, true},
        [TC_VRAM] = {"VRAM", 10, SCOLS_FL_RIGHT, true},
        [TC_SYSMEM] = {"SYSMEM", 10, SCOLS_FL_RIGHT, true},
        [TC_NUMA] = {"NUMA", 4, SCOLS_FL_RIGHT, true},
        [TC_RENDER] = {"RENDER", 6, 0, true},
        [TC_LINKS] = {"LINKS", 0.3, SCOLS_FL_WRAP, true},
        [TC_NAME] = {"NAME", 0.1, SCOLS_FL_TRUNC, false},
        [TC_PCI] = {"PCI", 12, 0, false},
        [TC_SIMDS] = {"SIMDS", 5, SCOLS_FL_RIGHT, false},
        [TC_CORES] = {"CORES", 5, SCOLS_FL_RIGHT, false},
        [TC_VENDOR] = {"VENDOR", 6, 0, false},
        [TC_DEVICE] = {"DEVICE", 6, 0, false},
        [TC_HIVE] = {"HIVE", 18, 0, false},
        [TC_LARGE_BAR] = {"LARGE_BAR", 3, 0, false},
};

/* The nodes; with --properties, a second table of every node's raw properties (NODE PROPERTY VALUE). */
static int print_topology(Ctl *ctl, const gm_topology *t, bool props)
{
        Table tb;
        char b1[32], b2[32], gfx[16], tl[16], links[1024];
        int r = table_new(ctl, &tb, "topology", topology_columns, ARRAY_SIZE(topology_columns));

        if (r)
                return r;
        for (size_t i = 0; i < t->n_nodes; i++) {
                const gm_topology_node *n = &t->nodes[i];
                size_t off = 0;
                table_row(&tb);
                table_cell(&tb, TC_NODE, "%u", n->node_id);
                table_cell(&tb, TC_KIND, "%s", n->is_gpu ? (n->cpu_cores ? "APU" : "GPU") : "CPU");
                table_cell(&tb, TC_NAME, "%s", n->name ? n->name : "");
                table_cell(&tb, TC_CORES, "%u", n->cpu_cores);
                if (n->local_mem_size)
                        table_cell(&tb, TC_VRAM, "%s", human_bytes(n->local_mem_size, b1, sizeof(b1)));
                if (n->system_mem_size)
                        table_cell(&tb, TC_SYSMEM, "%s", human_bytes(n->system_mem_size, b2, sizeof(b2)));
                if (n->numa_node >= 0)
                        table_cell(&tb, TC_NUMA, "%d", n->numa_node);
                if (n->is_gpu) {
                        table_cell(&tb, TC_GPU_ID, "%u", n->gpu_id);
                        table_cell(&tb, TC_TARGET, "%s", gfx_name(n->gfx_target_version, gfx, sizeof(gfx)));
                        table_cell(&tb, TC_RENDER, "D%u", n->drm_render_minor);
                        table_cell(&tb, TC_PCI, "%04x:%02x:%02x.%x", n->pci_domain, n->pci_location >> 8,
                                   (n->pci_location >> 3) & 0x1f, n->pci_location & 7);
                        table_cell(&tb, TC_SIMDS, "%u", n->simd_count);
                        table_cell(&tb, TC_VENDOR, "0x%04x", n->vendor_id);
                        table_cell(&tb, TC_DEVICE, "0x%04x", n->device_id);
                        if (n->hive_id)
                                table_cell(&tb, TC_HIVE, "0x%016" PRIx64, n->hive_id);
                        table_cell(&tb, TC_LARGE_BAR, "%s", n->large_bar ? "yes" : "no");
                }
                links[0] = '\0';
                for (size_t k = 0; k < n->n_io_links && off < sizeof(links); k++)
                        off += (size_t)snprintf(links + off, sizeof(links) - off, "%s%s->%u", k ? "," : "",
                                                link_type(n->io_links[k].type, tl, sizeof(tl)),
                                                n->io_links[k].node_to);
                table_cell(&tb, TC_LINKS, "%s", links);
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

static int cmd_topology(Ctl *ctl, int argc, char **argv)
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
        if (ctl->json) {
                json_object *o = jdoc(), *nodes;
                ju64(o, "generation_id", t->generation_id);
                nodes = jarray(o, "nodes");
                for (size_t i = 0; i < t->n_nodes; i++) {
                        const gm_topology_node *n = &t->nodes[i];
                        json_object *j = json_object_new_object(), *links;
                        ju64(j, "node_id", n->node_id);
                        jstr(j, "kind", n->is_gpu ? (n->cpu_cores ? "apu" : "gpu") : "cpu");
                        ju64(j, "gpu_id", n->gpu_id);
                        jstr(j, "name", n->name);
                        ju64(j, "cpu_cores", n->cpu_cores);
                        ju64(j, "simd_count", n->simd_count);
                        ju64(j, "vram_bytes", n->local_mem_size);
                        ju64(j, "system_mem_bytes", n->system_mem_size);
                        ju64(j, "gfx_target_version", n->gfx_target_version);
                        ju64(j, "vendor_id", n->vendor_id);
                        ju64(j, "device_id", n->device_id);
                        ju64(j, "pci_domain", n->pci_domain);
                        ju64(j, "pci_location", n->pci_location);
                        ju64(j, "drm_render_minor", n->drm_render_minor);
                        ju64(j, "hive_id", n->hive_id);
                        ji64(j, "numa_node", n->numa_node);
                        jbool(j, "large_bar", n->large_bar);
                        ju64(j, "capability", n->capability);
                        links = jarray(j, "io_links");
                        for (size_t k = 0; k < n->n_io_links; k++) {
                                const gm_io_link *l = &n->io_links[k];
                                json_object *lo = json_object_new_object();
                                char tb[16];
                                jstr(lo, "type", link_type(l->type, tb, sizeof(tb)));
                                ju64(lo, "from", l->node_from);
                                ju64(lo, "to", l->node_to);
                                ju64(lo, "weight", l->weight);
                                ju64(lo, "min_bandwidth", l->min_bandwidth);
                                ju64(lo, "max_bandwidth", l->max_bandwidth);
                                json_object_array_add(links, lo);
                        }
                        if (props) {
                                json_object *po = json_object_new_object();
                                for (size_t k = 0; k < n->n_properties; k++)
                                        ju64(po, n->properties[k].key, n->properties[k].value);
                                json_object_object_add(j, "properties", po);
                        }
                        json_object_array_add(nodes, j);
                }
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else {
                r = print_topology(ctl, t, props);
                gm_topology_free(t);
                return r;
        }
        gm_topology_free(t);
        return EXIT_SUCCESS;
}

static void fmt_time(uint64_t usec, char *buf, size_t len)
{
        time_t t = (time_t)(usec / 1000000);
        struct tm tm;
        if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
                snprintf(buf, len, "-");
}

enum {
        CC_ID,
        CC_PID,
        CC_UID,
        CC_CLASS,
        CC_NAME,
        CC_CONTAINER,
        CC_CONNECTED,
        CC_HANDLES,
        CC_VRAM,
        CC_HOST,
        CC_MANAGED,
        CC_GID,
        CC_POD,
        CC_CGROUP,
        CC_REQUESTS,
        CC_FDS,
        CC_ADMIN,
};
static const ColumnSpec client_columns[] = {
        [CC_ID] = {"ID", 4, SCOLS_FL_RIGHT, true},
        [CC_PID] = {"PID", 7, SCOLS_FL_RIGHT, true},
        [CC_UID] = {"UID", 5, SCOLS_FL_RIGHT, true},
        [CC_CLASS] = {"CLASS", 0.1, SCOLS_FL_TRUNC, true},
        [CC_NAME] = {"NAME", 0.1, SCOLS_FL_TRUNC, true},
        [CC_CONTAINER] = {"CONTAINER", 0.15, SCOLS_FL_TRUNC, true},
        [CC_CONNECTED] = {"CONNECTED", 20, 0, true},
        [CC_HANDLES] = {"HANDLES", 7, SCOLS_FL_RIGHT, true},
        [CC_VRAM] = {"VRAM", 10, SCOLS_FL_RIGHT, true},
        [CC_HOST] = {"HOST", 10, SCOLS_FL_RIGHT, true},
        [CC_MANAGED] = {"MANAGED", 10, SCOLS_FL_RIGHT, true},
        [CC_GID] = {"GID", 5, SCOLS_FL_RIGHT, false},
        [CC_POD] = {"POD", 36, 0, false},
        [CC_CGROUP] = {"CGROUP", 0.3, SCOLS_FL_TRUNC, false},
        [CC_REQUESTS] = {"REQUESTS", 8, SCOLS_FL_RIGHT, false},
        [CC_FDS] = {"FDS", 4, SCOLS_FL_RIGHT, false},
        [CC_ADMIN] = {"ADMIN", 3, 0, false},
};

static int print_clients(Ctl *ctl, const gm_client_info *infos, size_t n)
{
        Table tb;
        char when[32], b[32];
        int r = table_new(ctl, &tb, "clients", client_columns, ARRAY_SIZE(client_columns));

        if (r)
                return r;
        for (size_t i = 0; i < n; i++) {
                const gm_client_info *c = &infos[i];
                uint64_t vram = 0;
                for (size_t k = 0; k < c->n_usage; k++)
                        vram += c->usage[k].vram_bytes;
                fmt_time(c->connected_usec, when, sizeof(when));
                table_row(&tb);
                table_cell(&tb, CC_ID, "%" PRIu64, c->client_id);
                table_cell(&tb, CC_PID, "%u", c->pid);
                table_cell(&tb, CC_UID, "%u", c->uid);
                table_cell(&tb, CC_GID, "%u", c->gid);
                table_cell(&tb, CC_CLASS, "%s", c->class_name);
                table_cell(&tb, CC_NAME, "%s", c->name);
                table_cell(&tb, CC_CONTAINER, "%s", c->container);
                table_cell(&tb, CC_POD, "%s", c->pod);
                table_cell(&tb, CC_CGROUP, "%s", c->cgroup);
                table_cell(&tb, CC_CONNECTED, "%s", when);
                table_cell(&tb, CC_HANDLES, "%u", c->handles);
                table_cell(&tb, CC_VRAM, "%s", human_bytes(vram, b, sizeof(b)));
                table_cell(&tb, CC_HOST, "%s", human_bytes(c->host_bytes, b, sizeof(b)));
                table_cell(&tb, CC_MANAGED, "%s", human_bytes(c->managed_bytes, b, sizeof(b)));
                table_cell(&tb, CC_REQUESTS, "%" PRIu64, c->requests);
                table_cell(&tb, CC_FDS, "%u", c->fds);
                table_cell(&tb, CC_ADMIN, "%s", c->admin ? "yes" : "no");
        }
        return table_print(&tb);
}

static int cmd_clients(Ctl *ctl, int argc, char **argv)
{
        gm_client_info *infos = NULL;
        size_t n = 0;
        int r;

        if (argc > 1) {
                return usage_error("clients takes no arguments");
        }
        r = gm_admin_clients(ctl->c, &infos, &n);
        if (r < 0)
                return fail(ctl, "clients", r);
        if (ctl->json) {
                json_object *o = jdoc(), *list = jarray(o, "clients");
                for (size_t i = 0; i < n; i++) {
                        const gm_client_info *c = &infos[i];
                        json_object *j = json_object_new_object(), *vram;
                        ju64(j, "id", c->client_id);
                        ju64(j, "pid", c->pid);
                        ju64(j, "uid", c->uid);
                        ju64(j, "gid", c->gid);
                        jstr(j, "name", c->name);
                        jstr(j, "cgroup", c->cgroup);
                        jstr(j, "container", c->container);
                        jstr(j, "class", c->class_name);
                        jstr(j, "pod", c->pod);
                        jbool(j, "admin", c->admin);
                        ju64(j, "connected_usec", c->connected_usec);
                        ju64(j, "requests", c->requests);
                        ju64(j, "handles", c->handles);
                        ju64(j, "fds", c->fds);
                        ju64(j, "host_bytes", c->host_bytes);
                        ju64(j, "managed_bytes", c->managed_bytes);
                        vram = jarray(j, "vram");
                        for (size_t k = 0; k < c->n_usage; k++) {
                                json_object *u = json_object_new_object();
                                ju64(u, "gpu_id", c->usage[k].gpu_id);
                                ju64(u, "bytes", c->usage[k].vram_bytes);
                                json_object_array_add(vram, u);
                        }
                        json_object_array_add(list, j);
                }
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else {
                r = print_clients(ctl, infos, n);
                gm_client_info_free(infos, n);
                return r;
        }
        gm_client_info_free(infos, n);
        return EXIT_SUCCESS;
}

static int cmd_disconnect(Ctl *ctl, int argc, char **argv)
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
        if (ctl->json) {
                json_object *o = jdoc();
                ju64(o, "disconnected", id);
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else
                printf("client %llu disconnected\n", id);
        return EXIT_SUCCESS;
}

static int cmd_metrics(Ctl *ctl, int argc, char **argv)
{
        char *text = NULL;
        int r;

        if (argc > 1) {
                return usage_error("metrics takes no arguments");
        }
        r = gm_admin_metrics(ctl->c, &text);
        if (r < 0)
                return fail(ctl, "metrics", r);
        if (ctl->json) {
                json_object *o = jdoc();
                jstr(o, "prometheus", text);
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else {
                fputs(text, stdout);
        }
        gm_free(text);
        return EXIT_SUCCESS;
}

static int cmd_log_level(Ctl *ctl, int argc, char **argv)
{
        int r;

        if (argc != 2) {
                return usage_error("usage: log-level err|warning|notice|info|debug");
        }
        r = gm_admin_set_log_level(ctl->c, argv[1]);
        if (r < 0)
                return fail(ctl, "log-level", r);
        if (ctl->json) {
                json_object *o = jdoc();
                jstr(o, "log_level", argv[1]);
                jprint(o, JSON_C_TO_STRING_PLAIN);
        }
        return EXIT_SUCCESS;
}

static int cmd_ping(Ctl *ctl, int argc, char **argv)
{
        struct timespec a, b;
        int r;

        clock_gettime(CLOCK_MONOTONIC, &a);
        r = gm_ping(ctl->c);
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (r < 0)
                return fail(ctl, "ping", r);
        double us = (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
        if (ctl->json) {
                json_object *o = jdoc();
                char t[32];
                snprintf(t, sizeof(t), "%.1f", us); /* printed as measured, to 0.1 us */
                json_object_object_add(o, "round_trip_usec", json_object_new_double_s(us, t));
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else
                printf("gpumemd answered in %.1f us\n", us);
        return EXIT_SUCCESS;
}

/* CDI names start and end with a letter or digit; a kind is VENDOR/CLASS with VENDOR a DNS name. */
static bool cdi_name_ok(const char *s, size_t max, const char *inner)
{
        size_t n = strlen(s);

        if (n == 0 || n > max || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1]))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char)s[i]) && !strchr(inner, s[i]))
                        return false;
        return true;
}

static bool cdi_kind_ok(const char *kind)
{
        const char *slash = strchr(kind, '/');
        char vendor[254], label[64];
        const char *p;

        if (!slash || (size_t)(slash - kind) >= sizeof(vendor))
                return false;
        memcpy(vendor, kind, (size_t)(slash - kind));
        vendor[slash - kind] = '\0';
        if (!vendor[0] || !cdi_name_ok(slash + 1, 63, "-_"))
                return false;
        for (p = vendor; *p;) {
                size_t n = strcspn(p, ".");
                if (n == 0 || n >= sizeof(label))
                        return false;
                memcpy(label, p, n);
                label[n] = '\0';
                if (!cdi_name_ok(label, 63, "-"))
                        return false;
                p += n;
                if (*p == '.' && *++p == '\0')
                        return false;
        }
        return true;
}

static bool cdi_path_ok(const char *path)
{
        if (path[0] != '/' || strlen(path) >= 108)
                return false;
        for (const char *p = path; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == '=')
                        return false;
        return true;
}

/* Where this process loaded libprotobuf-c from: the library gpumem-kfd needs beside it in a container. */
static int find_protobuf_c(struct dl_phdr_info *info, size_t size, void *data)
{
        const char *base = strrchr(info->dlpi_name, '/');

        (void)size;
        if (base && strncmp(base + 1, "libprotobuf-c.so.", 17) == 0) {
                snprintf(data, PATH_MAX, "%s", info->dlpi_name);
                return 1;
        }
        return 0;
}

/* One bind mount of a file into the container. */
static void cdi_mount(json_object *mounts, const char *host, const char *inside, const char *const *opts)
{
        json_object *m = json_object_new_object(), *o;

        jstr(m, "hostPath", host);
        jstr(m, "containerPath", inside);
        jstr(m, "type", "bind");
        o = jarray(m, "options");
        for (size_t i = 0; opts[i]; i++)
                json_object_array_add(o, json_object_new_string(opts[i]));
        json_object_array_add(mounts, m);
}

#define CDI_ROCM_DIR "/opt/gpumemd/lib"

/*
 * A Container Device Interface spec for the socket: the container gets a bind mount of the socket and
 * GPUMEM_SOCKET, and no device node, since gpumemd alone opens /dev/kfd. With --rocm it also gets the
 * client-side KFD (libgpumem-kfd.so and the libprotobuf-c it needs, read-only, in /opt/gpumemd/lib) and
 * LD_PRELOAD naming it, so unmodified ROCm programs in it run through gpumemd. When the socket on the host
 * belongs to a group other than root's, the container's process gets that group too (additionalGids, CDI
 * 0.7.0), so that it may connect without --group-add; otherwise, or with --no-additional-gids (for runtimes
 * older than CDI 0.7.0, such as Debian 12's Podman 4.3), the spec is version 0.5.0, which covers everything
 * else used here (env, mount type and options).
 */
static int cmd_cdi(Ctl *ctl, int argc, char **argv)
{
        const char *kind = "gpumem.io/socket", *name = "default";
        const char *host = ctl->socket ? ctl->socket : GM_DEFAULT_SOCKET, *inside = NULL;
        const char *kfd_lib = GPUMEMD_KFD_LIBRARY;
        static const char *const sock_opts[] = {"bind", "nosuid", "nodev", "noexec", NULL};
        static const char *const lib_opts[] = {"bind", "ro", "nosuid", "nodev", NULL};
        char env[160], pbc[PATH_MAX] = "", in_pbc[PATH_MAX];
        bool rocm = false, gids = true;
        struct stat st;

        for (int i = 1; i < argc; i++) {
                static const char *const opts[] = {"--kind", "--name", "--socket-path", "--container-path",
                                                   "--kfd-library"};
                const char **dst[] = {&kind, &name, &host, &inside, &kfd_lib};
                size_t k, len = 0;

                if (strcmp(argv[i], "--rocm") == 0) {
                        rocm = true;
                        continue;
                }
                if (strcmp(argv[i], "--no-additional-gids") == 0) {
                        gids = false;
                        continue;
                }

                for (k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
                        len = strlen(opts[k]);
                        if (strncmp(argv[i], opts[k], len) == 0 &&
                            (argv[i][len] == '\0' || argv[i][len] == '='))
                                break;
                }
                if (k == sizeof(opts) / sizeof(opts[0])) {
                        return usage_error("cdi: unknown argument '%s'", argv[i]);
                }
                if (argv[i][len] == '=')
                        *dst[k] = argv[i] + len + 1;
                else if (i + 1 < argc)
                        *dst[k] = argv[++i];
                else {
                        return usage_error("cdi: %s needs a value", opts[k]);
                }
        }
        if (!inside)
                inside = host;
        if (!cdi_kind_ok(kind)) {
                return usage_error("cdi: '%s' is not a CDI kind (vendor.example/class)", kind);
        }
        if (!cdi_name_ok(name, 63, "-_.:")) {
                return usage_error("cdi: '%s' is not a CDI device name", name);
        }
        if (!cdi_path_ok(host) || !cdi_path_ok(inside)) {
                return usage_error("cdi: socket paths must be absolute, shorter than 108 bytes and free of "
                                   "control characters and '='");
        }
        if (rocm) {
                if (!cdi_path_ok(kfd_lib) || access(kfd_lib, R_OK) < 0)
                        return command_error(-ENOENT, "cdi", "no client-side KFD at %s (--kfd-library PATH)",
                                             kfd_lib);
                dl_iterate_phdr(find_protobuf_c, pbc);
                if (!pbc[0] || !cdi_path_ok(pbc))
                        return command_error(-ENOENT, "cdi", "cannot tell where libprotobuf-c is");
                snprintf(in_pbc, sizeof(in_pbc), "%s/%s", CDI_ROCM_DIR, strrchr(pbc, '/') + 1);
        }
        /* the socket's group, if it is there already and is not root's */
        gids = gids && stat(host, &st) == 0 && st.st_gid != 0;
        {
                json_object *spec = json_object_new_object(), *devs, *dev = json_object_new_object();
                json_object *edits = json_object_new_object(), *envs, *mounts;

                jstr(spec, "cdiVersion", gids ? "0.7.0" : "0.5.0");
                jstr(spec, "kind", kind);
                devs = jarray(spec, "devices");
                jstr(dev, "name", name);
                envs = jarray(edits, "env");
                snprintf(env, sizeof(env), "GPUMEM_SOCKET=%s", inside);
                json_object_array_add(envs, json_object_new_string(env));
                if (rocm)
                        json_object_array_add(
                                envs, json_object_new_string("LD_PRELOAD=" CDI_ROCM_DIR "/libgpumem-kfd.so"));
                if (gids)
                        json_object_array_add(jarray(edits, "additionalGids"),
                                              json_object_new_uint64(st.st_gid));
                mounts = jarray(edits, "mounts");
                cdi_mount(mounts, host, inside, sock_opts);
                if (rocm) {
                        cdi_mount(mounts, kfd_lib, CDI_ROCM_DIR "/libgpumem-kfd.so", lib_opts);
                        cdi_mount(mounts, pbc, in_pbc, lib_opts);
                }
                json_object_object_add(dev, "containerEdits", edits);
                json_object_array_add(devs, dev);
                /* a document people read and keep in /etc/cdi: indented */
                jprint(spec, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED);
        }
        return EXIT_SUCCESS;
}

static const char *kind_name(int kind)
{
        switch (kind) {
        case GM_KIND_DEVICE:
                return "device";
        case GM_KIND_HOST:
                return "host";
        case GM_KIND_MANAGED:
                return "managed";
        case GM_KIND_VMM:
                return "vmm";
        case GM_KIND_IMPORT:
                return "import";
        case GM_KIND_SHARE:
                return "share";
        default:
                return "reserved";
        }
}

static int parse_u64(const char *s, uint64_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 0);
        if (errno || *end || !*s || *s == '-')
                return -EINVAL;
        *ret = v;
        return 0;
}

enum {
        AC_CLIENT,
        AC_HANDLE,
        AC_KIND,
        AC_SIZE,
        AC_GPU,
        AC_VA,
        AC_EXPORTS,
        AC_MAPPED_ON,
};
static const ColumnSpec allocation_columns[] = {
        [AC_CLIENT] = {"CLIENT", 6, SCOLS_FL_RIGHT, true},
        [AC_HANDLE] = {"HANDLE", 18, 0, true},
        [AC_KIND] = {"KIND", 7, 0, true},
        [AC_SIZE] = {"SIZE", 10, SCOLS_FL_RIGHT, true},
        [AC_GPU] = {"GPU", 6, SCOLS_FL_RIGHT, true},
        [AC_VA] = {"VA", 18, 0, true},
        [AC_EXPORTS] = {"EXPORTS", 7, SCOLS_FL_RIGHT, true},
        [AC_MAPPED_ON] = {"MAPPED_ON", 0.2, SCOLS_FL_WRAP, true},
};

static int cmd_allocations(Ctl *ctl, int argc, char **argv)
{
        uint64_t client = 0, cursor = 0, total = 0;
        json_object *doc = NULL, *list = NULL;
        Table tb = {0};
        char b1[32];
        int r;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--client") == 0 && i + 1 < argc) {
                        if (parse_u64(argv[++i], &client) < 0 || client == 0) {
                                return usage_error("allocations: '%s' is not a client id", argv[i]);
                        }
                } else {
                        return usage_error("usage: allocations [--client ID]");
                }
        }
        if (ctl->json) {
                doc = jdoc();
                list = jarray(doc, "allocations");
        } else if ((r = table_new(ctl, &tb, "allocations", allocation_columns,
                                  ARRAY_SIZE(allocation_columns)))) {
                return r;
        }
        do {
                gm_alloc_info *a = NULL;
                size_t n = 0;
                r = gm_admin_allocations(ctl->c, client, 0, &cursor, &a, &n);
                if (r < 0) {
                        json_object_put(doc);
                        scols_unref_table(tb.tb);
                        return fail(ctl, "allocations", r);
                }
                for (size_t i = 0; i < n; i++, total++) {
                        if (ctl->json) {
                                json_object *o = json_object_new_object(), *m;
                                char h[24];
                                snprintf(h, sizeof(h), "0x%016" PRIx64, a[i].id);
                                ju64(o, "client_id", a[i].client_id);
                                jstr(o, "handle", h);
                                jstr(o, "kind", kind_name(a[i].kind));
                                ju64(o, "size", a[i].size);
                                ju64(o, "gpu_id", a[i].gpu_id);
                                ju64(o, "va", a[i].va);
                                ju64(o, "exports", a[i].exports);
                                m = jarray(o, "mapped_gpus");
                                for (size_t k = 0; k < a[i].n_mapped_gpus; k++)
                                        json_object_array_add(m, json_object_new_uint64(a[i].mapped_gpus[k]));
                                json_object_array_add(list, o);
                        } else {
                                char on[512] = "";
                                size_t off = 0;
                                for (size_t k = 0; k < a[i].n_mapped_gpus && off < sizeof(on); k++)
                                        off += (size_t)snprintf(on + off, sizeof(on) - off, "%s%u",
                                                                k ? "," : "", a[i].mapped_gpus[k]);
                                table_row(&tb);
                                table_cell(&tb, AC_CLIENT, "%" PRIu64, a[i].client_id);
                                table_cell(&tb, AC_HANDLE, "0x%016" PRIx64, a[i].id);
                                table_cell(&tb, AC_KIND, "%s", kind_name(a[i].kind));
                                table_cell(&tb, AC_SIZE, "%s", human_bytes(a[i].size, b1, sizeof(b1)));
                                if (a[i].gpu_id)
                                        table_cell(&tb, AC_GPU, "%u", a[i].gpu_id);
                                if (a[i].va)
                                        table_cell(&tb, AC_VA, "0x%" PRIx64, a[i].va);
                                table_cell(&tb, AC_EXPORTS, "%u", a[i].exports);
                                table_cell(&tb, AC_MAPPED_ON, "%s", on);
                        }
                }
                gm_alloc_info_free(a, n);
        } while (cursor);
        if (ctl->json) {
                jprint(doc, JSON_C_TO_STRING_PLAIN);
                return EXIT_SUCCESS;
        }
        r = table_print(&tb);
        /* the count is for people: a script asked for the rows alone (-n) gets only them */
        if (!r && !ctl->noheadings && !ctl->raw)
                printf("%" PRIu64 " object%s\n", total, total == 1 ? "" : "s");
        return r;
}

enum {
        SC_NAME,
        SC_OWNER,
        SC_CLASS,
        SC_KIND,
        SC_SIZE,
        SC_ROLE,
        SC_READERS,
        SC_AGE,
        SC_PERSISTENT,
        SC_GPU,
        SC_VA,
        SC_OPENS,
        SC_PUBLISHED,
};
static const ColumnSpec share_columns[] = {
        [SC_NAME] = {"NAME", 0.3, SCOLS_FL_TRUNC, true},
        [SC_OWNER] = {"OWNER", 6, SCOLS_FL_RIGHT, true},
        [SC_CLASS] = {"CLASS", 0.1, SCOLS_FL_TRUNC, true},
        [SC_KIND] = {"KIND", 6, 0, true},
        [SC_SIZE] = {"SIZE", 10, SCOLS_FL_RIGHT, true},
        [SC_ROLE] = {"ROLE", 10, 0, true},
        [SC_READERS] = {"READERS", 7, SCOLS_FL_RIGHT, true},
        [SC_AGE] = {"AGE", 8, SCOLS_FL_RIGHT, true},
        [SC_PERSISTENT] = {"PERSISTENT", 3, 0, false},
        [SC_GPU] = {"GPU", 6, SCOLS_FL_RIGHT, false},
        [SC_VA] = {"VA", 18, 0, false},
        [SC_OPENS] = {"OPENS", 6, SCOLS_FL_RIGHT, false},
        [SC_PUBLISHED] = {"PUBLISHED", 20, 0, false},
};

/* "3d4h", "12m", "40s": how long ago @usec (CLOCK_REALTIME) was. */
static void fmt_age(uint64_t usec, char *buf, size_t len)
{
        struct timespec ts;
        uint64_t now, s;

        clock_gettime(CLOCK_REALTIME, &ts);
        now = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        s = now > usec ? (now - usec) / 1000000u : 0;
        if (s >= 86400)
                snprintf(buf, len, "%" PRIu64 "d%" PRIu64 "h", s / 86400, s % 86400 / 3600);
        else if (s >= 3600)
                snprintf(buf, len, "%" PRIu64 "h%" PRIu64 "m", s / 3600, s % 3600 / 60);
        else if (s >= 60)
                snprintf(buf, len, "%" PRIu64 "m", s / 60);
        else
                snprintf(buf, len, "%" PRIu64 "s", s);
}

static int shared_list(Ctl *ctl)
{
        gm_share_info *sh = NULL;
        size_t n = 0;
        Table tb;
        int r = gm_admin_shares(ctl->c, &sh, &n);

        if (r < 0)
                return fail(ctl, "shared", r);
        if (ctl->json) {
                json_object *o = jdoc(), *list = jarray(o, "shares");
                for (size_t i = 0; i < n; i++) {
                        json_object *j = json_object_new_object();
                        jstr(j, "name", sh[i].name);
                        ju64(j, "owner_client_id", sh[i].owner_client_id);
                        jstr(j, "class", sh[i].owner_class);
                        jstr(j, "kind", kind_name(sh[i].kind));
                        ju64(j, "size", sh[i].size);
                        ju64(j, "gpu_id", sh[i].gpu_id);
                        ju64(j, "va", (uint64_t)(uintptr_t)sh[i].ptr);
                        jstr(j, "role", sh[i].read_only ? "read-only" : "read-write");
                        jbool(j, "persistent", sh[i].persistent);
                        ju64(j, "readers", sh[i].readers);
                        ju64(j, "opens", sh[i].opens);
                        ju64(j, "published_usec", sh[i].published_usec);
                        json_object_array_add(list, j);
                }
                jprint(o, JSON_C_TO_STRING_PLAIN);
                free(sh);
                return EXIT_SUCCESS;
        }
        r = table_new(ctl, &tb, "shared", share_columns, ARRAY_SIZE(share_columns));
        if (r) {
                free(sh);
                return r;
        }
        for (size_t i = 0; i < n; i++) {
                char b[32], age[32], when[32];
                fmt_age(sh[i].published_usec, age, sizeof(age));
                fmt_time(sh[i].published_usec, when, sizeof(when));
                table_row(&tb);
                table_cell(&tb, SC_NAME, "%s", sh[i].name);
                if (sh[i].owner_client_id)
                        table_cell(&tb, SC_OWNER, "%" PRIu64, sh[i].owner_client_id);
                table_cell(&tb, SC_CLASS, "%s", sh[i].owner_class);
                table_cell(&tb, SC_KIND, "%s", kind_name(sh[i].kind));
                table_cell(&tb, SC_SIZE, "%s", human_bytes(sh[i].size, b, sizeof(b)));
                table_cell(&tb, SC_ROLE, "%s", sh[i].read_only ? "read-only" : "read-write");
                table_cell(&tb, SC_READERS, "%u", sh[i].readers);
                table_cell(&tb, SC_AGE, "%s", age);
                table_cell(&tb, SC_PERSISTENT, "%s", sh[i].persistent ? "yes" : "no");
                if (sh[i].gpu_id)
                        table_cell(&tb, SC_GPU, "%u", sh[i].gpu_id);
                table_cell(&tb, SC_VA, "%p", sh[i].ptr);
                table_cell(&tb, SC_OPENS, "%" PRIu64, sh[i].opens);
                table_cell(&tb, SC_PUBLISHED, "%s", when);
        }
        free(sh);
        return table_print(&tb);
}

static int cmd_shared(Ctl *ctl, int argc, char **argv)
{
        int r;

        if (argc == 1 || (argc == 2 && strcmp(argv[1], "list") == 0))
                return shared_list(ctl);
        if (argc != 3 || strcmp(argv[1], "revoke") != 0)
                return usage_error("usage: shared [list] | shared revoke NAME");
        r = gm_share_revoke(ctl->c, argv[2]);
        if (r < 0)
                return fail(ctl, "shared revoke", r);
        if (ctl->json) {
                json_object *o = jdoc();
                jstr(o, "revoked", argv[2]);
                jprint(o, JSON_C_TO_STRING_PLAIN);
        } else {
                printf("share '%s' revoked\n", argv[2]);
        }
        return EXIT_SUCCESS;
}

static const char *const resource_names[] = {
        [GM_RESOURCE_VRAM] = "vram",         [GM_RESOURCE_HOST] = "host",
        [GM_RESOURCE_MANAGED] = "managed",   [GM_RESOURCE_HANDLES] = "handles",
        [GM_RESOURCE_FDS] = "fds",           [GM_RESOURCE_CONNECTIONS] = "connections",
        [GM_RESOURCE_INFLIGHT] = "inflight", [GM_RESOURCE_WINDOWS] = "windows",
        [GM_RESOURCE_QUEUES] = "queues",
};

static bool resource_is_bytes(int r)
{
        return r == GM_RESOURCE_VRAM || r == GM_RESOURCE_HOST || r == GM_RESOURCE_MANAGED;
}

static int parse_limit(const char *s, bool bytes, uint64_t *ret)
{
        char *end;
        unsigned long long v;
        unsigned shift = 0;

        if (strcmp(s, "unlimited") == 0) {
                *ret = GM_UNLIMITED;
                return 0;
        }
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || end == s || *s == '-')
                return -EINVAL;
        if (*end && bytes) {
                const char *u = "KMGT";
                const char *p = strchr(u, toupper((unsigned char)*end));
                if (!p || !*end)
                        return -EINVAL;
                shift = 10 * (unsigned)(p - u + 1);
                end++;
                if (*end == 'i')
                        end++;
                if (*end == 'B')
                        end++;
        }
        if (*end || (shift && v > (UINT64_MAX >> shift)))
                return -EINVAL;
        *ret = (uint64_t)v << shift;
        return 0;
}

static const char *limit_text(uint64_t v, bool bytes, char *buf, size_t len)
{
        if (v == GM_UNLIMITED)
                return "unlimited";
        if (bytes)
                return human_bytes(v, buf, len);
        snprintf(buf, len, "%" PRIu64, v);
        return buf;
}

enum { QC_CLASS, QC_RESOURCE, QC_GPU, QC_USED, QC_LIMIT };
static const ColumnSpec quota_columns[] = {
        [QC_CLASS] = {"CLASS", 0.15, SCOLS_FL_TRUNC, true}, [QC_RESOURCE] = {"RESOURCE", 11, 0, true},
        [QC_GPU] = {"GPU", 6, SCOLS_FL_RIGHT, true},        [QC_USED] = {"USED", 10, SCOLS_FL_RIGHT, true},
        [QC_LIMIT] = {"LIMIT", 10, SCOLS_FL_RIGHT, true},
};

static int print_quotas(Ctl *ctl, const gm_quota *q, size_t n)
{
        Table tb;
        char b[32];
        int r = table_new(ctl, &tb, "quota show", quota_columns, ARRAY_SIZE(quota_columns));

        if (r)
                return r;
        for (size_t i = 0; i < n; i++) {
                bool bytes = resource_is_bytes(q[i].resource);
                /* per-GPU rows only where a per-GPU limit or use exists */
                if (q[i].gpu_id && q[i].limit == GM_UNLIMITED && q[i].used == 0)
                        continue;
                table_row(&tb);
                table_cell(&tb, QC_CLASS, "%s", q[i].class_name);
                table_cell(&tb, QC_RESOURCE, "%s",
                           q[i].resource > 0 && q[i].resource <= GM_RESOURCE_QUEUES
                                   ? resource_names[q[i].resource]
                                   : "unknown");
                if (q[i].gpu_id)
                        table_cell(&tb, QC_GPU, "%u", q[i].gpu_id);
                else
                        table_cell(&tb, QC_GPU, "all");
                table_cell(&tb, QC_USED, "%s", limit_text(q[i].used, bytes, b, sizeof(b)));
                table_cell(&tb, QC_LIMIT, "%s", limit_text(q[i].limit, bytes, b, sizeof(b)));
        }
        return table_print(&tb);
}

static int cmd_quota(Ctl *ctl, int argc, char **argv)
{
        int r;

        if (argc >= 2 && strcmp(argv[1], "show") == 0) {
                gm_quota *q = NULL;
                size_t n = 0;
                if (argc > 3) {
                        return usage_error("usage: quota show [CLASS]");
                }
                r = gm_admin_quota_get(ctl->c, argc == 3 ? argv[2] : NULL, &q, &n);
                if (r < 0)
                        return fail(ctl, "quota show", r);
                if (ctl->json) {
                        json_object *o = jdoc(), *list = jarray(o, "quotas");
                        for (size_t i = 0; i < n; i++) {
                                json_object *e = json_object_new_object();
                                jstr(e, "class", q[i].class_name);
                                jstr(e, "resource",
                                     q[i].resource > 0 && q[i].resource <= GM_RESOURCE_QUEUES
                                             ? resource_names[q[i].resource]
                                             : "unknown");
                                ju64(e, "gpu_id", q[i].gpu_id);
                                ju64(e, "used", q[i].used);
                                jlimit(e, "limit", q[i].limit);
                                json_object_array_add(list, e);
                        }
                        jprint(o, JSON_C_TO_STRING_PLAIN);
                } else {
                        r = print_quotas(ctl, q, n);
                        gm_quota_free(q, n);
                        return r;
                }
                gm_quota_free(q, n);
                return EXIT_SUCCESS;
        }
        if (argc >= 5 && strcmp(argv[1], "set") == 0) {
                const char *cls = argv[2];
                int res = 0;
                uint64_t limit = 0, gpu = 0;
                bool force = false;
                for (int i = 1; i <= GM_RESOURCE_QUEUES; i++)
                        if (strcmp(argv[3], resource_names[i]) == 0)
                                res = i;
                if (!res) {
                        return usage_error(
                                "quota set: unknown resource '%s' (vram, host, managed, handles, fds, "
                                "connections, inflight, windows, queues)",
                                argv[3]);
                }
                if (parse_limit(argv[4], resource_is_bytes(res), &limit) < 0) {
                        return usage_error("quota set: '%s' is not a limit (a number%s, or 'unlimited')",
                                           argv[4], resource_is_bytes(res) ? " with K, M, G or T" : "");
                }
                for (int i = 5; i < argc; i++) {
                        if (strcmp(argv[i], "--force") == 0) {
                                force = true;
                        } else if (strcmp(argv[i], "--gpu") == 0 && i + 1 < argc) {
                                if (parse_u64(argv[++i], &gpu) < 0 || gpu == 0 || gpu > UINT32_MAX) {
                                        return usage_error("quota set: '%s' is not a GPU id", argv[i]);
                                }
                        } else {
                                return usage_error("quota set: unknown argument '%s'", argv[i]);
                        }
                }
                r = gm_admin_quota_set(ctl->c, cls, res, (uint32_t)gpu, limit, force);
                if (r < 0)
                        return fail(ctl, "quota set", r);
                if (ctl->json) {
                        json_object *o = jdoc();
                        jstr(o, "class", cls);
                        jstr(o, "resource", resource_names[res]);
                        ju64(o, "gpu_id", gpu);
                        jlimit(o, "limit", limit);
                        jprint(o, JSON_C_TO_STRING_PLAIN);
                } else
                        printf("class %s: %s%s limit set\n", cls, resource_names[res], gpu ? " per-GPU" : "");
                return EXIT_SUCCESS;
        }
        return usage_error("usage: quota show [CLASS] | quota set CLASS RESOURCE LIMIT [--gpu ID] [--force]");
}

static const struct {
        const char *name;
        int (*fn)(Ctl *ctl, int argc, char **argv);
        const char *help;
        bool offline; /* runs without connecting to the daemon */
} commands[] = {
        {"status", cmd_status, "daemon version, backend, uptime, clients, totals"},
        {"topology", cmd_topology, "CPU and GPU nodes, memory, links [--properties]"},
        {"clients", cmd_clients, "connected clients: identity, class, container, usage"},
        {"allocations", cmd_allocations, "objects the clients hold [--client ID]"},
        {"quota", cmd_quota, "show [CLASS] | set CLASS RESOURCE LIMIT [--gpu ID] [--force]"},
        {"shared", cmd_shared, "named shares: name, owner, size, role, readers, age [list] | revoke NAME"},
        {"disconnect", cmd_disconnect, "disconnect a client and free what it held: disconnect ID"},
        {"metrics", cmd_metrics, "metrics in Prometheus text format"},
        {"log-level", cmd_log_level, "set the daemon's log level: log-level LEVEL"},
        {"ping", cmd_ping, "one round trip to the daemon"},
        {"cdi", cmd_cdi, "print a CDI spec giving containers the socket [--kind K] [--name N] [--rocm]",
         true},
};

static void usage(FILE *f)
{
        fprintf(f, "Usage: gpumemctl [OPTIONS] COMMAND [ARGS]\n\nCommands:\n");
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
        fprintf(f,
                "\nOptions:\n"
                "  -s, --socket PATH  the daemon's socket (default $GPUMEM_SOCKET or " GM_DEFAULT_SOCKET ")\n"
                "  -j, --json         machine-readable output (a stable JSON schema; errors too)\n"
                "  -o, --output LIST  the table's columns, comma-separated (\"+LIST\": the defaults and "
                "these);\n"
                "                     a wrong name lists the table's columns\n"
                "  -n, --noheadings   tables without their heading line\n"
                "  -r, --raw          tables unaligned, one space between columns\n"
                "  -b, --bytes        sizes in bytes in tables and status\n"
                "  -V, --version      gpumemctl's version\n"
                "  -h, --help         this help\n"
                "Options may stand anywhere on the line; \"--\" ends them.\n"
                "\nExit status: 0 done, 1 the daemon refused or failed, 2 bad command line, 3 no daemon\n"
                "reachable, 4 not allowed, 5 no such client, class or object.\n");
}

/*
 * The options that are gpumemctl's own, wherever they stand (before or after the command and its
 * arguments; "--" ends them): taken out of @argv, which keeps the rest in order. 0, 1 for --help or
 * --version (done), or EXIT_USAGE.
 */
static int global_options(Ctl *ctl, int *argc, char **argv)
{
        int n = 1;
        bool ended = false;

        for (int i = 1; i < *argc; i++) {
                const char *a = argv[i];

                if (ended) {
                        argv[n++] = argv[i];
                } else if (strcmp(a, "--") == 0) {
                        ended = true;
                } else if (strcmp(a, "-j") == 0 || strcmp(a, "--json") == 0) {
                        ctl->json = json_errors = true;
                } else if (strcmp(a, "-s") == 0 || strcmp(a, "--socket") == 0) {
                        if (i + 1 >= *argc)
                                return usage_error("%s needs a path", a);
                        ctl->socket = argv[++i];
                } else if (strncmp(a, "--socket=", 9) == 0) {
                        ctl->socket = a + 9;
                } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
                        if (i + 1 >= *argc || !argv[i + 1][0])
                                return usage_error("%s needs a list of columns", a);
                        ctl->columns = argv[++i];
                } else if (strncmp(a, "--output=", 9) == 0) {
                        ctl->columns = a + 9;
                } else if (strcmp(a, "-n") == 0 || strcmp(a, "--noheadings") == 0) {
                        ctl->noheadings = true;
                } else if (strcmp(a, "-r") == 0 || strcmp(a, "--raw") == 0) {
                        ctl->raw = true;
                } else if (strcmp(a, "-b") == 0 || strcmp(a, "--bytes") == 0) {
                        exact_bytes = true;
                } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                        usage(stdout);
                        return 1;
                } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
                        printf("gpumemctl %s\n", GPUMEMD_VERSION);
                        return 1;
                } else if (a[0] == '-' && a[1] && a[1] != '-' && a[2] &&
                           strspn(a + 1, "jnrb") == strlen(a + 1)) {
                        /* flags together, as in -nrb */
                        for (const char *f = a + 1; *f; f++) {
                                if (*f == 'j')
                                        ctl->json = json_errors = true;
                                else if (*f == 'n')
                                        ctl->noheadings = true;
                                else if (*f == 'r')
                                        ctl->raw = true;
                                else
                                        exact_bytes = true;
                        }
                } else if (n == 1 && a[0] == '-') {
                        return usage_error("unknown option '%s' (see --help)", a);
                } else {
                        argv[n++] = argv[i];
                }
        }
        *argc = n;
        argv[n] = NULL;
        return 0;
}

/*
 * Runs a command; with --json its output is kept until it is done, so that a failure prints the error
 * object alone rather than after half a document.
 */
static int run_command(Ctl *ctl, int (*fn)(Ctl *, int, char **), int argc, char **argv)
{
        char *data = NULL;
        size_t len = 0;
        FILE *out = stdout, *mem;
        int r;

        if (!ctl->json || !(mem = open_memstream(&data, &len)))
                return fn(ctl, argc, argv);
        stdout = mem;
        r = fn(ctl, argc, argv);
        stdout = out;
        fclose(mem);
        if (r == EXIT_SUCCESS)
                fwrite(data, 1, len, stdout);
        else
                json_error_flush();
        free(data);
        return r;
}

int main(int argc, char **argv)
{
        Ctl ctl = {0};
        char buf[512];
        int r;

        r = global_options(&ctl, &argc, argv);
        json_error_flush();
        if (r)
                return r == 1 ? EXIT_SUCCESS : r;
        if (argc < 2) {
                usage(stderr);
                return EXIT_USAGE;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
                if (strcmp(argv[1], commands[i].name) != 0)
                        continue;
                if (commands[i].offline)
                        return commands[i].fn(&ctl, argc - 1, argv + 1);
                const char *path = ctl.socket ? ctl.socket : getenv("GPUMEM_SOCKET");
                if (!path || !*path)
                        path = GM_DEFAULT_SOCKET;
                r = gm_client_open(path, "gpumemctl", &ctl.c, buf, sizeof(buf));
                if (r < 0) {
                        /* no daemon there; a socket this user may not use; or the daemon's refusal */
                        int status = r == -EACCES || r == -EPERM ? EXIT_DENIED
                                     : r == -ENOENT || r == -ECONNREFUSED || r == -ENOTSOCK ||
                                                     r == -ETIMEDOUT || r == -ECONNRESET || r == -EPIPE ||
                                                     r == -ENOTDIR
                                             ? EXIT_UNREACHABLE
                                             : EXIT_FAILED;
                        char what[PATH_MAX + 32];
                        snprintf(what, sizeof(what), "cannot connect to gpumemd at %s", path);
                        fprintf(stderr, "gpumemctl: %s: %s\n", what, buf);
                        if (json_errors)
                                json_error(r, what, buf, status);
                        json_error_flush();
                        return status;
                }
                r = run_command(&ctl, commands[i].fn, argc - 1, argv + 1);
                gm_client_close(ctl.c);
                return r;
        }
        r = usage_error("unknown command '%s' (see --help)", argv[1]);
        json_error_flush();
        return r;
}
