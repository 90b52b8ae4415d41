/* The small replies read in place (view.h): a Reply's status and result, pointer info, SVM attributes. */
#include "view.h"
#include "gpumem.pb-c.h"

/*
 * The forms the daemon and the client library write (every field once, in order, the fewest bytes) are
 * read first by straight-line code that expects them byte by byte; anything else, or anything unexpected on
 * the way, goes to the general reader, which starts again from the beginning. What the short way reads is
 * what the general way reads of the same bytes.
 */

const ProtobufCFieldDescriptor *gm_proto_field(const ProtobufCMessageDescriptor *desc, uint32_t id)
{
        const ProtobufCIntRange *r = desc->field_ranges;

        /* Each range is a run of consecutive numbers starting at fields[orig_index]; the entry after the
         * last holds the field count as its orig_index. A message has a few runs: a scan beats a search. */
        for (unsigned i = 0; i < desc->n_field_ranges; i++) {
                uint32_t start = (uint32_t)r[i].start_value;
                uint32_t count = (uint32_t)(r[i + 1].orig_index - r[i].orig_index);
                if (id >= start && id - start < count)
                        return &desc->fields[(uint32_t)r[i].orig_index + (id - start)];
        }
        return NULL;
}

/* A one-byte tag @tag at *@at, then a varint: its value, *@at past it. */
static inline __attribute__((always_inline)) bool expect_uint(const uint8_t *p, size_t len, size_t *at,
                                                              uint8_t tag, uint64_t *ret)
{
        size_t i = *at, a;

        if (i >= len || p[i] != tag || !(a = gm_pb_varint_at(p, len, i + 1, ret)))
                return false;
        *at = i + 1 + a;
        return true;
}

/* A one-byte tag @tag at *@at, then a length that runs to the end of the body: *@at at the payload. */
static inline __attribute__((always_inline)) bool expect_last_len(const uint8_t *p, size_t len, size_t *at,
                                                                  uint8_t tag)
{
        uint64_t n;
        size_t i = *at, a;

        if (i >= len || p[i] != tag || !(a = gm_pb_varint_at(p, len, i + 1, &n)) || a > 5 ||
            n != len - i - 1 - a)
                return false;
        *at = i + 1 + a;
        return true;
}

/* Packed varints filling @p's @len bytes into @out (room for @cap), counted in *@n; false when one does not
 * end in time or there is no room (the general way then says which). */
static inline bool read_packed(const uint8_t *p, size_t len, uint64_t *out, size_t cap, size_t *n)
{
        for (size_t k = 0, a; k < len; k += a) {
                if (*n == cap || !(a = gm_pb_varint_at(p, len, k, &out[*n])))
                        return false;
                (*n)++;
        }
        return true;
}

size_t gm_pb_put_packed(uint8_t *out, uint32_t id, const uint64_t *arr, size_t count)
{
        size_t n, body = 0;

        if (!count)
                return 0;
        for (size_t i = 0; i < count; i++)
                body += gm_pb_varint_size(arr[i]);
        n = gm_pb_put_len(out, id, body);
        for (size_t i = 0; i < count; i++)
                n += gm_pb_put_varint_pad(out + n, arr[i]);
        return n;
}

size_t gm_reply_ok_head(uint8_t *out, uint32_t result, size_t len)
{
        size_t n = 0;

        /* status {code: 0}: field 1 of two bytes, its code 0 (a sint32 zero) */
        out[n++] = 1 << 3 | GM_PB_LEN;
        out[n++] = 2;
        out[n++] = 1 << 3 | GM_PB_VARINT;
        out[n++] = 0;
        return n + gm_pb_put_len(out + n, result, len);
}

size_t gm_pack_pointer_info(uint8_t *out, const GmPointerInfoOut *m)
{
        size_t n = 0;

        n += gm_pb_put_uint_pad(out + n, 1, m->handle);
        n += gm_pb_put_uint_pad(out + n, 2, (uint64_t)(int64_t)m->kind); /* an enum: int32, sign-extended */
        n += gm_pb_put_uint_pad(out + n, 3, m->gpu_id);
        n += gm_pb_put_uint_pad(out + n, 4, m->alloc_base);
        n += gm_pb_put_uint_pad(out + n, 5, m->size);
        for (size_t i = 0; i < m->n_mapped_gpus; i++) /* not packed: a tag each */
                n += gm_pb_put_uint_pad(out + n, 6, m->mapped_gpus[i]);
        n += gm_pb_put_uint_pad(out + n, 7, m->flags);
        out[n++] = 8 << 3 | GM_PB_VARINT;
        out[n++] = m->cpu_accessible ? 1 : 0;
        return n;
}

/*
 * A bool as protobuf-c reads it: true when any payload bit of what follows its tag is set, whatever the
 * wire type (a varint's dropped bits beyond 64 included; a length-delimited one's length counts too).
 */
static bool field_bool(const GmPbField *f)
{
        if (f->wire == GM_PB_LEN && f->n)
                return true;
        for (size_t i = 0; i < f->n; i++)
                if (f->data[i] & 0x7f)
                        return true;
        return false;
}

static int read_status(const uint8_t *p, size_t len, GmReplyView *v)
{
        GmPbField f;
        size_t at = 0;
        int r;

        while ((r = gm_pb_next(p, len, &at, &f)) > 0) {
                if (f.id == 1) { /* sint32: zigzag over the low 32 bits */
                        uint32_t u = (uint32_t)f.v;
                        if (f.wire != GM_PB_VARINT)
                                return -EPROTO;
                        v->has_code = true;
                        v->code = (int32_t)(u >> 1) ^ -(int32_t)(u & 1);
                } else if (f.id == 2) {
                        if (f.wire != GM_PB_LEN)
                                return -EPROTO;
                        v->reason = (const char *)f.data;
                        v->reason_len = f.n;
                }
        }
        return r;
}

/* The daemon's answer: status {code 0}, then the wanted result, which ends the body. */
static bool reply_daemon_form(const uint8_t *body, size_t len, uint32_t want, GmReplyView *ret)
{
        static const uint8_t ok[4] = {1 << 3 | GM_PB_LEN, 2, 1 << 3 | GM_PB_VARINT, 0};
        uint64_t tag, n;
        size_t i = sizeof(ok), a, b;

        /* a result is a member numbered 2 or more (1 is the status, 0 no field) */
        if (want < 2 || len < sizeof(ok) + 2 || memcmp(body, ok, sizeof(ok)) != 0)
                return false;
        if (!(a = gm_pb_varint_at(body, len, i, &tag)) || a > 5 || tag != ((uint64_t)want << 3 | GM_PB_LEN))
                return false;
        i += a;
        if (!(b = gm_pb_varint_at(body, len, i, &n)) || b > 5 || n != len - i - b)
                return false;
        *ret = (GmReplyView){.has_code = true, .has_result = true, .result = body + i + b, .result_len = n};
        return true;
}

int gm_reply_view(const uint8_t *body, size_t len, uint32_t want, GmReplyView *ret)
{
        GmReplyView v = {0};
        bool status = false;
        unsigned results = 0;
        GmPbField f;
        size_t at = 0;
        int r;

        if (reply_daemon_form(body, len, want, ret))
                return 0;
        while ((r = gm_pb_next(body, len, &at, &f)) > 0) {
                if (f.id == 1) {
                        if (f.wire != GM_PB_LEN)
                                return -EPROTO;
                        if (status)
                                return -ENOTSUP;
                        status = true;
                        if ((r = read_status(f.data, f.n, &v)) < 0)
                                return r;
                } else if (f.id == want || gm_proto_field(&gpumem__reply__descriptor, f.id)) {
                        /* a result: the one wanted, or another (which protobuf-c would read whole) */
                        if (f.wire != GM_PB_LEN)
                                return -EPROTO;
                        if (++results > 1)
                                return -ENOTSUP;
                        if (f.id == want) {
                                v.has_result = true;
                                v.result = f.data;
                                v.result_len = f.n;
                        } else {
                                v.other = f.id;
                        }
                }
        }
        if (r < 0)
                return r;
        *ret = v;
        return 0;
}

/* The daemon's answer: fields 1 to 5, the mapped GPUs, the flags, and a one-byte bool to end it. */
static bool pointer_info_daemon_form(const uint8_t *p, size_t len, GmPointerInfoView *ret)
{
        uint64_t kind, gpu_id, flags, g;
        size_t at = 0, n = 0;

        if (!expect_uint(p, len, &at, 1 << 3, &ret->handle) || !expect_uint(p, len, &at, 2 << 3, &kind) ||
            !expect_uint(p, len, &at, 3 << 3, &gpu_id) ||
            !expect_uint(p, len, &at, 4 << 3, &ret->alloc_base) ||
            !expect_uint(p, len, &at, 5 << 3, &ret->size))
                return false;
        while (at < len && p[at] == 6 << 3) {
                if (!expect_uint(p, len, &at, 6 << 3, &g))
                        return false;
                if (n < GM_VIEW_MAX_GPUS)
                        ret->mapped_gpus[n] = (uint32_t)g;
                n++;
        }
        if (!expect_uint(p, len, &at, 7 << 3, &flags) || len - at != 2 || p[at] != 8 << 3 ||
            p[at + 1] >= 0x80)
                return false;
        ret->kind = (int32_t)(uint32_t)kind;
        ret->gpu_id = (uint32_t)gpu_id;
        ret->flags = (uint32_t)flags;
        ret->cpu_accessible = p[at + 1] != 0;
        ret->n_mapped_gpus = n;
        return true;
}

int gm_pointer_info_view(const uint8_t *p, size_t len, GmPointerInfoView *ret)
{
        GmPbField f;
        size_t at = 0;
        int r;

        if (pointer_info_daemon_form(p, len, ret))
                return 0;
        memset(ret, 0, offsetof(GmPointerInfoView, mapped_gpus));
        while ((r = gm_pb_next(p, len, &at, &f)) > 0) {
                if (f.id == 0 || f.id > 8) /* unknown */
                        continue;
                if (f.id == 6 && f.wire == GM_PB_LEN) { /* the packed form */
                        for (size_t k = 0, a; k < f.n; k += a) {
                                uint64_t g;
                                if (!(a = gm_pb_varint_at(f.data, f.n, k, &g)))
                                        return -EPROTO;
                                if (ret->n_mapped_gpus < GM_VIEW_MAX_GPUS)
                                        ret->mapped_gpus[ret->n_mapped_gpus] = (uint32_t)g;
                                ret->n_mapped_gpus++;
                        }
                        continue;
                }
                if (f.id == 8) {
                        ret->cpu_accessible = field_bool(&f);
                        continue;
                }
                if (f.wire != GM_PB_VARINT)
                        return -EPROTO;
                switch (f.id) {
                case 1:
                        ret->handle = f.v;
                        break;
                case 2: /* an enum is an int32 */
                        ret->kind = (int32_t)(uint32_t)f.v;
                        break;
                case 3:
                        ret->gpu_id = (uint32_t)f.v;
                        break;
                case 4:
                        ret->alloc_base = f.v;
                        break;
                case 5:
                        ret->size = f.v;
                        break;
                case 6:
                        if (ret->n_mapped_gpus < GM_VIEW_MAX_GPUS)
                                ret->mapped_gpus[ret->n_mapped_gpus] = (uint32_t)f.v;
                        ret->n_mapped_gpus++;
                        break;
                default:
                        ret->flags = (uint32_t)f.v;
                        break;
                }
        }
        return r;
}

/* @f as an SVM attribute field: an SvmAttr message (number @msg_id; read through, counted in *@n_msgs) or
 * packed attributes (@packed_id, either form) appended to @out (room for @cap). 1 when it was one, 0 when
 * not, or -EPROTO / -E2BIG. */
static int svm_attr_field(const GmPbField *f, uint32_t msg_id, uint32_t packed_id, uint64_t *out, size_t cap,
                          size_t *n, size_t *n_msgs)
{
        if (f->id == msg_id) {
                GmPbField g;
                size_t k = 0;
                int r;
                if (f->wire != GM_PB_LEN)
                        return -EPROTO;
                while ((r = gm_pb_next(f->data, f->n, &k, &g)) > 0)
                        if ((g.id == 1 || g.id == 2) && g.wire != GM_PB_VARINT) /* type, value: uint32 */
                                return -EPROTO;
                if (r < 0)
                        return r;
                (*n_msgs)++;
                return 1;
        }
        if (f->id != packed_id)
                return 0;
        if (f->wire == GM_PB_LEN) {
                for (size_t k = 0, a; k < f->n; k += a, (*n)++) {
                        uint64_t v;
                        if (!(a = gm_pb_varint_at(f->data, f->n, k, &v)))
                                return -EPROTO;
                        if (*n == cap)
                                return -E2BIG;
                        out[*n] = v;
                }
                return 1;
        }
        if (f->wire != GM_PB_VARINT)
                return -EPROTO;
        if (*n == cap)
                return -E2BIG;
        out[(*n)++] = f->v;
        return 1;
}

int gm_svm_attrs_view(const uint8_t *p, size_t len, uint64_t *out, size_t cap, size_t *ret_n,
                      size_t *ret_n_msgs)
{
        size_t n = 0, n_msgs = 0, at = 0;
        GmPbField f;
        int r;

        /* the daemon's answer: nothing, or the packed attributes alone */
        if (len == 0 || (expect_last_len(p, len, &at, 2 << 3 | GM_PB_LEN) &&
                         read_packed(p + at, len - at, out, cap, &n))) {
                *ret_n = n;
                *ret_n_msgs = 0;
                return 0;
        }
        n = at = 0;
        while ((r = gm_pb_next(p, len, &at, &f)) > 0)
                if ((r = svm_attr_field(&f, 1, 2, out, cap, &n, &n_msgs)) < 0)
                        return r;
        if (r < 0)
                return r;
        *ret_n = n;
        *ret_n_msgs = n_msgs;
        return 0;
}

int gm_svm_call_view(const uint8_t *p, size_t len, uint64_t *out, size_t cap, GmSvmCallView *ret)
{
        GmSvmCallView v = {0};
        size_t at = 0;
        GmPbField f;
        int r;

        /* the client library's call: va, size, and the packed attributes (if any) to end it */
        if (expect_uint(p, len, &at, 1 << 3, &v.va) && expect_uint(p, len, &at, 2 << 3, &v.size) &&
            (at == len || (expect_last_len(p, len, &at, 4 << 3 | GM_PB_LEN) &&
                           read_packed(p + at, len - at, out, cap, &v.n)))) {
                *ret = v;
                return 0;
        }
        v = (GmSvmCallView){0};
        at = 0;
        while ((r = gm_pb_next(p, len, &at, &f)) > 0) {
                if (f.id == 1 || f.id == 2) {
                        if (f.wire != GM_PB_VARINT)
                                return -EPROTO;
                        *(f.id == 1 ? &v.va : &v.size) = f.v;
                } else if ((r = svm_attr_field(&f, 3, 4, out, cap, &v.n, &v.n_msgs)) < 0) {
                        return r;
                }
        }
        if (r < 0)
                return r;
        *ret = v;
        return 0;
}

int gm_request_op_view(const uint8_t *body, size_t len, uint32_t *ret_op, const uint8_t **ret_msg,
                       size_t *ret_len)
{
        GmPbField f;
        size_t at = 0;

        /* the client library's request of a short message: a tag of one or two bytes, a length of one */
        if (len >= 2 && body[0] >= 1 << 3 && body[0] < 0x80 && (body[0] & 7) == GM_PB_LEN && body[1] < 0x80 &&
            body[1] == len - 2) {
                *ret_op = body[0] >> 3;
                *ret_msg = body + 2;
                *ret_len = body[1];
                return 0;
        }
        if (len >= 3 && body[0] >= 0x80 && body[1] < 0x80 && (body[0] & 7) == GM_PB_LEN && body[2] < 0x80 &&
            body[2] == len - 3) {
                *ret_op = (uint32_t)((body[0] & 0x7f) | body[1] << 7) >> 3;
                *ret_msg = body + 3;
                *ret_len = body[2];
                return 0;
        }
        if (gm_pb_next(body, len, &at, &f) <= 0 || f.wire != GM_PB_LEN || at != len)
                return -EPROTO;
        *ret_op = f.id;
        *ret_msg = f.data;
        *ret_len = f.n;
        return 0;
}

int gm_empty_view(const uint8_t *p, size_t len)
{
        GmPbField f;
        size_t at = 0;
        int r;

        while ((r = gm_pb_next(p, len, &at, &f)) > 0)
                ;
        return r;
}

int gm_u64_view(const uint8_t *p, size_t len, bool *ret_has, uint64_t *ret_v)
{
        GmPbField f;
        size_t at = 0;
        int r;

        /* the one field, alone */
        if (expect_uint(p, len, &at, 1 << 3, ret_v) && at == len) {
                *ret_has = true;
                return 0;
        }
        at = 0;
        *ret_has = false;
        *ret_v = 0;
        while ((r = gm_pb_next(p, len, &at, &f)) > 0) {
                if (f.id != 1)
                        continue;
                if (f.wire != GM_PB_VARINT)
                        return -EPROTO;
                *ret_has = true;
                *ret_v = f.v;
        }
        return r;
}
