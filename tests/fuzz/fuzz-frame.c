/* libFuzzer target: the frame header check (gm_frame_parse) and the encoder's agreement with it. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        GmFrameHdr hdr, again;
        const char *why = NULL;
        uint8_t enc[GM_FRAME_HDR_SIZE];
        size_t n_fds;
        int r;

        if (size < 1)
                return 0;
        /* the first byte is the number of fds that "arrived" with the packet */
        n_fds = data[0] % (GM_FRAME_MAX_FDS + 4);
        data++, size--;
        memset(&hdr, 0xa5, sizeof(hdr));
        r = gm_frame_parse(data, size, n_fds, 1, &hdr, &why);
        if (r < 0) {
                /* every failure is one of the documented errnos and carries a reason */
                if (r != -EBADMSG && r != -EPROTO && r != -EPROTONOSUPPORT && r != -EMSGSIZE && r != -E2BIG)
                        abort();
                if (!why)
                        abort();
                return 0;
        }
        /* accepted: the header is self-consistent and within limits */
        if (hdr.magic != GM_FRAME_MAGIC || hdr.version == 0 || hdr.version > 1 ||
            hdr.body_len > GM_FRAME_BODY_MAX || hdr.n_fds != n_fds || hdr.n_fds > GM_FRAME_MAX_FDS ||
            (size_t)hdr.body_len + GM_FRAME_HDR_SIZE != size)
                abort();
        /* and re-encoding it gives the same bytes */
        if (gm_frame_hdr_encode(enc, hdr.version, hdr.request_id, hdr.body_len, hdr.n_fds) != 0)
                abort();
        if (memcmp(enc, data, GM_FRAME_HDR_SIZE) != 0)
                abort();
        if (gm_frame_parse(enc, GM_FRAME_HDR_SIZE, n_fds, 1, &again, NULL) == 0 && hdr.body_len != 0)
                abort(); /* a bare header cannot be a frame with a body */
        return 0;
}
