/* The gpumemd backend of the KFD interposition layer: /dev/kfd and the render nodes served by the daemon. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <drm.h>

#include "backend.h"
#include "config.h"
#include "fd-table.h"
#include "fork-pages.h"
#include "gpumem-client.h"
#include "kfd-ioctls.h"
#include "model-clock.h"
#include "svm-book.h"
#include "registered.h"
#include "swap.h"
#include "topology-dir.h"

/*
 * One connection per process, made at the layer's start: the process's KFD is its connection's context in
 * the daemon. Every ioctl is turned into the daemon's own operations (memory by its kind and flags, at the
 * address libhsakmt chose in the client's window); no ioctl's bytes or pointers travel.
 *
 * What this backend serves so far: the process-level ioctls (version, apertures, ACQUIRE_VM, memory
 * policy, clock counters, XNACK mode, available memory, the debugger's probe), memory (VRAM and GTT BOs,
 * registration of pages inside the window, substituted by memory the daemon shares, GPU mapping and CPU
 * mapping at the same address), events (kept by the daemon, waits answered by it, GPU interrupts
 * relayed by it) and queues (run by the daemon in the process's own context, their rings and pointers in
 * memory both share; the doorbells and the MMIO-remap page are pages of the process's own, below) and SVM
 * ranges (their pages substituted by the daemon's memory at their own address, their attributes kept
 * here). Anything else answers -EOPNOTSUPP and logs its name once (docs/rocm-in-containers.md).
 */

#define MAX_GPUS 64
#define PAGE     4096ull
/* A process's doorbells on one GPU: 1024 queues of 8-byte doorbells (SOC15) */
#define DOORBELL_SLICE     8192ull
#define MMAP_TYPE_MASK     (3ull << 62)
#define MMAP_TYPE_DOORBELL (3ull << 62)
#define MMAP_TYPE_RESERVED (1ull << 62)
/* GPU apertures of gfx9 and later as KFD reports them (the window is the GPUVM one). */
#define LDS_BASE     (1ull << 48)
#define SCRATCH_BASE (2ull << 48)

typedef struct Bo {
        uint64_t handle; /* gpu_id << 32 | index, as KFD makes them */
        uint64_t va, size;
        uint64_t cpu_va; /* registered pages: where the process has them (va: where the GPUs do) */
        uint64_t kept;   /* and where their own pages wait to come back (swap.c), 0 if nowhere */
        uint64_t mmap_offset;
        uint32_t gpu_id;
        uint32_t kfd_flags;
        bool userptr;
        bool doorbell;      /* the process's doorbell slice: its own pages, the daemon has none (below) */
        bool mmio;          /* the MMIO-remap page: the same */
        bool host;          /* the CPU can map it (GTT, host-visible VRAM, registered pages) */
        uint64_t mapped;    /* bit per GPU index: mapped through MAP_MEMORY_TO_GPU */
        uint64_t in_daemon; /* bit per GPU index: mapped there in the daemon (the allocation maps its own) */
} Bo;

static struct {
        pthread_mutex_t lock;
        gm_client *c;
        const PreloadHost *host;
        uint64_t window_base, window_size;
        uint32_t kfd_major, kfd_minor;
        char topology_dir[PATH_MAX];
        size_t n_gpus;
        struct {
                uint32_t gpu_id, render_minor;
                int acquired_fd; /* the render fd ACQUIRE_VM took, or -1 */
        } gpus[MAX_GPUS];
        Bo *bos;
        size_t n_bos, cap_bos;
        uint32_t next_bo;
        uint64_t unserved_said;               /* bit per ioctl number already logged as not served */
        uint64_t event_page, event_page_size; /* the GTT BO named at the first CREATE_EVENT */
        size_t n_queues;                      /* made through CREATE_QUEUE, not destroyed yet (atomic) */
        /* SVM: the ranges whose pages are the daemon's now (each a GTT buffer at its own address), and their
         * attributes as KFD would report them */
        struct SvmPages {
                uint64_t va, size;
                uint64_t unmapped; /* pages of it the process unmapped so far */
        } * svm_pages;
        size_t n_svm_pages, cap_svm_pages;
        SvmBook svm;
        /* around each SVM call and each unmapping of a substituted range, held across the daemon's calls so
         * that two threads never substitute the same pages (recursive: a free's own munmap comes back) */
        pthread_mutex_t svm_lock;
        /* held shared while registered pages are the daemon's memory but not (or no longer) among kb.bos, and
         * exclusively by fork(): it finds every such range listed, to make it private for the child */
        pthread_rwlock_t fork_lock;
        uint64_t parent_base, parent_size; /* in a child: its parent's window (still reserved here) */
        pid_t owner;                       /* the process the connection and the topology directory are of */
        bool once;                         /* the fork handlers are installed */
} kb = {.lock = PTHREAD_MUTEX_INITIALIZER,
        .svm_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP,
        .fork_lock = PTHREAD_RWLOCK_INITIALIZER};

static void say(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(int level, const char *fmt, ...)
{
        char msg[512];
        va_list ap;

        if (!kb.host)
                return;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        kb.host->log(kb.host->ctx, level, msg);
}

static int gpu_index(uint32_t gpu_id)
{
        for (size_t i = 0; i < kb.n_gpus; i++)
                if (kb.gpus[i].gpu_id == gpu_id)
                        return (int)i;
        return -1;
}

/* ---- start: connection, window, topology ------------------------------------------------------------- */

__attribute__((destructor)) static void remove_topology(void)
{
        /* a forked child's exit leaves its parent's directory alone */
        if (kb.topology_dir[0] && getpid() == kb.owner)
                topology_dir_remove(kb.topology_dir);
}

/*
 * fork(). As on the kernel, a child does not inherit its parent's KFD: the connection is the parent's, and
 * frames of two processes on one socket would mix. The child's ioctls and mmaps on the inherited fds fail
 * with -EBADF; its next open of /dev/kfd or of the topology starts it again (the layer calls b_start once
 * more), with a connection, a window and a topology directory of its own. The parent's memory in the
 * window (libhsakmt's BOs, mapped MADV_DONTFORK on the kernel) is not the child's: the window is a bare
 * reservation there. Registered pages and SVM ranges outside it are the child's copies (fork-pages.h).
 * The locks are taken in their order, so no thread is half-way through anything the fork looks at.
 */
static void before_fork(void)
{
        int failed = 0;

        pthread_rwlock_wrlock(&kb.fork_lock);
        pthread_mutex_lock(&kb.svm_lock);
        pthread_mutex_lock(&kb.lock);
        for (size_t i = 0; i < kb.n_bos; i++)
                if (kb.bos[i].userptr && kb.bos[i].cpu_va != kb.bos[i].va)
                        failed += fork_pages_add(kb.bos[i].cpu_va, kb.bos[i].size, kb.bos[i].va);
        for (size_t i = 0; i < kb.n_svm_pages; i++)
                failed += fork_pages_add(kb.svm_pages[i].va, kb.svm_pages[i].size, kb.svm_pages[i].va);
        /* the ranges stay as listed (fork_lock, svm_lock); kb.lock is let go of meanwhile, since a failed
         * swap's munmap comes back to b_munmap, which takes it */
        pthread_mutex_unlock(&kb.lock);
        failed += fork_pages_private();
        if (failed)
                say(0, "fork: the child shares %d ranges of registered pages with its parent", failed);
        pthread_mutex_lock(&kb.lock);
}

static void after_fork_in_parent(void)
{
        int failed;

        pthread_mutex_unlock(&kb.lock); /* (as in before_fork) */
        failed = fork_pages_shared_again();
        if (failed)
                say(0, "fork: %d ranges of registered pages are no longer the GPUs' memory", failed);
        pthread_mutex_unlock(&kb.svm_lock);
        pthread_rwlock_unlock(&kb.fork_lock);
}

/* The locks were taken before the fork, so no other thread of the parent held them half-way; this is the
 * child's only thread, so they are let go of first (a failed swap's munmap comes back to b_munmap). */
static void after_fork_in_child(void)
{
        gm_client *parents = kb.c;
        pthread_mutexattr_t ma;

        /* made anew rather than unlocked: the recursive mutex and the rwlock know their holder by its thread
         * id, which is another in the child */
        pthread_mutex_init(&kb.lock, NULL);
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&kb.svm_lock, &ma);
        pthread_mutexattr_destroy(&ma);
        pthread_rwlock_init(&kb.fork_lock, NULL);
        swap_after_fork_in_child();
        if (fork_pages_in_child())
                say(0, "fork: the child shares ranges of registered pages with its parent");
        /* the window: a reservation again, in which none of the parent's memory is mapped */
        if (kb.window_size)
                (void)syscall(SYS_mmap, (void *)(uintptr_t)kb.window_base, kb.window_size, PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        /* the child's copy of the socket is closed and nothing is said to the daemon: the connection, and all
         * it holds there, stay the parent's. No SVM range is known any more, so that no unmapping asks the
         * daemon to free one; the window stays reserved (the client's unmapping of it comes to b_munmap). */
        kb.c = NULL;
        kb.n_svm_pages = 0;
        svm_book_free(&kb.svm);
        if (parents)
                gm_client_close(parents);
        kb.parent_base = kb.window_base;
        kb.parent_size = kb.window_size;
        kb.window_base = kb.window_size = 0;
        /* the old pages kept for the parent's deregistrations: of no use here */
        for (size_t i = 0; i < kb.n_bos; i++)
                swap_drop_kept(kb.bos[i].kept, kb.bos[i].size);
        kb.n_bos = 0;
        kb.next_bo = 0;
        kb.event_page = kb.event_page_size = 0;
        kb.n_gpus = 0;
        /* the parent's: its exit removes it */
        kb.topology_dir[0] = '\0';
        fd_table_after_fork_in_child();
}

/* The daemon's topology as a directory of this process's, which the layer serves in place of sysfs. */
static int make_topology(char *msg, size_t msglen)
{
        gm_topology_file *files = NULL;
        gm_topology *t = NULL;
        size_t n = 0;
        int r;

        r = gm_topology_files(kb.c, &files, &n);
        if (r < 0) {
                gm_strerror(kb.c, r, msg, msglen);
                return r;
        }
        r = topology_dir_make(kb.topology_dir, sizeof(kb.topology_dir), files, n, msg, msglen);
        gm_topology_files_free(files, n);
        if (r < 0)
                return r;
        r = gm_topology_get(kb.c, false, &t);
        if (r < 0) {
                gm_strerror(kb.c, r, msg, msglen);
                return r;
        }
        for (size_t i = 0; i < t->n_nodes && kb.n_gpus < MAX_GPUS; i++)
                if (t->nodes[i].is_gpu) {
                        kb.gpus[kb.n_gpus].gpu_id = t->nodes[i].gpu_id;
                        kb.gpus[kb.n_gpus].render_minor = t->nodes[i].drm_render_minor;
                        kb.gpus[kb.n_gpus].acquired_fd = -1;
                        kb.n_gpus++;
                }
        gm_topology_free(t);
        return 0;
}

static const ThunkSeamOps broker_ops;

static int b_start(const PreloadHost *host, ThunkSeam *ret_seam, char *topology_dir, size_t len, char *msg,
                   size_t msglen)
{
        const char *sock = getenv("GPUMEM_SOCKET");
        char name[64] = "", err[400] = "";
        gm_client_options o = {.struct_size = sizeof(o), .low_window = true};
        int r, fd;

        kb.host = host;
        kb.owner = getpid();
        /* once: not again in a child */
        if (!kb.once)
                kb.once = pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) == 0;
        if (!sock || !*sock)
                sock = GPUMEMD_SOCKET_DEFAULT;
        fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
                ssize_t n = read(fd, name, sizeof(name) - 1);
                name[n > 0 ? n : 0] = '\0';
                name[strcspn(name, "\n")] = '\0';
                close(fd);
        }
        o.socket_path = sock;
        o.name = name;
        r = gm_client_open_with(&o, &kb.c, err, sizeof(err));
        if (r < 0) {
                snprintf(msg, msglen, "cannot reach gpumemd at %s (set GPUMEM_SOCKET): %s", sock, err);
                return r;
        }
        gm_client_window(kb.c, &kb.window_base, &kb.window_size);
        gm_client_kfd_version(kb.c, &kb.kfd_major, &kb.kfd_minor);
        r = make_topology(err, sizeof(err));
        if (r < 0) {
                snprintf(msg, msglen, "gpumemd at %s: %s", sock, err);
                gm_client_close(kb.c);
                kb.c = NULL;
                return r;
        }
        *ret_seam = (ThunkSeam){.ops = &broker_ops};
        snprintf(topology_dir, len, "%s", kb.topology_dir);
        snprintf(msg, msglen, "gpumemd at %s: client %llu, window 0x%llx+0x%llx, %zu GPUs", sock,
                 (unsigned long long)gm_client_id(kb.c), (unsigned long long)kb.window_base,
                 (unsigned long long)kb.window_size, kb.n_gpus);
        return 0;
}

/* ---- device fds ---------------------------------------------------------------------------------------- */

static int b_open_kfd(void *impl, int *ret_fd)
{
        return fd_table_open(FD_KFD, 0, ret_fd);
}

static int b_open_render(void *impl, uint32_t minor, int *ret_fd)
{
        for (size_t i = 0; i < kb.n_gpus; i++)
                if (kb.gpus[i].render_minor == minor)
                        return fd_table_open(FD_RENDER, minor, ret_fd);
        return -ENOENT;
}

static int b_close(void *impl, int fd)
{
        pthread_mutex_lock(&kb.lock);
        if (fd_table_forget(fd))
                for (size_t g = 0; g < kb.n_gpus; g++)
                        if (kb.gpus[g].acquired_fd == fd)
                                kb.gpus[g].acquired_fd = -1;
        pthread_mutex_unlock(&kb.lock);
        return syscall(SYS_close, fd) < 0 ? -errno : 0;
}

/* ---- process-level ioctls ------------------------------------------------------------------------------ */

static void fill_apertures(size_t g, struct kfd_process_device_apertures *ap)
{
        memset(ap, 0, sizeof(*ap));
        ap->gpu_id = kb.gpus[g].gpu_id;
        ap->lds_base = LDS_BASE;
        ap->lds_limit = LDS_BASE | 0xFFFFFFFFull;
        ap->scratch_base = SCRATCH_BASE;
        ap->scratch_limit = SCRATCH_BASE | 0xFFFFFFFFull;
        /* the client's window: every address the daemon and libhsakmt place lies there */
        ap->gpuvm_base = kb.window_base;
        ap->gpuvm_limit = kb.window_base + kb.window_size - 1;
}

static int get_apertures_new(void *arg, unsigned long request)
{
        struct kfd_ioctl_get_process_apertures_new_args *a = arg;
        struct kfd_process_device_apertures *out =
                (struct kfd_process_device_apertures *)(uintptr_t)a->kfd_process_device_apertures_ptr;
        size_t n = kb.n_gpus;

        if (a->num_of_nodes == 0) { /* how many: the caller sizes its array */
                a->num_of_nodes = (uint32_t)n;
                return 0;
        }
        if (!out)
                return -EFAULT;
        if (n > a->num_of_nodes)
                n = a->num_of_nodes;
        for (size_t g = 0; g < n; g++)
                fill_apertures(g, &out[g]);
        a->num_of_nodes = (uint32_t)n;
        return 0;
}

static int get_apertures(void *arg, unsigned long request)
{
        struct kfd_ioctl_get_process_apertures_args *a = arg;
        size_t n = kb.n_gpus < NUM_OF_SUPPORTED_GPUS ? kb.n_gpus : NUM_OF_SUPPORTED_GPUS;

        for (size_t g = 0; g < n; g++)
                fill_apertures(g, &a->process_apertures[g]);
        a->num_of_nodes = (uint32_t)n;
        return 0;
}

static int acquire_vm(void *arg, unsigned long request)
{
        const struct kfd_ioctl_acquire_vm_args *a = arg;
        int g = gpu_index(a->gpu_id), r = 0;
        FdKind kind = 0;
        uint32_t minor = 0;

        if (g < 0)
                return -EINVAL;
        pthread_mutex_lock(&kb.lock);
        if (fd_table_find((int)a->drm_fd, &kind, &minor) < 0 || kind != FD_RENDER ||
            minor != kb.gpus[g].render_minor)
                r = -EINVAL; /* not a render node of that GPU */
        else if (kb.gpus[g].acquired_fd >= 0 && kb.gpus[g].acquired_fd != (int)a->drm_fd)
                r = -EBUSY; /* the VM was acquired through another file */
        else
                kb.gpus[g].acquired_fd = (int)a->drm_fd;
        pthread_mutex_unlock(&kb.lock);
        return r;
}

static int set_memory_policy(void *arg, unsigned long request)
{
        const struct kfd_ioctl_set_memory_policy_args *a = arg;
        if (gpu_index(a->gpu_id) < 0)
                return -EINVAL;
        if ((a->default_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
             a->default_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT) ||
            (a->alternate_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
             a->alternate_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT))
                return -EINVAL;
        /* the policy applies to the process's queues, which are not served through gpumemd yet */
        return 0;
}

static uint64_t clock_ns(clockid_t id)
{
        struct timespec ts;

        clock_gettime(id, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int clock_counters(void *arg, unsigned long request)
{
        struct kfd_ioctl_get_clock_counters_args *a = arg;
        if (gpu_index(a->gpu_id) < 0)
                return -EINVAL;
        /* the GPU's counter as the model's engines in the daemon write it into timestamps (one host, one
         * clock); a daemon on the kernel's KFD would have to ask the GPU, which the protocol cannot yet */
        a->gpu_clock_counter = model_gpu_clock_now();
        a->cpu_clock_counter = clock_ns(CLOCK_MONOTONIC_RAW);
        a->system_clock_counter = clock_ns(CLOCK_BOOTTIME);
        a->system_clock_freq = 1000000000ull;
        return 0;
}

static int xnack_mode(void *arg, unsigned long request)
{
        struct kfd_ioctl_set_xnack_mode_args *a = arg;
        if (a->xnack_enabled < 0) { /* a query */
                a->xnack_enabled = 0;
                return 0;
        }
        /* KFD refuses any change, even to the mode in force, while the process has queues */
        if (__atomic_load_n(&kb.n_queues, __ATOMIC_ACQUIRE))
                return -EBUSY;
        /* retry faults would need the client's context in the daemon switched too: not served */
        return a->xnack_enabled == 0 ? 0 : -EPERM;
}

static int available_memory(void *arg, unsigned long request)
{
        struct kfd_ioctl_get_available_memory_args *a = arg;
        size_t free_bytes = 0, total = 0;
        int r;

        if (gpu_index(a->gpu_id) < 0)
                return -EINVAL;
        r = gm_mem_get_info(kb.c, a->gpu_id, &free_bytes, &total);
        if (r < 0)
                return r;
        a->available = free_bytes;
        return 0;
}

/* ---- memory -------------------------------------------------------------------------------------------- */

/* Under kb.lock. */
static int bo_add(const Bo *bo)
{
        if (kb.n_bos == kb.cap_bos) {
                size_t cap = kb.cap_bos ? kb.cap_bos * 2 : 64;
                Bo *more = realloc(kb.bos, cap * sizeof(*more));
                if (!more)
                        return -ENOMEM;
                kb.bos = more;
                kb.cap_bos = cap;
        }
        kb.bos[kb.n_bos++] = *bo;
        return 0;
}

/* Under kb.lock. */
static Bo *bo_find(uint64_t handle)
{
        for (size_t i = 0; i < kb.n_bos; i++)
                if (kb.bos[i].handle == handle)
                        return &kb.bos[i];
        return NULL;
}

static unsigned gm_flags_of(uint32_t k)
{
        unsigned f = 0;

        if (k & KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC)
                f |= GM_MEM_HOST_VISIBLE;
        if (k & KFD_IOC_ALLOC_MEM_FLAGS_COHERENT)
                f |= GM_MEM_COHERENT;
        if (k & KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED)
                f |= GM_MEM_UNCACHED;
        if (k & KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE)
                f |= GM_MEM_EXECUTABLE;
        if (k & KFD_IOC_ALLOC_MEM_FLAGS_CONTIGUOUS)
                f |= GM_MEM_CONTIGUOUS;
        if ((k & KFD_IOC_ALLOC_MEM_FLAGS_EXT_COHERENT) && (k & KFD_IOC_ALLOC_MEM_FLAGS_COHERENT))
                f |= GM_MEM_EXT_COHERENT;
        if (!(k & KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE))
                f |= GM_MEM_READ_ONLY;
        return f;
}

static bool in_window(uint64_t va, uint64_t size)
{
        return size && va >= kb.window_base && size <= kb.window_size &&
               va - kb.window_base <= kb.window_size - size;
}

static int alloc_memory(void *arg, unsigned long request)
{
        struct kfd_ioctl_alloc_memory_of_gpu_args *a = arg;
        uint32_t k = a->flags;
        unsigned flags = gm_flags_of(k);
        Bo bo = {.va = a->va_addr, .size = a->size, .gpu_id = a->gpu_id, .kfd_flags = k};
        int g = gpu_index(a->gpu_id), r;
        bool fork_held = false;
        void *p = NULL;

        if (g < 0)
                return -EINVAL;
        if (a->size == 0 || a->size % PAGE || a->va_addr % PAGE)
                return -EINVAL;
        if (!in_window(a->va_addr, a->size))
                return -EINVAL; /* libhsakmt places every BO in its GPUVM aperture, the window */
        if ((k & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP) && !(k & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)) {
                /*
                 * The page of the GPU's registers a process may write (the HDP flush): the model keeps the
                 * CPU's and the GPUs' views of memory coherent and has no such register, so the page is the
                 * process's own and its writes reach nobody. (On the kernel path it is an MMIO page of the
                 * daemon's context that no other process may map: the daemon would flush for the client.)
                 */
                if (a->size != PAGE)
                        return -EINVAL;
                bo.mmio = bo.host = true;
                r = 0;
        } else if (k & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL) {
                /*
                 * The doorbell slice. The daemon's engines look at each queue's write pointer, which lives in
                 * memory both share, so a doorbell write carries nothing they need: the slice is pages of
                 * this process's own, mapped when libhsakmt maps the kfd fd at the queue's doorbell offset.
                 * (On the kernel path a doorbell is an MMIO page of the daemon's context that no other
                 * process may map: the daemon would have to ring it for the client.)
                 */
                if (a->size != DOORBELL_SLICE)
                        return -EINVAL;
                bo.doorbell = bo.host = true;
                r = 0;
        } else if (k & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
                uint64_t cpu = a->mmap_offset;

                /* pages elsewhere in the window than their GPU address would take the daemon's room */
                if (cpu % PAGE || cpu == 0 || cpu > UINT64_MAX - a->size ||
                    (cpu != a->va_addr &&
                     (in_window(cpu, a->size) ||
                      (cpu < kb.window_base + kb.window_size && cpu + a->size > kb.window_base))))
                        return -EINVAL;
                /* from the swap until the BO is listed (a fork meanwhile waits) */
                pthread_rwlock_rdlock(&kb.fork_lock);
                fork_held = true;
                r = registered_swap_in(kb.c, kb.host, cpu, a->va_addr, a->size, a->gpu_id, flags, &bo.kept);
                bo.userptr = bo.host = true;
                bo.cpu_va = cpu;
        } else if (k & KFD_IOC_ALLOC_MEM_FLAGS_VRAM) {
                gm_alloc_desc d = {.kind = GM_KIND_DEVICE,
                                   .size = a->size,
                                   .gpu_id = a->gpu_id,
                                   .flags = flags,
                                   .numa_node = -1,
                                   .alignment = PAGE,
                                   .fixed_addr = (void *)(uintptr_t)a->va_addr};
                r = gm_malloc_desc(kb.c, &d, &p);
                bo.host = (k & KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC) != 0;
        } else if (k & KFD_IOC_ALLOC_MEM_FLAGS_GTT) {
                gm_alloc_desc d = {.kind = GM_KIND_HOST,
                                   .size = a->size,
                                   .gpu_id = a->gpu_id,
                                   /* writable for the CPU, which maps it through its dmabuf, whatever
                                    * the GPUs may do */
                                   .flags = (flags & ~(unsigned)(GM_MEM_HOST_VISIBLE | GM_MEM_CONTIGUOUS |
                                                                 GM_MEM_READ_ONLY)) |
                                            GM_MEM_GTT,
                                   .numa_node = -1,
                                   .alignment = PAGE,
                                   .fixed_addr = (void *)(uintptr_t)a->va_addr,
                                   .map_gpus = &a->gpu_id,
                                   .n_map_gpus = 1};
                r = gm_malloc_desc(kb.c, &d, &p);
                bo.host = true;
        } else {
                return -EINVAL;
        }
        if (r < 0) {
                char why[300];
                say(1, "ALLOC 0x%llx+0x%llx: %s", (unsigned long long)a->va_addr, (unsigned long long)a->size,
                    gm_strerror(kb.c, r, why, sizeof(why)));
                if (fork_held)
                        pthread_rwlock_unlock(&kb.fork_lock);
                /* KFD's words for a full device or class */
                return r == -EDQUOT ? -ENOMEM : r;
        }
        /* the daemon mapped the memory on its GPU with the allocation: MAP_MEMORY_TO_GPU there asks nothing
         */
        if (!bo.doorbell && !bo.mmio)
                bo.in_daemon = 1ull << g;
        pthread_mutex_lock(&kb.lock);
        bo.handle = (uint64_t)a->gpu_id << 32 | ++kb.next_bo;
        /* what libhsakmt hands to mmap on the render node: names the BO, nothing else (KFD's reserved mmap
         * type, so that it is never a doorbell's or an MMIO page's); the MMIO page's is KFD's own */
        bo.mmap_offset =
                bo.mmio ? (uint64_t)a->gpu_id << 46 : MMAP_TYPE_RESERVED | (uint64_t)kb.next_bo << 12;
        r = bo_add(&bo);
        pthread_mutex_unlock(&kb.lock);
        if (fork_held)
                pthread_rwlock_unlock(&kb.fork_lock);
        if (r < 0) {
                bool freed;
                if (bo.userptr) /* the process's own pages back first */
                        (void)registered_swap_out(kb.c, kb.host, bo.cpu_va, bo.va, bo.size, &bo.kept, &freed);
                else
                        (void)gm_mem_free(kb.c, (void *)(uintptr_t)a->va_addr);
                return r;
        }
        a->handle = bo.handle;
        if (!bo.userptr)
                a->mmap_offset = bo.mmap_offset;
        return 0;
}

static int free_memory(void *arg, unsigned long request)
{
        const struct kfd_ioctl_free_memory_of_gpu_args *a = arg;
        bool freed;
        Bo bo;
        Bo *b;
        int r;

        /* from the BO's leaving the list until its pages are private again (a fork meanwhile waits) */
        pthread_rwlock_rdlock(&kb.fork_lock);
        pthread_mutex_lock(&kb.lock);
        b = bo_find(a->handle);
        if (!b) {
                pthread_mutex_unlock(&kb.lock);
                pthread_rwlock_unlock(&kb.fork_lock);
                return -EINVAL;
        }
        bo = *b;
        *b = kb.bos[--kb.n_bos];
        /* the event page goes with its BO: no later event's slot is written there */
        if (kb.event_page == bo.va)
                kb.event_page = kb.event_page_size = 0;
        pthread_mutex_unlock(&kb.lock);
        if (bo.doorbell || bo.mmio) {
                /* back to the window's reservation */
                void *p = (void *)syscall(SYS_mmap, (void *)(uintptr_t)bo.va, bo.size, PROT_NONE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
                r = (uintptr_t)p > (uintptr_t)-4096 ? (int)(intptr_t)p : 0;
                freed = true;
        } else if (bo.userptr) {
                r = registered_swap_out(kb.c, kb.host, bo.cpu_va, bo.va, bo.size, &bo.kept, &freed);
        } else {
                r = gm_mem_free(kb.c, (void *)(uintptr_t)bo.va);
                freed = r == 0;
        }
        if (!freed) { /* still the daemon's: keep it known (the array may have grown or moved meanwhile) */
                pthread_mutex_lock(&kb.lock);
                if (bo_add(&bo) < 0)
                        say(0, "out of memory: the BO at 0x%llx is no longer known here",
                            (unsigned long long)bo.va);
                pthread_mutex_unlock(&kb.lock);
        }
        pthread_rwlock_unlock(&kb.fork_lock);
        return r;
}

/* MAP (@map) or UNMAP on the devices of the list from n_success on, as KFD goes through them. */
static int map_memory(uint64_t handle, uint64_t ids_ptr, uint32_t n_devices, uint32_t *n_success, bool map)
{
        const uint32_t *ids = (const uint32_t *)(uintptr_t)ids_ptr;
        uint64_t va, in_daemon;
        bool doorbell;
        Bo *b;
        int r = 0;

        if (!ids || n_devices == 0 || *n_success > n_devices)
                return -EINVAL;
        pthread_mutex_lock(&kb.lock);
        b = bo_find(handle);
        va = b ? b->va : 0;
        doorbell = b && (b->doorbell || b->mmio);
        in_daemon = b ? b->in_daemon : 0;
        pthread_mutex_unlock(&kb.lock);
        if (!b)
                return -EINVAL;
        for (uint32_t i = *n_success; i < n_devices; i++) {
                int g = gpu_index(ids[i]);
                if (g < 0)
                        return -EINVAL;
                /* the doorbell slice and the MMIO page have no GPU side in the daemon (alloc_memory); a GPU
                 * where the daemon has it in the state asked already needs no request */
                if (doorbell || map == ((in_daemon >> g) & 1))
                        r = 0;
                else if (map)
                        r = gm_mem_map_gpus(kb.c, (void *)(uintptr_t)va, &ids[i], 1);
                else
                        r = gm_mem_unmap_gpus(kb.c, (void *)(uintptr_t)va, &ids[i], 1);
                /* already in that state in the daemon: done */
                if (r == -EEXIST || r == -EALREADY || (!map && r == -EINVAL))
                        r = 0;
                if (r < 0)
                        return r;
                in_daemon = map ? in_daemon | 1ull << g : in_daemon & ~(1ull << g);
                pthread_mutex_lock(&kb.lock);
                b = bo_find(handle);
                if (b) {
                        if (map)
                                b->mapped |= 1ull << g;
                        else
                                b->mapped &= ~(1ull << g);
                        b->in_daemon = in_daemon;
                }
                pthread_mutex_unlock(&kb.lock);
                (*n_success)++;
        }
        return 0;
}

/* libhsakmt maps the kfd fd at a queue's doorbell offset over the doorbell BO: pages of this process's. */
static int map_doorbell(void *addr, size_t len, int prot, int flags, int fd, uint64_t offset, void **ret)
{
        uint32_t gpu_id = (uint32_t)((offset >> 46) & 0xffff);
        bool found = false;
        FdKind kind = 0;
        int slot = fd_table_find(fd, &kind, NULL);
        void *p;

        pthread_mutex_lock(&kb.lock);
        for (size_t i = 0; slot == 0 && kind == FD_KFD && i < kb.n_bos; i++)
                if (kb.bos[i].doorbell && kb.bos[i].va == (uint64_t)(uintptr_t)addr &&
                    kb.bos[i].gpu_id == gpu_id)
                        found = true;
        pthread_mutex_unlock(&kb.lock);
        if (slot < 0)
                return -EBADF;
        if (!found || len != DOORBELL_SLICE || !(flags & MAP_FIXED)) {
                say(1, "mmap of the doorbells of GPU %u at %p+0x%zx: only over its doorbell BO", gpu_id, addr,
                    len);
                return -EINVAL;
        }
        p = (void *)syscall(SYS_mmap, addr, len, prot, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if ((uintptr_t)p > (uintptr_t)-4096)
                return (int)(intptr_t)p;
        *ret = p;
        return 0;
}

static int b_mmap(void *impl, void *addr, size_t len, int prot, int flags, int fd, uint64_t offset,
                  void **ret)
{
        uint64_t va = 0, size = 0;
        bool host = false;
        int slot;

        if ((offset & MMAP_TYPE_MASK) == MMAP_TYPE_DOORBELL)
                return map_doorbell(addr, len, prot, flags, fd, offset, ret);
        slot = fd_table_find(fd, NULL, NULL);
        pthread_mutex_lock(&kb.lock);
        for (size_t i = 0; slot >= 0 && i < kb.n_bos; i++)
                if (kb.bos[i].mmap_offset == offset && !kb.bos[i].userptr) {
                        va = kb.bos[i].va;
                        size = kb.bos[i].size;
                        host = kb.bos[i].host;
                }
        pthread_mutex_unlock(&kb.lock);
        if (slot < 0)
                return -EBADF;
        if (!va) {
                say(1, "mmap at offset 0x%llx names no BO served through gpumemd",
                    (unsigned long long)offset);
                return -EINVAL;
        }
        if ((uint64_t)(uintptr_t)addr != va || len > size) {
                say(1, "mmap of the BO at 0x%llx+0x%llx at %p+0x%zx: only at its own address",
                    (unsigned long long)va, (unsigned long long)size, addr, len);
                return -EINVAL;
        }
        if (!host) {
                /* memory the CPU cannot reach: libhsakmt maps it PROT_NONE to hold the range, which the
                 * window's reservation does already */
                if (prot != PROT_NONE)
                        return -EINVAL;
                *ret = addr;
                return 0;
        }
        /* the memory is mapped at its address already (the daemon's file, at alloc): only there */
        if (mprotect(addr, len, prot) < 0)
                return -errno;
        *ret = addr;
        return 0;
}

/* ---- events ------------------------------------------------------------------------------------------- */

/*
 * The process's events are its context's in the daemon. The event page is the GTT BO libhsakmt allocated
 * for it (memory the daemon shares): a signal event's slot there starts unsignalled, as KFD leaves it.
 */
static int create_event(void *arg, unsigned long request)
{
        struct kfd_ioctl_create_event_args *a = arg;
        uint64_t page_va = 0, page_size = 0;
        uint32_t id = 0, slot = 0;
        int r;

        if (a->event_page_offset) {
                Bo *b;
                pthread_mutex_lock(&kb.lock);
                b = bo_find(a->event_page_offset);
                if (b && b->host && !b->userptr) {
                        page_va = b->va;
                        page_size = b->size;
                }
                pthread_mutex_unlock(&kb.lock);
                if (!page_va)
                        return -EINVAL;
        }
        r = gm_event_create(kb.c, a->event_type, a->auto_reset != 0, (void *)(uintptr_t)page_va, &id, &slot);
        if (r < 0)
                return r;
        pthread_mutex_lock(&kb.lock);
        if (page_va) {
                kb.event_page = page_va;
                kb.event_page_size = page_size;
        }
        if (a->event_type == KFD_IOC_EVENT_SIGNAL && kb.event_page && 8ull * slot < kb.event_page_size)
                __atomic_store_n((uint64_t *)(uintptr_t)(kb.event_page + 8ull * slot), ~0ull,
                                 __ATOMIC_RELEASE);
        pthread_mutex_unlock(&kb.lock);
        a->event_id = id;
        a->event_trigger_data = id;
        if (a->event_type == KFD_IOC_EVENT_SIGNAL) {
                a->event_slot_index = slot;
                a->event_page_offset = THUNK_KFD_MMAP_TYPE_EVENTS;
        }
        return 0;
}

static int wait_events(void *arg, unsigned long request)
{
        struct kfd_ioctl_wait_events_args *a = arg;
        struct kfd_event_data *ev = (struct kfd_event_data *)(uintptr_t)a->events_ptr;
        gm_memory_exception exc[8];
        uint32_t ids[256];
        size_t n_exc = 0;
        int r;

        if (a->num_events == 0 || a->num_events > 256)
                return -EINVAL;
        if (!ev)
                return -EFAULT;
        for (uint32_t i = 0; i < a->num_events; i++)
                ids[i] = ev[i].event_id;
        /* the wait is the daemon's: it answers when an event comes, other calls going on meanwhile */
        r = gm_event_wait_faults(kb.c, ids, a->num_events, a->wait_for_all != 0, a->timeout, exc, 8, &n_exc);
        /* the daemon's limit of pending waits: not an EAGAIN, which libhsakmt would retry at once */
        if (r == -EAGAIN)
                return -ENOMEM;
        if (r < 0)
                return r;
        a->wait_result = (uint32_t)r;
        /* as KFD copies out a memory event's fault into its entry */
        for (size_t k = 0; k < n_exc; k++)
                for (uint32_t i = 0; i < a->num_events; i++)
                        if (ev[i].event_id == exc[k].event_id) {
                                struct kfd_hsa_memory_exception_data *m = &ev[i].memory_exception_data;
                                memset(m, 0, sizeof(*m));
                                m->gpu_id = exc[k].gpu_id;
                                m->va = exc[k].va;
                                m->failure.NotPresent = exc[k].not_present;
                                m->failure.ReadOnly = exc[k].read_only;
                                m->failure.NoExecute = exc[k].no_execute;
                        }
        return 0;
}

/* The GPU's tiling as the daemon's driver reports it, into the caller's arrays as far as they go. */
static int tile_config(void *arg, unsigned long request)
{
        struct kfd_ioctl_get_tile_config_args *a = arg;
        gm_tile_config t;
        int r;

        if (gpu_index(a->gpu_id) < 0)
                return -EINVAL;
        r = gm_tile_config_get(kb.c, a->gpu_id, &t);
        if (r < 0)
                return r;
        a->gb_addr_config = t.gb_addr_config;
        a->num_banks = t.num_banks;
        a->num_ranks = t.num_ranks;
        if (a->num_tile_configs > t.n_tile)
                a->num_tile_configs = t.n_tile;
        if (a->num_macro_tile_configs > t.n_macro)
                a->num_macro_tile_configs = t.n_macro;
        if ((a->num_tile_configs && !a->tile_config_ptr) ||
            (a->num_macro_tile_configs && !a->macro_tile_config_ptr))
                return -EFAULT;
        if (a->num_tile_configs)
                memcpy((void *)(uintptr_t)a->tile_config_ptr, t.tile, a->num_tile_configs * sizeof(uint32_t));
        if (a->num_macro_tile_configs)
                memcpy((void *)(uintptr_t)a->macro_tile_config_ptr, t.macro,
                       a->num_macro_tile_configs * sizeof(uint32_t));
        return 0;
}

/* What the process's queues would run with: recorded by KFD per device; checked here, and kept for the
 * queues, which are not served through gpumemd yet. */
static int queue_setting(uint32_t gpu_id)
{
        return gpu_index(gpu_id) < 0 ? -EINVAL : 0;
}

/* ---- the window --------------------------------------------------------------------------------------- */

static bool range_in_window(const void *addr, size_t len)
{
        return in_window((uint64_t)(uintptr_t)addr, len);
}

/*
 * libhsakmt reserves its GPUVM aperture itself, asking for the window's address without MAP_FIXED: the
 * library reserved the window already, so the kernel would place it elsewhere. The reservation is handed
 * over instead (the same kind of mapping, made over it).
 */
static int b_mmap_anon(void *addr, size_t len, int prot, int flags, void **ret)
{
        uint64_t a = (uint64_t)(uintptr_t)addr;
        void *p;

        if (flags & MAP_FIXED) {
                /*
                 * In a forked child, libhsakmt keeps its parent's GPUVM aperture when it can map it again
                 * (on the kernel, the child's GPU VM is a whole address space of its own). Through gpumemd
                 * the child's GPU addresses are its own window, elsewhere: the parent's stays its parent's,
                 * and libhsakmt, refused there, takes its aperture from the child's window. (Only such a
                 * reservation is refused: what else lands there once libhsakmt unmapped it is the child's.)
                 */
                if (kb.parent_size && prot == PROT_NONE && (flags & MAP_NORESERVE) &&
                    a < kb.parent_base + kb.parent_size && a + len > kb.parent_base)
                        return -ENOMEM;
                return 0;
        }
        if (!range_in_window(addr, len))
                return 0;
        p = (void *)syscall(SYS_mmap, addr, len, prot, flags | MAP_FIXED, -1, 0);
        if ((uintptr_t)p > (uintptr_t)-4096)
                return (int)(intptr_t)p;
        *ret = p;
        return 1;
}

/* What the process unmaps inside the window stays reserved: the daemon places memory there, and nothing
 * else of the process's may land in it meanwhile. */
static void svm_unmapped(uint64_t va, uint64_t len);

static int b_munmap(void *addr, size_t len)
{
        void *p;

        if (!range_in_window(addr, len)) {
                if (len)
                        svm_unmapped((uint64_t)(uintptr_t)addr, (uint64_t)len);
                return 0;
        }
        p = (void *)syscall(SYS_mmap, addr, len, PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        return (uintptr_t)p > (uintptr_t)-4096 ? (int)(intptr_t)p : 1;
}

/* ---- SVM ----------------------------------------------------------------------------------------------- */

/*
 * The daemon cannot reach the process's own pages, and a client context takes no SVM call (on the kernel as
 * in the model): a range the process names becomes a GTT buffer of its context at the range's own address
 * (GM_MEM_SVM_RANGE), which takes the place of its pages (what they held copied in), mapped on every GPU of
 * its class; its attributes are kept here, as KFD keeps them. The GPUs reach it whatever its ACCESS says,
 * and nothing migrates (as on the model, whose SVM moves no pages either).
 */

/* The process's pages of [va, va + size) become an SVM range's GTT buffer at the same address, with their
 * bytes (the library maps it there, over them). -EFAULT: not mapped readable throughout. */
static int substitute_range(uint64_t va, uint64_t size)
{
        uint64_t kept;

        return registered_swap_in(kb.c, kb.host, va, va, size, kb.gpus[0].gpu_id,
                                  GM_MEM_COHERENT | GM_MEM_SVM_RANGE, &kept);
}

/* Substitute the pages of [va, va + size) that are not yet: one range at a time, lowest first. */
static int svm_substitute(uint64_t va, uint64_t size)
{
        uint64_t at = va, end = va + size;

        while (at < end) {
                uint64_t stop = end;
                struct SvmPages *p;
                int r;

                pthread_mutex_lock(&kb.lock);
                /* skip what is substituted already; stop before the next substituted range */
                for (bool moved = true; moved && at < end;) {
                        moved = false;
                        for (size_t i = 0; i < kb.n_svm_pages; i++) {
                                p = &kb.svm_pages[i];
                                if (p->va <= at && at < p->va + p->size) {
                                        at = p->va + p->size;
                                        moved = true;
                                }
                        }
                }
                for (size_t i = 0; i < kb.n_svm_pages; i++)
                        if (kb.svm_pages[i].va > at && kb.svm_pages[i].va < stop)
                                stop = kb.svm_pages[i].va;
                if (at < end && kb.n_svm_pages == kb.cap_svm_pages) {
                        size_t cap = kb.cap_svm_pages ? kb.cap_svm_pages * 2 : 16;
                        struct SvmPages *more = realloc(kb.svm_pages, cap * sizeof(*more));
                        if (!more) {
                                pthread_mutex_unlock(&kb.lock);
                                return -ENOMEM;
                        }
                        kb.svm_pages = more;
                        kb.cap_svm_pages = cap;
                }
                pthread_mutex_unlock(&kb.lock);
                if (at >= end)
                        break;
                r = substitute_range(at, stop - at);
                if (r < 0)
                        return r;
                pthread_mutex_lock(&kb.lock);
                kb.svm_pages[kb.n_svm_pages++] = (struct SvmPages){.va = at, .size = stop - at};
                pthread_mutex_unlock(&kb.lock);
                at = stop;
        }
        return 0;
}

static int svm_call(struct kfd_ioctl_svm_args *a, unsigned long request);

static int svm_ioctl(void *arg, unsigned long request)
{
        int r;

        pthread_mutex_lock(&kb.svm_lock);
        r = svm_call(arg, request);
        pthread_mutex_unlock(&kb.svm_lock);
        return r;
}

static int svm_call(struct kfd_ioctl_svm_args *a, unsigned long request)
{
        size_t bytes = _IOC_SIZE(request);
        uint64_t first, last;
        int r;

        if (bytes < sizeof(*a) || a->nattr > (bytes - sizeof(*a)) / sizeof(a->attrs[0]))
                return -EINVAL;
        if (a->size == 0 || a->start_addr % PAGE || a->size % PAGE)
                return -EINVAL;
        if (a->start_addr > UINT64_MAX - a->size)
                return -EOVERFLOW;
        if (a->op != KFD_IOCTL_SVM_OP_SET_ATTR && a->op != KFD_IOCTL_SVM_OP_GET_ATTR)
                return -EINVAL;
        /* KFD takes (or reports on) only memory the process has mapped, every page of the range: msync
         * answers ENOMEM for a range with a page that is not */
        if (msync((void *)(uintptr_t)a->start_addr, a->size, MS_ASYNC) < 0)
                return errno == ENOMEM ? -EFAULT : -errno;
        /* the window is libhsakmt's BOs' */
        if (a->start_addr < kb.window_base + kb.window_size && a->start_addr + a->size > kb.window_base)
                return -EADDRINUSE;
        first = a->start_addr / PAGE;
        last = (a->start_addr + a->size) / PAGE - 1;
        if (a->op == KFD_IOCTL_SVM_OP_GET_ATTR) {
                pthread_mutex_lock(&kb.lock);
                r = svm_book_get(&kb.svm, first, last, a->attrs, a->nattr, gpu_index);
                pthread_mutex_unlock(&kb.lock);
                return r;
        }
        {
                /* the attributes first, so that a bad one changes nothing */
                SvmBook scratch = {0};
                r = svm_book_set(&scratch, first, first, a->attrs, a->nattr, gpu_index);
                svm_book_free(&scratch);
                if (r < 0)
                        return r;
        }
        r = svm_substitute(a->start_addr, a->size);
        if (r < 0) {
                char why[300];
                say(1, "SVM range 0x%llx+0x%llx: %s", (unsigned long long)a->start_addr,
                    (unsigned long long)a->size, gm_strerror(kb.c, r, why, sizeof(why)));
                return r == -EDQUOT ? -ENOMEM : r;
        }
        pthread_mutex_lock(&kb.lock);
        r = svm_book_set(&kb.svm, first, last, a->attrs, a->nattr, gpu_index);
        pthread_mutex_unlock(&kb.lock);
        return r;
}

/* Is any page of [lo, hi) mapped in this process? (msync answers ENOMEM for a page that is not.) */
static bool any_page_mapped(uint64_t lo, uint64_t hi)
{
        for (uint64_t p = lo; p < hi; p += PAGE)
                if (msync((void *)(uintptr_t)p, PAGE, MS_ASYNC) == 0)
                        return true;
        return false;
}

/*
 * The process unmaps [va, va + len) outside the window (HIP frees managed memory so): the attributes there
 * go, and each substituted range of which no page stays mapped goes back to the daemon. Called before the
 * unmapping, which the caller then does.
 */
static void svm_unmapped(uint64_t va, uint64_t len)
{
        uint64_t end = va + len;

        pthread_mutex_lock(&kb.svm_lock);
        for (;;) {
                uint64_t free_va = 0;

                pthread_mutex_lock(&kb.lock);
                if (kb.n_svm_pages)
                        (void)svm_book_drop(&kb.svm, va / PAGE, (end - 1) / PAGE);
                for (size_t i = 0; i < kb.n_svm_pages && !free_va; i++) {
                        struct SvmPages *p = &kb.svm_pages[i];
                        uint64_t pend = p->va + p->size;
                        if (p->va >= end || va >= pend)
                                continue;
                        /* what is left of it around the unmapped part */
                        if (any_page_mapped(p->va, va > p->va ? va : p->va) ||
                            any_page_mapped(end < pend ? end : pend, pend))
                                continue;
                        free_va = p->va;
                        *p = kb.svm_pages[--kb.n_svm_pages];
                }
                pthread_mutex_unlock(&kb.lock);
                if (!free_va)
                        break;
                /* the library's own munmap of it comes back here and finds it gone from the list */
                (void)gm_mem_free(kb.c, (void *)(uintptr_t)free_va);
        }
        pthread_mutex_unlock(&kb.svm_lock);
}

/* ---- queues -------------------------------------------------------------------------------------------- */

static int create_queue(void *arg, unsigned long request)
{
        struct kfd_ioctl_create_queue_args *a = arg;
        gm_queue_desc d = {.gpu_id = a->gpu_id,
                           .type = a->queue_type,
                           .percentage = a->queue_percentage,
                           .priority = a->queue_priority,
                           .ring_va = a->ring_base_address,
                           .ring_size = a->ring_size,
                           .rptr_va = a->read_pointer_address,
                           .wptr_va = a->write_pointer_address,
                           .eop_va = a->eop_buffer_address,
                           .eop_size = a->eop_buffer_size,
                           .ctx_save_va = a->ctx_save_restore_address,
                           .ctx_save_size = a->ctx_save_restore_size,
                           .ctl_stack_size = a->ctl_stack_size};
        uint64_t db = 0;
        uint32_t id = 0;
        int r;

        if (gpu_index(a->gpu_id) < 0)
                return -EINVAL;
        r = gm_queue_create(kb.c, &d, &id, &db);
        if (r < 0) {
                char why[300];
                say(1, "CREATE_QUEUE: %s", gm_strerror(kb.c, r, why, sizeof(why)));
                return r == -EDQUOT ? -ENOMEM : r; /* KFD's word for no queue left */
        }
        a->queue_id = id;
        a->doorbell_offset = db;
        __atomic_add_fetch(&kb.n_queues, 1, __ATOMIC_RELEASE);
        return 0;
}

/* ---- dispatch ------------------------------------------------------------------------------------------ */

static int get_version(void *arg, unsigned long request)
{
        struct kfd_ioctl_get_version_args *a = arg;

        a->major_version = kb.kfd_major;
        a->minor_version = kb.kfd_minor;
        return 0;
}

static int map_to_gpu(void *arg, unsigned long request)
{
        struct kfd_ioctl_map_memory_to_gpu_args *a = arg;

        return map_memory(a->handle, a->device_ids_array_ptr, a->n_devices, &a->n_success, true);
}

static int unmap_from_gpu(void *arg, unsigned long request)
{
        struct kfd_ioctl_unmap_memory_from_gpu_args *a = arg;

        return map_memory(a->handle, a->device_ids_array_ptr, a->n_devices, &a->n_success, false);
}

static int destroy_event(void *arg, unsigned long request)
{
        return gm_event_destroy(kb.c, ((struct kfd_ioctl_destroy_event_args *)arg)->event_id);
}

static int set_event(void *arg, unsigned long request)
{
        return gm_event_set(kb.c, ((struct kfd_ioctl_set_event_args *)arg)->event_id);
}

static int reset_event(void *arg, unsigned long request)
{
        return gm_event_reset(kb.c, ((struct kfd_ioctl_reset_event_args *)arg)->event_id);
}

static int destroy_queue(void *arg, unsigned long request)
{
        int r = gm_queue_destroy(kb.c, ((struct kfd_ioctl_destroy_queue_args *)arg)->queue_id);

        if (r == 0) /* (a queue the daemon destroyed was made here) */
                __atomic_sub_fetch(&kb.n_queues, 1, __ATOMIC_RELEASE);
        return r;
}

static int update_queue(void *arg, unsigned long request)
{
        struct kfd_ioctl_update_queue_args *a = arg;

        return gm_queue_update(kb.c, a->queue_id, a->ring_base_address, a->ring_size, a->queue_percentage,
                               a->queue_priority);
}

static int trap_handler(void *arg, unsigned long request)
{
        return queue_setting(((struct kfd_ioctl_set_trap_handler_args *)arg)->gpu_id);
}

static int scratch_backing_va(void *arg, unsigned long request)
{
        return queue_setting(((struct kfd_ioctl_set_scratch_backing_va_args *)arg)->gpu_id);
}

/*
 * What serves each KFD ioctl of the list (kfd-ioctls.h), NULL for one not served through gpumemd (yet).
 * Every entry is named here: one added to the list does not build until this backend says.
 */
#define SERVE_GET_VERSION               get_version
#define SERVE_CREATE_QUEUE              create_queue
#define SERVE_DESTROY_QUEUE             destroy_queue
#define SERVE_SET_MEMORY_POLICY         set_memory_policy
#define SERVE_GET_CLOCK_COUNTERS        clock_counters
#define SERVE_GET_PROCESS_APERTURES     get_apertures
#define SERVE_UPDATE_QUEUE              update_queue
#define SERVE_CREATE_EVENT              create_event
#define SERVE_DESTROY_EVENT             destroy_event
#define SERVE_SET_EVENT                 set_event
#define SERVE_RESET_EVENT               reset_event
#define SERVE_WAIT_EVENTS               wait_events
#define SERVE_DBG_REGISTER              NULL
#define SERVE_DBG_UNREGISTER            NULL
#define SERVE_DBG_ADDRESS_WATCH         NULL
#define SERVE_DBG_WAVE_CONTROL          NULL
#define SERVE_SET_SCRATCH_BACKING_VA    scratch_backing_va
#define SERVE_GET_TILE_CONFIG           tile_config
#define SERVE_SET_TRAP_HANDLER          trap_handler
#define SERVE_GET_PROCESS_APERTURES_NEW get_apertures_new
#define SERVE_ACQUIRE_VM                acquire_vm
#define SERVE_ALLOC_MEMORY_OF_GPU       alloc_memory
#define SERVE_FREE_MEMORY_OF_GPU        free_memory
#define SERVE_MAP_MEMORY_TO_GPU         map_to_gpu
#define SERVE_UNMAP_MEMORY_FROM_GPU     unmap_from_gpu
#define SERVE_SET_CU_MASK               NULL
#define SERVE_GET_QUEUE_WAVE_STATE      NULL
#define SERVE_GET_DMABUF_INFO           NULL
#define SERVE_IMPORT_DMABUF             NULL
#define SERVE_ALLOC_QUEUE_GWS           NULL
#define SERVE_SMI_EVENTS                NULL
#define SERVE_SVM                       svm_ioctl
#define SERVE_SET_XNACK_MODE            xnack_mode
#define SERVE_CRIU_OP                   NULL
#define SERVE_AVAILABLE_MEMORY          available_memory
#define SERVE_EXPORT_DMABUF             NULL
#define SERVE_RUNTIME_ENABLE            NULL
#define SERVE_DBG_TRAP                  NULL
#define SERVE_CREATE_PROCESS            NULL

/* Numbers past 1.11's table (RUNTIME_ENABLE, the debugger's probe, among them) answer -ENOTTY, as a kernel
 * without them does; the ones in it that are not served, -EOPNOTSUPP. */
#define TABLE_MINOR 11

typedef struct KfdRow {
        unsigned long request;
        int (*fn)(void *arg, unsigned long request);
} KfdRow;

#define KFD_ROW(name, req, args, minor) [_IOC_NR(req)] = {req, SERVE_##name},
static const KfdRow kfd_rows[] = {THUNK_KFD_IOCTLS(KFD_ROW)};

static int unserved(unsigned long request)
{
        unsigned nr = _IOC_NR(request);

        pthread_mutex_lock(&kb.lock);
        bool first = nr < 64 && !(kb.unserved_said & (1ull << nr));
        if (nr < 64)
                kb.unserved_said |= 1ull << nr;
        pthread_mutex_unlock(&kb.lock);
        if (first)
                say(0, "KFD ioctl %s (0x%02x) is not served through gpumemd yet", thunk_ioctl_name(request),
                    nr);
        return -EOPNOTSUPP;
}

static int kfd_ioctl(unsigned long request, void *arg)
{
        unsigned nr = _IOC_NR(request);
        int since = thunk_kfd_ioctl_minor(nr);
        const KfdRow *row;

        if (_IOC_TYPE(request) != AMDKFD_IOCTL_BASE || since < 0 || since > TABLE_MINOR)
                return -ENOTTY;
        row = &kfd_rows[nr];
        /* the request the row names, or SVM's with any size: its size is the attributes' too */
        if (row->fn && (request == row->request ||
                        (nr == _IOC_NR(AMDKFD_IOC_SVM) && _IOC_DIR(request) == _IOC_DIR(AMDKFD_IOC_SVM))))
                return row->fn(arg, request);
        return unserved(request);
}

static int b_ioctl(void *impl, int fd, unsigned long request, void *arg)
{
        FdKind kind = 0;

        if (fd_table_find(fd, &kind, NULL) < 0)
                return -EBADF;
        if (!arg)
                return -EFAULT;
        if (kind == FD_KFD)
                return kfd_ioctl(request, arg);
        /* a render node: its VM is the process's context in the daemon, reached through /dev/kfd */
        return _IOC_TYPE(request) == DRM_IOCTL_BASE ? -EINVAL : -ENOTTY;
}

static int b_stats(char *buf, size_t len)
{
        size_t fds = fd_table_count();

        pthread_mutex_lock(&kb.lock);
        int n = snprintf(buf, len, "client=%llu fds=%zu bos=%zu", (unsigned long long)gm_client_id(kb.c), fds,
                         kb.n_bos);
        pthread_mutex_unlock(&kb.lock);
        return n;
}

/* The device calls; the process's unmaps come through b_munmap, whose answers say whether the kernel's
 * munmap follows, so the seam has none. */
static const ThunkSeamOps broker_ops = {
        .name = "gpumemd",
        .open_kfd = b_open_kfd,
        .open_render = b_open_render,
        .ioctl = b_ioctl,
        .mmap = b_mmap,
        .close = b_close,
};

const PreloadBackend preload_backend = {
        .restart_after_fork = true,
        .log_name = "gpumem-kfd",
        .env_prefix = "GPUMEM_KFD_",
        .stats_tag = "gpumem-kfd-stats",
        .start = b_start,
        .mmap_anon = b_mmap_anon,
        .munmap = b_munmap,
        .sigaction = swap_sigaction,
        .stats = b_stats,
};
