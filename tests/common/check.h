/* Minimal test helpers shared by gpumemd's C tests: checks that report file:line and a test runner. */
#pragma once

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures __attribute__((unused));

#define CHECK(cond)                                                                                          \
        do {                                                                                                 \
                if (!(cond)) {                                                                               \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);             \
                        check_failures++;                                                                    \
                }                                                                                            \
        } while (0)

#define CHECK_EQ(a, b)                                                                                       \
        do {                                                                                                 \
                long long _a = (long long)(a), _b = (long long)(b);                                          \
                if (_a != _b) {                                                                              \
                        fprintf(stderr, "%s:%d: check failed: %s == %s (%lld != %lld)\n", __FILE__,          \
                                __LINE__, #a, #b, _a, _b);                                                   \
                        check_failures++;                                                                    \
                }                                                                                            \
        } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                                      \
        do {                                                                                                 \
                const char *_h = (hay);                                                                      \
                if (!_h || !strstr(_h, (needle))) {                                                          \
                        fprintf(stderr, "%s:%d: check failed: '%s' does not contain '%s'\n", __FILE__,       \
                                __LINE__, _h ? _h : "(null)", (needle));                                     \
                        check_failures++;                                                                    \
                }                                                                                            \
        } while (0)

/* Number of open fds of @pid (0 = this process). */
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

/* the same as util/macro.h's, for tests that do not include it */
#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif
