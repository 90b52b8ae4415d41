/* Growable arrays: room for more elements, doubling, as every part of the project grows its arrays. */
#pragma once

#include <stddef.h>

/*
 * Room in *@v (of *@cap elements of @size bytes) for @need elements: nothing when they fit, else the capacity
 * doubled (from @first when there is none) until they fit. -ENOMEM, also when the size would overflow,
 * leaves the array and its capacity as they were. ARRAY_RESERVE() takes the array itself.
 */
int array_reserve(void **v, size_t *cap, size_t need, size_t size, size_t first);
#define ARRAY_RESERVE(v, cap, need, first) array_reserve((void **)&(v), &(cap), (need), sizeof(*(v)), (first))
