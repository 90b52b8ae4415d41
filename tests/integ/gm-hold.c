/* A client that holds memory until its stdin closes, for tests that look at a live daemon from outside. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem-client.h"

/*
 * gm-hold SOCKET NAME GPU_ID KIND:BYTES...   (KIND: device, host or managed)
 * Prints "held CLIENT_ID" once everything is allocated, then waits for EOF on stdin and frees it all. Exit 0
 * only if every call succeeded; a failure names the call and its errno.
 */
int main(int argc, char **argv)
{
        gm_client *c = NULL;
        char err[256];
        void *ptrs[16];
        int n = 0, r, status = 0;
        uint32_t gpu;

        if (argc < 4 || argc - 4 > 16) {
                fprintf(stderr, "usage: gm-hold SOCKET NAME GPU_ID KIND:BYTES... (at most 16)\n");
                return 2;
        }
        gpu = (uint32_t)strtoul(argv[3], NULL, 0);
        r = gm_client_open(argv[1], argv[2], &c, err, sizeof(err));
        if (r < 0) {
                fprintf(stderr, "gm-hold: connect: %s (%s)\n", strerror(-r), err);
                return 1;
        }
        for (int i = 4; i < argc; i++) {
                const char *colon = strchr(argv[i], ':');
                size_t size = colon ? (size_t)strtoull(colon + 1, NULL, 0) : 0;
                if (!colon || !size) {
                        fprintf(stderr, "gm-hold: bad KIND:BYTES '%s'\n", argv[i]);
                        status = 2;
                        break;
                }
                if (strncmp(argv[i], "device:", 7) == 0)
                        r = gm_malloc(c, size, gpu, 0, &ptrs[n]);
                else if (strncmp(argv[i], "host:", 5) == 0)
                        r = gm_host_malloc(c, size, gpu, -1, 0, &ptrs[n]);
                else if (strncmp(argv[i], "managed:", 8) == 0)
                        r = gm_malloc_managed(c, size, 0, &ptrs[n]);
                else
                        r = -EINVAL;
                if (r < 0) {
                        fprintf(stderr, "gm-hold: %s: %s\n", argv[i], strerror(-r));
                        status = 1;
                        break;
                }
                n++;
        }
        if (!status) {
                printf("held %" PRIu64 "\n", gm_client_id(c));
                fflush(stdout);
                while (getchar() != EOF)
                        ;
        }
        for (int i = 0; i < n; i++)
                if ((r = gm_mem_free(c, ptrs[i])) < 0) {
                        fprintf(stderr, "gm-hold: free: %s\n", strerror(-r));
                        status = 1;
                }
        gm_client_close(c);
        return status;
}
