/* gpumemd frame header: pure encode/check, no I/O and no allocation (fuzzed directly). */
#include "frame.h"

#include <errno.h>
#include <string.h>

static void put_le16(uint8_t *p, uint16_t v)
{
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_le16(const uint8_t *p)
{
        return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p)
{
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

int gm_frame_hdr_encode(uint8_t out[GM_FRAME_HDR_SIZE], uint16_t version, uint32_t request_id,
                        uint32_t body_len, unsigned n_fds)
{
        if (body_len > GM_FRAME_BODY_MAX)
                return -EMSGSIZE;
        if (n_fds > GM_FRAME_MAX_FDS)
                return -E2BIG;
        put_le32(out, GM_FRAME_MAGIC);
        put_le16(out + 4, version);
        put_le16(out + 6, (uint16_t)n_fds);
        put_le32(out + 8, body_len);
        put_le32(out + 12, request_id);
        return 0;
}

int gm_frame_parse(const uint8_t *buf, size_t len, size_t n_fds_received, uint16_t max_version,
                   GmFrameHdr *ret, const char **ret_reason)
{
        GmFrameHdr h;
        const char *reason_unused;

        if (!ret_reason)
                ret_reason = &reason_unused;
        memset(&h, 0, sizeof(h));
        if (len < GM_FRAME_HDR_SIZE) {
                *ret = h;
                *ret_reason = "frame shorter than its header";
                return -EBADMSG;
        }
        h.magic = get_le32(buf);
        h.version = get_le16(buf + 4);
        h.n_fds = get_le16(buf + 6);
        h.body_len = get_le32(buf + 8);
        h.request_id = get_le32(buf + 12);
        *ret = h;

        if (h.magic != GM_FRAME_MAGIC) {
                *ret_reason = "bad frame magic";
                return -EPROTO;
        }
        if (h.version == 0 || h.version > max_version) {
                *ret_reason = "unsupported protocol version in frame header";
                return -EPROTONOSUPPORT;
        }
        if (h.body_len > GM_FRAME_BODY_MAX) {
                *ret_reason = "frame body over the size limit";
                return -EMSGSIZE;
        }
        if (h.n_fds > GM_FRAME_MAX_FDS) {
                *ret_reason = "too many fds in frame header";
                return -E2BIG;
        }
        if (len - GM_FRAME_HDR_SIZE != h.body_len) {
                *ret_reason = len - GM_FRAME_HDR_SIZE < h.body_len
                                      ? "frame truncated: body shorter than header says"
                                      : "trailing bytes after frame body";
                return -EBADMSG;
        }
        if (n_fds_received != h.n_fds) {
                *ret_reason = "fds received disagree with the header's fd count";
                return -EPROTO;
        }
        *ret_reason = NULL;
        return 0;
}
