/* Hostile tenants against the daemon's core promises: quotas hold, read-only stays so, no one stalls others.
 * One case per run (its name is the first argument), each on a daemon of its own with its own policy. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/capability.h>
#include <linux/falloc.h>

#include "../common/check.h"
#include "frame.h"
#include "gpumem-client.h"
#include "gpumem.pb-c.h"
#include "harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static DaemonState base;
static uint32_t gpus[16];
static size_t n_gpus;

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int start(const char *config)
{
        int r = daemon_setup(&dmn, "mi300x", config, NULL, gpus, ARRAY_SIZE(gpus));

        if (r < 0)
                return r;
        n_gpus = (size_t)r;
        return daemon_base_state(&dmn, &base);
}

/* A raw connection after hello that sends pings and never reads a reply, until the daemon stops taking
 * them: its replies back up in the daemon. Returns the fd. */
static int flood_without_reading(void)
{
        uint8_t frame[GM_FRAME_HDR_SIZE + 2];
        const uint8_t body[] = {0x12, 0x00}; /* Request.ping {} */
        struct timeval tv = {0, 200000};
        int fd = raw_connect(dmn.sock), sent = 0;

        CHECK(fd >= 0);
        if (fd < 0)
                return -1;
        CHECK_EQ(raw_hello(fd), 0);
        gm_frame_hdr_encode(frame, 1, 7, sizeof(body), 0);
        memcpy(frame + GM_FRAME_HDR_SIZE, body, sizeof(body));
        CHECK_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
        for (int i = 0; i < 100000; i++) {
                if (send(fd, frame, sizeof(frame), MSG_NOSIGNAL) < 0)
                        break;
                sent++;
        }
        CHECK(sent > 10);
        return fd;
}

/* In a child, so that a daemon that blocks us fails the check instead of hanging the test. */
static bool served_within(int seconds)
{
        int status;
        pid_t pid = fork();

        if (pid == 0) {
                gm_client *c = NULL;
                alarm((unsigned)seconds);
                if (gm_client_connect(dmn.sock, "bystander", &c) != 0)
                        _exit(1);
                for (int i = 0; i < 50; i++)
                        if (gm_ping(c) != 0)
                                _exit(2);
                gm_client_close(c);
                _exit(0);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid)
                return false;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/*
 * Clients that flood requests and never read the replies, in a class with an in-flight limit: a new
 * connection of the same class still gets its hello and is served, and the flooders are dropped once
 * their replies have waited send-timeout seconds, leaving nothing behind.
 */
#define STALL_CONFIG                                                                                         \
        "[daemon]\nsend-timeout = 2\nlog-level = warning\n"                                                  \
        "[class all]\nmatch-all = yes\ninflight = 2\nconnections = 16\n"

static void test_stall(void)
{
        int fds[3];
        DaemonState st = {0};
        int64_t t0;

        for (size_t i = 0; i < 3; i++)
                fds[i] = flood_without_reading();
        t0 = now_ms();
        CHECK(served_within(5));
        CHECK(now_ms() - t0 < 1500); /* served while the flooders still wait, not after they were dropped */
        /* dropped after the timeout: only our status connection is left */
        for (int i = 0; i < 100; i++) {
                if (daemon_state(&dmn, &st) == 0 && st.clients == base.clients)
                        break;
                usleep(100000);
        }
        CHECK_EQ(st.clients, base.clients);
        for (size_t i = 0; i < 3; i++) {
                if (fds[i] < 0)
                        continue;
                CHECK(raw_closed(fds[i], 2000)); /* the replies that were queued, then the close */
                close(fds[i]);
        }
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
        CHECK(served_within(5));
        {
                gm_client *adm = NULL;
                char *text = NULL;
                CHECK_EQ(gm_client_connect(dmn.sock, "hostile-admin", &adm), 0);
                if (adm && gm_admin_metrics(adm, &text) == 0)
                        CHECK_STR_CONTAINS(text, "gpumemd_clients_stalled_total 3\n");
                gm_free(text);
                gm_client_close(adm);
        }
}

/* What class @name uses of @resource (all GPUs), or UINT64_MAX when it cannot be read. */
static uint64_t class_used(const char *name, int resource)
{
        uint64_t used;

        (void)daemon_class_quota(&dmn, name, resource, 0, &used, NULL);
        return used;
}

/* Wait (up to 3 s) until the class uses @want of @resource. */
static bool class_settles(const char *name, int resource, uint64_t want)
{
        return daemon_class_reaches(&dmn, name, resource, want, 3000) == 0;
}

static gm_handle handle_of(gm_client *c, void *p)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        return gm_pointer_get_attributes(c, p, &pa) == 0 ? pa.handle : 0;
}

static bool fd_is_read_only(int fd)
{
        return fd >= 0 && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY;
}

/* A shared writable mapping of @fd is refused by the kernel (the file was opened read-only). */
static bool cannot_map_writable(int fd, size_t size)
{
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
                munmap(p, size);
                return false;
        }
        return errno == EACCES;
}

/*
 * Nor can its holder open the same file again writable through /proc (a memfd's mode would allow it): tried
 * by a child with another uid when we are root (root passes every permission check), dumpable so that its
 * own /proc entries stay its own.
 */
static bool cannot_reopen_writable(int fd)
{
        pid_t pid = fork();
        int st = -1;

        if (pid < 0)
                return false;
        if (pid == 0) {
                char path[64];
                int w;
                if (getuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0))
                        _exit(2);
                (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
                snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
                w = open(path, O_RDWR | O_CLOEXEC);
                _exit(w < 0 && errno == EACCES ? 0 : 1);
        }
        return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The capabilities that pass every permission check on a file, in effect in this process
 * (/proc/self/status): what root has in a rootful container. */
static bool has_every_file_cap(void)
{
        const unsigned long long need = 1ull << CAP_DAC_OVERRIDE | 1ull << CAP_FOWNER |
                                        1ull << CAP_SYS_ADMIN | 1ull << CAP_SYS_PTRACE;
        unsigned long long eff = 0;
        char line[256];
        bool found = false;
        FILE *f = fopen("/proc/self/status", "r");

        if (!f)
                return false;
        while (!found && fgets(line, sizeof(line), f))
                found = sscanf(line, "CapEff: %llx", &eff) == 1;
        fclose(f);
        return found && (eff & need) == need;
}

/* This process becomes uid and gid 65534 and keeps every capability it had in effect. */
static bool become_other_uid_with_caps(void)
{
        struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
        struct __user_cap_data_struct d[2] = {{0}};

        if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 || setgroups(0, NULL) < 0 ||
            setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0 ||
            syscall(SYS_capget, &h, d) < 0)
                return false;
        d[0].effective = d[0].permitted;
        d[1].effective = d[1].permitted;
        if (syscall(SYS_capset, &h, d) < 0)
                return false;
        (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0); /* its /proc entries its own again */
        return getuid() == 65534;
}

/* A write that worked: counted, and said. */
static int worked(const char *how)
{
        fprintf(stderr, "read-only memory written: %s\n", how);
        return 1;
}

/* Every way one fd might write the file it is of; how many worked. */
static int write_through(int f, size_t size, const char *which)
{
        static const uint8_t junk[64] = {0xee};
        char how[96];
        int n = 0;
        void *p;

        snprintf(how, sizeof(how), "write() through %s", which);
        n += write(f, junk, sizeof(junk)) > 0 ? worked(how) : 0;
        snprintf(how, sizeof(how), "pwrite() through %s", which);
        n += pwrite(f, junk, sizeof(junk), 4096) > 0 ? worked(how) : 0;
        snprintf(how, sizeof(how), "a hole punched through %s", which);
        n += fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192) == 0 ? worked(how) : 0;
        snprintf(how, sizeof(how), "ftruncate() through %s", which);
        n += ftruncate(f, 0) == 0 ? worked(how) : 0;
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (p != MAP_FAILED) {
                memset(p, 0xee, 4096);
                munmap(p, size);
                snprintf(how, sizeof(how), "a shared writable mapping of %s", which);
                n += worked(how);
        }
        p = mmap(NULL, size, PROT_READ, MAP_SHARED, f, 0);
        if (p != MAP_FAILED) {
                if (mprotect(p, size, PROT_READ | PROT_WRITE) == 0) {
                        memset(p, 0xee, 4096);
                        snprintf(how, sizeof(how), "a read-only mapping of %s made writable", which);
                        n += worked(how);
                }
                munmap(p, size);
        }
        /* more seals could freeze the owner's memory; seals are never taken back */
        snprintf(how, sizeof(how), "a seal added through %s", which);
        n += fcntl(f, F_ADD_SEALS, F_SEAL_WRITE) == 0 || fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK) == 0
                     ? worked(how)
                     : 0;
        return n;
}

/*
 * A holder of read-only memory with every capability a container's root has, in a process of its own,
 * tries every way to write it: through @fd (or, with @fd -1, the file behind @map, opened through
 * /proc/self/map_files as CAP_SYS_ADMIN may), the same file opened again read-write through /proc, after
 * fchmod, through @map made writable, through /proc/self/mem. Returns how many worked, or -1 when the
 * process does not hold those capabilities.
 */
static int root_write_attempts(int fd, void *map, size_t size)
{
        char path[96];
        int n = 0, rw, own = -1, mem;

        if (!has_every_file_cap())
                return -1;
        if (fd < 0 && map) {
                snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", (unsigned long)(uintptr_t)map,
                         (unsigned long)(uintptr_t)map + size);
                fd = own = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        return -1;
                rw = open(path, O_RDWR | O_CLOEXEC);
                if (rw >= 0) {
                        n += write_through(rw, size, "the mapping's file opened read-write");
                        close(rw);
                }
        }
        n += write_through(fd, size, "the fd given");
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        rw = open(path, O_RDWR | O_CLOEXEC); /* the memfd's mode does not stop CAP_DAC_OVERRIDE */
        if (rw >= 0) {
                n += write_through(rw, size, "the fd opened again read-write");
                close(rw);
        }
        if (fchmod(fd, 0666) == 0 && (rw = open(path, O_RDWR | O_CLOEXEC)) >= 0) {
                n += write_through(rw, size, "the fd opened again after fchmod");
                close(rw);
        }
        if (map) {
                if (mprotect(map, size, PROT_READ | PROT_WRITE) == 0) {
                        memset(map, 0xee, 4096);
                        n += worked("the read-only mapping made writable");
                }
                mem = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
                if (mem >= 0) {
                        n += pwrite(mem, "\xee\xee\xee\xee", 4, (off_t)(uintptr_t)map) == 4
                                     ? worked("/proc/self/mem over the read-only mapping")
                                     : 0;
                        close(mem);
                }
        }
        if (own >= 0)
                close(own);
        return n;
}

/* root_write_attempts() in a child of its own (root, every capability): true if it had them and every
 * attempt failed. */
static bool root_cannot_write(int fd, void *map, size_t size)
{
        pid_t pid = fork();
        int st = -1;

        if (pid == 0)
                _exit(root_write_attempts(fd, map, size) == 0 ? 0 : 1);
        return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The memory at @p holds @size bytes of @v; then the owner writes @v + 1 through its own mapping. */
static bool unchanged_and_owner_writes(volatile uint8_t *p, size_t size, uint8_t v)
{
        bool same = true;

        for (size_t i = 0; i < size; i++)
                same &= p[i] == v;
        memset((void *)p, v + 1, size);
        for (size_t i = 0; i < size; i += 4096)
                same &= p[i] == (uint8_t)(v + 1);
        return same;
}

#define RO_CONFIG "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\n"

/*
 * Read-only stays read-only: a read-only export is an O_RDONLY file; an importer of it gets neither GPU nor
 * CPU write access, its CPU mapping cannot be made writable, and what it exports again is read-only too.
 */
static void test_read_only(void)
{
        gm_client *x = NULL, *y = NULL;
        void *dev = NULL, *host = NULL, *ro_dev = NULL, *res = NULL;
        gm_handle imp = 0;
        int fd = -1, fd2 = -1, fd3 = -1, fd4 = -1;
        size_t size = 0;

        CHECK_EQ(gm_client_connect(dmn.sock, "exporter", &x), 0);
        CHECK_EQ(gm_client_connect(dmn.sock, "importer", &y), 0);
        if (!x || !y)
                goto out;
        CHECK_EQ(gm_malloc(x, 2 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &dev), 0);
        if (dev)
                memset(dev, 0x5a, 2 * MiB);
        if (daemon_kfd_preload()) {
                /* the kernel path: a kernel's dmabuf takes no seals, so device memory is not handed out
                 * read-only at all (the preload's model answers as a kernel does); the host memory below is
                 */
                char why[256];
                CHECK_EQ(gm_mem_export_flags(x, handle_of(x, dev), GM_EXPORT_READ_ONLY, &fd, &size),
                         -EOPNOTSUPP);
                gm_strerror(x, -EOPNOTSUPP, why, sizeof(why));
                CHECK(strstr(why, "takes no seals") != NULL);
                goto host_part;
        }
        CHECK_EQ(gm_mem_export_flags(x, handle_of(x, dev), GM_EXPORT_READ_ONLY, &fd, &size), 0);
        CHECK(fd_is_read_only(fd));
        if (fd >= 0) {
                CHECK(cannot_map_writable(fd, 2 * MiB));
                CHECK(cannot_reopen_writable(fd));
                /* nor can root with every capability write it: its file is sealed */
                CHECK(fcntl(fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE);
                CHECK(root_cannot_write(fd, NULL, 2 * MiB));
                CHECK(dev && unchanged_and_owner_writes(dev, 2 * MiB, 0x5a));
                if (dev)
                        memset(dev, 0x5a, 2 * MiB);
        }
        CHECK_EQ(gm_mem_export_flags(x, handle_of(x, dev), 0x80, &fd2, NULL), -EINVAL);
        /* sealed memory takes no new writable mapping: exported read-only only */
        CHECK_EQ(gm_mem_export(x, handle_of(x, dev), &fd2, NULL), -EPERM);

        /* the importer: GPU and CPU read-write are refused, read is granted and reads the exporter's data */
        if (fd >= 0) {
                gm_access_desc gpu_rw = {gpus[0], GM_ACCESS_READ_WRITE}, gpu_r = {gpus[0], GM_ACCESS_READ};
                gm_access_desc cpu_rw = {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE};
                gm_access_desc cpu_r = {GM_LOCATION_CPU, GM_ACCESS_READ};
                CHECK_EQ(gm_mem_import(y, fd, gpus[0], &imp, &size), 0);
                CHECK_EQ(gm_mem_address_reserve(y, 2 * MiB, 0, NULL, 0, &res), 0);
                CHECK_EQ(gm_mem_map(y, res, 2 * MiB, 0, imp), 0);
                CHECK_EQ(gm_mem_set_access(y, res, 2 * MiB, &gpu_rw, 1), -EACCES);
                CHECK_EQ(gm_mem_set_access(y, res, 2 * MiB, &cpu_rw, 1), -EACCES);
                CHECK_EQ(gm_mem_set_access(y, res, 2 * MiB, &gpu_r, 1), 0);
                CHECK_EQ(gm_mem_set_access(y, res, 2 * MiB, &cpu_r, 1), 0);
                if (res) {
                        CHECK_EQ(((volatile unsigned char *)res)[4096], 0x5a);
                        /* the page tables hold a read-only file: no way to make the mapping writable */
                        CHECK(mprotect(res, 2 * MiB, PROT_READ | PROT_WRITE) < 0 && errno == EACCES);
                        /* nor for root with every capability, through the mapping's file */
                        CHECK(root_cannot_write(-1, res, 2 * MiB));
                }
                /* exporting the import again cannot shed the restriction */
                CHECK_EQ(gm_mem_export(y, imp, &fd2, NULL), 0);
                CHECK(fd_is_read_only(fd2));
                CHECK(root_cannot_write(fd2, NULL, 2 * MiB));
                CHECK(dev && unchanged_and_owner_writes(dev, 2 * MiB, 0x5a));
                CHECK_EQ(gm_mem_unmap(y, res, 2 * MiB), 0);
                CHECK_EQ(gm_mem_release(y, imp), 0);
                CHECK_EQ(gm_mem_address_free(y, res, 2 * MiB), 0);
        }

        /* host memory the same way, and memory allocated read-only is exported read-only without asking */
host_part:
        CHECK_EQ(gm_host_malloc(x, 2 * MiB, 0, -1, 0, &host), 0);
        if (host)
                memset(host, 0x3c, 2 * MiB);
        CHECK_EQ(gm_mem_export_flags(x, handle_of(x, host), GM_EXPORT_READ_ONLY, &fd3, NULL), 0);
        CHECK(fd_is_read_only(fd3));
        if (fd3 >= 0) {
                CHECK(cannot_map_writable(fd3, 2 * MiB));
                CHECK(cannot_reopen_writable(fd3));
                CHECK(root_cannot_write(fd3, NULL, 2 * MiB));
                CHECK(host && unchanged_and_owner_writes(host, 2 * MiB, 0x3c));
        }
        CHECK_EQ(gm_malloc(x, 2 * MiB, gpus[0], GM_MEM_READ_ONLY, &ro_dev), 0);
        if (daemon_kfd_preload()) {
                CHECK_EQ(gm_mem_export(x, handle_of(x, ro_dev), &fd4, NULL), -EOPNOTSUPP);
        } else {
                CHECK_EQ(gm_mem_export(x, handle_of(x, ro_dev), &fd4, NULL), 0);
                CHECK(fd_is_read_only(fd4));
        }
        CHECK_EQ(gm_mem_free(x, dev), 0);
        CHECK_EQ(gm_mem_free(x, host), 0);
        CHECK_EQ(gm_mem_free(x, ro_dev), 0);
out:
        for (int *f = (int[]){fd, fd2, fd3, fd4}, i = 0; i < 4; i++)
                if (f[i] >= 0)
                        close(f[i]);
        gm_client_close(y);
        gm_client_close(x);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

#define RO_SHARE_CONFIG                                                                                      \
        "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\nshare-publish = ro/*\n"                \
        "share-read = ro/*\nshare-write = ro/*\n"

/* A reader of share @arg opens it read-only and attacks it with every capability, as root or as another
 * uid: exits 0 if it found the publisher's bytes and wrote none. */
static int share_attacker(const char *name, bool other_uid)
{
        gm_client *c = NULL;
        size_t size = 0;
        void *p = NULL;
        int n;

        if (other_uid && !become_other_uid_with_caps())
                return 2;
        if (gm_client_connect(dmn.sock, other_uid ? "reader-65534" : "reader-root", &c) != 0 ||
            gm_share_open(c, name, 0, NULL, 0, &p, &size, NULL) != 0)
                return 3;
        if (((volatile uint8_t *)p)[size - 1] != 0x77)
                return 4;
        n = root_write_attempts(-1, p, size);
        gm_client_close(c);
        return n == 0 ? 0 : 5;
}

static bool share_attacked(const char *name, bool other_uid)
{
        pid_t pid = fork();
        int st = -1;

        if (pid == 0)
                _exit(share_attacker(name, other_uid));
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
                return false;
        if (WEXITSTATUS(st) != 0)
                fprintf(stderr, "share attacker (%s): exit %d\n", other_uid ? "uid 65534" : "root",
                        WEXITSTATUS(st));
        return WEXITSTATUS(st) == 0;
}

/*
 * Named shares opened read-only, host and device memory, published read-only or read-write: readers with
 * every capability, root and another uid, cannot write the publisher's bytes on any path; the publisher
 * still writes through its own mapping; a read-write open after a read-only one is refused.
 */
static void test_read_only_shares(void)
{
        static const char *names[] = {"ro/host", "ro/device", "ro/host-rw", "ro/device-rw"};
        gm_client *x = NULL;
        void *mem[4] = {NULL};

        CHECK_EQ(gm_client_connect(dmn.sock, "publisher", &x), 0);
        if (!x)
                return;
        for (size_t i = 0; i < 4; i++) {
                bool host = i % 2 == 0, rw = i >= 2;
                int r = host ? gm_host_malloc(x, 2 * MiB, 0, -1, 0, &mem[i])
                             : gm_malloc(x, 2 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &mem[i]);

                CHECK_EQ(r, 0);
                if (r != 0)
                        continue;
                memset(mem[i], 0x77, 2 * MiB);
                CHECK_EQ(gm_share_publish(x, handle_of(x, mem[i]), names[i], rw ? 0 : GM_SHARE_READ_ONLY,
                                          NULL),
                         0);
                CHECK(share_attacked(names[i], false));
                CHECK(share_attacked(names[i], true));
                CHECK(unchanged_and_owner_writes(mem[i], 2 * MiB, 0x77));
                if (rw) {
                        gm_client *y = NULL;
                        void *p = NULL;
                        CHECK_EQ(gm_client_connect(dmn.sock, "writer", &y), 0);
                        CHECK_EQ(gm_share_open(y, names[i], GM_SHARE_WRITE, NULL, 0, &p, NULL, NULL), -EPERM);
                        gm_client_close(y);
                }
                CHECK_EQ(gm_share_revoke(x, names[i]), 0);
                CHECK_EQ(gm_mem_free(x, mem[i]), 0);
        }
        gm_client_close(x);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

#define LIFE_CONFIG                                                                                          \
        "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\nvram = 8M\nhost = 4M\n"                \
        "handles = 64\n"

/*
 * Memory is charged for as long as anything keeps it alive. Free after export, keeping the fd, then
 * allocate again: the class would hold twice its quota; now the second allocation is -EDQUOT until the fd
 * is closed. A share that outlives its owner stays charged to the owner's class until the importer lets go.
 */
static void test_lifetime(void)
{
        gm_client *x = NULL, *y = NULL;
        void *p = NULL, *q = NULL;
        gm_handle imp = 0;
        int fd = -1;

        CHECK_EQ(gm_client_connect(dmn.sock, "hoarder", &x), 0);
        if (!x)
                return;
        /* device memory: the exported dmabuf keeps 6 MiB alive after the free */
        CHECK_EQ(gm_malloc(x, 6 * MiB, gpus[0], 0, &p), 0);
        CHECK_EQ(gm_mem_export(x, handle_of(x, p), &fd, NULL), 0);
        CHECK_EQ(gm_mem_free(x, p), 0);
        CHECK_EQ(class_used("all", GM_RESOURCE_VRAM), 6 * MiB);
        CHECK_EQ(gm_malloc(x, 6 * MiB, gpus[0], 0, &q), -EDQUOT);
        if (fd >= 0)
                close(fd);
        CHECK(class_settles("all", GM_RESOURCE_VRAM, 0));
        CHECK_EQ(gm_malloc(x, 6 * MiB, gpus[0], 0, &q), 0);
        CHECK_EQ(gm_mem_free(x, q), 0);

        /* host memory: the memfd handed out at allocation and exported again */
        fd = -1;
        CHECK_EQ(gm_host_malloc(x, 3 * MiB, 0, -1, 0, &p), 0);
        CHECK_EQ(gm_mem_export(x, handle_of(x, p), &fd, NULL), 0);
        CHECK_EQ(gm_mem_free(x, p), 0);
        CHECK_EQ(class_used("all", GM_RESOURCE_HOST), 3 * MiB);
        CHECK_EQ(gm_host_malloc(x, 3 * MiB, 0, -1, 0, &q), -EDQUOT);
        if (fd >= 0)
                close(fd);
        CHECK(class_settles("all", GM_RESOURCE_HOST, 0));

        /* a share that outlives its owner: the importer's handle keeps the exporter's class paying */
        fd = -1;
        CHECK_EQ(gm_client_connect(dmn.sock, "importer", &y), 0);
        CHECK_EQ(gm_malloc(x, 6 * MiB, gpus[0], 0, &p), 0);
        CHECK_EQ(gm_mem_export(x, handle_of(x, p), &fd, NULL), 0);
        if (y && fd >= 0)
                CHECK_EQ(gm_mem_import(y, fd, gpus[0], &imp, NULL), 0);
        if (fd >= 0)
                close(fd);
        gm_client_close(x); /* frees its allocation */
        usleep(200000);
        CHECK_EQ(class_used("all", GM_RESOURCE_VRAM), 6 * MiB);
        if (y)
                CHECK_EQ(gm_mem_release(y, imp), 0);
        CHECK(class_settles("all", GM_RESOURCE_VRAM, 0));
        gm_client_close(y);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

/*
 * Imports of gpumemd's own exports create no memory outside every account: importing the same export over
 * and over costs the importer handles only, and the exporter's class pays for the memory once. A foreign
 * dmabuf (a memfd the client made) is charged by its size, with a per-class cap on one import.
 */
static void test_import_accounts(void)
{
        gm_client *x = NULL;
        void *p = NULL;
        gm_handle h[8] = {0};
        int fd = -1, mfd = -1, big = -1;
        gm_handle fh = 0;

        CHECK_EQ(gm_client_connect(dmn.sock, "looper", &x), 0);
        if (!x)
                return;
        CHECK_EQ(gm_malloc(x, 4 * MiB, gpus[0], 0, &p), 0);
        CHECK_EQ(gm_mem_export(x, handle_of(x, p), &fd, NULL), 0);
        for (int i = 0; i < 8 && fd >= 0; i++)
                CHECK_EQ(gm_mem_import(x, fd, gpus[0], &h[i], NULL), 0);
        CHECK_EQ(class_used("all", GM_RESOURCE_VRAM), 4 * MiB);
        CHECK_EQ(class_used("all", GM_RESOURCE_HANDLES), 9);
        for (int i = 0; i < 8; i++)
                if (h[i])
                        CHECK_EQ(gm_mem_release(x, h[i]), 0);
        CHECK_EQ(gm_mem_free(x, p), 0);
        if (fd >= 0)
                close(fd);
        CHECK(class_settles("all", GM_RESOURCE_VRAM, 0));

        /* foreign memory: 1 MiB is within the class's caps, 3 MiB is more than one import may be */
        mfd = memfd_create("foreign", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        big = memfd_create("foreign-big", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        CHECK(mfd >= 0 && big >= 0);
        if (mfd >= 0 && big >= 0) {
                CHECK_EQ(ftruncate(mfd, 1 * MiB), 0);
                CHECK_EQ(ftruncate(big, 3 * MiB), 0);
                CHECK_EQ(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
                CHECK_EQ(fcntl(big, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
                CHECK_EQ(gm_mem_import(x, big, gpus[0], &fh, NULL), -EDQUOT);
                {
                        char eb[512];
                        CHECK_STR_CONTAINS(gm_strerror(x, -EDQUOT, eb, sizeof(eb)), "single foreign import");
                }
                CHECK_EQ(gm_mem_import(x, mfd, gpus[0], &fh, NULL), 0);
                /* the second would take the class past its 1.5 MiB of foreign imports */
                gm_handle fh2 = 0;
                CHECK_EQ(gm_mem_import(x, mfd, gpus[0], &fh2, NULL), -EDQUOT);
                CHECK_EQ(gm_mem_release(x, fh), 0);
                CHECK_EQ(gm_mem_import(x, mfd, gpus[0], &fh2, NULL), 0);
                CHECK_EQ(gm_mem_release(x, fh2), 0);
        }
        if (mfd >= 0)
                close(mfd);
        if (big >= 0)
                close(big);
        gm_client_close(x);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

#define IMPORT_CONFIG                                                                                        \
        "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\nvram = 8M\n"                           \
        "foreign-imports = 1536K\nforeign-import-max = 2M\n"

/* Every record the daemon keeps for a client costs a handle: VMM mappings count against `handles`. */
static void test_vmm_mappings(void)
{
        gm_client *x = NULL;
        void *res = NULL;
        gm_handle h = 0;
        size_t mapped = 0;

        CHECK_EQ(gm_client_connect(dmn.sock, "mapper", &x), 0);
        if (!x)
                return;
        CHECK_EQ(gm_mem_address_reserve(x, 64 * MiB, 0, NULL, 0, &res), 0);
        CHECK_EQ(gm_mem_create(x, 2 * MiB, gpus[0], 0, &h), 0);
        /* 2 handles used: 6 mappings fit under 8, the 7th is refused */
        for (size_t i = 0; i < 16 && res; i++) {
                int r = gm_mem_map(x, (char *)res + i * 2 * MiB, 2 * MiB, 0, h);
                if (r != 0) {
                        CHECK_EQ(r, -EDQUOT);
                        char eb[512];
                        CHECK_STR_CONTAINS(gm_strerror(x, r, eb, sizeof(eb)), "handle limit");
                        break;
                }
                mapped++;
        }
        CHECK_EQ(mapped, 6);
        CHECK_EQ(class_used("all", GM_RESOURCE_HANDLES), 8);
        if (res)
                CHECK_EQ(gm_mem_unmap(x, res, mapped * 2 * MiB), 0);
        CHECK_EQ(class_used("all", GM_RESOURCE_HANDLES), 2);
        gm_client_close(x);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

#define MAPPINGS_CONFIG "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\nhandles = 8\n"

/*
 * A client with a hundred thousand objects leaves: its teardown runs in slices, and other clients are served
 * between them. Seen from outside: while it goes on, admin status answers with part of it done.
 */
static void test_teardown_slices(void)
{
        enum { N = 100000 };
        DaemonState st = {0};
        int sync[2], status;
        uint64_t peak = 0, seen_between = 0;
        pid_t pid;

        CHECK_EQ(pipe2(sync, O_CLOEXEC), 0);
        pid = fork();
        if (pid == 0) {
                gm_client *c = NULL;
                void *res = NULL;
                gm_handle h = 0;
                close(sync[0]);
                if (gm_client_connect(dmn.sock, "hoarder", &c) != 0 ||
                    gm_mem_address_reserve(c, (size_t)N * 4096, 0, NULL, 0, &res) != 0 ||
                    gm_mem_create(c, 4096, gpus[0], 0, &h) != 0)
                        _exit(1);
                for (size_t i = 0; i < N; i++)
                        if (gm_mem_map(c, (char *)res + i * 4096, 4096, 0, h) != 0)
                                _exit(2);
                if (write(sync[1], "x", 1) != 1)
                        _exit(3);
                pause(); /* killed with everything held */
                _exit(4);
        }
        close(sync[1]);
        {
                char ch;
                CHECK_EQ(read(sync[0], &ch, 1), 1);
        }
        close(sync[0]);
        CHECK_EQ(daemon_state(&dmn, &st), 0);
        peak = st.allocations;
        CHECK(peak >= base.allocations + N);
        kill(pid, SIGKILL);
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        /* the daemon notices the close, then frees a slice per loop round; status is served in between */
        for (int i = 0; i < 2000; i++) {
                if (daemon_state(&dmn, &st) != 0)
                        break;
                if (st.allocations > base.allocations && st.allocations < peak)
                        seen_between++;
                if (st.allocations == base.allocations)
                        break;
        }
        CHECK(seen_between > 0);
        CHECK(daemon_wait_base(&dmn, &base, 10000, NULL) == 0);
}

#define TEARDOWN_CONFIG "[daemon]\nlog-level = warning\n"

/* One host allocation is populated on the daemon's loop: host-alloc-max bounds how long one request holds it.
 */
static void test_request_size(void)
{
        gm_client *x = NULL;
        void *p = NULL;
        char eb[512];
        int r;

        CHECK_EQ(gm_client_connect(dmn.sock, "greedy", &x), 0);
        if (!x)
                return;
        r = gm_host_malloc(x, 3 * MiB, 0, -1, 0, &p);
        CHECK_EQ(r, -EDQUOT);
        CHECK_STR_CONTAINS(gm_strerror(x, r, eb, sizeof(eb)),
                           "single host allocation limit: at most 2 MiB, 3 MiB asked");
        CHECK_EQ(class_used("all", GM_RESOURCE_HOST), 0);
        CHECK_EQ(gm_host_malloc(x, 2 * MiB, 0, -1, 0, &p), 0);
        CHECK_EQ(gm_mem_free(x, p), 0);
        gm_client_close(x);
        CHECK(daemon_wait_base(&dmn, &base, 5000, NULL) == 0);
}

#define REQUEST_SIZE_CONFIG                                                                                  \
        "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\nhost-alloc-max = 2M\n"

/* The next reply on @fd is @want_id's, with status @want_code; its reason goes to @why (may be NULL). */
static void expect_reply(int fd, uint32_t want_id, int want_code, char *why, size_t why_len)
{
        uint32_t id = 0;
        int code = 1;

        CHECK_EQ(raw_recv_reply(fd, &id, &code, why, why_len, 20000), 0);
        CHECK_EQ(id, want_id);
        CHECK_EQ(code, want_code);
}

/* Two raw connections, each after its hello; false (a check failed) when they cannot be had. */
static bool two_greeted(int *a, int *b)
{
        *a = raw_connect(dmn.sock);
        *b = raw_connect(dmn.sock);
        CHECK(*a >= 0 && *b >= 0);
        if (*a < 0 || *b < 0)
                return false;
        CHECK_EQ(raw_hello(*a), 0);
        CHECK_EQ(raw_hello(*b), 0);
        return true;
}

/* Replies waiting on @fd right now (without blocking). */
static bool reply_waiting(int fd)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};
        return poll(&p, 1, 0) == 1;
}

/*
 * A host allocation the daemon must populate (512 MiB: a few hundred milliseconds of page faults) is made
 * off the event loop: another client is served meanwhile, the allocating client's replies keep its request
 * order, a class's quota is held while the memory is being made, and a client that goes away before its
 * allocation is done leaves nothing behind.
 */
static void test_slow_alloc(void)
{
        int a, b, cfd, dfd;
        char why[256];

        if (!two_greeted(&a, &b))
                return;

        /* a: the allocation, then a ping behind it */
        raw_send_host_alloc(a, 20, 512 * MiB);
        raw_send_ping(a, 21);
        usleep(5 * 1000); /* the daemon has taken the allocation by now (the ping waits behind it) */
        /* b is answered while a's memory is still being populated */
        raw_send_ping(b, 30);
        expect_reply(b, 30, 0, why, sizeof(why));
        CHECK(!reply_waiting(a));
        /* a's replies come in its order: the allocation first, though its ping was quick */
        expect_reply(a, 20, 0, why, sizeof(why));
        expect_reply(a, 21, 0, why, sizeof(why));
        CHECK_EQ(class_used("all", GM_RESOURCE_HOST), 512 * MiB);
        close(a);
        close(b);
        CHECK(daemon_wait_base(&dmn, &base, 10000, NULL) == 0);

        /* the quota is held from the start: a second allocation meanwhile is over it */
        if (!two_greeted(&cfd, &dfd))
                return;
        raw_send_host_alloc(cfd, 40, 512 * MiB);
        usleep(10 * 1000);
        raw_send_host_alloc(dfd, 50, 512 * MiB);
        expect_reply(dfd, 50, -EDQUOT, why, sizeof(why));
        expect_reply(cfd, 40, 0, why, sizeof(why));
        close(cfd);
        close(dfd);
        CHECK(daemon_wait_base(&dmn, &base, 10000, NULL) == 0);

        /* clients that go while their allocation is being made: nothing stays, and others are served */
        for (int i = 0; i < 4; i++) {
                int e = raw_connect(dmn.sock);
                CHECK(e >= 0);
                if (e < 0)
                        return;
                CHECK_EQ(raw_hello(e), 0);
                raw_send_host_alloc(e, 60, 256 * MiB);
                raw_send_ping(e, 61);
                usleep((useconds_t)(i * 5000));
                close(e);
        }
        CHECK(served_within(10));
        CHECK(daemon_wait_base(&dmn, &base, 20000, NULL) == 0);
}

/*
 * A client's requests run in the order it sent them, also when one of them finishes later: a pointer query
 * behind a host allocation being populated finds it; a prefetch (off the loop from 2 MiB), the free of its
 * memory and a prefetch of the freed range, pipelined, run in that order.
 */
static void test_ordered_prefetch(void)
{
        Gpumem__Request q = GPUMEM__REQUEST__INIT;
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        Gpumem__SvmPrefetch pf = GPUMEM__SVM_PREFETCH__INIT;
        Gpumem__Free fr = GPUMEM__FREE__INIT;
        Gpumem__Reply *rep = NULL;
        int fds[16];
        size_t n_fds = 0;
        uint64_t va = 0, handle = 0, window_base = 0;
        uint32_t id = 0;
        int fd = raw_connect(dmn.sock), code = 1;
        char why[256];

        CHECK(fd >= 0);
        if (fd < 0)
                return;
        /* the hello reply names the window, where the fixed address below is placed */
        CHECK_EQ(raw_hello_named(fd, 1, "ordered", (void **)&rep), 0);
        if (rep && rep->hello)
                window_base = rep->hello->window_base;
        raw_reply_free(rep);
        rep = NULL;
        CHECK(window_base != 0);
        {
                /* a host allocation the daemon populates for a while, at a known address, and a pointer
                 * query of that address right behind it: the query runs after the allocation */
                Gpumem__Alloc h = GPUMEM__ALLOC__INIT;
                Gpumem__PointerInfoGet pi = GPUMEM__POINTER_INFO_GET__INIT;
                h.has_kind = h.has_size = h.has_fixed_va = true;
                h.kind = GPUMEM__MEM_KIND__MEM_KIND_HOST;
                h.size = 512 * MiB;
                h.fixed_va = window_base + 1024 * MiB;
                q.op_case = GPUMEM__REQUEST__OP_ALLOC;
                q.alloc = &h;
                raw_send_request(fd, 70, &q);
                pi.has_va = true;
                pi.va = h.fixed_va + 4096;
                q.op_case = GPUMEM__REQUEST__OP_POINTER_INFO;
                q.pointer_info = &pi;
                raw_send_request(fd, 71, &q);
                expect_reply(fd, 70, 0, why, sizeof(why));
                expect_reply(fd, 71, 0, why, sizeof(why));
        }
        a.has_kind = a.has_size = true;
        a.kind = GPUMEM__MEM_KIND__MEM_KIND_MANAGED;
        a.size = 64 * MiB;
        q.op_case = GPUMEM__REQUEST__OP_ALLOC;
        q.alloc = &a;
        CHECK_EQ(raw_request(fd, 80, &q, NULL, 0, (void **)&rep, fds, &n_fds, NULL), 0);
        if (rep && rep->alloc) {
                va = rep->alloc->va;
                handle = rep->alloc->handle;
        }
        raw_reply_free(rep);
        for (size_t i = 0; i < n_fds; i++)
                close(fds[i]);
        CHECK(va != 0 && handle != 0);

        pf.has_va = pf.has_size = pf.has_location = true;
        pf.va = va;
        pf.size = 64 * MiB;
        pf.location = gpus[0];
        q.op_case = GPUMEM__REQUEST__OP_SVM_PREFETCH;
        q.svm_prefetch = &pf;
        raw_send_request(fd, 81, &q);
        fr.has_handle = true;
        fr.handle = handle;
        q.op_case = GPUMEM__REQUEST__OP_FREE;
        q.free = &fr;
        raw_send_request(fd, 82, &q);
        q.op_case = GPUMEM__REQUEST__OP_SVM_PREFETCH;
        q.svm_prefetch = &pf;
        raw_send_request(fd, 83, &q);

        expect_reply(fd, 81, 0, why, sizeof(why));
        expect_reply(fd, 82, 0, why, sizeof(why));
        CHECK_EQ(raw_recv_reply(fd, &id, &code, why, sizeof(why), 10000), 0);
        CHECK_EQ(id, 83);
        CHECK(code < 0);
        CHECK_STR_CONTAINS(why, "managed");
        close(fd);
        CHECK(daemon_wait_base(&dmn, &base, 10000, NULL) == 0);
}

#define SLOW_ALLOC_CONFIG "[daemon]\nlog-level = warning\n[class all]\nmatch-all = yes\nhost = 768M\n"

int main(int argc, char **argv)
{
        static const struct {
                const char *name;
                const char *config; /* the daemon's configuration file for the case */
                TestCase tc;
        } cases[] = {
                {"stall",
                 STALL_CONFIG,
                 {"a client that does not read its replies stalls no one and is dropped", test_stall}},
                {"read-only",
                 RO_CONFIG,
                 {"a read-only export stays read-only on every path", test_read_only}},
                {"read-only-shares",
                 RO_SHARE_CONFIG,
                 {"a share opened read-only stays so for readers with every capability",
                  test_read_only_shares}},
                {"lifetime",
                 LIFE_CONFIG,
                 {"memory is charged for as long as anything keeps it alive", test_lifetime}},
                {"imports",
                 IMPORT_CONFIG,
                 {"imports create no memory outside every account", test_import_accounts}},
                {"vmm-mappings", MAPPINGS_CONFIG, {"VMM mappings cost a handle each", test_vmm_mappings}},
                {"teardown",
                 TEARDOWN_CONFIG,
                 {"a client with many objects is torn down in slices", test_teardown_slices}},
                {"request-size",
                 REQUEST_SIZE_CONFIG,
                 {"one host allocation is bounded by host-alloc-max", test_request_size}},
                {"slow-alloc",
                 SLOW_ALLOC_CONFIG,
                 {"a host allocation is populated off the event loop, replies in order", test_slow_alloc}},
                {"ordered",
                 SLOW_ALLOC_CONFIG,
                 {"a client's requests run in its order, a deferred prefetch among them",
                  test_ordered_prefetch}},
        };
        int r = EXIT_FAILURE;

        signal(SIGPIPE, SIG_IGN);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                if (argc > 1 && strcmp(argv[1], cases[i].name) == 0) {
                        if (start(cases[i].config) == 0)
                                r = run_tests(&cases[i].tc, 1);
                        if (dmn.pid > 0 && daemon_stop(&dmn) != 0)
                                r = EXIT_FAILURE;
                        daemon_cleanup(&dmn);
                        return r;
                }
        fprintf(stderr, "usage: %s CASE (", argv[0]);
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
                fprintf(stderr, "%s%s", i ? ", " : "", cases[i].name);
        fprintf(stderr, ")\n");
        return 2;
}
