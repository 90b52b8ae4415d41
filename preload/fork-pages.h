/* Pages of the process that are the daemon's memory, made private for the moment of a fork(). */
#pragma once

#include <stdint.h>

/*
 * Registered pages and SVM ranges outside the window are a shared mapping of the daemon's memory; on the
 * kernel they are the process's own anonymous pages, which a child gets copy-on-write, as they were at the
 * fork. They cannot be copied in the child: the parent goes on writing them, the forking thread's own
 * frames among them when a registered page is of its stack. So, in the fork handlers, with the caller's
 * locks keeping the ranges as they are:
 *   before:  fork_pages_add() each range (@shared: where the buffer is mapped whole), then
 * fork_pages_private(): private pages with what they hold take their place (swap.c), the shared mapping kept
 * aside where the child does not inherit it; parent:  fork_pages_shared_again(): the shared mapping takes
 * their place again, with what they hold; child:   fork_pages_in_child(): nothing to do but for a range that
 * could not be made private before, which is copied now, the best there is. A GPU write into the pages while
 * the fork runs is lost. Each returns how many ranges failed.
 */
int fork_pages_add(uint64_t va, uint64_t size, uint64_t shared);
int fork_pages_private(void);
int fork_pages_shared_again(void);
int fork_pages_in_child(void);
