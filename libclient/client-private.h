/* libgpumem_client internals shared by its source files. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "envelope.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "hashmap.h"
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
 * in malloc. A call holds one arena from decoding its reply until gm_reply_free(). The client makes them
 * as calls run at once, up to GM_REPLY_ARENAS; a call beyond that decodes its reply with malloc.
 */
#define GM_REPLY_ARENA_SIZE 4096
#define GM_REPLY_ARENAS     16

struct gm_client {
        int fd;
        pthread_mutex_t send_lock; /* one sendmsg at a time */
        pthread_mutex_t lock;      /* everything below */
        pthread_cond_t cond;
        bool reading;     /* a thread is in recvmsg on behalf of all */
        Pending *pending; /* replies that arrived for other threads */
        int broken;       /* 0, or the -errno every call now fails with */
        char broken_reason[256];
        uint32_t next_id;
        ErrSlot errs[GM_ERR_SLOTS]; /* last failure reason per thread */
        unsigned next_err_slot;
        uint8_t *rxbuf;                /* used only by the reading thread */
        Arena arenas[GM_REPLY_ARENAS]; /* the first n_arenas are made; their contents are their holder's */
        unsigned n_arenas;
        uint32_t arenas_busy; /* bit i: arenas[i] holds a reply not yet freed */

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
};

/* Unmap and forget the shares still open (at close, under nothing: no other call runs). */
void gm_shares_done(gm_client *c);

/* One request/reply round trip. On success *ret_reply is the decoded reply (status 0), to be released
 * with gm_reply_free(), and, if asked, the reply's fds are handed over. On failure the reason is recorded
 * for the calling thread. */
int gm_call(gm_client *c, Gpumem__Request *req, const int *fds, size_t n_fds, Gpumem__Reply **ret_reply,
            int *ret_fds, size_t *ret_n_fds);

/* Release a reply from gm_call(), wherever it was decoded; NULL-safe. Nothing may point into it after. */
void gm_reply_free(gm_client *c, Gpumem__Reply *reply);

/* Record @err's reason for the calling thread; returns @err. */
int gm_set_reason(gm_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* gm_call without fds that also checks the reply carries @want (-EPROTO otherwise). */
int gm_call_expect(gm_client *c, Gpumem__Request *req, Gpumem__Reply__ResultCase want, Gpumem__Reply **ret);
/* The same for an op whose result is Empty: nothing to read from the reply. */
int gm_call_empty(gm_client *c, Gpumem__Request *req);

/* -EINVAL for a missing or invalid argument, with a reason naming the call, so that gm_strerror() never shows
 * a previous call's reason for it (without a client there is nowhere to keep one). */
#define BAD_ARGS(c)                                                                                          \
        ((c) ? gm_set_reason((c), -EINVAL, "%s: a required argument is missing or invalid", __func__)        \
             : -EINVAL)
