/* Unit tests of the policy file: classes, limits, errors with their lines, matching, containers. */
#include <stdint.h>
#include <unistd.h>

#include "../common/check.h"
#include "config/policy.h"

static char tmpdir[] = "/tmp/gpumemd-test-policy-XXXXXX";

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

static void test_parse(void)
{
        const char *path = write_file("good.conf", "[daemon]\n"
                                                   "log-level = info\n"
                                                   "\n"
                                                   "[class batch]\n"
                                                   "match-cgroup = /kubepods.slice/*\n"
                                                   "match-cgroup = /system.slice/docker-*.scope\n"
                                                   "match-uid = 1000, 1001\n"
                                                   "vram = 64G\n"
                                                   "vram.13500 = 16G\n"
                                                   "host = 8G\n"
                                                   "managed = unlimited\n"
                                                   "handles = 4096\n"
                                                   "fds = 256\n"
                                                   "connections = 32\n"
                                                   "inflight = 8\n"
                                                   "windows = 12\n"
                                                   "foreign-imports = 2G\n"
                                                   "foreign-import-max = 512M\n"
                                                   "host-alloc-max = 1G\n"
                                                   "mappings = 5000\n"
                                                   "shares = 2048\n"
                                                   "managed = 10%\n"
                                                   "gpus = 13500 9844\n"
                                                   "deny-ops = svm import\n"
                                                   "import-foreign = no\n"
                                                   "shared-gpu-context = yes\n"
                                                   "\n"
                                                   "[class ops]\n"
                                                   "match-gid = root\n"
                                                   "admin = yes\n"
                                                   "\n"
                                                   "[class default]\n"
                                                   "match-all = yes\n");
        char err[1024] = "";
        Policy *p = NULL;

        CHECK_EQ(policy_load(path, true, &p, err, sizeof(err)), 0);
        if (!p) {
                fprintf(stderr, "%s", err);
                return;
        }
        CHECK_EQ(p->n_classes, 3);
        const PolicyClass *b = policy_find(p, "batch");
        CHECK(b != NULL);
        if (b) {
                CHECK_EQ(b->line, 4);
                CHECK_EQ(b->n_cgroups, 2);
                CHECK_EQ(b->n_uids, 2);
                CHECK_EQ(b->limit[POLICY_RES_VRAM], 64ull << 30);
                CHECK_EQ(b->n_vram_gpu, 1);
                CHECK_EQ(b->vram_gpu_ids[0], 13500);
                CHECK_EQ(b->vram_gpu_limit[0], 16ull << 30);
                CHECK_EQ(b->limit[POLICY_RES_HOST], 8ull << 30);
                /* a share of the node's memory: its pages as sysconf says, a tenth */
                CHECK_EQ(b->limit[POLICY_RES_MANAGED],
                         (uint64_t)sysconf(_SC_PHYS_PAGES) / 100 * 10 * (uint64_t)sysconf(_SC_PAGESIZE));
                CHECK_EQ(b->limit[POLICY_RES_MAPPINGS], 5000);
                CHECK_EQ(b->limit[POLICY_RES_SHARES], 2048);
                CHECK_EQ(b->limit[POLICY_RES_HANDLES], 4096);
                CHECK_EQ(b->limit[POLICY_RES_FDS], 256);
                CHECK_EQ(b->limit[POLICY_RES_CONNECTIONS], 32);
                CHECK_EQ(b->limit[POLICY_RES_INFLIGHT], 8);
                CHECK_EQ(b->limit[POLICY_RES_WINDOWS], 12);
                CHECK_EQ(b->foreign_imports, 2ull << 30);
                CHECK_EQ(b->foreign_import_max, 512ull << 20);
                CHECK_EQ(b->host_alloc_max, 1ull << 30);
                CHECK_EQ(b->n_gpus, 2);
                CHECK_EQ(b->deny_ops, POLICY_OP_SVM | POLICY_OP_IMPORT);
                CHECK(!b->import_foreign);
                CHECK(b->shared_gpu_context);
                CHECK(!b->admin);
        }
        const PolicyClass *o = policy_find(p, "ops");
        CHECK(o && o->admin && o->n_gids == 1);
        /* a class that says nothing of it still bounds the replies a connection may leave unread */
        if (o) {
                CHECK_EQ(o->limit[POLICY_RES_INFLIGHT], POLICY_DEFAULT_INFLIGHT);
                CHECK_EQ(o->host_alloc_max, POLICY_UNLIMITED);
                CHECK(!o->shared_gpu_context); /* isolation unless a class gives it up */
                /* nor fill the daemon's table of named shares */
                CHECK_EQ(o->limit[POLICY_RES_SHARES], POLICY_DEFAULT_SHARES);
                CHECK(o->limit[POLICY_RES_MAPPINGS] ==
                      POLICY_UNLIMITED); /* the daemon makes it half its own */
        }

        /* matching: first class in file order that admits the identity */
        gid_t groups[] = {44};
        PolicyIdentity pod = {
                .uid = 5000, .gid = 5000, .cgroup = "/kubepods.slice/kubepods-besteffort.slice/x"};
        PolicyIdentity dock = {.uid = 5000, .gid = 5000, .cgroup = "/system.slice/docker-abc.scope"};
        PolicyIdentity user = {.uid = 1001, .gid = 100, .cgroup = "/user.slice"};
        PolicyIdentity root = {.uid = 7, .gid = 0, .cgroup = "/"};
        PolicyIdentity other = {.uid = 9, .gid = 9, .groups = groups, .n_groups = 1, .cgroup = "/init.scope"};
        CHECK(policy_match(p, &pod) == b);
        CHECK(policy_match(p, &dock) == b);
        CHECK(policy_match(p, &user) == b);
        CHECK(policy_match(p, &root) == o);
        CHECK(strcmp(policy_match(p, &other)->name, "default") == 0);
        policy_free(p);

        /* without any class the built-in default admits everyone with no limits */
        path = write_file("noclass.conf", "[daemon]\nlog-level = info\n");
        CHECK_EQ(policy_load(path, true, &p, err, sizeof(err)), 0);
        CHECK(p && p->n_classes == 1 && p->classes[0].match_all);
        CHECK(p && p->classes[0].limit[POLICY_RES_VRAM] == POLICY_UNLIMITED);
        policy_free(p);
        /* a class that admits nobody in particular leaves the others unmatched */
        path = write_file("strict.conf", "[class only]\nmatch-uid = 4242\n");
        CHECK_EQ(policy_load(path, true, &p, err, sizeof(err)), 0);
        CHECK(p && policy_match(p, &other) == NULL);
        policy_free(p);
}

static void test_errors(void)
{
        static const struct {
                const char *text;
                const char *want;
        } cases[] = {
                {"[class a]\nmatch-all = yes\nvram = lots\n", ":3: vram: 'lots'"},
                {"[class a]\nmatch-all = yes\nhandles = -1\n", ":3: handles"},
                {"[class a]\nmatch-all = yes\nfrobnicate = 1\n", ":3: unknown setting 'frobnicate'"},
                {"[class a]\nmatch-uid = no-such-user-here\n", ":2: match-uid: no user named"},
                {"[class a]\nmatch-gid = no-such-group-here\n", ":2: match-gid: no group named"},
                {"[class a]\nmatch-cgroup = relative/path\n", ":2: match-cgroup"},
                {"[class a]\nmatch-all = maybe\n", ":2: match-all"},
                {"[class a]\nmatch-all = yes\ndeny-ops = svm teleport\n",
                 ":3: deny-ops: unknown operation family 'teleport'"},
                {"[class a]\nmatch-all = yes\ngpus = 13500 zero\n", ":3: gpus: 'zero'"},
                {"[class a]\nmatch-all = yes\nvram.x = 1G\n", ":3: vram.x"},
                {"[class a]\nmatch-all = yes\nvram.7 = 1G\nvram.7 = 2G\n", ":4: vram.7 is given twice"},
                {"[class a]\nmatch-all = yes\n[class a]\nmatch-all = yes\n",
                 ":3: class 'a' is defined twice"},
                {"[class a b]\nmatch-all = yes\n", ":1: class name 'a b'"},
                {"[class a]\nvram = 1G\n", ":1: class 'a' matches nobody"},
                {"[class a]\nmatch-all = yes\ngpus = 5\nvram.6 = 1G\n", ":1: class 'a' limits VRAM on GPU 6"},
                {"[class a]\nmatch-all = yes\ninflight = 0\n", ":3: inflight: must be at least 1"},
                {"[class a]\nmatch-all = yes\nforeign-imports = lots\n", ":3: foreign-imports: 'lots'"},
                {"[class a]\nmatch-all = yes\nforeign-import-max = -1\n", ":3: foreign-import-max"},
                {"[class a]\nmatch-all = yes\nhost-alloc-max = 4X\n", ":3: host-alloc-max"},
                {"[class a]\nmatch-all = yes\nshares = 2049\n", ":3: shares: at most 2048"},
                {"[class a]\nmatch-all = yes\nshares = unlimited\n", ":3: shares: at most 2048"},
                {"[class a]\nmatch-all = yes\nhost = 0%\n", ":3: host: '0%'"},
                {"[class a]\nmatch-all = yes\nhost = 101%\n", ":3: host: '101%'"},
                {"[class a]\nmatch-all = yes\nmappings = 1G\n", ":3: mappings"},
                {"[class a]\nmatch-all = yes\nshare-publish = weights/$x\n",
                 ":3: share-publish: 'weights/$x' holds '$'"},
                {"[class a]\nmatch-all = yes\nshare-read = a\\b\n", ":3: share-read"},
        };
        char err[2048];
        Policy *p;

        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                const char *path = write_file("bad.conf", cases[i].text);
                p = NULL;
                err[0] = '\0';
                CHECK_EQ(policy_load(path, true, &p, err, sizeof(err)), -EINVAL);
                CHECK(p == NULL);
                CHECK_STR_CONTAINS(err, cases[i].want);
                CHECK_STR_CONTAINS(err, "bad.conf");
        }
        /* each error of a file, each with its line */
        const char *path = write_file("multi.conf",
                                      "[class a]\nmatch-all = yes\nvram = x\nhost = y\n[class b]\nz = 1\n");
        CHECK_EQ(policy_load(path, true, &p, err, sizeof(err)), -EINVAL);
        CHECK_STR_CONTAINS(err, "multi.conf:3:");
        CHECK_STR_CONTAINS(err, "multi.conf:4:");
        CHECK_STR_CONTAINS(err, "multi.conf:6:");
        CHECK_STR_CONTAINS(err, "multi.conf:5: class 'b' matches nobody");
        CHECK_EQ(policy_load("/nonexistent/gpumemd.conf", true, &p, err, sizeof(err)), -ENOENT);
        CHECK_EQ(policy_load("/nonexistent/gpumemd.conf", false, &p, err, sizeof(err)), 0);
        policy_free(p);
}

static void test_containers(void)
{
        static const struct {
                const char *cgroup, *container, *pod;
        } cases[] = {
                {"/system.slice/"
                 "docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope",
                 "docker/0123456789ab", ""},
                {"/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                 "docker/0123456789ab", ""},
                {"/user.slice/user-1000.slice/user@1000.service/user.slice/"
                 "libpod-fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210.scope/container",
                 "podman/fedcba987654", ""},
                {"/kubepods.slice/kubepods-burstable.slice/"
                 "kubepods-burstable-pod8d9e6a1c_6a0f_4c39_9f5e_1a2b3c4d5e6f.slice/"
                 "cri-containerd-aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999.scope",
                 "containerd/aaaabbbbcccc", "8d9e6a1c-6a0f-4c39-9f5e-1a2b3c4d5e6f"},
                {"/kubepods/besteffort/pod8d9e6a1c-6a0f-4c39-9f5e-1a2b3c4d5e6f/"
                 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                 "container/0123456789ab", "8d9e6a1c-6a0f-4c39-9f5e-1a2b3c4d5e6f"},
                {"/kubepods.slice/kubepods-pod11112222_3333_4444_5555_666677778888.slice/"
                 "crio-99998888777766665555444433332222111100009999888877776666555544.scope",
                 "cri-o/999988887777", "11112222-3333-4444-5555-666677778888"},
                {"/user.slice/user-1000.slice/session-3.scope", "", ""},
                {"/", "", ""},
        };
        char c[64], p[64];

        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                policy_container_of(cases[i].cgroup, c, sizeof(c), p, sizeof(p));
                if (strcmp(c, cases[i].container) || strcmp(p, cases[i].pod))
                        fprintf(stderr, "%s -> '%s' '%s'\n", cases[i].cgroup, c, p);
                CHECK(strcmp(c, cases[i].container) == 0);
                CHECK(strcmp(p, cases[i].pod) == 0);
        }
        policy_container_of(NULL, c, sizeof(c), p, sizeof(p));
        CHECK(c[0] == '\0' && p[0] == '\0');
}

static void test_shares(void)
{
        const char *path = write_file("shares.conf", "[class loaders]\n"
                                                     "match-uid = 0\n"
                                                     "share-publish = weights/* scratch/*\n"
                                                     "share-persistent = weights/*\n"
                                                     "[class readers]\n"
                                                     "match-all = yes\n"
                                                     "share-read = weights/*\n"
                                                     "share-write = scratch/team-?\n");
        char err[1024] = "";
        Policy *p = NULL;
        const PolicyClass *l, *r;

        CHECK_EQ(policy_load(path, true, &p, err, sizeof(err)), 0);
        if (!p) {
                fprintf(stderr, "%s", err);
                return;
        }
        l = policy_find(p, "loaders");
        r = policy_find(p, "readers");
        CHECK(l && r);
        if (!l || !r) {
                policy_free(p);
                return;
        }
        CHECK(policy_share_allows(l, POLICY_SHARE_PUBLISH, "weights/llama-70b"));
        CHECK(policy_share_allows(l, POLICY_SHARE_PUBLISH, "scratch/x"));
        CHECK(!policy_share_allows(l, POLICY_SHARE_PUBLISH, "weights/a/b")); /* '*' does not cross '/' */
        CHECK(!policy_share_allows(l, POLICY_SHARE_PUBLISH, "other"));
        CHECK(policy_share_allows(l, POLICY_SHARE_PERSISTENT, "weights/x"));
        CHECK(!policy_share_allows(l, POLICY_SHARE_PERSISTENT, "scratch/x"));
        CHECK(!policy_share_allows(l, POLICY_SHARE_READ, "weights/x")); /* publishing is not reading */
        CHECK(policy_share_allows(r, POLICY_SHARE_READ, "weights/x"));
        CHECK(!policy_share_allows(r, POLICY_SHARE_WRITE, "weights/x"));
        CHECK(policy_share_allows(r, POLICY_SHARE_WRITE, "scratch/team-a"));
        CHECK(policy_share_allows(r, POLICY_SHARE_READ, "scratch/team-a")); /* write implies read */
        CHECK(!policy_share_allows(r, POLICY_SHARE_WRITE, "scratch/team-ab"));
        CHECK(!policy_share_allows(r, POLICY_SHARE_PUBLISH, "weights/x"));
        /* names that can never be shares, whatever the patterns */
        static const char *const bad[] = {"",    "/weights", "weights/", "a//b", "a/../b",
                                          "./a", "a b",      "a\nb",     "é"};
        for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
                CHECK(!policy_share_name_valid(bad[i]));
        char longname[POLICY_SHARE_NAME_MAX + 2];
        memset(longname, 'a', sizeof(longname) - 1);
        longname[sizeof(longname) - 1] = '\0';
        CHECK(!policy_share_name_valid(longname));
        longname[POLICY_SHARE_NAME_MAX] = '\0';
        CHECK(policy_share_name_valid(longname));
        CHECK(policy_share_name_valid("weights/llama-3.1_70b"));
        policy_free(p);
}

int main(void)
{
        static const TestCase cases[] = {
                {"share names and rights", test_shares},
                {"classes, limits and matching", test_parse},
                {"errors name their line", test_errors},
                {"containers from cgroup paths", test_containers},
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
