/* The Prometheus text exposition of the daemon's state and counters, and its optional HTTP listener. */
#include "exposition.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/resource.h>

#include "broker/broker.h"
#include "server/classes.h"
#include "server/conn.h"
#include "base/log.h"
#include "server/core.h"
#include "base/metrics.h"
#include "config.h"
#include "frame.h"
#include "config/policy.h"
#include "topology.h"

static void limit_value(FILE *f, uint64_t v)
{
        if (v == UINT64_MAX)
                fputs("+Inf\n", f);
        else
                fprintf(f, "%llu\n", (unsigned long long)v);
}

/* A label value as the text format wants it: backslash, double quote and newline escaped. Client names
 * and class names come from clients and from the configuration, so nothing may pass through raw. */
static void label_value(FILE *f, const char *v)
{
        for (; v && *v; v++) {
                if (*v == '\\')
                        fputs("\\\\", f);
                else if (*v == '"')
                        fputs("\\\"", f);
                else if (*v == '\n')
                        fputs("\\n", f);
                else
                        fputc(*v, f);
        }
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The labels that name a GPU, the same on every per-GPU series: KFD's gpu id (what gpumemctl, the client
 * library and KFD's sysfs call it), its PCI address and KFD's unique id (what other exporters can be joined
 * on). */
static void gpu_labels(FILE *f, const Manager *m, uint32_t gpu_id)
{
        const ThunkNode *n = thunk_topology_gpu_by_id(driver_topology(m->drv), gpu_id);

        fprintf(f, "kfd_gpu_id=\"%u\"", gpu_id);
        if (!n)
                return;
        fprintf(f, ",pci_address=\"%04x:%02x:%02x.%x\",unique_id=\"0x%016llx\"", n->domain,
                n->location_id >> 8, (n->location_id >> 3) & 0x1f, n->location_id & 7,
                (unsigned long long)n->unique_id);
}

/* One per-GPU family: @v[g] for each GPU g (in broker order) that @have[g] (NULL: every GPU). */
static void gpu_family(FILE *f, const Manager *m, const char *name, const char *help, const uint64_t *v,
                       const bool *have)
{
        family(f, name, "gauge", help);
        for (size_t g = 0; g < broker_gpu_count(m->broker); g++) {
                if (have && !have[g])
                        continue;
                fprintf(f, "%s{", name);
                gpu_labels(f, m, broker_gpu_id(m->broker, g));
                fprintf(f, "} %llu\n", (unsigned long long)v[g]);
        }
}

static void render_gpus(FILE *f, Manager *m, const BrokerUsage *tot)
{
        uint64_t total[BROKER_MAX_GPUS], avail[BROKER_MAX_GPUS];
        bool has_avail[BROKER_MAX_GPUS];

        for (size_t g = 0; g < broker_gpu_count(m->broker); g++) {
                DriverGpu d = {0};
                (void)driver_gpu(m->drv, g, &d);
                total[g] = d.vram_bytes;
                avail[g] = 0;
                has_avail[g] = driver_available_memory(m->drv, driver_ctx_primary(m->drv),
                                                       broker_gpu_id(m->broker, g), &avail[g]) >= 0;
        }
        gpu_family(f, m, "gpumemd_gpu_vram_total_bytes", "The GPU's own memory (VRAM), in bytes.", total,
                   NULL);
        gpu_family(f, m, "gpumemd_gpu_vram_used_bytes", "VRAM gpumemd's clients hold on the GPU, in bytes.",
                   tot->vram_bytes, NULL);
        /* The driver's answer, which also counts what other users of the GPU (and the driver) hold: free is
         * not total less used. A GPU whose driver cannot say has no series. */
        gpu_family(f, m, "gpumemd_gpu_vram_free_bytes",
                   "VRAM the driver can still allocate on the GPU, in bytes (other users included).", avail,
                   has_avail);
}

/* One family per limited resource, its unit in the name: the use as gpumemd_class_NAME[_bytes], the limit as
 * gpumemd_class_NAME_limit[_bytes] (+Inf: none). */
static const struct {
        const char *name, *unit, *use, *limit;
} class_res[_POLICY_RES_MAX] = {
        [POLICY_RES_VRAM] = {"vram", "_bytes",
                             "Device memory and VMM handles a class holds on every GPU, in bytes.",
                             "A class's limit on device memory and VMM handles, in bytes (+Inf: none)."},
        [POLICY_RES_HOST] = {"host", "_bytes", "Pinned host memory a class holds, in bytes.",
                             "A class's limit on pinned host memory, in bytes (+Inf: none)."},
        [POLICY_RES_MANAGED] = {"managed", "_bytes", "Managed memory a class holds, in bytes.",
                                "A class's limit on managed memory, in bytes (+Inf: none)."},
        [POLICY_RES_HANDLES] = {"handles", "",
                                "Objects a class holds (allocations, VMM handles, imports, reservations).",
                                "A class's limit on objects (+Inf: none)."},
        [POLICY_RES_FDS] = {"fds", "", "File descriptors the daemon holds for a class.",
                            "A class's limit on the file descriptors the daemon holds for it (+Inf: none)."},
        [POLICY_RES_CONNECTIONS] = {"connections", "", "A class's connections.",
                                    "A class's limit on connections at once (+Inf: none)."},
        [POLICY_RES_INFLIGHT] = {"inflight_requests", "",
                                 "Requests of a class in flight, all its connections.",
                                 "Requests one connection of a class may have in flight."},
        [POLICY_RES_WINDOWS] = {"windows", "", "VA windows a class holds, current and refused ones.",
                                "A class's limit on VA windows (+Inf: none)."},
        [POLICY_RES_QUEUES] = {"queues", "", "User-mode queues the daemon runs for a class.",
                               "A class's limit on user-mode queues (+Inf: none)."},
        [POLICY_RES_MAPPINGS] =
                {"mappings", "",
                 "Entries of the daemon's memory map a class's objects cost (vm.max_map_count).",
                 "A class's limit on the daemon's mappings (+Inf: none)."},
        [POLICY_RES_SHARES] = {"shares", "", "Named shares a class has published.",
                               "A class's limit on named shares (+Inf: none)."},
};

/* The kinds of memory, in the order of the values the two memory families list. */
static const char *const memory_kinds[] = {"device", "vmm", "host", "managed"};

static void render_classes(FILE *f, Manager *m)
{
        char name[96];

        family(f, "gpumemd_class_memory_bytes", "gauge", "Memory a class holds, by kind, in bytes.");
        for (ClassState *s = m->classes; s; s = s->next) {
                BrokerUsage u;
                broker_account_usage(&s->acct, &u);
                uint64_t vals[] = {u.device_bytes, u.vmm_bytes, u.host_bytes, u.managed_bytes};
                for (size_t k = 0; k < ARRAY_SIZE(vals); k++) {
                        fputs("gpumemd_class_memory_bytes{class=\"", f);
                        label_value(f, s->name);
                        fprintf(f, "\",kind=\"%s\"} %llu\n", memory_kinds[k], (unsigned long long)vals[k]);
                }
        }
        family(f, "gpumemd_class_gpu_vram_bytes", "gauge", "VRAM a class holds on each GPU, in bytes.");
        for (ClassState *s = m->classes; s; s = s->next) {
                BrokerUsage u;
                broker_account_usage(&s->acct, &u);
                for (size_t g = 0; g < broker_gpu_count(m->broker); g++) {
                        fputs("gpumemd_class_gpu_vram_bytes{class=\"", f);
                        label_value(f, s->name);
                        fputs("\",", f);
                        gpu_labels(f, m, broker_gpu_id(m->broker, g));
                        fprintf(f, "} %llu\n", (unsigned long long)u.vram_bytes[g]);
                }
        }
        for (int r = 0; r < _POLICY_RES_MAX; r++) {
                for (int lim = 0; lim < 2; lim++) {
                        snprintf(name, sizeof(name), "gpumemd_class_%s%s%s", class_res[r].name,
                                 lim ? "_limit" : "", class_res[r].unit);
                        family(f, name, "gauge", lim ? class_res[r].limit : class_res[r].use);
                        for (ClassState *s = m->classes; s; s = s->next) {
                                uint64_t used, limit;
                                classes_get(m, s, (PolicyResource)r, 0, &used, &limit);
                                fprintf(f, "%s{class=\"", name);
                                label_value(f, s->name);
                                fputs("\"} ", f);
                                if (lim)
                                        limit_value(f, limit);
                                else
                                        fprintf(f, "%llu\n", (unsigned long long)used);
                        }
                }
        }
        family(f, "gpumemd_class_denials_total", "counter", "Requests and connections of a class refused.");
        for (ClassState *s = m->classes; s; s = s->next) {
                fputs("gpumemd_class_denials_total{class=\"", f);
                label_value(f, s->name);
                fprintf(f, "\"} %llu\n", (unsigned long long)READ_ONCE(s->denials));
        }
}

typedef struct ClientRow {
        const Conn *c;
        BrokerUsage u;
} ClientRow;

/* The labels of a client's series: its id (unique for the daemon's life), what it called itself, its class,
 * uid and pid, and the container and pod its cgroup path names ("" when none). */
static void client_labels(FILE *f, const Conn *c)
{
        fprintf(f, "client=\"%llu\",name=\"", (unsigned long long)c->id);
        label_value(f, c->name);
        fputs("\",class=\"", f);
        label_value(f, c->cls ? c->cls->name : "");
        fprintf(f, "\",uid=\"%u\",pid=\"%d\",container=\"", (unsigned)c->ident.uid, (int)c->ident.pid);
        label_value(f, c->container);
        fputs("\",pod_uid=\"", f);
        label_value(f, c->pod);
        fputc('"', f);
}

/* Per client: the memory it holds by kind, per GPU, and its handles and fds. Clients with no memory op yet
 * (no books) have no series; administrators' sessions (gpumemctl) have none either. */
static int render_clients(FILE *f, Manager *m)
{
        _cleanup_free_ ClientRow *rows = calloc(m->n_conns ? m->n_conns : 1, sizeof(*rows));
        size_t n = 0;

        if (!rows)
                return -ENOMEM;
        for (Conn *c = m->conns; c && n < m->n_conns; c = c->next) {
                bool has_books;
                conn_lock(c); /* its loop may be changing its books meanwhile */
                has_books = c->broker != NULL;
                if (has_books)
                        broker_client_usage(c->broker, &rows[n].u);
                conn_unlock(c);
                if (has_books)
                        rows[n++].c = c;
        }
        family(f, "gpumemd_client_memory_bytes", "gauge", "Memory a client holds, by kind, in bytes.");
        for (size_t i = 0; i < n; i++) {
                const BrokerUsage *u = &rows[i].u;
                uint64_t vals[] = {u->device_bytes, u->vmm_bytes, u->host_bytes, u->managed_bytes};
                for (size_t k = 0; k < ARRAY_SIZE(vals); k++) {
                        fputs("gpumemd_client_memory_bytes{", f);
                        client_labels(f, rows[i].c);
                        fprintf(f, ",kind=\"%s\"} %llu\n", memory_kinds[k], (unsigned long long)vals[k]);
                }
        }
        family(f, "gpumemd_client_gpu_vram_bytes", "gauge",
               "VRAM a client holds on a GPU, in bytes (GPUs it holds none on have no series).");
        for (size_t i = 0; i < n; i++)
                for (uint32_t g = 0; g < rows[i].u.n_gpus; g++) {
                        if (!rows[i].u.vram_bytes[g])
                                continue;
                        fputs("gpumemd_client_gpu_vram_bytes{", f);
                        client_labels(f, rows[i].c);
                        fputc(',', f);
                        gpu_labels(f, m, rows[i].u.gpu_ids[g]);
                        fprintf(f, "} %llu\n", (unsigned long long)rows[i].u.vram_bytes[g]);
                }
        family(f, "gpumemd_client_handles", "gauge", "Objects a client holds (its handles).");
        for (size_t i = 0; i < n; i++) {
                fputs("gpumemd_client_handles{", f);
                client_labels(f, rows[i].c);
                fprintf(f, "} %llu\n", (unsigned long long)rows[i].u.objects);
        }
        family(f, "gpumemd_client_fds", "gauge", "File descriptors the daemon holds for a client.");
        for (size_t i = 0; i < n; i++) {
                fputs("gpumemd_client_fds{", f);
                client_labels(f, rows[i].c);
                fprintf(f, "} %u\n", rows[i].u.held_fds);
        }
        return 0;
}

/* The daemon's own process, under the names Prometheus's client libraries give these. */
/* Per named share: its size, readers and opens, labelled with its name, class and role. */
static int render_shares(FILE *f, Manager *m)
{
        static const struct {
                const char *name, *type, *help;
        } fam[] = {
                {"gpumemd_share_bytes", "gauge", "Memory a named share holds, in bytes (its class pays)."},
                {"gpumemd_share_readers", "gauge", "Clients that have a named share open."},
                {"gpumemd_share_opens_total", "counter", "Opens of a named share since it was published."},
        };
        BrokerShareInfo *sh = calloc(BROKER_MAX_SHARES, sizeof(*sh));
        size_t cursor = 0, n;

        if (!sh)
                return -ENOMEM;
        n = broker_share_list(m->broker, &cursor, sh, BROKER_MAX_SHARES);
        for (size_t k = 0; k < ARRAY_SIZE(fam); k++) {
                family(f, fam[k].name, fam[k].type, fam[k].help);
                for (size_t i = 0; i < n; i++) {
                        fprintf(f, "%s{share=\"", fam[k].name);
                        label_value(f, sh[i].name);
                        fputs("\",class=\"", f);
                        label_value(f, sh[i].class_name);
                        fprintf(f, "\",role=\"%s\",persistent=\"%s\"} %llu\n",
                                sh[i].read_only ? "read-only" : "read-write", sh[i].persistent ? "yes" : "no",
                                (unsigned long long)(k == 0   ? sh[i].size
                                                     : k == 1 ? sh[i].readers
                                                              : sh[i].opens));
                }
        }
        free(sh);
        return 0;
}

static void render_process(FILE *f)
{
        char buf[1024], *p;
        unsigned long long utime = 0, stime = 0, start = 0, vsize = 0, btime = 0;
        long long rss = 0, threads = 0;
        long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
        struct rlimit rl;
        size_t n;
        FILE *in;
        DIR *d;

        in = fopen("/proc/self/stat", "re");
        if (in) {
                n = fread(buf, 1, sizeof(buf) - 1, in);
                buf[n] = 0;
                fclose(in);
                /* fields after the command name, which may hold spaces and parentheses: from field 3 on */
                p = strrchr(buf, ')');
                if (!p ||
                    sscanf(p + 2,
                           "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %lld %*d "
                           "%llu %llu %lld",
                           &utime, &stime, &threads, &start, &vsize, &rss) != 6)
                        utime = stime = start = vsize = 0, rss = threads = 0;
        }
        in = fopen("/proc/stat", "re");
        if (in) {
                while (fgets(buf, sizeof(buf), in))
                        if (sscanf(buf, "btime %llu", &btime) == 1)
                                break;
                fclose(in);
        }
        family(f, "process_cpu_seconds_total", "counter",
               "CPU time of the daemon, user and system, in seconds.");
        fprintf(f, "process_cpu_seconds_total %.2f\n",
                tick > 0 ? (double)(utime + stime) / (double)tick : 0.0);
        family(f, "process_resident_memory_bytes", "gauge", "Resident memory of the daemon, in bytes.");
        fprintf(f, "process_resident_memory_bytes %lld\n", rss * page);
        family(f, "process_virtual_memory_bytes", "gauge", "Virtual memory of the daemon, in bytes.");
        fprintf(f, "process_virtual_memory_bytes %llu\n", vsize);
        family(f, "process_threads", "gauge", "Threads of the daemon.");
        fprintf(f, "process_threads %lld\n", threads);
        if (btime && tick > 0) {
                family(f, "process_start_time_seconds", "gauge",
                       "When the daemon started, in seconds since the epoch.");
                fprintf(f, "process_start_time_seconds %.2f\n", (double)btime + (double)start / (double)tick);
        }
        d = opendir("/proc/self/fd");
        if (d) {
                const struct dirent *e;
                long long fds = -1; /* the directory's own fd, open only while counting, is not one */
                while ((e = readdir(d)))
                        if (e->d_name[0] != '.')
                                fds++;
                closedir(d);
                family(f, "process_open_fds", "gauge", "Open file descriptors of the daemon.");
                fprintf(f, "process_open_fds %lld\n", fds);
        }
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
                family(f, "process_max_fds", "gauge", "The daemon's limit on open file descriptors.");
                fprintf(f, "process_max_fds ");
                limit_value(f, rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur);
        }
}

int metrics_render(Manager *m, char **ret, size_t *ret_len)
{
        _cleanup_free_ Metrics *mt = calloc(1, sizeof(*mt));
        char *text = NULL;
        size_t len = 0;
        FILE *f;
        BrokerUsage tot;
        ManagerStats st;

        if (!mt)
                return -ENOMEM;
        for (unsigned i = 0; i < m->n_shards; i++)
                metrics_add(mt, m->shards[i].metrics);
        manager_stats(m, &st);
        f = open_memstream(&text, &len);
        if (!f)
                return -ENOMEM;
        broker_totals(m->broker, &tot);
        fprintf(f,
                "# HELP gpumemd_up Whether gpumemd is serving.\n# TYPE gpumemd_up gauge\n"
                "gpumemd_up{backend=\"%s\"} 1\n"
                "# HELP gpumemd_build_info The daemon's version and protocol; always 1.\n"
                "# TYPE gpumemd_build_info gauge\n"
                "gpumemd_build_info{version=\"%s\",protocol=\"%u\",backend=\"%s\"} 1\n"
                "# HELP gpumemd_uptime_seconds Seconds since gpumemd started.\n# TYPE gpumemd_uptime_seconds "
                "gauge\n"
                "gpumemd_uptime_seconds %.3f\n"
                "# HELP gpumemd_connections Connected clients.\n# TYPE gpumemd_connections gauge\n"
                "gpumemd_connections %u\n"
                "# HELP gpumemd_connections_total Connections accepted since start.\n"
                "# TYPE gpumemd_connections_total counter\ngpumemd_connections_total %llu\n"
                "# HELP gpumemd_connections_refused_total Connections refused (caps, no class).\n"
                "# TYPE gpumemd_connections_refused_total counter\ngpumemd_connections_refused_total %llu\n"
                "# HELP gpumemd_requests_total Requests handled since start.\n"
                "# TYPE gpumemd_requests_total counter\ngpumemd_requests_total %llu\n"
                "# HELP gpumemd_protocol_errors_total Malformed frames and protocol violations.\n"
                "# TYPE gpumemd_protocol_errors_total counter\ngpumemd_protocol_errors_total %llu\n"
                "# HELP gpumemd_clients_stalled_total Clients dropped for leaving replies unread "
                "send-timeout seconds.\n"
                "# TYPE gpumemd_clients_stalled_total counter\ngpumemd_clients_stalled_total %llu\n",
                driver_name(m->drv), GPUMEMD_VERSION, GM_PROTOCOL_VERSION, driver_name(m->drv),
                (double)(now_usec(CLOCK_MONOTONIC) - m->started_mono_usec) / 1e6, m->n_conns,
                (unsigned long long)st.connections_total, (unsigned long long)st.connections_refused,
                (unsigned long long)st.requests, (unsigned long long)st.protocol_errors,
                (unsigned long long)st.stalled_drops);

        fputs("# HELP gpumemd_denials_total Requests and connections refused, by reason.\n"
              "# TYPE gpumemd_denials_total counter\n",
              f);
        for (int i = 0; i < _DENY_MAX; i++)
                fprintf(f, "gpumemd_denials_total{reason=\"%s\"} %llu\n", metrics_deny_names[i],
                        (unsigned long long)mt->denials[i]);

        fputs("# HELP gpumemd_operations_total Operations handled, by op and result.\n"
              "# TYPE gpumemd_operations_total counter\n",
              f);
        for (int op = 0; op < METRICS_MAX_OPS; op++) {
                const OpStats *s = &mt->ops[op];
                if (!s->count)
                        continue;
                fprintf(f, "gpumemd_operations_total{op=\"%s\",result=\"ok\"} %llu\n", mt->op_names[op],
                        (unsigned long long)s->ok);
                for (int e = 1; e < METRICS_MAX_ERRNO; e++) {
                        const char *en;
                        if (!s->by_errno[e])
                                continue;
                        en = strerrorname_np(e);
                        fprintf(f, "gpumemd_operations_total{op=\"%s\",result=\"%s\"} %u\n", mt->op_names[op],
                                en ? en : "unknown", s->by_errno[e]);
                }
        }
        fputs("# HELP gpumemd_operation_duration_seconds Time to handle an operation in the daemon.\n"
              "# TYPE gpumemd_operation_duration_seconds histogram\n",
              f);
        for (int op = 0; op < METRICS_MAX_OPS; op++) {
                const OpStats *s = &mt->ops[op];
                uint64_t cum = 0;
                if (!s->count)
                        continue;
                for (int i = 0; i < METRICS_N_BUCKETS; i++) {
                        cum += s->buckets[i];
                        fprintf(f, "gpumemd_operation_duration_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n",
                                mt->op_names[op], (double)metrics_bucket_ns[i] / 1e9,
                                (unsigned long long)cum);
                }
                fprintf(f, "gpumemd_operation_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n",
                        mt->op_names[op], (unsigned long long)s->count);
                fprintf(f, "gpumemd_operation_duration_seconds_sum{op=\"%s\"} %.9f\n", mt->op_names[op],
                        (double)s->sum_ns / 1e9);
                fprintf(f, "gpumemd_operation_duration_seconds_count{op=\"%s\"} %llu\n", mt->op_names[op],
                        (unsigned long long)s->count);
        }

        render_gpus(f, m, &tot);
        render_classes(f, m);
        int clients = render_clients(f, m); /* the parts with an allocation of their own */
        int shares = render_shares(f, m);
        render_process(f);
        if (fclose(f) != 0 || !text || clients < 0 || shares < 0) {
                free(text);
                return -ENOMEM;
        }
        *ret = text;
        *ret_len = len;
        return 0;
}

static void on_http(struct evhttp_request *req, void *userdata)
{
        Manager *m = userdata;
        struct evbuffer *buf;
        char *text = NULL;
        size_t len = 0;
        int r;

        if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
                evhttp_send_error(req, 405, "only GET");
                return;
        }
        manager_lock(m);
        r = metrics_render(m, &text, &len);
        manager_unlock(m);
        if (r < 0 || !(buf = evbuffer_new())) {
                free(text);
                evhttp_send_error(req, 500, "out of memory");
                return;
        }
        evbuffer_add(buf, text, len);
        free(text);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "text/plain; version=0.0.4; charset=utf-8");
        evhttp_send_reply(req, 200, "OK", buf);
        evbuffer_free(buf);
}

/*
 * The HTTP listener shares the event loop and the fd table with the Unix socket, so a peer that can reach the
 * port must be able to hold neither. These bound what it can take.
 */
/* HTTP connections at once; each is an fd of the daemon. Past it, a new connection is closed at once. */
#define METRICS_HTTP_MAX_CONNS 64
/*
 * Every HTTP connection is closed this long after it was accepted, whatever it is doing: a scrape takes
 * milliseconds, and a peer that trickles its request or reads the answer byte by byte holds a slot no longer.
 * evhttp's own timeout (the same value) only closes a connection idle that long.
 */
#define METRICS_HTTP_TIMEOUT_S 10
/* The request line and headers; a scraper sends a few hundred bytes. */
#define METRICS_HTTP_MAX_HEADERS 8192
/* A GET has no body; a small one is read so that a refused POST gets its 501 rather than a reset. */
#define METRICS_HTTP_MAX_BODY 1024
/* Connections the kernel queues until gpumemd accepts them: they cost no fd of the daemon. */
#define METRICS_HTTP_BACKLOG 16
/* Connections closed per wakeup while at the cap, so that a flood of them does not hold the loop. */
#define METRICS_HTTP_REFUSE_BATCH 16

typedef enum HttpSlotState {
        HTTP_SLOT_FREE,
        HTTP_SLOT_PENDING, /* accepted; evhttp has not set the connection up yet */
        HTTP_SLOT_LIVE,
} HttpSlotState;

typedef struct HttpSlot {
        HttpSlotState state;
        struct bufferevent *bev;         /* PENDING: our reference, so it outlives a failed setup */
        struct evhttp_connection *evcon; /* LIVE */
        struct event *deadline;          /* LIVE: closes it METRICS_HTTP_TIMEOUT_S after the accept */
} HttpSlot;

typedef struct MetricsHttp {
        Manager *m;
        struct evhttp *http;
        int fd;           /* the listening socket; its evconnlistener (owned by the evhttp) closes it */
        unsigned n_conns; /* slots not free */
        bool paused;      /* out of fds: accepting again in a second */
        bool refusing;    /* a one-shot refusal event is armed on fd */
        bool adopt_armed; /* a one-shot event will adopt the pending slots */
        bool warned;
        HttpSlot slots[METRICS_HTTP_MAX_CONNS];
} MetricsHttp;

/*
 * One listener per process. Its state lives here because the Manager holds only the struct evhttp and frees
 * it with evhttp_free(), which frees the listener and then every connection (each close callback frees its
 * slot); the one-shot events go with the event base. Nothing else needs freeing, but for a connection
 * accepted in the loop's very last iteration and not yet adopted: it keeps its bufferevent until exit.
 */
static MetricsHttp metrics_http;

static void on_http_refuse(evutil_socket_t fd, short what, void *userdata);
static void on_http_resume(evutil_socket_t fd, short what, void *userdata);

static void find_listener(struct evhttp_bound_socket *bound, void *userdata)
{
        *(struct evconnlistener **)userdata = evhttp_bound_socket_get_listener(bound);
}

/* NULL while evhttp_free() frees the connections: it has unbound (and freed) the listener by then. */
static struct evconnlistener *http_listener(MetricsHttp *h)
{
        struct evconnlistener *lev = NULL;

        evhttp_foreach_bound_socket(h->http, find_listener, &lev);
        return lev;
}

/* Below the cap evhttp accepts; at the cap the listener is off and new connections are closed at once. */
static void http_accept_update(MetricsHttp *h)
{
        struct evconnlistener *lev = http_listener(h);

        if (!lev || h->paused)
                return;
        if (h->n_conns < METRICS_HTTP_MAX_CONNS) {
                evconnlistener_enable(lev);
                return;
        }
        evconnlistener_disable(lev);
        /* Without the event, new connections wait in the backlog: no fd of ours either. */
        if (!h->refusing && event_base_once(h->m->base, h->fd, EV_READ, on_http_refuse, h, NULL) == 0)
                h->refusing = true;
}

/* Out of fds (or memory): stop accepting for a second rather than spin, like the Unix socket. */
static void http_pause(MetricsHttp *h, int err)
{
        struct evconnlistener *lev = http_listener(h);
        struct timeval tv = {1, 0};

        log_warning_errno(err, "metrics: accept: %s, pausing for a second", strerror(err));
        if (lev)
                evconnlistener_disable(lev);
        /* Without the timer, the next connection to close turns accepting back on. */
        h->paused = event_base_once(h->m->base, -1, EV_TIMEOUT, on_http_resume, h, &tv) == 0;
}

static void on_http_resume(evutil_socket_t fd, short what, void *userdata)
{
        MetricsHttp *h = userdata;

        h->paused = false;
        http_accept_update(h);
}

static bool accept_out_of_resources(int err)
{
        return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/* evconnlistener calls this on an accept error other than EAGAIN, EINTR and ECONNABORTED. */
static void on_http_accept_error(struct evconnlistener *lev, void *userdata)
{
        int err = EVUTIL_SOCKET_ERROR();

        /* @userdata is the evhttp (evhttp_bind_listener sets it) */
        if (accept_out_of_resources(err))
                http_pause(&metrics_http, err);
        else
                log_debug("metrics: accept: %s", strerror(err));
}

static void on_http_refuse(evutil_socket_t fd, short what, void *userdata)
{
        MetricsHttp *h = userdata;

        h->refusing = false;
        if (h->paused || h->n_conns < METRICS_HTTP_MAX_CONNS)
                return; /* the listener takes them again */
        for (int i = 0; i < METRICS_HTTP_REFUSE_BATCH; i++) {
                int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

                if (cfd >= 0) {
                        safe_close(cfd);
                        continue;
                }
                if (errno == EINTR || errno == ECONNABORTED)
                        continue;
                if (accept_out_of_resources(errno)) {
                        http_pause(h, errno);
                        return;
                }
                break; /* EAGAIN: none left */
        }
        http_accept_update(h);
}

static void http_slot_free(MetricsHttp *h, HttpSlot *s)
{
        if (s->deadline)
                event_free(s->deadline);
        *s = (HttpSlot){.state = HTTP_SLOT_FREE};
        h->n_conns--;
        http_accept_update(h);
}

static void on_http_close(struct evhttp_connection *evcon, void *userdata)
{
        HttpSlot *s = userdata;

        evhttp_connection_set_closecb(evcon, NULL, NULL); /* once per slot, whatever evhttp does next */
        http_slot_free(&metrics_http, s);
}

static void on_http_deadline(evutil_socket_t fd, short what, void *userdata)
{
        HttpSlot *s = userdata;
        struct evhttp_connection *evcon = s->evcon;

        evhttp_connection_free(evcon); /* calls on_http_close */
        if (s->state == HTTP_SLOT_LIVE && s->evcon == evcon)
                http_slot_free(&metrics_http, s); /* in case evhttp did not */
}

/*
 * libevent 2.1 hands out an incoming connection only with its first whole request (2.2 adds
 * evhttp_set_newreqcb). So its bufferevent, which we create, is tracked from the accept, and once evhttp has
 * set the connection up (after evhttp's accept callback returns), the connection is found as the
 * bufferevent's callback argument, checked, and given its close callback and deadline.
 */
static void http_adopt(MetricsHttp *h, HttpSlot *s)
{
        struct bufferevent *bev = TAKE_PTR(s->bev);
        bufferevent_data_cb readcb = NULL;
        void *arg = NULL;
        struct timeval tv = {METRICS_HTTP_TIMEOUT_S, 0};

        bufferevent_getcb(bev, &readcb, NULL, NULL, &arg);
        if (!readcb || !arg || evhttp_connection_get_bufferevent(arg) != bev) {
                /* bufferevent_free() clears the callbacks: evhttp dropped it already (it does when out of
                 * memory). Anything else is a libevent that sets up connections otherwise. */
                if (readcb && !h->warned) {
                        h->warned = true;
                        log_warning("metrics: cannot track HTTP connections with this libevent");
                }
                http_slot_free(h, s);
                bufferevent_decref(bev);
                return;
        }
        s->state = HTTP_SLOT_LIVE;
        s->evcon = arg;
        evhttp_connection_set_closecb(s->evcon, on_http_close, s);
        bufferevent_decref(bev); /* the connection holds its own reference */
        s->deadline = evtimer_new(h->m->base, on_http_deadline, s);
        if (!s->deadline || evtimer_add(s->deadline, &tv) < 0)
                on_http_deadline(-1, 0, s); /* no deadline, no connection */
}

static void http_adopt_all(MetricsHttp *h)
{
        for (size_t i = 0; i < METRICS_HTTP_MAX_CONNS; i++)
                if (h->slots[i].state == HTTP_SLOT_PENDING)
                        http_adopt(h, &h->slots[i]);
}

static void on_http_adopt(evutil_socket_t fd, short what, void *userdata)
{
        MetricsHttp *h = userdata;

        h->adopt_armed = false;
        http_adopt_all(h);
}

/* evhttp calls this for each accepted connection, before it sets the connection up. */
static struct bufferevent *on_http_new_conn(struct event_base *base, void *userdata)
{
        MetricsHttp *h = userdata;
        HttpSlot *s = NULL;
        struct bufferevent *bev;

        http_adopt_all(h); /* those accepted before this one are set up by now */
        for (size_t i = 0; i < METRICS_HTTP_MAX_CONNS && !s; i++)
                if (h->slots[i].state == HTTP_SLOT_FREE)
                        s = &h->slots[i];
        /* Neither should happen (the listener is off at the cap); evhttp then makes its own bufferevent, and
         * the connection has only evhttp's idle timeout. */
        if (!s)
                return NULL;
        bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
        if (!bev)
                return NULL;
        bufferevent_incref(bev);
        s->state = HTTP_SLOT_PENDING;
        s->bev = bev;
        h->n_conns++;
        /* Made active at once: it runs in this loop iteration, after the accept callback. */
        if (!h->adopt_armed && event_base_once(base, -1, EV_TIMEOUT, on_http_adopt, h, NULL) == 0)
                h->adopt_armed = true;
        if (h->n_conns >= METRICS_HTTP_MAX_CONNS)
                http_accept_update(h); /* evconnlistener stops its accept loop once disabled */
        return bev;
}

static int listen_tcp(const char *host, unsigned port)
{
        struct addrinfo hints = {
                .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
                .ai_family = AF_UNSPEC,
                .ai_socktype = SOCK_STREAM,
        };
        struct addrinfo *ai = NULL;
        char service[8];
        int r = -EADDRNOTAVAIL;

        snprintf(service, sizeof(service), "%u", port);
        if (getaddrinfo(host, service, &hints, &ai) != 0)
                return -EADDRNOTAVAIL;
        for (struct addrinfo *p = ai; p; p = p->ai_next) {
                int one = 1;
                int fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, p->ai_protocol);

                if (fd < 0) {
                        r = -errno;
                        continue;
                }
                if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
                    bind(fd, p->ai_addr, p->ai_addrlen) < 0 || listen(fd, METRICS_HTTP_BACKLOG) < 0) {
                        r = -errno;
                        safe_close(fd);
                        continue;
                }
                r = fd;
                break;
        }
        freeaddrinfo(ai);
        return r;
}

int metrics_listen(Manager *m, const char *addr_port)
{
        MetricsHttp *h = &metrics_http;
        char host[128];
        const char *colon = strrchr(addr_port, ':');
        struct evconnlistener *lev;
        unsigned long port;
        char *end;
        int fd;

        if (!colon || colon == addr_port || (size_t)(colon - addr_port) >= sizeof(host))
                return log_error_errno(-EINVAL, "metrics-listen '%s' is not ADDRESS:PORT", addr_port);
        port = strtoul(colon + 1, &end, 10);
        if (*end || port == 0 || port > 65535)
                return log_error_errno(-EINVAL, "metrics-listen '%s': bad port", addr_port);
        memcpy(host, addr_port, (size_t)(colon - addr_port));
        host[colon - addr_port] = '\0';
        if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [::1]:9464 */
                memmove(host, host + 1, strlen(host));
                host[strlen(host) - 1] = '\0';
        }
        m->http = evhttp_new(m->base);
        if (!m->http)
                return -ENOMEM;
        *h = (MetricsHttp){.m = m, .http = m->http, .fd = -1};
        evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET);
        evhttp_set_max_headers_size(m->http, METRICS_HTTP_MAX_HEADERS);
        evhttp_set_max_body_size(m->http, METRICS_HTTP_MAX_BODY);
        evhttp_set_timeout(m->http, METRICS_HTTP_TIMEOUT_S);
        evhttp_set_bevcb(m->http, on_http_new_conn, h);
        evhttp_set_cb(m->http, "/metrics", on_http, m);

        fd = listen_tcp(host, (unsigned)port);
        if (fd < 0)
                return log_error_errno(fd, "cannot serve metrics on %s", addr_port);
        /* Accepted fds get SOCK_NONBLOCK (the default) and SOCK_CLOEXEC (LEV_OPT_CLOSE_ON_EXEC). */
        lev = evconnlistener_new(m->base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
        if (!lev) {
                safe_close(fd);
                return -ENOMEM;
        }
        if (!evhttp_bind_listener(m->http, lev)) {
                evconnlistener_free(lev);
                return -ENOMEM;
        }
        evconnlistener_set_error_cb(lev, on_http_accept_error);
        h->fd = fd;
        log_info("serving metrics on http://%s/metrics (at most %d connections, each for %d s)", addr_port,
                 METRICS_HTTP_MAX_CONNS, METRICS_HTTP_TIMEOUT_S);
        return 0;
}
