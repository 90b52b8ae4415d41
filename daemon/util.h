/* Small helpers for gpumemd's daemon code: cleanup attributes, ownership transfer, bounded formatting. */
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define _cleanup_(f)   __attribute__((cleanup(f)))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _unused_       __attribute__((unused))

/* Move ownership out of a variable: the variable is left NULL (or -1 for fds). */
#define TAKE_PTR(p)                                                                                          \
        ({                                                                                                   \
                __typeof__(p) _p_ = (p);                                                                     \
                (p) = NULL;                                                                                  \
                _p_;                                                                                         \
        })
#define TAKE_FD(fd)                                                                                          \
        ({                                                                                                   \
                int _fd_ = (fd);                                                                             \
                (fd) = -1;                                                                                   \
                _fd_;                                                                                        \
        })

static inline void freep(void *p)
{
        free(*(void **)p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline int safe_close(int fd)
{
        if (fd >= 0) {
                int saved = errno;
                close(fd);
                errno = saved;
        }
        return -1;
}

static inline void closep(int *fd)
{
        *fd = safe_close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

static inline void fclosep(FILE **f)
{
        if (*f)
                fclose(*f);
}
#define _cleanup_fclose_ _cleanup_(fclosep)

#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)                                                              \
        static inline void func##p(type *p)                                                                  \
        {                                                                                                    \
                if (*p)                                                                                      \
                        *p = func(*p);                                                                       \
        }

static inline uint64_t now_usec(clockid_t clock)
{
        struct timespec ts;
        clock_gettime(clock, &ts);
        return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Parse a whole unsigned number (decimal, or 0x hex) with an optional binary size suffix (K, M, G, T). */
int parse_size(const char *s, uint64_t *ret);
/* Parse a whole unsigned number with no suffix. */
int parse_uint(const char *s, uint64_t max, uint64_t *ret);
/* Parse yes/no/true/false/1/0/on/off. */
int parse_bool(const char *s, bool *ret);
