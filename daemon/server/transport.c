/* A client's socket: one packet per wakeup in, replies out in request order, slots for late replies. */
#include "transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "envelope.h"
#include "frame.h"
#include "base/util.h"
#include "wire.h"

/* Queued reply bytes beyond which a client that does not read is dropped. */
#define TRANSPORT_OUT_MAX (1024u * 1024u)

/*
 * A reply waiting for the socket, or (hole) the place of one that a request finishing later will fill:
 * replies leave in the order their requests came, so nothing behind a hole is sent before it.
 */
struct TransportPacket {
        TransportPacket *next;
        bool hole;
        size_t len;
        size_t n_fds;
        int fds[GM_FRAME_MAX_FDS];
        uint8_t *data;
};

static void packet_free(TransportPacket *p)
{
        gm_wire_close_fds(p->fds, p->n_fds);
        free(p->data);
        free(p);
}

static void packet_fill(TransportPacket *p, const uint8_t *buf, size_t len, const int *fds, size_t n_fds)
{
        p->len = len;
        p->n_fds = n_fds;
        if (n_fds) /* fds is NULL when there are none */
                memcpy(p->fds, fds, n_fds * sizeof(int));
        memcpy(p->data, buf, len);
}

/* The peer is gone or the socket failed: stop, and let the owner end the connection. */
static void fail(Transport *t)
{
        if (t->dead)
                return;
        transport_stop(t);
        t->ops->closed(t->owner);
}

/* Nothing stops reading: not dead, not paused or held, below the in-flight limit. */
static bool reading_allowed(const Transport *t)
{
        return !t->dead && !t->paused && !t->held && t->out_count < t->ops->inflight_limit(t->owner);
}

/*
 * Watch the socket for what is wanted now: reading while nothing stops it, writing while a reply waits for
 * room. Called after every change of that state; unchanged, it costs a comparison. A socket the loop cannot
 * watch is a failed one.
 */
static void watch(Transport *t)
{
        unsigned want = 0;

        if (!t->started)
                return;
        if (reading_allowed(t))
                want |= LOOP_READ;
        if (!t->dead && t->out_head && !t->out_head->hole)
                want |= LOOP_WRITE;
        if (loop_io_want(&t->io, want) < 0)
                fail(t);
}

/* The queue moved (or began): the client has send-timeout seconds until it moves again. */
static void send_timer_restart(Transport *t)
{
        /* the setting a reload may change meanwhile, on another thread */
        uint32_t timeout = __atomic_load_n(t->send_timeout_sec, __ATOMIC_RELAXED);

        if (t->started && timeout)
                loop_timer_arm(&t->send_timer, (uint64_t)timeout * 1000000u);
}

/* A reply has waited since the queue last moved: a client that does not read is dropped, so it cannot hold
 * its connection slot, its class's counts and its memory for ever. */
static void on_send_timeout(void *userdata)
{
        Transport *t = userdata;

        /* a reply the daemon has not made yet is no fault of the client's */
        if (t->dead || !t->out_head || t->out_head->hole)
                return;
        t->ops->stalled(t->owner);
}

/* Queue @p; it counts in flight until it is sent. At the limit reading stops, for this connection alone. */
static void out_append(Transport *t, TransportPacket *p)
{
        bool limited;

        p->next = NULL;
        if (t->out_tail)
                t->out_tail->next = p;
        else
                t->out_head = p;
        t->out_tail = p;
        t->out_count++;
        limited = t->out_count >= t->ops->inflight_limit(t->owner);
        if (limited)
                watch(t);
        t->ops->inflight(t->owner, +1, limited);
}

static int flush(Transport *t)
{
        while (t->out_head && !t->out_head->hole) {
                TransportPacket *p = t->out_head;
                int r = gm_wire_send(t->fd, p->data, p->len, NULL, 0, p->fds, p->n_fds, MSG_DONTWAIT);
                if (r == -EAGAIN) {
                        watch(t); /* for room to write; and below its in-flight limit, reading again */
                        return 0;
                }
                if (r < 0)
                        return r;
                t->out_head = p->next;
                if (!t->out_head)
                        t->out_tail = NULL;
                t->out_bytes -= p->len;
                packet_free(p);
                t->out_count--;
                t->ops->inflight(t->owner, -1, false);
                send_timer_restart(t);
        }
        /* empty, or waiting for a reply still being made: nothing to write, and no stall of the client's */
        if (t->started)
                loop_timer_cancel(&t->send_timer);
        /* below its in-flight limit again: read it (replies keep their order in the queue) */
        watch(t);
        return 0;
}

/* Receive one packet and hand it to the owner: true if one was handled, false if none was there or the
 * connection cannot go on. */
static bool read_one(Transport *t)
{
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        ssize_t n;

        /* The buffer is shared by all connections: a short packet refused for its control data must not have
         * its request id read from the previous packet's bytes. */
        memset(t->rx_buf, 0, GM_FRAME_HDR_SIZE);
        n = gm_wire_recv(t->fd, t->rx_buf, GM_FRAME_MAX, fds, &n_fds, MSG_DONTWAIT);
        if (n == -EAGAIN)
                return false;
        if (n == -EMSGSIZE || n == -EPROTO) {
                GmFrameHdr hdr = {0};
                (void)gm_frame_parse(t->rx_buf, GM_FRAME_HDR_SIZE, 0, GM_PROTOCOL_VERSION, &hdr, NULL);
                t->ops->refused(t->owner, (int)n, hdr.request_id);
                return false;
        }
        if (n <= 0) {
                fail(t);
                return false;
        }
        t->ops->packet(t->owner, t->rx_buf, (size_t)n, fds, n_fds);
        return true;
}

/*
 * One frame per wakeup, and sometimes a few more. The loop is level-triggered, so a client with more
 * queued comes round again and others get their turn in between. But when the reply went out at once, the
 * client may have sent its next request already: a client on the loop's CPU (where the wake-up of a
 * synchronous send tends to put it) runs on the reply's wake-up before the loop is back from sendmsg. Then
 * reading again at once saves the trip through epoll_wait, and a read that finds nothing costs one
 * EAGAIN. So the transport reads again while that pays: after a hit, at once; after a miss, only at every
 * READ_AGAIN_PROBE-th reply. At most READ_AGAIN_MAX frames in a row, then the others' turn.
 */
enum { READ_AGAIN_MAX = 8, READ_AGAIN_PROBE = 16 };

static void on_read(Transport *t)
{
        if (t->dead || t->paused || t->held)
                return;
        if (t->out_count >= t->ops->inflight_limit(t->owner)) {
                /* as many replies wait as this connection may have in flight: it waits, alone */
                watch(t);
                t->ops->inflight(t->owner, 0, true);
                return;
        }
        if (!read_one(t))
                return;
        for (unsigned k = 1; k < READ_AGAIN_MAX; k++) {
                /* the reply still queued or being made, or reading stopped: the loop takes it from here */
                if (t->out_head || !reading_allowed(t))
                        return;
                if (t->read_again_skip > 0) {
                        t->read_again_skip--;
                        return;
                }
                if (!read_one(t)) {
                        if (!t->dead)
                                t->read_again_skip = READ_AGAIN_PROBE - 1;
                        return;
                }
        }
}

static void on_io(void *userdata, unsigned what)
{
        Transport *t = userdata;

        if ((what & LOOP_WRITE) && flush(t) < 0)
                fail(t);
        if ((what & LOOP_READ) && !t->dead)
                on_read(t);
}

void transport_adopt(Transport *t, int fd, const TransportOps *ops, void *owner)
{
        memset(t, 0, sizeof(*t));
        t->fd = fd;
        t->ops = ops;
        t->owner = owner;
}

int transport_start(Transport *t, Loop *loop, uint8_t *rx_buf, uint8_t *tx_buf,
                    const uint32_t *send_timeout_sec)
{
        int r;

        t->rx_buf = rx_buf;
        t->tx_buf = tx_buf;
        t->send_timeout_sec = send_timeout_sec;
        loop_io_init(&t->io, loop, t->fd, on_io, t);
        r = loop_timer_init(&t->send_timer, loop, on_send_timeout, t);
        if (r < 0)
                return r;
        t->started = true;
        /* stopped, paused or held before it started: not read yet */
        return loop_io_want(&t->io, reading_allowed(t) ? LOOP_READ : 0);
}

int transport_init(Transport *t, Loop *loop, int fd, uint8_t *rx_buf, uint8_t *tx_buf,
                   const uint32_t *send_timeout_sec, const TransportOps *ops, void *owner)
{
        transport_adopt(t, fd, ops, owner);
        return transport_start(t, loop, rx_buf, tx_buf, send_timeout_sec);
}

void transport_done(Transport *t)
{
        loop_io_done(&t->io);
        loop_timer_done(&t->send_timer);
        t->started = false;
        while (t->out_head) {
                TransportPacket *p = t->out_head;
                t->out_head = p->next;
                packet_free(p);
                t->out_count--;
                t->ops->inflight(t->owner, -1, false);
        }
        t->out_tail = NULL;
        t->fd = safe_close(t->fd);
}

void transport_stop(Transport *t)
{
        if (t->dead)
                return;
        /* Consume what the client sent and we will never read: closing over unread data makes the kernel
         * report a reset to the client before it has read our last (error) frame. */
        for (int i = 0; i < 64; i++) {
                /* a small buffer: the packet is consumed whole anyway (-EMSGSIZE), and the frame being
                 * handled may still sit in the shared receive buffer */
                uint8_t scratch[64];
                int fds[GM_FRAME_MAX_FDS];
                size_t n_fds = 0;
                ssize_t n = gm_wire_recv(t->fd, scratch, sizeof(scratch), fds, &n_fds, MSG_DONTWAIT);
                if (n > 0)
                        gm_wire_close_fds(fds, n_fds);
                else if (n != -EMSGSIZE && n != -EPROTO)
                        break;
        }
        t->dead = true;
        watch(t);
        if (t->started)
                loop_timer_cancel(&t->send_timer);
}

void transport_pause(Transport *t, bool paused)
{
        t->paused = paused;
        watch(t); /* not started: transport_start() looks at it */
}

void transport_hold(Transport *t)
{
        if (t->held++ == 0)
                watch(t);
}

void transport_release(Transport *t)
{
        if (t->held && --t->held == 0)
                watch(t);
}

bool transport_idle(const Transport *t)
{
        return !t->out_head;
}

/* The frame header for @body_len bytes of body, in the transmit buffer. */
/* Why nothing can be sent: dead, or not started on its loop yet (no transmit buffer). 0: it can. */
static int cannot_send(const Transport *t)
{
        return t->dead ? -ECONNRESET : !t->tx_buf ? -ENOTCONN : 0;
}

static int frame_hdr(Transport *t, uint32_t request_id, size_t body_len, size_t n_fds)
{
        int r = gm_frame_hdr_encode(t->tx_buf, t->version ? t->version : GM_PROTOCOL_VERSION_MIN, request_id,
                                    (uint32_t)body_len, (unsigned)n_fds);
        if (r < 0)
                return r;
        return body_len > GM_FRAME_BODY_MAX ? -EMSGSIZE : 0;
}

/* Send the frame in the transmit buffer (header and body, @len bytes), or queue it. */
static int send_frame(Transport *t, size_t len, int *fds, size_t n_fds)
{
        TransportPacket *p;
        int r;

        if (!t->out_head) {
                r = gm_wire_send(t->fd, t->tx_buf, len, NULL, 0, fds, n_fds, MSG_DONTWAIT);
                if (r != -EAGAIN) {
                        gm_wire_close_fds(fds, n_fds);
                        if (r < 0)
                                fail(t);
                        return r;
                }
        }
        if (t->out_bytes + len > TRANSPORT_OUT_MAX) {
                gm_wire_close_fds(fds, n_fds);
                fail(t);
                return -ENOBUFS;
        }
        p = calloc(1, sizeof(*p));
        if (p)
                p->data = malloc(len);
        if (!p || !p->data) {
                free(p);
                gm_wire_close_fds(fds, n_fds);
                fail(t);
                return -ENOMEM;
        }
        packet_fill(p, t->tx_buf, len, fds, n_fds);
        t->out_bytes += len;
        out_append(t, p);
        if (!t->out_head->hole) {
                if (t->out_head == p)
                        send_timer_restart(t);
                watch(t);
        }
        return 0;
}

/*
 * Pack @reply as a frame in the transmit buffer: the body first, bounded by the frame's limit, then its
 * header. Returns the frame's length; on failure the fds are closed.
 */
static int frame_reply(Transport *t, uint32_t request_id, const Gpumem__Reply *reply, int *fds, size_t n_fds,
                       size_t *ret_len)
{
        size_t body_len = 0;
        int r = cannot_send(t);

        if (r >= 0)
                r = gm_reply_pack_into(reply, t->tx_buf + GM_FRAME_HDR_SIZE, GM_FRAME_BODY_MAX, &body_len);
        if (r >= 0)
                r = frame_hdr(t, request_id, body_len, n_fds);
        if (r < 0) {
                gm_wire_close_fds(fds, n_fds);
                return r;
        }
        *ret_len = GM_FRAME_HDR_SIZE + body_len;
        return 0;
}

int transport_send(Transport *t, uint32_t request_id, const Gpumem__Reply *reply, int *fds, size_t n_fds)
{
        size_t len;
        int r = frame_reply(t, request_id, reply, fds, n_fds, &len);

        return r < 0 ? r : send_frame(t, len, fds, n_fds);
}

int transport_send_packed(Transport *t, uint32_t request_id, const uint8_t *body, size_t body_len)
{
        int r = cannot_send(t);

        if (r < 0)
                return r;
        r = frame_hdr(t, request_id, body_len, 0);
        if (r < 0)
                return r;
        memcpy(t->tx_buf + GM_FRAME_HDR_SIZE, body, body_len);
        return send_frame(t, GM_FRAME_HDR_SIZE + body_len, NULL, 0);
}

int transport_send_error(Transport *t, uint32_t request_id, int code, const char *reason)
{
        Gpumem__Reply reply = GPUMEM__REPLY__INIT;
        Gpumem__Status st = GPUMEM__STATUS__INIT;

        st.has_code = true;
        st.code = code;
        st.reason = (char *)(reason ? reason : "");
        reply.status = &st;
        return transport_send(t, request_id, &reply, NULL, 0);
}

int transport_slot_reserve(Transport *t, TransportPacket **ret)
{
        TransportPacket *p;
        int r = cannot_send(t);

        if (r < 0)
                return r;
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->hole = true;
        out_append(t, p);
        *ret = p;
        return 0;
}

int transport_slot_fill(Transport *t, TransportPacket *slot, uint32_t request_id, const Gpumem__Reply *reply,
                        int *fds, size_t n_fds)
{
        size_t len;
        int r = frame_reply(t, request_id, reply, fds, n_fds, &len);

        if (r < 0)
                return r;
        slot->data = malloc(len);
        if (!slot->data) {
                gm_wire_close_fds(fds, n_fds);
                fail(t);
                return -ENOMEM;
        }
        packet_fill(slot, t->tx_buf, len, fds, n_fds);
        slot->hole = false;
        t->out_bytes += slot->len;
        if (t->out_head == slot) {
                send_timer_restart(t);
                if (flush(t) < 0)
                        fail(t);
        }
        return 0;
}
