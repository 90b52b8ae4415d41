/* gpumemctl: the administrators' CLI for gpumemd (tables for people, stable JSON with --json). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem-client.h"

#define GPUMEMCTL_JSON_SCHEMA 1

typedef struct Ctl {
        gm_client *c;
        bool json;
        const char *socket;
} Ctl;

static void json_str(const char *s)
{
        putchar('"');
        for (; s && *s; s++) {
                unsigned char ch = (unsigned char)*s;
                switch (ch) {
                case '"':
                        fputs("\\\"", stdout);
                        break;
                case '\\':
                        fputs("\\\\", stdout);
                        break;
                case '\n':
                        fputs("\\n", stdout);
                        break;
                case '\t':
                        fputs("\\t", stdout);
                        break;
                default:
                        if (ch < 0x20)
                                printf("\\u%04x", ch);
                        else
                                putchar(ch);
                }
        }
        putchar('"');
}

static const char *human_bytes(uint64_t v, char *buf, size_t len)
{
        static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
        double d = (double)v;
        size_t u = 0;

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

static int fail(Ctl *ctl, const char *what, int err)
{
        char buf[512];
        fprintf(stderr, "gpumemctl: %s: %s\n", what, gm_strerror(ctl->c, err, buf, sizeof(buf)));
        return EXIT_FAILURE;
}

static int cmd_status(Ctl *ctl, int argc, char **argv)
{
        gm_status *s = NULL;
        char b1[32], b2[32], b3[32];
        int r;

        if (argc > 1) {
                fprintf(stderr, "gpumemctl: status takes no arguments\n");
                return EXIT_FAILURE;
        }
        r = gm_admin_status(ctl->c, &s);
        if (r < 0)
                return fail(ctl, "status", r);
        if (ctl->json) {
                printf("{\"schema\":%d,\"server_version\":", GPUMEMCTL_JSON_SCHEMA);
                json_str(s->server_version);
                printf(",\"protocol_version\":%u,\"backend\":", s->protocol_version);
                json_str(s->backend);
                printf(",\"preset\":");
                json_str(s->preset);
                printf(",\"kfd_version\":{\"major\":%u,\"minor\":%u}", s->kfd_major, s->kfd_minor);
                printf(",\"pid\":%u,\"uptime_usec\":%" PRIu64 ",\"started_usec\":%" PRIu64, s->pid,
                       s->uptime_usec, s->started_usec);
                printf(",\"clients\":%u,\"gpus\":%u,\"allocations\":%" PRIu64, s->clients, s->gpus,
                       s->allocations);
                printf(",\"bytes\":{\"device\":%" PRIu64 ",\"host\":%" PRIu64 ",\"managed\":%" PRIu64 "}",
                       s->bytes_device, s->bytes_host, s->bytes_managed);
                printf(",\"requests\":%" PRIu64 ",\"protocol_errors\":%" PRIu64 "}\n", s->requests,
                       s->protocol_errors);
        } else {
                printf("gpumemd %s (protocol %u), pid %u\n", s->server_version, s->protocol_version, s->pid);
                printf("  backend:   %s%s%s, KFD ABI %u.%u\n", s->backend, s->preset[0] ? ", preset " : "",
                       s->preset, s->kfd_major, s->kfd_minor);
                printf("  uptime:    %.1f s\n", (double)s->uptime_usec / 1e6);
                printf("  GPUs:      %u\n", s->gpus);
                printf("  clients:   %u\n", s->clients);
                printf("  requests:  %" PRIu64 " (%" PRIu64 " protocol errors)\n", s->requests,
                       s->protocol_errors);
                printf("  memory:    %" PRIu64 " allocations; device %s, host %s, managed %s\n",
                       s->allocations, human_bytes(s->bytes_device, b1, sizeof(b1)),
                       human_bytes(s->bytes_host, b2, sizeof(b2)),
                       human_bytes(s->bytes_managed, b3, sizeof(b3)));
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

static int cmd_topology(Ctl *ctl, int argc, char **argv)
{
        bool props = false;
        gm_topology *t = NULL;
        char b1[32], b2[32];
        int r;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--properties") == 0)
                        props = true;
                else {
                        fprintf(stderr, "gpumemctl: topology: unknown argument '%s'\n", argv[i]);
                        return EXIT_FAILURE;
                }
        }
        r = gm_topology_get(ctl->c, props, &t);
        if (r < 0)
                return fail(ctl, "topology", r);
        if (ctl->json) {
                printf("{\"schema\":%d,\"generation_id\":%" PRIu64 ",\"nodes\":[", GPUMEMCTL_JSON_SCHEMA,
                       t->generation_id);
                for (size_t i = 0; i < t->n_nodes; i++) {
                        const gm_topology_node *n = &t->nodes[i];
                        printf("%s{\"node_id\":%u,\"kind\":\"%s\",\"gpu_id\":%u,\"name\":", i ? "," : "",
                               n->node_id, n->is_gpu ? (n->cpu_cores ? "apu" : "gpu") : "cpu", n->gpu_id);
                        json_str(n->name);
                        printf(",\"cpu_cores\":%u,\"simd_count\":%u,\"vram_bytes\":%" PRIu64
                               ",\"system_mem_bytes\":%" PRIu64,
                               n->cpu_cores, n->simd_count, n->local_mem_size, n->system_mem_size);
                        printf(",\"gfx_target_version\":%u,\"vendor_id\":%u,\"device_id\":%u",
                               n->gfx_target_version, n->vendor_id, n->device_id);
                        printf(",\"pci_domain\":%u,\"pci_location\":%u,\"drm_render_minor\":%u",
                               n->pci_domain, n->pci_location, n->drm_render_minor);
                        printf(",\"hive_id\":%" PRIu64 ",\"numa_node\":%d,\"large_bar\":%s,\"capability\":%u",
                               n->hive_id, n->numa_node, n->large_bar ? "true" : "false", n->capability);
                        printf(",\"io_links\":[");
                        for (size_t k = 0; k < n->n_io_links; k++) {
                                const gm_io_link *l = &n->io_links[k];
                                char tb[16];
                                printf("%s{\"type\":\"%s\",\"from\":%u,\"to\":%u,\"weight\":%u,"
                                       "\"min_bandwidth\":%u,\"max_bandwidth\":%u}",
                                       k ? "," : "", link_type(l->type, tb, sizeof(tb)), l->node_from,
                                       l->node_to, l->weight, l->min_bandwidth, l->max_bandwidth);
                        }
                        printf("]");
                        if (props) {
                                printf(",\"properties\":{");
                                for (size_t k = 0; k < n->n_properties; k++) {
                                        printf("%s", k ? "," : "");
                                        json_str(n->properties[k].key);
                                        printf(":%" PRIu64, n->properties[k].value);
                                }
                                printf("}");
                        }
                        printf("}");
                }
                printf("]}\n");
        } else {
                printf("%-5s %-4s %-7s %-9s %-11s %-11s %-5s %-7s %s\n", "NODE", "KIND", "GPU_ID", "TARGET",
                       "VRAM", "SYSMEM", "NUMA", "RENDER", "LINKS");
                for (size_t i = 0; i < t->n_nodes; i++) {
                        const gm_topology_node *n = &t->nodes[i];
                        char gpu[16] = "-", numa[16] = "-", render[16] = "-", gfx[16], tb[16];
                        if (n->is_gpu) {
                                snprintf(gpu, sizeof(gpu), "%u", n->gpu_id);
                                snprintf(render, sizeof(render), "D%u", n->drm_render_minor);
                        }
                        if (n->numa_node >= 0)
                                snprintf(numa, sizeof(numa), "%d", n->numa_node);
                        printf("%-5u %-4s %-7s %-9s %-11s %-11s %-5s %-7s", n->node_id,
                               n->is_gpu ? (n->cpu_cores ? "APU" : "GPU") : "CPU", gpu,
                               gfx_name(n->gfx_target_version, gfx, sizeof(gfx)),
                               n->local_mem_size ? human_bytes(n->local_mem_size, b1, sizeof(b1)) : "-",
                               n->system_mem_size ? human_bytes(n->system_mem_size, b2, sizeof(b2)) : "-",
                               numa, render);
                        for (size_t k = 0; k < n->n_io_links; k++)
                                printf("%s%s->%u", k ? "," : "",
                                       link_type(n->io_links[k].type, tb, sizeof(tb)),
                                       n->io_links[k].node_to);
                        printf("\n");
                        for (size_t k = 0; props && k < n->n_properties; k++)
                                printf("        %-32s %" PRIu64 "\n", n->properties[k].key,
                                       n->properties[k].value);
                }
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

static int cmd_clients(Ctl *ctl, int argc, char **argv)
{
        gm_client_info *infos = NULL;
        size_t n = 0;
        char when[32];
        int r;

        if (argc > 1) {
                fprintf(stderr, "gpumemctl: clients takes no arguments\n");
                return EXIT_FAILURE;
        }
        r = gm_admin_clients(ctl->c, &infos, &n);
        if (r < 0)
                return fail(ctl, "clients", r);
        if (ctl->json) {
                printf("{\"schema\":%d,\"clients\":[", GPUMEMCTL_JSON_SCHEMA);
                for (size_t i = 0; i < n; i++) {
                        const gm_client_info *c = &infos[i];
                        printf("%s{\"id\":%" PRIu64 ",\"pid\":%u,\"uid\":%u,\"gid\":%u,\"name\":",
                               i ? "," : "", c->client_id, c->pid, c->uid, c->gid);
                        json_str(c->name);
                        printf(",\"cgroup\":");
                        json_str(c->cgroup);
                        printf(",\"container\":");
                        json_str(c->container);
                        printf(",\"class\":");
                        json_str(c->class_name);
                        printf(",\"admin\":%s,\"connected_usec\":%" PRIu64 ",\"requests\":%" PRIu64
                               ",\"handles\":%u,\"fds\":%u",
                               c->admin ? "true" : "false", c->connected_usec, c->requests, c->handles,
                               c->fds);
                        printf(",\"host_bytes\":%" PRIu64 ",\"managed_bytes\":%" PRIu64 ",\"vram\":[",
                               c->host_bytes, c->managed_bytes);
                        for (size_t k = 0; k < c->n_usage; k++)
                                printf("%s{\"gpu_id\":%u,\"bytes\":%" PRIu64 "}", k ? "," : "",
                                       c->usage[k].gpu_id, c->usage[k].vram_bytes);
                        printf("]}");
                }
                printf("]}\n");
        } else {
                printf("%-6s %-8s %-6s %-16s %-20s %-9s %s\n", "ID", "PID", "UID", "NAME", "CONNECTED",
                       "REQUESTS", "CGROUP");
                for (size_t i = 0; i < n; i++) {
                        const gm_client_info *c = &infos[i];
                        fmt_time(c->connected_usec, when, sizeof(when));
                        printf("%-6" PRIu64 " %-8u %-6u %-16.16s %-20s %-9" PRIu64 " %s\n", c->client_id,
                               c->pid, c->uid, c->name[0] ? c->name : "-", when, c->requests,
                               c->cgroup[0] ? c->cgroup : "-");
                }
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
                fprintf(stderr, "gpumemctl: usage: disconnect CLIENT_ID\n");
                return EXIT_FAILURE;
        }
        errno = 0;
        id = strtoull(argv[1], &end, 10);
        if (errno || *end || !argv[1][0]) {
                fprintf(stderr, "gpumemctl: disconnect: '%s' is not a client id\n", argv[1]);
                return EXIT_FAILURE;
        }
        r = gm_admin_disconnect(ctl->c, id);
        if (r < 0)
                return fail(ctl, "disconnect", r);
        if (ctl->json)
                printf("{\"schema\":%d,\"disconnected\":%llu}\n", GPUMEMCTL_JSON_SCHEMA, id);
        else
                printf("client %llu disconnected\n", id);
        return EXIT_SUCCESS;
}

static int cmd_metrics(Ctl *ctl, int argc, char **argv)
{
        char *text = NULL;
        int r;

        if (argc > 1) {
                fprintf(stderr, "gpumemctl: metrics takes no arguments\n");
                return EXIT_FAILURE;
        }
        r = gm_admin_metrics(ctl->c, &text);
        if (r < 0)
                return fail(ctl, "metrics", r);
        if (ctl->json) {
                printf("{\"schema\":%d,\"prometheus\":", GPUMEMCTL_JSON_SCHEMA);
                json_str(text);
                printf("}\n");
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
                fprintf(stderr, "gpumemctl: usage: log-level err|warning|notice|info|debug\n");
                return EXIT_FAILURE;
        }
        r = gm_admin_set_log_level(ctl->c, argv[1]);
        if (r < 0)
                return fail(ctl, "log-level", r);
        if (ctl->json)
                printf("{\"schema\":%d,\"log_level\":\"%s\"}\n", GPUMEMCTL_JSON_SCHEMA, argv[1]);
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
        if (ctl->json)
                printf("{\"schema\":%d,\"round_trip_usec\":%.1f}\n", GPUMEMCTL_JSON_SCHEMA, us);
        else
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

/*
 * A Container Device Interface spec for the socket: the container gets a bind mount of the socket and
 * GPUMEM_SOCKET, and no device node, since gpumemd alone opens /dev/kfd. Version 0.5.0 of the CDI spec
 * covers everything used here (mount type and options), so older runtimes accept it too.
 */
static int cmd_cdi(Ctl *ctl, int argc, char **argv)
{
        const char *kind = "gpumem.io/socket", *name = "default";
        const char *host = ctl->socket ? ctl->socket : GM_DEFAULT_SOCKET, *inside = NULL;
        char env[160];

        for (int i = 1; i < argc; i++) {
                static const char *const opts[] = {"--kind", "--name", "--socket-path", "--container-path"};
                const char **dst[] = {&kind, &name, &host, &inside};
                size_t k, len = 0;

                for (k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
                        len = strlen(opts[k]);
                        if (strncmp(argv[i], opts[k], len) == 0 &&
                            (argv[i][len] == '\0' || argv[i][len] == '='))
                                break;
                }
                if (k == sizeof(opts) / sizeof(opts[0])) {
                        fprintf(stderr, "gpumemctl: cdi: unknown argument '%s'\n", argv[i]);
                        return EXIT_FAILURE;
                }
                if (argv[i][len] == '=')
                        *dst[k] = argv[i] + len + 1;
                else if (i + 1 < argc)
                        *dst[k] = argv[++i];
                else {
                        fprintf(stderr, "gpumemctl: cdi: %s needs a value\n", opts[k]);
                        return EXIT_FAILURE;
                }
        }
        if (!inside)
                inside = host;
        if (!cdi_kind_ok(kind)) {
                fprintf(stderr, "gpumemctl: cdi: '%s' is not a CDI kind (vendor.example/class)\n", kind);
                return EXIT_FAILURE;
        }
        if (!cdi_name_ok(name, 63, "-_.:")) {
                fprintf(stderr, "gpumemctl: cdi: '%s' is not a CDI device name\n", name);
                return EXIT_FAILURE;
        }
        if (!cdi_path_ok(host) || !cdi_path_ok(inside)) {
                fprintf(stderr, "gpumemctl: cdi: socket paths must be absolute, shorter than 108 bytes and "
                                "free of control characters and '='\n");
                return EXIT_FAILURE;
        }
        printf("{\n  \"cdiVersion\": \"0.5.0\",\n  \"kind\": ");
        json_str(kind);
        printf(",\n  \"devices\": [\n    {\n      \"name\": ");
        json_str(name);
        printf(",\n      \"containerEdits\": {\n        \"env\": [");
        snprintf(env, sizeof(env), "GPUMEM_SOCKET=%s", inside);
        json_str(env);
        printf("],\n        \"mounts\": [\n          {\n            \"hostPath\": ");
        json_str(host);
        printf(",\n            \"containerPath\": ");
        json_str(inside);
        printf(",\n            \"type\": \"bind\",\n"
               "            \"options\": [\"bind\", \"nosuid\", \"nodev\", \"noexec\"]\n"
               "          }\n        ]\n      }\n    }\n  ]\n}\n");
        return EXIT_SUCCESS;
}

static const struct {
        const char *name;
        int (*fn)(Ctl *ctl, int argc, char **argv);
        const char *help;
        bool offline; /* runs without connecting to the daemon */
} commands[] = {
        {"status", cmd_status, "daemon version, backend, uptime, clients, totals"},
        {"topology", cmd_topology, "CPU and GPU nodes, memory, links [--properties]"},
        {"clients", cmd_clients, "connected clients and their identities"},
        {"disconnect", cmd_disconnect, "disconnect a client and free what it held: disconnect ID"},
        {"metrics", cmd_metrics, "metrics in Prometheus text format"},
        {"log-level", cmd_log_level, "set the daemon's log level: log-level LEVEL"},
        {"ping", cmd_ping, "one round trip to the daemon"},
        {"cdi", cmd_cdi, "print a CDI spec giving containers the socket [--kind K] [--name N]", true},
};

static void usage(FILE *f)
{
        fprintf(f, "Usage: gpumemctl [--socket PATH] [--json] COMMAND [ARGS]\n\nCommands:\n");
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
        fprintf(f,
                "\nOptions:\n"
                "  -s, --socket PATH  the daemon's socket (default $GPUMEM_SOCKET or " GM_DEFAULT_SOCKET ")\n"
                "  -j, --json         machine-readable output (a stable JSON schema)\n"
                "  -h, --help         this help\n");
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                {"socket", required_argument, NULL, 's'},
                {"json", no_argument, NULL, 'j'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        Ctl ctl = {0};
        char buf[512];
        int c, r;

        while ((c = getopt_long(argc, argv, "+s:jh", longopts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        ctl.socket = optarg;
                        break;
                case 'j':
                        ctl.json = true;
                        break;
                case 'h':
                        usage(stdout);
                        return EXIT_SUCCESS;
                default:
                        usage(stderr);
                        return EXIT_FAILURE;
                }
        }
        if (optind >= argc) {
                usage(stderr);
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
                if (strcmp(argv[optind], commands[i].name) != 0)
                        continue;
                if (commands[i].offline)
                        return commands[i].fn(&ctl, argc - optind, argv + optind);
                const char *path = ctl.socket ? ctl.socket : getenv("GPUMEM_SOCKET");
                if (!path || !*path)
                        path = GM_DEFAULT_SOCKET;
                r = gm_client_connect(path, "gpumemctl", &ctl.c);
                if (r < 0) {
                        fprintf(stderr, "gpumemctl: cannot connect to gpumemd at %s: %s\n", path,
                                gm_strerror(NULL, r, buf, sizeof(buf)));
                        return EXIT_FAILURE;
                }
                r = commands[i].fn(&ctl, argc - optind, argv + optind);
                gm_client_close(ctl.c);
                return r;
        }
        fprintf(stderr, "gpumemctl: unknown command '%s' (see --help)\n", argv[optind]);
        return EXIT_FAILURE;
}
