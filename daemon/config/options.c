/* gpumemd settings: one table of them, read by getopt_long from the command line and by inih from the file.
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "config.h"
#include "base/log.h"
#include "base/util.h"
#include "drivers/driver-kfd.h"
#include "drivers/driver.h"

#define DEFAULT_WINDOW_SIZE (64ull << 30)
/*
 * VA-window bytes one uid may hold by default: 16 TiB, an eighth of the 47-bit user space the windows are
 * carved from (1 TiB to 128 TiB), so no single uid can take the aperture from the others. It is 256 clients
 * of one uid at the default 64 GiB window, and never less than window-size, whose maximum is 16 TiB.
 */
#define DEFAULT_MAX_WINDOW_BYTES_PER_UID (16ull << 40)
/* Where named shares are placed, at the same VA for every reader: room for a few dozen models' weights. */
#define DEFAULT_SHARED_REGION_SIZE (512ull << 30)

void options_init(Options *o)
{
        *o = (Options){
                .backend = "kfd",
                .log_level = LOG_INFO,
                .max_connections = 4096,
                .handover = true,
                .max_connections_per_uid = 1024,
                .window_size = DEFAULT_WINDOW_SIZE,
                .max_window_bytes_per_uid = DEFAULT_MAX_WINDOW_BYTES_PER_UID,
                .shared_region_size = DEFAULT_SHARED_REGION_SIZE,
                .hello_timeout_sec = 10,
                .send_timeout_sec = 30,
                .worker_threads = 2,
                .socket_mode = 0660,
        };
        o->socket_path = strdup(GPUMEMD_SOCKET_DEFAULT);
        o->model_preset = strdup("mi300x");
}

void options_done(Options *o)
{
        free(o->config_path);
        free(o->socket_path);
        free(o->model_preset);
        free(o->topology_root);
        free(o->metrics_listen);
        *o = (Options){0};
}

/* --- the settings: each declared once, for the command line and the [daemon] section alike ------------- */

typedef struct Setting Setting;

/* Where a bad value is told: stderr for the command line, the file's list of errors with their lines. */
typedef struct Complaints {
        void (*say)(struct Complaints *c, const Setting *s, const char *msg);
} Complaints;

/* A value read and checked, not yet stored: a bad value changes nothing. */
typedef struct Value {
        uint64_t num;
        const char *str; /* the text itself, copied when stored */
        gid_t gids[OPT_MAX_ADMIN_GROUPS];
        size_t n_gids;
} Value;

typedef struct SettingType {
        /* Reads @text into @v. A bad value is told through @c (which key, why) and gives -EINVAL. */
        int (*parse)(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c);
        enum { STORE_NUM, STORE_STR, STORE_CHARS, STORE_GIDS } store;
} SettingType;

struct Setting {
        const char *key;     /* in [daemon]; NULL: the command line only */
        const char *longopt; /* NULL: the file only */
        char shortopt;
        const char *arg;  /* the option's argument in --help; NULL: it takes none */
        const char *help; /* --help's text; a '\n' starts another line under it */
        const SettingType *type;
        uint64_t min, max, align; /* numbers and sizes; for a text, max is its longest length (0: any) */
        bool nonempty;            /* a text that may not be empty */
        bool absolute;       /* a path the file must give absolute (the command line's is the caller's) */
        const char *expect;  /* what a bad value is not: "a number from 0 to 64" */
        size_t offset, size; /* the Options field */
        size_t given;        /* GIVEN(f): a bool set when the command line names the option; 0: none */
        unsigned cli_bit;    /* OPT_SET_*: given on the command line, the file does not override it */
};

#define FIELD(f) .offset = offsetof(Options, f), .size = sizeof(((Options *)0)->f)
#define GIVEN(f) (offsetof(Options, f) + 1)

_printf_(3, 4) static int complain(Complaints *c, const Setting *s, const char *fmt, ...)
{
        char msg[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        c->say(c, s, msg);
        return -EINVAL;
}

static int parse_flag(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        v->num = 1;
        return 0;
}

static int parse_text(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        bool absolute = from_file && s->absolute;

        if (s->nonempty && !*text)
                return complain(c, s, "empty value");
        if ((absolute && text[0] != '/') || (s->max && (!*text || strlen(text) > s->max)))
                return complain(c, s, "'%s' is not %s%s", text, absolute ? "an absolute " : "a ", s->expect);
        v->str = text;
        return 0;
}

static int parse_number(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        if (parse_uint(text, s->max, &v->num) < 0 || v->num < s->min)
                return complain(c, s, "'%s' is not %s", text, s->expect);
        return 0;
}

static int parse_bytes(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        if (parse_size(text, &v->num) < 0 || v->num < s->min || v->num > s->max ||
            (s->align && v->num % s->align))
                return complain(c, s, "'%s' is not %s", text, s->expect);
        return 0;
}

/* A size, or N% of the node's memory as the file is read. */
static int parse_bytes_or_percent(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        if (parse_size_or_percent(text, &v->num) < 0 || v->num < s->min || v->num > s->max)
                return complain(c, s, "'%s' is not %s", text, s->expect);
        return 0;
}

static int parse_octal(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        char *end;

        v->num = strtoul(text, &end, 8);
        if (!*text || *end || v->num > s->max)
                return complain(c, s, "'%s' is not %s", text, s->expect);
        return 0;
}

/* only these two words: the file is read by people, and "handover = 1" reads as a count */
static int parse_yes_no(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        if (strcmp(text, "yes") != 0 && strcmp(text, "no") != 0)
                return complain(c, s, "'%s' is neither yes nor no", text);
        v->num = strcmp(text, "yes") == 0;
        return 0;
}

/* "kfd, model": the backends there are, for errors. */
static const char *backend_names(char *buf, size_t len)
{
        buf[0] = '\0';
        for (size_t i = 0; driver_backend_at(i); i++) {
                size_t used = strnlen(buf, len);
                snprintf(buf + used, len - used, "%s%s", i ? ", " : "", driver_backend_at(i)->name);
        }
        return buf;
}

static int parse_backend(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        char names[128];

        if (!driver_backend_find(text))
                return complain(c, s, "no backend called '%s' (%s)", text,
                                backend_names(names, sizeof(names)));
        v->str = text;
        return 0;
}

static int parse_log_level(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        int r = log_level_from_string(text);

        if (r < 0)
                return complain(c, s, "unknown level '%s'", text);
        v->num = (uint64_t)r;
        return 0;
}

/* 0 (the model's newest) or a minor version the model can report: checked here, so --check-config sees it */
static int parse_kfd_minor(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        uint32_t lo, hi;

        driver_kfd_model_minor_range(&lo, &hi);
        if (parse_uint(text, hi, &v->num) < 0 || (v->num && v->num < lo))
                return complain(c, s, "'%s' is not 0 or a number from %u to %u", text, lo, hi);
        return 0;
}

static int parse_address(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        const char *colon = strrchr(text, ':');

        if (!colon || colon == text || !colon[1])
                return complain(c, s, "'%s' is not %s", text, s->expect);
        v->str = text;
        return 0;
}

/* Group names, split at blanks and commas; every unknown name is told, each in its own error. */
static int parse_groups(const Setting *s, const char *text, bool from_file, Value *v, Complaints *c)
{
        char buf[512];
        char *save = NULL;
        int r = 0;

        snprintf(buf, sizeof(buf), "%s", text);
        for (char *t = strtok_r(buf, " \t,", &save); t; t = strtok_r(NULL, " \t,", &save)) {
                struct group *g = getgrnam(t);
                if (!g) {
                        r = complain(c, s, "no group named '%s'", t);
                        continue;
                }
                if (v->n_gids >= OPT_MAX_ADMIN_GROUPS)
                        return complain(c, s, "more than %d groups", OPT_MAX_ADMIN_GROUPS);
                v->gids[v->n_gids++] = g->gr_gid;
        }
        return r;
}

static const SettingType type_flag = {parse_flag, STORE_NUM};
static const SettingType type_text = {parse_text, STORE_STR};
static const SettingType type_number = {parse_number, STORE_NUM};
static const SettingType type_bytes = {parse_bytes, STORE_NUM};
static const SettingType type_octal = {parse_octal, STORE_NUM};
static const SettingType type_bytes_or_percent = {parse_bytes_or_percent, STORE_NUM};
static const SettingType type_yes_no = {parse_yes_no, STORE_NUM};
static const SettingType type_backend = {parse_backend, STORE_CHARS};
static const SettingType type_log_level = {parse_log_level, STORE_NUM};
static const SettingType type_kfd_minor = {parse_kfd_minor, STORE_NUM};
static const SettingType type_address = {parse_address, STORE_STR};
static const SettingType type_groups = {parse_groups, STORE_GIDS};

/* A setting of both the command line and the file, under one name; one of either alone. */
#define BOTH(name, letter, arg_, help_, type_, ...)                                                          \
        {                                                                                                    \
                .key = name, .longopt = name, .shortopt = letter, .arg = arg_, .help = help_,                \
                .type = &type_, __VA_ARGS__                                                                  \
        }
#define ARGV_ONLY(name, letter, arg_, help_, type_, ...)                                                     \
        {                                                                                                    \
                .longopt = name, .shortopt = letter, .arg = arg_, .help = help_, .type = &type_, __VA_ARGS__ \
        }
#define FILE_ONLY(name, type_, ...)                                                                          \
        {                                                                                                    \
                .key = name, .type = &type_, __VA_ARGS__                                                     \
        }

/* In --help's order, then the file's own. */
static const Setting settings[] = {
        /* name, letter, argument and help of the option, type; the field, OPT_SET_* bit, checks */
        ARGV_ONLY("config", 'c', "FILE", "configuration file (default " GPUMEMD_CONFIG_FILE ")", type_text,
                  FIELD(config_path), .given = GIVEN(config_explicit)),
        BOTH("socket", 's', "PATH",
             "listen on PATH when not socket-activated\n(default " GPUMEMD_SOCKET_DEFAULT ")", type_text,
             FIELD(socket_path), .cli_bit = OPT_SET_SOCKET, .max = 107, .absolute = true,
             .expect = "path shorter than 108 bytes"),
        BOTH("backend", 'b', "NAME", "the device gpumemd serves (default kfd):", type_backend, FIELD(backend),
             .cli_bit = OPT_SET_BACKEND),
        BOTH("model-preset", 'p', "NAME", "model topology preset or directory (default mi300x)", type_text,
             FIELD(model_preset), .cli_bit = OPT_SET_PRESET, .nonempty = true),
        BOTH("model-kfd-minor", 0, "N", "KFD ABI minor version the model reports", type_kfd_minor,
             FIELD(model_kfd_minor), .cli_bit = OPT_SET_KFD_MINOR),
        BOTH("topology", 't', "DIR", "KFD sysfs topology (default /sys/devices/virtual/kfd/kfd/topology)",
             type_text, FIELD(topology_root), .cli_bit = OPT_SET_TOPOLOGY, .absolute = true,
             .expect = "path"),
        BOTH("log-level", 'l', "LEVEL", "err, warning, notice, info or debug (default info)", type_log_level,
             FIELD(log_level), .cli_bit = OPT_SET_LOG_LEVEL),
        ARGV_ONLY("check-config", 0, NULL, "validate the configuration file and exit", type_flag,
                  FIELD(check_config)),

        /* name, type; the field, checks */
        FILE_ONLY("socket-mode", type_octal, FIELD(socket_mode), .max = 0777, .expect = "an octal mode"),
        FILE_ONLY("max-connections", type_number, FIELD(max_connections), .min = 1, .max = 1000000,
                  .expect = "a number between 1 and 1000000"),
        FILE_ONLY("max-connections-per-uid", type_number, FIELD(max_connections_per_uid), .min = 1,
                  .max = 1000000, .expect = "a number between 1 and 1000000"),
        FILE_ONLY("hello-timeout", type_number, FIELD(hello_timeout_sec), .max = 3600,
                  .expect = "a number of seconds up to 3600"),
        /* never 0: a client that does not read would hold its slot and its memory for ever */
        FILE_ONLY("send-timeout", type_number, FIELD(send_timeout_sec), .min = 1, .max = 3600,
                  .expect = "a number of seconds from 1 to 3600"),
        FILE_ONLY("worker-threads", type_number, FIELD(worker_threads), .max = 64,
                  .expect = "a number from 0 to 64"),
        FILE_ONLY("handover", type_yes_no, FIELD(handover)),
        FILE_ONLY("loops", type_number, FIELD(loops), .max = 64,
                  .expect = "a number from 0 (one per CPU) to 64"),
        FILE_ONLY("window-size", type_bytes, FIELD(window_size), .min = 1ull << 30, .max = 1ull << 44,
                  .align = 2ull << 20, .expect = "a multiple of 2M between 1G and 16T"),
        FILE_ONLY("shared-region-size", type_bytes, FIELD(shared_region_size), .max = 16ull << 40,
                  .align = 1ull << 30, .expect = "a multiple of 1G up to 16T (0: none)"),
        FILE_ONLY("max-window-bytes-per-uid", type_bytes, FIELD(max_window_bytes_per_uid), .min = 1ull << 30,
                  .max = 1ull << 47, .expect = "a size between 1G and 128T"),
        FILE_ONLY("max-host-per-uid", type_bytes_or_percent, FIELD(max_host_per_uid), .max = UINT64_MAX,
                  .expect = "a size or a percentage of the node's memory (0: no limit)"),
        FILE_ONLY("max-event-threads", type_number, FIELD(max_event_threads), .max = 4096,
                  .expect = "a number up to 4096 (0: 32)"),
        FILE_ONLY("max-event-threads-per-uid", type_number, FIELD(max_event_threads_per_uid), .max = 4096,
                  .expect = "a number up to 4096 (0: a quarter of max-event-threads)"),
        FILE_ONLY("max-mappings", type_number, FIELD(max_mappings), .max = 1u << 30,
                  .expect = "a number (0: half of vm.max_map_count)"),
        FILE_ONLY("max-mappings-per-uid", type_number, FIELD(max_mappings_per_uid), .max = 1u << 30,
                  .expect = "a number (0: an eighth of max-mappings)"),
        FILE_ONLY("metrics-listen", type_address, FIELD(metrics_listen), .expect = "ADDRESS:PORT"),
        FILE_ONLY("admin-groups", type_groups, FIELD(admin_gids)),
};

static int store_text(char **dst, const char *v)
{
        char *s = strdup(v);
        if (!s)
                return -ENOMEM;
        free(*dst);
        *dst = s;
        return 0;
}

static int store(const Setting *s, Options *o, const Value *v)
{
        void *field = (char *)o + s->offset;

        switch (s->type->store) {
        case STORE_NUM: /* a uint64_t, a uint32_t or int, or a bool */
                if (s->size == sizeof(uint64_t)) {
                        memcpy(field, &v->num, sizeof(uint64_t));
                } else if (s->size == sizeof(uint32_t)) {
                        uint32_t n = (uint32_t)v->num; /* the parser checked the bounds */
                        memcpy(field, &n, sizeof(n));
                } else {
                        bool b = v->num != 0;
                        memcpy(field, &b, sizeof(b));
                }
                return 0;
        case STORE_STR:
                return store_text(field, v->str);
        case STORE_CHARS:
                snprintf(field, s->size, "%s", v->str);
                return 0;
        case STORE_GIDS: /* admin_gids, and their count beside them */
                memcpy(o->admin_gids, v->gids, sizeof(v->gids));
                o->n_admin_gids = v->n_gids;
                return 0;
        }
        return -EINVAL;
}

/* Reads and stores one setting: from the file, not one the command line gave (that one wins). */
static int setting_apply(const Setting *s, const char *text, Options *o, bool from_file, Complaints *c)
{
        Value v = {0};
        int r;

        r = s->type->parse(s, text, from_file, &v, c);
        if (r < 0)
                return r;
        if (from_file && (o->set_by_cli & s->cli_bit))
                return 0;
        r = store(s, o, &v);
        if (r < 0)
                return r;
        if (!from_file) {
                o->set_by_cli |= s->cli_bit;
                if (s->given)
                        *(bool *)((char *)o + s->given - 1) = true;
        }
        return 0;
}

/* --- the command line ---------------------------------------------------------------------------------- */

/* getopt_long's value for a setting: its letter, or one past the letters for a long option alone */
#define OPT_LONG_ONLY 0x100

static void help_line(char shortopt, const char *longopt, const char *arg, const char *text)
{
        char left[64];

        if (shortopt)
                snprintf(left, sizeof(left), "-%c, --%s%s%s", shortopt, longopt, arg ? " " : "",
                         arg ? arg : "");
        else
                snprintf(left, sizeof(left), "    --%s%s%s", longopt, arg ? " " : "", arg ? arg : "");
        /* the text's first line beside the option, the others under it */
        for (const char *line = text; line;) {
                const char *nl = strchr(line, '\n');
                printf("  %-25s %.*s\n", left, nl ? (int)(nl - line) : (int)strlen(line), line);
                left[0] = '\0';
                line = nl ? nl + 1 : NULL;
        }
}

static void help(void)
{
        printf("Usage: gpumemd [OPTIONS]\n"
               "\n"
               "Privileged GPU memory broker for AMD (and NVIDIA) GPUs.\n"
               "\n");
        for (size_t i = 0; i < ARRAY_SIZE(settings); i++) {
                const Setting *s = &settings[i];
                if (!s->longopt)
                        continue;
                help_line(s->shortopt, s->longopt, s->arg, s->help);
                if (s->type == &type_backend)
                        for (size_t b = 0; driver_backend_at(b); b++)
                                printf("                              %-8s %s\n", driver_backend_at(b)->name,
                                       driver_backend_at(b)->summary);
        }
        help_line('h', "help", NULL, "show this help");
        help_line('V', "version", NULL, "show the version");
        printf("\n"
               "Environment: GPUMEMD_MODEL_FAULTS_FILE=FILE (model backend, for tests): SIGUSR2 arms the\n"
               "model's fault injection from FILE, one \"IOCTL NTH ERRNO\" per line.\n");
}

static void say_on_stderr(Complaints *c, const Setting *s, const char *msg)
{
        fprintf(stderr, "gpumemd: --%s: %s\n", s->longopt, msg);
}

static const Setting *setting_of_option(int c)
{
        if (c >= OPT_LONG_ONLY && (size_t)(c - OPT_LONG_ONLY) < ARRAY_SIZE(settings))
                return &settings[c - OPT_LONG_ONLY];
        for (size_t i = 0; c > 0 && i < ARRAY_SIZE(settings); i++)
                if (settings[i].longopt && settings[i].shortopt == c)
                        return &settings[i];
        return NULL;
}

int options_parse_argv(Options *o, int argc, char **argv)
{
        struct option longopts[ARRAY_SIZE(settings) + 3] = {
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
        };
        char shortopts[2 * ARRAY_SIZE(settings) + 8] = ":hV";
        size_t n = 2, len = strlen(shortopts);
        Complaints complaints = {say_on_stderr};
        int c, r;

        for (size_t i = 0; i < ARRAY_SIZE(settings); i++) {
                const Setting *s = &settings[i];
                if (!s->longopt)
                        continue;
                longopts[n++] = (struct option){s->longopt, s->arg ? required_argument : no_argument, NULL,
                                                s->shortopt ? s->shortopt : OPT_LONG_ONLY + (int)i};
                if (s->shortopt) {
                        shortopts[len++] = s->shortopt;
                        if (s->arg)
                                shortopts[len++] = ':';
                }
        }
        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) >= 0) {
                const Setting *s = setting_of_option(c);
                if (s) {
                        r = setting_apply(s, optarg ? optarg : "", o, false, &complaints);
                        if (r < 0)
                                return r;
                        continue;
                }
                switch (c) {
                case 'h':
                        help();
                        return 1;
                case 'V':
                        printf("gpumemd %s\n", GPUMEMD_VERSION);
                        return 1;
                case ':':
                        fprintf(stderr, "gpumemd: option '%s' needs an argument\n", argv[optind - 1]);
                        return -EINVAL;
                default:
                        fprintf(stderr, "gpumemd: unknown option '%s' (see --help)\n", argv[optind - 1]);
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "gpumemd: unexpected argument '%s' (see --help)\n", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

/* --- config file --------------------------------------------------------------------------------------- */

typedef struct FileCtx {
        ConfigReader in;
        Complaints complaints;
        Options next; /* the settings being built; copied into the caller's only if the whole file is good */
        unsigned line_of[ARRAY_SIZE(settings)]; /* where each setting was last read well: for errors after */
} FileCtx;

static void say_in_file(Complaints *c, const Setting *s, const char *msg)
{
        FileCtx *ctx = (FileCtx *)((char *)c - offsetof(FileCtx, complaints));

        config_error(&ctx->in, "%s: %s", s->key, msg);
}

static bool known_section(const char *name, size_t len)
{
        /* [class NAME] sections are the policy's (policy.c) */
        return (len == strlen("daemon") && strncmp(name, "daemon", len) == 0) ||
               (len > 6 && strncmp(name, "class", 5) == 0 && (name[5] == ' ' || name[5] == '\t'));
}

/*
 * inih calls this for every line it reads, so ctx->in.line is the line of the current entry. Section headers
 * are checked here, where an empty unknown section is seen too (inih reports only its keys).
 */
static char *file_reader(char *str, int num, void *stream)
{
        FileCtx *ctx = stream;
        char *s = config_reader_gets(&ctx->in, str, num);
        const char *name;
        size_t len;

        if (s && config_line_section(s, &name, &len)) {
                if (len == SIZE_MAX)
                        config_error(&ctx->in, "section header without ']'");
                else if (!known_section(name, len))
                        config_error(&ctx->in, "unknown section [%.*s]", (int)len, name);
        }
        return s;
}

static const Setting *setting_of_key(const char *key)
{
        for (size_t i = 0; i < ARRAY_SIZE(settings); i++)
                if (settings[i].key && strcmp(settings[i].key, key) == 0)
                        return &settings[i];
        return NULL;
}

static void daemon_key(FileCtx *ctx, const char *name, const char *value)
{
        const Setting *s = setting_of_key(name);
        int r;

        if (!s) {
                config_error(&ctx->in, "unknown setting '%s' in [daemon]", name);
                return;
        }
        r = setting_apply(s, value, &ctx->next, true, &ctx->complaints);
        if (r == -ENOMEM)
                config_error(&ctx->in, "%s: out of memory", name);
        if (r >= 0)
                ctx->line_of[s - settings] = ctx->in.line;
}

static int file_handler(void *user, const char *section, const char *name, const char *value)
{
        FileCtx *ctx = user;

        if (!name) /* a section header alone */
                return 1;
        if (strcmp(section, "daemon") == 0)
                daemon_key(ctx, name, value);
        else if (section[0] == '\0')
                config_error(&ctx->in, "setting '%s' outside any section", name);
        /* keys of [class NAME] sections are the policy's */
        /* keys of an unknown section: its header was already reported */
        return 1;
}

/* The checks of one setting against another, once the whole file is read (in any order). */
static void file_check_together(FileCtx *ctx)
{
        const Setting *cap = setting_of_key("max-window-bytes-per-uid");
        unsigned line = ctx->line_of[cap - settings];

        if (line && ctx->next.max_window_bytes_per_uid < ctx->next.window_size) {
                ctx->in.line = line;
                config_error(&ctx->in,
                             "max-window-bytes-per-uid: less than window-size, no client could connect");
        }
}

int options_copy(Options *dst, const Options *src)
{
        Options n = *src;
        n.config_path = src->config_path ? strdup(src->config_path) : NULL;
        n.socket_path = src->socket_path ? strdup(src->socket_path) : NULL;
        n.model_preset = src->model_preset ? strdup(src->model_preset) : NULL;
        n.topology_root = src->topology_root ? strdup(src->topology_root) : NULL;
        n.metrics_listen = src->metrics_listen ? strdup(src->metrics_listen) : NULL;
        if ((src->config_path && !n.config_path) || (src->socket_path && !n.socket_path) ||
            (src->model_preset && !n.model_preset) || (src->topology_root && !n.topology_root) ||
            (src->metrics_listen && !n.metrics_listen)) {
                options_done(&n);
                return -ENOMEM;
        }
        *dst = n;
        return 0;
}

int options_load_file(Options *o, const char *path, bool must_exist, char *errbuf, size_t errlen)
{
        FileCtx ctx = {.complaints = {say_in_file}};
        int r;

        r = config_reader_open(&ctx.in, path, must_exist, errbuf, errlen);
        if (r < 0)
                return r == -ENOENT && !must_exist ? 0 : r;
        r = options_copy(&ctx.next, o);
        if (r < 0) {
                config_reader_close(&ctx.in);
                return r;
        }
        r = ini_parse_stream(file_reader, &ctx, file_handler, &ctx);
        config_reader_close(&ctx.in);
        if (r > 0 && ctx.in.n_errors == 0) {
                /* inih's own syntax error (e.g. a line with neither '=' nor a section) at line r */
                ctx.in.line = (unsigned)r;
                config_error(&ctx.in, "syntax error: expected 'key = value' or '[section]'");
        } else if (r < 0 && ctx.in.n_errors == 0) {
                config_error(&ctx.in, "cannot parse file");
        }
        file_check_together(&ctx);
        if (ctx.in.n_errors > 0) {
                options_done(&ctx.next);
                return -EINVAL;
        }
        options_done(o);
        *o = ctx.next;
        return 0;
}

int options_preset_dir(const Options *o, char *buf, size_t len)
{
        const char *p = o->model_preset;
        const char *roots[] = {getenv("GPUMEMD_PRESETDIR"), GPUMEMD_PRESETDIR, GPUMEMD_SOURCE_PRESETDIR};
        struct stat st;

        if (!p || !*p)
                return -EINVAL;
        if (strchr(p, '/')) {
                if (!realpath(p, buf))
                        return -errno;
                return 0;
        }
        for (size_t i = 0; i < ARRAY_SIZE(roots); i++) {
                if (!roots[i])
                        continue;
                if ((size_t)snprintf(buf, len, "%s/%s", roots[i], p) >= len)
                        return -ENAMETOOLONG;
                if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
                        return 0;
        }
        return -ENOENT;
}
