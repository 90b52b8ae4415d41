/* Helpers every part of gpumemd shares (daemon, thunk, client library): array size, cleanup, ownership. */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* One set of flag bits in another's terms: the @to of every pair of @map whose @from is in @f. */
typedef struct FlagMap {
        uint32_t from, to;
} FlagMap;
static inline uint32_t flags_map(uint32_t f, const FlagMap *map, size_t n)
{
        uint32_t t = 0;

        for (size_t i = 0; i < n; i++)
                if (f & map[i].from)
                        t |= map[i].to;
        return t;
}

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

/* The first of the @n elements of array @a whose @member equals @key, or NULL. */
#define ARRAY_FIND(a, n, member, key)                                                                        \
        ({                                                                                                   \
                __typeof__(&(a)[0]) _found_ = NULL;                                                          \
                for (size_t _i_ = 0; _i_ < (n) && !_found_; _i_++)                                           \
                        if ((a)[_i_].member == (key))                                                        \
                                _found_ = &(a)[_i_];                                                         \
                _found_;                                                                                     \
        })

/* Append @item, its next already NULL, to the singly linked list from @head to @tail. */
#define LIST_APPEND(head, tail, item)                                                                        \
        do {                                                                                                 \
                if (tail)                                                                                    \
                        (tail)->next = (item);                                                               \
                else                                                                                         \
                        (head) = (item);                                                                     \
                (tail) = (item);                                                                             \
        } while (0)

static inline void freep(void *p)
{
        free(*(void **)p);
}
#define _cleanup_free_ _cleanup_(freep)

/* Close @fd if it is one, keeping errno; returns -1 for "fd = safe_close(fd)". */
static inline int safe_close(int fd)
{
        if (fd >= 0) {
                int saved = errno;
                close(fd);
                errno = saved;
        }
        return -1;
}

/* A close-on-exec copy of @fd above stdio in *@ret_fd, for a caller that hands it on: 0, or -errno with
 * *@ret_fd untouched. */
static inline int fd_dup_into(int fd, int *ret_fd)
{
        int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);

        if (copy < 0)
                return -errno;
        *ret_fd = copy;
        return 0;
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

/*
 * A value one thread writes and others read without a lock (counters, settings a reload changes): relaxed
 * atomics, which compile to plain loads and stores on x86 and keep ThreadSanitizer informed. COUNTER_ADD is
 * for a counter with a single writer only.
 */
#define READ_ONCE(x)      __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define WRITE_ONCE(x, v)  __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define COUNTER_ADD(x, n) WRITE_ONCE(x, READ_ONCE(x) + (n))
