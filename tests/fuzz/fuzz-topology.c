/* libFuzzer target: the KFD sysfs topology parser over a tree of files written from the input. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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
 */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char root[] = "/dev/shm/gpumemd-fuzz-topo-XXXXXX";
        ThunkTopology *t = NULL;
        char err[256];
        size_t at = 0;
        int r;

        if (!mkdtemp(root))
                abort();
        while (at + 5 <= size) {
                unsigned kind = data[at], a = data[at + 1] % 70, b = data[at + 2] % 70;
                size_t len = (size_t)data[at + 3] | (size_t)data[at + 4] << 8;
                const uint8_t *content = data + at + 5;
                char rel[256];

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
                        write_file(root, rel, content + n, len - n, false);
                        continue;
                }
                kind %= 16;
                if (kind >= sizeof(layout) / sizeof(layout[0]))
                        kind = 2;
                layout_path(rel, sizeof(rel), kind, a, b);
                write_file(root, rel, content, len, kind >= 9);
        }

        err[0] = '\0';
        r = thunk_topology_load(root, &t, err, sizeof(err));
        if (r < 0) {
                if (t)
                        abort(); /* untouched on failure */
                if (!err[0])
                        abort(); /* every refusal says why */
        } else {
                /* what the parser accepted is consistent: GPU look-ups find their own nodes */
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
                thunk_topology_free(t);
        }
        nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        return 0;
}
