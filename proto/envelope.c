/* Request and Reply envelopes: one op field decoded by its own descriptor, status and result packed alone,
 * the small ops' messages coded by hand. */
#include "envelope.h"
#include "view.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/*
 * One length-delimited field at @p (of @len bytes): its number, payload and size, or 0 when it is not one.
 * Stricter than protobuf-c where it must be: a tag or a length takes at most 5 bytes there, and bits beyond
 * 32 are dropped; here such a field is not taken (the general way then decides), so whatever is taken here
 * protobuf-c reads the same way.
 */
static size_t field_get(const uint8_t *p, size_t len, uint32_t *ret_id, const uint8_t **ret_data,
                        size_t *ret_n)
{
        uint64_t tag, n;
        size_t a, b;

        /* a tag of one or two bytes (fields up to 2047) and a short length: every small op's, inline */
        if (len >= 2 && p[0] < 0x80) {
                tag = p[0];
                a = 1;
        } else if (len >= 3 && p[1] < 0x80) {
                tag = (uint64_t)(p[0] & 0x7f) | (uint64_t)p[1] << 7;
                a = 2;
        } else {
                a = gm_pb_varint(p, len < 5 ? len : 5, &tag);
        }
        if (!a || (tag & 7) != 2 || (tag >> 3) == 0 || (tag >> 3) > 0xffff)
                return 0;
        if (a < len && p[a] < 0x80) {
                n = p[a];
                b = 1;
        } else {
                b = gm_pb_varint(p + a, len - a < 5 ? len - a : 5, &n);
        }
        if (!b || n > UINT32_MAX || n > len - a - b)
                return 0;
        *ret_id = (uint32_t)(tag >> 3);
        *ret_data = p + a + b;
        *ret_n = (size_t)n;
        return a + b + (size_t)n;
}

/* The message member @id of @desc's oneof, or NULL. */
static const ProtobufCFieldDescriptor *oneof_message(const ProtobufCMessageDescriptor *desc, uint32_t id)
{
        const ProtobufCFieldDescriptor *f = gm_proto_field(desc, id);

        return f && f->type == PROTOBUF_C_TYPE_MESSAGE && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ? f : NULL;
}

static void *msg_alloc(ProtobufCAllocator *alloc, size_t n)
{
        /* protobuf-c's own default, for a NULL allocator, is malloc and free */
        return alloc ? alloc->alloc(alloc->allocator_data, n) : malloc(n);
}

static void msg_free(ProtobufCAllocator *alloc, void *p)
{
        if (alloc)
                alloc->free(alloc->allocator_data, p);
        else
                free(p);
}

/* @outer's oneof member @f set to @sub, as protobuf-c sets it. */
static void set_member(void *outer, const ProtobufCFieldDescriptor *f, ProtobufCMessage *sub)
{
        *(uint32_t *)((uint8_t *)outer + f->quantifier_offset) = f->id;
        *(ProtobufCMessage **)((uint8_t *)outer + f->offset) = sub;
}

/*
 * The small ops' requests and the ping's reply coded by hand, as the results below: a message of an optional
 * uint64 at field 1 (Ping, PingReply, PointerInfoGet), and the packed form of the SVM attribute calls
 * (va at 1, size at 2, the packed attributes at 4). A decoder takes only the plain form protobuf-c writes
 * (each field once, in order, a one-byte tag); anything else goes the general way.
 */

/* Field 1 as an optional uint64, the whole body: false when the body is anything else. */
static bool unhand_u64_1(const uint8_t *p, size_t len, protobuf_c_boolean *has, uint64_t *v)
{
        size_t a;

        if (len == 0) {
                *has = false;
                return true;
        }
        if (p[0] != 1 << 3 || !(a = gm_pb_varint_at(p, len, 1, v)) || 1 + a != len)
                return false;
        *has = true;
        return true;
}

/* A message of @desc whose one field is that optional uint64 (Ping, PingReply, PointerInfoGet), or NULL. */
static ProtobufCMessage *unhand_u64_msg(ProtobufCAllocator *alloc, const ProtobufCMessageDescriptor *desc,
                                        const uint8_t *p, size_t len)
{
        const ProtobufCFieldDescriptor *f = &desc->fields[0];
        protobuf_c_boolean has;
        uint64_t v = 0;
        ProtobufCMessage *m;

        if (!unhand_u64_1(p, len, &has, &v) || !(m = msg_alloc(alloc, desc->sizeof_message)))
                return NULL;
        desc->message_init(m);
        *(protobuf_c_boolean *)((uint8_t *)m + f->quantifier_offset) = has;
        *(uint64_t *)((uint8_t *)m + f->offset) = v;
        return m;
}

/* Into a buffer with room for 8 bytes more than it writes (gm_pb_put_varint_pad). */
static size_t hand_u64_1(protobuf_c_boolean has, uint64_t v, uint8_t *out)
{
        return has ? gm_pb_put_uint_pad(out, 1, v) : 0;
}

/* The packed SVM call's fields; false when the body is not that plain form. The attributes' bytes run from
 * *@ret_off to the end of the body, *@ret_count of them. */
static bool unhand_svm_call(const uint8_t *p, size_t len, protobuf_c_boolean *has_va, uint64_t *va,
                            protobuf_c_boolean *has_size, uint64_t *size, size_t *ret_off, size_t *ret_count)
{
        size_t at = 0, a, count = 0;
        uint64_t body, v;

        *has_va = *has_size = false;
        *ret_off = len;
        *ret_count = 0;
        if (at < len && p[at] == 1 << 3) {
                if (!(a = gm_pb_varint_at(p, len, at + 1, va)))
                        return false;
                *has_va = true;
                at += 1 + a;
        }
        if (at < len && p[at] == 2 << 3) {
                if (!(a = gm_pb_varint_at(p, len, at + 1, size)))
                        return false;
                *has_size = true;
                at += 1 + a;
        }
        if (at < len) {
                if (p[at] != (4 << 3 | 2) || !(a = gm_pb_varint_at(p, len, at + 1, &body)) || a > 5 ||
                    body == 0 || body != len - at - 1 - a)
                        return false;
                at += 1 + a;
                for (size_t k = 0, n; k < body; k += n, count++)
                        if (!(n = gm_pb_varint_at(p, len, at + k, &v))) /* the field ends the body */
                                return false;
                *ret_off = at;
                *ret_count = count;
        }
        return true;
}

/* The @count packed attributes that unhand_svm_call() found from @off to the end of @p (@len bytes), into
 * an array of @alloc, or NULL. */
static uint64_t *unhand_attrs(ProtobufCAllocator *alloc, const uint8_t *p, size_t len, size_t off,
                              size_t count)
{
        uint64_t *arr = msg_alloc(alloc, count * sizeof(*arr));

        for (size_t at = off, i = 0; arr && at < len; i++)
                at += gm_pb_varint_at(p, len, at, &arr[i]);
        return arr;
}

_Static_assert(sizeof(Gpumem__SvmSetAttr) == sizeof(Gpumem__SvmGetAttr) &&
                       offsetof(Gpumem__SvmSetAttr, va) == offsetof(Gpumem__SvmGetAttr, va) &&
                       offsetof(Gpumem__SvmSetAttr, size) == offsetof(Gpumem__SvmGetAttr, size) &&
                       offsetof(Gpumem__SvmSetAttr, n_attrs) == offsetof(Gpumem__SvmGetAttr, n_attrs) &&
                       offsetof(Gpumem__SvmSetAttr, packed_attrs) ==
                               offsetof(Gpumem__SvmGetAttr, packed_attrs),
               "SvmSetAttr and SvmGetAttr are coded as one");

/* The packed form of an SVM call into @out (of @cap bytes), or 0 for the general way. */
static size_t hand_svm_call(const Gpumem__SvmGetAttr *m, uint8_t *out, size_t cap)
{
        size_t n = 0;

        /* room for what the varints' padded writes leave past the end */
        if (m->base.n_unknown_fields || m->n_attrs || 2 * 11 + 6 + m->n_packed_attrs * 10 + 8 > cap)
                return 0;
        if (m->has_va)
                n += gm_pb_put_uint_pad(out + n, 1, m->va);
        if (m->has_size)
                n += gm_pb_put_uint_pad(out + n, 2, m->size);
        if (m->n_packed_attrs)
                n += gm_pb_put_packed(out + n, 4, m->packed_attrs, m->n_packed_attrs);
        return n;
}

/* The op @id's message decoded by hand from @p, or NULL (not one of these, or out of memory). */
static ProtobufCMessage *unhand_op(ProtobufCAllocator *alloc, uint32_t id, const uint8_t *p, size_t len)
{
        switch (id) {
        case GPUMEM__REQUEST__OP_PING:
                return unhand_u64_msg(alloc, &gpumem__ping__descriptor, p, len);
        case GPUMEM__REQUEST__OP_POINTER_INFO:
                return unhand_u64_msg(alloc, &gpumem__pointer_info_get__descriptor, p, len);
        case GPUMEM__REQUEST__OP_SVM_SET_ATTR:
        case GPUMEM__REQUEST__OP_SVM_GET_ATTR: {
                protobuf_c_boolean has_va, has_size;
                uint64_t va = 0, size = 0;
                size_t off, count;
                Gpumem__SvmGetAttr *m;
                if (!unhand_svm_call(p, len, &has_va, &va, &has_size, &size, &off, &count) ||
                    !(m = msg_alloc(alloc, sizeof(*m))))
                        return NULL;
                if (id == GPUMEM__REQUEST__OP_SVM_SET_ATTR)
                        gpumem__svm_set_attr__init((Gpumem__SvmSetAttr *)(void *)m);
                else
                        gpumem__svm_get_attr__init(m);
                m->has_va = has_va;
                m->va = va;
                m->has_size = has_size;
                m->size = size;
                if (count && !(m->packed_attrs = unhand_attrs(alloc, p, len, off, count))) {
                        msg_free(alloc, m);
                        return NULL;
                }
                m->n_packed_attrs = count;
                return &m->base;
        }
        default:
                return NULL;
        }
}

/* The small ops' requests packed by hand into @tmp (of @cap bytes): the size, or 0 for the general
 * way. */
static size_t hand_op(const Gpumem__Request *req, const ProtobufCMessage *op, uint8_t *tmp, size_t cap)
{
        if (op->n_unknown_fields)
                return 0;
        switch (req->op_case) {
        case GPUMEM__REQUEST__OP_PING:
                return hand_u64_1(req->ping->has_cookie, req->ping->cookie, tmp);
        case GPUMEM__REQUEST__OP_POINTER_INFO:
                return hand_u64_1(req->pointer_info->has_va, req->pointer_info->va, tmp);
        case GPUMEM__REQUEST__OP_SVM_SET_ATTR:
        case GPUMEM__REQUEST__OP_SVM_GET_ATTR:
                return hand_svm_call((const Gpumem__SvmGetAttr *)(const void *)op, tmp, cap);
        default:
                return 0;
        }
}

int gm_request_unpack_op(ProtobufCAllocator *alloc, const uint8_t *body, size_t len, Gpumem__Request **ret)
{
        const ProtobufCFieldDescriptor *f;
        const uint8_t *data;
        ProtobufCMessage *op;
        Gpumem__Request *req;
        uint32_t id;
        size_t n;

        /* exactly one field: nothing, or anything after it (a second op, unknown fields), takes the
         * general way */
        size_t used = field_get(body, len, &id, &data, &n);
        if (!used || used != len || !(f = oneof_message(&gpumem__request__descriptor, id)))
                return 0;
        /* the top message first, as protobuf-c allocates: an arena's owner finds it at the arena's
         * start */
        req = msg_alloc(alloc, sizeof(*req));
        if (!req)
                return 0;
        gpumem__request__init(req);
        op = unhand_op(alloc, id, data, n);
        if (!op)
                op = protobuf_c_message_unpack(f->descriptor, alloc, n, data);
        if (!op) { /* the general way refuses it too, and says so the usual way */
                msg_free(alloc, req);
                return 0;
        }
        set_member(req, f, op);
        *ret = req;
        return 1;
}

/*
 * The same parts decoded by hand, strictly: each field once in its plain form (a varint, one-byte
 * tag), as protobuf-c reads it. Anything else (another field, a packed form where the other one is
 * usual, a broken varint) is not taken, and protobuf-c decides. NULL: not taken, or out of memory.
 */
static Gpumem__Status *unhand_status(ProtobufCAllocator *alloc, const uint8_t *p, size_t len)
{
        Gpumem__Status *st;
        uint64_t v;
        size_t a;

        if (len < 2 || p[0] != 1 << 3 || !(a = gm_pb_varint_at(p, len, 1, &v)) || 1 + a != len)
                return NULL;
        st = msg_alloc(alloc, sizeof(*st));
        if (!st)
                return NULL;
        gpumem__status__init(st);
        st->has_code = true;
        st->code = (int32_t)((uint32_t)v >> 1) ^ -(int32_t)((uint32_t)v & 1);
        return st;
}

/* Pointer info: fields 1-8 as varints, the mapped GPUs (6) one tag each. */
static Gpumem__PointerInfoReply *unhand_pointer_info(ProtobufCAllocator *alloc, const uint8_t *p, size_t len)
{
        Gpumem__PointerInfoReply *m = msg_alloc(alloc, sizeof(*m));
        uint32_t *gpus = NULL;

        if (!m)
                return NULL;
        gpumem__pointer_info_reply__init(m);
        /* one pass: room for as many mapped GPUs as the body could hold (two bytes each at least) */
        if (len >= 2 && !(gpus = msg_alloc(alloc, len / 2 * sizeof(*gpus))))
                goto fail;
        for (size_t at = 0; at < len;) {
                uint8_t tag = p[at];
                const uint8_t *q = p + at + 1;
                uint64_t v = 0;
                bool any = false;
                size_t a;

                if (tag < (1 << 3) || tag > (8 << 3) || (tag & 7) != 0 ||
                    !(a = gm_pb_varint(q, len - at - 1, &v)))
                        goto fail;
                at += 1 + a;
                switch (tag >> 3) {
                case 1:
                        m->has_handle = true;
                        m->handle = v;
                        break;
                case 2:
                        m->has_kind = true;
                        m->kind = (Gpumem__MemKind)(int32_t)(uint32_t)v;
                        break;
                case 3:
                        m->has_gpu_id = true;
                        m->gpu_id = (uint32_t)v;
                        break;
                case 4:
                        m->has_alloc_base = true;
                        m->alloc_base = v;
                        break;
                case 5:
                        m->has_size = true;
                        m->size = v;
                        break;
                case 6:
                        gpus[m->n_mapped_gpus++] = (uint32_t)v;
                        break;
                case 7:
                        m->has_flags = true;
                        m->flags = (uint32_t)v;
                        break;
                default:
                        /* a bool is true if any payload bit is, as protobuf-c reads it */
                        for (size_t i = 0; i < a; i++)
                                any |= (q[i] & 0x7f) != 0;
                        m->has_cpu_accessible = true;
                        m->cpu_accessible = any;
                        break;
                }
        }
        if (m->n_mapped_gpus) {
                m->mapped_gpus = gpus;
        } else if (gpus) { /* protobuf-c leaves the array NULL when there is none */
                msg_free(alloc, gpus);
        }
        return m;
fail:
        if (gpus)
                msg_free(alloc, gpus);
        msg_free(alloc, m);
        return NULL;
}

/* Packed SVM attributes: field 2, once, packed. */
static Gpumem__SvmGetAttrReply *unhand_svm_get(ProtobufCAllocator *alloc, const uint8_t *p, size_t len)
{
        Gpumem__SvmGetAttrReply *m;
        size_t a, n = 0;
        uint64_t body, v;

        if (len < 2 || p[0] != (2 << 3 | 2) || !(a = gm_pb_varint(p + 1, len - 1 < 5 ? len - 1 : 5, &body)) ||
            body != len - 1 - a || body == 0)
                return NULL;
        p += 1 + a;
        for (size_t at = 0, k; at < body; at += k)
                if (!(k = gm_pb_varint(p + at, body - at, &v)))
                        return NULL;
                else
                        n++;
        m = msg_alloc(alloc, sizeof(*m));
        if (!m)
                return NULL;
        gpumem__svm_get_attr_reply__init(m);
        m->packed_attrs = msg_alloc(alloc, n * sizeof(*m->packed_attrs));
        if (!m->packed_attrs) {
                msg_free(alloc, m);
                return NULL;
        }
        for (size_t at = 0; at < body;)
                at += gm_pb_varint(p + at, body - at, &m->packed_attrs[m->n_packed_attrs++]);
        return m;
}

static ProtobufCMessage *unhand_result(ProtobufCAllocator *alloc, uint32_t id, const uint8_t *p, size_t len)
{
        switch (id) {
        case GPUMEM__REPLY__RESULT_PING:
                return unhand_u64_msg(alloc, &gpumem__ping_reply__descriptor, p, len);
        case GPUMEM__REPLY__RESULT_EMPTY: {
                Gpumem__Empty *m;
                if (len || !(m = msg_alloc(alloc, sizeof(*m))))
                        return NULL;
                gpumem__empty__init(m);
                return &m->base;
        }
        case GPUMEM__REPLY__RESULT_POINTER_INFO:
                return (ProtobufCMessage *)unhand_pointer_info(alloc, p, len);
        case GPUMEM__REPLY__RESULT_SVM_GET_ATTR:
                return (ProtobufCMessage *)unhand_svm_get(alloc, p, len);
        default:
                return NULL;
        }
}

int gm_reply_unpack_result(ProtobufCAllocator *alloc, const uint8_t *body, size_t len, Gpumem__Reply **ret)
{
        const ProtobufCFieldDescriptor *f = NULL;
        const uint8_t *st_data = NULL, *res_data = NULL;
        size_t st_n = 0, res_n = 0, at = 0;
        Gpumem__Reply *rep;

        /* a status and a result at most, once each: any other body takes the general way */
        while (at < len) {
                const uint8_t *data;
                uint32_t id;
                size_t n, used = field_get(body + at, len - at, &id, &data, &n);
                if (!used)
                        return 0;
                if (id == 1 && !st_data) {
                        st_data = data;
                        st_n = n;
                } else if (!f && (f = oneof_message(&gpumem__reply__descriptor, id))) {
                        res_data = data;
                        res_n = n;
                } else {
                        return 0;
                }
                at += used;
        }
        rep = msg_alloc(alloc, sizeof(*rep));
        if (!rep)
                return 0;
        gpumem__reply__init(rep);
        if (st_data && !(rep->status = unhand_status(alloc, st_data, st_n)) &&
            !(rep->status = gpumem__status__unpack(alloc, st_n, st_data))) {
                msg_free(alloc, rep);
                return 0;
        }
        if (f) {
                ProtobufCMessage *res = unhand_result(alloc, f->id, res_data, res_n);
                if (!res)
                        res = protobuf_c_message_unpack(f->descriptor, alloc, res_n, res_data);
                if (!res) {
                        if (rep->status)
                                gpumem__status__free_unpacked(rep->status, alloc);
                        msg_free(alloc, rep);
                        return 0;
                }
                set_member(rep, f, res);
        }
        *ret = rep;
        return 1;
}

int gm_request_pack_into(const Gpumem__Request *req, uint8_t *out, size_t cap, size_t *ret_len)
{
        const ProtobufCFieldDescriptor *f;
        const ProtobufCMessage *op = NULL;
        uint8_t tmp[256];
        size_t need = 0, n = 0, s = 0, hand = 0;
        uint64_t tag = 0;

        if (req->base.n_unknown_fields || req->op_case == GPUMEM__REQUEST__OP__NOT_SET ||
            !(f = oneof_message(&gpumem__request__descriptor, (uint32_t)req->op_case))) {
                need = gpumem__request__get_packed_size(req);
                if (need > cap)
                        return -EMSGSIZE;
                *ret_len = gpumem__request__pack(req, out);
                return 0;
        }
        op = *(const ProtobufCMessage *const *)((const uint8_t *)req + f->offset);
        if (op) { /* a NULL member is not written, as protobuf-c does */
                tag = (uint64_t)f->id << 3 | 2;
                s = hand = hand_op(req, op, tmp, sizeof(tmp));
                if (!hand)
                        s = protobuf_c_message_get_packed_size(op);
                need = gm_pb_varint_size(tag) + gm_pb_varint_size(s) + s;
        }
        if (need > cap)
                return -EMSGSIZE;
        if (op) {
                n += gm_pb_put_varint(out + n, tag);
                n += gm_pb_put_varint(out + n, s);
                if (hand)
                        memcpy(out + n, tmp, hand);
                n += hand ? hand : protobuf_c_message_pack(op, out + n);
        }
        *ret_len = n;
        return 0;
}

/* The result member of @r (NULL when none is set, or it is NULL, as protobuf-c then writes nothing).
 */
static const ProtobufCMessage *reply_result(const Gpumem__Reply *r, const ProtobufCFieldDescriptor **ret_f)
{
        const ProtobufCFieldDescriptor *f;

        if (r->result_case == GPUMEM__REPLY__RESULT__NOT_SET)
                return NULL;
        f = gm_proto_field(&gpumem__reply__descriptor, (uint32_t)r->result_case);
        if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE)
                return NULL;
        *ret_f = f;
        return *(const ProtobufCMessage *const *)((const uint8_t *)r + f->offset);
}

/*
 * The parts of the small ops' replies packed by hand, byte for byte as protobuf-c packs them (its
 * general walk costs those ops more than the rest of their way through the daemon): a status with a
 * code alone, and the results of pointer queries and packed SVM attribute queries. Into @tmp (of @cap
 * bytes): the size, or 0 when the message is not one of these (pack it the general way).
 */
enum { HAND_MAX = 192 };

static size_t hand_status(const Gpumem__Status *st, uint8_t *tmp)
{
        size_t n = 0;

        if (st->base.n_unknown_fields || st->reason)
                return 0;
        if (st->has_code) {
                n += gm_pb_put_uint_pad(tmp + n, 1,
                                        ((uint32_t)st->code << 1) ^ (0u - ((uint32_t)st->code >> 31)));
        }
        return n;
}

static size_t hand_pointer_info(const Gpumem__PointerInfoReply *m, uint8_t *tmp)
{
        size_t n = 0;

        /* at most 11 bytes per field, and 6 per mapped GPU */
        if (m->base.n_unknown_fields || m->n_mapped_gpus > (HAND_MAX - 7 * 11) / 6)
                return 0;
        if (m->has_handle)
                n += gm_pb_put_uint_pad(tmp + n, 1, m->handle);
        if (m->has_kind) { /* an enum is an int32: negative ones take ten bytes */
                n += gm_pb_put_uint_pad(tmp + n, 2, (uint64_t)(int64_t)(int32_t)m->kind);
        }
        if (m->has_gpu_id)
                n += gm_pb_put_uint_pad(tmp + n, 3, m->gpu_id);
        if (m->has_alloc_base)
                n += gm_pb_put_uint_pad(tmp + n, 4, m->alloc_base);
        if (m->has_size)
                n += gm_pb_put_uint_pad(tmp + n, 5, m->size);
        for (size_t i = 0; i < m->n_mapped_gpus; i++) { /* not packed: a tag each */
                n += gm_pb_put_uint_pad(tmp + n, 6, m->mapped_gpus[i]);
        }
        if (m->has_flags)
                n += gm_pb_put_uint_pad(tmp + n, 7, m->flags);
        if (m->has_cpu_accessible) {
                tmp[n++] = 8 << 3;
                tmp[n++] = m->cpu_accessible ? 1 : 0;
        }
        return n;
}

static size_t hand_svm_get(const Gpumem__SvmGetAttrReply *m, uint8_t *tmp)
{
        if (m->base.n_unknown_fields || m->n_attrs || !m->n_packed_attrs ||
            m->n_packed_attrs > (HAND_MAX - 8) / 10)
                return 0;
        return gm_pb_put_packed(tmp, 2, m->packed_attrs, m->n_packed_attrs);
}

static size_t hand_result(const Gpumem__Reply *r, const ProtobufCMessage *res, uint8_t *tmp)
{
        switch (r->result_case) {
        case GPUMEM__REPLY__RESULT_PING:
                return res->n_unknown_fields ? 0 : hand_u64_1(r->ping->has_cookie, r->ping->cookie, tmp);
        case GPUMEM__REPLY__RESULT_POINTER_INFO:
                return hand_pointer_info((const Gpumem__PointerInfoReply *)res, tmp);
        case GPUMEM__REPLY__RESULT_SVM_GET_ATTR:
                return hand_svm_get((const Gpumem__SvmGetAttrReply *)res, tmp);
        default:
                return 0;
        }
}

int gm_reply_pack_into(const Gpumem__Reply *r, uint8_t *out, size_t cap, size_t *ret_len)
{
        uint8_t st_tmp[16 + 8], rs_tmp[HAND_MAX + 8]; /* + the varints' padded writes */
        size_t st_hand = 0, rs_hand = 0;
        const ProtobufCFieldDescriptor *f = NULL;
        const ProtobufCMessage *res;
        size_t n = 0, st = 0, rs = 0, need = 0;
        uint64_t tag = 0;

        if (r->base.n_unknown_fields) {
                need = gpumem__reply__get_packed_size(r);
                if (need > cap)
                        return -EMSGSIZE;
                *ret_len = gpumem__reply__pack(r, out);
                return 0;
        }
        /* each part's size once, then the parts in the order protobuf-c writes them: by number,
         * status (1) before every result (10 on) */
        if (r->status) {
                st = st_hand = hand_status(r->status, st_tmp);
                if (!st_hand)
                        st = gpumem__status__get_packed_size(r->status);
                need += 1 + gm_pb_varint_size(st) + st;
        }
        res = reply_result(r, &f);
        if (res) {
                tag = (uint64_t)f->id << 3 | 2;
                rs = rs_hand = hand_result(r, res, rs_tmp);
                if (!rs_hand)
                        rs = protobuf_c_message_get_packed_size(res);
                need += gm_pb_varint_size(tag) + gm_pb_varint_size(rs) + rs;
        }
        if (need > cap)
                return -EMSGSIZE;
        if (r->status) {
                out[n++] = 1 << 3 | 2;
                n += gm_pb_put_varint(out + n, st);
                if (st_hand)
                        memcpy(out + n, st_tmp, st_hand);
                n += st_hand ? st_hand : gpumem__status__pack(r->status, out + n);
        }
        if (res) {
                n += gm_pb_put_varint(out + n, tag);
                n += gm_pb_put_varint(out + n, rs);
                if (rs_hand)
                        memcpy(out + n, rs_tmp, rs_hand);
                n += rs_hand ? rs_hand : protobuf_c_message_pack(res, out + n);
        }
        *ret_len = n;
        return 0;
}
