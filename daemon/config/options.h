/* gpumemd settings: command line and the [daemon] section of the config file (flags override the file). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Which settings the command line gave, so the file does not override them. */
enum {
        OPT_SET_SOCKET = 1u << 0,
        OPT_SET_BACKEND = 1u << 1,
        OPT_SET_PRESET = 1u << 2,
        OPT_SET_LOG_LEVEL = 1u << 3,
        OPT_SET_TOPOLOGY = 1u << 4,
        OPT_SET_KFD_MINOR = 1u << 5,
};

#define OPT_MAX_ADMIN_GROUPS 16

typedef struct Options {
        char *config_path;    /* NULL: the default file, if it exists */
        bool config_explicit; /* --config given: the file must exist */
        char *socket_path;
        char backend[16];    /* a backend's name (driver.h): checked when set */
        char *model_preset;  /* a preset name under the preset dir, or a directory path */
        char *topology_root; /* KFD backend: sysfs topology dir */
        uint32_t model_kfd_minor;
        int log_level;
        uint32_t max_connections;
        uint32_t max_connections_per_uid;
        uint64_t window_size;
        uint64_t shared_region_size;        /* named shares' VA region (0: no shares); at start only */
        uint64_t max_window_bytes_per_uid;  /* VA windows (current and refused) all clients of one uid hold */
        uint64_t max_host_per_uid;          /* host memory all clients of one uid may hold; 0: no limit */
        uint32_t max_event_threads;         /* threads waiting on clients' GPU contexts' events; 0: 32 */
        uint32_t max_event_threads_per_uid; /* of them, for the clients of one uid; 0: a quarter */
        uint32_t max_mappings; /* daemon mappings all clients' objects may cost; 0: half the kernel's */
        uint32_t max_mappings_per_uid; /* the same for one uid; 0: an eighth of max-mappings */
        uint32_t hello_timeout_sec;    /* a connection that has not said hello by then is closed; 0 = never */
        uint32_t worker_threads;       /* threads for slow work off the event loops; 0: all on the loops */
        uint32_t loops;                /* event loops serving clients; 0: one per CPU the daemon may use */
        uint32_t send_timeout_sec; /* a client whose queued replies do not move for this long is dropped */
        uint32_t socket_mode;
        gid_t admin_gids[OPT_MAX_ADMIN_GROUPS];
        size_t n_admin_gids;
        char *metrics_listen; /* ADDRESS:PORT for the Prometheus listener, or NULL */
        bool handover;        /* at a restart, hand the clients to the next daemon (docs/operations.md) */
        bool check_config;
        unsigned set_by_cli;
} Options;

void options_init(Options *o);
void options_done(Options *o);
/* Deep copy; @dst is overwritten (not freed first). */
int options_copy(Options *dst, const Options *src);

/*
 * Parse argv. Returns 0 to run, 1 when --help or --version was printed (exit 0), or a negative errno after
 * printing a one-line error to stderr.
 */
int options_parse_argv(Options *o, int argc, char **argv);

/*
 * Read the config file into @o (settings given on the command line win). Every error is appended to
 * @errbuf as "FILE:LINE: message\n". Returns 0, or -EINVAL when the file has errors (nothing in @o
 * changes then), or -errno when it cannot be read. A missing default file is not an error.
 */
int options_load_file(Options *o, const char *path, bool must_exist, char *errbuf, size_t errlen);

/* Resolve the preset to a directory (absolute path in @buf). */
int options_preset_dir(const Options *o, char *buf, size_t len);
