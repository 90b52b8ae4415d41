/* vmm-grow: a GPU buffer that grows in place: reserve address space once, then back it chunk by chunk. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <stdlib.h>

#include "example-gpus.h"
#include "gpumem-client.h"

#define RESERVE (64u << 20) /* the most the buffer may ever grow to */
#define CHUNKS  8

static int fail(gm_client *c, const char *what, int err)
{
        char msg[512];
        fprintf(stderr, "vmm-grow: %s: %s\n", what, gm_strerror(c, err, msg, sizeof(msg)));
        return EXIT_FAILURE;
}

/* Word i of the buffer holds f(i): one pattern across every chunk, so chunk borders are checked too. */
static uint64_t word(size_t i)
{
        return (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

static bool verify(const uint64_t *w, size_t bytes)
{
        for (size_t i = 0; i < bytes / sizeof(*w); i++)
                if (w[i] != word(i))
                        return false;
        return true;
}

int main(int argc, char **argv)
{
        /* --hold: keep the grown buffer until a signal, so administrators can look at it */
        bool hold = argc > 1 && strcmp(argv[1], "--hold") == 0;
        gm_client *c = NULL;
        gm_handle handles[CHUNKS];
        uint32_t gpu = 0;
        size_t chunk = 0, used = 0;
        void *base = NULL;
        int r;

        r = gm_client_connect(NULL, "vmm-grow", &c);
        if (r < 0)
                return fail(NULL, "connect", r);
        r = example_gpus(c, &gpu, 1);
        if (r == -ENODEV) {
                fprintf(stderr, "vmm-grow: no GPU\n");
                return EXIT_FAILURE;
        }
        if (r < 0)
                return fail(c, "topology", r);

        /* chunks of the recommended granularity (2 MiB) let the GPU use large pages */
        r = gm_mem_get_allocation_granularity(c, gpu, GM_GRANULARITY_RECOMMENDED, &chunk);
        if (r < 0)
                return fail(c, "gm_mem_get_allocation_granularity", r);
        r = gm_mem_address_reserve(c, RESERVE, 0, NULL, 0, &base);
        if (r < 0)
                return fail(c, "gm_mem_address_reserve", r);
        printf("reserved %u MiB of address space at %p (nothing behind it yet)\n", RESERVE >> 20, base);

        gm_access_desc access[2] = {{gpu, GM_ACCESS_READ_WRITE}, {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
        for (int i = 0; i < CHUNKS; i++) {
                char *at = (char *)base + used;

                /* physical memory first (no address), then bind it right after what is already there */
                r = gm_mem_create(c, chunk, gpu, 0, &handles[i]);
                if (r < 0)
                        return fail(c, "gm_mem_create", r);
                r = gm_mem_map(c, at, chunk, 0, handles[i]);
                if (r < 0)
                        return fail(c, "gm_mem_map", r);
                /* a new mapping is inaccessible until access is granted: here the GPU and this process */
                r = gm_mem_set_access(c, at, chunk, access, 2);
                if (r < 0)
                        return fail(c, "gm_mem_set_access", r);
                for (size_t k = used / sizeof(uint64_t); k < (used + chunk) / sizeof(uint64_t); k++)
                        ((uint64_t *)base)[k] = word(k);
                used += chunk;

                /* the old data is untouched and the buffer still starts where it always did */
                if (!verify(base, used)) {
                        fprintf(stderr, "vmm-grow: data lost while growing to %zu MiB\n", used >> 20);
                        return EXIT_FAILURE;
                }
                printf("grew to %2zu MiB, still at %p, all %zu MiB verified\n", used >> 20, base, used >> 20);
        }

        /* what the daemon knows about a pointer into the middle of the last chunk */
        gm_pointer_attributes attr = {.struct_size = sizeof(attr)};
        r = gm_pointer_get_attributes(c, (char *)base + used - chunk / 2, &attr);
        if (r < 0)
                return fail(c, "gm_pointer_get_attributes", r);
        if (attr.kind != GM_KIND_VMM || attr.base != (char *)base + used - chunk || attr.size != chunk) {
                fprintf(stderr, "vmm-grow: unexpected pointer attributes\n");
                return EXIT_FAILURE;
        }
        printf("the last chunk is a VMM mapping of %zu MiB at %p on GPU %u\n", attr.size >> 20, attr.base,
               attr.gpu_id);

        if (hold) {
                printf("holding the buffer until a signal\n");
                fflush(stdout);
                pause();
        }
        /* one call unmaps every whole mapping in the range; then the handles and the reservation go */
        r = gm_mem_unmap(c, base, used);
        if (r < 0)
                return fail(c, "gm_mem_unmap", r);
        for (int i = 0; i < CHUNKS; i++) {
                r = gm_mem_release(c, handles[i]);
                if (r < 0)
                        return fail(c, "gm_mem_release", r);
        }
        r = gm_mem_address_free(c, base, RESERVE);
        if (r < 0)
                return fail(c, "gm_mem_address_free", r);
        printf("unmapped %d chunks, released their memory and the reservation\n", CHUNKS);
        gm_client_close(c);
        return EXIT_SUCCESS;
}
