/* The daemon's KFD topology files as a private directory of the process's, served in place of sysfs. */
#include "topology-dir.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_file(const char *root, const char *rel, const char *content, size_t len)
{
        char path[PATH_MAX];
        int fd;

        if (snprintf(path, sizeof(path), "%s/%s", root, rel) >= (int)sizeof(path) || strstr(rel, ".."))
                return -EINVAL;
        for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
                *p = '\0';
                if (mkdir(path, 0700) < 0 && errno != EEXIST)
                        return -errno;
                *p = '/';
        }
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        if (write(fd, content, len) != (ssize_t)len) {
                int r = -errno;
                close(fd);
                return r ? r : -EIO;
        }
        close(fd);
        return 0;
}

int topology_dir_make(char *dir, size_t len, const gm_topology_file *files, size_t n, char *msg,
                      size_t msglen)
{
        const char *rt = getenv("XDG_RUNTIME_DIR");
        int r = 0;

        snprintf(dir, len, "%s/gpumem-kfd-XXXXXX", rt && *rt ? rt : "/tmp");
        if (!mkdtemp(dir)) {
                r = -errno;
                snprintf(msg, msglen, "cannot make a directory for the KFD topology: %s", strerror(errno));
                dir[0] = '\0';
                return r;
        }
        for (size_t i = 0; i < n && r == 0; i++)
                r = write_file(dir, files[i].path, files[i].content, files[i].len);
        if (r < 0)
                snprintf(msg, msglen, "cannot write the KFD topology into %s: %s", dir, strerror(-r));
        return r;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        return remove(path);
}

void topology_dir_remove(const char *dir)
{
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
