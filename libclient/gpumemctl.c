/* gpumemctl: the administrators' CLI for gpumemd (tables for people, stable JSON with --json): its options,
 * commands and exit statuses. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gpumemctl.h"

typedef struct Command {
        const char *name;
        int (*fn)(Ctl *ctl, int argc, char **argv);
        const char *help;
        bool offline; /* runs without connecting to the daemon */
        bool no_args; /* takes no arguments */
} Command;

static const Command commands[] = {
        {"status", cmd_status, "daemon version, backend, uptime, clients, totals", .no_args = true},
        {"topology", cmd_topology, "CPU and GPU nodes, memory, links [--properties]"},
        {"clients", cmd_clients, "connected clients: identity, class, container, usage", .no_args = true},
        {"allocations", cmd_allocations, "objects the clients hold [--client ID]"},
        {"quota", cmd_quota, "show [CLASS] | set CLASS RESOURCE LIMIT [--gpu ID] [--force]"},
        {"shared", cmd_shared, "named shares: name, owner, size, role, readers, age [list] | revoke NAME"},
        {"disconnect", cmd_disconnect, "disconnect a client and free what it held: disconnect ID"},
        {"metrics", cmd_metrics, "metrics in Prometheus text format", .no_args = true},
        {"log-level", cmd_log_level, "set the daemon's log level: log-level LEVEL"},
        {"ping", cmd_ping, "one round trip to the daemon"},
        {"cdi", cmd_cdi, "print a CDI spec giving containers the socket [--kind K] [--name N] [--rocm]",
         true},
};

static void usage(FILE *f)
{
        fprintf(f, "Usage: gpumemctl [OPTIONS] COMMAND [ARGS]\n\nCommands:\n");
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
        fprintf(f,
                "\nOptions:\n"
                "  -s, --socket PATH  the daemon's socket (default $GPUMEM_SOCKET or " GM_DEFAULT_SOCKET ")\n"
                "  -j, --json         machine-readable output (a stable JSON schema; errors too)\n"
                "  -o, --output LIST  the table's columns, comma-separated (\"+LIST\": the defaults and "
                "these);\n"
                "                     a wrong name lists the table's columns\n"
                "  -n, --noheadings   tables without their heading line\n"
                "  -r, --raw          tables unaligned, one space between columns\n"
                "  -b, --bytes        sizes in bytes in tables and status\n"
                "  -V, --version      gpumemctl's version\n"
                "  -h, --help         this help\n"
                "Options may stand anywhere on the line; \"--\" ends them.\n"
                "\nExit status: 0 done, 1 the daemon refused or failed, 2 bad command line, 3 no daemon\n"
                "reachable, 4 not allowed, 5 no such client, class or object.\n");
}

/*
 * The options that are gpumemctl's own, wherever they stand (before or after the command and its
 * arguments; "--" ends them): taken out of @argv, which keeps the rest in order. 0, 1 for --help or
 * --version (done), or EXIT_USAGE.
 */
static int global_options(Ctl *ctl, int *argc, char **argv)
{
        int n = 1;
        bool ended = false;

        for (int i = 1; i < *argc; i++) {
                const char *a = argv[i];

                if (ended) {
                        argv[n++] = argv[i];
                } else if (strcmp(a, "--") == 0) {
                        ended = true;
                } else if (strcmp(a, "-j") == 0 || strcmp(a, "--json") == 0) {
                        ctl->json = json_errors = true;
                } else if (strcmp(a, "-s") == 0 || strcmp(a, "--socket") == 0) {
                        if (i + 1 >= *argc)
                                return usage_error("%s needs a path", a);
                        ctl->socket = argv[++i];
                } else if (strncmp(a, "--socket=", 9) == 0) {
                        ctl->socket = a + 9;
                } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
                        if (i + 1 >= *argc || !argv[i + 1][0])
                                return usage_error("%s needs a list of columns", a);
                        ctl->columns = argv[++i];
                } else if (strncmp(a, "--output=", 9) == 0) {
                        ctl->columns = a + 9;
                } else if (strcmp(a, "-n") == 0 || strcmp(a, "--noheadings") == 0) {
                        ctl->noheadings = true;
                } else if (strcmp(a, "-r") == 0 || strcmp(a, "--raw") == 0) {
                        ctl->raw = true;
                } else if (strcmp(a, "-b") == 0 || strcmp(a, "--bytes") == 0) {
                        exact_bytes = true;
                } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                        usage(stdout);
                        return 1;
                } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
                        printf("gpumemctl %s\n", GPUMEMD_VERSION);
                        return 1;
                } else if (a[0] == '-' && a[1] && a[1] != '-' && a[2] &&
                           strspn(a + 1, "jnrb") == strlen(a + 1)) {
                        /* flags together, as in -nrb */
                        for (const char *f = a + 1; *f; f++) {
                                if (*f == 'j')
                                        ctl->json = json_errors = true;
                                else if (*f == 'n')
                                        ctl->noheadings = true;
                                else if (*f == 'r')
                                        ctl->raw = true;
                                else
                                        exact_bytes = true;
                        }
                } else if (n == 1 && a[0] == '-') {
                        return usage_error("unknown option '%s' (see --help)", a);
                } else {
                        argv[n++] = argv[i];
                }
        }
        *argc = n;
        argv[n] = NULL;
        return 0;
}

/*
 * Runs a command; with --json its output is kept until it is done, so that a failure prints the error
 * object alone rather than after half a document.
 */
static int run_command(Ctl *ctl, const Command *cmd, int argc, char **argv)
{
        char *data = NULL;
        size_t len = 0;
        FILE *out = stdout, *mem;
        int r;

        if (cmd->no_args && argc > 1) {
                r = usage_error("%s takes no arguments", cmd->name);
                json_error_flush();
                return r;
        }
        if (!ctl->json || !(mem = open_memstream(&data, &len)))
                return cmd->fn(ctl, argc, argv);
        stdout = mem;
        r = cmd->fn(ctl, argc, argv);
        stdout = out;
        fclose(mem);
        if (r == EXIT_SUCCESS)
                fwrite(data, 1, len, stdout);
        else
                json_error_flush();
        free(data);
        return r;
}

int main(int argc, char **argv)
{
        Ctl ctl = {0};
        char buf[512];
        int r;

        r = global_options(&ctl, &argc, argv);
        json_error_flush();
        if (r)
                return r == 1 ? EXIT_SUCCESS : r;
        if (argc < 2) {
                usage(stderr);
                return EXIT_USAGE;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
                if (strcmp(argv[1], commands[i].name) != 0)
                        continue;
                if (commands[i].offline)
                        return commands[i].fn(&ctl, argc - 1, argv + 1);
                const char *path = ctl.socket ? ctl.socket : getenv("GPUMEM_SOCKET");
                if (!path || !*path)
                        path = GM_DEFAULT_SOCKET;
                r = gm_client_open(path, "gpumemctl", &ctl.c, buf, sizeof(buf));
                if (r < 0) {
                        /* no daemon there; a socket this user may not use; or the daemon's refusal */
                        int status = r == -EACCES || r == -EPERM ? EXIT_DENIED
                                     : r == -ENOENT || r == -ECONNREFUSED || r == -ENOTSOCK ||
                                                     r == -ETIMEDOUT || r == -ECONNRESET || r == -EPIPE ||
                                                     r == -ENOTDIR
                                             ? EXIT_UNREACHABLE
                                             : EXIT_FAILED;
                        char what[PATH_MAX + 32];
                        snprintf(what, sizeof(what), "cannot connect to gpumemd at %s", path);
                        fprintf(stderr, "gpumemctl: %s: %s\n", what, buf);
                        if (json_errors)
                                json_error(r, what, buf, status);
                        json_error_flush();
                        return status;
                }
                r = run_command(&ctl, &commands[i], argc - 1, argv + 1);
                gm_client_close(ctl.c);
                return r;
        }
        r = usage_error("unknown command '%s' (see --help)", argv[1]);
        json_error_flush();
        return r;
}
