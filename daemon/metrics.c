/* Metrics: counters kept on the request path, rendered in Prometheus text format for gpumemctl and HTTP. */
#include "metrics.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "classes.h"
#include "conn.h"
#include "log.h"
#include "manager.h"

/* Upper bounds of the latency buckets, in nanoseconds (10 µs to 1 s). */
static const uint64_t bucket_ns[METRICS_N_BUCKETS] = {
        10000,   25000,    50000,    100000,   250000,    500000,    1000000,    2500000,
        5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 1000000000,
};

static const char *const deny_names[_DENY_MAX] = {
        [DENY_ADMIN] = "admin",       [DENY_PERMISSION] = "permission",   [DENY_QUOTA] = "quota",
        [DENY_NO_CLASS] = "no_class", [DENY_CONNECTIONS] = "connections", [DENY_INFLIGHT] = "inflight",
};

void metrics_record(Metrics *mt, unsigned op, const char *name, int result, uint64_t ns)
{
        OpStats *s;

        if (op >= METRICS_MAX_OPS)
                return;
        s = &mt->ops[op];
        mt->op_names[op] = name;
        if (result >= 0)
                s->ok++;
        else if (-result < METRICS_MAX_ERRNO)
                s->by_errno[-result]++;
        for (int i = 0; i < METRICS_N_BUCKETS; i++)
                if (ns <= bucket_ns[i]) {
                        s->buckets[i]++;
                        break;
                }
        s->count++;
        s->sum_ns += ns;
}

void metrics_deny(Metrics *mt, DenyReason why)
{
        if (why < _DENY_MAX)
                mt->denials[why]++;
}

static void limit_value(FILE *f, uint64_t v)
{
        if (v == UINT64_MAX)
                fputs("+Inf\n", f);
        else
                fprintf(f, "%llu\n", (unsigned long long)v);
}

int metrics_render(Manager *m, char **ret, size_t *ret_len)
{
        Metrics *mt = m->metrics;
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        BrokerUsage tot;

        if (!f)
                return -ENOMEM;
        broker_totals(m->broker, &tot);
        fprintf(f,
                "# HELP gpumemd_up Whether gpumemd is serving.\n# TYPE gpumemd_up gauge\n"
                "gpumemd_up{backend=\"%s\"} 1\n"
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
                "# TYPE gpumemd_protocol_errors_total counter\ngpumemd_protocol_errors_total %llu\n",
                thunk_device_backend_name(m->dev),
                (double)(now_usec(CLOCK_MONOTONIC) - m->started_mono_usec) / 1e6, m->n_conns,
                (unsigned long long)m->stats.connections_total,
                (unsigned long long)m->stats.connections_refused, (unsigned long long)m->stats.requests,
                (unsigned long long)m->stats.protocol_errors);

        fputs("# HELP gpumemd_denials_total Requests and connections refused, by reason.\n"
              "# TYPE gpumemd_denials_total counter\n",
              f);
        for (int i = 0; i < _DENY_MAX; i++)
                fprintf(f, "gpumemd_denials_total{reason=\"%s\"} %llu\n", deny_names[i],
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
                                mt->op_names[op], (double)bucket_ns[i] / 1e9, (unsigned long long)cum);
                }
                fprintf(f, "gpumemd_operation_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n",
                        mt->op_names[op], (unsigned long long)s->count);
                fprintf(f, "gpumemd_operation_duration_seconds_sum{op=\"%s\"} %.9f\n", mt->op_names[op],
                        (double)s->sum_ns / 1e9);
                fprintf(f, "gpumemd_operation_duration_seconds_count{op=\"%s\"} %llu\n", mt->op_names[op],
                        (unsigned long long)s->count);
        }

        fputs("# HELP gpumemd_gpu_vram_used_bytes VRAM the broker's clients hold, per GPU.\n"
              "# TYPE gpumemd_gpu_vram_used_bytes gauge\n",
              f);
        for (size_t g = 0; g < broker_gpu_count(m->broker); g++)
                fprintf(f, "gpumemd_gpu_vram_used_bytes{gpu=\"%u\"} %llu\n", broker_gpu_id(m->broker, g),
                        (unsigned long long)tot.vram_bytes[g]);

        fputs("# HELP gpumemd_class_bytes Memory a class holds, by kind.\n# TYPE gpumemd_class_bytes gauge\n",
              f);
        for (ClassState *s = m->classes; s; s = s->next) {
                const BrokerUsage *u = &s->acct.used;
                fprintf(f, "gpumemd_class_bytes{class=\"%s\",kind=\"device\"} %llu\n", s->name,
                        (unsigned long long)u->device_bytes);
                fprintf(f, "gpumemd_class_bytes{class=\"%s\",kind=\"vmm\"} %llu\n", s->name,
                        (unsigned long long)u->vmm_bytes);
                fprintf(f, "gpumemd_class_bytes{class=\"%s\",kind=\"host\"} %llu\n", s->name,
                        (unsigned long long)u->host_bytes);
                fprintf(f, "gpumemd_class_bytes{class=\"%s\",kind=\"managed\"} %llu\n", s->name,
                        (unsigned long long)u->managed_bytes);
        }
        fputs("# HELP gpumemd_class_vram_bytes VRAM a class holds, per GPU.\n"
              "# TYPE gpumemd_class_vram_bytes gauge\n",
              f);
        for (ClassState *s = m->classes; s; s = s->next)
                for (size_t g = 0; g < broker_gpu_count(m->broker); g++)
                        fprintf(f, "gpumemd_class_vram_bytes{class=\"%s\",gpu=\"%u\"} %llu\n", s->name,
                                broker_gpu_id(m->broker, g), (unsigned long long)s->acct.used.vram_bytes[g]);
        fputs("# HELP gpumemd_class_limit A class's limit, by resource (+Inf: none).\n"
              "# TYPE gpumemd_class_limit gauge\n",
              f);
        for (ClassState *s = m->classes; s; s = s->next)
                for (int r = 0; r < _POLICY_RES_MAX; r++) {
                        uint64_t used, limit;
                        classes_get(m, s, (PolicyResource)r, 0, &used, &limit);
                        fprintf(f, "gpumemd_class_limit{class=\"%s\",resource=\"%s\"} ", s->name,
                                policy_resource_name((PolicyResource)r));
                        limit_value(f, limit);
                }
        fputs("# HELP gpumemd_class_usage A class's use of each limited resource.\n"
              "# TYPE gpumemd_class_usage gauge\n",
              f);
        for (ClassState *s = m->classes; s; s = s->next)
                for (int r = 0; r < _POLICY_RES_MAX; r++) {
                        uint64_t used, limit;
                        classes_get(m, s, (PolicyResource)r, 0, &used, &limit);
                        fprintf(f, "gpumemd_class_usage{class=\"%s\",resource=\"%s\"} %llu\n", s->name,
                                policy_resource_name((PolicyResource)r), (unsigned long long)used);
                }
        fputs("# HELP gpumemd_class_denials_total Requests and connections of a class refused.\n"
              "# TYPE gpumemd_class_denials_total counter\n",
              f);
        for (ClassState *s = m->classes; s; s = s->next)
                fprintf(f, "gpumemd_class_denials_total{class=\"%s\"} %llu\n", s->name,
                        (unsigned long long)s->denials);
        if (fclose(f) != 0 || !text) {
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

        if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
                evhttp_send_error(req, 405, "only GET");
                return;
        }
        if (metrics_render(m, &text, &len) < 0 || !(buf = evbuffer_new())) {
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

int metrics_listen(Manager *m, const char *addr_port)
{
        char host[128];
        const char *colon = strrchr(addr_port, ':');
        unsigned long port;
        char *end;

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
        evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET);
        evhttp_set_cb(m->http, "/metrics", on_http, m);
        if (evhttp_bind_socket(m->http, host, (uint16_t)port) < 0)
                return log_error_errno(-EADDRNOTAVAIL, "cannot serve metrics on %s", addr_port);
        log_info("serving metrics on http://%s/metrics", addr_port);
        return 0;
}
