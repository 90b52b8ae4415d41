/* Pages of the process swapped for other pages at the same address, with no moment where a write is lost. */
#include "swap.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define PAGE 4096ull
/* the stack the swap runs on: the copy and three system calls, nothing deeper */
#define SWAP_STACK (64ull << 10)
/* pagemap entries read at a time (8 bytes each) */
#define PM_CHUNK        4096
#define PM_PRESENT      (1ull << 63)
#define PM_SWAPPED      (1ull << 62)
#define MAX_FILE_RANGES 64

/*
 * How a swap goes, and why. The pages at [va, va + size) are the process's: its heap around a buffer HIP
 * pins, a .bss array, the caller's own stack. Other threads may write them at any moment, and the caller
 * itself writes its stack. So the copy and the swap run
 *   - on a stack of their own (a ucontext), so that the caller's stack is not written meanwhile;
 *   - with every signal blocked, so that none is delivered on the old pages;
 *   - with the range write-protected: another thread that writes it faults, and the SIGSEGV handler
 *     below holds it until the new pages are in place, then lets the write go again, onto them.
 * Nothing is allocated and no lock is taken between the copy and the swap: a thread held in the handler
 * may hold malloc's lock or any other. Writes by the kernel on behalf of another thread (a read() into
 * the range) fail with EFAULT for as long as the copy takes.
 */
typedef struct FileRange {
        uint64_t start, end; /* part of the range not anonymous memory: unread pages there hold data */
} FileRange;

static struct {
        pthread_mutex_t lock;  /* one swap at a time */
        uint32_t busy;         /* futex word: 1 while [va, va + size) is write-protected */
        uint64_t va, size;     /* the range of the swap under way, or of the last one */
        struct sigaction next; /* the program's handler, which ours calls for faults not of a swap */
        bool installed;        /* atomic once set */
        int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);
        uint8_t *stack;
        ucontext_t caller, worker;
        /* the job */
        uint64_t dst;     /* where the new pages are mapped now */
        bool dst_private; /* a private scratch mapping of size bytes (else a shared one, kept) */
        bool copy_all;
        bool keep;         /* keep the old pages aside (mremap'ed away) rather than drop them */
        bool changed_only; /* copy only the pages that differ from dst's (dst holds the old pages) */
        uint64_t kept;     /* where the old pages went, 0 if dropped */
        uint64_t scratch;  /* address space reserved for them beforehand (size bytes), or 0 */
        FileRange file[MAX_FILE_RANGES];
        size_t n_file;
        bool in_stack; /* the range touches the main stack, which grows down into any hole below it */
        int pagemap;
        uint64_t pm[PM_CHUNK];
        int result;
} sw = {.lock = PTHREAD_MUTEX_INITIALIZER, .pagemap = -1};

/* The swaps that ended last (a thread's fault may reach the handler only after its swap, and after the
 * next one began): their ranges, and how many swaps have ended. */
#define RECENT 8
static struct {
        uint64_t va, size; /* atomic each; size 0 while the slot is rewritten */
} recent[RECENT];
static uint64_t swaps_ended; /* atomic */

/* the swaps_ended at which a thread was let go again without a swap under way: a second fault of it
 * before another swap ends is not a swap's (initial-exec: a preloaded library has static TLS, and the
 * handler may not call into the loader) */
static __thread __attribute__((tls_model("initial-exec"))) uint64_t retried_after;

static bool in_recent(uint64_t a)
{
        for (unsigned i = 0; i < RECENT; i++) {
                uint64_t size = __atomic_load_n(&recent[i].size, __ATOMIC_ACQUIRE);
                if (size && a - __atomic_load_n(&recent[i].va, __ATOMIC_ACQUIRE) < size)
                        return true;
        }
        return false;
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
        uint64_t a = (uint64_t)(uintptr_t)si->si_addr;
        uint64_t va = __atomic_load_n(&sw.va, __ATOMIC_ACQUIRE),
                 size = __atomic_load_n(&sw.size, __ATOMIC_ACQUIRE);

        if (si->si_code > 0 && a - va < size && __atomic_load_n(&sw.busy, __ATOMIC_ACQUIRE)) {
                while (__atomic_load_n(&sw.busy, __ATOMIC_ACQUIRE))
                        syscall(SYS_futex, &sw.busy, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
                return; /* the write again, onto the new pages */
        }
        /* a swap ended between the fault and here: once more, and once only until another swap ends */
        uint64_t ended = __atomic_load_n(&swaps_ended, __ATOMIC_ACQUIRE);
        if (si->si_code > 0 && (a - va < size || in_recent(a)) && retried_after != ended) {
                retried_after = ended;
                return;
        }
        struct sigaction next = sw.next;
        if (next.sa_flags & SA_RESETHAND) {
                sw.next.sa_handler = SIG_DFL;
                sw.next.sa_flags = 0;
        }
        if (next.sa_flags & SA_SIGINFO) {
                next.sa_sigaction(sig, si, uc);
        } else if (next.sa_handler == SIG_DFL || next.sa_handler == SIG_IGN) {
                /* the fault comes again and the default action takes it, as without us */
                struct sigaction dfl = {.sa_handler = SIG_DFL};
                sigemptyset(&dfl.sa_mask);
                sw.real_sigaction(SIGSEGV, &dfl, NULL);
        } else {
                next.sa_handler(sig);
        }
}

static bool in_file_range(uint64_t a)
{
        for (size_t i = 0; i < sw.n_file; i++)
                if (a >= sw.file[i].start && a < sw.file[i].end)
                        return true;
        return false;
}

/* Copy what the range holds to sw.dst: every page when asked, else those that hold anything. */
static int copy_pages(void)
{
        for (uint64_t off = 0; off < sw.size;) {
                uint64_t n = (sw.size - off) / PAGE;
                if (n > PM_CHUNK)
                        n = PM_CHUNK;
                if (sw.changed_only) {
                        /* back onto the pages kept at the swap in: those the GPUs or the CPU changed */
                        for (uint64_t i = 0; i < n; i++) {
                                void *to = (void *)(uintptr_t)(sw.dst + off + i * PAGE);
                                const void *from = (const void *)(uintptr_t)(sw.va + off + i * PAGE);
                                if (memcmp(to, from, PAGE) != 0)
                                        memcpy(to, from, PAGE);
                        }
                        off += n * PAGE;
                        continue;
                }
                if (!sw.copy_all) {
                        ssize_t got = pread(sw.pagemap, sw.pm, n * 8, (off_t)((sw.va + off) / PAGE * 8));
                        if (got != (ssize_t)(n * 8))
                                return -EIO;
                }
                for (uint64_t i = 0; i < n;) {
                        uint64_t j = i;
                        /* a run of pages to copy: written (present or swapped out), or unread file data */
                        while (j < n && (sw.copy_all || (sw.pm[j] & (PM_PRESENT | PM_SWAPPED)) ||
                                         in_file_range(sw.va + off + j * PAGE)))
                                j++;
                        if (j > i)
                                memcpy((void *)(uintptr_t)(sw.dst + off + i * PAGE),
                                       (const void *)(uintptr_t)(sw.va + off + i * PAGE), (j - i) * PAGE);
                        i = j + 1;
                }
                off += n * PAGE;
        }
        return 0;
}

/* The swap itself, on its own stack with every signal blocked. */
static void swap_main(void)
{
        long r;

        __atomic_store_n(&sw.busy, 1, __ATOMIC_RELEASE);
        if (mprotect((void *)(uintptr_t)sw.va, sw.size, PROT_READ) < 0) {
                sw.result = -errno;
                goto out;
        }
        sw.result = copy_pages();
        if (sw.result < 0) {
                (void)mprotect((void *)(uintptr_t)sw.va, sw.size, PROT_READ | PROT_WRITE);
                goto out;
        }
        /* the old pages aside, whole, for the way back (one VMA only: else they are dropped below); a
         * thread that touches the range meanwhile is held by the handler as for a write */
        sw.kept = 0;
        if (sw.keep && sw.scratch) {
                r = syscall(SYS_mremap, (void *)(uintptr_t)sw.va, sw.size, sw.size,
                            MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)sw.scratch);
                if (r != -1)
                        sw.kept = (uint64_t)r;
        }
        /* a shared mapping mapped a second time (old size 0), or the private scratch pages moved, over the
         * old ones: one step for every other thread */
        r = syscall(SYS_mremap, (void *)(uintptr_t)sw.dst, sw.dst_private ? sw.size : 0, sw.size,
                    MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)sw.va);
        if (r == -1) {
                sw.result = -errno;
                if (sw.kept) /* the old pages back where they were */
                        (void)syscall(SYS_mremap, (void *)(uintptr_t)sw.kept, sw.size, sw.size,
                                      MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)sw.va);
                sw.kept = 0;
                (void)mprotect((void *)(uintptr_t)sw.va, sw.size, PROT_READ | PROT_WRITE);
        }
out:
        /* among the recent swaps before busy drops: a late fault of this one finds it there */
        {
                unsigned slot = (unsigned)(__atomic_load_n(&swaps_ended, __ATOMIC_RELAXED) % RECENT);
                __atomic_store_n(&recent[slot].size, 0, __ATOMIC_RELEASE);
                __atomic_store_n(&recent[slot].va, sw.va, __ATOMIC_RELEASE);
                __atomic_store_n(&recent[slot].size, sw.size, __ATOMIC_RELEASE);
                __atomic_add_fetch(&swaps_ended, 1, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&sw.busy, 0, __ATOMIC_RELEASE);
        syscall(SYS_futex, &sw.busy, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* The parts of [va, va + size) that are not anonymous memory, from /proc/self/maps (before the swap:
 * this reads a file and allocates). */
static int find_file_ranges(uint64_t va, uint64_t size)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        int r = 0;

        sw.n_file = 0;
        sw.in_stack = false;
        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f)) {
                unsigned long long s, e, ino;
                char perms[8];
                int path = 0;

                if (sscanf(line, "%llx-%llx %7s %*s %*s %llu %n", &s, &e, perms, &ino, &path) < 4)
                        continue;
                /*
                 * The main stack grows down into a hole below it: a range anywhere in the room it may grow
                 * into (RLIMIT_STACK below its top) must not become one for a moment. Its top only is named
                 * [stack]: an earlier swap there leaves the pages below it a mapping without a name.
                 */
                if (strncmp(line + path, "[stack]", 7) == 0) {
                        struct rlimit rl;
                        uint64_t room = getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
                                                        rl.rlim_cur < e
                                                ? rl.rlim_cur
                                                : e;
                        if (va < e && va + size > e - room)
                                sw.in_stack = true;
                }
                if (e <= va || s >= va + size)
                        continue;
                /* anonymous: no inode, no name or a bracketed one ([heap], [stack], [anon:...]) */
                if (ino == 0 && (line[path] == '\n' || line[path] == '\0' || line[path] == '['))
                        continue;
                if (sw.n_file == MAX_FILE_RANGES) {
                        r = -E2BIG;
                        break;
                }
                sw.file[sw.n_file++] = (FileRange){s < va ? va : s, e > va + size ? va + size : e};
        }
        fclose(f);
        return r;
}

int swap_parts_mapped(uint64_t va, uint64_t size, uint64_t shared, SwapRange *ret, size_t cap, size_t *ret_n)
{
        FILE *f = fopen("/proc/self/maps", "re");
        unsigned long long dev_maj = 0, dev_min = 0, ino = 0, off0 = 0;
        bool found = false;
        char line[512];
        int r = 0;

        *ret_n = 0;
        if (!f)
                return -errno;
        /* the file and offset the buffer's own mapping at @shared has */
        while (!found && fgets(line, sizeof(line), f)) {
                unsigned long long s, e, off, ma, mi, in;
                if (sscanf(line, "%llx-%llx %*s %llx %llx:%llx %llu", &s, &e, &off, &ma, &mi, &in) == 6 &&
                    shared >= s && shared < e && in != 0) {
                        dev_maj = ma, dev_min = mi, ino = in, off0 = off + (shared - s);
                        found = true;
                }
        }
        rewind(f);
        while (found && fgets(line, sizeof(line), f)) {
                unsigned long long s, e, off, ma, mi, in;
                if (sscanf(line, "%llx-%llx %*s %llx %llx:%llx %llu", &s, &e, &off, &ma, &mi, &in) != 6)
                        continue;
                if (e <= va || s >= va + size || in != ino || ma != dev_maj || mi != dev_min)
                        continue;
                uint64_t a = s < va ? va : s, b = e > va + size ? va + size : e;
                /* the buffer's pages at their place: page a of the range is the buffer's page a - va */
                if (off + (a - s) != off0 + (a - va))
                        continue;
                if (*ret_n && ret[*ret_n - 1].va + ret[*ret_n - 1].size == a) {
                        ret[*ret_n - 1].size += b - a;
                } else if (*ret_n == cap) {
                        r = -E2BIG;
                        break;
                } else {
                        ret[(*ret_n)++] = (SwapRange){a, b - a};
                }
        }
        fclose(f);
        return found ? r : -ENOENT;
}

static int setup_locked(void)
{
        if (!sw.stack) {
                void *p = mmap(NULL, SWAP_STACK, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
                if (p == MAP_FAILED)
                        return -errno;
                sw.stack = p;
        }
        if (sw.pagemap < 0) {
                sw.pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
                if (sw.pagemap < 0)
                        return -errno;
        }
        if (!sw.installed) {
                struct sigaction sa = {.sa_sigaction = on_segv,
                                       .sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART};
                /* libc's own: the layer's sigaction() keeps ours in place once it is (swap_sigaction) */
                sw.real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(
                        RTLD_NEXT, "sigaction");
                if (!sw.real_sigaction)
                        return -ENOSYS;
                sigemptyset(&sa.sa_mask);
                if (sw.real_sigaction(SIGSEGV, &sa, &sw.next) < 0)
                        return -errno;
                __atomic_store_n(&sw.installed, true, __ATOMIC_RELEASE);
        }
        return 0;
}

static int run_swap(uint64_t va, uint64_t size, uint64_t dst, bool dst_private, bool copy_all, bool keep,
                    bool changed_only)
{
        uint64_t stack = (uint64_t)(uintptr_t)sw.stack;
        int r;

        if (!size || va % PAGE || size % PAGE || va + size < va)
                return -EINVAL;
        /* never the swap's own memory */
        if (va < stack + SWAP_STACK && stack < va + size)
                return -EINVAL;
        if ((uint64_t)(uintptr_t)&sw < va + size && va < (uint64_t)(uintptr_t)(&sw + 1))
                return -EINVAL;
        sw.dst = dst;
        sw.dst_private = dst_private;
        sw.copy_all = copy_all;
        sw.keep = keep;
        sw.changed_only = changed_only;
        sw.kept = 0;
        sw.result = 0;
        __atomic_store_n(&sw.size, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&sw.va, va, __ATOMIC_RELEASE);
        __atomic_store_n(&sw.size, size, __ATOMIC_RELEASE);
        if (getcontext(&sw.worker) < 0)
                return -errno;
        sw.worker.uc_stack.ss_sp = sw.stack;
        sw.worker.uc_stack.ss_size = SWAP_STACK;
        sw.worker.uc_link = &sw.caller;
        sigfillset(&sw.worker.uc_sigmask);
        makecontext(&sw.worker, swap_main, 0);
        /* from here to the return, this thread writes nothing on its own stack */
        if (swapcontext(&sw.caller, &sw.worker) < 0)
                return -errno;
        r = sw.result;
        return r;
}

/* The pages of [va, va + size) that were written, made present in the mapping at @dst beforehand, so that
 * the copy does not fault them in one at a time. Best effort (MADV_POPULATE_WRITE: Linux 5.14). */
static void populate_written(uint64_t va, uint64_t size, uint64_t dst)
{
        for (uint64_t off = 0; off < size;) {
                uint64_t n = (size - off) / PAGE;
                if (n > PM_CHUNK)
                        n = PM_CHUNK;
                if (pread(sw.pagemap, sw.pm, n * 8, (off_t)((va + off) / PAGE * 8)) != (ssize_t)(n * 8))
                        return;
                for (uint64_t i = 0; i < n;) {
                        uint64_t j = i;
                        while (j < n && (sw.pm[j] & (PM_PRESENT | PM_SWAPPED)))
                                j++;
                        if (j > i)
                                (void)madvise((void *)(uintptr_t)(dst + off + i * PAGE), (j - i) * PAGE,
                                              MADV_POPULATE_WRITE);
                        i = j + 1;
                }
                off += n * PAGE;
        }
}

int swap_in_shared(uint64_t va, uint64_t size, uint64_t shared, uint64_t *ret_kept)
{
        int r;

        *ret_kept = 0;
        pthread_mutex_lock(&sw.lock);
        r = setup_locked();
        if (r == 0)
                r = find_file_ranges(va, size);
        if (r == 0) {
                /* room for the old pages, made now (nothing may be made during the swap) */
                void *room = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                sw.scratch = room == MAP_FAILED ? 0 : (uint64_t)(uintptr_t)room;
                populate_written(va, size, shared);
                /* not out of the main stack: a hole there would be filled by the stack growing into it */
                r = run_swap(va, size, shared, false, false, !sw.in_stack, false);
                /* unused unless the old pages went there */
                if (sw.scratch && (r < 0 || !sw.kept))
                        munmap(room, size);
                sw.scratch = 0;
        }
        if (r == 0)
                *ret_kept = sw.kept;
        pthread_mutex_unlock(&sw.lock);
        return r;
}

int swap_out_private(uint64_t va, uint64_t size, uint64_t kept)
{
        void *p = (void *)(uintptr_t)kept;
        int r;

        if (kept) {
                /* the pages kept at the swap in, writable again: only what changed is written to them */
                if (mprotect(p, size, PROT_READ | PROT_WRITE) < 0)
                        return -errno;
        } else {
                /* private pages made first, written by the copy (populated: one fault's worth of work) */
                p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1,
                         0);
                if (p == MAP_FAILED)
                        return -errno;
        }
        pthread_mutex_lock(&sw.lock);
        r = setup_locked();
        if (r == 0)
                r = run_swap(va, size, (uint64_t)(uintptr_t)p, true, !kept, false, kept != 0);
        pthread_mutex_unlock(&sw.lock);
        if (r < 0 && !kept)
                munmap(p, size);
        return r;
}

void swap_drop_kept(uint64_t kept, uint64_t size)
{
        if (kept)
                munmap((void *)(uintptr_t)kept, size);
}

int swap_touched(uint64_t va, uint64_t size, bool *ret_any)
{
        int r = 0;

        *ret_any = false;
        pthread_mutex_lock(&sw.lock);
        if (sw.pagemap < 0) {
                sw.pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
                if (sw.pagemap < 0)
                        r = -errno;
        }
        for (uint64_t off = 0; r == 0 && off < size && !*ret_any;) {
                uint64_t n = (size - off) / PAGE;
                if (n > PM_CHUNK)
                        n = PM_CHUNK;
                if (pread(sw.pagemap, sw.pm, n * 8, (off_t)((va + off) / PAGE * 8)) != (ssize_t)(n * 8)) {
                        r = -EIO;
                        break;
                }
                for (uint64_t i = 0; i < n; i++)
                        if (sw.pm[i] & (PM_PRESENT | PM_SWAPPED))
                                *ret_any = true;
                off += n * PAGE;
        }
        pthread_mutex_unlock(&sw.lock);
        return r;
}

int swap_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
        if (sig != SIGSEGV || !__atomic_load_n(&sw.installed, __ATOMIC_ACQUIRE))
                return 0;
        if (old)
                *old = sw.next;
        if (act)
                sw.next = *act;
        return 1;
}

void swap_after_fork_in_child(void)
{
        pthread_mutex_init(&sw.lock, NULL);
        __atomic_store_n(&sw.busy, 0, __ATOMIC_RELEASE);
        /* the parent's pages: /proc/self/pagemap reads the mm of the process that opened it */
        if (sw.pagemap >= 0)
                close(sw.pagemap);
        sw.pagemap = -1;
}
