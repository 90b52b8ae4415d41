/*
 * libFuzzer target: the KFD sysfs topology parser over a tree built from the input. The tree is held in
 * memory and served through ThunkTopologySource; some inputs are also written as real files and loaded
 * with thunk_topology_load(), so that the directory code is fuzzed too and both sources are compared.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "topology.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Input: records of [kind u8][a u8][b u8][len u16 LE][len bytes of content]. @kind picks a file of the KFD
 * layout (a and b are its node and sub-object numbers), or (kind 15) a file whose name is the content's
 * first line, so odd names and stray files are tried too.
 *
 * About one input in REAL_FILES_ONE_IN also goes through real files: those whose hash (real_files()) says
 * so. A hash of the whole input rather than one byte of it, so that the share stays the same however many
 * such inputs the corpus keeps (they reach code the others do not, so it keeps many), and mutants of one
 * mostly stay in memory.
 */
#define REAL_FILES_ONE_IN 16

static const char *const layout[] = {
        "system_properties",
        "generation_id",
        "nodes/%u/properties",
        "nodes/%u/gpu_id",
        "nodes/%u/name",
        "nodes/%u/mem_banks/%u/properties",
        "nodes/%u/caches/%u/properties",
        "nodes/%u/io_links/%u/properties",
        "nodes/%u/p2p_links/%u/properties",
        "nodes/%u",              /* a directory with nothing in it */
        "nodes/%u/mem_banks/%u", /* a sub-object without properties */
        "nodes/%u/io_links/%u",
        "nodes",
        "nodes/%u/caches/%u",
};

/* layout[] with its numbers filled in (by hand: the table is not a format string the compiler can check). */
static void layout_path(char *out, size_t len, unsigned kind, unsigned a, unsigned b)
{
        const char *t = layout[kind];
        unsigned nums[2] = {a, b}, used = 0;
        size_t o = 0;

        for (; *t && o + 12 < len; t++) {
                if (t[0] == '%' && t[1] == 'u') {
                        o += (size_t)snprintf(out + o, len - o, "%u", nums[used++ % 2]);
                        t++;
                } else {
                        out[o++] = *t;
                }
        }
        out[o] = '\0';
}

/*
 * The tree in memory: one node per file or directory, the children of a directory in a list. Building it
 * follows what write_file() does on a real filesystem: directories on the way are created, a later write
 * replaces a file's content, a write over a directory or under a file does nothing.
 */
typedef struct MemNode {
        char name[64];
        size_t name_len;
        bool dir;
        const uint8_t *content; /* points into the input */
        size_t len;
        int child, next; /* first child, next sibling; -1 for none */
} MemNode;

typedef struct MemTree {
        MemNode *nodes; /* nodes[0] is the root directory */
        size_t n, cap;
} MemTree;

static int mem_child(const MemTree *t, int dir, const char *name, size_t len)
{
        for (int c = t->nodes[dir].child; c >= 0; c = t->nodes[c].next)
                if (t->nodes[c].name_len == len && memcmp(t->nodes[c].name, name, len) == 0)
                        return c;
        return -1;
}

static int mem_add(MemTree *t, int parent, const char *name, size_t len, bool dir)
{
        if (t->n == t->cap || len >= sizeof(t->nodes[0].name))
                abort(); /* sized for the input by the caller; names are shorter than 64 */
        int i = (int)t->n++;
        MemNode *m = &t->nodes[i];
        memcpy(m->name, name, len);
        m->name[len] = '\0';
        m->name_len = len;
        m->dir = dir;
        m->content = NULL;
        m->len = 0;
        m->child = -1;
        m->next = t->nodes[parent].child;
        t->nodes[parent].child = i;
        return i;
}

static void mem_put(MemTree *t, const char *rel, const uint8_t *content, size_t len, bool dir)
{
        int cur = 0;
        for (const char *s = rel;;) {
                const char *e = strchr(s, '/');
                size_t l = e ? (size_t)(e - s) : strlen(s);
                int c = mem_child(t, cur, s, l);
                if (c < 0)
                        c = mem_add(t, cur, s, l, e || dir);
                else if (!t->nodes[c].dir && (e || dir))
                        return; /* a file on the way (ENOTDIR), or a directory over a file (EEXIST) */
                else if (!e && t->nodes[c].dir)
                        return; /* a directory again (EEXIST), or a file over a directory (EISDIR) */
                if (!e) {
                        if (!dir) {
                                t->nodes[c].content = content;
                                t->nodes[c].len = len;
                        }
                        return;
                }
                cur = c;
                s = e + 1;
        }
}

/* The node at @rel: -ENOENT when a component is missing, -ENOTDIR when one on the way is a file. */
static int mem_walk(const MemTree *t, const char *rel, int *ret)
{
        int cur = 0;
        for (const char *s = rel;;) {
                if (!t->nodes[cur].dir)
                        return -ENOTDIR;
                const char *e = strchr(s, '/');
                int c = mem_child(t, cur, s, e ? (size_t)(e - s) : strlen(s));
                if (c < 0)
                        return -ENOENT;
                if (!e) {
                        *ret = c;
                        return 0;
                }
                cur = c;
                s = e + 1;
        }
}

/* The phrases are those of thunk_topology_load()'s directory source, so that messages match. */
static int mem_read_file(void *ctx, const char *rel, char *buf, size_t cap, size_t *ret_len,
                         const char **ret_what)
{
        const MemTree *t = ctx;
        int i, r = mem_walk(t, rel, &i);
        if (r < 0) {
                *ret_what = "cannot open";
                return r;
        }
        const MemNode *m = &t->nodes[i];
        if (m->dir) {
                *ret_what = "read failed"; /* open(2) of a directory works, read(2) says EISDIR */
                return -EISDIR;
        }
        if (m->len > cap)
                return -E2BIG;
        if (m->len)
                memcpy(buf, m->content, m->len);
        *ret_len = m->len;
        return 0;
}

static int mem_list_dir(void *ctx, const char *rel, int (*each)(void *each_ctx, const char *name),
                        void *each_ctx, const char **ret_what)
{
        const MemTree *t = ctx;
        int i, r = mem_walk(t, rel, &i);
        if (r == 0 && !t->nodes[i].dir)
                r = -ENOTDIR;
        if (r < 0) {
                *ret_what = "cannot open directory";
                return r;
        }
        for (int c = t->nodes[i].child; c >= 0 && r == 0; c = t->nodes[c].next)
                r = each(each_ctx, t->nodes[c].name);
        return r;
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st, (void)flag, (void)ftw;
        return remove(path);
}

static int mkdirs(char *path)
{
        for (char *p = path + 1; *p; p++) {
                if (*p != '/')
                        continue;
                *p = '\0';
                int r = mkdir(path, 0755);
                *p = '/';
                if (r < 0 && errno != EEXIST)
                        return -1;
        }
        return 0;
}

static void write_file(const char *root, const char *rel, const uint8_t *content, size_t len, bool dir)
{
        char path[512];
        int fd;

        if ((size_t)snprintf(path, sizeof(path), "%s/%s%s", root, rel, dir ? "/" : "") >= sizeof(path))
                return;
        if (mkdirs(path) < 0 || dir)
                return;
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
                return;
        if (len)
                (void)!write(fd, content, len);
        close(fd);
}

static bool props_equal(const ThunkProps *a, const ThunkProps *b)
{
        if (a->n != b->n)
                return false;
        for (size_t i = 0; i < a->n; i++)
                if (strcmp(a->items[i].key, b->items[i].key) != 0 || a->items[i].value != b->items[i].value)
                        return false;
        return true;
}

/* @n objects of @size bytes each, whose ThunkProps is at @off; the typed members follow from the props. */
static bool objects_equal(const void *a, const void *b, size_t n, size_t size, size_t off)
{
        for (size_t i = 0; i < n; i++)
                if (!props_equal((const ThunkProps *)((const char *)a + i * size + off),
                                 (const ThunkProps *)((const char *)b + i * size + off)))
                        return false;
        return true;
}

#define OBJECTS_EQUAL(a, b, member, n, type)                                                                 \
        objects_equal((a)->member, (b)->member, n, sizeof(type), offsetof(type, props))

/* The same tree read from files and from memory gives the same topology. */
static bool topologies_equal(const ThunkTopology *a, const ThunkTopology *b)
{
        if (a->generation_id != b->generation_id || a->n_nodes != b->n_nodes || a->n_gpus != b->n_gpus ||
            !props_equal(&a->system_props, &b->system_props))
                return false;
        for (size_t i = 0; i < a->n_nodes; i++) {
                const ThunkNode *x = &a->nodes[i], *y = &b->nodes[i];
                if (x->gpu_id != y->gpu_id || strcmp(x->name, y->name) != 0 || x->numa_node != y->numa_node ||
                    !props_equal(&x->props, &y->props) || x->n_mem_banks != y->n_mem_banks ||
                    x->n_caches != y->n_caches || x->n_io_links != y->n_io_links ||
                    x->n_p2p_links != y->n_p2p_links ||
                    !OBJECTS_EQUAL(x, y, mem_banks, x->n_mem_banks, ThunkMemBank) ||
                    !OBJECTS_EQUAL(x, y, caches, x->n_caches, ThunkCache) ||
                    !OBJECTS_EQUAL(x, y, io_links, x->n_io_links, ThunkIoLink) ||
                    !OBJECTS_EQUAL(x, y, p2p_links, x->n_p2p_links, ThunkIoLink))
                        return false;
        }
        return true;
}

/* The oracle: a refusal says why and leaves @t alone; what the parser accepted is consistent. */
static void check_result(int r, const ThunkTopology *t, const char *err)
{
        if (r < 0) {
                if (t)
                        abort(); /* untouched on failure */
                if (!err[0])
                        abort(); /* every refusal says why */
                return;
        }
        /* GPU look-ups find their own nodes */
        size_t gpus = 0;
        if (!t)
                abort();
        for (size_t i = 0; i < t->n_nodes; i++) {
                const ThunkNode *n = &t->nodes[i];
                if (n->gpu_id) {
                        gpus++;
                        if (thunk_topology_gpu_by_id(t, n->gpu_id) == NULL)
                                abort();
                }
                (void)thunk_topology_numa_of(t, n);
        }
        if (gpus != t->n_gpus)
                abort();
        for (size_t g = 0; g < t->n_gpus; g++)
                if (!thunk_topology_gpu_by_index(t, g))
                        abort();
}

/*
 * FNV-1a over the input; its top bits decide. Not instrumented: a traced compare per input byte would
 * cost more than the parsing.
 */
__attribute__((no_sanitize("coverage"), noinline)) static bool real_files(const uint8_t *data, size_t size)
{
        uint32_t h = 2166136261u;
        for (size_t i = 0; i < size; i++)
                h = (h ^ data[i]) * 16777619u;
        return (uint64_t)h * REAL_FILES_ONE_IN >> 32 == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static MemNode *arena; /* kept for the run: the tree's nodes, grown to the largest input */
        static size_t arena_cap;
        char root[] = "/dev/shm/gpumemd-fuzz-topo-XXXXXX";
        bool real = real_files(data, size);
        ThunkTopology *t = NULL;
        char err[256];
        size_t at = 0;
        int r;

        /* Every record adds at most 5 nodes (nodes/a/mem_banks/b/properties), plus the root. */
        size_t need = 1 + 5 * (size / 5 + 1);
        if (need > arena_cap) {
                MemNode *n = realloc(arena, need * sizeof(*n));
                if (!n)
                        abort();
                arena = n;
                arena_cap = need;
        }
        MemTree tree = {.nodes = arena, .n = 1, .cap = arena_cap};
        tree.nodes[0] = (MemNode){.dir = true, .child = -1, .next = -1};

        if (real && !mkdtemp(root))
                abort();
        while (at + 5 <= size) {
                unsigned kind = data[at], a = data[at + 1] % 70, b = data[at + 2] % 70;
                size_t len = (size_t)data[at + 3] | (size_t)data[at + 4] << 8;
                const uint8_t *content = data + at + 5;
                char rel[256];
                bool dir = false;

                at += 5;
                if (len > size - at)
                        len = size - at;
                at += len;
                if (kind % 16 == 15) {
                        /* a name from the content: one path component under nodes/<a>/ */
                        size_t n = 0;
                        char name[64];
                        while (n < len && n < sizeof(name) - 1 && content[n] != '\n') {
                                char ch = (char)content[n];
                                name[n++] = (ch == '/' || ch == '\0' || ch == '.') ? '_' : ch;
                        }
                        name[n] = '\0';
                        if (!n)
                                continue;
                        snprintf(rel, sizeof(rel), "nodes/%u/%s", a, name);
                        content += n;
                        len -= n;
                } else {
                        kind %= 16;
                        if (kind >= sizeof(layout) / sizeof(layout[0]))
                                kind = 2;
                        layout_path(rel, sizeof(rel), kind, a, b);
                        dir = kind >= 9;
                }
                mem_put(&tree, rel, content, len, dir);
                if (real)
                        write_file(root, rel, content, len, dir);
        }

        ThunkTopologySource src = {.ctx = &tree, .read_file = mem_read_file, .list_dir = mem_list_dir};
        err[0] = '\0';
        r = thunk_topology_load_source(&src, "memory", &t, err, sizeof(err));
        check_result(r, t, err);

        if (real) {
                ThunkTopology *ft = NULL;
                char ferr[256] = "";
                int fr = thunk_topology_load(root, &ft, ferr, sizeof(ferr));
                check_result(fr, ft, ferr);
                /*
                 * Both accept or both refuse. The errno and message of a refusal may differ: a directory with
                 * several bad entries is refused for the first one its listing gives, in either order.
                 */
                if ((r < 0) != (fr < 0) || (r == 0 && !topologies_equal(t, ft))) {
                        fprintf(stderr, "memory: %d %s\nfiles: %d %s\n", r, err, fr, ferr);
                        abort();
                }
                thunk_topology_free(ft);
                nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        }
        thunk_topology_free(t);
        return 0;
}
