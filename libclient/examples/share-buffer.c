/* share-buffer: two processes share one GPU buffer through gpumemd, by passing its dmabuf fd over a socket.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "example-gpus.h"
#include "gpumem-client.h"

#define SIZE (4u << 20)

/* Print why @what failed (with the daemon's reason) and return 1, the exit status of a failed step. */
static int fail(gm_client *c, const char *who, const char *what, int err)
{
        char msg[512];
        fprintf(stderr, "%s: %s: %s\n", who, what, gm_strerror(c, err, msg, sizeof(msg)));
        return 1;
}

/* The bytes each side writes: a different pattern per seed, so a stale or foreign page cannot pass. */
static void fill(void *p, size_t size, uint32_t seed)
{
        uint32_t *w = p;
        for (size_t i = 0; i < size / sizeof(*w); i++)
                w[i] = (uint32_t)i * 2654435761u ^ seed;
}

static bool check(const void *p, size_t size, uint32_t seed)
{
        const uint32_t *w = p;
        for (size_t i = 0; i < size / sizeof(*w); i++)
                if (w[i] != ((uint32_t)i * 2654435761u ^ seed))
                        return false;
        return true;
}

/* An fd travels as SCM_RIGHTS ancillary data, with one byte of payload: the message and its room. */
typedef struct FdMsg {
        char byte;
        struct iovec iov;
        _Alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
        struct msghdr msg;
} FdMsg;

static struct msghdr *fd_msg(FdMsg *m)
{
        memset(m, 0, sizeof(*m));
        m->byte = 'F';
        m->iov = (struct iovec){&m->byte, 1};
        m->msg.msg_iov = &m->iov;
        m->msg.msg_iovlen = 1;
        m->msg.msg_control = m->cbuf;
        m->msg.msg_controllen = sizeof(m->cbuf);
        return &m->msg;
}

static int send_fd(int sock, int fd)
{
        FdMsg m;
        struct msghdr *msg = fd_msg(&m);
        struct cmsghdr *cm = CMSG_FIRSTHDR(msg);

        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        return sendmsg(sock, msg, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

static int recv_fd(int sock, int *ret_fd)
{
        FdMsg m;
        struct msghdr *msg = fd_msg(&m);
        ssize_t n = recvmsg(sock, msg, MSG_CMSG_CLOEXEC);
        struct cmsghdr *cm;

        if (n < 0)
                return -errno;
        cm = CMSG_FIRSTHDR(msg);
        if (n != 1 || !cm || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(sizeof(int)))
                return -EPROTO;
        memcpy(ret_fd, CMSG_DATA(cm), sizeof(int));
        return 0;
}

/* One byte of "your turn" between the two processes. */
static int signal_peer(int sock, char what)
{
        return write(sock, &what, 1) == 1 ? 0 : -EPIPE;
}

static int wait_peer(int sock, char want)
{
        char got;
        return read(sock, &got, 1) == 1 && got == want ? 0 : -EPIPE;
}

/* A client of @who's own ("share-buffer child" to the daemon) and the two GPUs it uses: 0, or 1 after
 * saying which step failed. */
static int start(const char *who, gm_client **ret_c, uint32_t *gpus)
{
        char name[32];
        int r;

        snprintf(name, sizeof(name), "share-buffer %s", who);
        r = gm_client_connect(NULL, name, ret_c);
        if (r < 0)
                return fail(NULL, who, "connect", r);
        r = example_gpus(*ret_c, gpus, 2);
        return r < 0 ? fail(*ret_c, who, "topology", r) : 0;
}

/* The child: a client of its own, which knows nothing of the buffer but the fd it is sent. */
static int child(int sock)
{
        const char *who = "child";
        gm_client *c = NULL;
        gm_handle handle = 0;
        uint32_t gpus[2];
        size_t size = 0;
        void *va = NULL;
        int fd = -1, r;

        if (start(who, &c, gpus))
                return 1;
        r = recv_fd(sock, &fd);
        if (r < 0)
                return fail(NULL, who, "receive the fd", r);
        printf("child: received fd %d from the parent\n", fd);

        /* import on another GPU than the one the memory lives on: it reaches it over XGMI or PCIe */
        r = gm_mem_import(c, fd, gpus[1], &handle, &size);
        close(fd); /* the daemon holds the buffer now; the fd is not needed any more */
        if (r < 0)
                return fail(c, who, "gm_mem_import", r);
        printf("child: imported %zu bytes on GPU %u\n", size, gpus[1]);

        /* an import is a VMM handle: give it an address, then grant access to it */
        r = gm_mem_address_reserve(c, size, 0, NULL, 0, &va);
        if (r < 0)
                return fail(c, who, "gm_mem_address_reserve", r);
        r = gm_mem_map(c, va, size, 0, handle);
        if (r < 0)
                return fail(c, who, "gm_mem_map", r);
        gm_access_desc access[2] = {{gpus[1], GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
        r = gm_mem_set_access(c, va, size, access, 2);
        if (r < 0)
                return fail(c, who, "gm_mem_set_access", r);
        printf("child: mapped it at %p for GPU %u and the CPU\n", va, gpus[1]);

        if (!check(va, size, 0xC0FFEE)) {
                fprintf(stderr, "child: the parent's pattern is not there\n");
                return 1;
        }
        printf("child: pattern verified\n");
        fill(va, size, 0xBEEF);
        printf("child: wrote the reply pattern\n");
        r = signal_peer(sock, 'w');
        if (r < 0 || (r = wait_peer(sock, 'k')) < 0)
                return fail(NULL, who, "talk to the parent", r);

        /* take it apart in reverse order; closing the client alone would also free everything */
        r = gm_mem_unmap(c, va, size);
        if (r < 0)
                return fail(c, who, "gm_mem_unmap", r);
        r = gm_mem_release(c, handle);
        if (r < 0)
                return fail(c, who, "gm_mem_release", r);
        r = gm_mem_address_free(c, va, size);
        if (r < 0)
                return fail(c, who, "gm_mem_address_free", r);
        gm_client_close(c);
        printf("child: done\n");
        return 0;
}

static int parent(int sock, pid_t pid)
{
        const char *who = "parent";
        gm_pointer_attributes attr = {.struct_size = sizeof(attr)};
        gm_client *c = NULL;
        uint32_t gpus[2];
        size_t size = 0;
        void *p = NULL;
        int fd = -1, r, status;

        if (start(who, &c, gpus))
                return 1;

        /* host-visible: the library maps the VRAM into this process at the returned address */
        r = gm_malloc(c, SIZE, gpus[0], GM_MEM_HOST_VISIBLE, &p);
        if (r < 0)
                return fail(c, who, "gm_malloc", r);
        printf("parent: allocated %u MiB of host-visible VRAM on GPU %u at %p\n", SIZE >> 20, gpus[0], p);
        fill(p, SIZE, 0xC0FFEE);
        printf("parent: wrote the pattern\n");

        /* the allocation's handle names it for export */
        r = gm_pointer_get_attributes(c, p, &attr);
        if (r < 0)
                return fail(c, who, "gm_pointer_get_attributes", r);
        r = gm_mem_export(c, attr.handle, &fd, &size);
        if (r < 0)
                return fail(c, who, "gm_mem_export", r);
        printf("parent: exported it as fd %d (%zu bytes)\n", fd, size);
        r = send_fd(sock, fd);
        close(fd); /* the child has its own reference now */
        if (r < 0)
                return fail(NULL, who, "send the fd", r);

        r = wait_peer(sock, 'w');
        if (r < 0)
                return fail(NULL, who, "wait for the child", r);
        if (!check(p, SIZE, 0xBEEF)) {
                fprintf(stderr, "parent: the child's reply is not there\n");
                return 1;
        }
        printf("parent: reply verified: the child's writes are in this process's buffer\n");
        r = signal_peer(sock, 'k');
        if (r < 0)
                return fail(NULL, who, "talk to the child", r);
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "parent: the child failed\n");
                return 1;
        }
        r = gm_mem_free(c, p);
        if (r < 0)
                return fail(c, who, "gm_mem_free", r);
        gm_client_close(c);
        printf("parent: done\n");
        return 0;
}

int main(void)
{
        int sv[2], r;
        pid_t pid;

        setvbuf(stdout, NULL, _IOLBF, 0); /* the two processes' lines interleave in the order they happen */
        /* connect only after fork: a gm_client belongs to the process that opened it */
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
                perror("share-buffer: socketpair");
                return EXIT_FAILURE;
        }
        pid = fork();
        if (pid < 0) {
                perror("share-buffer: fork");
                return EXIT_FAILURE;
        }
        if (pid == 0) {
                close(sv[0]);
                r = child(sv[1]);
                fflush(stdout);
                _exit(r);
        }
        close(sv[1]);
        r = parent(sv[0], pid);
        if (r != 0) {
                close(sv[0]); /* the child sees EOF and stops */
                (void)waitpid(pid, NULL, 0);
        }
        return r == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
