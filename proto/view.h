/* The protobuf wire read in place and written by hand: fields off a body without protobuf-c's objects, the
 * small ops' requests packed straight into a frame, their replies read straight into plain structs. */
#pragma once

#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

/*
 * Why: a reply that protobuf-c unpacks becomes a tree of allocated messages that the caller copies out of
 * and frees again, and a request is a tree the caller builds to have it walked. For the ops a program calls
 * in its inner loops (ping, pointer queries, SVM attributes) those trees cost more than the rest of the
 * client's side of the round trip; here the same bytes are read and written where they lie.
 *
 * What is read is what protobuf-c reads, or refused: a field of a known number with the wrong wire type, a
 * varint longer than ten bytes, a length past the body, a group or a wire type protobuf-c does not take is
 * -EPROTO. Unknown fields are stepped over, a scalar given twice keeps the last value, a repeated scalar is
 * read in both its packed and its plain form, as protobuf-c does. Forms this reader does not take although
 * protobuf-c would (a message field given twice, which protobuf-c merges) are -ENOTSUP.
 */

/* Wire types. */
enum { GM_PB_VARINT = 0, GM_PB_FIXED64 = 1, GM_PB_LEN = 2, GM_PB_FIXED32 = 5 };

/* One field as read off the wire. */
typedef struct GmPbField {
        uint32_t id;
        unsigned wire;
        uint64_t v;          /* a varint's or a fixed field's value */
        const uint8_t *data; /* a length-delimited field's payload, or a varint's own bytes */
        size_t n;            /* its length */
} GmPbField;

/* The 7-bit groups of the eight bytes in @x gathered into 56 bits, in three steps of halving. */
static inline uint64_t gm_pb_gather7(uint64_t x)
{
        x = (x & 0x007f007f007f007full) | ((x & 0x7f007f007f007f00ull) >> 1);
        x = (x & 0x00003fff00003fffull) | ((x & 0x3fff00003fff0000ull) >> 2);
        return (x & 0x000000000fffffffull) | ((x & 0x0fffffff00000000ull) >> 4);
}

/*
 * The varint at @b + @i in a body of @len bytes (@i <= @len), at most ten bytes long: its length, or 0 when
 * it does not end in time. Bits beyond 64 are dropped, as protobuf-c drops them. Eight bytes are read at
 * once, never outside the body: forwards from @i where eight remain, else backwards from the body's end
 * when the body has eight, else in two loads of four bytes or fewer; the first clear top bit ends the varint.
 */
static inline __attribute__((always_inline)) size_t gm_pb_varint_at(const uint8_t *b, size_t len, size_t i,
                                                                    uint64_t *ret)
{
        size_t max = len - i;
        uint64_t w, stop, v = 0;
        unsigned n;

        if (max == 0)
                return 0;
        if (b[i] < 0x80) {
                *ret = b[i];
                return 1;
        }
        if (max >= 2 && b[i + 1] < 0x80) { /* two bytes: a tag of field 16 on, a length of 128 on */
                *ret = (uint64_t)(b[i] & 0x7f) | (uint64_t)b[i + 1] << 7;
                return 2;
        }
        if (max >= 8) {
                memcpy(&w, b + i, sizeof(w));
                w = le64toh(w);
                stop = ~w & 0x8080808080808080ull;
                if (!stop) { /* nine or ten bytes: the ninth and tenth hold bits 56-63 */
                        v = gm_pb_gather7(w);
                        if (max > 8 && b[i + 8] < 0x80) {
                                *ret = v | (uint64_t)b[i + 8] << 56;
                                return 9;
                        }
                        if (max > 9 && b[i + 9] < 0x80) {
                                *ret = v | (uint64_t)(b[i + 8] & 0x7f) << 56 | (uint64_t)b[i + 9] << 63;
                                return 10;
                        }
                        return 0;
                }
        } else if (len >= 8) {
                memcpy(&w, b + len - 8, sizeof(w));
                w = le64toh(w) >> (8 * (8 - max));
                stop = ~w & 0x8080808080808080ull & ((1ull << (8 * max)) - 1);
                if (!stop)
                        return 0;
        } else {
                /* a body of fewer than eight bytes: its 2 to 7 bytes from @i gathered by two loads that may
                 * overlap (the bytes they share are the same), so no byte outside the body is read */
                uint32_t lo32, hi32;
                uint16_t lo16;

                if (max >= 4) {
                        memcpy(&lo32, b + i, sizeof(lo32));
                        memcpy(&hi32, b + i + max - 4, sizeof(hi32));
                        w = (uint64_t)le32toh(lo32) | (uint64_t)le32toh(hi32) << (8 * (max - 4));
                } else if (max == 3) {
                        memcpy(&lo16, b + i, sizeof(lo16));
                        w = (uint64_t)le16toh(lo16) | (uint64_t)b[i + 2] << 16;
                } else {
                        return 0; /* one or two bytes, the last with its top bit set */
                }
                stop = ~w & 0x8080808080808080ull & ((1ull << (8 * max)) - 1);
                if (!stop)
                        return 0;
        }
        n = ((unsigned)__builtin_ctzll(stop) >> 3) + 1;
        *ret = gm_pb_gather7(n == 8 ? w : w & ((1ull << (8 * n)) - 1));
        return n;
}

/* The varint at @p of at most @max bytes: gm_pb_varint_at() with @p as the body. */
static inline __attribute__((always_inline)) size_t gm_pb_varint(const uint8_t *p, size_t max, uint64_t *ret)
{
        return gm_pb_varint_at(p, max, 0, ret);
}

/*
 * The field at *@at of @p (@len bytes), *@at then past it: 1, 0 at the end of the body, or -EPROTO when
 * what lies there is no field protobuf-c reads (a tag or a length of more than five bytes, a length beyond
 * 32 bits, field number 0 in a one-byte tag, a group, a value past the end).
 */
static inline __attribute__((always_inline)) int gm_pb_next(const uint8_t *p, size_t len, size_t *at,
                                                            GmPbField *f)
{
        size_t i = *at, a, b;
        uint64_t tag, n;

        if (i >= len)
                return 0;
        if (p[i] < 0x80) {
                tag = p[i];
                a = 1;
                if (tag < 8) /* field number 0 in one byte: refused there, though not in more */
                        return -EPROTO;
        } else if (!(a = gm_pb_varint_at(p, len, i, &tag)) || a > 5) {
                return -EPROTO;
        }
        i += a;
        f->id = (uint32_t)(tag >> 3); /* protobuf-c drops the bits beyond 32 */
        f->wire = (unsigned)(tag & 7);
        switch (f->wire) {
        case GM_PB_VARINT:
                if (!(b = gm_pb_varint_at(p, len, i, &f->v)))
                        return -EPROTO;
                f->data = p + i;
                f->n = b;
                break;
        case GM_PB_FIXED64:
        case GM_PB_FIXED32:
                b = f->wire == GM_PB_FIXED64 ? 8 : 4;
                if (len - i < b)
                        return -EPROTO;
                f->v = 0;
                for (size_t k = 0; k < b; k++)
                        f->v |= (uint64_t)p[i + k] << (8 * k);
                f->data = p + i;
                f->n = b;
                break;
        case GM_PB_LEN:
                if (i < len && p[i] < 0x80) {
                        n = p[i];
                        a = 1;
                } else if (!(a = gm_pb_varint_at(p, len, i, &n)) || a > 5 || n > UINT32_MAX) {
                        return -EPROTO;
                }
                i += a;
                if (n > len - i)
                        return -EPROTO;
                f->v = n;
                f->data = p + i;
                f->n = b = (size_t)n;
                break;
        default:
                return -EPROTO;
        }
        *at = i + b;
        return 1;
}

/* The size of @v as a varint: a byte per 7 bits of it, one at least. */
static inline size_t gm_pb_varint_size(uint64_t v)
{
        return (63 - (unsigned)__builtin_clzll(v | 1)) / 7 + 1;
}

/* Writing: a varint (at most ten bytes at @out), a varint field (at most eleven, for numbers below 16),
 * and the head of a length-delimited field (tag and length: at most eight). Each returns what it wrote. */
static inline size_t gm_pb_put_varint(uint8_t *out, uint64_t v)
{
        size_t n = 0;

        while (v >= 0x80) {
                out[n++] = (uint8_t)(v | 0x80);
                v >>= 7;
        }
        out[n++] = (uint8_t)v;
        return n;
}

/* The low 56 bits of @x spread into 7-bit groups, one a byte (gm_pb_gather7() undone), in three steps. */
static inline uint64_t gm_pb_spread7(uint64_t x)
{
        x = (x & 0x000000000fffffffull) | ((x & 0x00fffffff0000000ull) << 4);
        x = (x & 0x00003fff00003fffull) | ((x & 0x0fffc0000fffc000ull) << 2);
        return (x & 0x007f007f007f007full) | ((x & 0x3f803f803f803f80ull) << 1);
}

/*
 * The same for a buffer with room for ten bytes at @out whatever @v's size: a varint of up to eight bytes is
 * written as one word (its 7-bit groups spread in three steps of doubling, the continuation bits set on all
 * but its last byte), so up to eight bytes are written where fewer are meant; one of nine or ten as a word
 * and one or two bytes after it.
 */
static inline size_t gm_pb_put_varint_pad(uint8_t *out, uint64_t v)
{
        uint64_t x;
        unsigned n;

        if (v < 0x80) {
                out[0] = (uint8_t)v;
                return 1;
        }
        if (v < 0x4000) { /* two bytes are cheaper by hand */
                out[0] = (uint8_t)(v | 0x80);
                out[1] = (uint8_t)(v >> 7);
                return 2;
        }
        x = gm_pb_spread7(v & 0x00ffffffffffffffull);
        if (v >> 56) { /* nine or ten bytes (a handle, most often): eight whole, then bits 56-63 */
                x = htole64(x | 0x8080808080808080ull);
                memcpy(out, &x, sizeof(x));
                if (v >> 63) {
                        out[8] = (uint8_t)(v >> 56) | 0x80;
                        out[9] = 1;
                        return 10;
                }
                out[8] = (uint8_t)(v >> 56);
                return 9;
        }
        n = (unsigned)gm_pb_varint_size(v);
        x |= 0x8080808080808080ull & ((1ull << (8 * (n - 1))) - 1);
        x = htole64(x);
        memcpy(out, &x, sizeof(x));
        return n;
}

/* A varint field of a number below 16 written so (room for eleven bytes at @out). */
static inline size_t gm_pb_put_uint_pad(uint8_t *out, uint32_t id, uint64_t v)
{
        out[0] = (uint8_t)(id << 3 | GM_PB_VARINT);
        return 1 + gm_pb_put_varint_pad(out + 1, v);
}

static inline size_t gm_pb_put_uint(uint8_t *out, uint32_t id, uint64_t v)
{
        size_t n = gm_pb_put_varint(out, (uint64_t)id << 3 | GM_PB_VARINT);
        return n + gm_pb_put_varint(out + n, v);
}

static inline size_t gm_pb_put_len(uint8_t *out, uint32_t id, size_t len)
{
        size_t n = gm_pb_put_varint(out, (uint64_t)id << 3 | GM_PB_LEN);
        return n + gm_pb_put_varint(out + n, len);
}

/* Field @id packed: @count varints of @arr (none: nothing written). At most 8 + 10 * @count bytes, in a
 * buffer with room for 8 more (the varints are written as gm_pb_put_varint_pad() writes them). */
size_t gm_pb_put_packed(uint8_t *out, uint32_t id, const uint64_t *arr, size_t count);

/*
 * The small replies written by hand, byte for byte as protobuf-c packs them, for the daemon's answers to the
 * ops its clients call most: a successful Reply's head (status code 0, the result's tag and length; at most
 * GM_REPLY_HEAD_MAX bytes) before a result packed in place. Each returns what it wrote.
 */
#define GM_REPLY_HEAD_MAX 16
size_t gm_reply_ok_head(uint8_t *out, uint32_t result, size_t len);

/* A PointerInfoReply with every field set (as the daemon answers), into @out: room for
 * GM_POINTER_INFO_MAX(@n_mapped_gpus). */
typedef struct GmPointerInfoOut {
        uint64_t handle, alloc_base, size;
        int32_t kind;
        uint32_t gpu_id, flags;
        bool cpu_accessible;
        size_t n_mapped_gpus;
        const uint32_t *mapped_gpus;
} GmPointerInfoOut;
#define GM_POINTER_INFO_MAX(n) (7 * 11 + 2 + 6 * (n) + 8)
size_t gm_pack_pointer_info(uint8_t *out, const GmPointerInfoOut *m);

/*
 * A Reply body read in place: its status, and its result when that is the member numbered @want of the
 * Reply's oneof. @other is the number of another member that came instead (0: none), for the caller to
 * refuse. 0, -EPROTO (not a Reply protobuf-c reads), or -ENOTSUP (a status twice, or more than one result,
 * which protobuf-c merges or reads whole and then drops).
 */
typedef struct GmReplyView {
        bool has_code;
        int32_t code;
        const char *reason; /* not NUL-terminated: @reason_len bytes (NULL: none) */
        size_t reason_len;
        bool has_result;
        const uint8_t *result; /* the wanted result's payload */
        size_t result_len;
        uint32_t other;
} GmReplyView;
int gm_reply_view(const uint8_t *body, size_t len, uint32_t want, GmReplyView *ret);

/* A PointerInfoReply; the mapped GPUs beyond GM_VIEW_MAX_GPUS are counted, not kept. 0 or -EPROTO. */
#define GM_VIEW_MAX_GPUS 64
typedef struct GmPointerInfoView {
        uint64_t handle, alloc_base, size;
        int32_t kind;
        uint32_t gpu_id, flags;
        bool cpu_accessible;
        size_t n_mapped_gpus;
        uint32_t mapped_gpus[GM_VIEW_MAX_GPUS];
} GmPointerInfoView;
int gm_pointer_info_view(const uint8_t *p, size_t len, GmPointerInfoView *ret);

/* A Request body that is exactly one op field (length-delimited) and nothing else: the op's number and its
 * message. 0, or -EPROTO for any other body (the general way decides about it). */
int gm_request_op_view(const uint8_t *body, size_t len, uint32_t *ret_op, const uint8_t **ret_msg,
                       size_t *ret_len);

/* An SVM call (SvmSetAttr or SvmGetAttr: va 1, size 2, attributes as messages 3, packed 4): the packed
 * attributes into @out (room for @cap; more is -E2BIG), how many came as messages (read through, not kept)
 * in @n_msgs. 0, -EPROTO or -E2BIG. */
typedef struct GmSvmCallView {
        uint64_t va, size;
        size_t n, n_msgs;
} GmSvmCallView;
int gm_svm_call_view(const uint8_t *p, size_t len, uint64_t *out, size_t cap, GmSvmCallView *ret);

/* An SvmGetAttrReply: the packed attributes (field 2) into @out (room for @cap; more is -E2BIG), their
 * count in *@ret_n, and how many attributes came as messages (field 1, the older form) in *@ret_n_msgs.
 * 0, -EPROTO or -E2BIG. */
int gm_svm_attrs_view(const uint8_t *p, size_t len, uint64_t *out, size_t cap, size_t *ret_n,
                      size_t *ret_n_msgs);

/* An Empty: nothing but unknown fields, well formed. 0 or -EPROTO. */
int gm_empty_view(const uint8_t *p, size_t len);

/* A message whose field 1 is an optional uint64 (PingReply): 0 or -EPROTO. */
int gm_u64_view(const uint8_t *p, size_t len, bool *ret_has, uint64_t *ret_v);

/*
 * The field numbered @id of @desc, or NULL: what protobuf_c_message_descriptor_get_field() returns, found
 * without its search and the call into the library (every request and reply looks up its op's field).
 */
const ProtobufCFieldDescriptor *gm_proto_field(const ProtobufCMessageDescriptor *desc, uint32_t id);
