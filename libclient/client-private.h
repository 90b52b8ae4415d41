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
typedef struct GmCuda GmCuda;

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
        uint32_t reading;   /* 1: a thread is in recvmsg on behalf of all */
        unsigned waiters;   /* threads in pthread_cond_wait on cond, or about to be */
        Pending *pending;   /* replies that arrived for other threads */
        unsigned n_pending; /* its length: changed under the lock, read atomically */
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
        GmCuda *cuda;             /* backend "cuda": this process's CUDA side (client-cuda.c), else NULL */
};

/*
 * Backend "cuda" (client-cuda.c): memory is imported into this process's CUDA context and mapped at the
 * window's image in CUDA's VA space. gm_cuda_va() turns a pointer the caller holds into the daemon's VA
 * (identity outside the image), gm_cuda_ptr() a VA of the window into the caller's pointer. The rest take
 * the daemon's VAs and record a reason on failure.
 */
int gm_cuda_open(gm_client *c);
void gm_cuda_close(gm_client *c);
uint64_t gm_cuda_va(const gm_client *c, uint64_t ptr);
uint64_t gm_cuda_ptr(const gm_client *c, uint64_t va);
int gm_cuda_import(gm_client *c, int fd, uint32_t gpu_id, uint64_t *ret_h);
void gm_cuda_release(gm_client *c, uint64_t h);
int gm_cuda_map(gm_client *c, uint64_t va, uint64_t size, uint64_t offset, uint64_t h);
int gm_cuda_unmap(gm_client *c, uint64_t va, uint64_t size);
int gm_cuda_access(gm_client *c, uint64_t va, uint64_t size, uint32_t gpu_id, int access);
int gm_cuda_host_register(gm_client *c, uint64_t va, uint64_t size);
void gm_cuda_host_unregister(gm_client *c, uint64_t va);
/* The CUDA handle of this process's import of the daemon's @handle (VMM handles and imports). */
int gm_cuda_handle_put(gm_client *c, gm_handle handle, uint64_t h);
uint64_t gm_cuda_handle_get(gm_client *c, gm_handle handle);
uint64_t gm_cuda_handle_take(gm_client *c, gm_handle handle);

/* Unmap and forget the shares still open (at close, under nothing: no other call runs). */
void gm_shares_done(gm_client *c);

/* One request/reply round trip. On success *ret_reply is the decoded reply (status 0), to be released
 * with gm_reply_free(), and, if asked, the reply's fds are handed over. On failure the reason is recorded
 * for the calling thread. */
int gm_call(gm_client *c, Gpumem__Request *req, const int *fds, size_t n_fds, Gpumem__Reply **ret_reply,
            int *ret_fds, size_t *ret_n_fds);

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
