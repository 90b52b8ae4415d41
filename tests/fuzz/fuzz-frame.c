/* libFuzzer target: the frame header check (gm_frame_parse) and the encoder's agreement with it; the Request
 * and Reply envelopes (envelope.c) and the replies read in place (view.c) against protobuf-c's general
 * coding of the same bytes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "frame.h"
#include "view.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* @a and @b packed (the envelope's way for @a): the same bytes. */
static void same_reply(const Gpumem__Reply *a, const Gpumem__Reply *b)
{
        size_t na = gpumem__reply__get_packed_size(b), nb = 0;
        uint8_t *x = malloc(na + 1), *y = malloc(na + 1);

        if (!x || !y)
                abort();
        if (gpumem__reply__pack(b, x) != na || gm_reply_pack_into(a, y, na, &nb) != 0 || nb != na ||
            memcmp(x, y, na) != 0)
                abort();
        free(x);
        free(y);
}

/* Any bytes as a Request and as a Reply body: where the envelope decodes them, protobuf-c gives the same
 * message; whatever protobuf-c decodes, the envelope packs to the bytes protobuf-c packs. */
static void envelopes(const uint8_t *data, size_t size)
{
        Gpumem__Request *qa = NULL, *qb = gpumem__request__unpack(NULL, size, data);
        Gpumem__Reply *ra = NULL, *rb = gpumem__reply__unpack(NULL, size, data);

        if (gm_request_unpack_op(NULL, data, size, &qa) == 1) {
                if (!qb || qa->op_case != qb->op_case)
                        abort();
        }
        if (qb) {
                size_t n = gpumem__request__get_packed_size(qb), m = 0;
                uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
                if (!x || !y || gpumem__request__pack(qb, x) != n)
                        abort();
                if (!qb->base.n_unknown_fields &&
                    (gm_request_pack_into(qb, y, n, &m) != 0 || m != n || memcmp(x, y, n) != 0))
                        abort();
                if (qa) { /* the envelope's message packs as the general one does */
                        if (gm_request_pack_into(qa, y, n, &m) != 0 || m != n || memcmp(x, y, n) != 0)
                                abort();
                }
                free(x);
                free(y);
        }
        if (gm_reply_unpack_result(NULL, data, size, &ra) == 1) {
                if (!rb || ra->result_case != rb->result_case || !ra->status != !rb->status)
                        abort();
                same_reply(ra, rb);
        }
        if (rb && !rb->base.n_unknown_fields)
                same_reply(rb, rb);
        if (qa)
                gpumem__request__free_unpacked(qa, NULL);
        if (qb)
                gpumem__request__free_unpacked(qb, NULL);
        if (ra)
                gpumem__reply__free_unpacked(ra, NULL);
        if (rb)
                gpumem__reply__free_unpacked(rb, NULL);
}

/* Any bytes as a Reply read in place, from a buffer of exactly their size (a read past it is caught): a
 * result read so is one protobuf-c reads as that result too. */
static void views(const uint8_t *data, size_t size)
{
        static const uint32_t wants[] = {GPUMEM__REPLY__RESULT_POINTER_INFO,
                                         GPUMEM__REPLY__RESULT_SVM_GET_ATTR, GPUMEM__REPLY__RESULT_PING,
                                         GPUMEM__REPLY__RESULT_EMPTY};
        uint8_t *body = malloc(size ? size : 1);
        Gpumem__Reply *pb;

        if (!body)
                abort();
        memcpy(body, data, size);
        pb = gpumem__reply__unpack(NULL, size, body);
        for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++) {
                GmReplyView v;
                GmPointerInfoView pi;
                uint64_t attrs[64], cookie;
                size_t n, n_msgs;
                bool has;
                int r;
                if (gm_reply_view(body, size, wants[i], &v) < 0 || !v.has_result)
                        continue;
                if (wants[i] == GPUMEM__REPLY__RESULT_POINTER_INFO)
                        r = gm_pointer_info_view(v.result, v.result_len, &pi);
                else if (wants[i] == GPUMEM__REPLY__RESULT_SVM_GET_ATTR)
                        r = gm_svm_attrs_view(v.result, v.result_len, attrs, 64, &n, &n_msgs);
                else if (wants[i] == GPUMEM__REPLY__RESULT_PING)
                        r = gm_u64_view(v.result, v.result_len, &has, &cookie);
                else
                        r = gm_empty_view(v.result, v.result_len);
                if (r == 0 && (!pb || (uint32_t)pb->result_case != wants[i]))
                        abort();
        }
        if (pb)
                gpumem__reply__free_unpacked(pb, NULL);
        free(body);
}

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
        envelopes(data, size);
        views(data, size);
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
