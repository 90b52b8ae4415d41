/* gpumem-info: a small gpumemd client: connect, show the session and the GPUs, measure round trips. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpumem-client.h"

static double now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(void)
{
        gm_client *c = NULL;
        gm_topology *t = NULL;
        uint64_t base, size, vram = 0;
        uint32_t major, minor;
        unsigned gpus = 0;
        char msg[512];
        int r;

        r = gm_client_connect(NULL, "gpumem-info", &c);
        if (r < 0) {
                fprintf(stderr, "gpumem-info: cannot connect: %s\n", gm_strerror(NULL, r, msg, sizeof(msg)));
                return EXIT_FAILURE;
        }
        gm_client_window(c, &base, &size);
        gm_client_kfd_version(c, &major, &minor);
        printf("connected to gpumemd %s as client %" PRIu64 " (protocol %u, %s backend, KFD ABI %u.%u)\n",
               gm_client_server_version(c), gm_client_id(c), gm_client_protocol_version(c),
               gm_client_backend(c), major, minor);
        printf("VA window 0x%" PRIx64 "-0x%" PRIx64 " (%" PRIu64 " GiB), reserved in this process\n", base,
               base + size, size >> 30);

        r = gm_topology_get(c, false, &t);
        if (r < 0) {
                fprintf(stderr, "gpumem-info: topology: %s\n", gm_strerror(c, r, msg, sizeof(msg)));
                gm_client_close(c);
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < t->n_nodes; i++) {
                if (!t->nodes[i].is_gpu)
                        continue;
                gpus++;
                vram += t->nodes[i].local_mem_size;
        }
        printf("%u GPUs, %" PRIu64 " GiB of VRAM in all\n", gpus, vram >> 30);
        gm_topology_free(t);

        double start = now_us();
        const int n = 1000;
        for (int i = 0; i < n; i++) {
                r = gm_ping(c);
                if (r < 0) {
                        fprintf(stderr, "gpumem-info: ping: %s\n", gm_strerror(c, r, msg, sizeof(msg)));
                        gm_client_close(c);
                        return EXIT_FAILURE;
                }
        }
        printf("%d round trips, %.1f us each on average\n", n, (now_us() - start) / n);
        gm_client_close(c);
        return EXIT_SUCCESS;
}
