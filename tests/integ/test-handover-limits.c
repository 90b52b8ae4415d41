/* Hand-overs under pressure: one tenant fills the daemon's fd table, then a restart through the fd store or a
 * re-exec on SIGUSR1; the daemon serves afterwards and the other tenants are carried. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB (1ull << 20)
/* the daemon's fd limit in these tests: the hog fills it in a few hundred allocations */
#define DAEMON_FDS 400

static Daemon dmn;
static uint32_t gpu0;

static struct rlimit daemon_fds0;

/* Give the daemon (by pid, it keeps it across an exec) an fd limit of DAEMON_FDS, or the one it had. */
static int limit_daemon_fds(bool on)
{
        struct rlimit rl = {DAEMON_FDS, DAEMON_FDS};

        if (on && prlimit(dmn.pid, RLIMIT_NOFILE, NULL, &daemon_fds0) < 0)
                return -errno;
        return prlimit(dmn.pid, RLIMIT_NOFILE, on ? &rl : &daemon_fds0, NULL) < 0 ? -errno : 0;
}

/* Allocate small host buffers on @hog until the daemon refuses one: how many it got. */
static size_t fill_fd_table(gm_client *hog, void **ptrs, size_t cap, int *ret_err)
{
        size_t n = 0;

        *ret_err = 0;
        while (n < cap) {
                int r = gm_host_malloc(hog, 64 << 10, gpu0, -1, 0, &ptrs[n]);
                if (r < 0) {
                        *ret_err = r;
                        break;
                }
                n++;
        }
        return n;
}

/* A victim with device and host memory, bytes written. */
static int victim_setup(gm_client **ret, unsigned char **dev, unsigned char **host)
{
        void *p = NULL, *q = NULL;
        int r = daemon_connect_carried(&dmn, "victim", ret);

        if (r == 0)
                r = gm_malloc(*ret, 2 * MiB, gpu0, GM_MEM_HOST_VISIBLE, &p);
        if (r == 0)
                r = gm_host_malloc(*ret, 2 * MiB, gpu0, -1, 0, &q);
        if (r < 0)
                return r;
        *dev = p;
        *host = q;
        memset(*dev, 0x5a, 2 * MiB);
        memset(*host, 0xa5, 2 * MiB);
        return 0;
}

/* The victim after the hand-over: the same connection, handles and bytes. */
static void victim_check(gm_client *v, unsigned char *dev, unsigned char *host, uint64_t id, gm_handle hd,
                         gm_handle hh)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};

        CHECK_RC(gm_ping(v), 0);
        CHECK_EQ(gm_client_id(v), id);
        CHECK_RC(gm_pointer_get_attributes(v, dev, &pa), 0);
        CHECK_EQ(pa.handle, hd);
        CHECK_RC(gm_pointer_get_attributes(v, host, &pa), 0);
        CHECK_EQ(pa.handle, hh);
        CHECK_EQ(dev[0], 0x5a);
        CHECK_EQ(dev[2 * MiB - 1], 0x5a);
        CHECK_EQ(host[2 * MiB - 1], 0xa5);
}

static gm_handle handle_of(gm_client *c, void *p)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        return gm_pointer_get_attributes(c, p, &pa) == 0 ? pa.handle : 0;
}

/*
 * @reexec: SIGUSR1, else SIGTERM into the (polling) fd store and a start from it. The hog connected first
 * and fills the fd table; the victim connected after it. Afterwards the daemon accepts a new client, the
 * victim is carried, and the hog either is too or was told why not.
 */
static int exhausted_case(bool reexec)
{
        enum { CAP = 2 * DAEMON_FDS };
        gm_client *hog = NULL, *v = NULL, *fresh = NULL;
        unsigned char *dev = NULL, *host = NULL;
        void **ptrs = calloc(CAP, sizeof(void *));
        gm_handle hd, hh;
        uint64_t id;
        size_t got;
        int err = 0, r;

        REQUIRE(ptrs != NULL);
        REQUIRE_RC(daemon_connect_carried(&dmn, "hog", &hog), 0);
        REQUIRE_RC(victim_setup(&v, &dev, &host), 0);
        id = gm_client_id(v);
        hd = handle_of(v, dev);
        hh = handle_of(v, host);
        REQUIRE_RC(limit_daemon_fds(true), 0);
        got = fill_fd_table(hog, ptrs, CAP, &err);
        fprintf(stderr, "the hog got %zu buffers before %s\n", got, strerror(-err));
        /* the daemon ran out of fds, and said so */
        CHECK(got < CAP);
        CHECK(err == -EMFILE || err == -ENFILE || err == -ENOMEM);

        if (reexec) {
                pid_t pid = dmn.pid;
                daemon_notify_clear(&dmn);
                CHECK_EQ(kill(dmn.pid, SIGUSR1), 0);
                CHECK_EQ(daemon_wait_notify(&dmn, "READY=1", 20000), 0);
                CHECK_EQ(dmn.pid, pid);
        } else {
                CHECK_EQ(daemon_term(&dmn), 0);
                REQUIRE_EQ(daemon_restart_handover(&dmn, "mi300x", NULL), 0);
        }
        /* serving: a new client connects and is answered */
        r = gm_client_connect(dmn.sock, "fresh", &fresh);
        CHECK_RC(r, 0);
        CHECK_RC(gm_ping(fresh), 0);
        victim_check(v, dev, host, id, hd, hh);
        /* the hog: carried, or closed with a reason */
        r = gm_ping(hog);
        fprintf(stderr, "the hog after the hand-over: %s\n", r ? strerror(-r) : "carried");
        CHECK(r == 0 || r == -ECONNRESET);
        gm_client_close(hog);
        /* its fds given back, the others allocate again */
        if (r == 0) {
                void *p = NULL;
                int tries = 0;
                while ((r = gm_malloc(fresh, 2 * MiB, gpu0, 0, &p)) == -EMFILE && tries++ < 200)
                        usleep(10000); /* the hog's teardown runs in slices */
                CHECK_RC(r, 0);
        }
        gm_client_close(fresh);
        gm_client_close(v);
        free(ptrs);
        /* the daemon is back to the limit it was started with, for the next case (raising a hard limit
         * may be refused: a fresh daemon then) */
        if (limit_daemon_fds(false) < 0) {
                CHECK_EQ(daemon_stop(&dmn), 0);
                CHECK_EQ(daemon_restart(&dmn, "mi300x", NULL), 0);
        }
        return 0;
}

static void test_reexec_exhausted(void)
{
        (void)exhausted_case(true);
}

static void test_store_exhausted(void)
{
        (void)exhausted_case(false);
}

/*
 * A client whose books do not fit in the state with the others' (a daemon built with a 64 KiB bound for
 * them): it connected first but holds the most objects, so it goes last and alone is left out, told why;
 * the victim is carried.
 */
static int big_books_case(void)
{
        enum { RESERVATIONS = 4000 };
        gm_client *hog = NULL, *v = NULL;
        unsigned char *dev = NULL, *host = NULL;
        const char *small = getenv("GPUMEMD_SMALL_STATE");
        char *normal = getenv("GPUMEMD") ? strdup(getenv("GPUMEMD")) : NULL;
        gm_handle hd, hh;
        uint64_t id;
        int r;

        REQUIRE(small && normal);
        CHECK_EQ(daemon_stop(&dmn), 0);
        setenv("GPUMEMD", small, 1);
        REQUIRE_EQ(daemon_restart(&dmn, "mi300x", NULL), 0);
        REQUIRE_RC(daemon_connect_carried(&dmn, "hog", &hog), 0);
        /* reservations: books without files */
        for (int i = 0; i < RESERVATIONS; i++) {
                void *p = NULL;
                REQUIRE_RC(gm_mem_address_reserve(hog, 64 << 10, 0, NULL, 0, &p), 0);
        }
        REQUIRE_RC(victim_setup(&v, &dev, &host), 0);
        id = gm_client_id(v);
        hd = handle_of(v, dev);
        hh = handle_of(v, host);
        CHECK_EQ(daemon_term(&dmn), 0);
        REQUIRE_EQ(daemon_restart_handover(&dmn, "mi300x", NULL), 0);
        victim_check(v, dev, host, id, hd, hh);
        r = gm_ping(hog);
        CHECK_RC(r, -ECONNRESET);
        gm_client_close(hog);
        gm_client_close(v);
        CHECK_EQ(daemon_stop(&dmn), 0);
        setenv("GPUMEMD", normal, 1);
        free(normal);
        CHECK_EQ(daemon_restart(&dmn, "mi300x", NULL), 0);
        return 0;
}

static void test_big_books(void)
{
        (void)big_books_case();
}

int main(int argc, char **argv)
{
        static const TestCase cases[] = {
                {"SIGUSR1 with the fd table full: serving after, the others carried", test_reexec_exhausted},
                {"a restart with the fd table full: serving after, the others carried", test_store_exhausted},
                {"a client whose books do not fit the state: it alone is left out", test_big_books},
        };
        int r;

        (void)argc;
        (void)argv;
        signal(SIGPIPE, SIG_IGN);
        if (daemon_wrapped()) {
                fprintf(stderr, "skipped under a wrapper (a re-exec runs the program without it)\n");
                return 77;
        }
        if (daemon_setup(&dmn, "mi300x", NULL, NULL, &gpu0, 1) < 0)
                return EXIT_FAILURE;
        r = run_tests(cases, ARRAY_SIZE(cases));
        return daemon_finish(&dmn, r);
}
