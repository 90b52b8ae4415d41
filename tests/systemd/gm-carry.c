/* Clients holding every kind of memory a restart carries, checked before and after, for the tests under the
 * real service manager (test_pid1.py). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpumem-client.h"

/*
 * gm-carry SOCKET N GPU_ID
 * Opens N connections; connection i holds host memory, device memory the CPU sees and device memory it does
 * not, managed memory with SVM attributes, a VMM reservation with a mapping (its handle released) and access
 * granted, GTT host memory, an import of connection i+1's device memory mapped in a reservation, and a named
 * share "carry/i" that connection i+1 opens read-write; every byte written with a pattern of its own.
 * Prints "ready" and then reads commands, one a line:
 *   watch   ping every connection in turn from a thread, timing each call, until the next command
 *   check   everything as before: ids, handles, kinds, sizes, bytes, charges; prints "ok STALL_US PINGS" or
 *           one "bad ..." line per difference and "failed N"
 *   quota   the class's charges, one "quota RESOURCE USED" a line
 * EOF closes everything.
 */

#define OBJS 8
#define SZ   (64u << 10)

typedef struct Held {
        void *ptr;
        size_t size;
        gm_handle handle;
        int kind;
        unsigned char pattern;
        bool cpu; /* the bytes are read through @ptr (else through an export of the handle) */
} Held;

typedef struct Conn {
        gm_client *c;
        uint64_t id;
        Held held[OBJS];
        size_t n;
        void *res, *imp_res, *share_at;
        gm_handle vmm, imp;
        int export_fd; /* of the device-only memory, for the next connection to import */
} Conn;

static Conn *conns;
static int n_conns;
static uint32_t gpu;
static size_t gran;
static atomic_bool watching;
static uint64_t stall_us, pings, ping_errors;

static uint64_t now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int fail(const char *what, int i, int r)
{
        fprintf(stderr, "gm-carry: connection %d: %s: %s\n", i, what, strerror(-r));
        return r;
}

static void hold(Conn *k, void *p, size_t size, int kind, unsigned char pattern, bool cpu)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};

        if (cpu)
                memset(p, pattern, size);
        (void)gm_pointer_get_attributes(k->c, p, &pa);
        k->held[k->n++] = (Held){p, size, pa.handle, pa.kind, pattern, cpu};
}

/* The first and last byte of @h as the daemon's memory has them (an export of the handle, mapped). */
static int bytes_of(Conn *k, const Held *h, unsigned char *first, unsigned char *last)
{
        unsigned char *m;
        size_t got = 0;
        int fd = -1, r;

        if (h->cpu) {
                *first = ((unsigned char *)h->ptr)[0];
                *last = ((unsigned char *)h->ptr)[h->size - 1];
                return 0;
        }
        r = gm_mem_export(k->c, h->handle, &fd, &got);
        if (r < 0)
                return r;
        m = mmap(NULL, h->size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
                return -errno;
        *first = m[0];
        *last = m[h->size - 1];
        munmap(m, h->size);
        return 0;
}

static int setup_one(int i)
{
        Conn *k = &conns[i];
        gm_access_desc rw[2] = {{gpu, GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
        gm_svm_attr attrs[] = {{GM_SVM_ATTR_PREFERRED_LOC, gpu}, {GM_SVM_ATTR_ACCESS, gpu}};
        unsigned char base = (unsigned char)(i * 8 + 1);
        char name[64];
        void *p = NULL;
        size_t got = 0;
        int r;

        snprintf(name, sizeof(name), "carry-%d", i);
        r = gm_client_connect(NULL, name, &k->c); /* $GPUMEM_SOCKET */
        if (r < 0)
                return fail("connect", i, r);
        k->id = gm_client_id(k->c);
        if ((r = gm_host_malloc(k->c, SZ, gpu, -1, 0, &p)) < 0)
                return fail("host", i, r);
        hold(k, p, SZ, GM_KIND_HOST, base, true);
        if ((r = gm_malloc(k->c, SZ, gpu, GM_MEM_HOST_VISIBLE, &p)) < 0)
                return fail("device (visible)", i, r);
        hold(k, p, SZ, GM_KIND_DEVICE, base + 1, true);
        if ((r = gm_malloc(k->c, SZ, gpu, 0, &p)) < 0)
                return fail("device", i, r);
        hold(k, p, SZ, GM_KIND_DEVICE, base + 2, false);
        /* the device-only memory written through an export, which the next connection also imports */
        {
                unsigned char *m;
                if ((r = gm_mem_export(k->c, k->held[2].handle, &k->export_fd, &got)) < 0)
                        return fail("export", i, r);
                m = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_SHARED, k->export_fd, 0);
                if (m == MAP_FAILED)
                        return fail("export mmap", i, -errno);
                memset(m, base + 2, SZ);
                munmap(m, SZ);
        }
        if ((r = gm_malloc_managed(k->c, SZ, GM_MEM_COHERENT, &p)) < 0)
                return fail("managed", i, r);
        if ((r = gm_svm_set_attributes(k->c, p, SZ, attrs, 2)) < 0)
                return fail("svm attributes", i, r);
        hold(k, p, SZ, GM_KIND_MANAGED, base + 3, true);
        if ((r = gm_host_malloc(k->c, SZ, gpu, -1, GM_MEM_GTT, &p)) < 0)
                return fail("GTT host", i, r);
        hold(k, p, SZ, GM_KIND_HOST, base + 4, true);
        /* VMM: a reservation, a handle mapped in it with access granted, then released (the mapping holds it)
         */
        if ((r = gm_mem_address_reserve(k->c, 2 * gran, 0, NULL, 0, &k->res)) < 0 ||
            (r = gm_mem_create(k->c, gran, gpu, 0, &k->vmm)) < 0 ||
            (r = gm_mem_map(k->c, k->res, gran, 0, k->vmm)) < 0 ||
            (r = gm_mem_set_access(k->c, k->res, gran, rw, 2)) < 0)
                return fail("VMM", i, r);
        memset(k->res, base + 5, gran);
        if ((r = gm_mem_release(k->c, k->vmm)) < 0)
                return fail("VMM release", i, r);
        {
                gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                (void)gm_pointer_get_attributes(k->c, k->res, &pa);
                k->held[k->n++] = (Held){k->res, gran, pa.handle, pa.kind, base + 5, true};
        }
        /* a named share of the visible device memory, for the next connection */
        snprintf(name, sizeof(name), "carry/%d", i);
        if ((r = gm_share_publish(k->c, k->held[1].handle, name, 0, NULL)) < 0)
                return fail("share publish", i, r);
        return 0;
}

/* Connection i takes connection i-1's export and share (they exist once every connection is set up). */
static int setup_links(int i)
{
        Conn *k = &conns[i], *prev = &conns[(i + n_conns - 1) % n_conns];
        gm_access_desc rw[2] = {{gpu, GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
        char name[64];
        size_t got = 0;
        int r;

        if ((r = gm_mem_import(k->c, prev->export_fd, gpu, &k->imp, &got)) < 0)
                return fail("import", i, r);
        if ((r = gm_mem_address_reserve(k->c, gran, 0, NULL, 0, &k->imp_res)) < 0 ||
            (r = gm_mem_map(k->c, k->imp_res, SZ, 0, k->imp)) < 0 ||
            (r = gm_mem_set_access(k->c, k->imp_res, SZ, rw, 2)) < 0)
                return fail("import mapping", i, r);
        snprintf(name, sizeof(name), "carry/%d", (i + n_conns - 1) % n_conns);
        if ((r = gm_share_open(k->c, name, GM_SHARE_WRITE, NULL, 0, &k->share_at, NULL, NULL)) < 0)
                return fail("share open", i, r);
        return 0;
}

static void *pinger(void *arg)
{
        (void)arg;
        for (int i = 0; atomic_load(&watching); i = (i + 1) % n_conns) {
                uint64_t t0 = now_us(), dt;
                int r = gm_ping(conns[i].c);
                dt = now_us() - t0;
                if (dt > stall_us)
                        stall_us = dt;
                pings++;
                ping_errors += r != 0;
        }
        return NULL;
}

static int check_all(void)
{
        int bad = 0;

        for (int i = 0; i < n_conns; i++) {
                Conn *k = &conns[i], *prev = &conns[(i + n_conns - 1) % n_conns];
                int r = gm_ping(k->c);
                if (r < 0) {
                        printf("bad %d ping %s (%d)\n", i, strerror(-r), r);
                        bad++;
                        continue;
                }
                if (gm_client_id(k->c) != k->id) {
                        printf("bad %d id %" PRIu64 " was %" PRIu64 "\n", i, gm_client_id(k->c), k->id);
                        bad++;
                }
                for (size_t j = 0; j < k->n; j++) {
                        const Held *h = &k->held[j];
                        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
                        unsigned char a = 0, z = 0;
                        r = gm_pointer_get_attributes(k->c, h->ptr, &pa);
                        if (r < 0 || pa.handle != h->handle || pa.kind != h->kind) {
                                printf("bad %d object %zu: %s handle %" PRIu64 " kind %d, was %" PRIu64
                                       " %d\n",
                                       i, j, strerror(-r), (uint64_t)pa.handle, pa.kind, (uint64_t)h->handle,
                                       h->kind);
                                bad++;
                                continue;
                        }
                        r = bytes_of(k, h, &a, &z);
                        if (r < 0 || a != h->pattern || z != h->pattern) {
                                printf("bad %d object %zu bytes %02x..%02x want %02x (%s)\n", i, j, a, z,
                                       h->pattern, strerror(-r));
                                bad++;
                        }
                }
                /* the import and the share read the previous connection's memory */
                if (((unsigned char *)k->imp_res)[SZ - 1] != prev->held[2].pattern ||
                    ((unsigned char *)k->share_at)[0] != prev->held[1].pattern) {
                        printf("bad %d import or share bytes\n", i);
                        bad++;
                }
        }
        if (bad)
                printf("failed %d\n", bad);
        else
                printf("ok %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", stall_us, pings, ping_errors);
        fflush(stdout);
        return bad;
}

static void print_quota(void)
{
        gm_quota *q = NULL;
        size_t n = 0;
        uint64_t used[8] = {0};

        if (gm_quota_get(conns[0].c, &q, &n) < 0) {
                printf("quota-failed\n");
                fflush(stdout);
                return;
        }
        for (size_t i = 0; i < n; i++)
                if (q[i].resource > 0 && q[i].resource < 8 && q[i].gpu_id == 0)
                        used[q[i].resource] = q[i].used;
        gm_quota_free(q, n);
        for (int r = 1; r < 8; r++)
                printf("quota %d %" PRIu64 "\n", r, used[r]);
        printf("quota-end\n");
        fflush(stdout);
}

int main(int argc, char **argv)
{
        pthread_t th;
        bool thread_on = false;
        char line[64];

        if (argc != 4) {
                fprintf(stderr, "usage: gm-carry SOCKET N GPU_ID\n");
                return 2;
        }
        setenv("GPUMEM_SOCKET", argv[1], 1);
        n_conns = atoi(argv[2]);
        gpu = (uint32_t)strtoul(argv[3], NULL, 0);
        conns = calloc((size_t)(n_conns > 0 ? n_conns : 1), sizeof(*conns));
        if (!conns || n_conns < 2)
                return 2;
        for (int i = 0; i < n_conns; i++) {
                if (i == 0) {
                        gm_client *c = NULL;
                        int r = gm_client_connect(NULL, "granularity", &c);
                        if (r == 0)
                                r = gm_mem_get_allocation_granularity(c, gpu, 0, &gran);
                        if (r < 0 || gran == 0) {
                                fprintf(stderr, "gm-carry: the VMM granularity: %s\n", strerror(-r));
                                return 1;
                        }
                        /* a whole number of granules, at least SZ */
                        gran = (SZ + gran - 1) / gran * gran;
                        gm_client_close(c);
                }
                if (setup_one(i) < 0)
                        return 1;
        }
        for (int i = 0; i < n_conns; i++)
                if (setup_links(i) < 0)
                        return 1;
        printf("ready\n");
        fflush(stdout);
        while (fgets(line, sizeof(line), stdin)) {
                if (thread_on) {
                        atomic_store(&watching, false);
                        pthread_join(th, NULL);
                        thread_on = false;
                }
                if (strncmp(line, "watch", 5) == 0) {
                        stall_us = pings = ping_errors = 0;
                        atomic_store(&watching, true);
                        thread_on = pthread_create(&th, NULL, pinger, NULL) == 0;
                        printf("watching\n");
                        fflush(stdout);
                } else if (strncmp(line, "check", 5) == 0) {
                        (void)check_all();
                } else if (strncmp(line, "quota", 5) == 0) {
                        print_quota();
                }
        }
        for (int i = 0; i < n_conns; i++)
                gm_client_close(conns[i].c);
        free(conns);
        return 0;
}
