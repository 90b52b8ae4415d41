/* The assertion helper of gpumemd's C tests: checks that report file:line and both values, test runners, and
 * fds passed over Unix sockets. */
#pragma once

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/*
 * Three flavours of every check, all counted in check_failures and reported in one format
 * ("FILE:LINE: check failed: ..."); they differ only in what follows a failure:
 *   CHECK*    go on, so that one run shows every broken expectation;
 *   REQUIRE*  return 1 from the calling function (a case or helper returning 0 or 1), for checks whose
 *             failure leaves nothing sensible to test after them;
 *   ASSERT*   exit(EXIT_FAILURE), for programs that have nothing to unwind.
 * Each of them comes as X(cond), X_EQ(a, b) (integers, both values shown), X_RC(expr, want) (0 or a
 * negative errno, both shown with their text) and X_STR_CONTAINS(hay, needle).
 */

/* Weak, so that the files of one test program share one counter without one of them defining it. */
int check_failures __attribute__((weak));

static inline void check_failed(const char *file, int line, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static inline void check_failed(const char *file, int line, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "%s:%d: check failed: %s\n", file, line, msg);
        __atomic_fetch_add(&check_failures, 1, __ATOMIC_RELAXED);
}

/* @v in decimal, and in hex too where it is too large to read as a count (addresses, sizes, masks). */
static inline const char *check_fmt_int(char *buf, size_t len, long long v)
{
        if (v > -65536 && v < 65536)
                snprintf(buf, len, "%lld", v);
        else
                snprintf(buf, len, "%lld (%#llx)", v, (unsigned long long)v);
        return buf;
}

/* @v as a return code: the number and its errno text ("Success" for 0). */
static inline const char *check_fmt_rc(char *buf, size_t len, long long v)
{
        snprintf(buf, len, "%lld (%s)", v, strerror(v < 0 ? (int)-v : (int)v));
        return buf;
}

static inline void check_failed_eq(const char *file, int line, const char *ea, const char *eb, long long a,
                                   long long b, const char *(*fmt)(char *, size_t, long long))
{
        char va[96], vb[96];

        check_failed(file, line, "%s == %s: %s != %s", ea, eb, fmt(va, sizeof(va), a),
                     fmt(vb, sizeof(vb), b));
}

#define CHECK_THEN_(cond, on_fail)                                                                           \
        do {                                                                                                 \
                if (!(cond)) {                                                                               \
                        check_failed(__FILE__, __LINE__, "%s", #cond);                                       \
                        on_fail;                                                                             \
                }                                                                                            \
        } while (0)

#define CHECK_EQ_THEN_(a, b, fmt, on_fail)                                                                   \
        do {                                                                                                 \
                long long check_a_ = (long long)(a), check_b_ = (long long)(b);                              \
                if (check_a_ != check_b_) {                                                                  \
                        check_failed_eq(__FILE__, __LINE__, #a, #b, check_a_, check_b_, fmt);                \
                        on_fail;                                                                             \
                }                                                                                            \
        } while (0)

#define CHECK_STR_CONTAINS_THEN_(hay, needle, on_fail)                                                       \
        do {                                                                                                 \
                const char *check_h_ = (hay), *check_n_ = (needle);                                          \
                if (!check_h_ || !strstr(check_h_, check_n_)) {                                              \
                        check_failed(__FILE__, __LINE__, "%s contains '%s': '%s'", #hay, check_n_,           \
                                     check_h_ ? check_h_ : "(null)");                                        \
                        on_fail;                                                                             \
                }                                                                                            \
        } while (0)

#define CHECK(cond)                     CHECK_THEN_(cond, (void)0)
#define CHECK_EQ(a, b)                  CHECK_EQ_THEN_(a, b, check_fmt_int, (void)0)
#define CHECK_RC(expr, want)            CHECK_EQ_THEN_(expr, want, check_fmt_rc, (void)0)
#define CHECK_STR_CONTAINS(hay, needle) CHECK_STR_CONTAINS_THEN_(hay, needle, (void)0)

#define REQUIRE(cond)                     CHECK_THEN_(cond, return 1)
#define REQUIRE_EQ(a, b)                  CHECK_EQ_THEN_(a, b, check_fmt_int, return 1)
#define REQUIRE_RC(expr, want)            CHECK_EQ_THEN_(expr, want, check_fmt_rc, return 1)
#define REQUIRE_STR_CONTAINS(hay, needle) CHECK_STR_CONTAINS_THEN_(hay, needle, return 1)

#define ASSERT(cond)                     CHECK_THEN_(cond, exit(EXIT_FAILURE))
#define ASSERT_EQ(a, b)                  CHECK_EQ_THEN_(a, b, check_fmt_int, exit(EXIT_FAILURE))
#define ASSERT_RC(expr, want)            CHECK_EQ_THEN_(expr, want, check_fmt_rc, exit(EXIT_FAILURE))
#define ASSERT_STR_CONTAINS(hay, needle) CHECK_STR_CONTAINS_THEN_(hay, needle, exit(EXIT_FAILURE))

/* Number of open fds of @pid (0 = this process), or a negative errno. */
static inline int count_fds(int pid)
{
        char path[64];
        DIR *d;
        struct dirent *e;
        int n = 0;

        if (pid)
                snprintf(path, sizeof(path), "/proc/%d/fd", pid);
        else
                snprintf(path, sizeof(path), "/proc/self/fd");
        d = opendir(path);
        if (!d)
                return -errno;
        while ((e = readdir(d)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(d);
        return pid ? n : n - 1; /* the directory stream's own fd */
}

typedef struct TestCase {
        const char *name;
        void (*fn)(void);
} TestCase;

/* Run every case, checking that none leaves an fd open; prints one line per case and a summary. */
static inline int run_tests(const TestCase *cases, size_t n)
{
        int passed = 0, failed = 0;

        for (size_t i = 0; i < n; i++) {
                int before = check_failures;
                int fds = count_fds(0);
                cases[i].fn();
                int leaked = count_fds(0) - fds;
                if (leaked != 0) {
                        fprintf(stderr, "%s: leaked %d fd(s)\n", cases[i].name, leaked);
                        check_failures++;
                }
                if (check_failures == before) {
                        printf("ok %zu - %s\n", i + 1, cases[i].name);
                        passed++;
                } else {
                        printf("not ok %zu - %s\n", i + 1, cases[i].name);
                        failed++;
                }
                fflush(stdout);
        }
        printf("%d passed, %d failed\n", passed, failed);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* A case that returns 0, or 1 when it failed (it stops at its first failed REQUIRE). */
typedef struct RcTestCase {
        const char *name;
        int (*fn)(void);
} RcTestCase;

/*
 * Run the case called @name, or every case when @name is NULL (one meson test per case passes its name).
 * A case fails when it returns non-zero or a CHECK in it failed. Prints "ok NAME" or "FAIL NAME" for each;
 * returns 0, 1 when any failed, 2 when no case is called @name.
 */
static inline int run_rc_tests(const RcTestCase *cases, size_t n, const char *name)
{
        int failed = 0, ran = 0;

        for (size_t i = 0; i < n; i++) {
                int before = check_failures;

                if (name && strcmp(name, cases[i].name) != 0)
                        continue;
                ran++;
                if (cases[i].fn() != 0 || check_failures != before) {
                        fprintf(stderr, "FAIL %s\n", cases[i].name);
                        failed++;
                } else {
                        printf("ok %s\n", cases[i].name);
                }
        }
        if (ran == 0) {
                fprintf(stderr, "no test named %s\n", name ? name : "");
                return 2;
        }
        return failed ? 1 : 0;
}

/* the same as util/macro.h's, for tests that do not include it */
#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif

/* ---- fds passed over a Unix socket (SCM_RIGHTS) ---- */

/*
 * One packet of @len bytes with @n_fds fds (up to the kernel's 253; more than the protocol allows too): what
 * sendmsg() returned, -1 with errno on failure.
 */
static inline ssize_t send_with_fds(int sock, const void *buf, size_t len, const int *fds, size_t n_fds,
                                    int flags)
{
        char ctl[CMSG_SPACE(253 * sizeof(int))] __attribute__((aligned(__alignof__(struct cmsghdr))));
        struct iovec iov = {(void *)buf, len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        struct cmsghdr *c;

        if (n_fds > 253) {
                errno = EINVAL;
                return -1;
        }
        if (n_fds) {
                msg.msg_control = ctl;
                msg.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
                memset(ctl, 0, msg.msg_controllen);
                c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
                memcpy(CMSG_DATA(c), fds, n_fds * sizeof(int));
        }
        return sendmsg(sock, &msg, flags);
}

/* @fd passed to whoever reads @sock, with one byte: 0 or a negative errno. */
static inline int send_one_fd(int sock, int fd)
{
        return send_with_fds(sock, "F", 1, &fd, 1, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

/* The fd that came with the next packet on @sock (close-on-exec; @flags: MSG_DONTWAIT, say), -1 when none. */
static inline int recv_one_fd(int sock, int flags)
{
        char b[8], ctl[CMSG_SPACE(sizeof(int))] __attribute__((aligned(__alignof__(struct cmsghdr))));
        struct iovec iov = {b, sizeof(b)};
        struct msghdr msg = {
                .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
        int fd = -1;

        if (recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC) <= 0)
                return -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                        memcpy(&fd, CMSG_DATA(c), sizeof(int));
        return fd;
}
