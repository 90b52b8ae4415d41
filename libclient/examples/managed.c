/* managed: managed memory with advice and prefetch, and the SVM attributes read back from the driver. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "example-gpus.h"
#include "gpumem-client.h"

#define SIZE (8u << 20)
#define HALF (SIZE / 2)

static int fail(gm_client *c, const char *what, int err)
{
        char msg[512];
        fprintf(stderr, "managed: %s: %s\n", what, gm_strerror(c, err, msg, sizeof(msg)));
        return EXIT_FAILURE;
}

static const char *location(uint32_t v, char *buf, size_t len)
{
        if (v == GM_LOCATION_CPU)
                snprintf(buf, len, "system memory");
        else if (v == GM_SVM_LOCATION_UNDEFINED)
                snprintf(buf, len, "undefined");
        else
                snprintf(buf, len, "GPU %u", v);
        return buf;
}

/* Read back and print the attributes of [p, p+size); -1 on failure. */
static int show(gm_client *c, const char *name, void *p, size_t size, uint32_t gpu, gm_svm_attr *ret)
{
        gm_svm_attr q[5] = {
                {GM_SVM_ATTR_PREFERRED_LOC, 0}, {GM_SVM_ATTR_PREFETCH_LOC, 0}, {GM_SVM_ATTR_ACCESS, gpu},
                {GM_SVM_ATTR_SET_FLAGS, 0},     {GM_SVM_ATTR_GRANULARITY, 0},
        };
        char b1[32], b2[32];
        int r = gm_svm_get_attributes(c, p, size, q, 5);

        if (r < 0)
                return r;
        printf("  %-12s preferred %s, prefetch %s, GPU %u %s, flags 0x%02x%s%s, granularity 2^%u pages\n",
               name, location(q[0].value, b1, sizeof(b1)), location(q[1].value, b2, sizeof(b2)), gpu,
               q[2].type == GM_SVM_ATTR_ACCESS_IN_PLACE ? "maps it in place"
               : q[2].type == GM_SVM_ATTR_ACCESS        ? "may access it"
                                                        : "has no access",
               q[3].value, q[3].value & GM_SVM_FLAG_COHERENT ? " coherent" : "",
               q[3].value & GM_SVM_FLAG_GPU_READ_MOSTLY ? " read-mostly" : "", q[4].value);
        for (int i = 0; i < 5; i++)
                ret[i] = q[i];
        return 0;
}

int main(void)
{
        gm_client *c = NULL;
        uint32_t gpus[2] = {0, 0};
        gm_svm_attr a[5];
        unsigned char *m = NULL;
        int r;

        r = gm_client_connect(NULL, "managed", &c);
        if (r < 0)
                return fail(NULL, "connect", r);
        /* GPU A and GPU B: the same one on a one-GPU machine */
        r = example_gpus(c, gpus, 2);
        if (r == -ENODEV) {
                fprintf(stderr, "managed: no GPU\n");
                return EXIT_FAILURE;
        }
        if (r < 0)
                return fail(c, "topology", r);

        /* one pointer for the CPU and every GPU; the CPU uses it at once */
        r = gm_malloc_managed(c, SIZE, 0, (void **)&m);
        if (r < 0)
                return fail(c, "gm_malloc_managed", r);
        for (size_t i = 0; i < SIZE; i++)
                m[i] = (unsigned char)(i * 31 + 7);
        printf("allocated %u MiB of managed memory at %p and wrote it from the CPU\n", SIZE >> 20, (void *)m);
        if ((r = show(c, "as allocated", m, SIZE, gpus[0], a)) < 0)
                return fail(c, "gm_svm_get_attributes", r);

        /* hipMemAdvise equivalents: the first half prefers GPU A and is read mostly; GPU A maps all of it */
        r = gm_mem_advise(c, m, HALF, GM_ADVISE_SET_PREFERRED_LOCATION, gpus[0]);
        if (r < 0)
                return fail(c, "advise preferred location", r);
        r = gm_mem_advise(c, m, HALF, GM_ADVISE_SET_READ_MOSTLY, 0);
        if (r < 0)
                return fail(c, "advise read mostly", r);
        r = gm_mem_advise(c, m, SIZE, GM_ADVISE_SET_ACCESSED_BY, gpus[0]);
        if (r < 0)
                return fail(c, "advise accessed by", r);
        /* hipMemPrefetchAsync equivalent: the second half is wanted on GPU B */
        r = gm_mem_prefetch(c, m + HALF, HALF, gpus[1]);
        if (r < 0)
                return fail(c, "gm_mem_prefetch", r);
        printf("advised and prefetched; the driver now reports:\n");

        if ((r = show(c, "first half", m, HALF, gpus[0], a)) < 0)
                return fail(c, "gm_svm_get_attributes", r);
        if (a[0].value != gpus[0] || !(a[3].value & GM_SVM_FLAG_GPU_READ_MOSTLY) ||
            a[2].type != GM_SVM_ATTR_ACCESS_IN_PLACE) {
                fprintf(stderr, "managed: the first half does not carry the advice given\n");
                return EXIT_FAILURE;
        }
        if ((r = show(c, "second half", m + HALF, HALF, gpus[0], a)) < 0)
                return fail(c, "gm_svm_get_attributes", r);
        if (a[1].value != gpus[1] || a[0].value != GM_SVM_LOCATION_UNDEFINED) {
                fprintf(stderr, "managed: the second half does not carry the prefetch location\n");
                return EXIT_FAILURE;
        }
        /* over the whole range, what differs between the halves reads as undefined or unset */
        if ((r = show(c, "whole range", m, SIZE, gpus[0], a)) < 0)
                return fail(c, "gm_svm_get_attributes", r);
        if (a[0].value != GM_SVM_LOCATION_UNDEFINED || (a[3].value & GM_SVM_FLAG_GPU_READ_MOSTLY)) {
                fprintf(stderr, "managed: the whole range should mix the halves' attributes\n");
                return EXIT_FAILURE;
        }

        /* attributes are placement hints: the data is where the CPU left it */
        for (size_t i = 0; i < SIZE; i++)
                if (m[i] != (unsigned char)(i * 31 + 7)) {
                        fprintf(stderr, "managed: byte %zu changed\n", i);
                        return EXIT_FAILURE;
                }
        printf("data unchanged after advice and prefetch\n");
        r = gm_mem_free(c, m);
        if (r < 0)
                return fail(c, "gm_mem_free", r);
        gm_client_close(c);
        return EXIT_SUCCESS;
}
