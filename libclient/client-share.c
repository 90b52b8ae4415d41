/* Named shares on the client side: publish, open (the CPU mapping at the share's address), close, revoke. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client-private.h"

typedef struct ShareEntry {
        gm_handle handle;
        uint64_t size;
} ShareEntry;

static uint64_t ptr_key(const void *p)
{
        return (uint64_t)(uintptr_t)p;
}

/* The daemon must speak protocol 3: an older one does not know these ops. */
static int need_shares(gm_client *c)
{
        if (c->protocol_version < 3)
                return gm_set_reason(c, -EOPNOTSUPP, "gpumemd speaks protocol %u; named shares need 3",
                                     c->protocol_version);
        return 0;
}

static bool name_ok(const char *name)
{
        return name && name[0] && strnlen(name, GM_SHARE_NAME_MAX + 1) <= GM_SHARE_NAME_MAX;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
        size_t n = src ? strnlen(src, cap - 1) : 0;
        if (n)
                memcpy(dst, src, n);
        dst[n] = '\0';
}

/* What a share's entry says as the daemon's message says it. */
#define SHARE_FIELDS(X)                                                                                      \
        X(owner_client_id), X(kind), X(gpu_id), X(size), X(read_only), X(persistent), X(readers),            \
                X(published_usec), X(opens)

static void info_from_proto(const Gpumem__ShareInfo *src, gm_share_info *dst)
{
        memset(dst, 0, sizeof(*dst));
        copy_str(dst->name, sizeof(dst->name), src->name);
        copy_str(dst->owner_class, sizeof(dst->owner_class), src->owner_class);
        SHARE_FIELDS(GM_COPY_FIELD);
        dst->ptr = (void *)(uintptr_t)src->va;
}

/* What the daemon says of a share just published: where it lies, how large, whether it outlives us. */
static int publish_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__SharePublishReply *p = result;
        gm_share_info *info = ctx;

        (void)c;
        info->size = p->size;
        info->ptr = (void *)(uintptr_t)p->va;
        info->persistent = p->persistent;
        return 0;
}

int gm_share_publish(gm_client *c, gm_handle handle, const char *name, unsigned flags,
                     gm_share_info *ret_info)
{
        Gpumem__SharePublish sp = GPUMEM__SHARE_PUBLISH__INIT;
        gm_share_info info = {0};
        int r;

        if (!c || !name_ok(name) || (flags & ~(unsigned)GM_SHARE_READ_ONLY))
                return BAD_ARGS(c);
        r = need_shares(c);
        if (r < 0)
                return r;
        sp.has_handle = sp.has_read_only = true;
        sp.handle = handle;
        sp.name = (char *)name;
        sp.read_only = (flags & GM_SHARE_READ_ONLY) != 0;
        copy_str(info.name, sizeof(info.name), name);
        info.owner_client_id = c->client_id;
        info.read_only = sp.read_only;
        r = gm_request_take(c, GPUMEM__REQUEST__OP_SHARE_PUBLISH, &sp, GPUMEM__REPLY__RESULT_SHARE_PUBLISH,
                            publish_take, &info);
        if (r == 0 && ret_info)
                *ret_info = info;
        return r;
}

int gm_share_open(gm_client *c, const char *name, unsigned flags, const uint32_t *gpu_ids, size_t n_gpus,
                  void **ret_ptr, size_t *ret_size, gm_handle *ret_handle)
{
        Gpumem__ShareOpen so = GPUMEM__SHARE_OPEN__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__ShareOpenReply *o;
        int fds[GM_FRAME_MAX_FDS], r, err;
        size_t n_fds = 0;
        uint64_t va, size;
        gm_handle handle;
        bool read_only, mapped;
        ShareEntry *e;

        if (!c || !name_ok(name) || !ret_ptr || (flags & ~(unsigned)GM_SHARE_WRITE) || (n_gpus && !gpu_ids) ||
            n_gpus > 64)
                return BAD_ARGS(c);
        r = need_shares(c);
        if (r < 0)
                return r;
        so.name = (char *)name;
        so.has_write = true;
        so.write = (flags & GM_SHARE_WRITE) != 0;
        so.gpu_ids = (uint32_t *)gpu_ids;
        so.n_gpu_ids = n_gpus;
        r = gm_request_fds(c, GPUMEM__REQUEST__OP_SHARE_OPEN, &so, NULL, 0, GPUMEM__REPLY__RESULT_SHARE_OPEN,
                           &reply, fds, &n_fds);
        if (r < 0)
                return r;
        if (n_fds != 1 || reply->share_open->fd_index != 0) {
                for (size_t i = 0; i < n_fds; i++)
                        close(fds[i]);
                gm_reply_free(c, reply);
                return gm_set_reason(c, -EPROTO, "gpumemd replied with an unexpected result");
        }
        o = reply->share_open;
        handle = o->handle;
        va = o->va;
        size = o->size;
        read_only = o->read_only;
        gm_reply_free(c, reply);

        /* the CPU mapping at the share's address, as every reader has it: never over something of ours */
        err = map_at(va, size, PROT_READ | (read_only ? 0 : PROT_WRITE), MAP_SHARED | MAP_FIXED_NOREPLACE,
                     fds[0], 0);
        close(fds[0]);
        mapped = err == 0;
        e = err == 0 ? malloc(sizeof(*e)) : NULL;
        if (err == 0 && !e)
                err = -ENOMEM;
        if (e) {
                *e = (ShareEntry){handle, size};
                pthread_mutex_lock(&c->mem_lock);
                err = hashmap_put(&c->shares, va, e);
                pthread_mutex_unlock(&c->mem_lock);
                if (err < 0)
                        free(e);
        }
        if (err < 0) {
                if (mapped)
                        munmap((void *)(uintptr_t)va, size);
                /* the daemon's handle of what this process could not map */
                (void)gm_request_num(c, GPUMEM__REQUEST__OP_FREE, handle, GPUMEM__REPLY__RESULT_EMPTY, NULL,
                                     NULL);
                return gm_set_reason(c, err, "cannot map share '%s' at 0x%llx: %s", name,
                                     (unsigned long long)va, strerror(-err));
        }
        *ret_ptr = (void *)(uintptr_t)va;
        if (ret_size)
                *ret_size = size;
        if (ret_handle)
                *ret_handle = handle;
        return 0;
}

int gm_share_close(gm_client *c, void *ptr)
{
        gm_handle handle;
        ShareEntry *e;

        if (!c || !ptr)
                return BAD_ARGS(c);
        pthread_mutex_lock(&c->mem_lock);
        e = hashmap_remove(&c->shares, ptr_key(ptr));
        pthread_mutex_unlock(&c->mem_lock);
        if (!e)
                return gm_set_reason(c, -EINVAL, "%p is no share gm_share_open mapped", ptr);
        /* the mapping first: the daemon then frees what no one maps */
        (void)munmap(ptr, e->size);
        handle = e->handle;
        free(e);
        return gm_request_num(c, GPUMEM__REQUEST__OP_FREE, handle, GPUMEM__REPLY__RESULT_EMPTY, NULL, NULL);
}

int gm_share_revoke(gm_client *c, const char *name)
{
        Gpumem__ShareRevoke sr = GPUMEM__SHARE_REVOKE__INIT;
        int r;

        if (!c || !name_ok(name))
                return BAD_ARGS(c);
        r = need_shares(c);
        if (r < 0)
                return r;
        sr.name = (char *)name;
        return gm_request(c, GPUMEM__REQUEST__OP_SHARE_REVOKE, &sr, GPUMEM__REPLY__RESULT_EMPTY, NULL);
}

static int shares_take(gm_client *c, const void *result, void *ctx)
{
        const Gpumem__AdminSharesReply *a = result;
        GmPages *o = ctx;
        gm_share_info *all = realloc(o->items, (o->n + a->n_shares + 1) * sizeof(*all));

        if (!all)
                return gm_set_reason(c, -ENOMEM, "out of memory");
        o->items = all;
        for (size_t i = 0; i < a->n_shares; i++)
                info_from_proto(a->shares[i], &all[o->n++]);
        o->next = a->next;
        return 0;
}

int gm_admin_shares(gm_client *c, gm_share_info **ret, size_t *ret_n)
{
        GmPages out = {NULL, 0, 0};
        uint32_t from = 0;
        int r;

        if (!c || !ret || !ret_n)
                return BAD_ARGS(c);
        r = need_shares(c);
        if (r < 0)
                return r;
        do {
                r = gm_request_num(c, GPUMEM__REQUEST__OP_ADMIN_SHARES, from,
                                   GPUMEM__REPLY__RESULT_ADMIN_SHARES, shares_take, &out);
                if (r < 0) {
                        free(out.items);
                        return r;
                }
                /* a next that does not move on would never end */
                from = out.next > from ? out.next : 0;
        } while (from);
        *ret = out.items;
        *ret_n = out.n;
        return 0;
}

void gm_shares_done(gm_client *c)
{
        size_t it = 0;
        uint64_t va;
        void *v;

        while (hashmap_next(&c->shares, &it, &va, &v)) {
                const ShareEntry *e = v;
                (void)munmap((void *)(uintptr_t)va, e->size);
                free(v);
        }
        hashmap_done(&c->shares);
}
