/* Pages the process registers, swapped for a GTT buffer of its context in gpumemd and back (swap.c). */
#include "registered.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "swap.h"

#define PAGE 4096ull

static void say(const PreloadHost *host, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void say(const PreloadHost *host, int level, const char *fmt, ...)
{
        char msg[512];
        va_list ap;

        if (!host)
                return;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        host->log(host->ctx, level, msg);
}

/*
 * Pages the process registers become memory the daemon shares: the daemon cannot reach the process's
 * private pages (and a client context takes no userptr, on the kernel as in the model), so a GTT buffer of
 * the process's context takes their place. It lies at the GPU address libhsakmt chose in the window
 * (@gpu_va), where the library maps it as any allocation.
 *
 * Pages elsewhere (@cpu_va: the heap around a buffer HIP pins for a copy, a hipHostRegister'ed array, a
 * stack) are the program's, written by any of its threads at any moment: the buffer is made first, then
 * swap.c copies what they hold into it and maps it over them in one step, with the range write-protected
 * meanwhile so that no write is lost (a writer waits for the swap and then writes the new pages).
 *
 * Pages at their own GPU address are libhsakmt's own host allocation, mapped by it a moment ago and not
 * yet handed to anyone (or an SVM range HIP has just mapped): the buffer is mapped over them, and only
 * when a page of them was written already is what they hold copied across.
 */
int registered_swap_in(gm_client *c, const PreloadHost *host, uint64_t cpu_va, uint64_t gpu_va, uint64_t size,
                       uint32_t gpu_id, unsigned flags, uint64_t *ret_kept)
{
        gm_alloc_desc d = {.kind = GM_KIND_HOST,
                           .size = size,
                           .gpu_id = gpu_id,
                           /* in the process's own GPU context, where its queues read and write */
                           .flags = (flags & ~(unsigned)GM_MEM_READ_ONLY) | GM_MEM_GTT,
                           .numa_node = -1,
                           .alignment = PAGE,
                           .fixed_addr = (void *)(uintptr_t)gpu_va,
                           /* on its own GPU, as the BO's other allocations: MAP_MEMORY_TO_GPU adds others */
                           .map_gpus = &gpu_id,
                           .n_map_gpus = 1};
        uint8_t *saved = NULL;
        bool written = false;
        void *p = NULL;
        int r;

        *ret_kept = 0;
        if (cpu_va != gpu_va) {
                r = gm_malloc_desc(c, &d, &p);
                if (r < 0)
                        return r;
                r = swap_in_shared(cpu_va, size, gpu_va, ret_kept);
                say(host, 2, "registered 0x%llx+0x%llx at 0x%llx: %d (own pages kept: %s)",
                    (unsigned long long)cpu_va, (unsigned long long)size, (unsigned long long)gpu_va, r,
                    *ret_kept ? "yes" : "no");
                if (r < 0) {
                        say(host, 1, "cannot put shared pages in place of 0x%llx+0x%llx: %s",
                            (unsigned long long)cpu_va, (unsigned long long)size, strerror(-r));
                        (void)gm_mem_free(c, (void *)(uintptr_t)gpu_va);
                }
                return r;
        }
        r = swap_touched(cpu_va, size, &written);
        if (r < 0)
                return r;
        if (written) {
                /* all of it (pages swapped out included), read so that a range this process cannot read is
                 * an error rather than a fault */
                struct iovec here, there = {(void *)(uintptr_t)cpu_va, size};
                saved = malloc(size);
                if (!saved)
                        return -ENOMEM;
                here = (struct iovec){saved, size};
                if (process_vm_readv(getpid(), &here, 1, &there, 1, 0) != (ssize_t)size) {
                        free(saved);
                        return -EFAULT;
                }
        }
        r = gm_malloc_desc(c, &d, &p);
        if (r == 0 && saved)
                memcpy((void *)(uintptr_t)cpu_va, saved, size);
        free(saved);
        return r;
}

/*
 * The substituted pages go back to being the process's own, with what they hold, when it deregisters
 * (swapped as above). Pages at their own GPU address are libhsakmt's host allocation, which it unmaps as
 * soon as the free returns: they become the window's reservation again, what they held not kept.
 * *@freed: the daemon let go of the memory (even when its pages could not be put back here).
 */
int registered_swap_out(gm_client *c, const PreloadHost *host, uint64_t cpu_va, uint64_t gpu_va,
                        uint64_t size, uint64_t *kept, bool *freed)
{
        int r;

        *freed = false;
        if (cpu_va != gpu_va) {
                SwapRange parts[16];
                size_t n = 0;

                /*
                 * The process's pages first, so that no mapping of the buffer outlives its handle. Only where
                 * the buffer still is: the program may have freed what it registered (glibc unmaps a large
                 * block) and even have new memory there before the runtime deregisters; as on the kernel,
                 * where a userptr BO follows the address, that new memory is left alone.
                 */
                r = swap_parts_mapped(cpu_va, size, gpu_va, parts, 16, &n);
                say(host, 2, "deregistering 0x%llx+0x%llx at 0x%llx: %zu part(s) still its own (%d)",
                    (unsigned long long)cpu_va, (unsigned long long)size, (unsigned long long)gpu_va, n, r);
                if (r == 0 && n == 1 && parts[0].va == cpu_va && parts[0].size == size) {
                        r = swap_out_private(cpu_va, size, *kept);
                        if (r == 0)
                                *kept = 0; /* moved back over the range */
                } else if (r == 0) {
                        swap_drop_kept(*kept, size);
                        *kept = 0;
                        for (size_t i = 0; i < n && r == 0; i++)
                                r = swap_out_private(parts[i].va, parts[i].size, 0);
                }
                if (r < 0) {
                        say(host, 1, "cannot put private pages back at 0x%llx+0x%llx: %s",
                            (unsigned long long)cpu_va, (unsigned long long)size, strerror(-r));
                        return r;
                }
        }
        r = gm_mem_free(c, (void *)(uintptr_t)gpu_va);
        *freed = r == 0;
        if (r < 0) {
                char why[300];
                say(host, 1, "cannot free the registered pages' buffer at 0x%llx: %s",
                    (unsigned long long)gpu_va, gm_strerror(c, r, why, sizeof(why)));
        }
        return r;
}
