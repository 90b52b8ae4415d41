/* Memory handed over as files: a client's exports, and imports of dmabufs and of gpumemd's exports. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "broker-private.h"

/* A new fd (owned by the caller) of @o's whole memory, read-write: a copy of its memfd, or the driver's
 * export (whose file the class pays for when it is the first). */
int broker_obj_file(BrokerClient *c, Obj *o, int *ret_fd, Reason *w)
{
        int fd = -1, r;

        if (o->memfd >= 0) {
                r = broker_obj_dup_memfd(o, &fd, w);
                if (r < 0)
                        return r;
        } else {
                int taken = broker_export_fd_take(c, o, w);
                if (taken < 0)
                        return taken;
                r = driver_mem_export(c->b->drv, o->mem, &fd);
                broker_export_fd_end(c, o, taken, r >= 0);
                if (r == -EINVAL && !driver_has(c->b->drv, DRIVER_CAP_EXPORT))
                        return reason_set(w, -EOPNOTSUPP, "the driver cannot export dmabufs (KFD: ABI 1.12)");
                if (r < 0)
                        return reason_set(w, r, "the driver refused to export: %s", strerror(-r));
        }
        *ret_fd = fd;
        return 0;
}

int broker_export(BrokerClient *c, uint64_t handle, bool read_only, int *ret_fd, uint64_t *ret_size,
                  Reason *w)
{
        Obj *o = broker_obj_lookup(c, handle);
        int fd = -1, r;

        if (!o)
                return reason_set(w, -ENOENT, "no handle 0x%llx", (unsigned long long)handle);
        if (o->kind == BROKER_KIND_RESERVATION)
                return reason_set(w, -EINVAL, "a VA reservation has no memory to export");
        if (o->kind == BROKER_KIND_SHARE)
                return reason_set(w, -EINVAL, "a named share is not exported: its readers open it by name");
        r = broker_obj_file(c, o, &fd, w);
        if (r < 0)
                return r;
        /* memory that is read-only to this client is read-only to everyone it gives it to; memory sealed
         * read-only takes no new writable mapping, so is exported read-only only */
        if (read_only || broker_obj_read_only(o))
                r = broker_hand_out_read_only(c->b, &fd, w);
        else if ((r = broker_check_writable(fd, w)) < 0)
                safe_close(fd);
        if (r < 0)
                return r;
        broker_note_file(c->b, o, fd);
        o->exports++;
        *ret_fd = fd;
        *ret_size = o->size;
        return 0;
}

int broker_import(BrokerClient *c, int fd, uint32_t gpu_id, uint64_t *ret_handle, uint64_t *ret_size,
                  Reason *w)
{
        DriverCtx *ctx;
        uint32_t gpu = gpu_id ? gpu_id : c->b->gpu_ids[0];
        struct stat st;
        bool own, read_only, src_read_only;
        bool import_foreign = true;
        uint64_t size;
        Obj *o;
        int r, fl;

        r = broker_gpu_allowed(c, gpu, w);
        if (r < 0)
                return r;
        if (fstat(fd, &st) < 0 || (fl = fcntl(fd, F_GETFL)) < 0)
                return reason_set(w, -EBADF, "cannot inspect the fd: %s", strerror(errno));
        /* gpumemd's own exports are paid for by their exporter's class; anything else by the importer's.
         * A device's file (CUDA) says nothing of the memory: the driver knows its own exports. */
        if (S_ISCHR(st.st_mode)) {
                src_read_only = false;
                own = driver_dmabuf_is_own(c->b->drv, driver_ctx_primary(c->b->drv), fd);
        } else {
                own = broker_is_own_file(c->b, &st, &src_read_only);
        }
        /* a file sealed against new writable mappings is read-only to every import of it */
        read_only = (fl & O_ACCMODE) == O_RDONLY || src_read_only || broker_file_sealed(fd);
        size = (uint64_t)(st.st_size > 0 ? st.st_size : 0);
        size = (size + BROKER_PAGE_SIZE - 1) & ~(BROKER_PAGE_SIZE - 1);
        /* a foreign file is one more the model keeps open; an own export's memory file is the exporter's */
        r = broker_quota_check(c, BROKER_KIND_IMPORT, gpu, own ? 0 : size,
                               !own && broker_driver_holds_fd(c->b), w);
        if (r < 0)
                return r;
        r = broker_client_ctx(c, &ctx, w);
        if (r < 0)
                return r;
        if (c->acct) {
                broker_account_lock(c->acct);
                import_foreign = c->acct->import_foreign;
                broker_account_unlock(c->acct);
        }
        if (!import_foreign) {
                if (!driver_dmabuf_is_own(c->b->drv, ctx, fd))
                        return reason_set(w, -EACCES,
                                          "class '%s' may not import dmabufs the GPU driver did not export",
                                          c->acct->name);
        }
        o = broker_obj_new(BROKER_KIND_IMPORT);
        if (!o)
                return reason_set(w, -ENOMEM, "out of memory");
        r = driver_mem_import(c->b->drv, ctx, fd, gpu, &o->mem);
        if (r < 0) {
                free(o);
                if (r == -EINVAL || r == -EBADF)
                        return reason_set(w, r, "the driver cannot import this fd as GPU memory");
                return reason_set(w, r, "the driver refused the import: %s", strerror(-r));
        }
        o->size = driver_mem_size(c->b->drv, o->mem);
        o->gpu_id = gpu;
        o->client_refs = 1;
        o->read_only = read_only;
        o->flags = read_only ? BROKER_FLAG_READ_ONLY : 0;
        o->foreign = !own;
        o->backing_fd = !own && broker_driver_holds_fd(c->b);
        /* the driver's size is the one charged (and checked again: it may be larger than the file's) */
        r = broker_obj_add(c, o, w);
        if (r < 0)
                return r;
        *ret_handle = o->handle;
        *ret_size = o->size;
        return 0;
}
