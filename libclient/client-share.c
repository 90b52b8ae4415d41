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

static void info_from_proto(const Gpumem__ShareInfo *s, gm_share_info *d)
{
        memset(d, 0, sizeof(*d));
        copy_str(d->name, sizeof(d->name), s->name);
        copy_str(d->owner_class, sizeof(d->owner_class), s->owner_class);
        d->owner_client_id = s->owner_client_id;
        d->kind = (int)s->kind;
        d->gpu_id = s->gpu_id;
        d->size = s->size;
        d->ptr = (void *)(uintptr_t)s->va;
        d->read_only = s->read_only;
        d->persistent = s->persistent;
        d->readers = s->readers;
        d->published_usec = s->published_usec;
        d->opens = s->opens;
}

int gm_share_publish(gm_client *c, gm_handle handle, const char *name, unsigned flags,
                     gm_share_info *ret_info)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__SharePublish sp = GPUMEM__SHARE_PUBLISH__INIT;
        Gpumem__Reply *reply = NULL;
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
        req.op_case = GPUMEM__REQUEST__OP_SHARE_PUBLISH;
        req.share_publish = &sp;
        r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_SHARE_PUBLISH, &reply);
        if (r < 0)
                return r;
        if (ret_info) {
                memset(ret_info, 0, sizeof(*ret_info));
                copy_str(ret_info->name, sizeof(ret_info->name), name);
                ret_info->owner_client_id = c->client_id;
                ret_info->size = reply->share_publish->size;
                ret_info->ptr = (void *)(uintptr_t)reply->share_publish->va;
                ret_info->read_only = sp.read_only;
                ret_info->persistent = reply->share_publish->persistent;
        }
        gm_reply_free(c, reply);
        return 0;
}

/* Free the daemon's handle of a share this process could not map. */
static void release(gm_client *c, gm_handle handle)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Free f = GPUMEM__FREE__INIT;

        f.has_handle = true;
        f.handle = handle;
        req.op_case = GPUMEM__REQUEST__OP_FREE;
        req.free = &f;
        (void)gm_call_empty(c, &req);
}

int gm_share_open(gm_client *c, const char *name, unsigned flags, const uint32_t *gpu_ids, size_t n_gpus,
                  void **ret_ptr, size_t *ret_size, gm_handle *ret_handle)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__ShareOpen so = GPUMEM__SHARE_OPEN__INIT;
        Gpumem__Reply *reply = NULL;
        const Gpumem__ShareOpenReply *o;
        int fds[GM_FRAME_MAX_FDS], r, err;
        size_t n_fds = 0;
        uint64_t va, size;
        gm_handle handle;
        bool read_only;
        ShareEntry *e;
        void *p;

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
        req.op_case = GPUMEM__REQUEST__OP_SHARE_OPEN;
        req.share_open = &so;
        r = gm_call(c, &req, NULL, 0, &reply, fds, &n_fds);
        if (r < 0)
                return r;
        if (reply->result_case != GPUMEM__REPLY__RESULT_SHARE_OPEN || n_fds != 1 ||
            reply->share_open->fd_index != 0) {
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
        p = mmap((void *)(uintptr_t)va, size, PROT_READ | (read_only ? 0 : PROT_WRITE),
                 MAP_SHARED | MAP_FIXED_NOREPLACE, fds[0], 0);
        err = p == MAP_FAILED ? -errno : 0;
        close(fds[0]);
        if (err == 0 && (uintptr_t)p != va) { /* a kernel that does not know MAP_FIXED_NOREPLACE */
                munmap(p, size);
                err = -EEXIST;
        }
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
                if (p != MAP_FAILED && (uintptr_t)p == va)
                        munmap(p, size);
                release(c, handle);
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
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Free f = GPUMEM__FREE__INIT;
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
        f.has_handle = true;
        f.handle = e->handle;
        req.op_case = GPUMEM__REQUEST__OP_FREE;
        req.free = &f;
        free(e);
        return gm_call_empty(c, &req);
}

int gm_share_revoke(gm_client *c, const char *name)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__ShareRevoke sr = GPUMEM__SHARE_REVOKE__INIT;
        int r;

        if (!c || !name_ok(name))
                return BAD_ARGS(c);
        r = need_shares(c);
        if (r < 0)
                return r;
        sr.name = (char *)name;
        req.op_case = GPUMEM__REQUEST__OP_SHARE_REVOKE;
        req.share_revoke = &sr;
        return gm_call_empty(c, &req);
}

int gm_admin_shares(gm_client *c, gm_share_info **ret, size_t *ret_n)
{
        gm_share_info *all = NULL;
        size_t n = 0;
        uint32_t from = 0;
        int r;

        if (!c || !ret || !ret_n)
                return BAD_ARGS(c);
        r = need_shares(c);
        if (r < 0)
                return r;
        do {
                Gpumem__Request req = GPUMEM__REQUEST__INIT;
                Gpumem__AdminShares as = GPUMEM__ADMIN_SHARES__INIT;
                Gpumem__Reply *reply = NULL;
                const Gpumem__AdminSharesReply *a;
                gm_share_info *grown;

                as.has_from = true;
                as.from = from;
                req.op_case = GPUMEM__REQUEST__OP_ADMIN_SHARES;
                req.admin_shares = &as;
                r = gm_call_expect(c, &req, GPUMEM__REPLY__RESULT_ADMIN_SHARES, &reply);
                if (r < 0) {
                        free(all);
                        return r;
                }
                a = reply->admin_shares;
                grown = realloc(all, (n + a->n_shares + 1) * sizeof(*all));
                if (!grown) {
                        gm_reply_free(c, reply);
                        free(all);
                        return gm_set_reason(c, -ENOMEM, "out of memory");
                }
                all = grown;
                for (size_t i = 0; i < a->n_shares; i++)
                        info_from_proto(a->shares[i], &all[n++]);
                /* a next that does not move on would never end */
                from = a->next > from ? a->next : 0;
                gm_reply_free(c, reply);
        } while (from);
        *ret = all;
        *ret_n = n;
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
