/* hipMemcpy2D host -> device -> host on the KFD model: windows of odd widths, pitches and offsets copied by
 * the SDMA engines' sub-window copies, every byte of both surfaces checked, the bytes between rows too. */
#include <hip/hip_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip-check.h"

#define OUTSIDE_DEV  0x5a /* what the device surface holds outside the window */
#define OUTSIDE_HOST 0xe7 /* what the host surface it comes back to holds outside the window */

typedef struct Shape {
        size_t width, height; /* the window, bytes by rows */
        size_t spitch, soff;  /* host source: bytes per row, and where the window starts */
        size_t dpitch, doff;  /* device surface */
        size_t bpitch, boff;  /* host surface it comes back to */
} Shape;

static uint8_t pattern(size_t row, size_t col, unsigned int seed)
{
        return (uint8_t)(row * 31 + col * 7 + seed + (col >> 8));
}

/* Is byte @i of a surface of @pitch inside the window that starts at @off, and where in it? */
static bool in_window(const Shape *s, size_t pitch, size_t off, size_t i, size_t *row, size_t *col)
{
        if (i < off)
                return false;
        *row = (i - off) / pitch;
        *col = (i - off) % pitch;
        return *row < s->height && *col < s->width;
}

/* Every byte of @p (@n bytes, a surface of @pitch with the window at @off) is the pattern inside the window
 * and @outside elsewhere. */
static int check_surface(const Shape *s, const uint8_t *p, size_t n, size_t pitch, size_t off,
                         uint8_t outside, unsigned int seed)
{
        for (size_t i = 0; i < n; i++) {
                size_t row, col;
                uint8_t want = in_window(s, pitch, off, i, &row, &col) ? pattern(row, col, seed) : outside;

                if (p[i] != want) {
                        fprintf(stderr, "%zux%zu: byte %zu is 0x%02x, not 0x%02x\n", s->width, s->height, i,
                                p[i], want);
                        return 1;
                }
        }
        return 0;
}

static int round_trip(const Shape *s, bool pinned, unsigned int seed)
{
        size_t sn = s->soff + s->spitch * s->height, dn = s->doff + s->dpitch * s->height;
        size_t bn = s->boff + s->bpitch * s->height;
        uint8_t *src, *back, *seen = malloc(dn);
        void *dev = NULL;

        if (pinned) {
                REQUIRE_HIP(hipHostMalloc((void **)&src, sn, 0));
                REQUIRE_HIP(hipHostMalloc((void **)&back, bn, 0));
        } else {
                /* pages of their own: HIP registers (userptr) the pages of pageable memory it copies by
                 * sub-window, and through gpumemd such pages are substituted while registered */
                src = aligned_alloc(4096, (sn + 4095) & ~(size_t)4095);
                back = aligned_alloc(4096, (bn + 4095) & ~(size_t)4095);
        }
        REQUIRE(src && back && seen);
        memset(src, 0x11, sn);
        for (size_t r = 0; r < s->height; r++)
                for (size_t c = 0; c < s->width; c++)
                        src[s->soff + r * s->spitch + c] = pattern(r, c, seed);
        REQUIRE_HIP(hipMalloc(&dev, dn));
        /* filled by a linear copy (hipMemset's kernel does not run on the model) */
        memset(seen, OUTSIDE_DEV, dn);
        REQUIRE_HIP(hipMemcpy(dev, seen, dn, hipMemcpyHostToDevice));

        /* host -> device: the window lands, the bytes around it stay */
        REQUIRE_HIP(hipMemcpy2D((uint8_t *)dev + s->doff, s->dpitch, src + s->soff, s->spitch, s->width,
                                s->height, hipMemcpyHostToDevice));
        memset(seen, 0, dn);
        REQUIRE_HIP(hipMemcpy(seen, dev, dn, hipMemcpyDeviceToHost));
        REQUIRE(check_surface(s, seen, dn, s->dpitch, s->doff, OUTSIDE_DEV, seed) == 0);

        /* device -> host into a surface of another pitch */
        memset(back, OUTSIDE_HOST, bn);
        REQUIRE_HIP(hipMemcpy2D(back + s->boff, s->bpitch, (uint8_t *)dev + s->doff, s->dpitch, s->width,
                                s->height, hipMemcpyDeviceToHost));
        REQUIRE(check_surface(s, back, bn, s->bpitch, s->boff, OUTSIDE_HOST, seed) == 0);

        REQUIRE_HIP(hipFree(dev));
        if (pinned) {
                REQUIRE_HIP(hipHostFree(src));
                REQUIRE_HIP(hipHostFree(back));
        } else {
                free(src);
                free(back);
        }
        free(seen);
        return 0;
}

int main(void)
{
        /* ROCr 5.2.3 takes a window to the SDMA engine's sub-window copy when both pitches and both starts
         * are whole dwords (it refuses a dword-aligned pitch with a start that is not); the widths are any
         * bytes. Pitches of odd bytes go row by row. */
        static const Shape shapes[] = {
                {.width = 1, .height = 1, .spitch = 4, .dpitch = 4, .bpitch = 4},
                {.width = 3,
                 .height = 7,
                 .spitch = 8,
                 .soff = 4,
                 .dpitch = 12,
                 .doff = 8,
                 .bpitch = 4,
                 .boff = 4},
                {.width = 37, .height = 300, .spitch = 44, .soff = 12, .dpitch = 64, .doff = 4, .bpitch = 40},
                {.width = 64, .height = 33, .spitch = 64, .dpitch = 128, .doff = 8, .bpitch = 96, .boff = 4},
                {.width = 1001,
                 .height = 129,
                 .spitch = 4100,
                 .soff = 16,
                 .dpitch = 1004,
                 .doff = 4,
                 .bpitch = 1024,
                 .boff = 12},
                /* more rows than one run of the engine copies */
                {.width = 37,
                 .height = 6000,
                 .spitch = 40,
                 .soff = 4,
                 .dpitch = 48,
                 .doff = 8,
                 .bpitch = 52,
                 .boff = 4},
                {.width = 5,
                 .height = 9,
                 .spitch = 7,
                 .soff = 1,
                 .dpitch = 9,
                 .doff = 3,
                 .bpitch = 5,
                 .boff = 2},
        };
        unsigned int seed = 1;

        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
                REQUIRE(round_trip(&shapes[i], false, seed++) == 0);
                REQUIRE(round_trip(&shapes[i], true, seed++) == 0);
                printf("hipMemcpy2D %zu x %zu bytes: ok\n", shapes[i].width, shapes[i].height);
        }
        printf("ok\n");
        return 0;
}
