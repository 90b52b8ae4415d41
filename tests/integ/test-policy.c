/* Policy integration tests: classes by uid, shared quotas, GPUs and operations, admin plane, reload. */
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
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"

#define MiB       (1ull << 20)
#define UID_ALPHA 65534
#define UID_BETA  65533
#define UID_GAMMA 65532

static Daemon dmn;
static uint32_t g0, g1;
static gm_status base;

static char policy_text[4096];

static void write_policy(unsigned alpha_vram_mib)
{
        snprintf(policy_text, sizeof(policy_text),
                 "[daemon]\nlog-level = warning\n\n"
                 "[class admins]\nmatch-uid = 0\nadmin = yes\n\n"
                 "[class alpha]\nmatch-uid = %u\nvram = %uM\nvram.%u = 6M\nhost = 4M\nmanaged = 4M\n"
                 "handles = 6\nfds = 4\nconnections = 3\n\n"
                 "[class beta]\nmatch-uid = %u\ngpus = %u\ndeny-ops = svm import\nvram = 64M\n\n"
                 "[class gamma]\nmatch-uid = %u\ninflight = 1\n",
                 UID_ALPHA, alpha_vram_mib, g0, UID_BETA, g0, UID_GAMMA);
        CHECK_EQ(daemon_write_config(&dmn, policy_text), 0);
}

static int reload(void)
{
        /* a reload is done when the daemon has read it: wait for its next answer after the signal */
        kill(dmn.pid, SIGHUP);
        usleep(200000);
        return 0;
}

static bool reason_has(gm_client *c, int err, const char *needle)
{
        char buf[512];
        gm_strerror(c, err, buf, sizeof(buf));
        if (!strstr(buf, needle)) {
                fprintf(stderr, "reason '%s' lacks '%s'\n", buf, needle);
                return false;
        }
        return true;
}

/* ---- quota usage, as administrators see it ---- */

static uint64_t class_used(const char *cls, int resource, uint32_t gpu)
{
        uint64_t used;

        CHECK_RC(daemon_class_quota(&dmn, cls, resource, gpu, &used, NULL), 0);
        return used;
}

static void wait_class_idle(const char *cls)
{
        for (int i = 0; i < 250 && class_used(cls, GM_RESOURCE_HANDLES, 0) != 0; i++)
                usleep(20000);
        CHECK_EQ(class_used(cls, GM_RESOURCE_HANDLES, 0), 0);
        CHECK_EQ(class_used(cls, GM_RESOURCE_VRAM, 0), 0);
        CHECK_EQ(class_used(cls, GM_RESOURCE_HOST, 0), 0);
        CHECK_EQ(class_used(cls, GM_RESOURCE_MANAGED, 0), 0);
        CHECK_EQ(class_used(cls, GM_RESOURCE_FDS, 0), 0);
}

/* The broker's ledger equals the KFD model's own accounting. */
static void check_ledger_matches_model(const char *when)
{
        gm_client *c = daemon_client(&dmn, "admin");
        gm_status *s = NULL;

        if (!c)
                return;
        CHECK_EQ(gm_admin_status(c, &s), 0);
        if (s) {
                uint64_t vram = s->model_vram_bytes - base.model_vram_bytes;
                uint64_t sys = s->model_system_bytes - base.model_system_bytes;
                if (vram != s->bytes_device || sys != s->bytes_host + s->bytes_managed)
                        fprintf(stderr,
                                "%s: ledger device %llu host %llu managed %llu; model vram %llu system "
                                "%llu\n",
                                when, (unsigned long long)s->bytes_device, (unsigned long long)s->bytes_host,
                                (unsigned long long)s->bytes_managed, (unsigned long long)vram,
                                (unsigned long long)sys);
                CHECK_EQ(vram, s->bytes_device);
                CHECK_EQ(sys, s->bytes_host + s->bytes_managed);
        }
        gm_status_free(s);
        gm_client_close(c);
}

/* ---- scenarios --------------------------------------------------------------------------------------- */

static int alpha_shared(void *arg)
{
        gm_client *a = NULL, *b = NULL;
        void *p1 = NULL, *p2 = NULL, *p3 = NULL;
        size_t fr = 0, tot = 0;
        int r;

        REQUIRE(gm_client_connect(dmn.sock, "alpha-1", &a) == 0);
        REQUIRE(gm_client_connect(dmn.sock, "alpha-2", &b) == 0);
        REQUIRE(gm_malloc(a, 6 * MiB, g0, 0, &p1) == 0);
        r = gm_malloc(b, 4 * MiB, g1, 0, &p2); /* 6 + 4 > the class's 8 MiB, though b holds nothing */
        REQUIRE(r == -EDQUOT);
        REQUIRE(reason_has(b, r, "class 'alpha' VRAM limit"));
        REQUIRE(gm_malloc(b, 2 * MiB, g1, 0, &p2) == 0);
        r = gm_malloc(a, 2 * MiB, g0, 0, &p3); /* the class's 6 MiB on g0 are used */
        REQUIRE(r == -EDQUOT);
        REQUIRE(reason_has(a, r, "on GPU"));
        /* what the clients see: their allowance, not the device */
        REQUIRE(gm_mem_get_info(b, g0, &fr, &tot) == 0);
        REQUIRE(tot == 6 * MiB && fr == 0);
        REQUIRE(gm_mem_get_info(b, g1, &fr, &tot) == 0);
        REQUIRE(tot == 8 * MiB && fr == 0);
        /* the admin plane is closed to this class */
        gm_status *s = NULL;
        REQUIRE(gm_admin_status(a, &s) == -EACCES);
        /* hold until the parent has looked */
        char ch;
        REQUIRE(read(*(int *)arg, &ch, 1) == 1);
        REQUIRE(gm_mem_free(a, p1) == 0);
        REQUIRE(gm_mem_free(b, p2) == 0);
        gm_client_close(a);
        gm_client_close(b);
        return 0;
}

static int beta_big(void *arg)
{
        gm_client *c = NULL;
        void *p = NULL;
        REQUIRE(gm_client_connect(dmn.sock, "beta", &c) == 0);
        REQUIRE(gm_malloc(c, 32 * MiB, g0, 0, &p) == 0); /* another class: alpha's limits do not apply */
        REQUIRE(gm_mem_free(c, p) == 0);
        gm_client_close(c);
        return 0;
}

static void test_shared_quota(void)
{
        int sync;
        pid_t pid = fork_as_synced(UID_ALPHA, alpha_shared, &sync);

        for (int i = 0; i < 250 && class_used("alpha", GM_RESOURCE_VRAM, 0) != 8 * MiB; i++)
                usleep(20000);
        CHECK_EQ(class_used("alpha", GM_RESOURCE_VRAM, 0), 8 * MiB);
        CHECK_EQ(class_used("alpha", GM_RESOURCE_VRAM, g0), 6 * MiB);
        CHECK_EQ(class_used("alpha", GM_RESOURCE_VRAM, g1), 2 * MiB);
        CHECK_EQ(class_used("alpha", GM_RESOURCE_CONNECTIONS, 0), 2);
        check_ledger_matches_model("two alpha clients");
        CHECK_EQ(run_as(UID_BETA, beta_big, NULL), 0);
        (void)!write(sync, "x", 1);
        CHECK_EQ(child_end(pid, sync), 0);
        wait_class_idle("alpha");
        wait_class_idle("beta");
}

static int alpha_paths(void *arg)
{
        gm_client *c = NULL, *c2 = NULL;
        void *d = NULL, *h = NULL, *h2 = NULL, *m = NULL, *m2 = NULL, *res = NULL;
        gm_handle vh = 0, ih = 0, x;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int fd = -1, r;

        REQUIRE(gm_client_connect(dmn.sock, "alpha-paths", &c) == 0);
        REQUIRE(gm_malloc(c, 2 * MiB, g0, GM_MEM_HOST_VISIBLE, &d) == 0);
        REQUIRE(gm_host_malloc(c, 3 * MiB, g0, -1, 0, &h) == 0);
        r = gm_host_malloc(c, 2 * MiB, g0, -1, 0, &h2); /* 3 + 2 > 4 MiB */
        REQUIRE(r == -EDQUOT && reason_has(c, r, "host memory"));
        REQUIRE(gm_malloc_managed(c, 3 * MiB, 0, &m) == 0);
        r = gm_malloc_managed(c, 2 * MiB, 0, &m2);
        REQUIRE(r == -EDQUOT && reason_has(c, r, "managed memory"));
        /* device (the model's memory file), host and managed memory hold an fd each in the daemon: 4 */
        REQUIRE(gm_host_malloc(c, 4096, g0, -1, 0, &h2) == 0);
        r = gm_malloc_managed(c, 4096, 0, &m2);
        REQUIRE(r == -EDQUOT && reason_has(c, r, "fd limit"));
        REQUIRE(gm_mem_free(c, h2) == 0);
        /* a VMM handle holds no fd until its first export (or grant): then the model's memory file is one */
        REQUIRE(gm_mem_create(c, 2 * MiB, g1, 0, &vh) == 0);
        REQUIRE(gm_host_malloc(c, 4096, g0, -1, 0, &h2) == 0);
        {
                int vfd = -1;

                r = gm_mem_export(c, vh, &vfd, NULL);
                REQUIRE(r == -EDQUOT && reason_has(c, r, "fd limit"));
                REQUIRE(gm_mem_free(c, h2) == 0);
                REQUIRE(gm_mem_export(c, vh, &vfd, NULL) == 0);
                if (vfd >= 0)
                        close(vfd);
        }
        REQUIRE(gm_mem_address_reserve(c, 2 * MiB, 0, NULL, 0, &res) == 0);
        REQUIRE(gm_pointer_get_attributes(c, d, &pa) == 0);
        REQUIRE(gm_mem_export(c, pa.handle, &fd, NULL) == 0);
        REQUIRE(gm_mem_import(c, fd, g1, &ih, NULL) == 0); /* handle 6 of 6 */
        r = gm_mem_import(c, fd, g1, &x, NULL);
        REQUIRE(r == -EDQUOT && reason_has(c, r, "handle limit"));
        r = gm_mem_create(c, 6 * MiB, g1, 0, &x); /* over the VRAM total too, but handles come first */
        REQUIRE(r == -EDQUOT);
        /* a third connection is fine, a fourth is not */
        REQUIRE(gm_client_connect(dmn.sock, "alpha-2", &c2) == 0);
        gm_client *c3 = NULL, *c4 = NULL;
        REQUIRE(gm_client_connect(dmn.sock, "alpha-3", &c3) == 0);
        r = gm_client_connect(dmn.sock, "alpha-4", &c4);
        if (r != -EUSERS)
                fprintf(stderr, "fourth alpha connection: %d\n", r);
        REQUIRE(r == -EUSERS);
        gm_client_close(c3);
        gm_client_close(c2);
        close(fd);
        char ch;
        REQUIRE(write(*(int *)arg, "r", 1) == 1); /* tell the parent everything is held */
        REQUIRE(read(*(int *)arg, &ch, 1) == 1);
        REQUIRE(gm_mem_release(c, ih) == 0);
        REQUIRE(gm_mem_release(c, vh) == 0);
        REQUIRE(gm_mem_address_free(c, res, 2 * MiB) == 0);
        REQUIRE(gm_mem_free(c, d) == 0);
        REQUIRE(gm_mem_free(c, h) == 0);
        REQUIRE(gm_mem_free(c, m) == 0);
        gm_client_close(c);
        return 0;
}

static void test_every_path(void)
{
        int sync;
        char ch;
        pid_t pid = fork_as_synced(UID_ALPHA, alpha_paths, &sync);

        if (read(sync, &ch, 1) == 1) {
                CHECK_EQ(class_used("alpha", GM_RESOURCE_VRAM, 0), 4 * MiB); /* device + VMM */
                CHECK_EQ(class_used("alpha", GM_RESOURCE_VRAM, g1), 2 * MiB);
                CHECK_EQ(class_used("alpha", GM_RESOURCE_HOST, 0), 3 * MiB); /* the 4 KiB one was freed */
                CHECK_EQ(class_used("alpha", GM_RESOURCE_MANAGED, 0), 3 * MiB);
                CHECK_EQ(class_used("alpha", GM_RESOURCE_HANDLES, 0), 6);
                CHECK_EQ(class_used("alpha", GM_RESOURCE_FDS, 0),
                         4); /* device, host, managed, VMM exported */
                check_ledger_matches_model("every path");
                (void)!write(sync, "k", 1);
        }
        CHECK_EQ(child_end(pid, sync), 0);
        wait_class_idle("alpha");
        check_ledger_matches_model("every path, freed");
}

static int beta_limits(void *arg)
{
        gm_client *c = NULL;
        void *p = NULL, *h = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        size_t fr, tot;
        gm_handle x;
        int r, fd;

        REQUIRE(gm_client_connect(dmn.sock, "beta", &c) == 0);
        r = gm_malloc(c, MiB, g1, 0, &p);
        REQUIRE(r == -EACCES && reason_has(c, r, "may not use GPU"));
        REQUIRE(gm_mem_get_info(c, g1, &fr, &tot) == 0 && tot == 0 && fr == 0);
        REQUIRE(gm_host_malloc(c, MiB, 0, -1, 0, &h) == 0);
        REQUIRE(gm_pointer_get_attributes(c, h, &pa) == 0);
        REQUIRE(pa.n_mapped_gpus == 1 && pa.mapped_gpus[0] == g0); /* only where the class may go */
        REQUIRE(gm_malloc(c, MiB, g0, 0, &p) == 0);
        REQUIRE(gm_mem_map_gpus(c, p, &g1, 1) == -EACCES);
        r = gm_svm_set_attributes(c, h, MiB, &(gm_svm_attr){GM_SVM_ATTR_GRANULARITY, 2}, 1);
        REQUIRE(r == -EACCES && reason_has(c, r, "class 'beta' may not call svm_set_attr"));
        REQUIRE(gm_pointer_get_attributes(c, p, &pa) == 0);
        REQUIRE(gm_mem_export(c, pa.handle, &fd, NULL) == 0);
        r = gm_mem_import(c, fd, g0, &x, NULL);
        REQUIRE(r == -EACCES && reason_has(c, r, "may not call dmabuf_import"));
        close(fd);
        REQUIRE(gm_mem_free(c, p) == 0);
        REQUIRE(gm_mem_free(c, h) == 0);
        gm_client_close(c);
        return 0;
}

/* A tenant reads its own class's limits and usage (the quota op), not another class's and not the admin view.
 */
static int alpha_own_quota(void *arg)
{
        gm_client *c = NULL;
        gm_quota *q = NULL;
        size_t n = 0, seen = 0;
        void *p = NULL;

        (void)arg;
        REQUIRE(gm_client_connect(dmn.sock, "alpha-quota", &c) == 0);
        REQUIRE(gm_malloc(c, 2 * MiB, g0, 0, &p) == 0);
        REQUIRE(gm_quota_get(c, &q, &n) == 0);
        for (size_t i = 0; i < n; i++) {
                REQUIRE(strcmp(q[i].class_name, "alpha") == 0);
                if (q[i].resource == GM_RESOURCE_VRAM && q[i].gpu_id == 0)
                        seen += q[i].limit == 8 * MiB && q[i].used == 2 * MiB;
                if (q[i].resource == GM_RESOURCE_VRAM && q[i].gpu_id == g0)
                        seen += q[i].limit == 6 * MiB && q[i].used == 2 * MiB;
                if (q[i].resource == GM_RESOURCE_HANDLES)
                        seen += q[i].limit == 6 && q[i].used == 1;
                if (q[i].resource == GM_RESOURCE_HOST)
                        seen += q[i].limit == 4 * MiB && q[i].used == 0;
        }
        REQUIRE(seen == 4);
        gm_quota_free(q, n);
        REQUIRE(gm_admin_quota_get(c, "alpha", &q, &n) == -EACCES);
        REQUIRE(gm_quota_get(c, NULL, &n) == -EINVAL);
        REQUIRE(gm_mem_free(c, p) == 0);
        gm_client_close(c);
        return 0;
}

static void test_own_quota(void)
{
        CHECK_EQ(run_as(UID_ALPHA, alpha_own_quota, NULL), 0);
        wait_class_idle("alpha");
}

static void test_gpus_and_ops(void)
{
        CHECK_EQ(run_as(UID_BETA, beta_limits, NULL), 0);
        wait_class_idle("beta");
}

static int alpha_hold(void *arg)
{
        gm_client *c = NULL;
        void *p = NULL;
        char ch;
        int fdw = ((int *)arg)[0];

        REQUIRE(gm_client_connect(dmn.sock, "alpha-hold", &c) == 0);
        REQUIRE(gm_malloc(c, 2 * MiB, g0, 0, &p) == 0);
        REQUIRE(gm_malloc(c, 2 * MiB, g1, 0, &p) == 0);
        REQUIRE(write(fdw, "h", 1) == 1);
        REQUIRE(read(fdw, &ch, 1) == 1);
        /* the administrator lowered the limit below what the class holds */
        int r = gm_malloc(c, 4096, g1, 0, &p);
        REQUIRE(r == -EDQUOT);
        gm_client_close(c);
        return 0;
}

static void test_admin_plane(void)
{
        gm_client *adm = daemon_client(&dmn, "admin");
        gm_alloc_info *list = NULL;
        size_t n = 0;
        uint64_t cursor = 0;
        int sync;
        char ch;
        pid_t pid;

        if (!adm)
                return;
        pid = fork_as_synced(UID_ALPHA, alpha_hold, &sync);
        CHECK_EQ(read(sync, &ch, 1), 1);

        /* clients: identity, class, usage */
        gm_client_info *infos = NULL;
        size_t ni = 0;
        uint64_t alpha_id = 0;
        CHECK_EQ(gm_admin_clients(adm, &infos, &ni), 0);
        for (size_t i = 0; i < ni; i++)
                if (infos[i].uid == UID_ALPHA) {
                        alpha_id = infos[i].client_id;
                        CHECK(strcmp(infos[i].class_name, "alpha") == 0);
                        CHECK_EQ(infos[i].handles, 2);
                        CHECK_EQ(infos[i].n_usage, 2);
                }
        gm_client_info_free(infos, ni);
        CHECK(alpha_id != 0);

        /* allocations, filtered and paged */
        CHECK_EQ(gm_admin_allocations(adm, alpha_id, 1, &cursor, &list, &n), 0);
        CHECK_EQ(n, 1);
        CHECK(cursor != 0);
        if (n == 1) {
                CHECK_EQ(list[0].client_id, alpha_id);
                CHECK_EQ(list[0].size, 2 * MiB);
                CHECK_EQ(list[0].kind, GM_KIND_DEVICE);
                CHECK_EQ(list[0].n_mapped_gpus, 1);
        }
        gm_alloc_info_free(list, n);
        CHECK_EQ(gm_admin_allocations(adm, alpha_id, 1, &cursor, &list, &n), 0);
        CHECK_EQ(n, 1);
        gm_alloc_info_free(list, n);
        CHECK_EQ(gm_admin_allocations(adm, alpha_id, 1, &cursor, &list, &n), 0);
        CHECK_EQ(n, 0);
        CHECK_EQ(cursor, 0);
        gm_alloc_info_free(list, n);
        cursor = 0;
        CHECK_EQ(gm_admin_allocations(adm, 0, 0, &cursor, &list, &n), 0);
        CHECK_EQ(n, 2);
        gm_alloc_info_free(list, n);
        CHECK_EQ(gm_admin_allocations(adm, 999999, 0, &cursor, &list, &n), -ESRCH);

        /* quota show and set: refused below usage unless forced */
        CHECK_EQ(gm_admin_quota_set(adm, "alpha", GM_RESOURCE_VRAM, 0, 3 * MiB, false), -EBUSY);
        CHECK_EQ(gm_admin_quota_set(adm, "alpha", GM_RESOURCE_VRAM, 0, 3 * MiB, true), 0);
        CHECK_EQ(gm_admin_quota_set(adm, "nosuch", GM_RESOURCE_VRAM, 0, 3 * MiB, true), -ENOENT);
        CHECK_EQ(gm_admin_quota_set(adm, "alpha", GM_RESOURCE_HOST, g0, MiB, true), -EINVAL);
        CHECK_EQ(gm_admin_quota_set(adm, "alpha", GM_RESOURCE_VRAM, 4242, MiB, true), -ENODEV);
        {
                gm_quota *q = NULL;
                size_t nq = 0;
                bool seen = false;
                CHECK_EQ(gm_admin_quota_get(adm, "alpha", &q, &nq), 0);
                for (size_t i = 0; i < nq; i++)
                        if (q[i].resource == GM_RESOURCE_VRAM && q[i].gpu_id == 0) {
                                CHECK_EQ(q[i].limit, 3 * MiB);
                                CHECK_EQ(q[i].used, 4 * MiB);
                                seen = true;
                        }
                CHECK(seen);
                gm_quota_free(q, nq);
                CHECK_EQ(gm_admin_quota_get(adm, "nosuch", &q, &nq), -ENOENT);
        }
        (void)!write(sync, "k", 1);
        CHECK_EQ(child_end(pid, sync), 0);
        CHECK_EQ(gm_admin_quota_set(adm, "alpha", GM_RESOURCE_VRAM, 0, 8 * MiB, false), 0);
        gm_client_close(adm);
        wait_class_idle("alpha");
}

static int alpha_big(void *arg)
{
        gm_client *c = NULL;
        void *p = NULL;
        int want = *(int *)arg;
        REQUIRE(gm_client_connect(dmn.sock, "alpha-big", &c) == 0);
        int r = gm_malloc(c, 12 * MiB, g1, 0, &p);
        REQUIRE(r == want);
        gm_client_close(c);
        return 0;
}

static void test_reload(void)
{
        int want = -EDQUOT;

        CHECK_EQ(run_as(UID_ALPHA, alpha_big, &want), 0);
        /* a bad file is refused whole: not even its good lines apply */
        CHECK_EQ(daemon_write_config(&dmn, "[class alpha]\nmatch-uid = 65534\nvram = 64M\nvram = lots\n"), 0);
        reload();
        CHECK_EQ(run_as(UID_ALPHA, alpha_big, &want), 0);
        /* a good one applies */
        write_policy(16);
        reload();
        want = 0;
        CHECK_EQ(run_as(UID_ALPHA, alpha_big, &want), 0);
        write_policy(8);
        reload();
        wait_class_idle("alpha");
}

/* Random sequences of every kind of operation, in clients of two classes, some killed part-way. */
static unsigned random_seed; /* the next random client's, set before it is forked */

static int random_client(void *arg)
{
        unsigned seed = random_seed;
        gm_client *c = NULL;
        void *ptrs[16] = {0};
        gm_handle handles[16] = {0};

        REQUIRE(gm_client_connect(dmn.sock, "random", &c) == 0);
        for (int step = 0; step < 200; step++) {
                int i = rand_r(&seed) % 16;
                size_t size = (size_t)(1 + rand_r(&seed) % 4) * MiB / 2;
                switch (rand_r(&seed) % 6) {
                case 0:
                        if (!ptrs[i])
                                (void)gm_malloc(c, size, rand_r(&seed) % 2 ? g0 : g1, 0, &ptrs[i]);
                        break;
                case 1:
                        if (!ptrs[i])
                                (void)gm_host_malloc(c, size, 0, -1, 0, &ptrs[i]);
                        break;
                case 2:
                        if (!ptrs[i])
                                (void)gm_malloc_managed(c, size, 0, &ptrs[i]);
                        break;
                case 3:
                        if (!handles[i])
                                (void)gm_mem_create(c, 2 * MiB, g0, 0, &handles[i]);
                        break;
                case 4:
                        if (ptrs[i] && gm_mem_free(c, ptrs[i]) == 0)
                                ptrs[i] = NULL;
                        break;
                case 5:
                        if (handles[i] && gm_mem_release(c, handles[i]) == 0)
                                handles[i] = 0;
                        break;
                }
        }
        /* hold everything until killed or told to go */
        char ch;
        REQUIRE(write(*(int *)arg, "r", 1) == 1);
        REQUIRE(read(*(int *)arg, &ch, 1) >= 0);
        gm_client_close(c);
        return 0;
}

static void test_random_and_kills(void)
{
        pid_t pids[6];
        int socks[6];

        for (int i = 0; i < 6; i++) {
                random_seed = 1000 + (unsigned)i;
                pids[i] = fork_as_synced(i % 2 ? UID_ALPHA : UID_BETA, random_client, &socks[i]);
                CHECK(pids[i] > 0);
        }
        for (int i = 0; i < 6; i++) {
                char ch;
                CHECK_EQ(read(socks[i], &ch, 1), 1);
        }
        /* everybody holds a random mix: the ledger must equal the model's accounting */
        check_ledger_matches_model("random sequences");
        for (int i = 0; i < 6; i++) {
                if (i % 3 == 0)
                        kill(pids[i], SIGKILL);
                else
                        (void)!write(socks[i], "k", 1);
                waitpid(pids[i], NULL, 0);
                close(socks[i]);
        }
        wait_class_idle("alpha");
        wait_class_idle("beta");
        check_ledger_matches_model("after kills");
}

/* A class limited to one request in flight per connection: a flood stalls its own connection only. */
static int gamma_flood(void *arg)
{
        int fd = raw_connect(dmn.sock);
        uint8_t frame[64];
        uint8_t body[] = {0x12, 0x00}; /* Request.ping {} */
        int sent = 0;

        REQUIRE(fd >= 0);
        REQUIRE(raw_hello(fd) == 0);
        gm_frame_hdr_encode(frame, 1, 7, sizeof(body), 0);
        memcpy(frame + GM_FRAME_HDR_SIZE, body, sizeof(body));
        /* blocking sends with a timeout: keep the daemon answering until its replies to us back up */
        struct timeval tv = {0, 300000};
        REQUIRE(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0);
        for (int i = 0; i < 100000; i++) {
                if (send(fd, frame, GM_FRAME_HDR_SIZE + sizeof(body), MSG_NOSIGNAL) < 0)
                        break;
                sent++;
        }
        REQUIRE(sent > 10);
        REQUIRE(write(*(int *)arg, "f", 1) == 1);
        char ch;
        REQUIRE(read(*(int *)arg, &ch, 1) >= 0);
        close(fd);
        return 0;
}

static int beta_ping(void *arg)
{
        gm_client *c = NULL;
        REQUIRE(gm_client_connect(dmn.sock, "beta-ping", &c) == 0);
        for (int i = 0; i < 50; i++)
                REQUIRE(gm_ping(c) == 0);
        gm_client_close(c);
        return 0;
}

static int gamma_ping(void *arg)
{
        alarm(10);
        return beta_ping(arg);
}

static void test_inflight(void)
{
        int sync;
        char ch;
        pid_t pid = fork_as_synced(UID_GAMMA, gamma_flood, &sync);

        CHECK_EQ(read(sync, &ch, 1), 1);
        CHECK_EQ(run_as(UID_BETA, beta_ping, NULL), 0); /* other classes are served meanwhile */
        /* another client of the flooding class is served too: the limit holds the flooding connection
         * back, never a connection that reads its replies, nor a new connection's hello */
        CHECK_EQ(run_as(UID_GAMMA, gamma_ping, NULL), 0);
        (void)!write(sync, "k", 1); /* the flood ends */
        CHECK(child_end(pid, sync) >= 0);
        gm_client *adm = daemon_client(&dmn, "admin");
        char *text = NULL;
        if (adm && gm_admin_metrics(adm, &text) == 0) {
                CHECK_STR_CONTAINS(text, "gpumemd_denials_total{reason=\"inflight\"}");
                CHECK(!strstr(text, "gpumemd_denials_total{reason=\"inflight\"} 0\n"));
                CHECK_STR_CONTAINS(text, "gpumemd_class_vram_bytes{class=\"alpha\"}");
                CHECK_STR_CONTAINS(text, "gpumemd_operation_duration_seconds_bucket{op=\"alloc\"");
                CHECK_STR_CONTAINS(text, "gpumemd_operations_total{op=\"alloc\",result=\"EDQUOT\"}");
                gm_free(text);
        }
        gm_client_close(adm);
}

int main(void)
{
        static const TestCase cases[] = {
                {"two clients of one class share its quota, another class is unaffected", test_shared_quota},
                {"every memory path is charged and refunded", test_every_path},
                {"GPUs and operations a class may use", test_gpus_and_ops},
                {"a tenant reads its own class's limits and usage", test_own_quota},
                {"admin plane: clients, allocations, quota show and set", test_admin_plane},
                {"SIGHUP reload: a bad file changes nothing", test_reload},
                {"ledger equals the model after random sequences and kills", test_random_and_kills},
                {"in-flight cap: a flooding connection stalls only itself", test_inflight},
        };
        gm_client *c;
        gm_topology *t = NULL;
        gm_status *s = NULL;
        int r;

        signal(SIGPIPE, SIG_IGN);
        if (daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, NULL, 0) < 0)
                return EXIT_FAILURE;
        chmod(dmn.dir, 0755);
        chmod(dmn.sock, 0666);
        c = daemon_client(&dmn, "admin");
        if (!c || gm_topology_get(c, false, &t) < 0 || gm_admin_status(c, &s) < 0) {
                daemon_cleanup(&dmn);
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < t->n_nodes; i++)
                if (t->nodes[i].is_gpu) {
                        if (!g0)
                                g0 = t->nodes[i].gpu_id;
                        else if (!g1)
                                g1 = t->nodes[i].gpu_id;
                }
        base = *s;
        base.server_version = base.backend = base.preset = NULL;
        gm_status_free(s);
        gm_topology_free(t);
        gm_client_close(c);
        /* the policy names GPU ids, so it is written once the topology is known, and loaded by SIGHUP */
        write_policy(8);
        reload();
        r = run_tests(cases, ARRAY_SIZE(cases));
        return daemon_finish(&dmn, r);
}
