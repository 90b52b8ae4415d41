/* Unit tests of the frame header: round trip and every malformed case, plus packet I/O with fds. */
#include <fcntl.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/check.h"
#include "frame.h"
#include "wire.h"

static size_t make(uint8_t *buf, uint16_t version, uint32_t id, uint32_t body_len, unsigned n_fds)
{
        CHECK_EQ(gm_frame_hdr_encode(buf, version, id, body_len, n_fds), 0);
        memset(buf + GM_FRAME_HDR_SIZE, 0xab, body_len);
        return GM_FRAME_HDR_SIZE + body_len;
}

static void test_roundtrip(void)
{
        uint8_t buf[GM_FRAME_HDR_SIZE + 32];
        const char *why = "x";
        GmFrameHdr h;
        size_t len = make(buf, 1, 0xdeadbeef, 32, 2);

        CHECK_EQ(gm_frame_parse(buf, len, 2, GM_PROTOCOL_VERSION, &h, &why), 0);
        CHECK(why == NULL);
        CHECK_EQ(h.magic, GM_FRAME_MAGIC);
        CHECK_EQ(h.version, 1);
        CHECK_EQ(h.n_fds, 2);
        CHECK_EQ(h.body_len, 32);
        CHECK_EQ(h.request_id, 0xdeadbeef);
        /* little-endian on the wire, whatever the host */
        CHECK_EQ(buf[0], 0x47);
        CHECK_EQ(buf[12], 0xef);
}

static void test_encode_limits(void)
{
        uint8_t buf[GM_FRAME_HDR_SIZE];
        CHECK_EQ(gm_frame_hdr_encode(buf, 1, 1, GM_FRAME_BODY_MAX + 1, 0), -EMSGSIZE);
        CHECK_EQ(gm_frame_hdr_encode(buf, 1, 1, 0, GM_FRAME_MAX_FDS + 1), -E2BIG);
        CHECK_EQ(gm_frame_hdr_encode(buf, 1, 1, GM_FRAME_BODY_MAX, GM_FRAME_MAX_FDS), 0);
}

static void test_malformed(void)
{
        static uint8_t buf[GM_FRAME_MAX + 64];
        const char *why;
        GmFrameHdr h;
        size_t len;

        /* shorter than a header: every length from 0 to 15 */
        make(buf, 1, 7, 0, 0);
        for (size_t l = 0; l < GM_FRAME_HDR_SIZE; l++) {
                why = NULL;
                CHECK_EQ(gm_frame_parse(buf, l, 0, 1, &h, &why), -EBADMSG);
                CHECK(why != NULL);
        }
        /* wrong magic */
        len = make(buf, 1, 7, 4, 0);
        buf[0] ^= 0xff;
        CHECK_EQ(gm_frame_parse(buf, len, 0, 1, &h, &why), -EPROTO);
        CHECK_STR_CONTAINS(why, "magic");
        CHECK_EQ(h.request_id, 7); /* still readable, so the error can answer the right request */
        /* version 0 and a version from the future */
        len = make(buf, 0, 7, 4, 0);
        CHECK_EQ(gm_frame_parse(buf, len, 0, 1, &h, &why), -EPROTONOSUPPORT);
        len = make(buf, 2, 7, 4, 0);
        CHECK_EQ(gm_frame_parse(buf, len, 0, 1, &h, &why), -EPROTONOSUPPORT);
        /* body longer than the limit, claimed in the header */
        len = make(buf, 1, 7, 4, 0);
        buf[8] = 0xff, buf[9] = 0xff, buf[10] = 0xff, buf[11] = 0x7f;
        CHECK_EQ(gm_frame_parse(buf, len, 0, 1, &h, &why), -EMSGSIZE);
        /* too many fds claimed */
        len = make(buf, 1, 7, 4, 0);
        buf[6] = GM_FRAME_MAX_FDS + 1;
        CHECK_EQ(gm_frame_parse(buf, len, GM_FRAME_MAX_FDS + 1, 1, &h, &why), -E2BIG);
        /* truncated body and trailing bytes */
        len = make(buf, 1, 7, 100, 0);
        CHECK_EQ(gm_frame_parse(buf, len - 1, 0, 1, &h, &why), -EBADMSG);
        CHECK_STR_CONTAINS(why, "truncated");
        CHECK_EQ(gm_frame_parse(buf, len + 1, 0, 1, &h, &why), -EBADMSG);
        CHECK_STR_CONTAINS(why, "trailing");
        /* fd count mismatch both ways */
        len = make(buf, 1, 7, 4, 1);
        CHECK_EQ(gm_frame_parse(buf, len, 0, 1, &h, &why), -EPROTO);
        CHECK_EQ(gm_frame_parse(buf, len, 2, 1, &h, &why), -EPROTO);
        CHECK_EQ(gm_frame_parse(buf, len, 1, 1, &h, &why), 0);
        /* the largest legal frame */
        len = make(buf, 1, 7, GM_FRAME_BODY_MAX, 0);
        CHECK_EQ(gm_frame_parse(buf, len, 0, 1, &h, &why), 0);
}

static void test_wire_fds(void)
{
        int sv[2], fds[GM_FRAME_MAX_FDS], got[GM_FRAME_MAX_FDS];
        uint8_t hdr[GM_FRAME_HDR_SIZE], rx[256];
        size_t n = 0;
        ssize_t len;

        CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        for (int i = 0; i < 3; i++)
                fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        gm_frame_hdr_encode(hdr, 1, 9, 5, 3);
        CHECK_EQ(gm_wire_send(sv[0], hdr, sizeof(hdr), "hello", 5, fds, 3, 0), 0);
        len = gm_wire_recv(sv[1], rx, sizeof(rx), got, &n, 0);
        CHECK_EQ(len, GM_FRAME_HDR_SIZE + 5);
        CHECK_EQ(n, 3);
        for (size_t i = 0; i < n; i++)
                CHECK(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
        gm_wire_close_fds(got, n);

        /* a packet larger than the buffer is consumed and reported, its fds closed */
        CHECK_EQ(gm_wire_send(sv[0], hdr, sizeof(hdr), "hello", 5, fds, 1, 0), 0);
        len = gm_wire_recv(sv[1], rx, 8, got, &n, 0);
        CHECK_EQ(len, -EMSGSIZE);
        CHECK_EQ(n, 0);

        /* more fds than the control buffer holds: MSG_CTRUNC, all fds closed */
        {
                int many[GM_FRAME_MAX_FDS + 4];
                for (size_t i = 0; i < ARRAY_SIZE(many); i++)
                        many[i] = fds[0];
                CHECK_EQ(send_with_fds(sv[0], hdr, sizeof(hdr), many, ARRAY_SIZE(many), 0),
                         (ssize_t)sizeof(hdr));
                int before = count_fds(0);
                len = gm_wire_recv(sv[1], rx, sizeof(rx), got, &n, 0);
                CHECK_EQ(len, -EPROTO);
                CHECK_EQ(count_fds(0), before);
        }
        /* nothing to read on a non-blocking call */
        CHECK_EQ(gm_wire_recv(sv[1], rx, sizeof(rx), got, &n, MSG_DONTWAIT), -EAGAIN);
        /* peer gone: EPIPE, never SIGPIPE */
        close(sv[1]);
        CHECK_EQ(gm_wire_send(sv[0], hdr, sizeof(hdr), NULL, 0, NULL, 0, 0), -EPIPE);
        close(sv[0]);
        gm_wire_close_fds(fds, 3);
}

int main(void)
{
        static const TestCase cases[] = {
                {"frame round trip", test_roundtrip},
                {"encode limits", test_encode_limits},
                {"malformed headers", test_malformed},
                {"packet I/O with fds", test_wire_fds},
        };
        return run_tests(cases, ARRAY_SIZE(cases));
}
