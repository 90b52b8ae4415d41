/* The daemon's KFD topology files as a private directory of the process's, served in place of sysfs. */
#pragma once

#include <stddef.h>

#include "gpumem-client.h"

/*
 * A new directory under $XDG_RUNTIME_DIR (else /tmp) in @dir (@len bytes), with @files written there. 0, or
 * a negative errno with the reason in @msg; @dir is "" unless the directory was made (then it is there,
 * for topology_dir_remove(), even when a file failed).
 */
int topology_dir_make(char *dir, size_t len, const gm_topology_file *files, size_t n, char *msg,
                      size_t msglen);

/* The directory and everything in it. */
void topology_dir_remove(const char *dir);
