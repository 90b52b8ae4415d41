/* Memory that outlives its handle: the files of it handed to clients, known and watched until they go. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker-private.h"

int broker_event_fd(const Broker *b)
{
        return b->notify_fd;
}

static uint64_t ino_key(uint64_t ino)
{
        return ino == UINT64_MAX ? UINT64_MAX - 1
                                 : ino; /* never 0 (no inode is), never the map's tombstone */
}

/* An fd of @o's memory goes to a client: remember the inode, so that an import of it is known as ours and
 * so that the memory stays charged while that file lives. */
void broker_note_file(Broker *b, Obj *o, int fd)
{
        struct stat st;

        o->handed_out = true;
        /* an import's files are someone else's memory: never taken for gpumemd's own; a device's file
         * (CUDA's exports are files of /dev/nvidiactl) names the device, not the memory */
        if (o->kind == BROKER_KIND_IMPORT || o->file_ino || fstat(fd, &st) < 0 || S_ISCHR(st.st_mode))
                return;
        o->file_ino = (uint64_t)st.st_ino;
        o->file_dev = st.st_dev;
        pthread_mutex_lock(&b->lock);
        if (hashmap_put(&b->files, ino_key(o->file_ino), o) < 0)
                o->file_ino = 0; /* taken by another object's file (the same memory) or no memory: unknown */
        pthread_mutex_unlock(&b->lock);
}

static Charge linger_of(const Linger *l)
{
        return (Charge){.kind = l->kind, .gpu_id = l->gpu_id, .bytes = l->size, .lingering = true};
}

/* Under the broker's lock (the account's is taken inside it). */
static void linger_charge(Broker *b, Linger *l, int sign)
{
        Charge ch = linger_of(l);

        broker_usage_apply(&b->totals, b, &ch, sign);
        if (l->acct) {
                pthread_mutex_lock(&l->acct->lock);
                broker_usage_apply(&l->acct->used, b, &ch, sign);
                l->acct->lingering += (unsigned)sign;
                pthread_mutex_unlock(&l->acct->lock);
        }
}

/* Keep @size bytes of @kind charged to @acct (may be NULL) and the totals while the file @fd (borrowed)
 * refers to has holders; only files with no name (st_nlink 0) are watched. */
void broker_linger_watch(Broker *b, BrokerAccount *acct, BrokerKind kind, uint32_t gpu_id, uint64_t size,
                         int fd)
{
        char path[64];
        struct stat st;
        Linger *l, *first;
        int wd;

        if (fd < 0 || fstat(fd, &st) < 0 || st.st_nlink != 0)
                return;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        l = calloc(1, sizeof(*l));
        pthread_mutex_lock(&b->lock);
        wd = l ? inotify_add_watch(b->notify_fd, path, IN_DELETE_SELF) : -1;
        if (wd < 0) {
                b->watch_failures++;
                goto out;
        }
        *l = (Linger){.acct = acct,
                      .kind = kind,
                      .gpu_id = gpu_id,
                      .size = size,
                      .ino = (uint64_t)st.st_ino,
                      .dev = st.st_dev,
                      .wd = wd};
        first = hashmap_get(&b->lingering, (uint64_t)wd + 1);
        if (first) { /* the same inode watched already: one more charge on the same watch */
                l->next = first->next;
                first->next = l;
        } else if (hashmap_put(&b->lingering, (uint64_t)wd + 1, l) < 0) {
                b->watch_failures++;
                goto out;
        } else {
                (void)hashmap_put(&b->dead_files, ino_key(l->ino), l);
        }
        linger_charge(b, l, +1);
        l = NULL;
out:
        pthread_mutex_unlock(&b->lock);
        free(l);
}

/*
 * @o dies as an object; if files handed to clients may still hold its memory, keep its bytes charged until
 * the kernel drops the inode. @fd refers to the memory (borrowed). Only files with no name (memfds, the
 * model's dmabufs: st_nlink 0) are watched: the kernel reports their end. A dmabuf of the GPU driver is
 * refunded at once (docs/policy.md says what that leaves open). Memory a persistent share keeps is charged
 * by the share instead.
 */
void broker_linger_start(BrokerClient *c, const Obj *o, int fd)
{
        if (!o->handed_out || o->kind == BROKER_KIND_IMPORT || o->share_kept)
                return;
        broker_linger_watch(c->b, c->acct, o->kind, o->gpu_id, o->size, fd);
}

void broker_obj_forget_file(Broker *b, Obj *o)
{
        if (!o->file_ino)
                return;
        pthread_mutex_lock(&b->lock);
        if (hashmap_get(&b->files, ino_key(o->file_ino)) == o)
                hashmap_remove(&b->files, ino_key(o->file_ino));
        pthread_mutex_unlock(&b->lock);
        o->file_ino = 0;
}

void broker_process_events(Broker *b)
{
        char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));

        pthread_mutex_lock(&b->lock);
        for (;;) {
                ssize_t n = read(b->notify_fd, buf, sizeof(buf));
                if (n <= 0)
                        break;
                for (char *p = buf; p < buf + n;) {
                        const struct inotify_event *e = (const struct inotify_event *)(void *)p;
                        p += sizeof(*e) + e->len;
                        if (!(e->mask & IN_IGNORED))
                                continue;
                        Linger *l = hashmap_remove(&b->lingering, (uint64_t)e->wd + 1);
                        if (l && hashmap_get(&b->dead_files, ino_key(l->ino)) == l)
                                hashmap_remove(&b->dead_files, ino_key(l->ino));
                        while (l) {
                                Linger *next = l->next;
                                linger_charge(b, l, -1);
                                free(l);
                                l = next;
                        }
                }
        }
        pthread_mutex_unlock(&b->lock);
}

/* Replace *@fd by a file of its own opened read-only for the same memory: its holder cannot map it writable.
 * The model's dmabufs and memfds can be opened again; a dmabuf of the kernel cannot: -EOPNOTSUPP, and
 * *@fd is closed either way. */
int broker_make_read_only(int *fd, Reason *w)
{
        struct stat st;
        char path[64];
        int ro;

        /* opening a device's file again makes a new one, not another of the same memory */
        if (fstat(*fd, &st) == 0 && S_ISCHR(st.st_mode)) {
                *fd = safe_close(*fd);
                return reason_set(w, -EOPNOTSUPP, "this driver's exports cannot be made read-only");
        }

        snprintf(path, sizeof(path), "/proc/self/fd/%d", *fd);
        ro = open(path, O_RDONLY | O_CLOEXEC);
        if (ro < 0)
                ro = -errno;
        *fd = safe_close(*fd);
        if (ro < 0)
                return reason_set(w, -EOPNOTSUPP, "this memory cannot be handed out read-only: %s",
                                  strerror(-ro));
        *fd = ro;
        return 0;
}

bool broker_file_sealed(int fd)
{
        int seals = fcntl(fd, F_GET_SEALS);
        return seals >= 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
}

/*
 * Memory handed to another party read-only is read-only by construction: its file (@fd, borrowed) is sealed
 * against write() and new shared writable mappings (F_SEAL_FUTURE_WRITE) through every fd of it, whatever
 * the capabilities of their holders, and against further seals (F_SEAL_SEAL). Writable mappings made before
 * stay so: the owner's (made at allocation), gpumemd's own, and those the driver makes now for GPU access
 * it granted already (driver_file_seal). The seal is the memory's, not one fd's: from here on no one
 * maps it writable again. A file that takes no seals (a kernel's dmabuf) or was sealed by a holder without
 * a write seal cannot be handed out read-only.
 */
int broker_seal_read_only(Broker *b, int fd, Reason *w)
{
        int seals = fcntl(fd, F_GET_SEALS), r;

        if (seals < 0)
                return reason_set(w, -EOPNOTSUPP,
                                  "this memory cannot be handed out read-only: its file takes no seals");
        if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
                return 0;
        if (seals & F_SEAL_SEAL)
                return reason_set(w, -EPERM,
                                  "this memory cannot be handed out read-only: a holder sealed its file");
        r = driver_file_seal(b->drv, fd);
        if (r < 0)
                return reason_set(w, r, "the driver cannot keep its access to the memory through a seal: %s",
                                  strerror(-r));
        /* sealed by the driver now, else here */
        if (broker_file_sealed(fd) || fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) == 0)
                return 0;
        r = -errno;
        if (broker_file_sealed(fd))
                return 0; /* by another thread handing it out at the same time */
        if (r == -EINVAL)
                return reason_set(w, -EOPNOTSUPP,
                                  "this memory cannot be handed out read-only: the kernel has no "
                                  "F_SEAL_FUTURE_WRITE (Linux 5.1)");
        return reason_set(w, r, "this memory cannot be handed out read-only: its file refused a seal: %s",
                          strerror(-r));
}

/* @fd (owned; replaced) sealed read-only (broker_seal_read_only) and opened again read-only. */
int broker_hand_out_read_only(Broker *b, int *fd, Reason *w)
{
        struct stat st;
        int r;

        if (fstat(*fd, &st) == 0 && S_ISCHR(st.st_mode))
                return broker_make_read_only(fd, w); /* refuses, with the reason why */
        r = broker_seal_read_only(b, *fd, w);
        if (r < 0) {
                *fd = safe_close(*fd);
                return r;
        }
        return broker_make_read_only(fd, w);
}

/* -EPERM with the reason when @fd's memory was handed out read-only: no new writable mapping of it. */
int broker_check_writable(int fd, Reason *w)
{
        if (!broker_file_sealed(fd))
                return 0;
        return reason_set(w, -EPERM,
                          "this memory was handed out read-only before: no new writable mapping of it "
                          "can be made, by anyone (ask for read-only)");
}

bool broker_obj_read_only(const Obj *o)
{
        return o->read_only || (o->flags & BROKER_FLAG_READ_ONLY);
}

/*
 * Is @st one of the files gpumemd handed out, of live or lingering memory or of memory a persistent share
 * holds? *@ret_read_only: the live memory it is of is read-only. The object may be another client's, which
 * may free it at any time: it is read only under the broker's lock. The share lock, taken first, keeps a
 * share from handing its memory to a linger between the two looks.
 */
bool broker_is_own_file(Broker *b, const struct stat *st, bool *ret_read_only)
{
        const Obj *o;
        const Linger *l;
        bool own;

        pthread_mutex_lock(&b->share_lock);
        pthread_mutex_lock(&b->lock);
        o = hashmap_get(&b->files, ino_key((uint64_t)st->st_ino));
        l = hashmap_get(&b->dead_files, ino_key((uint64_t)st->st_ino));
        if (o && o->file_dev != st->st_dev)
                o = NULL;
        *ret_read_only = o && broker_obj_read_only(o);
        own = o || (l && l->dev == st->st_dev);
        pthread_mutex_unlock(&b->lock);
        own = own || broker_share_holds_file(b, st);
        pthread_mutex_unlock(&b->share_lock);
        return own;
}
