/* A client's socket: non-blocking frame I/O with fds, the ordered reply queue, backpressure, send timeout. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem.pb-c.h"
#include "base/loop.h"

/*
 * The transport knows nothing above it: its owner (the connection) hands it callbacks and its limits. It
 * reads one packet per wakeup and gives it to the owner; it sends replies at once or queues them in
 * order, with reply slots for requests that finish later; it stops reading while the owner's in-flight limit
 * is reached and tells the owner when the peer went, when replies stopped moving for the send timeout, and
 * when the queue changed.
 */

typedef struct TransportPacket TransportPacket; /* a queued reply, or a slot for one */

typedef struct TransportOps {
        /* A packet arrived: @buf is the shared receive buffer (valid during the call), @fds are the
         * callee's. */
        void (*packet)(void *owner, const uint8_t *buf, size_t len, int *fds, size_t n_fds);
        /* A packet was refused whole: @err -EMSGSIZE (too large) or -EPROTO (control data truncated or not
         * SCM_RIGHTS); @request_id read from its header, 0 when unreadable. */
        void (*refused)(void *owner, int err, uint32_t request_id);
        /* The peer closed, or the socket failed: the owner ends the connection. */
        void (*closed)(void *owner);
        /* Replies waited unread for the send timeout: the owner drops the client. */
        void (*stalled)(void *owner);
        /* Replies in flight (queued or being made) changed by @delta; @limited: reading stopped at the limit.
         */
        void (*inflight)(void *owner, int delta, bool limited);
        /* Replies the owner may have in flight before reading stops. */
        uint64_t (*inflight_limit)(void *owner);
} TransportOps;

typedef struct Transport {
        const TransportOps *ops;
        void *owner;
        int fd;
        uint8_t *rx_buf, *tx_buf;         /* shared by every transport of the loop, GM_FRAME_MAX each */
        LoopIo io;                        /* the socket, on its loop */
        LoopTimer send_timer;             /* the send timeout, armed while replies wait for the client */
        bool started;                     /* on its loop (transport_start) */
        const uint32_t *send_timeout_sec; /* the owner's setting (0: none), read when the queue moves */
        TransportPacket *out_head, *out_tail;
        size_t out_bytes;
        unsigned out_count; /* replies queued or being made */
        uint16_t version;   /* written in reply headers (0: the newest) */
        bool dead;
        bool paused;             /* not reading (the daemon is stopping) */
        unsigned held;           /* not reading until the owner's work in progress is done (transport_hold) */
        uint8_t read_again_skip; /* replies before the next read straight after one (on_read) */
} Transport;

/*
 * Take @fd (closed by transport_done) without watching it yet: the transport can be stopped and done before
 * transport_start(), which, on the thread of @loop, sets its watcher and timer up and starts reading.
 */
void transport_adopt(Transport *t, int fd, const TransportOps *ops, void *owner);
int transport_start(Transport *t, Loop *loop, uint8_t *rx_buf, uint8_t *tx_buf,
                    const uint32_t *send_timeout_sec);
/* Both at once (@fd is closed by transport_done, also after a failure here). */
int transport_init(Transport *t, Loop *loop, int fd, uint8_t *rx_buf, uint8_t *tx_buf,
                   const uint32_t *send_timeout_sec, const TransportOps *ops, void *owner);
/* Close the socket, drop what is queued (the owner is told of the in-flight change), free the events. */
void transport_done(Transport *t);
/* Dead: nothing more is read, written or timed. What the peer sent and was not read is consumed first, so
 * that the close does not reset the connection before the peer read the last reply. */
void transport_stop(Transport *t);
/* Stop or resume reading. */
void transport_pause(Transport *t, bool paused);
/* Hold reading (nested) while the owner works on a request, so that its next request waits for it. */
void transport_hold(Transport *t);
void transport_release(Transport *t);
/* Nothing queued or being made. */
bool transport_idle(const Transport *t);

/* Send a reply; takes @fds (closed once sent, or on failure). -EMSGSIZE: too large for a frame. A queue
 * over 1 MiB, or an allocation failure, stops the transport and reports it closed. */
int transport_send(Transport *t, uint32_t request_id, const Gpumem__Reply *reply, int *fds, size_t n_fds);
/* Send a reply packed earlier (a Reply body, no fds). */
int transport_send_packed(Transport *t, uint32_t request_id, const uint8_t *body, size_t body_len);
int transport_send_error(Transport *t, uint32_t request_id, int code, const char *reason);

/* A place in the reply order for a reply made later; counted in flight. */
int transport_slot_reserve(Transport *t, TransportPacket **ret);
/* Put the reply in its slot, and send what can go. Takes @fds. */
int transport_slot_fill(Transport *t, TransportPacket *slot, uint32_t request_id, const Gpumem__Reply *reply,
                        int *fds, size_t n_fds);
