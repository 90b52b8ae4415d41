/* Pages of the process that are the daemon's memory, made private for the moment of a fork(). */
#include "fork-pages.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "swap.h"

typedef struct ForkRange {
        uint64_t va, size;
        uint64_t shared; /* a second mapping of the daemon's memory at va, kept aside across the fork */
        bool private;    /* the pages at va are private ones now */
} ForkRange;

/* the ranges of the fork under way (the caller's fork handlers make it one at a time) */
static struct {
        ForkRange *r;
        size_t n, cap;
} fk;

int fork_pages_add(uint64_t va, uint64_t size, uint64_t shared)
{
        SwapRange parts[16];
        size_t n = 0;

        /* where the buffer still is: the process may have unmapped or remapped part of the range */
        if (swap_parts_mapped(va, size, shared, parts, 16, &n) < 0)
                return 1;
        if (fk.n + n > fk.cap) {
                size_t cap = fk.cap * 2 > fk.n + n ? fk.cap * 2 : fk.n + n + 16;
                ForkRange *more = realloc(fk.r, cap * sizeof(*more));
                if (!more)
                        return 1;
                fk.r = more;
                fk.cap = cap;
        }
        for (size_t i = 0; i < n; i++)
                fk.r[fk.n++] = (ForkRange){.va = parts[i].va, .size = parts[i].size};
        return 0;
}

int fork_pages_private(void)
{
        int failed = 0;

        for (size_t i = 0; i < fk.n; i++) {
                ForkRange *f = &fk.r[i];
                long p = syscall(SYS_mremap, (void *)(uintptr_t)f->va, 0, f->size, MREMAP_MAYMOVE);

                if (p != -1) {
                        f->shared = (uint64_t)p;
                        /* the child gets none of it */
                        f->private = madvise((void *)(uintptr_t)f->shared, f->size, MADV_DONTFORK) == 0 &&
                                     swap_out_private(f->va, f->size, 0) == 0;
                }
                failed += !f->private;
        }
        return failed;
}

int fork_pages_shared_again(void)
{
        int failed = 0;

        for (size_t i = 0; i < fk.n; i++) {
                const ForkRange *f = &fk.r[i];

                uint64_t kept = 0;

                if (f->private && swap_in_shared(f->va, f->size, f->shared, &kept) < 0)
                        failed++;
                /* the private pages of the fork are of no more use */
                swap_drop_kept(kept, f->size);
                if (f->shared)
                        (void)syscall(SYS_munmap, (void *)(uintptr_t)f->shared, f->size);
        }
        fk.n = 0;
        return failed;
}

int fork_pages_in_child(void)
{
        int failed = 0;

        for (size_t i = 0; i < fk.n; i++)
                if (!fk.r[i].private && swap_out_private(fk.r[i].va, fk.r[i].size, 0) < 0)
                        failed++;
        fk.n = 0;
        return failed;
}
