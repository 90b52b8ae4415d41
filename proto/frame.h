/* gpumemd frame header: encode and check the fixed header that precedes every protobuf body. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * One frame per SOCK_SEQPACKET packet:
 *
 *   0        4        6        8                12               16
 *   +--------+--------+--------+----------------+----------------+---------------------+
 *   | magic  |version | n_fds  |   body_len     |   request_id   | protobuf body ...   |
 *   +--------+--------+--------+----------------+----------------+---------------------+
 *
 * All integers little-endian. n_fds fds travel with the packet as SCM_RIGHTS. Replies echo request_id.
 * Everything here is checked before anything is allocated or unpacked.
 */
#define GM_FRAME_MAGIC      0x4d454d47u /* "GMEM" */
#define GM_PROTOCOL_VERSION 4u
/* The oldest version there is: what the daemon answers in before hello agreed on one (every client reads
 * it; the header is the same in every version). */
#define GM_PROTOCOL_VERSION_MIN 1u

/* Hello.features bits. */
/* (since 2) The client's window must lie below 1 TiB: libhsakmt 5.2 takes an SVM aperture only there. */
#define GM_HELLO_LOW_WINDOW 1ull
#define GM_LOW_WINDOW_END   (1ull << 40)
#define GM_FRAME_HDR_SIZE   16u
#define GM_FRAME_MAX        (128u * 1024u) /* header + body */
#define GM_FRAME_BODY_MAX   (GM_FRAME_MAX - GM_FRAME_HDR_SIZE)
#define GM_FRAME_MAX_FDS    16u

typedef struct GmFrameHdr {
        uint32_t magic;
        uint16_t version;
        uint16_t n_fds;
        uint32_t body_len;
        uint32_t request_id;
} GmFrameHdr;

/* Write a header into @out. Returns -EMSGSIZE or -E2BIG when the body or fd count is over the limits. */
int gm_frame_hdr_encode(uint8_t out[GM_FRAME_HDR_SIZE], uint16_t version, uint32_t request_id,
                        uint32_t body_len, unsigned n_fds);

/*
 * Check a received packet of @len bytes that arrived with @n_fds_received fds. On success fills @ret and
 * returns 0; the body is at buf + GM_FRAME_HDR_SIZE. On failure returns a negative errno and sets
 * *ret_reason to a static message; @ret then still holds whatever header fields could be read (request_id
 * is valid whenever len >= GM_FRAME_HDR_SIZE), so the caller can answer the right request.
 *   -EBADMSG   shorter than a header, or len disagrees with body_len (truncated or trailing bytes)
 *   -EPROTO    wrong magic, or fds that disagree with the header's n_fds
 *   -EPROTONOSUPPORT  version 0 or newer than @max_version
 *   -EMSGSIZE  body_len over GM_FRAME_BODY_MAX
 *   -E2BIG     n_fds over GM_FRAME_MAX_FDS
 */
int gm_frame_parse(const uint8_t *buf, size_t len, size_t n_fds_received, uint16_t max_version,
                   GmFrameHdr *ret, const char **ret_reason);
