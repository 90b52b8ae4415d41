/* Policy: [class NAME] sections of the config file (parsed with inih, every error with its line), matching.
 */
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <grp.h>
#include <ini.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/util.h"

static const char *const resource_names[_POLICY_RES_MAX] = {
        [POLICY_RES_VRAM] = "vram",         [POLICY_RES_HOST] = "host",
        [POLICY_RES_MANAGED] = "managed",   [POLICY_RES_HANDLES] = "handles",
        [POLICY_RES_FDS] = "fds",           [POLICY_RES_CONNECTIONS] = "connections",
        [POLICY_RES_INFLIGHT] = "inflight", [POLICY_RES_WINDOWS] = "windows",
        [POLICY_RES_QUEUES] = "queues",     [POLICY_RES_MAPPINGS] = "mappings",
        [POLICY_RES_SHARES] = "shares",
};

static const struct {
        const char *name;
        unsigned bit;
} op_families[] = {
        {"device", POLICY_OP_DEVICE}, {"host", POLICY_OP_HOST}, {"managed", POLICY_OP_MANAGED},
        {"vmm", POLICY_OP_VMM},       {"svm", POLICY_OP_SVM},   {"export", POLICY_OP_EXPORT},
        {"import", POLICY_OP_IMPORT},
};

const char *policy_resource_name(PolicyResource r)
{
        return r < _POLICY_RES_MAX ? resource_names[r] : "unknown";
}

int policy_resource_from_name(const char *s)
{
        for (int i = 0; i < _POLICY_RES_MAX; i++)
                if (strcmp(s, resource_names[i]) == 0)
                        return i;
        return -EINVAL;
}

static void class_init(PolicyClass *c)
{
        memset(c, 0, sizeof(*c));
        for (int i = 0; i < _POLICY_RES_MAX; i++)
                c->limit[i] = POLICY_UNLIMITED;
        /* a bound even without a configuration: replies a client leaves unread cost the daemon memory */
        c->limit[POLICY_RES_INFLIGHT] = POLICY_DEFAULT_INFLIGHT;
        c->limit[POLICY_RES_SHARES] = POLICY_DEFAULT_SHARES;
        c->import_foreign = true;
        c->foreign_imports = c->foreign_import_max = c->host_alloc_max = POLICY_UNLIMITED;
}

static void class_done(PolicyClass *c)
{
        free(c->name);
        for (size_t i = 0; i < c->n_cgroups; i++)
                free(c->cgroups[i]);
        free(c->cgroups);
        free(c->uids);
        free(c->gids);
        for (int r = 0; r < _POLICY_SHARE_MAX; r++) {
                for (size_t i = 0; i < c->n_share[r]; i++)
                        free(c->share[r][i]);
                free(c->share[r]);
        }
}

Policy *policy_free(Policy *p)
{
        if (!p)
                return NULL;
        for (size_t i = 0; i < p->n_classes; i++)
                class_done(&p->classes[i]);
        free(p->classes);
        free(p);
        return NULL;
}

int policy_new_default(Policy **ret)
{
        Policy *p = calloc(1, sizeof(*p));

        if (!p)
                return -ENOMEM;
        p->classes = calloc(1, sizeof(*p->classes));
        if (!p->classes) {
                free(p);
                return -ENOMEM;
        }
        class_init(&p->classes[0]);
        p->classes[0].name = strdup("default");
        p->classes[0].match_all = true;
        p->n_classes = 1;
        if (!p->classes[0].name)
                return policy_free(p), -ENOMEM;
        *ret = p;
        return 0;
}

/* ---- parsing ----------------------------------------------------------------------------------------- */

typedef struct Parse {
        ConfigReader in;
        Policy *p;
        PolicyClass *cur; /* the class whose section we are in */
} Parse;

/* "class NAME" → NAME, or NULL when the section is not a class. */
static const char *class_name_of(const char *section)
{
        if (strncmp(section, "class", 5) != 0 || !isspace((unsigned char)section[5]))
                return NULL;
        section += 5;
        while (isspace((unsigned char)*section))
                section++;
        return section;
}

static bool valid_name(const char *s)
{
        if (!*s || strlen(s) > 64)
                return false;
        for (; *s; s++)
                if (!isalnum((unsigned char)*s) && *s != '-' && *s != '_' && *s != '.')
                        return false;
        return true;
}

static PolicyClass *begin_class(Parse *ps, const char *name)
{
        PolicyClass *n;

        for (size_t i = 0; i < ps->p->n_classes; i++)
                if (strcmp(ps->p->classes[i].name, name) == 0) {
                        config_error(&ps->in, "class '%s' is defined twice (first at line %u)", name,
                                     ps->p->classes[i].line);
                        return NULL;
                }
        n = realloc(ps->p->classes, (ps->p->n_classes + 1) * sizeof(*n));
        if (!n)
                return NULL;
        ps->p->classes = n;
        n = &ps->p->classes[ps->p->n_classes];
        class_init(n);
        n->name = strdup(name);
        if (!n->name)
                return NULL;
        n->line = ps->in.line;
        ps->p->n_classes++;
        return n;
}

static int parse_limit(const char *v, bool bytes, uint64_t *ret)
{
        if (strcasecmp(v, "unlimited") == 0 || strcasecmp(v, "infinity") == 0) {
                *ret = POLICY_UNLIMITED;
                return 0;
        }
        /* N% of the node's memory as the file is read (a reload reads it again) */
        return bytes ? parse_size_or_percent(v, ret) : parse_uint(v, UINT32_MAX, ret);
}

/* Split a space/comma separated list; calls @fn for each item. */
static void each_item(Parse *ps, const char *key, const char *v,
                      void (*fn)(Parse *, const char *, const char *))
{
        char buf[1024];
        char *save = NULL;

        if (strlen(v) >= sizeof(buf)) {
                config_error(&ps->in, "%s: list too long", key);
                return;
        }
        strcpy(buf, v);
        for (char *t = strtok_r(buf, " \t,", &save); t; t = strtok_r(NULL, " \t,", &save))
                fn(ps, key, t);
}

/* A copy of @v at the end of the list @strv of @n (nothing added when out of memory). */
static void strv_add(char ***strv, size_t *n, const char *v)
{
        char **l = realloc(*strv, (*n + 1) * sizeof(*l));

        if (!l)
                return;
        *strv = l;
        l[*n] = strdup(v);
        if (l[*n])
                (*n)++;
}

/* A user (or with @group, a group), by number or by name, at the end of the list @ids of @n. */
static void add_id(Parse *ps, const char *key, const char *t, bool group, uint32_t **ids, size_t *n)
{
        uint64_t v;
        uint32_t id, *l;

        if (parse_uint(t, UINT32_MAX - 1, &v) == 0) {
                id = (uint32_t)v;
        } else {
                struct group *g = group ? getgrnam(t) : NULL;
                struct passwd *pw = group ? NULL : getpwnam(t);
                if (!g && !pw) {
                        config_error(&ps->in, "%s: no %s named '%s'", key, group ? "group" : "user", t);
                        return;
                }
                id = g ? g->gr_gid : pw->pw_uid;
        }
        l = realloc(*ids, (*n + 1) * sizeof(*l));
        if (!l)
                return;
        *ids = l;
        l[(*n)++] = id;
}

static void add_uid(Parse *ps, const char *key, const char *t)
{
        add_id(ps, key, t, false, &ps->cur->uids, &ps->cur->n_uids);
}

static void add_gid(Parse *ps, const char *key, const char *t)
{
        add_id(ps, key, t, true, &ps->cur->gids, &ps->cur->n_gids);
}

static void add_gpu(Parse *ps, const char *key, const char *t)
{
        PolicyClass *c = ps->cur;
        uint64_t v;

        if (parse_uint(t, 0xffff, &v) < 0 || v == 0) {
                config_error(&ps->in, "%s: '%s' is not a GPU id (see gpumemctl topology)", key, t);
                return;
        }
        if (c->n_gpus == POLICY_MAX_GPUS) {
                config_error(&ps->in, "%s: more than %d GPUs", key, POLICY_MAX_GPUS);
                return;
        }
        c->gpus[c->n_gpus++] = (uint32_t)v;
}

static void add_denied(Parse *ps, const char *key, const char *t)
{
        for (size_t i = 0; i < ARRAY_SIZE(op_families); i++)
                if (strcmp(t, op_families[i].name) == 0) {
                        ps->cur->deny_ops |= op_families[i].bit;
                        return;
                }
        config_error(&ps->in,
                     "%s: unknown operation family '%s' (device, host, managed, vmm, svm, export, import)",
                     key, t);
}

static const char *const share_keys[_POLICY_SHARE_MAX] = {
        [POLICY_SHARE_PUBLISH] = "share-publish",
        [POLICY_SHARE_READ] = "share-read",
        [POLICY_SHARE_WRITE] = "share-write",
        [POLICY_SHARE_PERSISTENT] = "share-persistent",
};

static bool share_char(char ch)
{
        return isalnum((unsigned char)ch) || ch == '.' || ch == '_' || ch == '-' || ch == '/';
}

bool policy_share_name_valid(const char *name)
{
        size_t len = name ? strlen(name) : 0;
        const char *part = name;

        if (len == 0 || len > POLICY_SHARE_NAME_MAX)
                return false;
        for (const char *p = name;; p++) {
                if (*p == '/' || *p == '\0') {
                        size_t n = (size_t)(p - part);
                        if (n == 0 || (n == 1 && part[0] == '.') ||
                            (n == 2 && part[0] == '.' && part[1] == '.'))
                                return false;
                        if (*p == '\0')
                                return true;
                        part = p + 1;
                } else if (!share_char(*p)) {
                        return false;
                }
        }
}

bool policy_share_allows(const PolicyClass *c, PolicyShareRight right, const char *name)
{
        if (!c || right >= _POLICY_SHARE_MAX || !policy_share_name_valid(name))
                return false;
        for (size_t i = 0; i < c->n_share[right]; i++)
                if (fnmatch(c->share[right][i], name, FNM_PATHNAME) == 0)
                        return true;
        /* read-write implies read-only */
        return right == POLICY_SHARE_READ && policy_share_allows(c, POLICY_SHARE_WRITE, name);
}

/* A name pattern: the characters of a name and fnmatch's "*?[]!". */
static void add_share_pattern(Parse *ps, const char *key, const char *t)
{
        PolicyClass *c = ps->cur;
        int right = -1;

        for (int r = 0; r < _POLICY_SHARE_MAX; r++)
                if (strcmp(key, share_keys[r]) == 0)
                        right = r;
        if (right < 0)
                return;
        if (strlen(t) > POLICY_SHARE_NAME_MAX) {
                config_error(&ps->in, "%s: pattern '%.20s...' is longer than %d characters", key, t,
                             POLICY_SHARE_NAME_MAX);
                return;
        }
        for (const char *p = t; *p; p++)
                if (!share_char(*p) && !strchr("*?[]!", *p)) {
                        config_error(
                                &ps->in,
                                "%s: '%s' holds '%c': a name pattern has letters, digits, \"._-/\" and *?[]!",
                                key, t, *p);
                        return;
                }
        strv_add(&c->share[right], &c->n_share[right], t);
}

/* A limit: a size (@bytes) or a number, or "unlimited". False after saying why it is none. */
static bool read_limit(Parse *ps, const char *key, const char *v, bool bytes, uint64_t *ret)
{
        if (parse_limit(v, bytes, ret) == 0)
                return true;
        config_error(&ps->in, "%s: '%s' is not %s or 'unlimited'", key, v,
                     bytes ? "a size (like 8G, or 50% of the node's memory)" : "a number");
        return false;
}

/* A setting of [class NAME] with a name of its own: how it is read, and into which field. */
typedef struct ClassKey {
        const char *key;
        void (*read)(Parse *ps, const struct ClassKey *k, const char *v);
        size_t offset;                                           /* the PolicyClass field */
        void (*item)(Parse *ps, const char *key, const char *t); /* a list's item */
} ClassKey;

static void read_yes_no(Parse *ps, const ClassKey *k, const char *v)
{
        bool b;

        if (parse_bool(v, &b) < 0)
                config_error(&ps->in, "%s: '%s' is not yes or no", k->key, v);
        else
                *(bool *)((char *)ps->cur + k->offset) = b;
}

static void read_size_limit(Parse *ps, const ClassKey *k, const char *v)
{
        uint64_t lim;

        if (read_limit(ps, k->key, v, true, &lim))
                *(uint64_t *)((char *)ps->cur + k->offset) = lim;
}

static void read_cgroup(Parse *ps, const ClassKey *k, const char *v)
{
        if (v[0] != '/')
                config_error(&ps->in, "%s: '%s' is not an absolute cgroup path pattern", k->key, v);
        else
                strv_add(&ps->cur->cgroups, &ps->cur->n_cgroups, v);
}

static void read_list(Parse *ps, const ClassKey *k, const char *v)
{
        each_item(ps, k->key, v, k->item);
}

#define CLASS_FIELD(f) .offset = offsetof(PolicyClass, f)

static const ClassKey class_keys[] = {
        {"match-all", read_yes_no, CLASS_FIELD(match_all)},
        {"admin", read_yes_no, CLASS_FIELD(admin)},
        {"import-foreign", read_yes_no, CLASS_FIELD(import_foreign)},
        {"shared-gpu-context", read_yes_no, CLASS_FIELD(shared_gpu_context)},
        {"foreign-imports", read_size_limit, CLASS_FIELD(foreign_imports)},
        {"foreign-import-max", read_size_limit, CLASS_FIELD(foreign_import_max)},
        {"host-alloc-max", read_size_limit, CLASS_FIELD(host_alloc_max)},
        {"match-cgroup", read_cgroup},
        {"match-uid", read_list, .item = add_uid},
        {"match-gid", read_list, .item = add_gid},
        {"gpus", read_list, .item = add_gpu},
        {"deny-ops", read_list, .item = add_denied},
};

/* vram.ID: the VRAM limit on one GPU. */
static void read_gpu_vram(Parse *ps, const char *key, const char *v)
{
        PolicyClass *c = ps->cur;
        uint64_t id, lim;

        if (parse_uint(key + 5, 0xffff, &id) < 0 || id == 0) {
                config_error(&ps->in, "%s: '%s' is not a GPU id", key, key + 5);
                return;
        }
        if (!read_limit(ps, key, v, true, &lim))
                return;
        for (size_t i = 0; i < c->n_vram_gpu; i++)
                if (c->vram_gpu_ids[i] == id) {
                        config_error(&ps->in, "%s is given twice", key);
                        return;
                }
        if (c->n_vram_gpu == POLICY_MAX_GPUS) {
                config_error(&ps->in, "%s: more than %d per-GPU limits", key, POLICY_MAX_GPUS);
                return;
        }
        c->vram_gpu_ids[c->n_vram_gpu] = (uint32_t)id;
        c->vram_gpu_limit[c->n_vram_gpu++] = lim;
}

/* A resource's name (vram, handles, ...): the class's limit on it. */
static void read_resource_limit(Parse *ps, PolicyResource r, const char *key, const char *v)
{
        uint64_t lim;

        if (!read_limit(ps, key, v, r == POLICY_RES_VRAM || r == POLICY_RES_HOST || r == POLICY_RES_MANAGED,
                        &lim))
                return;
        if (r == POLICY_RES_INFLIGHT && lim == 0) {
                config_error(&ps->in, "inflight: must be at least 1 (a class with none could never be read)");
                return;
        }
        if (r == POLICY_RES_SHARES && lim > POLICY_MAX_SHARES) {
                config_error(&ps->in, "shares: at most %d, half the daemon's table of shares",
                             POLICY_MAX_SHARES);
                return;
        }
        ps->cur->limit[r] = lim;
}

static void class_key(Parse *ps, const char *key, const char *v)
{
        int r;

        for (size_t i = 0; i < ARRAY_SIZE(class_keys); i++)
                if (strcmp(key, class_keys[i].key) == 0) {
                        class_keys[i].read(ps, &class_keys[i], v);
                        return;
                }
        for (size_t i = 0; i < ARRAY_SIZE(share_keys); i++)
                if (strcmp(key, share_keys[i]) == 0) {
                        each_item(ps, key, v, add_share_pattern);
                        return;
                }
        if (strncmp(key, "vram.", 5) == 0)
                read_gpu_vram(ps, key, v);
        else if ((r = policy_resource_from_name(key)) >= 0)
                read_resource_limit(ps, (PolicyResource)r, key, v);
        else
                config_error(&ps->in, "unknown setting '%s' in [class %s]", key, ps->cur->name);
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
        Parse *ps = user;

        /* [daemon] and unknown sections are the options parser's; a bad class header was reported */
        if (!class_name_of(section) || !ps->cur || !name)
                return 1;
        class_key(ps, name, value);
        return 1;
}

/* Class headers are found by the reader too, so empty classes exist and keep their line. */
static char *class_reader(char *str, int num, void *stream)
{
        Parse *ps = stream;
        char *s = config_reader_gets(&ps->in, str, num);
        const char *name, *cls;
        size_t len;
        char sec[128];

        if (!s || !config_line_section(s, &name, &len) || len >= sizeof(sec))
                return s;
        memcpy(sec, name, len);
        sec[len] = '\0';
        cls = class_name_of(sec);
        ps->cur = NULL;
        if (cls) {
                if (!valid_name(cls))
                        config_error(&ps->in, "class name '%s' must be 1-64 letters, digits, '-', '_' or '.'",
                                     cls);
                else
                        ps->cur = begin_class(ps, cls);
        }
        return s;
}

static void check_classes(Parse *ps)
{
        for (size_t i = 0; i < ps->p->n_classes; i++) {
                PolicyClass *c = &ps->p->classes[i];
                ps->in.line = c->line;
                if (!c->match_all && !c->n_cgroups && !c->n_uids && !c->n_gids)
                        config_error(&ps->in,
                                     "class '%s' matches nobody: give match-all, match-cgroup, match-uid or "
                                     "match-gid",
                                     c->name);
                for (size_t k = 0; k < c->n_vram_gpu; k++)
                        if (c->n_gpus) {
                                bool allowed = false;
                                for (size_t g = 0; g < c->n_gpus; g++)
                                        allowed |= c->gpus[g] == c->vram_gpu_ids[k];
                                if (!allowed)
                                        config_error(&ps->in,
                                                     "class '%s' limits VRAM on GPU %u, which its gpus list "
                                                     "excludes",
                                                     c->name, c->vram_gpu_ids[k]);
                        }
        }
}

int policy_load(const char *path, bool must_exist, Policy **ret, char *errbuf, size_t errlen)
{
        Parse ps = {0};
        int r;

        r = config_reader_open(&ps.in, path, must_exist, errbuf, errlen);
        if (r < 0)
                return r == -ENOENT && !must_exist ? policy_new_default(ret) : r;
        ps.p = calloc(1, sizeof(*ps.p));
        if (!ps.p) {
                config_reader_close(&ps.in);
                return -ENOMEM;
        }
        r = ini_parse_stream(class_reader, &ps, handler, &ps);
        config_reader_close(&ps.in);
        if (r < 0 && ps.in.n_errors == 0) {
                policy_free(ps.p);
                return -ENOMEM;
        }
        check_classes(&ps);
        if (ps.in.n_errors > 0) {
                policy_free(ps.p);
                return -EINVAL;
        }
        if (ps.p->n_classes == 0) {
                policy_free(ps.p);
                return policy_new_default(ret);
        }
        *ret = ps.p;
        return 0;
}

/* ---- matching ---------------------------------------------------------------------------------------- */

static bool class_matches(const PolicyClass *c, const PolicyIdentity *id)
{
        if (c->match_all)
                return true;
        for (size_t i = 0; i < c->n_uids; i++)
                if (c->uids[i] == id->uid)
                        return true;
        for (size_t i = 0; i < c->n_gids; i++) {
                if (c->gids[i] == id->gid)
                        return true;
                for (size_t k = 0; k < id->n_groups; k++)
                        if (c->gids[i] == id->groups[k])
                                return true;
        }
        for (size_t i = 0; id->cgroup && i < c->n_cgroups; i++)
                if (fnmatch(c->cgroups[i], id->cgroup, 0) == 0)
                        return true;
        return false;
}

const PolicyClass *policy_match(const Policy *p, const PolicyIdentity *id)
{
        for (size_t i = 0; i < p->n_classes; i++)
                if (class_matches(&p->classes[i], id))
                        return &p->classes[i];
        return NULL;
}

const PolicyClass *policy_find(const Policy *p, const char *name)
{
        for (size_t i = 0; i < p->n_classes; i++)
                if (strcmp(p->classes[i].name, name) == 0)
                        return &p->classes[i];
        return NULL;
}

/* ---- containers -------------------------------------------------------------------------------------- */

/* The id after @prefix in a path component, up to @suffix (or the component's end). */
static bool component_id(const char *comp, size_t len, const char *prefix, const char *suffix, char *out,
                         size_t outlen)
{
        size_t pl = strlen(prefix), sl = suffix ? strlen(suffix) : 0;

        if (len <= pl + sl || strncmp(comp, prefix, pl) != 0)
                return false;
        if (suffix && strncmp(comp + len - sl, suffix, sl) != 0)
                return false;
        size_t n = len - pl - sl;
        if (n >= outlen)
                n = outlen - 1;
        memcpy(out, comp + pl, n);
        out[n] = '\0';
        return true;
}

static bool is_hex_id(const char *s)
{
        size_t n = 0;
        for (; s[n]; n++)
                if (!isxdigit((unsigned char)s[n]))
                        return false;
        return n >= 12;
}

void policy_container_of(const char *cgroup, char *container, size_t clen, char *pod, size_t plen)
{
        static const struct {
                const char *prefix, *suffix, *runtime;
        } scopes[] = {
                {"docker-", ".scope", "docker"},
                {"libpod-", ".scope", "podman"},
                {"cri-containerd-", ".scope", "containerd"},
                {"crio-", ".scope", "cri-o"},
        };
        const char *p = cgroup;
        char id[80];

        container[0] = '\0';
        pod[0] = '\0';
        while (p && *p) {
                const char *end;
                size_t len;

                while (*p == '/')
                        p++;
                end = strchr(p, '/');
                len = end ? (size_t)(end - p) : strlen(p);
                for (size_t i = 0; i < ARRAY_SIZE(scopes); i++)
                        if (component_id(p, len, scopes[i].prefix, scopes[i].suffix, id, sizeof(id)) &&
                            is_hex_id(id))
                                snprintf(container, clen, "%s/%.12s", scopes[i].runtime, id);
                /* cgroupfs layouts: /docker/<id>, /kubepods/<qos>/pod<uid>/<id> */
                if (len >= 12 && len < sizeof(id)) {
                        memcpy(id, p, len);
                        id[len] = '\0';
                        if (is_hex_id(id) && !container[0])
                                snprintf(container, clen, "%s/%.12s",
                                         strstr(cgroup, "/docker/") ? "docker" : "container", id);
                }
                /* systemd layout: kubepods-burstable-pod<uid with _>.slice; cgroupfs: pod<uid> */
                /* "pod" at the start of the component or after a '-' (not the one inside "kubepods") */
                const char *podp = NULL;
                for (size_t k = 0; k + 3 <= len; k++)
                        if (!strncmp(p + k, "pod", 3) && (k == 0 || p[k - 1] == '-'))
                                podp = p + k;
                if (podp && strstr(cgroup, "kubepods")) {
                        size_t off = (size_t)(podp - p) + 3;
                        size_t n = len - off;
                        if (n > 6 && !strncmp(p + len - 6, ".slice", 6))
                                n -= 6;
                        if (n >= 32 && n < plen) {
                                memcpy(pod, p + off, n);
                                pod[n] = '\0';
                                for (char *c = pod; *c; c++)
                                        if (*c == '_')
                                                *c = '-';
                        }
                }
                p = end;
        }
}
