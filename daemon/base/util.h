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

#include "array.h"
#include "macro.h"

static inline uint64_t now_usec(clockid_t clock)
{
        struct timespec ts;
        clock_gettime(clock, &ts);
        return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The time @usec from now on @clock: a deadline for pthread_cond_timedwait() and the like. */
static inline struct timespec timespec_after_usec(clockid_t clock, uint64_t usec)
{
        struct timespec ts;

        clock_gettime(clock, &ts);
        ts.tv_sec += (time_t)(usec / 1000000u);
        ts.tv_nsec += (long)(usec % 1000000u) * 1000;
        if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
        }
        return ts;
}

/* Parse a whole unsigned number (decimal, or 0x hex) with an optional binary size suffix (K, M, G, T). */
int parse_size(const char *s, uint64_t *ret);
/* parse_size(), or "N%": N percent (1 to 100) of the node's memory as it is now. */
int parse_size_or_percent(const char *s, uint64_t *ret);
/* Parse a whole unsigned number with no suffix. */
int parse_uint(const char *s, uint64_t max, uint64_t *ret);
/* Parse yes/no/true/false/1/0/on/off. */
int parse_bool(const char *s, bool *ret);
/* A config file read through inih (ini_parse_stream): the line it is at, and the list of its errors. */
typedef struct ConfigReader {
        FILE *f;
        const char *path;
        unsigned line;
        char *err; /* "FILE:LINE: message\n" each (what does not fit is cut or left out), or NULL */
        size_t errlen;
        unsigned n_errors;
} ConfigReader;

/* Open @path. A missing file that need not exist gives -ENOENT; another failure is said in the error list. */
int config_reader_open(ConfigReader *r, const char *path, bool must_exist, char *err, size_t errlen);
void config_reader_close(ConfigReader *r);
/* The next line, counted: what an ini_parse_stream reader returns. */
char *config_reader_gets(ConfigReader *r, char *str, int num);
/* A line that starts a section: its name and its length, or SIZE_MAX for a header without ']'. */
bool config_line_section(const char *line, const char **ret_name, size_t *ret_len);
/* An error at the current line. */
void config_error(ConfigReader *r, const char *fmt, ...) _printf_(2, 3);
