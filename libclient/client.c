/* libgpumem_client core: connect and handshake, thread-safe request/reply demultiplexing, errors. */
#include "client-private.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define WINDOW_RETRIES 4

/*
 * Requests up to this size are built on the caller's stack, larger ones in a malloc'd buffer. Every request
 * whose size the API bounds fits with room to spare (the largest, 65 access descriptors, packs to under
 * 700 bytes); only one carrying a long string of the caller's (a client or class name) is bigger. 2 KiB
 * is little beside any thread's stack.
 */
#define SEND_STACK_MAX 2048

struct Pending {
        Pending *next;
        uint32_t id;
        size_t len;
        size_t n_fds;
        int fds[GM_FRAME_MAX_FDS];
        uint8_t data[];
};

static ErrSlot *err_slot(gm_client *c)
{
        pthread_t self = pthread_self();
        ErrSlot *s;

        for (size_t i = 0; i < GM_ERR_SLOTS; i++)
                if (c->errs[i].used && pthread_equal(c->errs[i].tid, self))
                        return &c->errs[i];
        s = &c->errs[c->next_err_slot];
        c->next_err_slot = (c->next_err_slot + 1) % GM_ERR_SLOTS;
        s->used = true;
        s->tid = self;
        s->reason[0] = '\0';
        return s;
}

int gm_set_reason(gm_client *c, int err, const char *fmt, ...)
{
        ErrSlot *s;
        va_list ap;

        if (!c)
                return err;
        pthread_mutex_lock(&c->lock);
        s = err_slot(c);
        va_start(ap, fmt);
        vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
        va_end(ap);
        pthread_mutex_unlock(&c->lock);
        return err;
}

const char *gm_strerror(gm_client *c, int err, char *buf, size_t len)
{
        char reason[sizeof(((ErrSlot *)0)->reason)] = "";

        if (!buf || len == 0)
                return buf;
        if (c) {
                pthread_mutex_lock(&c->lock);
                pthread_t self = pthread_self();
                for (size_t i = 0; i < GM_ERR_SLOTS; i++)
                        if (c->errs[i].used && pthread_equal(c->errs[i].tid, self))
                                snprintf(reason, sizeof(reason), "%s", c->errs[i].reason);
                pthread_mutex_unlock(&c->lock);
        }
        if (err >= 0)
                snprintf(buf, len, "Success");
        else if (reason[0])
                snprintf(buf, len, "%s: %s", strerror(-err), reason);
        else
                snprintf(buf, len, "%s", strerror(-err));
        return buf;
}

/* The connection is unusable from now on; every waiting and later call fails with @err. Lock held. */
/* A thread in a long wait (wait_long): its eventfd, on its stack while it waits. */
typedef struct LongWaiter {
        int efd;
        bool kick_only; /* asleep on its eventfd alone (the role was held), not on the socket */
        struct LongWaiter *next;
} LongWaiter;

/* Wake the threads in a long wait but @self to look again: all of them (@all: a reply may wait for them in
 * the list, or the connection broke), else those asleep on their eventfd alone. Lock held. */
static void kick_long_locked(gm_client *c, const LongWaiter *self, bool all)
{
        const uint64_t one = 1;

        for (LongWaiter *w = c->long_waiters; w; w = w->next)
                if (w != self && (all || w->kick_only))
                        (void)!write(w->efd, &one, sizeof(one));
}

static void mark_broken_locked(gm_client *c, int err, const char *reason)
{
        if (c->broken)
                return;
        snprintf(c->broken_reason, sizeof(c->broken_reason), "%s", reason);
        /* after its reason: a call that sees it without the lock takes the lock to read that */
        __atomic_store_n(&c->broken, err, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&c->cond);
        kick_long_locked(c, NULL, true);
}

static void pending_free(Pending *p)
{
        gm_wire_close_fds(p->fds, p->n_fds);
        free(p);
}

static void mark_broken(gm_client *c, int err, const char *reason)
{
        pthread_mutex_lock(&c->lock);
        mark_broken_locked(c, err, reason);
        pthread_mutex_unlock(&c->lock);
}

static void *arena_alloc_cb(void *arena, size_t size)
{
        return arena_alloc(arena, size);
}

static void arena_free_cb(void *arena, void *p)
{
        arena_free(arena, p);
}

/* A free reply arena, made when every one made is in use and the pool has room; -1 if none. Lock held. */
static int arena_take_locked(gm_client *c)
{
        unsigned i;

        /* a bit found clear stays clear: only takers, who hold the lock, set bits */
        uint32_t busy = __atomic_load_n(&c->arenas_busy, __ATOMIC_ACQUIRE);

        for (i = 0; i < c->n_arenas; i++)
                if (!(busy & (1u << i)))
                        break;
        if (i == GM_REPLY_ARENAS)
                return -1;
        if (i == c->n_arenas) {
                if (arena_init(&c->arenas[i], GM_REPLY_ARENA_SIZE) < 0)
                        return -1;
                /* after the arena is made: gm_reply_free() looks at arenas below it without the lock */
                __atomic_store_n(&c->n_arenas, i + 1, __ATOMIC_RELEASE);
        }
        __atomic_fetch_or(&c->arenas_busy, 1u << i, __ATOMIC_RELAXED);
        return (int)i;
}

/* Forget what arena @i holds and give it back to the pool: its holder alone touches it, no lock needed. */
static void arena_give_back(gm_client *c, unsigned i)
{
        arena_reset(&c->arenas[i]);
        /* release: whoever takes it next sees it reset */
        __atomic_fetch_and(&c->arenas_busy, ~(1u << i), __ATOMIC_RELEASE);
}

/* Decode a reply body into arena @i (taken for it, or -1 to decode with malloc). Free with
 * gm_reply_free(); the arena is given back here when decoding fails. */
static Gpumem__Reply *reply_unpack(gm_client *c, int i, const uint8_t *body, size_t len)
{
        Gpumem__Reply *reply;

        if (i < 0)
                return gm_reply_unpack_result(NULL, body, len, &reply)
                               ? reply
                               : gpumem__reply__unpack(NULL, len, body);
        ProtobufCAllocator alloc = {arena_alloc_cb, arena_free_cb, &c->arenas[i]};
        if (!gm_reply_unpack_result(&alloc, body, len, &reply))
                reply = gpumem__reply__unpack(&alloc, len, body);
        if (!reply) /* what it had spilled into malloc it freed already */
                arena_give_back(c, (unsigned)i);
        return reply;
}

void gm_reply_free(gm_client *c, Gpumem__Reply *reply)
{
        const uint8_t *p = (const uint8_t *)reply;
        Arena *a = NULL;
        unsigned i, n;

        if (!reply)
                return;
        n = __atomic_load_n(&c->n_arenas, __ATOMIC_ACQUIRE);
        /* A reply decoded in an arena begins in it: protobuf-c allocates the top message first. The arenas
         * made never move, and the one holding this reply is the caller's: no lock. */
        for (i = 0; i < n; i++) {
                if (p >= c->arenas[i].buf && p < c->arenas[i].buf + c->arenas[i].cap) {
                        a = &c->arenas[i];
                        break;
                }
        }
        if (a && !a->spilled) { /* the common case: all of it in the arena, nothing to walk */
                arena_give_back(c, i);
                return;
        }
        if (!a) { /* decoded while every arena was in use */
                gpumem__reply__free_unpacked(reply, NULL);
                return;
        }
        /* the arena's free() frees only what went beyond it, into malloc */
        ProtobufCAllocator alloc = {arena_alloc_cb, arena_free_cb, a};
        gpumem__reply__free_unpacked(reply, &alloc);
        arena_give_back(c, i);
}

/* A received frame's header as gm_frame_parse() read it, and what that said (0: a sound frame). */
typedef struct RxFrame {
        GmFrameHdr hdr; /* request_id 0 when the packet is too short to have one */
        int err;
} RxFrame;

/*
 * Receive one packet into the receive buffer (we are the reader, lock not held), its fds into @fds and
 * its parsed header into @ret_f. Returns its length, -EAGAIN when @flags has MSG_DONTWAIT and nothing is
 * there, or another negative errno after marking the connection broken. The packet stays valid until the
 * reading role is given up.
 */
static ssize_t read_one(gm_client *c, int flags, int *fds, size_t *ret_n_fds, RxFrame *ret_f)
{
        ssize_t n;

        *ret_n_fds = 0;
        n = gm_wire_recv(c->fd, c->rxbuf, GM_FRAME_MAX, fds, ret_n_fds, flags);
        if (n == -ECONNRESET) {
                /* The daemon hung up with our request unread: the kernel reports the reset first, then still
                 * delivers what the daemon sent before (its reason, in a connection-error frame). */
                n = gm_wire_recv(c->fd, c->rxbuf, GM_FRAME_MAX, fds, ret_n_fds, MSG_DONTWAIT);
                if (n == -EAGAIN || n == 0)
                        n = -ECONNRESET;
        }
        if (n == -EAGAIN)
                return n;
        if (n == 0) {
                mark_broken(c, -ECONNRESET, "gpumemd closed the connection");
                return -ECONNRESET;
        }
        if (n < 0) {
                if (n == -EMSGSIZE || n == -EPROTO)
                        mark_broken(c, -EPROTO, "malformed packet from gpumemd");
                else
                        mark_broken(c, (int)n, "cannot receive from gpumemd");
                return n;
        }
        /* parsed once, here: its id picks the thread it answers, which decodes it with this header */
        memset(&ret_f->hdr, 0, sizeof(ret_f->hdr));
        ret_f->err = gm_frame_parse(c->rxbuf, (size_t)n, *ret_n_fds, GM_PROTOCOL_VERSION, &ret_f->hdr, NULL);
        if ((size_t)n < GM_FRAME_HDR_SIZE)
                ret_f->hdr.request_id = 0;
        return n;
}

/* A frame with request id 0 is a connection-level error: the daemon is about to close. */
static void connection_error(gm_client *c, const uint8_t *data, size_t len, int *fds, size_t n_fds)
{
        Gpumem__Reply *reply = NULL;
        GmFrameHdr h;

        if (gm_frame_parse(data, len, n_fds, GM_PROTOCOL_VERSION, &h, NULL) == 0) {
                int i;
                pthread_mutex_lock(&c->lock);
                i = arena_take_locked(c);
                pthread_mutex_unlock(&c->lock);
                reply = reply_unpack(c, i, data + GM_FRAME_HDR_SIZE, h.body_len);
        }
        pthread_mutex_lock(&c->lock);
        if (reply && reply->status && reply->status->code < 0)
                mark_broken_locked(c, reply->status->code,
                                   reply->status->reason ? reply->status->reason : "connection error");
        else
                mark_broken_locked(c, -EPROTO, "malformed connection error from gpumemd");
        pthread_mutex_unlock(&c->lock);
        gm_reply_free(c, reply);
        gm_wire_close_fds(fds, n_fds);
}

/*
 * The packet the reader just received answers another thread, or the connection: keep a copy for that
 * thread, as the receive buffer holds the next packet once the reader lets go. This is the uncommon case
 * (several threads calling at once); the reader's own reply is decoded in place.
 */
static void dispatch_other(gm_client *c, size_t len, int *fds, size_t n_fds, uint32_t id)
{
        Pending *p;

        if (id == 0) {
                connection_error(c, c->rxbuf, len, fds, n_fds);
                return;
        }
        p = malloc(sizeof(*p) + len);
        if (!p) {
                gm_wire_close_fds(fds, n_fds);
                mark_broken(c, -ENOMEM, "out of memory receiving a reply");
                return;
        }
        p->id = id;
        p->len = len;
        p->n_fds = n_fds;
        memcpy(p->fds, fds, n_fds * sizeof(int));
        memcpy(p->data, c->rxbuf, len);
        pthread_mutex_lock(&c->lock);
        p->next = c->pending;
        c->pending = p;
        /* before the reading role is given back: whoever takes it next sees the reply is here */
        __atomic_store_n(&c->n_pending, c->n_pending + 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&c->lock);
}

/* Where a reply goes: decoded by protobuf-c into a Reply (fn NULL), or read in place by @fn (gm_call_view).
 */
typedef struct Sink {
        GmViewFn fn;
        void *ctx;
        uint32_t want;
} Sink;

/* The reply in @body read in place for @sink (see gm_call_view); the reason is recorded on failure. */
static int view_reply(gm_client *c, const Sink *sink, const uint8_t *body, size_t len)
{
        GmReplyView v;
        int r = gm_reply_view(body, len, sink->want, &v);

        if (r < 0 || !v.has_code)
                return gm_set_reason(c, -EPROTO, "undecodable reply from gpumemd");
        if (v.code < 0) {
                gm_set_reason(c, v.code, "%.*s", (int)(v.reason_len < 256 ? v.reason_len : 256),
                              v.reason ? v.reason : "");
                return v.code;
        }
        if (!v.has_result)
                return gm_set_reason(c, -EPROTO, "gpumemd replied with an unexpected result");
        return sink->fn(c, sink->ctx, v.result, v.result_len);
}

/*
 * Decode the reply frame in @data (the receive buffer while we still read, or a Pending's copy) into arena
 * @arena (-1: malloc), or read it in place for @sink's function, with its header @f as the reader parsed it
 * (NULL: parse it here), and hand its fds to the caller if asked, else close them. The arena is the reply's,
 * or given back on failure; on failure the reason is recorded for this thread.
 */
static int take_reply(gm_client *c, const Sink *sink, int arena, const uint8_t *data, size_t len,
                      const RxFrame *f, int *fds, size_t n_fds, Gpumem__Reply **ret_reply, int *ret_fds,
                      size_t *ret_n_fds)
{
        Gpumem__Reply *reply = NULL;
        RxFrame parsed;
        int r;

        if (!f) {
                parsed.err = gm_frame_parse(data, len, n_fds, GM_PROTOCOL_VERSION, &parsed.hdr, NULL);
                f = &parsed;
        }
        if (f->err < 0) {
                if (arena >= 0)
                        arena_give_back(c, (unsigned)arena);
                r = gm_set_reason(c, -EPROTO, "malformed reply frame from gpumemd");
                goto fail;
        }
        if (sink) {
                /* a view op takes no fds: any that came are closed */
                gm_wire_close_fds(fds, n_fds);
                return view_reply(c, sink, data + GM_FRAME_HDR_SIZE, f->hdr.body_len);
        }
        reply = reply_unpack(c, arena, data + GM_FRAME_HDR_SIZE, f->hdr.body_len);
        if (!reply || !reply->status || !reply->status->has_code) {
                r = gm_set_reason(c, -EPROTO, "undecodable reply from gpumemd");
                goto fail;
        }
        if (reply->status->code < 0) {
                r = reply->status->code;
                gm_set_reason(c, r, "%s", reply->status->reason ? reply->status->reason : "");
                goto fail;
        }
        if (ret_fds && ret_n_fds) {
                memcpy(ret_fds, fds, n_fds * sizeof(int));
                *ret_n_fds = n_fds;
        } else {
                gm_wire_close_fds(fds, n_fds);
        }
        *ret_reply = reply;
        return 0;

fail:
        gm_reply_free(c, reply);
        gm_wire_close_fds(fds, n_fds);
        return r;
}

/* Take the reading role if nobody holds it: true when taken. */
static bool reading_take(gm_client *c)
{
        uint32_t idle = 0;

        return __atomic_compare_exchange_n(&c->reading, &idle, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Give the reading role back, and wake the threads waiting for it or for a reply it may have left them.
 * Lock held (@locked) or not: without it, the waiters are counted after the role is seen taken and
 * before they wait (under the lock), so one of the two sides sees the other (both are sequentially
 * consistent), and a wake-up is not lost. */
static void reading_give_back_from(gm_client *c, bool locked, const LongWaiter *self)
{
        __atomic_store_n(&c->reading, 0, __ATOMIC_SEQ_CST);
        /* a thread alone on its connection (the common case) has nobody to wake; a long waiter counted
         * itself before it looked at the role, so one of the two sides sees the other */
        bool cond = __atomic_load_n(&c->waiters, __ATOMIC_SEQ_CST) != 0;
        unsigned n_long = __atomic_load_n(&c->n_long, __ATOMIC_SEQ_CST);
        if (!cond && (n_long == 0 || (n_long == 1 && self)))
                return;
        if (!locked)
                pthread_mutex_lock(&c->lock);
        if (cond)
                pthread_cond_broadcast(&c->cond);
        /* A long waiter must hear of a reply kept for it. One asleep on its eventfd alone must also be told
         * that nobody reads any more; while other replies are awaited, the last of them tells it
         * (wait_reply), so that it does not wake at every one. */
        if (c->n_pending || !__atomic_load_n(&c->n_short, __ATOMIC_SEQ_CST))
                kick_long_locked(c, self, c->n_pending != 0);
        if (!locked)
                pthread_mutex_unlock(&c->lock);
}

static void reading_give_back(gm_client *c, bool locked)
{
        reading_give_back_from(c, locked, NULL);
}

/*
 * Read one packet as the reader: decode it when it is the reply to @id (1, the result in *@ret), else keep
 * it for the thread it answers (0). The receive buffer is the reader's alone.
 */
static int read_as_reader(gm_client *c, uint32_t id, const Sink *sink, int arena, Gpumem__Reply **ret_reply,
                          int *ret_fds, size_t *ret_n_fds, int *ret)
{
        int fds[GM_FRAME_MAX_FDS];
        size_t n_fds = 0;
        RxFrame f;
        ssize_t n = read_one(c, 0, fds, &n_fds, &f);

        if (n > 0 && f.hdr.request_id == id) {
                *ret = take_reply(c, sink, arena, c->rxbuf, (size_t)n, &f, fds, n_fds, ret_reply, ret_fds,
                                  ret_n_fds);
                return 1;
        }
        if (n > 0)
                dispatch_other(c, (size_t)n, fds, n_fds, f.hdr.request_id);
        return 0; /* not ours, or the connection broke (recorded: the slow way reports it) */
}

/* The reply to @id if another thread kept it for us: taken out of the list. Lock held. */
static Pending *pending_take_locked(gm_client *c, uint32_t id)
{
        for (Pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
                if ((*pp)->id == id) {
                        Pending *p = *pp;
                        *pp = p->next;
                        __atomic_store_n(&c->n_pending, c->n_pending - 1, __ATOMIC_RELEASE);
                        return p;
                }
        }
        return NULL;
}

/*
 * Wait for the reply to a request that may take long (an event wait): as wait_reply, but asleep in poll()
 * rather than in recvmsg() and without the reading role. A thread asleep in recvmsg() receives every
 * packet that comes, so each reply to another thread would cost that thread a second wake-up (this one
 * receives it, then wakes it); asleep here, another thread's reply wakes that thread alone. This one
 * takes the role only to read what is there already, and sleeps on the socket while nobody holds the
 * role, else on its eventfd, which the holder writes when it gives the role back.
 */
static int wait_long(gm_client *c, uint32_t id, int efd, Gpumem__Reply **ret_reply, int *ret_fds,
                     size_t *ret_n_fds)
{
        LongWaiter self = {.efd = efd};
        int arena = -1, r = 0;
        bool done = false;

        pthread_mutex_lock(&c->lock);
        self.next = c->long_waiters;
        c->long_waiters = &self;
        /* counted before the role is looked at: whoever gives it back sees us (reading_give_back_from) */
        __atomic_store_n(&c->n_long, c->n_long + 1, __ATOMIC_SEQ_CST);
        arena = arena_take_locked(c);
        while (!done) {
                Pending *p = pending_take_locked(c, id);
                struct pollfd pf[2] = {{.fd = self.efd, .events = POLLIN}, {.fd = c->fd, .events = POLLIN}};
                nfds_t n_pf = 1;
                uint64_t drained;

                if (p) {
                        pthread_mutex_unlock(&c->lock);
                        r = take_reply(c, NULL, arena, p->data, p->len, NULL, p->fds, p->n_fds, ret_reply,
                                       ret_fds, ret_n_fds);
                        free(p);
                        arena = -1;
                        pthread_mutex_lock(&c->lock);
                        break;
                }
                if (c->broken) {
                        ErrSlot *s = err_slot(c);
                        snprintf(s->reason, sizeof(s->reason), "%s", c->broken_reason);
                        r = c->broken;
                        break;
                }
                /* while other replies are awaited, their waiters read (and the last one kicks us) */
                if (!__atomic_load_n(&c->n_short, __ATOMIC_SEQ_CST) && reading_take(c)) {
                        self.kick_only = false; /* it will watch the socket */
                        pthread_mutex_unlock(&c->lock);
                        /* what is there already, without sleeping in recvmsg() */
                        for (;;) {
                                int fds[GM_FRAME_MAX_FDS];
                                size_t n_fds = 0;
                                RxFrame f;
                                ssize_t n = read_one(c, MSG_DONTWAIT, fds, &n_fds, &f);

                                if (n <= 0)
                                        break; /* nothing more, or broken (seen above next time) */
                                if (f.hdr.request_id == id) {
                                        r = take_reply(c, NULL, arena, c->rxbuf, (size_t)n, &f, fds, n_fds,
                                                       ret_reply, ret_fds, ret_n_fds);
                                        arena = -1;
                                        done = true;
                                        break;
                                }
                                dispatch_other(c, (size_t)n, fds, n_fds, f.hdr.request_id);
                        }
                        reading_give_back_from(c, false, &self);
                        if (done || __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE)) {
                                pthread_mutex_lock(&c->lock);
                                continue;
                        }
                        n_pf = 2; /* nobody reads: sleep on the socket too */
                } else {
                        /* the role's holder kicks us when it gives it back, or the last other waiter */
                        self.kick_only = true;
                        pthread_mutex_unlock(&c->lock);
                }
                /* a kick or a packet; a role given back meanwhile has kicked us, a kept reply too */
                (void)poll(pf, n_pf, -1);
                while (read(self.efd, &drained, sizeof(drained)) > 0)
                        ;
                pthread_mutex_lock(&c->lock);
        }
        for (LongWaiter **pw = &c->long_waiters; *pw; pw = &(*pw)->next) {
                if (*pw == &self) {
                        *pw = self.next;
                        break;
                }
        }
        __atomic_store_n(&c->n_long, c->n_long - 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&c->lock);
        if (arena >= 0)
                arena_give_back(c, (unsigned)arena);
        close(efd);
        return r;
}

/*
 * Wait for the reply to @id and decode it: one thread reads at a time and hands others their replies.
 * The reader that receives its own reply decodes it from the receive buffer before it lets another
 * thread read, so the common case copies nothing. A view call (@sink) alone on its connection, with
 * nothing pending, reads without the lock.
 */
static int wait_short(gm_client *c, uint32_t id, const Sink *sink, Gpumem__Reply **ret_reply, int *ret_fds,
                      size_t *ret_n_fds)
{
        /* the arena the reply will be decoded into, taken while the lock is held anyway (a view needs none)
         */
        int arena = -1, r = 0;

        if (sink && !__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) && reading_take(c)) {
                /* a reply another reader kept for us before we took the role: the slow way finds it */
                bool mine = !__atomic_load_n(&c->n_pending, __ATOMIC_ACQUIRE) &&
                            read_as_reader(c, id, sink, -1, ret_reply, ret_fds, ret_n_fds, &r);
                reading_give_back(c, false);
                if (mine)
                        return r;
        }
        pthread_mutex_lock(&c->lock);
        for (;;) {
                bool mine;

                if (arena < 0 && !sink)
                        arena = arena_take_locked(c);
                for (Pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
                        if ((*pp)->id == id) {
                                Pending *p = *pp;
                                *pp = p->next;
                                __atomic_store_n(&c->n_pending, c->n_pending - 1, __ATOMIC_RELEASE);
                                pthread_mutex_unlock(&c->lock);
                                r = take_reply(c, sink, arena, p->data, p->len, NULL, p->fds, p->n_fds,
                                               ret_reply, ret_fds, ret_n_fds);
                                free(p); /* its fds were handed over or closed */
                                return r;
                        }
                }
                if (c->broken) {
                        int err = c->broken;
                        ErrSlot *s = err_slot(c);
                        snprintf(s->reason, sizeof(s->reason), "%s", c->broken_reason);
                        pthread_mutex_unlock(&c->lock);
                        if (arena >= 0)
                                arena_give_back(c, (unsigned)arena);
                        return err;
                }
                if (!reading_take(c)) {
                        /* counted before the role is looked at again: its holder then sees us */
                        __atomic_add_fetch(&c->waiters, 1, __ATOMIC_SEQ_CST);
                        if (__atomic_load_n(&c->reading, __ATOMIC_SEQ_CST))
                                pthread_cond_wait(&c->cond, &c->lock);
                        __atomic_sub_fetch(&c->waiters, 1, __ATOMIC_SEQ_CST);
                        continue;
                }
                pthread_mutex_unlock(&c->lock);
                mine = read_as_reader(c, id, sink, arena, ret_reply, ret_fds, ret_n_fds, &r);
                pthread_mutex_lock(&c->lock);
                reading_give_back(c, true);
                if (mine) {
                        pthread_mutex_unlock(&c->lock);
                        return r;
                }
        }
}

/* Wait for the reply to @id: a long wait (@long_wait) apart from the others (wait_long). */
static int wait_reply(gm_client *c, uint32_t id, const Sink *sink, bool long_wait, Gpumem__Reply **ret_reply,
                      int *ret_fds, size_t *ret_n_fds)
{
        int r;

        if (long_wait && !sink) {
                int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
                if (efd >= 0) /* else the ordinary way, which is correct too */
                        return wait_long(c, id, efd, ret_reply, ret_fds, ret_n_fds);
        }
        __atomic_add_fetch(&c->n_short, 1, __ATOMIC_SEQ_CST);
        r = wait_short(c, id, sink, ret_reply, ret_fds, ret_n_fds);
        /* the last one out tells the long waiters asleep on their eventfds that nobody reads now; they
         * counted themselves before they looked at n_short, so one of the two sides sees the other */
        if (__atomic_sub_fetch(&c->n_short, 1, __ATOMIC_SEQ_CST) == 0 &&
            __atomic_load_n(&c->n_long, __ATOMIC_SEQ_CST)) {
                pthread_mutex_lock(&c->lock);
                kick_long_locked(c, NULL, c->n_pending != 0);
                pthread_mutex_unlock(&c->lock);
        }
        return r;
}

/*
 * Send the request framed in @buf (its body, @len bytes, after the header's room) with @fds, under a new id,
 * then wait for its reply as @sink says.
 */
static int send_and_wait(gm_client *c, uint8_t *buf, size_t len, const int *fds, size_t n_fds,
                         const Sink *sink, bool long_wait, Gpumem__Reply **ret_reply, int *ret_fds,
                         size_t *ret_n_fds)
{
        uint32_t id;
        int r;

        if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE)) {
                pthread_mutex_lock(&c->lock);
                r = c->broken;
                ErrSlot *s = err_slot(c);
                snprintf(s->reason, sizeof(s->reason), "%s", c->broken_reason);
                pthread_mutex_unlock(&c->lock);
                return r;
        }
        id = __atomic_add_fetch(&c->next_id, 1, __ATOMIC_RELAXED);
        if (id == 0) /* 0 is the daemon's connection-error id */
                id = __atomic_add_fetch(&c->next_id, 1, __ATOMIC_RELAXED);

        /* Until hello has agreed on a version, the oldest one frames the request: a daemon of any version
         * can read the hello, which names the newest this library speaks. */
        (void)gm_frame_hdr_encode(
                buf, c->protocol_version ? (uint16_t)c->protocol_version : GM_PROTOCOL_VERSION_MIN, id,
                (uint32_t)len, (unsigned)n_fds);
        /* no lock: a SOCK_SEQPACKET send is one record whole, whichever threads send at once */
        r = gm_wire_send(c->fd, buf, GM_FRAME_HDR_SIZE + len, NULL, 0, fds, n_fds, 0);
        if (r < 0) {
                /* The daemon may have said why it hung up (a frame with id 0 still queued): prefer that. */
                pthread_mutex_lock(&c->lock);
                if (reading_take(c)) {
                        int in_fds[GM_FRAME_MAX_FDS];
                        size_t n_in = 0;
                        RxFrame f;
                        ssize_t n;

                        pthread_mutex_unlock(&c->lock);
                        while ((n = read_one(c, MSG_DONTWAIT, in_fds, &n_in, &f)) > 0)
                                dispatch_other(c, (size_t)n, in_fds, n_in, f.hdr.request_id);
                        pthread_mutex_lock(&c->lock);
                        reading_give_back(c, true); /* the waiters are woken by it and by mark_broken */
                }
                mark_broken_locked(c, r == -EPIPE ? -ECONNRESET : r, "cannot send to gpumemd");
                pthread_mutex_unlock(&c->lock);
        }
        return wait_reply(c, id, sink, long_wait, ret_reply, ret_fds, ret_n_fds);
}

/* One request/reply round trip of @req (see gm_request_fds). */
static int call(gm_client *c, Gpumem__Request *req, const int *fds, size_t n_fds, Gpumem__Reply **ret_reply,
                int *ret_fds, size_t *ret_n_fds)
{
        uint8_t stack_buf[SEND_STACK_MAX];
        uint8_t *buf = stack_buf;
        size_t len;
        int r;

        if (n_fds > GM_FRAME_MAX_FDS)
                return gm_set_reason(c, -E2BIG, "more than %u fds in one request", GM_FRAME_MAX_FDS);
        /* packed on the stack when it fits (nearly every request), else in a buffer of its size */
        if (gm_request_pack_into(req, buf + GM_FRAME_HDR_SIZE, sizeof(stack_buf) - GM_FRAME_HDR_SIZE, &len) <
            0) {
                len = gpumem__request__get_packed_size(req);
                if (len > GM_FRAME_BODY_MAX)
                        return gm_set_reason(c, -EMSGSIZE, "request larger than the maximum frame size");
                buf = malloc(GM_FRAME_HDR_SIZE + len);
                if (!buf)
                        return gm_set_reason(c, -ENOMEM, "out of memory");
                (void)gm_request_pack_into(req, buf + GM_FRAME_HDR_SIZE, len, &len);
        }
        /* an event wait that may block: asleep apart from the socket's other replies (wait_long) */
        bool long_wait = req->op_case == GPUMEM__REQUEST__OP_EVENT_WAIT && req->event_wait &&
                         (!req->event_wait->has_timeout_ms || req->event_wait->timeout_ms != 0);
        r = send_and_wait(c, buf, len, fds, n_fds, NULL, long_wait, ret_reply, ret_fds, ret_n_fds);
        if (buf != stack_buf)
                free(buf);
        return r;
}

int gm_request_fds(gm_client *c, uint32_t op, const void *msg, const int *fds, size_t n_fds, uint32_t want,
                   Gpumem__Reply **ret_reply, int *ret_fds, size_t *ret_n_fds)
{
        const ProtobufCFieldDescriptor *f = gm_proto_field(&gpumem__request__descriptor, op);
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Reply *reply = NULL;
        size_t n = 0;
        int r;

        /* the member for @op is the Request's field of that number, where its descriptor says, and it
         * takes the message of one type */
        if (!f || !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || f->type != PROTOBUF_C_TYPE_MESSAGE || !msg ||
            ((const ProtobufCMessage *)msg)->descriptor != f->descriptor)
                return gm_set_reason(c, -EINVAL, "request %u: no such op, or not its message", op);
        req.op_case = (Gpumem__Request__OpCase)op;
        memcpy((uint8_t *)&req + f->offset, &msg, sizeof(msg));
        r = call(c, &req, fds, n_fds, &reply, ret_fds, ret_fds ? &n : NULL);
        if (r < 0)
                return r;
        if (want != GM_ANY_RESULT && reply->result_case != want) {
                gm_wire_close_fds(ret_fds, n);
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd replied with an unexpected result");
        }
        if (ret_n_fds)
                *ret_n_fds = n;
        if (ret_reply)
                *ret_reply = reply;
        else
                gm_reply_free(c, reply);
        return 0;
}

int gm_request_take(gm_client *c, uint32_t op, const void *msg, uint32_t want, GmTakeFn fn, void *ctx)
{
        const ProtobufCFieldDescriptor *f = gm_proto_field(&gpumem__reply__descriptor, want);
        Gpumem__Reply *reply = NULL;
        int r;

        if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE)
                return gm_set_reason(c, -EINVAL, "result %u: no such result", want);
        r = gm_request(c, op, msg, want, &reply);
        if (r < 0)
                return r;
        /* the result member, where the Reply's descriptor says it lies */
        r = fn(c, *(const void *const *)((const uint8_t *)reply + f->offset), ctx);
        gm_reply_free(c, reply);
        return r;
}

/* Field 1 of messages of @d, when it is one optional number (the form gm_request_num and gm_take_num know).
 */
static const ProtobufCFieldDescriptor *number_one(const ProtobufCMessageDescriptor *d)
{
        const ProtobufCFieldDescriptor *f = gm_proto_field(d, 1);

        if (!f || f->label != PROTOBUF_C_LABEL_OPTIONAL || !f->quantifier_offset)
                return NULL;
        switch (f->type) {
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_ENUM:
        case PROTOBUF_C_TYPE_BOOL:
                return f;
        default:
                return NULL;
        }
}

int gm_take_num(gm_client *c, const void *result, void *ctx)
{
        const ProtobufCMessage *m = result;
        const ProtobufCFieldDescriptor *f = number_one(m->descriptor);
        const uint8_t *at = (const uint8_t *)m + (f ? f->offset : 0);

        if (!f)
                return gm_set_reason(c, -EINVAL, "%s: not a result of one number", m->descriptor->name);
        if (f->type == PROTOBUF_C_TYPE_UINT64)
                *(uint64_t *)ctx = *(const uint64_t *)at;
        else if (f->type == PROTOBUF_C_TYPE_ENUM) /* an int, as protobuf-c keeps enums */
                *(uint64_t *)ctx = (uint64_t)(int64_t)(*(const int *)at);
        else if (f->type == PROTOBUF_C_TYPE_UINT32)
                *(uint64_t *)ctx = *(const uint32_t *)at;
        else
                *(uint64_t *)ctx = *(const protobuf_c_boolean *)at != 0;
        return 0;
}

/* Op @op's message made here from its descriptor, with field 1 set to *@num if given, then sent as
 * gm_request_num() says. */
static int request_small(gm_client *c, uint32_t op, const uint64_t *num, uint32_t want, GmTakeFn fn,
                         void *ctx)
{
        const ProtobufCFieldDescriptor *f = gm_proto_field(&gpumem__request__descriptor, op), *nf = NULL;
        const ProtobufCMessageDescriptor *d = f && f->type == PROTOBUF_C_TYPE_MESSAGE ? f->descriptor : NULL;
        union {
                ProtobufCMessage base;
                uint64_t room[8];
        } m;
        uint8_t *at;

        if (d && num)
                nf = number_one(d);
        if (!d || d->sizeof_message > sizeof(m) || (num && (!nf || nf->type == PROTOBUF_C_TYPE_ENUM)))
                return gm_set_reason(c, -EINVAL, "request %u: not an op of one number", op);
        protobuf_c_message_init(d, &m);
        if (num) {
                at = (uint8_t *)&m + nf->offset;
                if (nf->type == PROTOBUF_C_TYPE_UINT64)
                        *(uint64_t *)at = *num;
                else if (nf->type == PROTOBUF_C_TYPE_UINT32)
                        *(uint32_t *)at = (uint32_t)*num;
                else
                        *(protobuf_c_boolean *)at = *num != 0;
                *(protobuf_c_boolean *)((uint8_t *)&m + nf->quantifier_offset) = 1;
        }
        return fn ? gm_request_take(c, op, &m, want, fn, ctx) : gm_request(c, op, &m, want, NULL);
}

int gm_request_num(gm_client *c, uint32_t op, uint64_t num, uint32_t want, GmTakeFn fn, void *ctx)
{
        return request_small(c, op, &num, want, fn, ctx);
}

int gm_request_none(gm_client *c, uint32_t op, uint32_t want, GmTakeFn fn, void *ctx)
{
        return request_small(c, op, NULL, want, fn, ctx);
}

int gm_call_view(gm_client *c, uint32_t op, const uint8_t *body, size_t len, uint32_t want, GmViewFn fn,
                 void *ctx)
{
        uint8_t buf[GM_FRAME_HDR_SIZE + 16 + GM_VIEW_BODY_MAX];
        Sink sink = {fn, ctx, want};
        size_t n;

        if (len > GM_VIEW_BODY_MAX)
                return gm_set_reason(c, -EMSGSIZE, "request larger than %d bytes", GM_VIEW_BODY_MAX);
        /* the Request: its one op field, as protobuf-c packs it */
        n = gm_pb_put_len(buf + GM_FRAME_HDR_SIZE, op, len);
        memcpy(buf + GM_FRAME_HDR_SIZE + n, body, len);
        return send_and_wait(c, buf, n + len, NULL, 0, &sink, false, NULL, NULL, NULL);
}

static int reserve_window(uint64_t base, uint64_t size)
{
        return map_at(base, size, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
}

static char *dup_or_empty(const char *s)
{
        return strdup(s ? s : "");
}

/* This process's side of the daemon's backend (client-backend.h): the default row until its own opens. */
static int backend_open(gm_client *c)
{
        const GmBackend *b = gm_backend_find(c->backend);
        int r = b->open(c);

        if (r == 0)
                c->bk = b;
        return r;
}

static int handshake(gm_client *c, const char *name, uint64_t window_size, bool low_window)
{
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__HelloReply *h;
        int r;

        hello.has_protocol_version = true;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.has_features = true;
        hello.features = low_window ? GM_HELLO_LOW_WINDOW : 0;
        hello.client_name = (char *)(name ? name : "");
        hello.has_window_size = window_size != 0;
        hello.window_size = window_size;
        /* any result: an unusable one is said so below */
        r = gm_request(c, GPUMEM__REQUEST__OP_HELLO, &hello, GM_ANY_RESULT, &reply);
        if (r < 0)
                return r;
        h = reply->hello;
        if (reply->result_case != GPUMEM__REPLY__RESULT_HELLO || !h || !h->has_window_base ||
            !h->has_window_size || h->protocol_version == 0 || h->protocol_version > GM_PROTOCOL_VERSION) {
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd answered hello with an unusable reply");
        }
        if (low_window && (h->protocol_version < 2 || h->window_base + h->window_size > GM_LOW_WINDOW_END)) {
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EOPNOTSUPP,
                                     "gpumemd (protocol %u) cannot place the VA window below 1 TiB",
                                     h->protocol_version);
        }
        c->protocol_version = h->protocol_version;
        c->client_id = h->client_id;
        c->window_base = h->window_base;
        c->window_size = h->window_size;
        c->kfd_major = h->kfd_major;
        c->kfd_minor = h->kfd_minor;
        c->server_version = dup_or_empty(h->server_version);
        c->backend = dup_or_empty(h->backend);
        gm_reply_free(c, reply);
        if (!c->server_version || !c->backend)
                return gm_set_reason(c, -ENOMEM, "out of memory");

        /* Reserve the same window here; if this process already uses part of it, ask for another. */
        for (int tries = 0;; tries++) {
                Gpumem__WindowRetry wr = GPUMEM__WINDOW_RETRY__INIT;

                r = reserve_window(c->window_base, c->window_size);
                if (r == 0) {
                        c->window_reserved = true;
                        return backend_open(c);
                }
                if (r != -EEXIST || tries >= WINDOW_RETRIES)
                        return gm_set_reason(c, -ENOSPC, "cannot reserve the VA window 0x%llx+0x%llx: %s",
                                             (unsigned long long)c->window_base,
                                             (unsigned long long)c->window_size, strerror(-r));
                wr.has_failed_base = true;
                wr.failed_base = c->window_base;
                r = gm_request(c, GPUMEM__REQUEST__OP_WINDOW_RETRY, &wr, GM_ANY_RESULT, &reply);
                if (r < 0)
                        return r;
                if (!reply->hello || !reply->hello->has_window_base) {
                        gm_reply_free(c, reply);
                        return gm_set_reason(c, -EPROTO, "gpumemd answered a window retry without a window");
                }
                c->window_base = reply->hello->window_base;
                gm_reply_free(c, reply);
        }
}

static gm_client *client_new(void)
{
        gm_client *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        c->fd = -1;
        c->rxbuf = malloc(GM_FRAME_MAX);
        if (!c->rxbuf) {
                free(c);
                return NULL;
        }
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->mem_lock, NULL);
        pthread_cond_init(&c->mem_cond, NULL);
        pthread_cond_init(&c->cond, NULL);
        c->bk = &gm_backend_default;
        return c;
}

int gm_client_connect(const char *socket_path, const char *name, gm_client **ret)
{
        return gm_client_open(socket_path, name, ret, NULL, 0);
}

/* Close a client that failed to connect, keeping its last reason for the caller. */
static int open_failed(gm_client *c, int err, char *errbuf, size_t errlen)
{
        if (errbuf && errlen)
                gm_strerror(c, err, errbuf, errlen);
        gm_client_close(c);
        return err;
}

int gm_client_open(const char *socket_path, const char *name, gm_client **ret, char *errbuf, size_t errlen)
{
        gm_client_options o = {.struct_size = sizeof(o), .socket_path = socket_path, .name = name};

        return gm_client_open_with(&o, ret, errbuf, errlen);
}

int gm_client_open_with(const gm_client_options *o, gm_client **ret, char *errbuf, size_t errlen)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        gm_client_options opts = {0};
        const char *socket_path;
        gm_client *c;
        int r;

        if (errbuf && errlen)
                errbuf[0] = '\0';
        if (!ret || !o || o->struct_size < offsetof(gm_client_options, low_window) + sizeof(bool))
                return open_failed(NULL, -EINVAL, errbuf, errlen);
        memcpy(&opts, o, o->struct_size < sizeof(opts) ? o->struct_size : sizeof(opts));
        socket_path = opts.socket_path;
        if (!socket_path || !*socket_path)
                socket_path = getenv("GPUMEM_SOCKET");
        if (!socket_path || !*socket_path)
                socket_path = GM_DEFAULT_SOCKET;
        if (strlen(socket_path) >= sizeof(sa.sun_path))
                return open_failed(NULL, -ENAMETOOLONG, errbuf, errlen);
        strcpy(sa.sun_path, socket_path);

        c = client_new();
        if (!c)
                return open_failed(NULL, -ENOMEM, errbuf, errlen);
        c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (c->fd < 0)
                return open_failed(c, -errno, errbuf, errlen);
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                return open_failed(c, -errno, errbuf, errlen);
        r = handshake(c, opts.name, opts.window_size, opts.low_window);
        if (r < 0)
                return open_failed(c, r, errbuf, errlen);
        *ret = c;
        return 0;
}

void gm_client_close(gm_client *c)
{
        if (!c)
                return;
        if (c->fd >= 0)
                close(c->fd);
        if (c->window_reserved)
                munmap((void *)(uintptr_t)c->window_base, c->window_size);
        while (c->pending) {
                Pending *p = c->pending;
                c->pending = p->next;
                pending_free(p);
        }
        {
                size_t it = 0;
                void *e;
                while (hashmap_next(&c->allocs, &it, NULL, &e))
                        free(e);
                hashmap_done(&c->allocs);
        }
        gm_shares_done(c);
        c->bk->close(c);
        pthread_cond_destroy(&c->mem_cond);
        pthread_mutex_destroy(&c->mem_lock);
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        free(c->server_version);
        free(c->backend);
        for (unsigned i = 0; i < c->n_arenas; i++)
                arena_done(&c->arenas[i]);
        free(c->rxbuf);
        free(c);
}

uint64_t gm_client_id(const gm_client *c)
{
        return c->client_id;
}

void gm_client_window(const gm_client *c, uint64_t *ret_base, uint64_t *ret_size)
{
        if (ret_base)
                *ret_base = c->window_base;
        if (ret_size)
                *ret_size = c->window_size;
}

const char *gm_client_server_version(const gm_client *c)
{
        return c->server_version;
}

const char *gm_client_backend(const gm_client *c)
{
        return c->backend;
}

void gm_client_kfd_version(const gm_client *c, uint32_t *ret_major, uint32_t *ret_minor)
{
        if (ret_major)
                *ret_major = c->kfd_major;
        if (ret_minor)
                *ret_minor = c->kfd_minor;
}

uint32_t gm_client_protocol_version(const gm_client *c)
{
        return c->protocol_version;
}

static int ping_view(gm_client *c, void *ctx, const uint8_t *p, size_t len)
{
        bool has;
        uint64_t cookie;

        if (gm_u64_view(p, len, &has, &cookie) < 0 || !has || cookie != *(const uint64_t *)ctx)
                return gm_set_reason(c, -EPROTO, "ping answered with the wrong cookie");
        return 0;
}

int gm_ping(gm_client *c)
{
        uint64_t cookie = 0x676d;
        uint8_t body[24];
        size_t n;

        if (!c)
                return BAD_ARGS(c);
        n = gm_pb_put_uint_pad(body, 1, cookie);
        return gm_call_view(c, GPUMEM__REQUEST__OP_PING, body, n, GPUMEM__REPLY__RESULT_PING, ping_view,
                            &cookie);
}

void gm_free(void *p)
{
        free(p);
}
