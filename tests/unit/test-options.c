/* Unit tests of gpumemd's settings: command line parsing and config file errors with their lines. */
#include <stdint.h>
#include <unistd.h>

#include "../common/check.h"
#include "base/log.h"
#include "config/options.h"
#include "base/util.h"

static char tmpdir[] = "/tmp/gpumemd-test-options-XXXXXX";

static const char *write_file(const char *name, const char *text)
{
        static char path[256];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
        f = fopen(path, "we");
        CHECK(f != NULL);
        if (f) {
                fputs(text, f);
                fclose(f);
        }
        return path;
}

static int parse(Options *o, int argc, const char **argv)
{
        /* getopt keeps state in globals; parsing resets it (optind = 0) */
        return options_parse_argv(o, argc, (char **)argv);
}

/* parse() with what it writes to stderr caught in @err */
static int parse_stderr(Options *o, int argc, const char *const *argv, char *err, size_t len)
{
        FILE *f = tmpfile();
        int saved = dup(STDERR_FILENO);
        size_t n = 0;
        int r;

        CHECK(f != NULL && saved >= 0);
        if (!f || saved < 0)
                return -EIO;
        fflush(stderr);
        dup2(fileno(f), STDERR_FILENO);
        r = parse(o, argc, (const char **)argv);
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
        rewind(f);
        n = fread(err, 1, len - 1, f);
        err[n] = '\0';
        fclose(f);
        return r;
}

static void test_argv(void)
{
        Options o;
        const char *ok[] = {
                "gpumemd",     "--socket", "/tmp/x.sock",       "-b", "kfd",      "--model-preset", "mi100",
                "--log-level", "debug",    "--model-kfd-minor", "15", "--config", "/etc/none"};
        options_init(&o);
        CHECK_EQ(parse(&o, ARRAY_SIZE(ok), ok), 0);
        CHECK(strcmp(o.socket_path, "/tmp/x.sock") == 0);
        CHECK(strcmp(o.backend, "kfd") == 0);
        CHECK(strcmp(o.model_preset, "mi100") == 0);
        CHECK_EQ(o.log_level, LOG_DEBUG);
        CHECK_EQ(o.model_kfd_minor, 15);
        CHECK(o.config_explicit);
        CHECK_EQ(o.max_window_bytes_per_uid, 16ull << 40); /* the default: an eighth of the 47-bit space */
        CHECK_EQ(o.send_timeout_sec, 30);
        CHECK_EQ(o.worker_threads, 2);
        CHECK_EQ(o.set_by_cli,
                 OPT_SET_SOCKET | OPT_SET_BACKEND | OPT_SET_PRESET | OPT_SET_LOG_LEVEL | OPT_SET_KFD_MINOR);
        options_done(&o);

        /* a bad value of each type the command line takes: refused, with the option and why on stderr */
        char long_path[160]; /* longer than sun_path holds */
        memset(long_path, 'a', sizeof(long_path) - 1);
        long_path[0] = '/';
        long_path[sizeof(long_path) - 1] = '\0';
        const struct {
                const char *argv[3];
                const char *want;
        } bad[] = {
                {{"gpumemd", "--backend", "gpu"}, "--backend: no backend called 'gpu' (kfd, model, cuda)"},
                {{"gpumemd", "--log-level", "loud"}, "--log-level: unknown level 'loud'"},
                {{"gpumemd", "--socket"}, "option '--socket' needs an argument"},
                {{"gpumemd", "--frobnicate"}, "unknown option '--frobnicate'"},
                {{"gpumemd", "stray"}, "unexpected argument 'stray'"},
                {{"gpumemd", "--model-kfd-minor", "x1"}, "--model-kfd-minor: 'x1' is not 0 or a number from"},
                {{"gpumemd", "--model-kfd-minor", "5"}, "--model-kfd-minor: '5' is not 0 or a number from"},
                {{"gpumemd", "--socket", ""}, "--socket: '' is not a path shorter than 108 bytes"},
                {{"gpumemd", "--socket", long_path}, "--socket: '/aaa"},
                {{"gpumemd", "-p", ""}, "--model-preset: empty value"},
                {{"gpumemd", "--help=x"}, "unknown option '--help=x'"},
                {{"gpumemd", "--check-config=yes"}, "unknown option '--check-config=yes'"},
                /* the file's own settings are no options */
                {{"gpumemd", "--window-size", "8G"}, "unknown option '--window-size'"},
                {{"gpumemd", "--socket-mode", "0600"}, "unknown option '--socket-mode'"},
        };
        for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
                char err[512];
                options_init(&o);
                CHECK_EQ(parse_stderr(&o, bad[i].argv[2] ? 3 : 2, bad[i].argv, err, sizeof(err)), -EINVAL);
                CHECK_STR_CONTAINS(err, bad[i].want);
                CHECK_STR_CONTAINS(err, "gpumemd: ");
                options_done(&o);
        }

        /* the command line's paths may be relative to the caller's directory (the file's may not) */
        const char *relative[] = {"gpumemd", "-s", "x.sock", "-t", "topo", "--check-config"};
        options_init(&o);
        CHECK_EQ(parse(&o, ARRAY_SIZE(relative), relative), 0);
        CHECK(strcmp(o.socket_path, "x.sock") == 0);
        CHECK(strcmp(o.topology_root, "topo") == 0);
        CHECK(o.check_config);
        CHECK(!o.config_explicit);
        CHECK_EQ(o.set_by_cli, OPT_SET_SOCKET | OPT_SET_TOPOLOGY);
        options_done(&o);

        const char *help[] = {"gpumemd", "--help"};
        options_init(&o);
        CHECK_EQ(parse(&o, 2, help), 1);
        options_done(&o);
}

static void test_file_good(void)
{
        Options o;
        char err[1024];
        const char *path = write_file("good.conf", "# comment\n"
                                                   "[daemon]\n"
                                                   "socket = /run/x/gm.sock\n"
                                                   "backend = model\n"
                                                   "model-preset = apu\n"
                                                   "log-level = warning\n"
                                                   "max-connections = 10\n"
                                                   "max-connections-per-uid = 3\n"
                                                   "hello-timeout = 0\n"
                                                   "send-timeout = 5\n"
                                                   "worker-threads = 0\n"
                                                   "loops = 3\n"
                                                   "window-size = 8G\n"
                                                   "max-window-bytes-per-uid = 1T\n"
                                                   "max-host-per-uid = 25%\n"
                                                   "max-mappings = 20000\n"
                                                   "max-mappings-per-uid = 1000\n"
                                                   "max-event-threads = 8\n"
                                                   "socket-mode = 0600\n"
                                                   "admin-groups = root\n");
        options_init(&o);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), 0);
        CHECK(strcmp(o.socket_path, "/run/x/gm.sock") == 0);
        CHECK(strcmp(o.model_preset, "apu") == 0);
        CHECK_EQ(o.log_level, LOG_WARNING);
        CHECK_EQ(o.max_connections, 10);
        CHECK_EQ(o.max_connections_per_uid, 3);
        CHECK_EQ(o.hello_timeout_sec, 0);
        CHECK_EQ(o.send_timeout_sec, 5);
        CHECK_EQ(o.worker_threads, 0);
        CHECK_EQ(o.loops, 3);
        CHECK_EQ(o.max_host_per_uid,
                 (uint64_t)sysconf(_SC_PHYS_PAGES) / 100 * 25 * (uint64_t)sysconf(_SC_PAGESIZE));
        CHECK_EQ(o.max_mappings, 20000);
        CHECK_EQ(o.max_mappings_per_uid, 1000);
        CHECK_EQ(o.max_event_threads, 8);
        CHECK_EQ(o.window_size, 8ull << 30);
        CHECK_EQ(o.max_window_bytes_per_uid, 1ull << 40);
        CHECK_EQ(o.socket_mode, 0600);
        CHECK_EQ(o.n_admin_gids, 1);
        options_done(&o);

        /* flags given on the command line win over the file */
        const char *argv[] = {"gpumemd", "--model-preset", "mi100", "--log-level", "debug"};
        options_init(&o);
        CHECK_EQ(parse(&o, ARRAY_SIZE(argv), argv), 0);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), 0);
        CHECK(strcmp(o.model_preset, "mi100") == 0);
        CHECK_EQ(o.log_level, LOG_DEBUG);
        CHECK_EQ(o.max_connections, 10);
        options_done(&o);

        /* each setting the command line takes wins over the file; the others come from the file */
        path = write_file("both.conf", "[daemon]\n"
                                       "socket = /run/file.sock\n"
                                       "backend = model\n"
                                       "model-kfd-minor = 12\n"
                                       "topology = /file/topology\n"
                                       "window-size = 2G\n");
        const char *all[] = {"gpumemd", "-s", "/run/cli.sock", "-b", "kfd", "--model-kfd-minor",
                             "16",      "-t", "/cli"};
        options_init(&o);
        CHECK_EQ(parse(&o, ARRAY_SIZE(all), all), 0);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), 0);
        CHECK(strcmp(o.socket_path, "/run/cli.sock") == 0);
        CHECK(strcmp(o.backend, "kfd") == 0);
        CHECK_EQ(o.model_kfd_minor, 16);
        CHECK(strcmp(o.topology_root, "/cli") == 0);
        CHECK_EQ(o.window_size, 2ull << 30);
        options_done(&o);
        /* without them, the file's */
        options_init(&o);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), 0);
        CHECK(strcmp(o.socket_path, "/run/file.sock") == 0);
        CHECK(strcmp(o.backend, "model") == 0);
        CHECK_EQ(o.model_kfd_minor, 12);
        CHECK(strcmp(o.topology_root, "/file/topology") == 0);
        options_done(&o);

        /* a setting the command line gave is still checked in the file: the file must be good on its own */
        path = write_file("bad-overridden.conf", "[daemon]\nbackend = gpu\n");
        const char *kfd[] = {"gpumemd", "-b", "kfd"};
        options_init(&o);
        CHECK_EQ(parse(&o, ARRAY_SIZE(kfd), kfd), 0);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), -EINVAL);
        CHECK_STR_CONTAINS(err, "bad-overridden.conf:2: backend: no backend called 'gpu'");
        options_done(&o);
}

static void test_file_errors(void)
{
        static const struct {
                const char *text;
                const char *want; /* "LINE: message fragment" */
        } cases[] = {
                {"[daemon]\nbackend = gpu\n", ":2: backend: no backend called 'gpu' (kfd, model, cuda)"},
                {"[daemon]\n\nlog-level = shout\n", ":3: log-level: unknown level 'shout'"},
                {"[daemon]\nsocket = relative.sock\n",
                 ":2: socket: 'relative.sock' is not an absolute path shorter than 108 bytes"},
                {"[daemon]\nmax-connections = 0\n",
                 ":2: max-connections: '0' is not a number between 1 and 1000000"},
                {"[daemon]\nmax-connections-per-uid = 1000001\n", ":2: max-connections-per-uid: '1000001'"},
                {"[daemon]\nwindow-size = 3M\n",
                 ":2: window-size: '3M' is not a multiple of 2M between 1G and 16T"},
                {"[daemon]\nwindow-size = 1025M\n", ":2: window-size: '1025M'"},
                {"[daemon]\nshared-region-size = 1025M\n",
                 ":2: shared-region-size: '1025M' is not a multiple of 1G"},
                {"[daemon]\nshared-region-size = 17T\n", ":2: shared-region-size: '17T'"},
                {"[daemon]\nhandover = true\n", ":2: handover: 'true' is neither yes nor no"},
                {"[daemon]\nmetrics-listen = 9100\n", ":2: metrics-listen: '9100' is not ADDRESS:PORT"},
                {"[daemon]\nmetrics-listen = :9100\n", ":2: metrics-listen: ':9100' is not ADDRESS:PORT"},
                {"[daemon]\nmodel-preset = \n", ":2: model-preset: empty value"},
                {"[daemon]\ntopology = sys/topology\n",
                 ":2: topology: 'sys/topology' is not an absolute path"},
                {"[daemon]\nadmin-groups = root root root root root root root root root root root root root "
                 "root "
                 "root root root\n",
                 ":2: admin-groups: more than 16 groups"},
                /* the command line's own are no settings of the file */
                {"[daemon]\nconfig = /etc/other.conf\n", ":2: unknown setting 'config' in [daemon]"},
                {"[daemon]\ncheck-config = yes\n", ":2: unknown setting 'check-config' in [daemon]"},
                {"[daemon]\nhello-timeout = 3601\n", ":2: hello-timeout"},
                {"[daemon]\nhello-timeout = -1\n", ":2: hello-timeout"},
                {"[daemon]\nmodel-kfd-minor = 25\n", ":2: model-kfd-minor: '25' is not 0 or a number from"},
                {"[daemon]\nmodel-kfd-minor = 5\n", ":2: model-kfd-minor"},
                {"[daemon]\nsocket-mode = 999\n", ":2: socket-mode: '999' is not an octal mode"},
                {"[daemon]\nfrobnicate = 1\n", ":2: unknown setting 'frobnicate'"},
                {"[nosuch]\nx = 1\n", ":1: unknown section [nosuch]"},
                {"[daemon]\nlog-level = info\n[empty]\n", ":3: unknown section [empty]"},
                {"backend = model\n", ":1: setting 'backend' outside any section"},
                {"[daemon]\nthis line has no equals sign\n", ":2: syntax error"},
                {"[daemon]\nmax-window-bytes-per-uid = 512M\n", ":2: max-window-bytes-per-uid"},
                {"[daemon]\nmax-host-per-uid = 150%\n", ":2: max-host-per-uid"},
                {"[daemon]\nmax-event-threads = 5000\n", ":2: max-event-threads"},
                {"[daemon]\nmax-mappings = lots\n", ":2: max-mappings"},
                {"[daemon]\nsend-timeout = 0\n",
                 ":2: send-timeout: '0' is not a number of seconds from 1 to 3600"},
                {"[daemon]\nsend-timeout = 3601\n", ":2: send-timeout"},
                {"[daemon]\nworker-threads = 65\n", ":2: worker-threads: '65' is not a number from 0 to 64"},
                {"[daemon]\nloops = 65\n", ":2: loops: '65' is not a number from 0 (one per CPU) to 64"},
                {"[daemon]\nloops = -1\n", ":2: loops: '-1' is not a number from 0 (one per CPU) to 64"},
                {"[daemon]\nmax-window-bytes-per-uid = 256T\n", ":2: max-window-bytes-per-uid"},
                /* checked against window-size wherever that comes in the file */
                {"[daemon]\nmax-window-bytes-per-uid = 2G\nwindow-size = 4G\n",
                 ":2: max-window-bytes-per-uid: less than window-size"},
                {"[daemon]\nadmin-groups = no-such-group-here\n",
                 ":2: admin-groups: no group named 'no-such-group-here'"},
                {"[daemon]\nmodel-kfd-minor = many\n", ":3: model-kfd-minor"},
        };
        char err[2048];
        Options o;

        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                const char *text = cases[i].text;
                char buf[256];
                if (i == ARRAY_SIZE(cases) - 1) {
                        snprintf(buf, sizeof(buf), "[daemon]\nlog-level = info\n%s",
                                 text + strlen("[daemon]\n"));
                        text = buf;
                }
                const char *path = write_file("bad.conf", text);
                options_init(&o);
                char *before = strdup(o.model_preset);
                CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), -EINVAL);
                CHECK_STR_CONTAINS(err, cases[i].want);
                CHECK_STR_CONTAINS(err, "bad.conf");
                /* nothing of a bad file is applied */
                CHECK(strcmp(o.model_preset, before) == 0);
                CHECK_EQ(o.log_level, LOG_INFO);
                free(before);
                options_done(&o);
        }

        /* every error is reported, each with its own line */
        const char *path = write_file("multi.conf", "[daemon]\nbackend = x\nlog-level = y\nfoo = z\n");
        options_init(&o);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), -EINVAL);
        CHECK_STR_CONTAINS(err, "multi.conf:2:");
        CHECK_STR_CONTAINS(err, "multi.conf:3:");
        CHECK_STR_CONTAINS(err, "multi.conf:4:");
        options_done(&o);

        /* and every unknown group of one line */
        path = write_file("groups.conf", "[daemon]\nadmin-groups = no-such-one, root, no-such-two\n");
        options_init(&o);
        CHECK_EQ(options_load_file(&o, path, true, err, sizeof(err)), -EINVAL);
        CHECK_STR_CONTAINS(err, "groups.conf:2: admin-groups: no group named 'no-such-one'");
        CHECK_STR_CONTAINS(err, "groups.conf:2: admin-groups: no group named 'no-such-two'");
        options_done(&o);

        /* a missing file: an error only when it was asked for */
        options_init(&o);
        CHECK_EQ(options_load_file(&o, "/nonexistent/gpumemd.conf", false, err, sizeof(err)), 0);
        CHECK_EQ(options_load_file(&o, "/nonexistent/gpumemd.conf", true, err, sizeof(err)), -ENOENT);
        options_done(&o);
}

static void test_parse_helpers(void)
{
        uint64_t v;
        bool b;

        CHECK_EQ(parse_size("2M", &v), 0);
        CHECK_EQ(v, 2u << 20);
        CHECK_EQ(parse_size("1GiB", &v), 0);
        CHECK_EQ(v, 1u << 30);
        CHECK_EQ(parse_size("0x1000", &v), 0);
        CHECK_EQ(v, 4096);
        CHECK_EQ(parse_size("010G", &v), 0); /* decimal, not octal */
        CHECK_EQ(v, 10ull << 30);
        CHECK_EQ(parse_size("-1", &v), -EINVAL);
        CHECK_EQ(parse_size("12Q", &v), -EINVAL);
        CHECK_EQ(parse_size("99999999999T", &v), -ERANGE);
        CHECK_EQ(parse_uint("10", 5, &v), -ERANGE);
        CHECK_EQ(parse_uint(" 1", 5, &v), -EINVAL);
        CHECK_EQ(parse_bool("yes", &b), 0);
        CHECK(b);
        CHECK_EQ(parse_bool("off", &b), 0);
        CHECK(!b);
        CHECK_EQ(parse_bool("maybe", &b), -EINVAL);
}

int main(void)
{
        static const TestCase cases[] = {
                {"command line", test_argv},
                {"config file", test_file_good},
                {"config file errors name their line", test_file_errors},
                {"number parsing", test_parse_helpers},
        };
        int r;

        if (!mkdtemp(tmpdir))
                return EXIT_FAILURE;
        r = run_tests(cases, ARRAY_SIZE(cases));
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        (void)!system(cmd);
        return r;
}
