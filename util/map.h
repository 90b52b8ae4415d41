/* A mapping at an exact address, for the VA windows the daemon and its clients agree on. */
#pragma once

#include <stdint.h>

/*
 * mmap() of @size bytes at @va exactly: 0, the mmap's -errno, or -EEXIST where a kernel that does not know
 * MAP_FIXED_NOREPLACE took it for a hint and mapped elsewhere (that mapping is undone).
 */
int map_at(uint64_t va, uint64_t size, int prot, int flags, int fd, uint64_t offset);
