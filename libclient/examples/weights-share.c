/* weights-share: publish a buffer of "weights" once under a name; any number of readers open it read-only by
 * name, with no channel to the publisher, at the same address in every reader. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem-client.h"

/* Say why @what failed (with the daemon's reason), close the client (and what it holds), return 1. */
static int fail(gm_client *c, const char *what, int err)
{
        char msg[512];
        fprintf(stderr, "weights-share: %s: %s\n", what, gm_strerror(c, err, msg, sizeof(msg)));
        gm_client_close(c);
        return 1;
}

/* The weights: a word per 4 bytes that depends on its place, so that a page out of place cannot pass. */
static void fill(uint32_t *w, size_t size)
{
        for (size_t i = 0; i < size / sizeof(*w); i++)
                w[i] = (uint32_t)i * 2654435761u ^ 0x5eed;
}

static size_t first_bad(const uint32_t *w, size_t size)
{
        for (size_t i = 0; i < size / sizeof(*w); i++)
                if (w[i] != ((uint32_t)i * 2654435761u ^ 0x5eed))
                        return i * sizeof(*w);
        return SIZE_MAX;
}

/* "64M", "1G", "4096": bytes, a multiple of 4 KiB. */
static int parse_size(const char *s, size_t *ret)
{
        char *end;
        unsigned long long v;
        unsigned shift = 0;

        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || end == s || *s == '-')
                return -EINVAL;
        if (*end == 'K' || *end == 'k')
                shift = 10;
        else if (*end == 'M' || *end == 'm')
                shift = 20;
        else if (*end == 'G' || *end == 'g')
                shift = 30;
        if (shift)
                end++;
        if (*end || v == 0 || v > (SIZE_MAX >> shift) || ((v << shift) & 4095))
                return -EINVAL;
        *ret = (size_t)(v << shift);
        return 0;
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
        (void)sig;
        stop = 1;
}

static gm_client *connect_or_say(void)
{
        const char *sock = getenv("GPUMEM_SOCKET");
        char err[256];
        gm_client *c = NULL;

        if (gm_client_open(sock, "weights-share", &c, err, sizeof(err)) < 0) {
                fprintf(stderr, "weights-share: cannot connect to gpumemd: %s\n", err);
                return NULL;
        }
        return c;
}

/* Device memory the CPU can fill (host visible), on the first GPU. */
static int publish(const char *name, size_t size)
{
        gm_pointer_attributes a = {.struct_size = sizeof(a)};
        struct sigaction sa = {.sa_handler = on_signal};
        gm_client *c = connect_or_say();
        gm_share_info info;
        gm_topology *t = NULL;
        uint32_t gpu = 0;
        void *p = NULL;
        int r;

        if (!c)
                return 1;
        r = gm_topology_get(c, false, &t);
        if (r < 0)
                return fail(c, "topology", r);
        for (size_t i = 0; i < t->n_nodes && !gpu; i++)
                gpu = t->nodes[i].gpu_id;
        gm_topology_free(t);
        r = gm_malloc(c, size, gpu, GM_MEM_HOST_VISIBLE, &p);
        if (r < 0)
                return fail(c, "allocate", r);
        fill(p, size);
        r = gm_pointer_get_attributes(c, p, &a);
        if (r < 0)
                return fail(c, "pointer attributes", r);
        r = gm_share_publish(c, a.handle, name, GM_SHARE_READ_ONLY, &info);
        if (r < 0)
                return fail(c, "publish", r);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        printf("published %s: %zu bytes of VRAM on GPU %u, read-only at %p for every reader%s\n", name, size,
               gpu, info.ptr, info.persistent ? ", persistent (it outlives this process until revoked)" : "");
        printf("holding it until killed\n");
        fflush(stdout);
        while (!stop)
                pause();
        /* the share ends with the memory (unless persistent) */
        r = gm_mem_free(c, p);
        gm_client_close(c);
        return r < 0 ? 1 : 0;
}

/* A write to @p kills whoever tries: tried by a child, which must die of SIGSEGV. */
static bool write_refused(volatile uint32_t *p)
{
        pid_t pid = fork();
        int st = 0;

        if (pid == 0) {
                signal(SIGSEGV, SIG_DFL);
                p[0] = 0;
                _exit(0);
        }
        return pid > 0 && waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
}

static int read_share(const char *name)
{
        gm_pointer_attributes a = {.struct_size = sizeof(a)};
        gm_client *c = connect_or_say();
        size_t size = 0, bad;
        void *p = NULL, *rw = NULL;
        int r, ok = 1;

        if (!c)
                return 1;
        r = gm_share_open(c, name, 0, NULL, 0, &p, &size, NULL);
        if (r < 0)
                return fail(c, "open", r);
        r = gm_pointer_get_attributes(c, p, &a);
        if (r < 0)
                return fail(c, "pointer attributes", r);
        printf("opened %s read-only: %zu bytes at %p, mapped on %zu GPU%s\n", name, size, p, a.n_mapped_gpus,
               a.n_mapped_gpus == 1 ? "" : "s");
        bad = first_bad(p, size);
        if (bad != SIZE_MAX) {
                fprintf(stderr, "weights-share: the pattern is wrong at byte %zu\n", bad);
                ok = 0;
        } else {
                printf("verified the pattern over all %zu bytes\n", size);
        }
        /* every way to write is refused: a store, making the mapping writable, opening it read-write */
        if (!write_refused(p)) {
                fprintf(stderr, "weights-share: a write to the share was not refused\n");
                ok = 0;
        } else if (mprotect(p, size, PROT_READ | PROT_WRITE) == 0 || errno != EACCES) {
                fprintf(stderr, "weights-share: the mapping could be made writable\n");
                ok = 0;
        } else if ((r = gm_share_open(c, name, GM_SHARE_WRITE, NULL, 0, &rw, NULL, NULL)) != -EACCES) {
                fprintf(stderr, "weights-share: opening it read-write gave %d, not -EACCES\n", r);
                ok = 0;
        } else {
                printf("a write is refused: the store faults, mprotect and a read-write open fail\n");
        }
        r = gm_share_close(c, p);
        if (r < 0)
                return fail(c, "close", r);
        gm_client_close(c);
        return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
        size_t size = 0;

        if (argc == 4 && strcmp(argv[1], "publish") == 0) {
                if (parse_size(argv[3], &size) < 0) {
                        fprintf(stderr,
                                "weights-share: '%s' is no size (bytes, K, M or G; 4 KiB multiples)\n",
                                argv[3]);
                        return 2;
                }
                return publish(argv[2], size);
        }
        if (argc == 3 && strcmp(argv[1], "read") == 0)
                return read_share(argv[2]);
        fprintf(stderr, "usage: weights-share publish NAME SIZE | weights-share read NAME\n");
        return 2;
}
