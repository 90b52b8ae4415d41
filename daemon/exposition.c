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

#include "broker.h"
#include "classes.h"
#include "conn.h"
#include "log.h"
#include "core.h"
#include "metrics.h"

static void limit_value(FILE *f, uint64_t v)
{
        if (v == UINT64_MAX)
                fputs("+Inf\n", f);
        else
                fprintf(f, "%llu\n", (unsigned long long)v);
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
                driver_name(m->drv), (double)(now_usec(CLOCK_MONOTONIC) - m->started_mono_usec) / 1e6,
                m->n_conns, (unsigned long long)st.connections_total,
                (unsigned long long)st.connections_refused, (unsigned long long)st.requests,
                (unsigned long long)st.protocol_errors, (unsigned long long)st.stalled_drops);

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

        fputs("# HELP gpumemd_gpu_vram_used_bytes VRAM the broker's clients hold, per GPU.\n"
              "# TYPE gpumemd_gpu_vram_used_bytes gauge\n",
              f);
        for (size_t g = 0; g < broker_gpu_count(m->broker); g++)
                fprintf(f, "gpumemd_gpu_vram_used_bytes{gpu=\"%u\"} %llu\n", broker_gpu_id(m->broker, g),
                        (unsigned long long)tot.vram_bytes[g]);

        fputs("# HELP gpumemd_class_bytes Memory a class holds, by kind.\n# TYPE gpumemd_class_bytes gauge\n",
              f);
        for (ClassState *s = m->classes; s; s = s->next) {
                BrokerUsage used, *u = &used;
                broker_account_usage(&s->acct, &used);
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
        for (ClassState *s = m->classes; s; s = s->next) {
                BrokerUsage u;
                broker_account_usage(&s->acct, &u);
                for (size_t g = 0; g < broker_gpu_count(m->broker); g++)
                        fprintf(f, "gpumemd_class_vram_bytes{class=\"%s\",gpu=\"%u\"} %llu\n", s->name,
                                broker_gpu_id(m->broker, g), (unsigned long long)u.vram_bytes[g]);
        }
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
                        (unsigned long long)READ_ONCE(s->denials));
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
