/* KFD topology parser: a sysfs-layout tree (a directory or a ThunkTopologySource) into ThunkTopology. */
#include "topology.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kfd_sysfs.h>
#include <unistd.h>

#include "macro.h"

#define REL_MAX 128 /* "nodes/255/caches/4095/properties" and friends */

typedef struct Parser {
        const ThunkTopologySource *src;
        char *buf; /* THUNK_TOPOLOGY_MAX_FILE + 1 bytes: the file read last (one file is read at a time) */
        char *err;
        size_t errlen;
} Parser;

/* The directory source of thunk_topology_load(): paths are opened relative to @rootfd. */
typedef struct DirSource {
        int rootfd;
} DirSource;

/* Parsed properties file together with the line each key came from (for error messages). */
typedef struct PropsFile {
        ThunkProps props;
        unsigned *lines;
} PropsFile;

/* A typed member decoded from a key. */
typedef struct Field {
        const char *key;
        size_t offset;
        unsigned width; /* 4 or 8 bytes */
} Field;

#define F32(type, member, key)                                                                               \
        {                                                                                                    \
                key, offsetof(type, member), 4                                                               \
        }
#define F64(type, member, key)                                                                               \
        {                                                                                                    \
                key, offsetof(type, member), 8                                                               \
        }

static const Field node_fields[] = {
        F32(ThunkNode, cpu_cores_count, "cpu_cores_count"),
        F32(ThunkNode, simd_count, "simd_count"),
        F32(ThunkNode, capability, "capability"),
        F32(ThunkNode, vendor_id, "vendor_id"),
        F32(ThunkNode, device_id, "device_id"),
        F32(ThunkNode, location_id, "location_id"),
        F32(ThunkNode, domain, "domain"),
        F32(ThunkNode, drm_render_minor, "drm_render_minor"),
        F64(ThunkNode, hive_id, "hive_id"),
        F64(ThunkNode, local_mem_size, "local_mem_size"),
        F32(ThunkNode, gfx_target_version, "gfx_target_version"),
        F64(ThunkNode, unique_id, "unique_id"),
        F32(ThunkNode, num_xcc, "num_xcc"),
        F32(ThunkNode, max_engine_clk_fcompute, "max_engine_clk_fcompute"),
        F32(ThunkNode, wave_front_size, "wave_front_size"),
        F32(ThunkNode, lds_size_in_kb, "lds_size_in_kb"),
};

static const Field bank_fields[] = {
        F32(ThunkMemBank, heap_type, "heap_type"),
        F64(ThunkMemBank, size_in_bytes, "size_in_bytes"),
        F32(ThunkMemBank, flags, "flags"),
        F32(ThunkMemBank, width, "width"),
        F32(ThunkMemBank, mem_clk_max, "mem_clk_max"),
};

static const Field cache_fields[] = {
        F32(ThunkCache, processor_id_low, "processor_id_low"),
        F32(ThunkCache, level, "level"),
        F32(ThunkCache, size_kib, "size"),
        F32(ThunkCache, cache_line_size, "cache_line_size"),
        F32(ThunkCache, cache_lines_per_tag, "cache_lines_per_tag"),
        F32(ThunkCache, association, "association"),
        F32(ThunkCache, latency, "latency"),
        F32(ThunkCache, type, "type"),
};

static const Field link_fields[] = {
        F32(ThunkIoLink, type, "type"),
        F32(ThunkIoLink, node_from, "node_from"),
        F32(ThunkIoLink, node_to, "node_to"),
        F32(ThunkIoLink, weight, "weight"),
        F32(ThunkIoLink, min_latency, "min_latency"),
        F32(ThunkIoLink, max_latency, "max_latency"),
        F32(ThunkIoLink, min_bandwidth, "min_bandwidth"),
        F32(ThunkIoLink, max_bandwidth, "max_bandwidth"),
        F32(ThunkIoLink, flags, "flags"),
};

static const Field system_fields[] = {
        F64(ThunkTopology, platform_oem, "platform_oem"),
        F64(ThunkTopology, platform_id, "platform_id"),
        F64(ThunkTopology, platform_rev, "platform_rev"),
};

/* Record "file:line: message" (line 0: "file: message") and return @r. */
__attribute__((format(printf, 5, 6))) static int fail(Parser *p, int r, const char *file, unsigned line,
                                                      const char *fmt, ...)
{
        if (!p->err || p->errlen == 0)
                return r;
        int n = line ? snprintf(p->err, p->errlen, "%s:%u: ", file, line)
                     : snprintf(p->err, p->errlen, "%s: ", file);
        if (n >= 0 && (size_t)n < p->errlen) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
                va_end(ap);
        }
        return r;
}

static void props_done(ThunkProps *p)
{
        free(p->items);
        p->items = NULL;
        p->n = 0;
}

static void props_file_done(PropsFile *pf)
{
        props_done(&pf->props);
        free(pf->lines);
        pf->lines = NULL;
}

static int dir_read_file(void *ctx, const char *rel, char *buf, size_t cap, size_t *ret_len,
                         const char **ret_what)
{
        const DirSource *ds = ctx;
        int fd = openat(ds->rootfd, rel, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                *ret_what = "cannot open";
                return -errno;
        }
        size_t len = 0;
        int r = 0;
        /* sysfs files report a fixed st_size, so read until EOF rather than trusting stat. */
        for (;;) {
                char extra; /* a full buffer: one more byte says whether the file is larger */
                ssize_t k = len < cap ? read(fd, buf + len, cap - len) : read(fd, &extra, 1);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        *ret_what = "read failed";
                        r = -errno;
                        break;
                }
                if (k == 0)
                        break;
                if (len == cap) {
                        r = -E2BIG;
                        break;
                }
                len += (size_t)k;
        }
        close(fd);
        if (r == 0)
                *ret_len = len;
        return r;
}

static int dir_list_dir(void *ctx, const char *rel, int (*each)(void *each_ctx, const char *name),
                        void *each_ctx, const char **ret_what)
{
        const DirSource *ds = ctx;
        int fd = openat(ds->rootfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
                *ret_what = "cannot open directory";
                return -errno;
        }
        DIR *d = fdopendir(fd);
        if (!d) {
                int r = -errno;
                close(fd);
                *ret_what = "cannot read directory";
                return r;
        }
        int r = 0;
        struct dirent *de;
        while (r == 0 && (de = readdir(d)))
                r = each(each_ctx, de->d_name);
        closedir(d);
        return r;
}

/*
 * Read @rel (relative to the root) into p->buf, NUL-terminated; the next read_file reuses it. A missing
 * file is -ENOENT without a message, so that the caller can decide whether the file is optional.
 */
static int read_file(Parser *p, const char *rel, char **ret_buf, size_t *ret_len)
{
        const char *what = NULL;
        size_t len = 0;
        int r = p->src->read_file(p->src->ctx, rel, p->buf, THUNK_TOPOLOGY_MAX_FILE, &len, &what);
        if (r > 0)
                r = -EIO; /* not a value the contract allows */
        if (r == -ENOENT)
                return -ENOENT;
        if (r == -E2BIG || (r == 0 && len > THUNK_TOPOLOGY_MAX_FILE))
                return fail(p, -E2BIG, rel, 0, "file larger than %d bytes", THUNK_TOPOLOGY_MAX_FILE);
        if (r < 0)
                return fail(p, r, rel, 0, "%s: %s", what ? what : "cannot read", strerror(-r));
        if (memchr(p->buf, '\0', len))
                return fail(p, -EINVAL, rel, 0, "file contains a NUL byte");
        p->buf[len] = '\0';
        *ret_buf = p->buf;
        *ret_len = len;
        return 0;
}

/* Strict unsigned decimal: digits only, no sign, no overflow. */
static int parse_u64(const char *s, size_t len, uint64_t *ret)
{
        uint64_t v = 0;
        if (len == 0)
                return -EINVAL;
        for (size_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return -EINVAL;
                unsigned d = (unsigned)(s[i] - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -ERANGE;
                v = v * 10 + d;
        }
        *ret = v;
        return 0;
}

/* A comma-separated list of decimals, like a cache's sibling_map. */
static bool is_number_list(const char *s, size_t len)
{
        bool digit = false, comma = false;
        for (size_t i = 0; i < len; i++) {
                if (s[i] >= '0' && s[i] <= '9') {
                        digit = true;
                } else if (s[i] == ',' && digit) {
                        digit = false;
                        comma = true;
                } else {
                        return false;
                }
        }
        return comma && digit;
}

static bool is_blank(char c)
{
        return c == ' ' || c == '\t' || c == '\r';
}

static bool is_key_char(char c)
{
        return isalnum((unsigned char)c) || c == '_';
}

/* Parse "key value" lines; list values (a,b,c) are checked and skipped as they hold no single number. */
static int parse_props(Parser *p, const char *rel, const char *buf, size_t len, PropsFile *out)
{
        PropsFile pf = {0};
        size_t cap = 0;
        unsigned lineno = 0;
        int r = 0;
        const char *pos = buf, *end = buf + len;

        while (pos < end && r == 0) {
                const char *eol = memchr(pos, '\n', (size_t)(end - pos));
                const char *next = eol ? eol + 1 : end;
                if (!eol)
                        eol = end;
                lineno++;
                if ((size_t)(eol - pos) > THUNK_TOPOLOGY_MAX_LINE) {
                        r = fail(p, -E2BIG, rel, lineno, "line longer than %d characters",
                                 THUNK_TOPOLOGY_MAX_LINE);
                        break;
                }
                const char *k = pos, *e = eol;
                while (k < e && is_blank(*k))
                        k++;
                while (e > k && is_blank(e[-1]))
                        e--;
                pos = next;
                if (k == e)
                        continue;

                const char *ke = k;
                while (ke < e && is_key_char(*ke))
                        ke++;
                if (ke == k || (ke < e && !is_blank(*ke))) {
                        r = fail(p, -EINVAL, rel, lineno, "malformed key in '%.*s'",
                                 (int)(e - k > 40 ? 40 : e - k), k);
                        break;
                }
                size_t klen = (size_t)(ke - k);
                if (klen >= THUNK_PROP_KEY_MAX) {
                        r = fail(p, -E2BIG, rel, lineno, "key '%.*s' longer than %d characters", (int)klen, k,
                                 THUNK_PROP_KEY_MAX - 1);
                        break;
                }
                const char *v = ke;
                while (v < e && is_blank(*v))
                        v++;
                if (v == e) {
                        r = fail(p, -EINVAL, rel, lineno, "key '%.*s' has no value", (int)klen, k);
                        break;
                }
                size_t vlen = (size_t)(e - v);
                uint64_t val;
                int q = parse_u64(v, vlen, &val);
                if (q == -EINVAL && is_number_list(v, vlen))
                        continue;
                if (q == -ERANGE) {
                        r = fail(p, -ERANGE, rel, lineno, "value of '%.*s' does not fit in 64 bits",
                                 (int)klen, k);
                        break;
                }
                if (q < 0) {
                        r = fail(p, -EINVAL, rel, lineno, "value '%.*s' of '%.*s' is not a number",
                                 (int)(vlen > 40 ? 40 : vlen), v, (int)klen, k);
                        break;
                }
                for (size_t i = 0; i < pf.props.n; i++) {
                        if (strlen(pf.props.items[i].key) == klen &&
                            memcmp(pf.props.items[i].key, k, klen) == 0) {
                                r = fail(p, -EINVAL, rel, lineno, "key '%.*s' repeats line %u", (int)klen, k,
                                         pf.lines[i]);
                                break;
                        }
                }
                if (r < 0)
                        break;
                if (pf.props.n == THUNK_TOPOLOGY_MAX_PROPS) {
                        r = fail(p, -E2BIG, rel, lineno, "more than %d properties", THUNK_TOPOLOGY_MAX_PROPS);
                        break;
                }
                if (pf.props.n == cap) {
                        size_t ncap = cap ? cap * 2 : 48;
                        ThunkProp *items = realloc(pf.props.items, ncap * sizeof(*items));
                        if (!items) {
                                r = -ENOMEM;
                                break;
                        }
                        pf.props.items = items;
                        unsigned *lines = realloc(pf.lines, ncap * sizeof(*lines));
                        if (!lines) {
                                r = -ENOMEM;
                                break;
                        }
                        pf.lines = lines;
                        cap = ncap;
                }
                ThunkProp *it = &pf.props.items[pf.props.n];
                memcpy(it->key, k, klen);
                it->key[klen] = '\0';
                it->value = val;
                pf.lines[pf.props.n] = lineno;
                pf.props.n++;
        }
        if (r < 0) {
                props_file_done(&pf);
                return r;
        }
        *out = pf;
        return 0;
}

/* read_file() of a file that must be there: a missing one is an error naming it. */
static int read_required(Parser *p, const char *rel, char **buf, size_t *len)
{
        int r = read_file(p, rel, buf, len);

        return r == -ENOENT ? fail(p, r, rel, 0, "missing") : r;
}

/* Read and parse a properties file; a missing file is an error naming it. */
static int load_props(Parser *p, const char *rel, PropsFile *out)
{
        char *buf;
        size_t len;
        int r = read_required(p, rel, &buf, &len);

        return r < 0 ? r : parse_props(p, rel, buf, len, out);
}

static ssize_t find_key(const PropsFile *pf, const char *key)
{
        for (size_t i = 0; i < pf->props.n; i++)
                if (strcmp(pf->props.items[i].key, key) == 0)
                        return (ssize_t)i;
        return -1;
}

/* Fill the typed members of @obj from @pf; absent keys leave them 0. */
static int decode(Parser *p, const char *rel, const PropsFile *pf, const Field *fields, size_t n, void *obj)
{
        for (size_t i = 0; i < n; i++) {
                ssize_t at = find_key(pf, fields[i].key);
                if (at < 0)
                        continue;
                uint64_t v = pf->props.items[at].value;
                char *dst = (char *)obj + fields[i].offset;
                if (fields[i].width == 4) {
                        if (v > UINT32_MAX)
                                return fail(p, -ERANGE, rel, pf->lines[at],
                                            "value %llu of '%s' exceeds 32 bits", (unsigned long long)v,
                                            fields[i].key);
                        uint32_t v32 = (uint32_t)v;
                        memcpy(dst, &v32, sizeof(v32));
                } else {
                        memcpy(dst, &v, sizeof(v));
                }
        }
        return 0;
}

/* Read a file holding one decimal number (trailing whitespace allowed). */
static int load_number(Parser *p, const char *rel, uint64_t *ret)
{
        char *buf;
        size_t len;
        int r = read_required(p, rel, &buf, &len);
        if (r < 0)
                return r;
        size_t s = 0;
        while (s < len && isspace((unsigned char)buf[s]))
                s++;
        while (len > s && isspace((unsigned char)buf[len - 1]))
                len--;
        r = parse_u64(buf + s, len - s, ret);
        if (r == -ERANGE)
                r = fail(p, r, rel, 1, "value does not fit in 64 bits");
        else if (r < 0)
                r = fail(p, r, rel, 1, "'%.*s' is not a number", (int)(len - s > 40 ? 40 : len - s), buf + s);
        return r;
}

/* The node's name file; optional (CPU nodes carry an empty name), one line. */
static int load_name(Parser *p, const char *rel, char name[THUNK_NAME_MAX])
{
        char *buf;
        size_t len;
        int r = read_file(p, rel, &buf, &len);
        if (r == -ENOENT) {
                name[0] = '\0';
                return 0;
        }
        if (r < 0)
                return r;
        while (len > 0 && isspace((unsigned char)buf[len - 1]))
                len--;
        if (memchr(buf, '\n', len))
                r = fail(p, -EINVAL, rel, 2, "name spans more than one line");
        else if (len >= THUNK_NAME_MAX)
                r = fail(p, -E2BIG, rel, 1, "name longer than %d characters", THUNK_NAME_MAX - 1);
        if (r == 0) {
                memcpy(name, buf, len);
                name[len] = '\0';
        }
        return r;
}

/* count_indexed_dir's walk over one directory. */
typedef struct DirCount {
        Parser *p;
        const char *rel;
        size_t cap;
        bool *seen; /* cap flags, allocated at the first numbered entry */
        size_t n;
        int r; /* the parser's own refusal (with its message), returned by count_entry to stop the walk */
} DirCount;

static int count_entry(void *ctx, const char *nm)
{
        DirCount *c = ctx;
        if (c->r < 0)
                return c->r;
        if (nm[0] == '.')
                return 0;
        uint64_t idx;
        size_t l = strlen(nm);
        if (parse_u64(nm, l, &idx) < 0 || (l > 1 && nm[0] == '0'))
                return c->r = fail(c->p, -EINVAL, c->rel, 0,
                                   "unexpected entry '%s' (entries are numbered 0..n-1)", nm);
        if (idx >= c->cap)
                return c->r = fail(c->p, -E2BIG, c->rel, 0, "entry '%s' exceeds the limit of %zu entries", nm,
                                   c->cap);
        if (!c->seen) {
                c->seen = calloc(c->cap, sizeof(*c->seen));
                if (!c->seen)
                        return c->r = -ENOMEM;
        }
        c->seen[idx] = true;
        c->n++;
        return 0;
}

/*
 * Count the entries of directory @rel, which must be named 0..n-1 (dot files are ignored). A missing
 * directory has 0 entries.
 */
static int count_indexed_dir(Parser *p, const char *rel, size_t cap, size_t *ret)
{
        DirCount c = {.p = p, .rel = rel, .cap = cap};
        const char *what = NULL;
        int r = p->src->list_dir(p->src->ctx, rel, count_entry, &c, &what);
        if (r > 0)
                r = -EIO; /* not a value the contract allows */
        if (c.r < 0) {
                r = c.r; /* refused by count_entry, which said why */
        } else if (r == -ENOENT) {
                c.n = 0;
                r = 0;
        } else if (r < 0) {
                r = fail(p, r, rel, 0, "%s: %s", what ? what : "cannot read directory", strerror(-r));
        }
        for (size_t i = 0; r == 0 && i < c.n; i++)
                if (!c.seen[i])
                        r = fail(p, -EINVAL, rel, 0, "entries are not numbered 0..%zu: %zu is missing",
                                 c.n - 1, i);
        free(c.seen);
        if (r == 0)
                *ret = c.n;
        return r;
}

/*
 * Load @dir/<i>/properties for every entry of nodes/<node>/@dir and check the count against the node's
 * @count_key (when the key is present).
 */
static int load_children(Parser *p, unsigned node, const char *dir, const char *count_key,
                         const PropsFile *npf, size_t cap, size_t elem_size, const Field *fields,
                         size_t n_fields, size_t props_offset, void **ret_items, size_t *ret_n)
{
        char rel[REL_MAX], nrel[REL_MAX];
        size_t n;
        int r;

        snprintf(rel, sizeof(rel), "nodes/%u/%s", node, dir);
        snprintf(nrel, sizeof(nrel), "nodes/%u/properties", node);
        r = count_indexed_dir(p, rel, cap, &n);
        if (r < 0)
                return r;
        ssize_t at = find_key(npf, count_key);
        if (at >= 0 && npf->props.items[at].value != n)
                return fail(p, -EINVAL, nrel, npf->lines[at], "%s is %llu but %s/ has %zu entries", count_key,
                            (unsigned long long)npf->props.items[at].value, rel, n);
        if (n == 0) {
                *ret_items = NULL;
                *ret_n = 0;
                return 0;
        }
        char *items = calloc(n, elem_size);
        if (!items)
                return -ENOMEM;
        size_t done = 0;
        for (; done < n; done++) {
                char prel[REL_MAX + 32];
                PropsFile pf;
                snprintf(prel, sizeof(prel), "%s/%u/properties", rel, (unsigned)done);
                r = load_props(p, prel, &pf);
                if (r < 0)
                        break;
                char *obj = items + done * elem_size;
                r = decode(p, prel, &pf, fields, n_fields, obj);
                if (r == 0 && fields == link_fields) {
                        /* Links must name their endpoints; they are checked against the node list later. */
                        if (find_key(&pf, "node_from") < 0 || find_key(&pf, "node_to") < 0)
                                r = fail(p, -EINVAL, prel, 0, "missing node_from or node_to");
                        else if (((ThunkIoLink *)obj)->node_from != node)
                                r = fail(p, -EINVAL, prel, pf.lines[find_key(&pf, "node_from")],
                                         "node_from is %u, not this node %u", ((ThunkIoLink *)obj)->node_from,
                                         node);
                }
                free(pf.lines);
                memcpy(obj + props_offset, &pf.props, sizeof(ThunkProps));
                if (r < 0) {
                        done++; /* its props are attached and freed below */
                        break;
                }
        }
        if (r < 0) {
                for (size_t i = 0; i < done; i++)
                        props_done((ThunkProps *)(items + i * elem_size + props_offset));
                free(items);
                return r;
        }
        *ret_items = items;
        *ret_n = n;
        return 0;
}

static void node_done(ThunkNode *n)
{
        props_done(&n->props);
        for (size_t i = 0; i < n->n_mem_banks; i++)
                props_done(&n->mem_banks[i].props);
        free(n->mem_banks);
        for (size_t i = 0; i < n->n_caches; i++)
                props_done(&n->caches[i].props);
        free(n->caches);
        for (size_t i = 0; i < n->n_io_links; i++)
                props_done(&n->io_links[i].props);
        free(n->io_links);
        for (size_t i = 0; i < n->n_p2p_links; i++)
                props_done(&n->p2p_links[i].props);
        free(n->p2p_links);
}

static int load_node(Parser *p, unsigned idx, ThunkNode *n)
{
        char rel[REL_MAX];
        PropsFile pf = {0};
        uint64_t gpu_id;
        void *items = NULL;
        int r;

        n->node_id = idx;
        n->numa_node = -1;
        snprintf(rel, sizeof(rel), "nodes/%u/gpu_id", idx);
        r = load_number(p, rel, &gpu_id);
        if (r < 0)
                return r;
        if (gpu_id > UINT32_MAX)
                return fail(p, -ERANGE, rel, 1, "gpu_id %llu exceeds 32 bits", (unsigned long long)gpu_id);
        n->gpu_id = (uint32_t)gpu_id;
        snprintf(rel, sizeof(rel), "nodes/%u/name", idx);
        r = load_name(p, rel, n->name);
        if (r < 0)
                return r;

        snprintf(rel, sizeof(rel), "nodes/%u/properties", idx);
        r = load_props(p, rel, &pf);
        if (r < 0)
                return r;
        r = decode(p, rel, &pf, node_fields, ARRAY_SIZE(node_fields), n);
        if (r < 0)
                goto out;
        n->is_gpu = n->simd_count > 0;
        if (n->is_gpu && n->gpu_id == 0) {
                r = fail(p, -EINVAL, rel, pf.lines[find_key(&pf, "simd_count")],
                         "node has %u SIMDs but nodes/%u/gpu_id is 0", n->simd_count, idx);
                goto out;
        }
        if (!n->is_gpu && n->gpu_id != 0) {
                r = fail(p, -EINVAL, rel, 0, "node has no SIMDs but nodes/%u/gpu_id is %u", idx, n->gpu_id);
                goto out;
        }

        r = load_children(p, idx, "mem_banks", "mem_banks_count", &pf, THUNK_TOPOLOGY_MAX_MEM_BANKS,
                          sizeof(ThunkMemBank), bank_fields, ARRAY_SIZE(bank_fields),
                          offsetof(ThunkMemBank, props), &items, &n->n_mem_banks);
        if (r < 0)
                goto out;
        n->mem_banks = items;
        r = load_children(p, idx, "caches", "caches_count", &pf, THUNK_TOPOLOGY_MAX_CACHES,
                          sizeof(ThunkCache), cache_fields, ARRAY_SIZE(cache_fields),
                          offsetof(ThunkCache, props), &items, &n->n_caches);
        if (r < 0)
                goto out;
        n->caches = items;
        r = load_children(p, idx, "io_links", "io_links_count", &pf, THUNK_TOPOLOGY_MAX_IO_LINKS,
                          sizeof(ThunkIoLink), link_fields, ARRAY_SIZE(link_fields),
                          offsetof(ThunkIoLink, props), &items, &n->n_io_links);
        if (r < 0)
                goto out;
        n->io_links = items;
        r = load_children(p, idx, "p2p_links", "p2p_links_count", &pf, THUNK_TOPOLOGY_MAX_IO_LINKS,
                          sizeof(ThunkIoLink), link_fields, ARRAY_SIZE(link_fields),
                          offsetof(ThunkIoLink, props), &items, &n->n_p2p_links);
        if (r < 0)
                goto out;
        n->p2p_links = items;
out:
        free(pf.lines);
        n->props = pf.props; /* owned by the node from here on, freed with it */
        return r;
}

static int check_links(Parser *p, const ThunkTopology *t, const ThunkNode *n, const char *dir,
                       const ThunkIoLink *links, size_t n_links)
{
        for (size_t i = 0; i < n_links; i++) {
                if (links[i].node_to >= t->n_nodes) {
                        char rel[REL_MAX];
                        snprintf(rel, sizeof(rel), "nodes/%u/%s/%zu/properties", n->node_id, dir, i);
                        return fail(p, -EINVAL, rel, 0, "node_to %u names no node (there are %zu)",
                                    links[i].node_to, t->n_nodes);
                }
        }
        return 0;
}

static int assign_numa(ThunkTopology *t)
{
        int *cpu_index = calloc(t->n_nodes, sizeof(*cpu_index));
        if (!cpu_index)
                return -ENOMEM;
        int ncpu = 0;
        for (size_t i = 0; i < t->n_nodes; i++)
                cpu_index[i] = t->nodes[i].cpu_cores_count > 0 ? ncpu++ : -1;
        for (size_t i = 0; i < t->n_nodes; i++) {
                ThunkNode *n = &t->nodes[i];
                if (cpu_index[i] >= 0) {
                        n->numa_node = cpu_index[i];
                        continue;
                }
                const ThunkIoLink *best = NULL;
                for (size_t l = 0; l < n->n_io_links; l++) {
                        const ThunkIoLink *k = &n->io_links[l];
                        if (cpu_index[k->node_to] >= 0 && (!best || k->weight < best->weight))
                                best = k;
                }
                n->numa_node = best ? cpu_index[best->node_to] : -1;
        }
        free(cpu_index);
        return 0;
}

/* Cross-node checks and NUMA indices need the whole node list. */
static int finish(Parser *p, ThunkTopology *t)
{
        for (size_t i = 0; i < t->n_nodes; i++) {
                const ThunkNode *n = &t->nodes[i];
                int r = check_links(p, t, n, "io_links", n->io_links, n->n_io_links);
                if (r == 0)
                        r = check_links(p, t, n, "p2p_links", n->p2p_links, n->n_p2p_links);
                if (r < 0)
                        return r;
                if (!n->is_gpu)
                        continue;
                t->n_gpus++;
                for (size_t j = 0; j < i; j++) {
                        if (t->nodes[j].is_gpu && t->nodes[j].gpu_id == n->gpu_id) {
                                char rel[REL_MAX];
                                snprintf(rel, sizeof(rel), "nodes/%zu/gpu_id", i);
                                return fail(p, -EINVAL, rel, 1, "gpu_id %u already used by node %zu",
                                            n->gpu_id, j);
                        }
                }
        }
        return assign_numa(t);
}

int thunk_topology_load_source(const ThunkTopologySource *src, const char *root_name, ThunkTopology **ret,
                               char *errbuf, size_t errlen)
{
        Parser p = {.src = src, .err = errbuf, .errlen = errlen};
        ThunkTopology *t = NULL;
        PropsFile spf = {0};
        size_t n_nodes;
        int r;

        if (!src || !src->read_file || !src->list_dir || !root_name || !ret)
                return -EINVAL;
        p.buf = malloc(THUNK_TOPOLOGY_MAX_FILE + 1);
        if (!p.buf)
                return -ENOMEM;
        t = calloc(1, sizeof(*t));
        if (!t) {
                r = -ENOMEM;
                goto fail;
        }
        t->root = strdup(root_name);
        if (!t->root) {
                r = -ENOMEM;
                goto fail;
        }
        r = load_number(&p, "generation_id", &t->generation_id);
        if (r < 0)
                goto fail;
        r = load_props(&p, "system_properties", &spf);
        if (r < 0)
                goto fail;
        r = decode(&p, "system_properties", &spf, system_fields, ARRAY_SIZE(system_fields), t);
        t->system_props = spf.props;
        free(spf.lines);
        if (r < 0)
                goto fail;

        r = count_indexed_dir(&p, "nodes", THUNK_TOPOLOGY_MAX_NODES, &n_nodes);
        if (r < 0)
                goto fail;
        if (n_nodes == 0) {
                r = fail(&p, -ENOENT, "nodes", 0, "no nodes");
                goto fail;
        }
        t->nodes = calloc(n_nodes, sizeof(*t->nodes));
        if (!t->nodes) {
                r = -ENOMEM;
                goto fail;
        }
        for (size_t i = 0; i < n_nodes; i++) {
                t->n_nodes = i + 1; /* so that a partly loaded node is freed too */
                r = load_node(&p, (unsigned)i, &t->nodes[i]);
                if (r < 0)
                        goto fail;
        }
        r = finish(&p, t);
        if (r < 0)
                goto fail;

        free(p.buf);
        *ret = t;
        return 0;
fail:
        free(p.buf);
        thunk_topology_free(t);
        return r;
}

int thunk_topology_load(const char *root, ThunkTopology **ret, char *errbuf, size_t errlen)
{
        Parser p = {.err = errbuf, .errlen = errlen}; /* for the message about the root only */
        DirSource ds;
        ThunkTopologySource src = {.ctx = &ds, .read_file = dir_read_file, .list_dir = dir_list_dir};

        if (!ret)
                return -EINVAL;
        if (!root)
                root = THUNK_TOPOLOGY_DEFAULT_PATH;
        ds.rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (ds.rootfd < 0)
                return fail(&p, -errno, root, 0, "cannot open topology directory: %s", strerror(errno));
        int r = thunk_topology_load_source(&src, root, ret, errbuf, errlen);
        close(ds.rootfd);
        return r;
}

ThunkTopology *thunk_topology_free(ThunkTopology *t)
{
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_nodes; i++)
                node_done(&t->nodes[i]);
        free(t->nodes);
        props_done(&t->system_props);
        free(t->root);
        free(t);
        return NULL;
}

const ThunkNode *thunk_topology_gpu_by_id(const ThunkTopology *t, uint32_t gpu_id)
{
        if (!t || gpu_id == 0)
                return NULL;
        for (size_t i = 0; i < t->n_nodes; i++)
                if (t->nodes[i].is_gpu && t->nodes[i].gpu_id == gpu_id)
                        return &t->nodes[i];
        return NULL;
}

const ThunkNode *thunk_topology_gpu_by_index(const ThunkTopology *t, size_t gpu_index)
{
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_nodes; i++) {
                if (!t->nodes[i].is_gpu)
                        continue;
                if (gpu_index == 0)
                        return &t->nodes[i];
                gpu_index--;
        }
        return NULL;
}

uint64_t thunk_node_system_bytes(const ThunkNode *n)
{
        uint64_t bytes = 0;

        for (size_t k = 0; k < n->n_mem_banks; k++)
                if (n->mem_banks[k].heap_type == HSA_MEM_HEAP_TYPE_SYSTEM)
                        bytes += n->mem_banks[k].size_in_bytes;
        return bytes;
}

bool thunk_node_has_public_vram(const ThunkNode *n)
{
        for (size_t k = 0; k < n->n_mem_banks; k++)
                if (n->mem_banks[k].heap_type == HSA_MEM_HEAP_TYPE_FB_PUBLIC)
                        return true;
        return false;
}

int thunk_topology_numa_of(const ThunkTopology *t, const ThunkNode *n)
{
        (void)t;
        return n ? n->numa_node : -1;
}

bool thunk_props_get(const ThunkProps *p, const char *key, uint64_t *ret)
{
        if (!p || !key)
                return false;
        for (size_t i = 0; i < p->n; i++) {
                if (strcmp(p->items[i].key, key) == 0) {
                        if (ret)
                                *ret = p->items[i].value;
                        return true;
                }
        }
        return false;
}

/* ---- writing the tree out again ------------------------------------------------------------------------ */

int thunk_props_write(const ThunkProps *p, const char *rel, const char *key, uint64_t value,
                      ThunkTopologyEmit emit, void *ctx)
{
        size_t cap, len = 0;
        char *buf;
        int r;

        if (!p || !rel || !emit)
                return -EINVAL;
        cap = p->n * (THUNK_PROP_KEY_MAX + 24) + 1;
        buf = malloc(cap);
        if (!buf)
                return -ENOMEM;
        for (size_t i = 0; i < p->n; i++) {
                uint64_t v = key && strcmp(p->items[i].key, key) == 0 ? value : p->items[i].value;
                len += (size_t)snprintf(buf + len, cap - len, "%s %llu\n", p->items[i].key,
                                        (unsigned long long)v);
        }
        r = emit(ctx, rel, buf, len);
        free(buf);
        return r;
}

/* A properties file as the kernel prints one: "key value" lines, decimal. */
static int emit_props(const ThunkProps *p, const char *rel, ThunkTopologyEmit emit, void *ctx)
{
        return thunk_props_write(p, rel, NULL, 0, emit, ctx);
}

static int emit_text(const char *rel, ThunkTopologyEmit emit, void *ctx, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static int emit_text(const char *rel, ThunkTopologyEmit emit, void *ctx, const char *fmt, ...)
{
        char buf[THUNK_NAME_MAX + 32];
        va_list ap;
        int n;

        va_start(ap, fmt);
        n = vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        return emit(ctx, rel, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static int emit_children(unsigned node, const char *dir, size_t n, const void *items, size_t item_size,
                         size_t props_off, ThunkTopologyEmit emit, void *ctx)
{
        char rel[REL_MAX];

        for (size_t i = 0; i < n; i++) {
                const ThunkProps *p =
                        (const ThunkProps *)(const void *)((const char *)items + i * item_size + props_off);
                int r;
                snprintf(rel, sizeof(rel), "nodes/%u/%s/%zu/properties", node, dir, i);
                r = emit_props(p, rel, emit, ctx);
                if (r < 0)
                        return r;
        }
        return 0;
}

int thunk_topology_write(const ThunkTopology *t, ThunkTopologyEmit emit, void *ctx)
{
        char rel[REL_MAX];
        int r;

        if (!t || !emit)
                return -EINVAL;
        r = emit_text("generation_id", emit, ctx, "%llu\n", (unsigned long long)t->generation_id);
        if (r >= 0)
                r = emit_props(&t->system_props, "system_properties", emit, ctx);
        for (size_t i = 0; r >= 0 && i < t->n_nodes; i++) {
                const ThunkNode *n = &t->nodes[i];
                unsigned id = n->node_id;
                snprintf(rel, sizeof(rel), "nodes/%u/gpu_id", id);
                r = emit_text(rel, emit, ctx, "%u\n", n->gpu_id);
                if (r < 0)
                        break;
                snprintf(rel, sizeof(rel), "nodes/%u/name", id);
                r = emit_text(rel, emit, ctx, "%s\n", n->name);
                if (r < 0)
                        break;
                snprintf(rel, sizeof(rel), "nodes/%u/properties", id);
                r = emit_props(&n->props, rel, emit, ctx);
                if (r >= 0)
                        r = emit_children(id, "mem_banks", n->n_mem_banks, n->mem_banks, sizeof(ThunkMemBank),
                                          offsetof(ThunkMemBank, props), emit, ctx);
                if (r >= 0)
                        r = emit_children(id, "caches", n->n_caches, n->caches, sizeof(ThunkCache),
                                          offsetof(ThunkCache, props), emit, ctx);
                if (r >= 0)
                        r = emit_children(id, "io_links", n->n_io_links, n->io_links, sizeof(ThunkIoLink),
                                          offsetof(ThunkIoLink, props), emit, ctx);
                if (r >= 0)
                        r = emit_children(id, "p2p_links", n->n_p2p_links, n->p2p_links, sizeof(ThunkIoLink),
                                          offsetof(ThunkIoLink, props), emit, ctx);
        }
        return r < 0 ? r : 0;
}
