/* Daemon restart: clients get a clear error and reconnect; shared memory they mapped outlives the daemon. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static DaemonState fresh; /* a daemon that just started, with no client */
static uint32_t gpu0;

static void fill(volatile unsigned char *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i += 512)
                p[i] = (unsigned char)(seed + i / 512);
}

static bool same(const volatile unsigned char *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i += 512)
                if (p[i] != (unsigned char)(seed + i / 512))
                        return false;
        return true;
}

/* Another process: maps the dmabuf it is given (CPU) and imports it (GPU), then checks and writes the data
 * across the daemon's death. Protocol on @sock: fd in; "m" mapped; (daemon dies) "c" check; "w" written. */
static int importer(int sock)
{
        gm_client *c = NULL;
        gm_handle h = 0;
        char cmd;
        int fd = recv_one_fd(sock, 0), ok = 1;
        volatile unsigned char *p;

        if (fd < 0 || gm_client_connect(dmn.sock, "importer", &c) < 0)
                return 10;
        p = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED || gm_mem_import(c, fd, gpu0, &h, NULL) < 0)
                return 11;
        close(fd);
        if (!same(p, 4 * MiB, 7))
                return 12;
        (void)!write(sock, "m", 1);
        if (read(sock, &cmd, 1) != 1 || cmd != 'c')
                return 13;
        /* the daemon is gone: the pages are not */
        if (!same(p, 4 * MiB, 7))
                ok = 0;
        fill(p, 4 * MiB, 9);
        if (!same(p, 4 * MiB, 9))
                ok = 0;
        /* and the client learns the daemon went, with an errno and a reason */
        int r = gm_ping(c);
        char msg[256];
        gm_strerror(c, r, msg, sizeof(msg));
        if (r >= 0 || strlen(msg) == 0)
                ok = 0;
        gm_client_close(c);
        (void)!write(sock, ok ? "w" : "x", 1);
        munmap((void *)p, 4 * MiB);
        return ok ? 0 : 14;
}

static bool is_disconnect_errno(int r)
{
        return r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN || r == -ESHUTDOWN || r == -ECONNABORTED;
}

static void one_restart(bool killed)
{
        gm_client *a = NULL, *again = NULL;
        void *dev = NULL, *host = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int fd = -1, sv[2], status = 0, r;
        char ch = 0, msg[256];
        pid_t pid;
        DaemonState s;

        CHECK_EQ(gm_client_connect(dmn.sock, "exporter", &a), 0);
        if (!a)
                return;
        CHECK_EQ(gm_malloc(a, 4 * MiB, gpu0, GM_MEM_HOST_VISIBLE, &dev), 0);
        CHECK_EQ(gm_host_malloc(a, 2 * MiB, 0, -1, 0, &host), 0);
        fill(dev, 4 * MiB, 7);
        fill(host, 2 * MiB, 8);
        CHECK_EQ(gm_pointer_get_attributes(a, dev, &pa), 0);
        CHECK_EQ(gm_mem_export(a, pa.handle, &fd, NULL), 0);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        pid = fork();
        if (pid == 0) {
                close(sv[0]);
                _exit(importer(sv[1]));
        }
        close(sv[1]);
        CHECK_EQ(send_one_fd(sv[0], fd), 0);
        close(fd);
        CHECK_EQ(read(sv[0], &ch, 1), 1);
        CHECK_EQ(ch, 'm');

        /* the daemon goes */
        if (killed)
                CHECK_EQ(daemon_kill(&dmn), 0);
        else
                CHECK_EQ(daemon_stop(&dmn), 0);

        /* this client's own mappings stay: the memory lives while someone maps it */
        CHECK(same(dev, 4 * MiB, 7));
        CHECK(same(host, 2 * MiB, 8));
        fill(host, 2 * MiB, 18);
        CHECK(same(host, 2 * MiB, 18));
        /* the other process's dmabuf mapping too, read and written */
        (void)!write(sv[0], "c", 1);
        CHECK_EQ(read(sv[0], &ch, 1), 1);
        CHECK_EQ(ch, 'w');
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(sv[0]);
        CHECK(same(dev, 4 * MiB, 9)); /* the importer's writes, through the same pages */

        /* a clear error: an errno that says the connection is gone, and a reason */
        r = gm_ping(a);
        gm_strerror(a, r, msg, sizeof(msg));
        fprintf(stderr, "%s: gm_ping -> %d: %s\n", killed ? "SIGKILL" : "SIGTERM", r, msg);
        CHECK(is_disconnect_errno(r));
        CHECK(strlen(msg) > 0);
        r = gm_malloc(a, MiB, gpu0, 0, &dev);
        CHECK(is_disconnect_errno(r));
        /* no daemon: connecting says so (the socket file is stale after SIGKILL, and after a hand-over that
         * the supervisor dropped; without a supervisor's fd store it is gone) */
        r = gm_client_connect(dmn.sock, "too-early", &again);
        CHECK(r == -ENOENT || r == -ECONNREFUSED);
        CHECK(again == NULL);

        /* the daemon comes back on the same socket */
        CHECK_EQ(daemon_restart(&dmn, "mi300x", NULL), 0);
        CHECK_EQ(gm_client_connect(dmn.sock, "reconnected", &again), 0);
        if (again) {
                void *p = NULL;
                CHECK_EQ(gm_malloc(again, 2 * MiB, gpu0, GM_MEM_HOST_VISIBLE, &p), 0);
                if (p) {
                        fill(p, 2 * MiB, 3);
                        CHECK(same(p, 2 * MiB, 3));
                        CHECK_EQ(gm_mem_free(again, p), 0);
                }
                /* no ghosts: the new daemon knows only its own clients and holds nothing of the old */
                gm_client_info *infos = NULL;
                size_t n = 0;
                CHECK_EQ(gm_admin_clients(again, &infos, &n), 0);
                CHECK_EQ(n, 1);
                gm_client_info_free(infos, n);
                gm_client_close(again);
        }
        CHECK_EQ(daemon_wait_base(&dmn, &fresh, 10000, &s), 0);
        CHECK_EQ(s.clients, 1); /* the status connection itself */
        CHECK_EQ(s.va_windows, 1);
        /* the old client's memory is still this process's until it lets go */
        CHECK(same(host, 2 * MiB, 18));
        gm_client_close(a);
}

static void test_sigterm(void)
{
        one_restart(false);
}

static void test_sigkill(void)
{
        one_restart(true);
}

int main(void)
{
        static const TestCase cases[] = {
                {"daemon stopped with SIGTERM and started again", test_sigterm},
                {"daemon killed with SIGKILL and started again", test_sigkill},
        };
        gm_client *c = NULL;
        int r;

        signal(SIGPIPE, SIG_IGN);
        if (daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, &gpu0, 1) < 0)
                return EXIT_FAILURE;
        /* the state to come back to is taken once a first client came and went */
        CHECK_EQ(gm_client_connect(dmn.sock, "setup", &c), 0);
        if (!c) {
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        gm_client_close(c);
        usleep(100000);
        CHECK_EQ(daemon_state(&dmn, &fresh), 0);
        fresh.fds = daemon_quiet_fd_count(&dmn);
        r = run_tests(cases, ARRAY_SIZE(cases));
        return daemon_finish(&dmn, r);
}
