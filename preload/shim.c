/* The KFD interposition layer of the LD_PRELOAD libraries: /dev/kfd, the render nodes, the KFD sysfs topology
 * and /proc/modules, served by a backend (backend.h): the in-process KFD model or gpumemd. */
/* The shim defines both open and open64 (and mmap, mmap64): libc's 64-bit aliasing must stay out. */
#undef _FILE_OFFSET_BITS
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "backend.h"
#include "kfd-ioctls.h"

/*
 * Everything here is process state by nature: the shim stands in for a kernel driver that every library of
 * the process reaches through libc, so it keeps one backend per process, started on the first open of
 * /dev/kfd, a render node or a topology path.
 *
 * Which fds belong to the backend is tracked here, in a lock-free table, rather than asked of it: a
 * backend closes and maps its own files (memfds, its socket) while holding its locks, and those calls
 * come back through these very wrappers.
 */

#define PRELOAD_EXPORT __attribute__((visibility("default")))

/* glibc's fortified open entry points, and the shim's own query (declared for -Wmissing-prototypes). */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);
int gpumem_preload_stats(char *buf, size_t len);
#define FD_TABLE_MAX 65536

static const char *const kfd_topology_paths[] = {
        "/sys/devices/virtual/kfd/kfd/topology",
        "/sys/class/kfd/kfd/topology",
};

static struct {
        pthread_mutex_t lock;
        bool env_read;
        int log_level;
        FILE *log;
        char stats_path[PATH_MAX];
        bool started;
        _Atomic bool started_ok;     /* read without the lock by mmap and munmap */
        int start_err;               /* the backend's start failed: every device open fails with it */
        char topology_dir[PATH_MAX]; /* what the KFD sysfs topology paths lead to once started */
        int modules_fd;              /* memfd with the /proc/modules text the backend's machine presents */
        ThunkSeam seam;              /* the backend's device calls, set at its start */
        _Atomic unsigned char owned[FD_TABLE_MAX];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .modules_fd = -1};

/* Device calls in progress on this thread: what the backend does inside one is its own (see fcntl below). */
static __thread __attribute__((tls_model("initial-exec"))) unsigned in_backend;
#define BACKEND(call)                                                                                        \
        ({                                                                                                   \
                in_backend++;                                                                                \
                __typeof__(call) r_ = (call);                                                                \
                in_backend--;                                                                                \
                r_;                                                                                          \
        })

/* ------------------------------------------------------------------ raw calls (never re-enter the shim) */

static int raw_openat(int dirfd, const char *path, int flags, mode_t mode)
{
        return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

static int raw_close(int fd)
{
        return (int)syscall(SYS_close, fd);
}

static int raw_ioctl(int fd, unsigned long request, void *arg)
{
        return (int)syscall(SYS_ioctl, fd, request, arg);
}

static void *raw_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
        return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static bool fd_owned(int fd)
{
        return fd >= 0 && fd < FD_TABLE_MAX && atomic_load(&g.owned[fd]);
}

/* ------------------------------------------------------------------ configuration and log */

static void logf_(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void logf_(int level, const char *fmt, ...)
{
        va_list ap;

        if (g.log_level < level || !g.log)
                return;
        va_start(ap, fmt);
        fprintf(g.log, "%s: ", preload_backend.log_name);
        vfprintf(g.log, fmt, ap);
        fputc('\n', g.log);
        fflush(g.log);
        va_end(ap);
}

/* The backend's variable @suffix ("LOG" -> GPUMEM_MODEL_LOG or GPUMEM_KFD_LOG). */
static const char *env(const char *suffix)
{
        char name[64];

        snprintf(name, sizeof(name), "%s%s", preload_backend.env_prefix, suffix);
        return getenv(name);
}

/* Called with g.lock held. */
static void read_env(void)
{
        const char *v;

        if (g.env_read)
                return;
        g.env_read = true;
        g.log = stderr;
        g.log_level = 0;
        v = env("LOG");
        if (v)
                g.log_level = atoi(v);
        v = env("LOG_FILE");
        if (v && *v) {
                int fd = raw_openat(AT_FDCWD, v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
                FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;

                if (f)
                        g.log = f;
                else if (fd >= 0)
                        raw_close(fd);
        }
        v = env("STATS");
        if (v)
                snprintf(g.stats_path, sizeof(g.stats_path), "%s", v);
}

static void preload_log(void *ctx, int level, const char *msg)
{
        (void)ctx;
        logf_(level, "%s", msg);
}

/* No thread of the parent holds the layer's lock in the child: a fork waits for a start under way. (The
 * handlers are registered after the backend's, so this lock is taken before the backend's locks, in the
 * order device_open takes them.) */
static void before_fork(void)
{
        pthread_mutex_lock(&g.lock);
}

static void after_fork_in_parent(void)
{
        pthread_mutex_unlock(&g.lock);
}

/* The child's first open starts the backend again, for a KFD of its own (the inherited fds stay owned, and
 * the backend keeps seeing the child's mmaps and munmaps meanwhile, as backend.h says). */
static void after_fork_in_child(void)
{
        if (preload_backend.restart_after_fork) {
                g.started = false;
                g.start_err = 0;
                g.topology_dir[0] = '\0';
        }
        pthread_mutex_unlock(&g.lock);
}

/* Start the backend once (called with g.lock held); 0 or its error, which every later call gets too. */
static int start(void)
{
        static bool atfork_installed;
        char err[512] = "";
        int r;

        read_env();
        if (g.started)
                return g.start_err;
        g.started = true;
        /* the backend keeps it: it lives as long as the process */
        static const PreloadHost host = {.log = preload_log};

        r = preload_backend.start(&host, &g.seam, g.topology_dir, sizeof(g.topology_dir), err, sizeof(err));
        /* after the backend's own (b_start's): prepare handlers run in the reverse order */
        if (!atfork_installed)
                atfork_installed =
                        pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) == 0;
        if (r < 0) {
                g.start_err = r;
                atomic_store(&g.started_ok, false);
                g.topology_dir[0] = '\0';
                /* said once, even when logging is off: without it the program only sees "no GPU" */
                if (g.log)
                        fprintf(g.log, "%s: %s\n", preload_backend.log_name, err[0] ? err : strerror(-r));
                return r;
        }
        logf_(1, "%s", err);
        atomic_store(&g.started_ok, true);
        return 0;
}

/* ------------------------------------------------------------------ paths */

/* The preset path standing for a KFD topology path, or NULL if @path is not one. */
static const char *redirect(const char *path, char *buf, size_t len)
{
        if (!path)
                return NULL;
        for (size_t i = 0; i < sizeof(kfd_topology_paths) / sizeof(kfd_topology_paths[0]); i++) {
                size_t n = strlen(kfd_topology_paths[i]);

                if (strncmp(path, kfd_topology_paths[i], n) == 0 && (path[n] == '\0' || path[n] == '/')) {
                        pthread_mutex_lock(&g.lock);
                        /* no backend: no topology (what a machine without the driver shows) */
                        if (start() < 0)
                                snprintf(buf, len, "/nonexistent/gpumem-kfd-topology%s", path + n);
                        else
                                snprintf(buf, len, "%s%s", g.topology_dir, path + n);
                        pthread_mutex_unlock(&g.lock);
                        logf_(2, "%s -> %s", path, buf);
                        return buf;
                }
        }
        return NULL;
}

/* /proc/modules as the backend's machine has it: the real list plus the amdgpu driver, which is what tools
 * look for to tell whether the KFD is present. */
static int open_modules(int flags)
{
        char path[64];
        int fd;

        pthread_mutex_lock(&g.lock);
        if (g.modules_fd < 0) {
                static const char line[] = "amdgpu 9000000 0 - Live 0x0000000000000000\n";
                char buf[4096];
                int src = raw_openat(AT_FDCWD, "/proc/modules", O_RDONLY | O_CLOEXEC, 0);
                int mfd = (int)syscall(SYS_memfd_create, "gpumem-modules", MFD_CLOEXEC);
                ssize_t n;
                bool ok = mfd >= 0;

                while (ok && src >= 0 && (n = read(src, buf, sizeof(buf))) > 0)
                        ok = write(mfd, buf, (size_t)n) == n;
                if (src >= 0)
                        raw_close(src);
                if (ok && write(mfd, line, sizeof(line) - 1) == (ssize_t)sizeof(line) - 1)
                        g.modules_fd = mfd;
                else if (mfd >= 0)
                        raw_close(mfd);
        }
        fd = -1;
        if (g.modules_fd >= 0) {
                snprintf(path, sizeof(path), "/proc/self/fd/%d", g.modules_fd);
                fd = raw_openat(AT_FDCWD, path, (flags & O_CLOEXEC) | O_RDONLY, 0);
        }
        pthread_mutex_unlock(&g.lock);
        return fd;
}

static int device_open(const char *path, int flags)
{
        unsigned int minor;
        int fd = -1, r;

        pthread_mutex_lock(&g.lock);
        r = start();
        if (r < 0) {
                /* as start() said */
        } else if (strcmp(path, "/dev/kfd") == 0) {
                r = BACKEND(g.seam.ops->open_kfd(g.seam.impl, &fd));
        } else if (sscanf(path, "/dev/dri/renderD%u", &minor) == 1) {
                r = BACKEND(g.seam.ops->open_render(g.seam.impl, minor, &fd));
        } else {
                r = -ENOENT;
        }
        if (r == 0) {
                if (fd >= FD_TABLE_MAX) {
                        (void)BACKEND(g.seam.ops->close(g.seam.impl, fd));
                        r = -EMFILE;
                } else {
                        atomic_store(&g.owned[fd], 1);
                        /* backends hand out O_CLOEXEC fds; honour a caller that did not ask for it */
                        if (!(flags & O_CLOEXEC))
                                fcntl(fd, F_SETFD, 0);
                }
        }
        pthread_mutex_unlock(&g.lock);
        logf_(2, "open %s -> %d", path, r < 0 ? r : fd);
        if (r < 0) {
                errno = -r;
                return -1;
        }
        return fd;
}

static bool is_device(const char *path)
{
        return path && (strcmp(path, "/dev/kfd") == 0 || strncmp(path, "/dev/dri/renderD", 16) == 0);
}

static int do_openat(int dirfd, const char *path, int flags, mode_t mode)
{
        char buf[PATH_MAX];
        const char *p;

        if (is_device(path))
                return device_open(path, flags);
        if (path && strcmp(path, "/proc/modules") == 0) {
                int fd = open_modules(flags);

                if (fd >= 0)
                        return fd;
        }
        p = redirect(path, buf, sizeof(buf));
        return raw_openat(dirfd, p ? p : path, flags, mode);
}

/* The mode that follows @flags in a variadic open call, where @flags asks for one (O_CREAT, O_TMPFILE). */
#define VA_MODE(flags, mode)                                                                                 \
        do {                                                                                                 \
                va_list ap_;                                                                                 \
                va_start(ap_, flags);                                                                        \
                mode = ((flags) & (O_CREAT | __O_TMPFILE)) ? (mode_t)va_arg(ap_, int) : 0;                   \
                va_end(ap_);                                                                                 \
        } while (0)

/* The 64-bit names are the same entry points (aliases): the shim is built without _FILE_OFFSET_BITS, and
 * off_t is off64_t on the ABIs it serves. */
_Static_assert(sizeof(off_t) == 8, "off_t is 64-bit");
#define PRELOAD_ALIAS(name) PRELOAD_EXPORT __attribute__((alias(#name)))

PRELOAD_EXPORT int open(const char *path, int flags, ...)
{
        mode_t mode;

        VA_MODE(flags, mode);
        return do_openat(AT_FDCWD, path, flags, mode);
}
PRELOAD_ALIAS(open) int open64(const char *path, int flags, ...);

PRELOAD_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
        mode_t mode;

        VA_MODE(flags, mode);
        return do_openat(dirfd, path, flags, mode);
}
PRELOAD_ALIAS(openat) int openat64(int dirfd, const char *path, int flags, ...);

/* The fortified entry points of <fcntl.h> (never with O_CREAT). */
PRELOAD_EXPORT int __open_2(const char *path, int flags)
{
        return do_openat(AT_FDCWD, path, flags, 0);
}
PRELOAD_ALIAS(__open_2) int __open64_2(const char *path, int flags);

PRELOAD_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
        return do_openat(dirfd, path, flags, 0);
}
PRELOAD_ALIAS(__openat_2) int __openat64_2(int dirfd, const char *path, int flags);

/* stdio and dirent open files inside libc, below the open wrappers: redirect their paths too. */
#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

PRELOAD_EXPORT FILE *fopen(const char *path, const char *mode)
{
        static FILE *(*next)(const char *, const char *);
        char buf[PATH_MAX];
        const char *p;

        if (!next)
                next = NEXT(fopen);
        if (path && strcmp(path, "/proc/modules") == 0) {
                int fd = open_modules(O_CLOEXEC);

                if (fd >= 0)
                        return fdopen(fd, "r");
        }
        p = redirect(path, buf, sizeof(buf));
        return next(p ? p : path, mode);
}

PRELOAD_ALIAS(fopen) FILE *fopen64(const char *path, const char *mode);

PRELOAD_EXPORT DIR *opendir(const char *path)
{
        static DIR *(*next)(const char *);
        char buf[PATH_MAX];
        const char *p;

        if (!next)
                next = NEXT(opendir);
        p = redirect(path, buf, sizeof(buf));
        return next(p ? p : path);
}

/* SIGSEGV's handler as the program sees it, where the backend keeps one of its own in place (swap.c). glibc's
 * signal() does not go through sigaction()'s symbol: both are served. */
PRELOAD_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
        static int (*next)(int, const struct sigaction *, struct sigaction *);

        if (preload_backend.sigaction && preload_backend.sigaction(sig, act, old) == 1)
                return 0;
        if (!next)
                next = NEXT(sigaction);
        return next(sig, act, old);
}

PRELOAD_EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
        static sighandler_t (*next)(int, sighandler_t);
        /* signal()'s BSD semantics: restarted calls, the signal blocked while its handler runs */
        struct sigaction sa = {.sa_handler = handler, .sa_flags = SA_RESTART}, old;

        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, sig);
        if (preload_backend.sigaction && preload_backend.sigaction(sig, &sa, &old) == 1)
                return old.sa_handler;
        if (!next)
                next = NEXT(signal);
        return next(sig, handler);
}

/* ------------------------------------------------------------------ device calls */

/* The request's name for the log (kfd-ioctls.h), or what kind of request it is. */
static const char *ioctl_name(unsigned long request)
{
        const char *name = thunk_ioctl_name(request);

        if (name)
                return name;
        if (_IOC_TYPE(request) == AMDKFD_IOCTL_BASE)
                return "KFD?";
        return _IOC_TYPE(request) == DRM_IOCTL_BASE ? "DRM?" : "?";
}

PRELOAD_EXPORT int ioctl(int fd, unsigned long request, ...)
{
        va_list ap;
        void *arg;
        int r;

        va_start(ap, request);
        arg = va_arg(ap, void *);
        va_end(ap);
        if (!fd_owned(fd))
                return raw_ioctl(fd, request, arg);
        r = BACKEND(g.seam.ops->ioctl(g.seam.impl, fd, request, arg));
        if (_IOC_NR(request) != _IOC_NR(AMDKFD_IOC_WAIT_EVENTS) || _IOC_TYPE(request) != AMDKFD_IOCTL_BASE ||
            g.log_level >= 3)
                logf_(1, "ioctl fd=%d %s (0x%08lx) -> %d%s%s", fd, ioctl_name(request), request, r,
                      r < 0 ? " " : "", r < 0 ? strerror(-r) : "");
        if (r < 0) {
                errno = -r;
                return -1;
        }
        return r;
}

/* Whether @fd is a memfd the backend names as one of its dmabufs. */
static bool is_dmabuf_memfd(int fd)
{
        char link[64], target[128];
        ssize_t n;

        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        n = syscall(SYS_readlinkat, AT_FDCWD, link, target, sizeof(target) - 1);
        if (n <= 0)
                return false;
        target[n] = '\0';
        for (const char *const *name = preload_backend.dmabuf_memfds; *name; name++) {
                size_t k = strlen(*name);
                /* "/memfd:NAME (deleted)" */
                if (strncmp(target, "/memfd:", 7) == 0 && strncmp(target + 7, *name, k) == 0 &&
                    (target[7 + k] == '\0' || target[7 + k] == ' '))
                        return true;
        }
        return false;
}

PRELOAD_EXPORT int fcntl(int fd, int cmd, ...)
{
        static int (*next)(int, int, ...);
        unsigned long arg;
        va_list ap;

        /* every fcntl command takes one argument or none, an int or a pointer: passed on as a word */
        va_start(ap, cmd);
        arg = va_arg(ap, unsigned long);
        va_end(ap);
        if ((cmd == F_GET_SEALS || cmd == F_ADD_SEALS) && !in_backend && preload_backend.dmabuf_memfds &&
            is_dmabuf_memfd(fd)) {
                errno = EINVAL; /* as a kernel's dmabuf answers */
                return -1;
        }
        if (!next)
                next = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl64");
        if (!next)
                next = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl");
        return next(fd, cmd, arg);
}

PRELOAD_ALIAS(fcntl) int fcntl64(int fd, int cmd, ...);

PRELOAD_EXPORT int close(int fd)
{
        int r;

        if (!fd_owned(fd))
                return raw_close(fd);
        atomic_store(&g.owned[fd], 0);
        r = BACKEND(g.seam.ops->close(g.seam.impl, fd));
        logf_(2, "close %d -> %d", fd, r);
        if (r < 0) {
                errno = -r;
                return -1;
        }
        return 0;
}

PRELOAD_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
        void *p = MAP_FAILED;
        int r;

        if (!(flags & MAP_ANONYMOUS) && fd_owned(fd)) {
                r = BACKEND(g.seam.ops->mmap(g.seam.impl, addr, len, prot, flags, fd, (uint64_t)off, &p));
                logf_(2, "mmap fd=%d offset=0x%llx len=0x%zx -> %d", fd, (unsigned long long)off, len, r);
                if (r < 0) {
                        errno = -r;
                        return MAP_FAILED;
                }
                return p;
        }
        if ((flags & MAP_ANONYMOUS) && addr && !(flags & MAP_FIXED_NOREPLACE) && preload_backend.mmap_anon &&
            atomic_load(&g.started_ok)) {
                r = preload_backend.mmap_anon(addr, len, prot, flags, &p);
                if (r < 0) {
                        errno = -r;
                        return MAP_FAILED;
                }
                if (r > 0)
                        return p;
        }
        p = raw_mmap(addr, len, prot, flags, fd, off);
        if ((uintptr_t)p > (uintptr_t)-4096) {
                errno = -(int)(intptr_t)p;
                return MAP_FAILED;
        }
        return p;
}

PRELOAD_ALIAS(mmap) void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off);

PRELOAD_EXPORT int munmap(void *addr, size_t len)
{
        if (preload_backend.munmap && atomic_load(&g.started_ok)) {
                int r = preload_backend.munmap(addr, len);
                if (r < 0) {
                        errno = -r;
                        return -1;
                }
                if (r > 0)
                        return 0;
        }
        if (syscall(SYS_munmap, addr, len) < 0)
                return -1;
        return 0;
}

/* ------------------------------------------------------------------ statistics */

/* One line describing the backend's live objects, for tests and the STATS variable. Returns the length
 * written (snprintf rules), or -1 if the backend has not started. */
PRELOAD_EXPORT int gpumem_preload_stats(char *buf, size_t len)
{
        if (!g.started || g.start_err)
                return -1;
        return preload_backend.stats(buf, len);
}

__attribute__((destructor)) static void preload_exit(void)
{
        char line[512];
        FILE *f;
        int fd;

        if (!g.stats_path[0] || gpumem_preload_stats(line, sizeof(line)) < 0)
                return;
        if (strcmp(g.stats_path, "-") == 0) {
                fprintf(stderr, "%s %s\n", preload_backend.stats_tag, line);
                return;
        }
        fd = raw_openat(AT_FDCWD, g.stats_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        f = fd >= 0 ? fdopen(fd, "a") : NULL;
        if (!f) {
                if (fd >= 0)
                        raw_close(fd);
                return;
        }
        fprintf(f, "%s %s\n", preload_backend.stats_tag, line);
        fclose(f);
}
