/* Small helpers of the daemon's own: clocks and the parsing of settings (the shared ones are in util/). */
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

#include "macro.h"

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
/*
 * Append "PATH:LINE: message\n" to the list of a config file's errors in @buf (NUL-terminated, @len bytes in
 * all); a line that does not fit whole is cut or left out.
 */
void error_list_vadd(char *buf, size_t len, const char *path, unsigned line, const char *fmt, va_list ap)
        _printf_(5, 0);
