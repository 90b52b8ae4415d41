/* gpumemctl's output: JSON documents and errors, tables (libsmartcols), sizes and times for people. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumemctl.h"

/* --json: what failed, as one JSON object on stdout, so that a script reading stdout sees it; main()
 * prints it in place of whatever the command began to print */
bool json_errors;
static char json_error_buf[4096]; /* a reason (512) and a path (PATH_MAX), escaped */

/* JSON is built with json-c and printed one document per line (PLAIN: no spaces, '/' unescaped). */
json_object *jdoc(void)
{
        json_object *o = json_object_new_object();
        json_object_object_add(o, "schema", json_object_new_int(GPUMEMCTL_JSON_SCHEMA));
        return o;
}

void jstr(json_object *o, const char *key, const char *v)
{
        json_object_object_add(o, key, json_object_new_string(v ? v : ""));
}

void ju64(json_object *o, const char *key, uint64_t v)
{
        json_object_object_add(o, key, json_object_new_uint64(v));
}

void ji64(json_object *o, const char *key, int64_t v)
{
        json_object_object_add(o, key, json_object_new_int64(v));
}

void jbool(json_object *o, const char *key, bool v)
{
        json_object_object_add(o, key, json_object_new_boolean(v));
}

/* A limit: null for none. */
void jlimit(json_object *o, const char *key, uint64_t v)
{
        json_object_object_add(o, key, v == GM_UNLIMITED ? NULL : json_object_new_uint64(v));
}

json_object *jarray(json_object *o, const char *key)
{
        json_object *a = json_object_new_array();
        json_object_object_add(o, key, a);
        return a;
}

/* Prints @o on one line and frees it. */
void jprint(json_object *o, int flags)
{
        puts(json_object_to_json_string_ext(o, flags | JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
}

/* -b: sizes as exact byte counts, for scripts (tables only; JSON always has bytes) */
bool exact_bytes;

const char *human_bytes(uint64_t v, char *buf, size_t len)
{
        static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
        double d = (double)v;
        size_t u = 0;

        if (exact_bytes) {
                snprintf(buf, len, "%" PRIu64, v);
                return buf;
        }

        while (d >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
                d /= 1024.0;
                u++;
        }
        if (u == 0)
                snprintf(buf, len, "%" PRIu64 " B", v);
        else
                snprintf(buf, len, "%.1f %s", d, units[u]);
        return buf;
}

void fmt_time(uint64_t usec, char *buf, size_t len)
{
        time_t t = (time_t)(usec / 1000000);
        struct tm tm;
        if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
                snprintf(buf, len, "-");
}

/* "3d4h", "12m", "40s": how long ago @usec (CLOCK_REALTIME) was. */
void fmt_age(uint64_t usec, char *buf, size_t len)
{
        struct timespec ts;
        uint64_t now, s;

        clock_gettime(CLOCK_REALTIME, &ts);
        now = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        s = now > usec ? (now - usec) / 1000000u : 0;
        if (s >= 86400)
                snprintf(buf, len, "%" PRIu64 "d%" PRIu64 "h", s / 86400, s % 86400 / 3600);
        else if (s >= 3600)
                snprintf(buf, len, "%" PRIu64 "h%" PRIu64 "m", s / 3600, s % 3600 / 60);
        else if (s >= 60)
                snprintf(buf, len, "%" PRIu64 "m", s / 60);
        else
                snprintf(buf, len, "%" PRIu64 "s", s);
}

/* The error as JSON on stdout: {"schema":1,"error":{"errno":-22,"name":"EINVAL","reason":"..."},...}. */
void json_error(int err, const char *what, const char *reason, int status)
{
        const char *name = strerrorname_np(-err);
        json_object *o = jdoc(), *e = json_object_new_object();

        ji64(e, "errno", err);
        jstr(e, "name", name ? name : "");
        jstr(e, "what", what);
        jstr(e, "reason", reason);
        json_object_object_add(o, "error", e);
        ji64(o, "exit_status", status);
        snprintf(json_error_buf, sizeof(json_error_buf), "%s\n",
                 json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
}

int jlist(const char *key, const void *items, size_t n, size_t size,
          void (*fn)(json_object *j, const void *item))
{
        json_object *o = jdoc(), *list = jarray(o, key);

        for (size_t i = 0; i < n; i++) {
                json_object *j = json_object_new_object();
                fn(j, (const uint8_t *)items + i * size);
                json_object_array_add(list, j);
        }
        jprint(o, JSON_C_TO_STRING_PLAIN);
        return EXIT_SUCCESS;
}

int print_done(Ctl *ctl, const char *key, json_object *value, const char *fmt, ...)
{
        va_list ap;

        if (ctl->json) {
                json_object *o = jdoc();
                json_object_object_add(o, key, value);
                jprint(o, JSON_C_TO_STRING_PLAIN);
                return EXIT_SUCCESS;
        }
        json_object_put(value);
        if (fmt) {
                va_start(ap, fmt);
                vprintf(fmt, ap);
                va_end(ap);
        }
        return EXIT_SUCCESS;
}

/* Prints the error a command left (JSON mode), or nothing. */
void json_error_flush(void)
{
        if (json_error_buf[0])
                fputs(json_error_buf, stdout);
        json_error_buf[0] = '\0';
}

static int exit_status_of(int err)
{
        switch (err) {
        case -EPERM:
        case -EACCES:
                return EXIT_DENIED;
        case -ENOENT:
        case -ESRCH:
                return EXIT_NOT_FOUND;
        default:
                return EXIT_FAILED;
        }
}

int fail(Ctl *ctl, const char *what, int err)
{
        char buf[512];
        int status = exit_status_of(err);

        gm_strerror(ctl->c, err, buf, sizeof(buf));
        fprintf(stderr, "gpumemctl: %s: %s\n", what, buf);
        if (json_errors)
                json_error(err, what, buf, status);
        return status;
}

/* A failure found here, not by the daemon: as fail() does, with its own reason. */
int command_error(int err, const char *what, const char *fmt, ...)
{
        char buf[512];
        va_list ap;
        int status = exit_status_of(err);

        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        fprintf(stderr, "gpumemctl: %s: %s\n", what, buf);
        if (json_errors)
                json_error(err, what, buf, status);
        return status;
}

/* A bad command line: the message on stderr (and as JSON with --json); exit status 2. */
int usage_error(const char *fmt, ...)
{
        char buf[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        fprintf(stderr, "gpumemctl: %s\n", buf);
        if (json_errors)
                json_error(-EINVAL, "usage", buf, EXIT_USAGE);
        return EXIT_USAGE;
}

/*
 * Tables, printed with libsmartcols (util-linux's table printer: widths, truncation, raw output), so that
 * every table takes the same -o, -n and -r as lsblk or findmnt do.
 */

/* Out of memory while making the table: nothing printed, the table let go. */
static int table_fail(Table *t, const char *what)
{
        scols_unref_table(t->tb);
        t->tb = NULL;
        return command_error(-ENOMEM, what, "out of memory");
}

static int table_add_column(Table *t, size_t k, size_t *placed)
{
        if (t->cell[k] >= 0)
                return 0; /* asked for twice: shown once */
        if (!scols_table_new_column(t->tb, t->spec[k].name, t->spec[k].whint, t->spec[k].flags))
                return -ENOMEM;
        t->cell[k] = (int)(*placed)++;
        return 0;
}

/* @columns (see table_new) into @t's spec: false for a list this program got wrong. */
static bool table_columns(Table *t, const char *columns)
{
        bool shown = true;
        char *end;

        for (const char *p = columns + strspn(columns, " "); *p; p += strspn(p, " ")) {
                ColumnSpec *c = &t->spec[t->n_spec];
                size_t len = strcspn(p, ":| ");

                if (*p == '|') {
                        shown = false;
                        p++;
                        continue;
                }
                if (t->n_spec == TABLE_MAX_COLUMNS || len == 0 || len >= sizeof(c->name) || p[len] != ':')
                        return false;
                memcpy(c->name, p, len);
                c->name[len] = '\0';
                c->whint = strtod(p + len + 1, &end); /* gpumemctl keeps the C locale: a '.' */
                p = end;
                c->shown = shown;
                for (; *p && *p != ' '; p++) {
                        if (!strchr("rtw", *p))
                                return false;
                        c->flags |= *p == 'r' ? SCOLS_FL_RIGHT : *p == 't' ? SCOLS_FL_TRUNC : SCOLS_FL_WRAP;
                }
                t->n_spec++;
        }
        return true;
}

/* The columns -o names (case does not matter), in its order, or the defaults; EXIT_USAGE for a name the
 * table does not have, listing those it has. */
int table_new(Ctl *ctl, Table *t, const char *what, const char *columns)
{
        const char *list = ctl->columns;
        const ColumnSpec *spec = t->spec;
        size_t placed = 0;

        memset(t, 0, sizeof(*t));
        for (size_t k = 0; k < TABLE_MAX_COLUMNS; k++)
                t->cell[k] = -1;
        if (!table_columns(t, columns))
                return command_error(-EINVAL, what, "no table of the columns '%s'", columns);
        t->tb = scols_new_table();
        if (!t->tb)
                return command_error(-ENOMEM, what, "out of memory");
        scols_table_set_stream(t->tb, stdout);
        scols_table_enable_noheadings(t->tb, ctl->noheadings);
        scols_table_enable_raw(t->tb, ctl->raw);
        if (!list || *list == '+') {
                for (size_t k = 0; k < t->n_spec; k++)
                        if (spec[k].shown && table_add_column(t, k, &placed) < 0)
                                return table_fail(t, what);
                if (list)
                        list++;
        }
        while (list && *list) {
                size_t len = strcspn(list, ","), k;
                for (k = 0; k < t->n_spec; k++)
                        if (strlen(spec[k].name) == len && strncasecmp(spec[k].name, list, len) == 0)
                                break;
                if (k == t->n_spec) {
                        char names[512] = "";
                        size_t at = 0;
                        /* the names joined by commas, as many as fit whole */
                        for (size_t i = 0; i < t->n_spec; i++) {
                                size_t n = strlen(spec[i].name);
                                if (at + 1 + n >= sizeof(names))
                                        break;
                                if (i)
                                        names[at++] = ',';
                                memcpy(names + at, spec[i].name, n + 1);
                                at += n;
                        }
                        scols_unref_table(t->tb);
                        t->tb = NULL;
                        return usage_error("%s has no column '%.*s' (its columns: %s)", what, (int)len, list,
                                           names);
                }
                if (table_add_column(t, k, &placed) < 0)
                        return table_fail(t, what);
                list += len;
                if (*list == ',')
                        list++;
        }
        return 0;
}

/* A new row, every cell "-" until set: a raw table's rows then always have every field. */
void table_row(Table *t)
{
        t->line = scols_table_new_line(t->tb, NULL);
        t->oom |= !t->line;
        for (size_t k = 0; t->line && k < t->n_spec; k++)
                if (t->cell[k] >= 0)
                        t->oom |= scols_line_set_data(t->line, (size_t)t->cell[k], "-") < 0;
}

/* "-" stands for nothing. */
void table_cell(Table *t, const char *column, const char *fmt, ...)
{
        char buf[1024];
        va_list ap;
        size_t k = 0;

        while (k < t->n_spec && strcmp(t->spec[k].name, column) != 0)
                k++;
        if (k == t->n_spec)
                t->unknown = column;
        if (!t->line || k == t->n_spec || t->cell[k] < 0)
                return;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        t->oom |= scols_line_set_data(t->line, (size_t)t->cell[k], buf[0] ? buf : "-") < 0;
}

int table_print(Table *t)
{
        if (t->oom)
                return table_fail(t, "table");
        if (t->unknown) {
                scols_unref_table(t->tb);
                t->tb = NULL;
                return command_error(-EINVAL, "table", "no column %s", t->unknown);
        }
        int r = scols_print_table(t->tb);
        scols_unref_table(t->tb);
        t->tb = NULL;
        return r < 0 ? command_error(r, "table", "cannot print it") : EXIT_SUCCESS;
}
