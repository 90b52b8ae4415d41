/* gpumemd settings: getopt_long for the command line, inih for the config file (with per-line errors). */
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

static int set_str(char **dst, const char *v)
{
        char *s = strdup(v);
        if (!s)
                return -ENOMEM;
        free(*dst);
        *dst = s;
        return 0;
}

static void help(void)
{
        printf("Usage: gpumemd [OPTIONS]\n"
               "\n"
               "Privileged GPU memory broker for AMD (and NVIDIA) GPUs.\n"
               "\n"
               "  -c, --config FILE         configuration file (default " GPUMEMD_CONFIG_FILE ")\n"
               "  -s, --socket PATH         listen on PATH when not socket-activated\n"
               "                            (default " GPUMEMD_SOCKET_DEFAULT ")\n"
               "  -b, --backend NAME        the device gpumemd serves (default kfd):\n");
        for (size_t i = 0; driver_backend_at(i); i++)
                printf("                              %-8s %s\n", driver_backend_at(i)->name,
                       driver_backend_at(i)->summary);
        printf("  -p, --model-preset NAME   model topology preset or directory (default mi300x)\n"
               "      --model-kfd-minor N   KFD ABI minor version the model reports\n"
               "  -t, --topology DIR        KFD sysfs topology (default "
               "/sys/devices/virtual/kfd/kfd/topology)\n"
               "  -l, --log-level LEVEL     err, warning, notice, info or debug (default info)\n"
               "      --check-config        validate the configuration file and exit\n"
               "  -h, --help                show this help\n"
               "  -V, --version             show the version\n"
               "\n"
               "Environment: GPUMEMD_MODEL_FAULTS_FILE=FILE (model backend, for tests): SIGUSR2 arms the\n"
               "model's fault injection from FILE, one \"IOCTL NTH ERRNO\" per line.\n");
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

/* 0 (the model's newest) or a minor version the model can report: checked here, so --check-config sees it */
static int parse_kfd_minor(const char *s, uint64_t *ret)
{
        uint32_t lo, hi;
        uint64_t v;

        driver_kfd_model_minor_range(&lo, &hi);
        if (parse_uint(s, hi, &v) < 0 || (v && v < lo))
                return -EINVAL;
        *ret = v;
        return 0;
}

int options_parse_argv(Options *o, int argc, char **argv)
{
        enum { ARG_CHECK_CONFIG = 0x100, ARG_KFD_MINOR };
        static const struct option longopts[] = {
                {"config", required_argument, NULL, 'c'},
                {"socket", required_argument, NULL, 's'},
                {"backend", required_argument, NULL, 'b'},
                {"model-preset", required_argument, NULL, 'p'},
                {"model-kfd-minor", required_argument, NULL, ARG_KFD_MINOR},
                {"topology", required_argument, NULL, 't'},
                {"log-level", required_argument, NULL, 'l'},
                {"check-config", no_argument, NULL, ARG_CHECK_CONFIG},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {},
        };
        int c, r;
        uint64_t v;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":c:s:b:p:t:l:hV", longopts, NULL)) >= 0) {
                switch (c) {
                case 'c':
                        if ((r = set_str(&o->config_path, optarg)) < 0)
                                return r;
                        o->config_explicit = true;
                        break;
                case 's':
                        if (optarg[0] == '\0' || strlen(optarg) >= 108) {
                                fprintf(stderr, "gpumemd: --socket: path empty or longer than 107 bytes\n");
                                return -EINVAL;
                        }
                        if ((r = set_str(&o->socket_path, optarg)) < 0)
                                return r;
                        o->set_by_cli |= OPT_SET_SOCKET;
                        break;
                case 'b':
                        if (!driver_backend_find(optarg)) {
                                char names[128];
                                fprintf(stderr, "gpumemd: --backend: no backend called '%s' (%s)\n", optarg,
                                        backend_names(names, sizeof(names)));
                                return -EINVAL;
                        }
                        snprintf(o->backend, sizeof(o->backend), "%s", optarg);
                        o->set_by_cli |= OPT_SET_BACKEND;
                        break;
                case 'p':
                        if (optarg[0] == '\0') {
                                fprintf(stderr, "gpumemd: --model-preset: empty name\n");
                                return -EINVAL;
                        }
                        if ((r = set_str(&o->model_preset, optarg)) < 0)
                                return r;
                        o->set_by_cli |= OPT_SET_PRESET;
                        break;
                case ARG_KFD_MINOR:
                        if (parse_kfd_minor(optarg, &v) < 0) {
                                uint32_t lo, hi;
                                driver_kfd_model_minor_range(&lo, &hi);
                                fprintf(stderr,
                                        "gpumemd: --model-kfd-minor: '%s' is not 0 or a number from %u to "
                                        "%u\n",
                                        optarg, lo, hi);
                                return -EINVAL;
                        }
                        o->model_kfd_minor = (uint32_t)v;
                        o->set_by_cli |= OPT_SET_KFD_MINOR;
                        break;
                case 't':
                        if ((r = set_str(&o->topology_root, optarg)) < 0)
                                return r;
                        o->set_by_cli |= OPT_SET_TOPOLOGY;
                        break;
                case 'l':
                        r = log_level_from_string(optarg);
                        if (r < 0) {
                                fprintf(stderr, "gpumemd: --log-level: unknown level '%s'\n", optarg);
                                return -EINVAL;
                        }
                        o->log_level = r;
                        o->set_by_cli |= OPT_SET_LOG_LEVEL;
                        break;
                case ARG_CHECK_CONFIG:
                        o->check_config = true;
                        break;
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
        FILE *f;
        const char *path;
        unsigned line;
        Options next; /* the settings being built; copied into the caller's only if the whole file is good */
        char *err;
        size_t errlen;
        unsigned n_errors;
        unsigned
                window_cap_line; /* max-window-bytes-per-uid's line: checked against window-size at the end */
} FileCtx;

_printf_(2, 3) static void file_error(FileCtx *ctx, const char *fmt, ...)
{
        size_t used;
        va_list ap;
        int n;

        ctx->n_errors++;
        if (!ctx->err)
                return;
        used = strnlen(ctx->err, ctx->errlen);
        if (used + 1 >= ctx->errlen)
                return;
        n = snprintf(ctx->err + used, ctx->errlen - used, "%s:%u: ", ctx->path, ctx->line);
        if (n < 0 || (size_t)n >= ctx->errlen - used)
                return;
        used += (size_t)n;
        va_start(ap, fmt);
        n = vsnprintf(ctx->err + used, ctx->errlen - used, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n >= ctx->errlen - used)
                return;
        used += (size_t)n;
        if (used + 1 < ctx->errlen) {
                ctx->err[used] = '\n';
                ctx->err[used + 1] = '\0';
        }
}

static bool known_section(const char *name, size_t len)
{
        /* [class NAME] sections are the policy's (policy.c) */
        return (len == strlen("daemon") && strncmp(name, "daemon", len) == 0) ||
               (len > 6 && strncmp(name, "class", 5) == 0 && (name[5] == ' ' || name[5] == '\t'));
}

/*
 * inih calls this for every line it reads, so ctx->line is the line of the current entry. Section headers
 * are checked here, where an empty unknown section is seen too (inih reports only its keys).
 */
static char *file_reader(char *str, int num, void *stream)
{
        FileCtx *ctx = stream;
        char *s = fgets(str, num, ctx->f);
        const char *p, *end;

        if (!s)
                return NULL;
        ctx->line++;
        p = s + strspn(s, " \t");
        if (*p == '[') {
                end = strchr(p, ']');
                if (!end)
                        file_error(ctx, "section header without ']'");
                else if (!known_section(p + 1, (size_t)(end - p - 1)))
                        file_error(ctx, "unknown section [%.*s]", (int)(end - p - 1), p + 1);
        }
        return s;
}

static int daemon_key(FileCtx *ctx, const char *name, const char *value)
{
        Options *o = &ctx->next;
        unsigned cli = o->set_by_cli;
        uint64_t v;
        int r;

        if (strcmp(name, "socket") == 0) {
                if (value[0] != '/' || strlen(value) >= 108) {
                        file_error(ctx, "socket: '%s' is not an absolute path shorter than 108 bytes", value);
                        return 1;
                }
                if (!(cli & OPT_SET_SOCKET) && set_str(&o->socket_path, value) < 0)
                        return 0;
        } else if (strcmp(name, "socket-mode") == 0) {
                char *end;
                unsigned long m = strtoul(value, &end, 8);
                if (!*value || *end || m > 0777) {
                        file_error(ctx, "socket-mode: '%s' is not an octal mode", value);
                        return 1;
                }
                o->socket_mode = (uint32_t)m;
        } else if (strcmp(name, "backend") == 0) {
                if (!driver_backend_find(value)) {
                        char names[128];
                        file_error(ctx, "backend: no backend called '%s' (%s)", value,
                                   backend_names(names, sizeof(names)));
                        return 1;
                }
                if (!(cli & OPT_SET_BACKEND))
                        snprintf(o->backend, sizeof(o->backend), "%s", value);
        } else if (strcmp(name, "model-preset") == 0) {
                if (!*value) {
                        file_error(ctx, "model-preset: empty value");
                        return 1;
                }
                if (!(cli & OPT_SET_PRESET) && set_str(&o->model_preset, value) < 0)
                        return 0;
        } else if (strcmp(name, "model-kfd-minor") == 0) {
                if (parse_kfd_minor(value, &v) < 0) {
                        uint32_t lo, hi;
                        driver_kfd_model_minor_range(&lo, &hi);
                        file_error(ctx, "model-kfd-minor: '%s' is not 0 or a number from %u to %u", value, lo,
                                   hi);
                        return 1;
                }
                if (!(cli & OPT_SET_KFD_MINOR))
                        o->model_kfd_minor = (uint32_t)v;
        } else if (strcmp(name, "topology") == 0) {
                if (value[0] != '/') {
                        file_error(ctx, "topology: '%s' is not an absolute path", value);
                        return 1;
                }
                if (!(cli & OPT_SET_TOPOLOGY) && set_str(&o->topology_root, value) < 0)
                        return 0;
        } else if (strcmp(name, "log-level") == 0) {
                r = log_level_from_string(value);
                if (r < 0) {
                        file_error(ctx, "log-level: unknown level '%s'", value);
                        return 1;
                }
                if (!(cli & OPT_SET_LOG_LEVEL))
                        o->log_level = r;
        } else if (strcmp(name, "max-connections") == 0 || strcmp(name, "max-connections-per-uid") == 0) {
                if (parse_uint(value, 1000000, &v) < 0 || v == 0) {
                        file_error(ctx, "%s: '%s' is not a number between 1 and 1000000", name, value);
                        return 1;
                }
                if (name[15] == '\0')
                        o->max_connections = (uint32_t)v;
                else
                        o->max_connections_per_uid = (uint32_t)v;
        } else if (strcmp(name, "hello-timeout") == 0) {
                if (parse_uint(value, 3600, &v) < 0) {
                        file_error(ctx, "hello-timeout: '%s' is not a number of seconds up to 3600", value);
                        return 1;
                }
                o->hello_timeout_sec = (uint32_t)v;
        } else if (strcmp(name, "send-timeout") == 0) {
                /* never 0: a client that does not read would hold its slot and its memory for ever */
                if (parse_uint(value, 3600, &v) < 0 || v == 0) {
                        file_error(ctx, "send-timeout: '%s' is not a number of seconds from 1 to 3600",
                                   value);
                        return 1;
                }
                o->send_timeout_sec = (uint32_t)v;
        } else if (strcmp(name, "worker-threads") == 0) {
                if (parse_uint(value, 64, &v) < 0) {
                        file_error(ctx, "worker-threads: '%s' is not a number from 0 to 64", value);
                        return 1;
                }
                o->worker_threads = (uint32_t)v;
        } else if (strcmp(name, "handover") == 0) {
                if (strcmp(value, "yes") == 0 || strcmp(value, "no") == 0) {
                        o->handover = strcmp(value, "yes") == 0;
                } else {
                        file_error(ctx, "handover: '%s' is neither yes nor no", value);
                        return 1;
                }
        } else if (strcmp(name, "loops") == 0) {
                if (parse_uint(value, 64, &v) < 0) {
                        file_error(ctx, "loops: '%s' is not a number from 0 (one per CPU) to 64", value);
                        return 1;
                }
                o->loops = (uint32_t)v;
        } else if (strcmp(name, "window-size") == 0) {
                if (parse_size(value, &v) < 0 || v < (1ull << 30) || v > (1ull << 44) ||
                    (v & ((2ull << 20) - 1))) {
                        file_error(ctx, "window-size: '%s' is not a multiple of 2M between 1G and 16T",
                                   value);
                        return 1;
                }
                o->window_size = v;
        } else if (strcmp(name, "shared-region-size") == 0) {
                if (parse_size(value, &v) < 0 || v > (16ull << 40) || (v & ((1ull << 30) - 1))) {
                        file_error(ctx,
                                   "shared-region-size: '%s' is not a multiple of 1G up to 16T (0: none)",
                                   value);
                        return 1;
                }
                o->shared_region_size = v;
        } else if (strcmp(name, "max-window-bytes-per-uid") == 0) {
                if (parse_size(value, &v) < 0 || v < (1ull << 30) || v > (1ull << 47)) {
                        file_error(ctx, "max-window-bytes-per-uid: '%s' is not a size between 1G and 128T",
                                   value);
                        return 1;
                }
                o->max_window_bytes_per_uid = v;
                ctx->window_cap_line = ctx->line;
        } else if (strcmp(name, "metrics-listen") == 0) {
                const char *colon = strrchr(value, ':');
                if (!colon || colon == value || !colon[1]) {
                        file_error(ctx, "metrics-listen: '%s' is not ADDRESS:PORT", value);
                        return 1;
                }
                if (set_str(&o->metrics_listen, value) < 0)
                        return 0;
        } else if (strcmp(name, "admin-groups") == 0) {
                char buf[512];
                char *save = NULL;
                o->n_admin_gids = 0;
                snprintf(buf, sizeof(buf), "%s", value);
                for (char *t = strtok_r(buf, " \t,", &save); t; t = strtok_r(NULL, " \t,", &save)) {
                        struct group *g = getgrnam(t);
                        if (!g) {
                                file_error(ctx, "admin-groups: no group named '%s'", t);
                                continue;
                        }
                        if (o->n_admin_gids >= OPT_MAX_ADMIN_GROUPS) {
                                file_error(ctx, "admin-groups: more than %d groups", OPT_MAX_ADMIN_GROUPS);
                                break;
                        }
                        o->admin_gids[o->n_admin_gids++] = g->gr_gid;
                }
        } else {
                file_error(ctx, "unknown setting '%s' in [daemon]", name);
        }
        return 1;
}

static int file_handler(void *user, const char *section, const char *name, const char *value)
{
        FileCtx *ctx = user;

        if (!name) /* a section header alone */
                return 1;
        if (strcmp(section, "daemon") == 0)
                return daemon_key(ctx, name, value);
        if (section[0] == '\0')
                file_error(ctx, "setting '%s' outside any section", name);
        /* keys of [class NAME] sections are the policy's */
        /* keys of an unknown section: its header was already reported */
        return 1;
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
        FileCtx ctx = {.path = path, .err = errbuf, .errlen = errlen};
        int r;

        if (errbuf && errlen)
                errbuf[0] = '\0';
        ctx.f = fopen(path, "re");
        if (!ctx.f) {
                r = -errno;
                if (r == -ENOENT && !must_exist)
                        return 0;
                if (errbuf)
                        snprintf(errbuf, errlen, "%s: cannot open: %s\n", path, strerror(-r));
                return r;
        }
        r = options_copy(&ctx.next, o);
        if (r < 0) {
                fclose(ctx.f);
                return r;
        }
        r = ini_parse_stream(file_reader, &ctx, file_handler, &ctx);
        fclose(ctx.f);
        if (r > 0 && ctx.n_errors == 0) {
                /* inih's own syntax error (e.g. a line with neither '=' nor a section) at line r */
                ctx.line = (unsigned)r;
                file_error(&ctx, "syntax error: expected 'key = value' or '[section]'");
        } else if (r < 0 && ctx.n_errors == 0) {
                file_error(&ctx, "cannot parse file");
        }
        if (ctx.window_cap_line && ctx.next.max_window_bytes_per_uid < ctx.next.window_size) {
                ctx.line = ctx.window_cap_line;
                file_error(&ctx, "max-window-bytes-per-uid: less than window-size, no client could connect");
        }
        if (ctx.n_errors > 0) {
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
