/* VA windows against a hostile uid: per-uid window bytes and a class's window count are capped, and freed. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"

#define MiB       (1ull << 20)
#define UID_HOG   65534 /* class "others": no window count limit, only the per-uid byte cap */
#define UID_BATCH 65533 /* class "batch": windows = 3 */
#define UID_OTHER 65532 /* a bystander of class "others" */
#define RETRIES   4     /* WINDOW_MAX_RETRIES of the daemon */

/* 1 GiB windows, 6 GiB per uid: the hog reaches the cap after one connection's hello and four retries
 * (5 windows) and a second hello (6). */
static const char config_default[] =
        "[daemon]\nlog-level = warning\nhello-timeout = 120\nwindow-size = 16T\n";
static const char config_caps[] = "[daemon]\nlog-level = warning\nhello-timeout = 120\nwindow-size = 1G\n"
                                  "max-window-bytes-per-uid = 6G\n\n"
                                  "[class admins]\nmatch-uid = 0\nadmin = yes\n\n"
                                  "[class batch]\nmatch-uid = 65533\nwindows = 3\n\n"
                                  "[class others]\nmatch-all = yes\n";

static Daemon dmn;
static bool started;
static int hog_cap_gib = 6; /* max-window-bytes-per-uid in force, in GiB (1 GiB windows) */
static uint32_t next_id = 1;

static int start(const char *config)
{
        int r;

        /* a daemon that exits at start is better not started at all */
        if (!daemon_accepts_config(config, true)) {
                fprintf(stderr, "this gpumemd refuses the configuration:\n%s", config);
                return -EINVAL;
        }
        r = daemon_setup(&dmn, "mi300x", config, NULL, NULL, 0);
        if (r < 0)
                return r;
        /* clients of other uids connect too */
        chmod(dmn.dir, 0755);
        chmod(dmn.sock, 0666);
        started = true;
        return 0;
}

static void stop(void)
{
        if (!started)
                return;
        CHECK_EQ(daemon_stop(&dmn), 0);
        daemon_cleanup(&dmn);
        started = false;
}

/* ---- raw window requests: the reply code, the window base and the reason ---- */

/* The reply @rep (freed here) with its @code, the window base in *@ret_base and the reason in @why. */
static int reply_of(int code, Gpumem__Reply *rep, uint64_t *ret_base, char *why, size_t len)
{
        if (why)
                snprintf(why, len, "%s",
                         rep && rep->status && rep->status->reason ? rep->status->reason : "");
        if (code == 0 && ret_base)
                *ret_base = rep && rep->hello ? rep->hello->window_base : 0;
        raw_reply_free(rep);
        return code;
}

static int hello(int fd, uint64_t *ret_base, char *why, size_t len)
{
        Gpumem__Reply *rep = NULL;
        int code = raw_hello_named(fd, next_id++, "windows", (void **)&rep);

        return reply_of(code, rep, ret_base, why, len);
}

/* The client says it could not reserve @base: the daemon keeps it and hands out another. */
static int retry(int fd, uint64_t *base, char *why, size_t len)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__WindowRetry w = GPUMEM__WINDOW_RETRY__INIT;
        Gpumem__Reply *rep = NULL;
        int code;

        w.has_failed_base = true;
        w.failed_base = *base;
        req.op_case = GPUMEM__REQUEST__OP_WINDOW_RETRY;
        req.window_retry = &w;
        code = raw_request(fd, next_id++, &req, NULL, 0, (void **)&rep, NULL, NULL, NULL);
        return reply_of(code, rep, base, why, len);
}

/* ---- children of other uids ---- */

typedef struct Child {
        pid_t pid;
        int sync; /* our end of a socketpair: the child writes 'r' when ready, waits for 'g' */
} Child;

/* Start @fn as @uid (it became that uid before it connected); @fn's argument points at its end of the sync
 * socket. */
static Child spawn_as(uid_t uid, int (*fn)(void *))
{
        Child ch;

        ch.pid = fork_as_synced(uid, fn, &ch.sync);
        return ch;
}

/* Wait for the child's 'r'; false when it exited instead (its checks failed). */
static bool child_ready(Child *ch)
{
        char c = 0;
        return ch->sync >= 0 && read(ch->sync, &c, 1) == 1 && c == 'r';
}

/* @fn started as @uid (spawn_as) in *@ch, and ready; false, a failed check, when it is not. */
static bool start_child(Child *ch, uid_t uid, int (*fn)(void *))
{
        bool ready;

        *ch = spawn_as(uid, fn);
        ready = child_ready(ch);
        CHECK(ready);
        return ready;
}

static void child_go(Child *ch)
{
        CHECK_EQ(write(ch->sync, "g", 1), 1);
}

/* Reap the child: its exit status (0: every expectation held). */
static int child_wait(Child *ch)
{
        int r = child_end(ch->pid, ch->sync);

        ch->sync = -1;
        return r;
}

/* In the child: say it is ready, wait to go on (@sync points at its end of the socket). */
static int signal_and_wait(void *sync)
{
        char c;
        if (write(*(int *)sync, "r", 1) != 1 || read(*(int *)sync, &c, 1) != 1)
                return -1;
        return 0;
}

/* ---- what the daemon holds ---- */

static int va_windows(void)
{
        DaemonState s;
        /* the status connection's own window is counted: report the others */
        return daemon_state(&dmn, &s) == 0 ? (int)s.va_windows - 1 : -1;
}

/* Windows are given back when the connection is freed, a loop round after it closed: wait for @want. */
static int wait_va_windows(int want)
{
        int n = -1;
        for (int i = 0; i < 250 && (n = va_windows()) != want; i++)
                usleep(20000);
        if (n != want)
                fprintf(stderr, "va_windows: %d, expected %d\n", n, want);
        return n;
}

static bool class_windows(const char *cls, uint64_t *used, uint64_t *limit)
{
        gm_client *c = NULL;
        gm_quota *q = NULL;
        size_t n = 0;
        bool found = false;

        if (gm_client_connect(dmn.sock, "admin", &c) < 0)
                return false;
        if (gm_admin_quota_get(c, cls, &q, &n) == 0)
                for (size_t i = 0; i < n; i++)
                        if (q[i].resource == GM_RESOURCE_WINDOWS && q[i].gpu_id == 0) {
                                *used = q[i].used;
                                *limit = q[i].limit;
                                found = true;
                        }
        gm_quota_free(q, n);
        gm_client_close(c);
        return found;
}

/* Each case needs the daemon of config_caps. */
#define NEED_DAEMON()                                                                                        \
        do {                                                                                                 \
                if (!started) {                                                                              \
                        CHECK(!"gpumemd runs with max-window-bytes-per-uid and a class with windows");       \
                        return;                                                                              \
                }                                                                                            \
        } while (0)

/* ---- (a) one uid against the per-uid cap ---- */

/* Open connections and retry windows until refused: the refusal must be the per-uid cap at 6 windows. */
static int hog_take_all(int *fds, int *n_fds, int max_fds, int *held, uint64_t *ret_base, char *why,
                        size_t len)
{
        uint64_t base = 0;
        int code = 0;

        *held = 0;
        for (*n_fds = 0; *n_fds < max_fds && code == 0;) {
                int fd = raw_connect(dmn.sock);
                if (fd < 0)
                        return fd;
                fds[(*n_fds)++] = fd;
                code = hello(fd, &base, why, len);
                if (code)
                        break;
                (*held)++;
                for (int k = 0; k < RETRIES && code == 0; k++) {
                        code = retry(fd, &base, why, len);
                        if (code == 0)
                                (*held)++;
                }
        }
        *ret_base = base;
        return code;
}

static int hog(void *arg)
{
        int fds[64], n = 0, held = 0, extra, code;
        char why[256], want[256];
        uint64_t base = 0;

        code = hog_take_all(fds, &n, 64, &held, &base, why, sizeof(why));
        fprintf(stderr, "hog: %d windows on %d connections, then %d (%s)\n", held, n, code, why);
        snprintf(want, sizeof(want),
                 "uid 65534 holds %d GiB of VA windows, its limit is %d GiB: 1 GiB more is refused",
                 hog_cap_gib, hog_cap_gib);
        REQUIRE(code == -EDQUOT);
        REQUIRE(held == hog_cap_gib);
        REQUIRE(n == 2);
        REQUIRE(strcmp(why, want) == 0);
        /* the refused retry changed nothing: its base is still the connection's window, and refused again */
        REQUIRE(retry(fds[1], &base, why, sizeof(why)) == -EDQUOT);
        /* a hello on a new connection is refused too, before any window is made */
        extra = raw_connect(dmn.sock);
        REQUIRE(extra >= 0);
        code = hello(extra, &base, why, sizeof(why));
        REQUIRE(code == -EDQUOT);
        REQUIRE(strcmp(why, want) == 0);
        /* what the library says */
        {
                gm_client *gc = NULL;
                REQUIRE(gm_client_open(dmn.sock, "hog", &gc, why, sizeof(why)) == -EDQUOT);
                REQUIRE(strstr(why, want) != NULL);
        }
        REQUIRE(signal_and_wait(arg) == 0);

        /* the first connection (5 windows) goes: the refused hello succeeds on the same connection */
        close(fds[0]);
        for (int i = 0; i < 250 && (code = hello(extra, &base, why, sizeof(why))) == -EDQUOT; i++)
                usleep(20000);
        REQUIRE(code == 0);
        REQUIRE(signal_and_wait(arg) == 0);
        /* killed with its windows held */
        pause();
        return 0;
}

static int bystander(void *arg)
{
        gm_client *c = NULL;
        gm_topology *t = NULL;
        uint32_t gpu = 0;
        void *p = NULL;
        char buf[256];
        int r = gm_client_open(dmn.sock, "bystander", &c, buf, sizeof(buf));

        (void)arg;
        if (r < 0)
                fprintf(stderr, "bystander: %s\n", buf);
        REQUIRE(r == 0);
        REQUIRE(gm_topology_get(c, false, &t) == 0);
        for (size_t i = 0; i < t->n_nodes && !gpu; i++)
                if (t->nodes[i].is_gpu)
                        gpu = t->nodes[i].gpu_id;
        gm_topology_free(t);
        REQUIRE(gm_malloc(c, 2 * MiB, gpu, 0, &p) == 0);
        REQUIRE(gm_mem_free(c, p) == 0);
        gm_client_close(c);
        return 0;
}

static void test_uid_cap(void)
{
        Child h;
        bool ready;

        NEED_DAEMON();
        ready = start_child(&h, UID_HOG, hog);
        if (ready) {
                CHECK_EQ(wait_va_windows(6), 6);
                /* another uid still gets its hello and allocates; so does root */
                CHECK_EQ(run_as(UID_OTHER, bystander, NULL), 0);
                CHECK_EQ(wait_va_windows(6), 6);
                child_go(&h);
                ready = child_ready(&h);
                CHECK(ready);
        }
        if (ready)
                CHECK_EQ(wait_va_windows(2),
                         2); /* 5 freed with the closed connection, 1 taken by the hello */
        /* killed while holding: everything comes back, and the uid can take its full share again */
        kill(h.pid, SIGKILL);
        CHECK_EQ(child_wait(&h), 128 + SIGKILL);
        CHECK_EQ(wait_va_windows(0), 0);
        ready = start_child(&h, UID_HOG, hog);
        if (ready)
                CHECK_EQ(wait_va_windows(6), 6);
        kill(h.pid, SIGKILL);
        child_wait(&h);
        CHECK_EQ(wait_va_windows(0), 0);
}

/* A reload applies a new max-window-bytes-per-uid to the next window. */
static void test_reload(void)
{
        char text[sizeof(config_caps) + 8];
        char *at;
        Child h;

        NEED_DAEMON();
        snprintf(text, sizeof(text), "%s", config_caps);
        at = strstr(text, "max-window-bytes-per-uid = 6G");
        CHECK(at != NULL);
        if (!at)
                return;
        at[strlen("max-window-bytes-per-uid = ")] = '7';
        CHECK_EQ(daemon_write_config(&dmn, text), 0);
        kill(dmn.pid, SIGHUP);
        usleep(300000);
        hog_cap_gib = 7;
        start_child(&h, UID_HOG, hog);
        CHECK_EQ(wait_va_windows(7), 7);
        kill(h.pid, SIGKILL);
        child_wait(&h);
        CHECK_EQ(wait_va_windows(0), 0);
        /* back to the file the other cases expect */
        hog_cap_gib = 6;
        CHECK_EQ(daemon_write_config(&dmn, config_caps), 0);
        kill(dmn.pid, SIGHUP);
        usleep(300000);
}

/* ---- (b) a class's window count ---- */

static int batch(void *arg)
{
        int fd[4];
        uint64_t base[4] = {0};
        char why[256];
        int code;

        for (int i = 0; i < 4; i++) {
                fd[i] = raw_connect(dmn.sock);
                REQUIRE(fd[i] >= 0);
        }
        for (int i = 0; i < 3; i++)
                REQUIRE(hello(fd[i], &base[i], why, sizeof(why)) == 0);
        /* the 4th window: by hello, and by window_retry */
        code = hello(fd[3], &base[3], why, sizeof(why));
        fprintf(stderr, "batch: 4th hello: %d (%s)\n", code, why);
        REQUIRE(code == -EDQUOT);
        REQUIRE(strcmp(why, "class 'batch' window limit: 3 in use of 3") == 0);
        code = retry(fd[0], &base[0], why, sizeof(why));
        REQUIRE(code == -EDQUOT);
        REQUIRE(strcmp(why, "class 'batch' window limit: 3 in use of 3") == 0);
        REQUIRE(signal_and_wait(arg) == 0);

        /* a disconnect frees one: the refused hello now succeeds, and the class is full again */
        close(fd[1]);
        for (int i = 0; i < 250 && (code = hello(fd[3], &base[3], why, sizeof(why))) == -EDQUOT; i++)
                usleep(20000);
        REQUIRE(code == 0);
        REQUIRE(retry(fd[0], &base[0], why, sizeof(why)) == -EDQUOT);
        /* another one goes: a retry takes its place (the refused window stays counted) */
        close(fd[3]);
        for (int i = 0; i < 250 && (code = retry(fd[0], &base[0], why, sizeof(why))) == -EDQUOT; i++)
                usleep(20000);
        REQUIRE(code == 0);
        fd[1] = raw_connect(dmn.sock);
        REQUIRE(hello(fd[1], &base[1], why, sizeof(why)) == -EDQUOT);
        REQUIRE(signal_and_wait(arg) == 0);
        return 0;
}

static bool ctl_output_has(const char *args, const char *needle)
{
        char cmd[512], out[8192];
        size_t n;
        FILE *p;
        const char *ctl = getenv("GPUMEMCTL");

        if (!ctl)
                return false;
        snprintf(cmd, sizeof(cmd), "%s --socket %s %s", ctl, dmn.sock, args);
        p = popen(cmd, "re");
        if (!p)
                return false;
        n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        pclose(p);
        if (!strstr(out, needle)) {
                fprintf(stderr, "'%s' printed:\n%s(without '%s')\n", cmd, out, needle);
                return false;
        }
        return true;
}

static void test_class_windows(void)
{
        uint64_t used = 0, limit = 0;
        gm_client *adm = NULL;
        char *text = NULL;
        Child b;
        bool ready;

        NEED_DAEMON();
        ready = start_child(&b, UID_BATCH, batch);
        if (ready) {
                CHECK(class_windows("batch", &used, &limit));
                CHECK_EQ(used, 3);
                CHECK_EQ(limit, 3);
                CHECK(ctl_output_has("-r quota show batch", "batch windows all 3 3\n"));
                CHECK_EQ(gm_client_connect(dmn.sock, "admin", &adm), 0);
                if (adm) {
                        CHECK_EQ(gm_admin_quota_set(adm, "batch", GM_RESOURCE_WINDOWS, 0, 2, false), -EBUSY);
                        CHECK_EQ(gm_admin_metrics(adm, &text), 0);
                        CHECK_STR_CONTAINS(text, "gpumemd_class_windows_limit{class=\"batch\"} 3\n");
                        CHECK_STR_CONTAINS(text, "gpumemd_class_windows{class=\"batch\"} 3\n");
                        CHECK_STR_CONTAINS(text, "gpumemd_class_windows_limit{class=\"others\"} +Inf");
                        gm_free(text);
                        gm_client_close(adm);
                }
                child_go(&b);
                ready = child_ready(&b);
                CHECK(ready);
        }
        if (ready) {
                CHECK(class_windows("batch", &used, &limit));
                CHECK_EQ(used, 3); /* fd0: a refused window and its current one; fd2: one */
                child_go(&b);
        }
        CHECK_EQ(child_wait(&b), 0);
        for (int i = 0; i < 250 && class_windows("batch", &used, &limit) && used != 0; i++)
                usleep(20000);
        CHECK_EQ(used, 0);
        CHECK_EQ(wait_va_windows(0), 0);
}

/* ---- with the defaults: one uid cannot take the whole aperture ---- */

static int hog_default(void *arg)
{
        int fds[16], n = 0, held = 0, code;
        uint64_t base;
        char why[256];

        code = hog_take_all(fds, &n, 16, &held, &base, why, sizeof(why));
        fprintf(stderr, "hog: %d windows of 16 TiB on %d connections, then %d (%s)\n", held, n, code, why);
        /* held while the bystander connects, whatever happened */
        REQUIRE(signal_and_wait(arg) == 0);
        REQUIRE(code == -EDQUOT);
        REQUIRE(held == 1);
        REQUIRE(strstr(why, "uid 65534 holds 16 TiB of VA windows, its limit is 16 TiB"));
        return 0;
}

static void test_default_cap(void)
{
        Child h;

        if (daemon_wrapped() || daemon_under_tsan()) { /* main started the daemon with config_caps */
                printf("# skipped under a wrapper or ThreadSanitizer: 16 TiB reservations\n");
                return;
        }
        start_child(&h, UID_HOG, hog_default);
        /* another uid connects (a 16 TiB window) and allocates while the hog holds all it could get */
        CHECK_EQ(run_as(UID_OTHER, bystander, NULL), 0);
        child_go(&h);
        CHECK_EQ(child_wait(&h), 0);
        /* the daemon the other cases need */
        stop();
        CHECK_EQ(start(config_caps), 0);
}

int main(void)
{
        static const TestCase cases[] = {
                /* first, on a daemon with the default cap and only settings every gpumemd knows */
                {"by default one uid cannot take the aperture", test_default_cap},
                {"one uid is refused at max-window-bytes-per-uid, other uids are served", test_uid_cap},
                {"a class's windows limit counts hellos and retries, a disconnect frees one",
                 test_class_windows},
                {"a reload changes max-window-bytes-per-uid", test_reload},
        };
        int r;

        signal(SIGPIPE, SIG_IGN);
        /* 16 TiB windows: the aperture (1 TiB to 128 TiB) holds about 7, so one unbounded uid can take it all
         */
        r = daemon_wrapped() || daemon_under_tsan() ? start(config_caps) : start(config_default);
        if (r < 0)
                return EXIT_FAILURE;
        r = run_tests(cases, ARRAY_SIZE(cases));
        stop();
        return r;
}
