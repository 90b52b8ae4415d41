/* Administration ops: status, clients, disconnect, metrics, log level (administrators only). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "model.h"
#include "config.h"
#include "log.h"
#include "manager.h"
#include "request.h"

int op_admin_status(ReqCtx *r, const Gpumem__Request *req)
{
        Manager *m = r->m;
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__AdminStatusReply s = GPUMEM__ADMIN_STATUS_REPLY__INIT;
        uint32_t major = 0, minor = 0;

        thunk_device_version(m->dev, &major, &minor);
        s.server_version = GPUMEMD_VERSION;
        s.backend = (char *)thunk_device_backend_name(m->dev);
        s.has_kfd_major = s.has_kfd_minor = true;
        s.kfd_major = major;
        s.kfd_minor = minor;
        s.has_uptime_usec = s.has_started_usec = true;
        s.uptime_usec = now_usec(CLOCK_MONOTONIC) - m->started_mono_usec;
        s.started_usec = m->started_real_usec;
        s.has_clients = s.has_gpus = true;
        s.clients = m->n_conns;
        s.gpus = (uint32_t)thunk_device_gpu_count(m->dev);
        BrokerUsage u;
        broker_totals(m->broker, &u);
        s.has_allocations = s.has_bytes_device = s.has_bytes_host = s.has_bytes_managed = true;
        s.allocations = u.objects;
        s.bytes_device = u.device_bytes + u.vmm_bytes;
        s.bytes_host = u.host_bytes;
        s.bytes_managed = u.managed_bytes;
        s.has_requests = s.has_protocol_errors = s.has_pid = s.has_protocol_version = true;
        s.requests = m->stats.requests;
        s.protocol_errors = m->stats.protocol_errors;
        s.pid = (uint32_t)getpid();
        s.protocol_version = GM_PROTOCOL_VERSION;
        s.preset = m->preset_name;
        s.has_va_windows = true;
        s.va_windows = (uint32_t)(thunk_va_space_count(m->va) - m->va_blocked);
        Gpumem__BackendStats ms = GPUMEM__BACKEND_STATS__INIT;
        if (thunk_device_model(m->dev)) {
                ThunkModelStats st;
                thunk_model_get_stats(thunk_device_model(m->dev), &st);
                ms.has_contexts = ms.has_buffers = ms.has_handles = ms.has_imports = ms.has_mappings = true;
                ms.has_gem_handles = ms.has_svm_ranges = ms.has_system_bytes = ms.has_vram_bytes = true;
                ms.contexts = st.contexts;
                ms.buffers = st.bufs;
                ms.handles = st.mems;
                ms.imports = st.imports;
                ms.mappings = st.mappings;
                ms.gem_handles = st.gem_handles;
                ms.svm_ranges = st.svm_ranges;
                ms.system_bytes = st.system_used;
                for (uint32_t i = 0; i < st.n_gpus && i < THUNK_MODEL_MAX_GPUS; i++)
                        ms.vram_bytes += st.vram_used[i];
                s.model = &ms;
        }
        reply.result_case = GPUMEM__REPLY__RESULT_ADMIN_STATUS;
        reply.admin_status = &s;
        return reply_ok(r, &reply);
}

int op_admin_clients(ReqCtx *r, const Gpumem__Request *req)
{
        Manager *m = r->m;
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__AdminClientsReply cr = GPUMEM__ADMIN_CLIENTS_REPLY__INIT;
        Gpumem__ClientInfo *infos, **ptrs;
        Gpumem__GpuUsage *usage;
        Gpumem__GpuUsage **usage_ptrs;
        size_t n = 0, n_usage = 0;
        int err;

        size_t max_usage = (m->n_conns ? m->n_conns : 1) * BROKER_MAX_GPUS;
        infos = calloc(m->n_conns ? m->n_conns : 1, sizeof(*infos));
        ptrs = calloc(m->n_conns ? m->n_conns : 1, sizeof(*ptrs));
        usage = calloc(max_usage, sizeof(*usage));
        usage_ptrs = calloc(max_usage, sizeof(*usage_ptrs));
        if (!infos || !ptrs || !usage || !usage_ptrs) {
                free(infos);
                free(ptrs);
                free(usage);
                free(usage_ptrs);
                return reply_fail(r, -ENOMEM, "out of memory listing clients");
        }
        for (Conn *c = m->conns; c && n < m->n_conns; c = c->next) {
                Gpumem__ClientInfo *i = &infos[n];
                gpumem__client_info__init(i);
                i->has_client_id = i->has_pid = i->has_uid = i->has_gid = true;
                i->client_id = c->id;
                i->pid = (uint32_t)c->ident.pid;
                i->uid = c->ident.uid;
                i->gid = c->ident.gid;
                i->cgroup = c->ident.cgroup ? c->ident.cgroup : "";
                i->container = "";
                i->name = c->name ? c->name : "";
                i->class_name = "";
                i->has_connected_usec = i->has_requests = i->has_admin = true;
                i->connected_usec = c->connected_real_usec;
                i->requests = c->requests;
                i->admin = c->admin;
                i->has_handles = i->has_fds = i->has_host_bytes = i->has_managed_bytes = true;
                if (c->broker) {
                        BrokerUsage u;
                        broker_client_usage(c->broker, &u);
                        i->handles = (uint32_t)u.objects;
                        i->fds = u.held_fds;
                        i->host_bytes = u.host_bytes;
                        i->managed_bytes = u.managed_bytes;
                        i->usage = &usage_ptrs[n_usage];
                        for (uint32_t k = 0; k < u.n_gpus; k++) {
                                if (!u.vram_bytes[k])
                                        continue;
                                gpumem__gpu_usage__init(&usage[n_usage]);
                                usage[n_usage].has_gpu_id = usage[n_usage].has_vram_bytes = true;
                                usage[n_usage].gpu_id = u.gpu_ids[k];
                                usage[n_usage].vram_bytes = u.vram_bytes[k];
                                usage_ptrs[n_usage] = &usage[n_usage];
                                n_usage++;
                                i->n_usage++;
                        }
                }
                ptrs[n++] = i;
        }
        cr.n_clients = n;
        cr.clients = ptrs;
        reply.result_case = GPUMEM__REPLY__RESULT_ADMIN_CLIENTS;
        reply.admin_clients = &cr;
        err = reply_ok(r, &reply);
        free(infos);
        free(ptrs);
        free(usage);
        free(usage_ptrs);
        return err;
}

int op_admin_disconnect(ReqCtx *r, const Gpumem__Request *req)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Empty empty = GPUMEM__EMPTY__INIT;
        uint64_t id = req->admin_disconnect->client_id;
        Conn *target = manager_find_conn(r->m, id);

        if (!target)
                return reply_fail(r, -ESRCH, "no client with id %llu", (unsigned long long)id);
        if (target == r->c)
                return reply_fail(r, -EINVAL, "a client cannot disconnect itself this way");
        conn_log(r->c, LOG_NOTICE, GM_MESSAGE_ADMIN_ACTION, NULL, "disconnected client %llu",
                 (unsigned long long)id);
        (void)conn_send_error(target, 0, -ECONNABORTED, "disconnected by an administrator");
        conn_kill(target);
        reply.result_case = GPUMEM__REPLY__RESULT_EMPTY;
        reply.empty = &empty;
        return reply_ok(r, &reply);
}

int op_admin_metrics(ReqCtx *r, const Gpumem__Request *req)
{
        Manager *m = r->m;
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__AdminMetricsReply mr = GPUMEM__ADMIN_METRICS_REPLY__INIT;
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        int err;

        if (!f)
                return reply_fail(r, -ENOMEM, "out of memory building metrics");
        fprintf(f,
                "# HELP gpumemd_up Whether gpumemd is serving.\n"
                "# TYPE gpumemd_up gauge\n"
                "gpumemd_up{backend=\"%s\"} 1\n"
                "# HELP gpumemd_uptime_seconds Seconds since gpumemd started.\n"
                "# TYPE gpumemd_uptime_seconds gauge\n"
                "gpumemd_uptime_seconds %.3f\n"
                "# HELP gpumemd_connections Connected clients.\n"
                "# TYPE gpumemd_connections gauge\n"
                "gpumemd_connections %u\n"
                "# HELP gpumemd_connections_total Connections accepted since start.\n"
                "# TYPE gpumemd_connections_total counter\n"
                "gpumemd_connections_total %llu\n"
                "# HELP gpumemd_connections_refused_total Connections refused over the connection caps.\n"
                "# TYPE gpumemd_connections_refused_total counter\n"
                "gpumemd_connections_refused_total %llu\n"
                "# HELP gpumemd_requests_total Requests handled since start.\n"
                "# TYPE gpumemd_requests_total counter\n"
                "gpumemd_requests_total %llu\n"
                "# HELP gpumemd_protocol_errors_total Malformed frames and protocol violations.\n"
                "# TYPE gpumemd_protocol_errors_total counter\n"
                "gpumemd_protocol_errors_total %llu\n"
                "# HELP gpumemd_denials_total Requests refused for lack of permission.\n"
                "# TYPE gpumemd_denials_total counter\n"
                "gpumemd_denials_total %llu\n",
                thunk_device_backend_name(m->dev),
                (double)(now_usec(CLOCK_MONOTONIC) - m->started_mono_usec) / 1e6, m->n_conns,
                (unsigned long long)m->stats.connections_total,
                (unsigned long long)m->stats.connections_refused, (unsigned long long)m->stats.requests,
                (unsigned long long)m->stats.protocol_errors, (unsigned long long)m->stats.denials);
        if (fclose(f) != 0 || !text) {
                free(text);
                return reply_fail(r, -ENOMEM, "out of memory building metrics");
        }
        mr.text = text;
        reply.result_case = GPUMEM__REPLY__RESULT_ADMIN_METRICS;
        reply.admin_metrics = &mr;
        err = reply_ok(r, &reply);
        free(text);
        return err;
}

int op_admin_set_log_level(ReqCtx *r, const Gpumem__Request *req)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Empty empty = GPUMEM__EMPTY__INIT;
        const char *s = req->admin_set_log_level->level;
        int level = s ? log_level_from_string(s) : -EINVAL;

        if (level < 0)
                return reply_fail(r, -EINVAL, "unknown log level '%s'", s ? s : "");
        log_set_level(level);
        conn_log(r->c, LOG_NOTICE, GM_MESSAGE_ADMIN_ACTION, NULL, "set the log level to %s",
                 log_level_to_string(level));
        reply.result_case = GPUMEM__REPLY__RESULT_EMPTY;
        reply.empty = &empty;
        return reply_ok(r, &reply);
}
