/* libgpumem_client internals shared by its source files. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "client-backend.h"
#include "envelope.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "hashmap.h"
#include "map.h"
#include "view.h"
#include "wire.h"

#define GM_ERR_SLOTS 32

typedef struct ErrSlot {
        bool used;
        pthread_t tid;
        char reason[256];
} ErrSlot;

typedef struct Pending Pending;
typedef struct MemEntry MemEntry;

/*
 * Replies are decoded into arenas the client keeps, so that a call makes no allocation of its own. 4 KiB
 * holds every reply whose size the API bounds (the largest, a pointer query on 64 GPUs or 32 SVM
 * attributes, decode into under 3.6 KiB); a bigger one (the topology, the administrators' lists) goes on
 * in malloc. A call holds one arena from when it starts waiting for its reply (taken under the lock it
 * holds then anyway) until gm_reply_free(). The client makes them as calls run at once, up to
 * GM_REPLY_ARENAS; a call beyond that decodes its reply with malloc.
 */
#define GM_REPLY_ARENA_SIZE 4096
#define GM_REPLY_ARENAS     16

struct gm_client {
        int fd;
        pthread_mutex_t lock; /* everything below */
        pthread_cond_t cond;
        /* The reading role, taken and given back atomically: a thread alone on its connection takes it
         * without the lock (wait_reply). Whoever gives it back after another thread counted itself in
         * waiters (atomic, under the lock) wakes the waiters under the lock. */
        uint32_t reading; /* 1: a thread is in recvmsg on behalf of all */
        unsigned waiters; /* threads in pthread_cond_wait on cond, or about to be */
        /* Threads in a long wait (an event wait that may block): they sleep in poll() on the socket and an
         * eventfd of their own, not in recvmsg(), so that another thread's reply wakes that thread and not
         * them (wait_long). Whoever gives the reading role back, or dispatches, kicks their eventfds. */
        struct LongWaiter *long_waiters; /* under the lock */
        unsigned n_long;                 /* its length: changed under the lock, read atomically */
        unsigned n_short;                /* threads waiting for other replies (atomic) */
        Pending *pending;                /* replies that arrived for other threads */
        unsigned n_pending;              /* its length: changed under the lock, read atomically */
        int broken; /* 0, or the -errno every call now fails with; set once, under lock, read atomically */
        char broken_reason[256];
        uint32_t next_id;           /* atomic */
        ErrSlot errs[GM_ERR_SLOTS]; /* last failure reason per thread */
        unsigned next_err_slot;
        uint8_t *rxbuf;                /* used only by the reading thread */
        Arena arenas[GM_REPLY_ARENAS]; /* the first n_arenas are made; their contents are their holder's */
        unsigned n_arenas;             /* grows under lock, read atomically: arenas below it are made */
        uint32_t arenas_busy; /* bit i: arenas[i] holds a reply not yet freed; set under lock, cleared by
                               * its holder without it (atomic) */

        uint32_t protocol_version;
        uint64_t client_id;
        uint64_t window_base, window_size;
        bool window_reserved;
        uint32_t kfd_major, kfd_minor;
        char *server_version;
        char *backend;

        pthread_mutex_t mem_lock; /* the allocation table */
        pthread_cond_t mem_cond;  /* an allocation's teardown in this process ended */
        HashMap allocs;           /* base address → MemEntry, for gm_mem_free and friends */
        MemEntry *freeing;        /* allocations gm_mem_free() is taking down: not yet to be mapped over */
        HashMap shares;           /* address of an open share → ShareEntry (client-share.c) */
        const GmBackend *bk;      /* this process's side of the daemon's backend (client-backend.h) */
        void *bk_data;            /* its state, or NULL */
};

/* The caller's pointer @ptr as the daemon's VA, and the daemon's @va as the caller's pointer (the backend's
 * translations). */
static inline uint64_t gm_ptr_va(const gm_client *c, const void *ptr)
{
        return c->bk->to_va(c, (uint64_t)(uintptr_t)ptr);
}

static inline void *gm_va_ptr(const gm_client *c, uint64_t va)
{
        return (void *)(uintptr_t)c->bk->to_ptr(c, va);
}

/* Unmap and forget the shares still open (at close, under nothing: no other call runs). */
void gm_shares_done(gm_client *c);

/* gm_request()'s @want when any result will do (the caller reads none, or checks it itself). */
#define GM_ANY_RESULT GPUMEM__REPLY__RESULT__NOT_SET

/*
 * One op's request/reply round trip. @msg is the op's message (a Gpumem__Alloc for GPUMEM__REQUEST__OP_ALLOC,
 * made with its _INIT), sent as the Request's member numbered @op: protobuf-c's descriptor of the Request
 * says where that member lies (gm_proto_field), so no envelope is built by hand and no list of ops kept.
 * On success the reply's status is 0 and its result is @want (else -EPROTO); *@ret_reply is the reply, to be
 * released with gm_reply_free() (NULL @ret_reply: released here). @fds go with the request; the reply's fds
 * are handed over in @ret_fds (room for GM_FRAME_MAX_FDS) and *@ret_n_fds if asked, else closed. On failure
 * the reason is recorded for the calling thread and no fd is left open.
 */
int gm_request_fds(gm_client *c, uint32_t op, const void *msg, const int *fds, size_t n_fds, uint32_t want,
                   Gpumem__Reply **ret_reply, int *ret_fds, size_t *ret_n_fds);

/* The same without fds either way. */
static inline int gm_request(gm_client *c, uint32_t op, const void *msg, uint32_t want,
                             Gpumem__Reply **ret_reply)
{
        return gm_request_fds(c, op, msg, NULL, 0, want, ret_reply, NULL, NULL);
}

/*
 * gm_request() for a call that reads its answer once: on success @fn gets the reply's result (the Reply's
 * member @want, such as a const Gpumem__AdminStatusReply *, never GM_ANY_RESULT) with @ctx, and returns the
 * call's result, 0 or a negative errno after gm_set_reason(); the reply is released after.
 */
typedef int (*GmTakeFn)(gm_client *c, const void *result, void *ctx);
int gm_request_take(gm_client *c, uint32_t op, const void *msg, uint32_t want, GmTakeFn fn, void *ctx);

/* A list the daemon answers a page at a time (the topology's files, the shares): what the GmTakeFn of each
 * page gathered so far, and where the daemon said the next page starts (0: that was the last). */
typedef struct GmPages {
        void *items;
        size_t n;
        uint32_t next;
} GmPages;

/*
 * The ops whose message is one number, its field 1 (an id, a handle, a GPU, where a page starts), or empty:
 * the message is made here from the op's descriptor. As gm_request_take(), or, with @fn NULL, gm_request()
 * reading nothing.
 */
int gm_request_num(gm_client *c, uint32_t op, uint64_t num, uint32_t want, GmTakeFn fn, void *ctx);
int gm_request_none(gm_client *c, uint32_t op, uint32_t want, GmTakeFn fn, void *ctx);
/* A GmTakeFn for the results of one number, field 1 (a VA, a handle, an access): into *(uint64_t *)@ctx. */
int gm_take_num(gm_client *c, const void *result, void *ctx);

/*
 * The small ops' round trip without protobuf-c's objects (view.h): @body is the op's message, packed by the
 * caller, sent as the Request's member @op; the reply's status is read in place and, on success, @fn gets the
 * payload of its result, which must be the Reply's member @want. No fds either way. @fn decodes into what
 * @ctx points to and returns 0, or a negative errno after gm_set_reason(). Returns 0 or a negative errno
 * with the reason recorded.
 */
typedef int (*GmViewFn)(gm_client *c, void *ctx, const uint8_t *p, size_t len);
int gm_call_view(gm_client *c, uint32_t op, const uint8_t *body, size_t len, uint32_t want, GmViewFn fn,
                 void *ctx);
/* The most @body of gm_call_view() may hold. */
#define GM_VIEW_BODY_MAX 1024

/* Release a reply from gm_request(), wherever it was decoded; NULL-safe. Nothing may point into it after. */
void gm_reply_free(gm_client *c, Gpumem__Reply *reply);

/* Record @err's reason for the calling thread; returns @err. */
int gm_set_reason(gm_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * The public structs share many of their fields with the daemon's messages, under the same names: each
 * such set is written once, as an X-macro list of the names joined by commas, expanded with GM_COPY_FIELD
 * (one expression of the copies) where the two are at hand as dst and src.
 */
#define GM_COPY_FIELD(f) (dst->f = src->f)

/* -EINVAL for a missing or invalid argument, with a reason naming the call, so that gm_strerror() never shows
 * a previous call's reason for it (without a client there is nowhere to keep one). */
#define BAD_ARGS(c)                                                                                          \
        ((c) ? gm_set_reason((c), -EINVAL, "%s: a required argument is missing or invalid", __func__)        \
             : -EINVAL)
