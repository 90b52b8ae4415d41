/* A mapping at an exact address (map.h). */
#include "map.h"

#include <errno.h>
#include <sys/mman.h>

int map_at(uint64_t va, uint64_t size, int prot, int flags, int fd, uint64_t offset)
{
        void *want = (void *)(uintptr_t)va;
        void *p = mmap(want, size, prot, flags, fd, (off_t)offset);

        if (p == MAP_FAILED)
                return -errno;
        if (p != want) {
                munmap(p, size);
                return -EEXIST;
        }
        return 0;
}
