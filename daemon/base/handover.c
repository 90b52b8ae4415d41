/* The hand-over between a gpumemd that stops and the next: named fds and the sealed, versioned state. */
#include "handover.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "util.h"

/*
 * The frame around the packed state: the magic, the body's length and an FNV-1a hash of it, little-endian.
 * The seals say nobody wrote the file since; the hash catches a writer that was cut short or went wrong.
 */
#define STATE_MAGIC   "GMDSTATE"
#define STATE_HDR_LEN 24u
#define SEALS_ALL     (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
        uint64_t h = 0xcbf29ce484222325ull;

        for (size_t i = 0; i < n; i++) {
                h ^= p[i];
                h *= 0x100000001b3ull;
        }
        return h;
}

static void put_le64(uint8_t *p, uint64_t v)
{
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
        uint64_t v = 0;

        for (int i = 7; i >= 0; i--)
                v = v << 8 | p[i];
        return v;
}

static int why_set(char *why, size_t len, int err, const char *fmt, ...) _printf_(4, 5);
static int why_set(char *why, size_t len, int err, const char *fmt, ...)
{
        va_list ap;

        if (why && len) {
                va_start(ap, fmt);
                vsnprintf(why, len, fmt, ap);
                va_end(ap);
        }
        return err;
}

/* Names as systemd takes them: printable ASCII without ':', at most HANDOVER_NAME_MAX - 1 bytes. */
static bool name_valid(const char *name)
{
        size_t n = strlen(name);

        if (n == 0 || n >= HANDOVER_NAME_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (name[i] <= ' ' || name[i] >= 127 || name[i] == ':')
                        return false;
        return true;
}

int handover_fds_add(HandoverFds *s, const char *name, int fd)
{
        if (fd < 0 || !name_valid(name)) {
                safe_close(fd);
                return -EINVAL;
        }
        if (ARRAY_RESERVE(s->v, s->cap, s->n + 1, 16) < 0) {
                safe_close(fd);
                return -ENOMEM;
        }
        strcpy(s->v[s->n].name, name);
        s->v[s->n].no_poll = false;
        s->v[s->n++].fd = fd;
        return 0;
}

int handover_fds_add_no_poll(HandoverFds *s, const char *name, int fd)
{
        int r = handover_fds_add(s, name, fd);

        if (r == 0)
                s->v[s->n - 1].no_poll = true;
        return r;
}

int handover_fds_take(HandoverFds *s, const char *name)
{
        for (size_t i = 0; i < s->n; i++)
                if (strcmp(s->v[i].name, name) == 0) {
                        int fd = s->v[i].fd;
                        s->v[i] = s->v[--s->n];
                        return fd;
                }
        return -ENOENT;
}

void handover_fds_done(HandoverFds *s)
{
        for (size_t i = 0; i < s->n; i++)
                safe_close(s->v[i].fd);
        free(s->v);
        *s = (HandoverFds){0};
}

int handover_fds_from_env(HandoverFds *ret)
{
        char **names = NULL;
        int n = sd_listen_fds_with_names(1, &names), r = 0;

        *ret = (HandoverFds){0};
        if (n <= 0) {
                free(names);
                return n;
        }
        for (int i = 0; i < n; i++) {
                int fd = SD_LISTEN_FDS_START + i;
                const char *name = names && names[i] ? names[i] : "unknown";
                (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
                if (r == 0)
                        r = handover_fds_add(ret, name, fd);
                else
                        safe_close(fd);
        }
        for (int i = 0; names && names[i]; i++)
                free(names[i]);
        free(names);
        if (r < 0)
                handover_fds_done(ret);
        return r < 0 ? r : n;
}

int handover_state_pack(const Gpumemd__HandoverState *st, uint8_t **ret, size_t *ret_len)
{
        size_t body = gpumemd__handover_state__get_packed_size(st);
        uint8_t *buf;

        if (body > HANDOVER_STATE_MAX - STATE_HDR_LEN)
                return -EFBIG;
        buf = malloc(STATE_HDR_LEN + body);
        if (!buf)
                return -ENOMEM;
        gpumemd__handover_state__pack(st, buf + STATE_HDR_LEN);
        memcpy(buf, STATE_MAGIC, 8);
        put_le64(buf + 8, body);
        put_le64(buf + 16, fnv1a(buf + STATE_HDR_LEN, body));
        *ret = buf;
        *ret_len = STATE_HDR_LEN + body;
        return 0;
}

int handover_state_seal(const Gpumemd__HandoverState *st, int *ret_fd)
{
        uint8_t *buf = NULL;
        size_t len = 0, done = 0;
        int fd, r;

        r = handover_state_pack(st, &buf, &len);
        if (r < 0)
                return r;
        fd = memfd_create("gpumemd-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0) {
                r = -errno;
                free(buf);
                return r;
        }
        while (done < len) {
                ssize_t n = write(fd, buf + done, len - done);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        r = n < 0 ? -errno : -EIO;
                        break;
                }
                done += (size_t)n;
        }
        free(buf);
        if (r == 0 && fcntl(fd, F_ADD_SEALS, SEALS_ALL) < 0)
                r = -errno;
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

int handover_state_parse(const uint8_t *buf, size_t len, Gpumemd__HandoverState **ret, char *why,
                         size_t why_len)
{
        Gpumemd__HandoverState *st;
        uint64_t body;

        if (len < STATE_HDR_LEN || memcmp(buf, STATE_MAGIC, 8) != 0)
                return why_set(why, why_len, -EBADMSG, "not a gpumemd state (no %s header)", STATE_MAGIC);
        body = get_le64(buf + 8);
        if (body != len - STATE_HDR_LEN)
                return why_set(why, why_len, -EBADMSG, "the state is cut short: %zu bytes of %llu",
                               len - STATE_HDR_LEN, (unsigned long long)body);
        if (fnv1a(buf + STATE_HDR_LEN, body) != get_le64(buf + 16))
                return why_set(why, why_len, -EBADMSG, "the state's checksum does not match");
        st = gpumemd__handover_state__unpack(NULL, body, buf + STATE_HDR_LEN);
        if (!st)
                return why_set(why, why_len, -EBADMSG, "the state cannot be decoded");
        if (!st->has_format || st->format == 0) {
                gpumemd__handover_state__free_unpacked(st, NULL);
                return why_set(why, why_len, -EBADMSG, "the state names no format");
        }
        if (st->format > HANDOVER_FORMAT) {
                int err = why_set(why, why_len, -EPROTONOSUPPORT,
                                  "the state is of format %u (written by gpumemd %s); this gpumemd reads "
                                  "format %u and older",
                                  st->format, st->writer_version ? st->writer_version : "?", HANDOVER_FORMAT);
                gpumemd__handover_state__free_unpacked(st, NULL);
                return err;
        }
        *ret = st;
        return 0;
}

int handover_state_open(int fd, Gpumemd__HandoverState **ret, char *why, size_t len)
{
        struct stat sb;
        void *p;
        int seals, r;

        seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0 || (seals & SEALS_ALL) != SEALS_ALL)
                return why_set(why, len, -EPERM, "the state is not a sealed memfd");
        if (fstat(fd, &sb) < 0)
                return why_set(why, len, -errno, "cannot stat the state: %s", strerror(errno));
        if (sb.st_size <= 0 || (uint64_t)sb.st_size > HANDOVER_STATE_MAX)
                return why_set(why, len, sb.st_size <= 0 ? -EBADMSG : -EFBIG, "the state has %lld bytes",
                               (long long)sb.st_size);
        p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
                return why_set(why, len, -errno, "cannot map the state: %s", strerror(errno));
        r = handover_state_parse(p, (size_t)sb.st_size, ret, why, len);
        munmap(p, (size_t)sb.st_size);
        return r;
}

/* fds per message: the kernel takes at most 253 (SCM_MAX_FD) */
#define CHANNEL_BATCH HANDOVER_CHANNEL_BATCH

int handover_channel_open(HandoverChannel *ch)
{
        int sv[2];
        /* as much room as net.core.wmem_max allows: each message of fds is a buffer of its own */
        int big = 64 << 20;

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
                return -errno;
        (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
        *ch = (HandoverChannel){.send_fd = sv[0], .recv_fd = sv[1]};
        return 0;
}

int handover_channel_send(HandoverChannel *ch, const int *fds, size_t n)
{
        union {
                struct cmsghdr h;
                char b[CMSG_SPACE(CHANNEL_BATCH * sizeof(int))];
        } ctl;
        /* the count, little-endian: a reader with a full fd table learns how many it lost */
        uint8_t count[4] = {(uint8_t)n, (uint8_t)(n >> 8), 0, 0};
        struct iovec iov = {count, sizeof(count)};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = &ctl,
                            .msg_controllen = CMSG_SPACE(n * sizeof(int))};
        struct cmsghdr *c;

        if (n == 0)
                return 0;
        if (n > CHANNEL_BATCH || ch->send_fd < 0)
                return -EINVAL;
        memset(&ctl, 0, sizeof(ctl));
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, n * sizeof(int));
        if (sendmsg(ch->send_fd, &mh, MSG_NOSIGNAL) < 0)
                return errno == EAGAIN ? -ENOBUFS : -errno;
        ch->n += n;
        return 0;
}

int handover_channel_finish(HandoverChannel *ch)
{
        int fd = ch->recv_fd;

        ch->send_fd = safe_close(ch->send_fd); /* the receiver reads to the end, then sees EOF */
        ch->recv_fd = -1;
        return fd;
}

void handover_channel_abort(HandoverChannel *ch)
{
        ch->send_fd = safe_close(ch->send_fd);
        ch->recv_fd = safe_close(ch->recv_fd);
}

int handover_channel_pack(const int *fds, size_t n, int *ret_fd)
{
        HandoverChannel ch;
        int r = handover_channel_open(&ch);

        for (size_t i = 0; r == 0 && i < n; i += CHANNEL_BATCH)
                r = handover_channel_send(&ch, fds + i, n - i < CHANNEL_BATCH ? n - i : CHANNEL_BATCH);
        if (r < 0) {
                handover_channel_abort(&ch);
                return r;
        }
        *ret_fd = handover_channel_finish(&ch);
        return 0;
}

void handover_fd_room(size_t n)
{
        struct rlimit rl;
        uint64_t want;
        int fd;

        /* a few hundred cost a doubling or two either way, and growing by more than needed costs one */
        if (n < 256 || getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < 64)
                return;
        /* beyond the fds open now, which a fresh daemon counts in hundreds at most */
        want = (uint64_t)n + 1024;
        if (want > rl.rlim_cur - 1)
                want = rl.rlim_cur - 1;
        /* a copy at the highest fd needed grows the table to it in one step; closing it keeps the room */
        fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, (int)want);
        if (fd < 0)
                fd = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, (int)want);
        if (fd >= 0)
                close(fd);
}

int handover_channel_unpack(int fd, int **ret_fds, size_t *ret_n, size_t *ret_lost)
{
        int *v = NULL;
        size_t n = 0, cap = 0, lost = 0;
        int r = 0;

        for (;;) {
                union {
                        struct cmsghdr h;
                        char b[CMSG_SPACE(CHANNEL_BATCH * sizeof(int))];
                } ctl;
                uint8_t count[4];
                struct iovec iov = {count, sizeof(count)};
                struct msghdr mh = {
                        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof(ctl)};
                ssize_t got = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
                size_t before = n, said;

                if (got == 0 || (got < 0 && errno == EAGAIN))
                        break; /* the end (EAGAIN: a sender end still open somewhere; nothing more comes) */
                if (got < 0) {
                        r = -errno;
                        break;
                }
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        size_t k;
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        if (ARRAY_RESERVE(v, cap, n + k, 256) < 0) {
                                /* the ones received before are closed with the rest below */
                                for (size_t j = 0; j < k; j++) {
                                        int x;
                                        memcpy(&x, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
                                        close(x);
                                }
                                r = -ENOMEM;
                                continue;
                        }
                        memcpy(v + n, CMSG_DATA(c), k * sizeof(int));
                        n += k;
                }
                if (!(mh.msg_flags & MSG_CTRUNC) || r < 0)
                        continue;
                /* the fds that did not fit: in their places, as -1, where the message says how many it held
                 */
                said = got == (ssize_t)sizeof(count) ? (size_t)count[0] | (size_t)count[1] << 8 : 0;
                if (said == 0 || said > CHANNEL_BATCH || said < n - before) {
                        r = -EPROTO;
                        continue;
                }
                if (ARRAY_RESERVE(v, cap, before + said, 256) < 0) {
                        r = -ENOMEM;
                        continue;
                }
                for (; n < before + said; n++) {
                        v[n] = -1;
                        lost++;
                }
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        safe_close(v[i]);
                free(v);
                return r;
        }
        *ret_fds = v;
        *ret_n = n;
        if (ret_lost)
                *ret_lost = lost;
        return 0;
}

/*
 * One datagram with one fd to the service manager. Its own socket with a send timeout: a manager (or a test's
 * supervisor) that does not read its notify socket would otherwise hold the daemon's exit for ever once the
 * socket's queue is full. SO_PASSCRED on the receiving end gives it the sender's credentials.
 */
static int notify_with_fd(const char *sock, const char *msg, int fd, uint64_t deadline_usec)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        socklen_t sa_len;
        size_t plen = strlen(sock);
        union {
                struct cmsghdr h;
                char b[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct iovec iov = {(void *)msg, strlen(msg)};
        struct msghdr mh = {.msg_name = &sa,
                            .msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = &ctl,
                            .msg_controllen = sizeof(ctl)};
        struct cmsghdr *c;
        uint64_t now = now_usec(CLOCK_MONOTONIC);
        struct timeval tv;
        int s, r = 0;

        if (plen == 0 || plen >= sizeof(sa.sun_path) || (sock[0] != '/' && sock[0] != '@'))
                return -EAFNOSUPPORT;
        memcpy(sa.sun_path, sock, plen);
        if (sock[0] == '@')
                sa.sun_path[0] = '\0'; /* an abstract address */
        sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen + (sock[0] == '/'));
        mh.msg_namelen = sa_len;
        if (now >= deadline_usec)
                return -ETIMEDOUT;
        tv = (struct timeval){(time_t)((deadline_usec - now) / 1000000),
                              (suseconds_t)((deadline_usec - now) % 1000000)};
        s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -errno;
        (void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        memset(&ctl, 0, sizeof(ctl));
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
        if (sendmsg(s, &mh, MSG_NOSIGNAL) < 0)
                r = errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        close(s);
        return r;
}

/* How long the service manager gets to take the fds, all of them. */
#define STORE_TIMEOUT_USEC (5u * 1000000u)

int handover_store(const HandoverFds *s)
{
        char msg[32 + HANDOVER_NAME_MAX];
        const char *sock = getenv("NOTIFY_SOCKET");
        uint64_t deadline = now_usec(CLOCK_MONOTONIC) + STORE_TIMEOUT_USEC;

        if (!sock || !*sock)
                return -ENOTCONN;
        for (size_t i = 0; i < s->n; i++) {
                int r;
                snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s%s", s->v[i].name,
                         s->v[i].no_poll ? "\nFDPOLL=0" : "");
                r = notify_with_fd(sock, msg, s->v[i].fd, deadline);
                if (r < 0)
                        return r;
        }
        return 0;
}

int handover_store_remove(const char *name)
{
        char msg[32 + HANDOVER_NAME_MAX];
        int r;

        if (!name_valid(name))
                return -EINVAL;
        snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
        r = sd_notify(0, msg);
        return r < 0 ? r : 0;
}

int handover_exec(const char *path, char *const argv[], HandoverFds *s)
{
        size_t names_len = 1;
        char *names, *p, num[32];
        int r;

        for (size_t i = 0; i < s->n; i++)
                names_len += strlen(s->v[i].name) + 1;
        names = malloc(names_len);
        if (!names)
                return -ENOMEM;
        p = names;
        for (size_t i = 0; i < s->n; i++) {
                size_t len = strlen(s->v[i].name);

                if (i)
                        *p++ = ':';
                memcpy(p, s->v[i].name, len);
                p += len;
        }
        *p = '\0';
        /* Out of the way of 3..3+n first, so that no fd lands on one not yet moved. */
        for (size_t i = 0; i < s->n; i++) {
                int fd = fcntl(s->v[i].fd, F_DUPFD_CLOEXEC, (int)(SD_LISTEN_FDS_START + s->n));
                if (fd < 0) {
                        r = -errno;
                        free(names);
                        return r;
                }
                close(s->v[i].fd);
                s->v[i].fd = fd;
        }
        for (size_t i = 0; i < s->n; i++) {
                int to = SD_LISTEN_FDS_START + (int)i;
                /* dup2 leaves the new fd open across exec; whatever of this process had that number is
                 * replaced (the process is about to be replaced as a whole) */
                if (dup2(s->v[i].fd, to) < 0) {
                        r = -errno;
                        free(names);
                        return r;
                }
                close(s->v[i].fd);
                s->v[i].fd = to;
        }
        if (s->n == 0) {
                /* nothing to pass: sd_listen_fds() takes LISTEN_FDS=0 for an error */
                unsetenv("LISTEN_PID");
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_FDNAMES");
                free(names);
                execv(path, argv);
                return -errno;
        }
        snprintf(num, sizeof(num), "%d", (int)getpid());
        setenv("LISTEN_PID", num, 1);
        snprintf(num, sizeof(num), "%zu", s->n);
        setenv("LISTEN_FDS", num, 1);
        setenv("LISTEN_FDNAMES", names, 1);
        free(names);
        execv(path, argv);
        r = -errno;
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        return r;
}
