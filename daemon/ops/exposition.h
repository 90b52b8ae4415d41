/* The Prometheus text exposition of gpumemd (for admin_metrics) and its optional HTTP listener. */
#pragma once

#include <stddef.h>

typedef struct Manager Manager;

/* The whole exposition, under the manager's lock; the caller frees *ret. */
int metrics_render(Manager *m, char **ret, size_t *ret_len);
/* Serve GET /metrics on ADDR:PORT with libevent's HTTP server. */
int metrics_listen(Manager *m, const char *addr_port);
