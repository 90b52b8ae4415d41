/* Named shares: the protocol side (policy rights, the publisher or an administrator revoking, audit lines).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "server/class-state.h"
#include "server/core.h"
#include "config/policy.h"
#include "request.h"

/* what one reply frame holds with names of the longest */
#define SHARES_PER_REPLY 128

static int fail_why(ReqCtx *r, int err, const Reason *w)
{
        return reply_fail(r, err, "%s", reason_or_errno(w, err));
}

/* The calling client's class as the running policy has it, or NULL. Under the manager's lock. */
static const PolicyClass *class_of(const ReqCtx *r)
{
        return r->c->cls ? r->c->cls->klass : NULL;
}

static const char *class_name(const ReqCtx *r)
{
        return r->c->cls ? r->c->cls->name : "";
}

/* The name must be one a share can have; -EINVAL with the rule otherwise. */
static int check_name(ReqCtx *r, const char *name)
{
        if (!policy_share_name_valid(name))
                return reply_fail(r, -EINVAL,
                                  "'%.*s' is no share name: 1 to %d letters, digits and \"._-/\" in parts "
                                  "separated by '/', none empty, \".\" or \"..\"",
                                  POLICY_SHARE_NAME_MAX, name ? name : "", POLICY_SHARE_NAME_MAX);
        return 0;
}

static int allows(ReqCtx *r, PolicyShareRight right, const char *name)
{
        return policy_share_allows(class_of(r), right, name);
}

/* A valid name, the client's books, and @right on the name (-EACCES naming @key otherwise). */
static int share_begin(ReqCtx *r, const char *name, PolicyShareRight right, const char *what, const char *key,
                       BrokerClient **ret)
{
        int err = check_name(r, name);

        if (err < 0)
                return err;
        err = req_books(r, ret);
        if (err < 0)
                return err;
        if (!allows(r, right, name))
                return reply_fail(r, -EACCES, "class '%s' may not %s '%s' (%s)", class_name(r), what, name,
                                  key);
        return 0;
}

int op_share_publish(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__SharePublish *a = req->share_publish;
        Gpumem__SharePublishReply pr = GPUMEM__SHARE_PUBLISH_REPLY__INIT;
        BrokerShareInfo info;
        bool persistent;
        Reason w = {""};
        int err;
        BrokerClient *bc;

        err = share_begin(r, a->name, POLICY_SHARE_PUBLISH, "publish under the name", "share-publish", &bc);
        if (err < 0)
                return err;
        persistent = allows(r, POLICY_SHARE_PERSISTENT, a->name);
        err = broker_share_publish(bc, a->handle, a->name, a->has_read_only && a->read_only, persistent,
                                   &info, &w);
        if (err < 0)
                return fail_why(r, err, &w);
        conn_log(r->c, LOG_NOTICE, GM_MESSAGE_SHARE_PUBLISH, NULL,
                 "published share '%s': %llu bytes at 0x%llx%s%s", info.name, (unsigned long long)info.size,
                 (unsigned long long)info.va, info.read_only ? ", read-only" : "",
                 info.persistent ? ", persistent" : "");
        pr.has_va = pr.has_size = pr.has_persistent = true;
        pr.va = info.va;
        pr.size = info.size;
        pr.persistent = info.persistent;
        return reply_result(r, &pr);
}

int op_share_open(ReqCtx *r, const Gpumem__Request *req)
{
        const Gpumem__ShareOpen *a = req->share_open;
        Gpumem__ShareOpenReply orp = GPUMEM__SHARE_OPEN_REPLY__INIT;
        bool write = a->has_write && a->write;
        BrokerShareInfo info;
        uint64_t handle = 0;
        Reason w = {""};
        int err, fd = -1;
        BrokerClient *bc;

        err = share_begin(r, a->name, write ? POLICY_SHARE_WRITE : POLICY_SHARE_READ,
                          write ? "open read-write" : "open read-only", write ? "share-write" : "share-read",
                          &bc);
        if (err < 0)
                return err;
        err = broker_share_open(bc, a->name, write, a->gpu_ids, a->n_gpu_ids, &handle, &info, &fd, &w);
        if (err < 0)
                return fail_why(r, err, &w);
        orp.fd_index = reply_add_fd(r, fd);
        if (orp.fd_index < 0) {
                (void)broker_mem_free(bc, handle, &w);
                return reply_fail(r, orp.fd_index, "cannot attach the share's fd");
        }
        conn_log(r->c, LOG_INFO, GM_MESSAGE_SHARE_OPEN, NULL, "opened share '%s' %s", info.name,
                 write && !info.read_only ? "read-write" : "read-only");
        orp.has_handle = orp.has_va = orp.has_size = orp.has_read_only = orp.has_fd_index = true;
        orp.handle = handle;
        orp.va = info.va;
        orp.size = info.size;
        orp.read_only = !write || info.read_only;
        return reply_result(r, &orp);
}

int op_share_revoke(ReqCtx *r, const Gpumem__Request *req)
{
        const char *name = req->share_revoke->name;
        BrokerShareInfo info;
        Conn *owner = NULL;
        BrokerDrop *drops = NULL;
        Reason w = {""};
        int err;

        err = check_name(r, name);
        if (err < 0)
                return err;
        if (broker_share_find(r->m->broker, name, &info) < 0)
                return reply_fail(r, -ENOENT, "no share named '%s'", name);
        /* its publisher, an administrator, or a class that may publish under the name (a loader that
         * comes back takes back what it published before) */
        if (!(r->c->broker && info.owner_tag == r->c->id) && !r->c->admin &&
            !allows(r, POLICY_SHARE_PUBLISH, name))
                return reply_fail(r, -EACCES, "share '%s' is not this client's to revoke", name);
        /* the publisher's books change: its loop serialises them with its lock, or none runs them (a
         * publisher torn down in slices, under the manager's lock that is held here) */
        if (info.owner_tag && info.owner_tag != r->c->id) {
                owner = manager_find_conn(r->m, info.owner_tag);
                if (owner)
                        conn_lock(owner);
        }
        err = broker_share_revoke(r->m->broker, name, &drops, &w);
        if (owner)
                conn_unlock(owner);
        if (err < 0)
                return fail_why(r, err, &w);
        conn_log(r->c, LOG_NOTICE, GM_MESSAGE_SHARE_REVOKE, NULL, "revoked share '%s' (%u readers)", name,
                 info.readers);
        /* a persistent share's memory, released on a worker: answered once it went */
        return reply_after_drops(r, 0, &w, drops);
}

static void info_to_proto(const BrokerShareInfo *s, Gpumem__ShareInfo *p)
{
        /* Bin-packed by hand: clang-format would put a designated initializer one member to a line. */
        // clang-format off
        *p = (Gpumem__ShareInfo){
                MSG_INIT(gpumem__share_info), .name = (char *)s->name, .owner_class = (char *)s->class_name,
                OPT(owner_client_id, s->owner_tag), OPT(kind, (Gpumem__MemKind)s->kind), OPT(size, s->size),
                OPT(va, s->va), OPT(read_only, s->read_only), OPT(persistent, s->persistent),
                OPT(readers, s->readers), OPT(published_usec, s->published_usec), OPT(gpu_id, s->gpu_id),
                OPT(opens, s->opens)
        };
        // clang-format on
}

int op_admin_shares(ReqCtx *r, const Gpumem__Request *req)
{
        BrokerShareInfo *infos = calloc(SHARES_PER_REPLY, sizeof(*infos));
        Gpumem__ShareInfo *items = NULL, **ptrs;
        size_t cursor = req->admin_shares->has_from ? req->admin_shares->from : 0, n;
        int err;

        if (!infos || !REPLY_ITEMS_NEW(items, ptrs, SHARES_PER_REPLY)) {
                free(infos);
                free(items);
                return reply_fail(r, -ENOMEM, "out of memory");
        }
        n = broker_share_list(r->m->broker, &cursor, infos, SHARES_PER_REPLY);
        for (size_t i = 0; i < n; i++) {
                info_to_proto(&infos[i], &items[i]);
                ptrs[i] = &items[i];
        }
        Gpumem__AdminSharesReply sr = {MSG_INIT(gpumem__admin_shares_reply), .n_shares = n, .shares = ptrs,
                                       OPT(next, (uint32_t)cursor)};
        err = reply_result(r, &sr);
        free(infos);
        free(items);
        return err;
}
