/* Session ops: hello (version, window, limits), ping, window retry. */
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "broker/broker.h"
#include "server/classes.h"
#include "config.h"
#include "base/log.h"
#include "server/core.h"
#include "request.h"
#include "view.h"
#include "server/window.h"

#define CLIENT_NAME_MAX 64

static char *sanitize_name(const char *s)
{
        char buf[CLIENT_NAME_MAX + 1];
        size_t n = 0;

        for (; s && *s && n < CLIENT_NAME_MAX; s++)
                buf[n++] = isprint((unsigned char)*s) ? *s : '?';
        buf[n] = '\0';
        return strdup(buf);
}

int op_hello(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__Hello *h = req->hello;
        Gpumem__HelloReply hr = GPUMEM__HELLO_REPLY__INIT;
        Conn *c = r->c;
        Manager *m = r->m;
        uint64_t size = m->opts.window_size;
        uint32_t major = 0, minor = 0;
        char why[200];
        int err;

        if (c->proto_version != 0)
                return reply_fail(r, -EALREADY, "hello was already done on this connection");
        if (!h->has_protocol_version || h->protocol_version == 0)
                return reply_fail(r, -EPROTONOSUPPORT, "hello without a protocol version");
        if (h->has_window_size && h->window_size != 0) {
                if (h->window_size % WINDOW_ALIGN || h->window_size > m->opts.window_size)
                        return reply_fail(
                                r, -EINVAL, "window size %llu is not a multiple of 2 MiB up to %llu bytes",
                                (unsigned long long)h->window_size, (unsigned long long)m->opts.window_size);
                size = h->window_size;
        }
        /* a window where libhsakmt accepts an SVM aperture, for ROCm through gpumemd */
        c->low_window = (h->features & GM_HELLO_LOW_WINDOW) != 0;
        err = window_assign(c, size, why, sizeof(why));
        if (err == -EDQUOT)
                return reply_fail(r, err, "%s", why);
        if (err < 0)
                return reply_fail(r, err, "no VA window of %llu bytes is free", (unsigned long long)size);

        free(c->name);
        c->name = sanitize_name(h->client_name);
        c->proto_version = (uint16_t)(h->protocol_version < GM_PROTOCOL_VERSION ? h->protocol_version
                                                                                : GM_PROTOCOL_VERSION);
        c->t.version = c->proto_version; /* replies now carry it */
        c->admin = classes_is_admin(m, c);
        conn_hello_done(c);
        driver_version(m->drv, &major, &minor);

        hr.has_protocol_version = hr.has_features = hr.has_client_id = true;
        hr.protocol_version = c->proto_version;
        hr.features = 0;
        hr.server_version = GPUMEMD_VERSION;
        hr.client_id = c->id;
        hr.has_window_base = hr.has_window_size = true;
        hr.window_base = c->window_base;
        hr.window_size = c->window_size;
        hr.has_page_size = hr.has_recommended_granularity = true;
        hr.page_size = 4096;
        hr.recommended_granularity = 2u << 20;
        hr.has_max_frame = hr.has_max_fds = hr.has_max_inflight = true;
        hr.max_frame = GM_FRAME_MAX;
        hr.max_fds = GM_FRAME_MAX_FDS;
        {
                uint64_t lim = conn_inflight_limit(c);
                hr.max_inflight = lim > UINT32_MAX ? UINT32_MAX : (uint32_t)lim;
        }
        hr.backend = (char *)driver_name(m->drv);
        hr.has_kfd_major = hr.has_kfd_minor = hr.has_private_gpu_vm = true;
        hr.kfd_major = major;
        hr.kfd_minor = minor;
        /* created at its first device allocation, where the driver allows secondary contexts */
        hr.private_gpu_vm = driver_has(m->drv, DRIVER_CAP_PRIVATE_VM);
        conn_log(c, conn_session_log_level(c), GM_MESSAGE_CLIENT_CONNECT, &m->conn_log_rl,
                 "connected as '%s', cgroup %s, window 0x%llx+0x%llx", c->name ? c->name : "",
                 c->ident.cgroup ? c->ident.cgroup : "-", (unsigned long long)c->window_base,
                 (unsigned long long)c->window_size);
        manager_notify_status(m);
        return reply_result(r, &hr);
}

static int ping_answer(ReqCtx *r, uint64_t cookie)
{
        uint8_t buf[GM_REPLY_HEAD_MAX + 11 + 8]; /* a PingReply with the cookie (absent: 0) */

        return reply_result_packed(r, buf, gm_pb_put_uint_pad(buf + GM_REPLY_HEAD_MAX, 1, cookie));
}

REQ_U64_HANDLERS(op_ping, ping, cookie, ping_answer)

int op_window_retry(ReqCtx *r, const Gpumem__Request *req)
{
        Gpumem__HelloReply hr = GPUMEM__HELLO_REPLY__INIT;
        Conn *c = r->c;
        char why[200];
        int err;

        /* an allocation still being made counts: it has its place in this window already */
        if (c->deferred || c->event_waits || (c->broker && broker_client_objects(c->broker) > 0))
                return reply_fail(r, -EBUSY, "the window can only change before the first allocation");
        c->broker = broker_client_free(c->broker);
        if (req->window_retry->failed_base != c->window_base)
                return reply_fail(r, -EINVAL, "0x%llx is not this client's window",
                                  (unsigned long long)req->window_retry->failed_base);
        err = window_retry(c, c->window_base, why, sizeof(why));
        if (err == -EDQUOT)
                return reply_fail(r, err, "%s", why);
        if (err == -ENOSPC)
                return reply_fail(r, err, "no further window: %d were refused", WINDOW_MAX_RETRIES);
        if (err < 0)
                return reply_fail(r, err, "no other VA window is free");
        hr.has_window_base = hr.has_window_size = true;
        hr.window_base = c->window_base;
        hr.window_size = c->window_size;
        return reply_result(r, &hr);
}
