/* gpumemctl's parts: the command line (gpumemctl.c), its output (gpumemctl-output.c) and the commands
 * (gpumemctl-daemon.c, gpumemctl-objects.c, gpumemctl-cdi.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>
#include <libsmartcols/libsmartcols.h>

#include "gpumem-client.h"

#define GPUMEMCTL_JSON_SCHEMA 1
#define ARRAY_SIZE(a)         (sizeof(a) / sizeof((a)[0]))

typedef struct Ctl {
        gm_client *c;
        bool json;
        const char *socket;
        const char *columns; /* -o: the table's columns, or "+A,B" for its defaults and these */
        bool noheadings;     /* -n */
        bool raw;            /* -r: one space between columns, unaligned, spaces escaped */
} Ctl;

/* Exit statuses (gpumemctl(1)): scripts tell these apart. */
enum {
        EXIT_FAILED = 1,      /* the daemon refused or failed the request */
        EXIT_USAGE = 2,       /* bad command line: nothing was asked of the daemon */
        EXIT_UNREACHABLE = 3, /* no daemon answered at the socket */
        EXIT_DENIED = 4,      /* the daemon refused: not allowed (EPERM, EACCES) */
        EXIT_NOT_FOUND = 5,   /* no such client, class or object (ENOENT, ESRCH) */
};

/* --json: failures are JSON objects on stdout too (json_error); -b: sizes as exact byte counts. */
extern bool json_errors;
extern bool exact_bytes;

/* JSON documents: a new one carries the schema; jprint() prints one on a line and frees it. */
json_object *jdoc(void);
void jstr(json_object *o, const char *key, const char *v);
void ju64(json_object *o, const char *key, uint64_t v);
void ji64(json_object *o, const char *key, int64_t v);
void jbool(json_object *o, const char *key, bool v);
void jlimit(json_object *o, const char *key, uint64_t v);
json_object *jarray(json_object *o, const char *key);
void jprint(json_object *o, int flags);

/* A document of one list, {"schema":1,"@key":[...]}: an object for each of the @n items (of @size bytes,
 * from @items) that @fn fills in. EXIT_SUCCESS. */
int jlist(const char *key, const void *items, size_t n, size_t size,
          void (*fn)(json_object *j, const void *item));
/* The key of the JSON object j named as the field of *s whose value it holds, for X-macro lists of the
 * fields (joined by commas). */
#define J_U64(f) ju64(j, #f, s->f)
#define J_STR(f) jstr(j, #f, s->f)

/* What a command that did one thing prints: with --json {"schema":1,"@key":@value}, else the line @fmt
 * makes (none when NULL). @value is taken. EXIT_SUCCESS. */
int print_done(Ctl *ctl, const char *key, json_object *value, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

/* For people: a size ("1.5 GiB", or bytes with -b), a time (UTC, ISO 8601) and an age ("3d4h"). */
const char *human_bytes(uint64_t v, char *buf, size_t len);
void fmt_time(uint64_t usec, char *buf, size_t len);
void fmt_age(uint64_t usec, char *buf, size_t len);

/* Failures, each on stderr (and kept as JSON with --json), returning the exit status: the daemon's
 * (fail), one found here (command_error) and a bad command line (usage_error, EXIT_USAGE). */
void json_error(int err, const char *what, const char *reason, int status);
void json_error_flush(void);
int fail(Ctl *ctl, const char *what, int err);
int command_error(int err, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef struct ColumnSpec {
        char name[16];
        double whint; /* width hint: < 1 a fraction of the terminal, else columns */
        int flags;    /* SCOLS_FL_* */
        bool shown;   /* one of the table's default columns */
} ColumnSpec;

#define TABLE_MAX_COLUMNS 32

typedef struct Table {
        struct libscols_table *tb;
        struct libscols_line *line;
        ColumnSpec spec[TABLE_MAX_COLUMNS];
        size_t n_spec;
        int cell[TABLE_MAX_COLUMNS]; /* per spec column: its place in the table, or -1 when not shown */
        bool oom;                    /* a row or a cell could not be made: the table is not printed */
        const char *unknown;         /* a cell was set in a column the table does not have */
} Table;

/*
 * A table of the @columns, in their order, each NAME:WIDTH, with r (right-aligned), t (truncated) or w
 * (wrapped) after the width: in columns, or below 1 a share of the terminal's; those after a "|" are shown
 * only when -o names them. 0, or the exit status after saying why (EXIT_USAGE for a column -o names that
 * the table does not have).
 */
int table_new(Ctl *ctl, Table *t, const char *what, const char *columns);
void table_row(Table *t);
/* The current row's cell in the column named @column, if that column is shown. */
void table_cell(Table *t, const char *column, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int table_print(Table *t);

/* The commands: @argv[0] is the command's name. An exit status. */
int cmd_status(Ctl *ctl, int argc, char **argv);
int cmd_topology(Ctl *ctl, int argc, char **argv);
int cmd_clients(Ctl *ctl, int argc, char **argv);
int cmd_disconnect(Ctl *ctl, int argc, char **argv);
int cmd_metrics(Ctl *ctl, int argc, char **argv);
int cmd_log_level(Ctl *ctl, int argc, char **argv);
int cmd_ping(Ctl *ctl, int argc, char **argv);
int cmd_allocations(Ctl *ctl, int argc, char **argv);
int cmd_shared(Ctl *ctl, int argc, char **argv);
int cmd_quota(Ctl *ctl, int argc, char **argv);
int cmd_cdi(Ctl *ctl, int argc, char **argv);
