/* hipMemcpy to and from malloc'ed memory, and hipHostRegister of heap, .bss and stack, while other threads
 * allocate and write around the same pages: no byte lost or changed, in the buffers or around them. */
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MiB      (1ull << 20)
#define MAX_SIZE (64 * MiB)

static int failures;
static volatile bool stop;

#define FAIL(...)                                                                                            \
        do {                                                                                                 \
                fprintf(stderr, "hip-heap: " __VA_ARGS__);                                                   \
                fputc('\n', stderr);                                                                         \
                __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                          \
        } while (0)

static uint64_t rng(uint64_t *s)
{
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        return *s;
}

/* random bytes, MAX_SIZE and a page more: a buffer's contents are these from an offset its seed picks */
static uint8_t *ref;

static const uint8_t *pattern(uint64_t seed)
{
        return ref + seed % 4096;
}

/* the first byte of @p (@n bytes) that differs from @want's, or @n */
static size_t first_diff(const uint8_t *p, const uint8_t *want, size_t n)
{
        if (memcmp(p, want, n) == 0)
                return n;
        for (size_t i = 0;; i++)
                if (p[i] != want[i])
                        return i;
}

/*
 * Counters that sit in the pages a registration takes (just before and just after the buffer, in the same
 * malloc block, or beside a .bss or stack array): a thread increments them all the time, and at the end
 * each must hold exactly as many increments as were made. A write lost while the pages are swapped shows.
 */
typedef struct Edge {
        volatile uint64_t *before, *after;
        uint64_t n; /* increments made */
        volatile bool on;
} Edge;

static Edge edge;
static pthread_mutex_t edge_lock = PTHREAD_MUTEX_INITIALIZER;

static void *edge_writer(void *arg)
{
        (void)arg;
        while (!stop) {
                pthread_mutex_lock(&edge_lock);
                if (edge.on) {
                        (*edge.before)++;
                        (*edge.after)++;
                        edge.n++;
                }
                pthread_mutex_unlock(&edge_lock);
        }
        return NULL;
}

static void edge_start(volatile uint64_t *before, volatile uint64_t *after)
{
        pthread_mutex_lock(&edge_lock);
        *before = *after = 0;
        edge = (Edge){.before = before, .after = after, .on = true};
        pthread_mutex_unlock(&edge_lock);
}

static void edge_check(const char *what)
{
        pthread_mutex_lock(&edge_lock);
        edge.on = false;
        if (*edge.before != edge.n || *edge.after != edge.n)
                FAIL("%s: counters beside the buffer hold %llu and %llu after %llu increments", what,
                     (unsigned long long)*edge.before, (unsigned long long)*edge.after,
                     (unsigned long long)edge.n);
        pthread_mutex_unlock(&edge_lock);
}

/* Other threads allocating, writing and checking their own blocks, on the heap the copies use. */
static void *churn(void *arg)
{
        uint64_t s = (uintptr_t)arg * 7919 + 1;
        struct {
                uint8_t *p;
                size_t n;
                uint64_t seed;
        } live[64] = {{0}};

        while (!stop) {
                unsigned k = (unsigned)(rng(&s) % 64);
                if (live[k].p) {
                        size_t i = first_diff(live[k].p, pattern(live[k].seed), live[k].n);
                        if (i < live[k].n)
                                FAIL("a block of another thread changed at %zu of %zu", i, live[k].n);
                        free(live[k].p);
                }
                live[k].n = 1 + rng(&s) % (rng(&s) % 4 ? 512 : 300000);
                live[k].seed = rng(&s);
                live[k].p = malloc(live[k].n);
                if (!live[k].p) {
                        FAIL("malloc");
                        break;
                }
                memcpy(live[k].p, pattern(live[k].seed), live[k].n);
                usleep(50); /* busy, not a hog: the copies have the CPUs too */
        }
        for (unsigned k = 0; k < 64; k++)
                free(live[k].p);
        return NULL;
}

/* One round trip of @n bytes at @off in a fresh malloc block, counters in its first and last pages. */
static void copy_round(void *dev, size_t n, size_t off, uint64_t seed)
{
        size_t total = off + n + 2 * sizeof(uint64_t) + 64;
        uint8_t *blk = malloc(total), *buf;
        volatile uint64_t *before, *after;

        if (!blk) {
                FAIL("malloc %zu", total);
                return;
        }
        before = (volatile uint64_t *)blk;
        buf = blk + sizeof(uint64_t) + off;
        after = (volatile uint64_t *)(((uintptr_t)(buf + n) + 7) & ~(uintptr_t)7);
        memcpy(buf, pattern(seed), n);
        edge_start(before, after);
        if (hipMemcpy(dev, buf, n, hipMemcpyHostToDevice) != hipSuccess)
                FAIL("hipMemcpy H2D %zu at +%zu", n, off);
        memset(buf, 0xa5, n);
        if (hipMemcpy(buf, dev, n, hipMemcpyDeviceToHost) != hipSuccess)
                FAIL("hipMemcpy D2H %zu at +%zu", n, off);
        edge_check("copy");
        size_t i = first_diff(buf, pattern(seed), n);
        if (i < n)
                FAIL("%zu bytes at +%zu: byte %zu is 0x%02x, not 0x%02x", n, off, i, buf[i],
                     pattern(seed)[i]);
        free(blk);
}

/* @n bytes at @p registered, written by the GPU through a copy, read back by the GPU, unregistered. */
static void register_round(const char *what, uint8_t *p, size_t n, void *dev, uint64_t seed)
{
        void *dp = NULL;
        size_t i;

        memcpy(p, pattern(seed), n);
        if (hipHostRegister(p, n, hipHostRegisterDefault) != hipSuccess) {
                FAIL("%s: hipHostRegister of %zu bytes", what, n);
                return;
        }
        if (hipHostGetDevicePointer(&dp, p, 0) != hipSuccess)
                FAIL("%s: hipHostGetDevicePointer", what);
        /* what the CPU wrote the GPU reads ... */
        if (hipMemcpy(dev, p, n, hipMemcpyHostToDevice) != hipSuccess)
                FAIL("%s: copy out", what);
        memset(p, 0x5a, n);
        /* ... and what the GPU writes the CPU reads, while registered and after */
        if (hipMemcpy(p, dev, n, hipMemcpyDeviceToHost) != hipSuccess)
                FAIL("%s: copy in", what);
        if ((i = first_diff(p, pattern(seed), n)) < n)
                FAIL("%s: registered byte %zu of %zu is 0x%02x", what, i, n, p[i]);
        if (hipHostUnregister(p) != hipSuccess)
                FAIL("%s: hipHostUnregister", what);
        if ((i = first_diff(p, pattern(seed), n)) < n)
                FAIL("%s: byte %zu of %zu changed by the unregistration", what, i, n);
}

static struct {
        uint64_t before;
        uint8_t buf[3 * 4096 + 123];
        uint64_t after;
} bss;

static void stack_round(void *dev, uint64_t seed)
{
        /* the array shares its pages with this frame and the ones the registration calls into */
        struct {
                uint64_t before;
                uint8_t buf[2 * 4096 + 77];
                uint64_t after;
        } st;

        edge_start(&st.before, &st.after);
        register_round("stack", st.buf, sizeof(st.buf), dev, seed);
        edge_check("stack");
}

static sigjmp_buf caught_at;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
        (void)sig, (void)si, (void)uc;
        siglongjmp(caught_at, 1);
}

/*
 * The program's own SIGSEGV handler, set after the runtime started (and after registrations made the
 * KFD layer install one of its own), is the one its faults reach, and reads back as the program's.
 */
static void own_handler(void)
{
        struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO}, back, before;
        volatile char *nowhere;

        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGSEGV, NULL, &before) < 0 || sigaction(SIGSEGV, &sa, NULL) < 0 ||
            sigaction(SIGSEGV, NULL, &back) < 0 || back.sa_sigaction != on_fault) {
                FAIL("sigaction does not read back the program's handler");
                return;
        }
        nowhere = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (nowhere == MAP_FAILED)
                return;
        if (sigsetjmp(caught_at, 1) == 0) {
                nowhere[0] = 1;
                FAIL("a write to a PROT_NONE page did not fault");
        }
        munmap((void *)nowhere, 4096);
        (void)sigaction(SIGSEGV, &before, NULL);
}

int main(int argc, char **argv)
{
        size_t rounds = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
        uint64_t s = 12345;
        pthread_t th[4];
        void *dev = NULL;

        ref = malloc(MAX_SIZE + 4096);
        if (!ref)
                return 1;
        for (size_t i = 0; i < MAX_SIZE + 4096; i += 8) {
                uint64_t v = rng(&s);
                memcpy(ref + i, &v, 8);
        }
        if (hipSetDevice(0) != hipSuccess || hipMalloc(&dev, MAX_SIZE) != hipSuccess) {
                fprintf(stderr, "hip-heap: HIP has no device\n");
                return 1;
        }
        for (uintptr_t i = 0; i < 3; i++)
                pthread_create(&th[i], NULL, churn, (void *)(i + 1));
        pthread_create(&th[3], NULL, edge_writer, NULL);

        /* sizes from 1 byte to 64 MiB, log-uniform, and every offset in a page over the rounds; the two
         * ends of the range in the first rounds */
        for (size_t r = 0; r < rounds && !failures; r++) {
                size_t n = r == 0 ? 1 : r == 1 ? MAX_SIZE : (size_t)1 << (rng(&s) % 26);
                if (r > 1)
                        n += rng(&s) % n;
                if (n > MAX_SIZE)
                        n = MAX_SIZE;
                copy_round(dev, n, r % 4096 == 0 ? 0 : (r * 4093) % 4096, rng(&s));
                if (r % 50 == 0) {
                        size_t hn = 1 + rng(&s) % (4 * MiB);
                        uint8_t *h = malloc(hn + 16), *hp = h + 1 + rng(&s) % 15;
                        edge_start((volatile uint64_t *)&bss.before, (volatile uint64_t *)&bss.after);
                        register_round("bss", bss.buf, sizeof(bss.buf), dev, rng(&s));
                        edge_check("bss");
                        register_round("heap", hp, hn, dev, rng(&s));
                        free(h);
                        stack_round(dev, rng(&s));
                }
        }
        stop = true;
        for (int i = 0; i < 4; i++)
                pthread_join(th[i], NULL);
        own_handler();
        hipFree(dev);
        if (failures) {
                fprintf(stderr, "hip-heap: %d failure(s)\n", failures);
                return 1;
        }
        printf("hip-heap: %zu rounds, no byte wrong\n", rounds);
        return 0;
}
