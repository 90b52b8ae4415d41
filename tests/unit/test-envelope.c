/* Unit tests of the Request and Reply envelopes and of the replies read in place (view.h): the same bytes
 * and the same messages as protobuf-c's general coding, and every other body left to it or refused. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "envelope.h"
#include "view.h"

/* Packed the envelope's way and protobuf-c's: the same size and bytes. */
static void same_packing(const Gpumem__Reply *r, const char *what)
{
        size_t want = gpumem__reply__get_packed_size(r), got = 0;
        uint8_t *a = malloc(want + 1), *b = malloc(want + 1);

        if (a && b) {
                size_t na = gpumem__reply__pack(r, a);
                CHECK_EQ(gm_reply_pack_into(r, b, want, &got), 0);
                CHECK_EQ(got, na);
                CHECK(memcmp(a, b, na) == 0);
                if (got != na || memcmp(a, b, na))
                        fprintf(stderr, "%s: packed differently\n", what);
                /* decoded both ways: the same message */
                Gpumem__Reply *fast = NULL, *slow = gpumem__reply__unpack(NULL, na, a);
                CHECK_EQ(gm_reply_unpack_result(NULL, a, na, &fast), 1);
                CHECK(slow != NULL && fast != NULL);
                if (fast && slow) {
                        size_t m = 0;
                        CHECK_EQ(fast->result_case, slow->result_case);
                        CHECK_EQ(gm_reply_pack_into(fast, b, want, &m), 0);
                        CHECK(m == na && memcmp(a, b, na) == 0);
                }
                if (fast)
                        gpumem__reply__free_unpacked(fast, NULL);
                if (slow)
                        gpumem__reply__free_unpacked(slow, NULL);
                /* a byte short: refused, nothing written */
                if (want) {
                        memset(b, 0xa5, want + 1);
                        got = 12345;
                        CHECK_EQ(gm_reply_pack_into(r, b, want - 1, &got), -EMSGSIZE);
                        CHECK_EQ(got, 12345);
                        CHECK_EQ(b[0], 0xa5);
                }
        }
        free(a);
        free(b);
}

static void test_reply(void)
{
        Gpumem__Reply r = GPUMEM__REPLY__INIT;
        Gpumem__Status st = GPUMEM__STATUS__INIT;
        Gpumem__PingReply ping = GPUMEM__PING_REPLY__INIT;
        Gpumem__HelloReply hello = GPUMEM__HELLO_REPLY__INIT;
        Gpumem__TopologyReply topo = GPUMEM__TOPOLOGY_REPLY__INIT;
        Gpumem__TopologyNode node = GPUMEM__TOPOLOGY_NODE__INIT, *nodes[3] = {&node, &node, &node};
        Gpumem__Empty empty = GPUMEM__EMPTY__INIT;

        same_packing(&r, "nothing");
        st.has_code = true;
        r.status = &st;
        same_packing(&r, "status 0");
        st.code = -EDQUOT;
        st.reason = (char *)"class 'batch' VRAM limit: 12 GiB in use of 16 GiB, 8 GiB asked";
        same_packing(&r, "an error with its reason");
        st.code = 0;
        st.reason = NULL;
        ping.has_cookie = true;
        ping.cookie = 0x676d;
        r.result_case = GPUMEM__REPLY__RESULT_PING;
        r.ping = &ping;
        same_packing(&r, "ping");
        r.status = NULL;
        same_packing(&r, "ping without a status");
        r.status = &st;
        hello.has_protocol_version = hello.has_window_base = hello.has_window_size = true;
        hello.protocol_version = 2;
        hello.window_base = 0x10000000000ull;
        hello.window_size = 64ull << 30;
        hello.server_version = (char *)"0.1.0";
        hello.backend = (char *)"model";
        r.result_case = GPUMEM__REPLY__RESULT_HELLO;
        r.hello = &hello;
        same_packing(&r, "hello");
        node.has_node_id = node.has_gpu_id = true;
        node.gpu_id = 13500;
        node.name = (char *)"ip discovery";
        topo.n_nodes = 3;
        topo.nodes = nodes;
        r.result_case = GPUMEM__REPLY__RESULT_TOPOLOGY;
        r.topology = &topo;
        same_packing(&r, "topology");
        r.result_case = GPUMEM__REPLY__RESULT_EMPTY;
        r.empty = &empty;
        same_packing(&r, "empty");
        /* a result case set with no message: protobuf-c writes nothing for it */
        r.empty = NULL;
        same_packing(&r, "a result case without its message");
}

/* @req packed, then decoded both ways: the same message (packed again, the same bytes). */
static void same_request(const Gpumem__Request *req)
{
        size_t n = gpumem__request__get_packed_size(req);
        uint8_t *buf = malloc(n + 1), *again = NULL;
        Gpumem__Request *fast = NULL, *slow;

        if (!buf)
                return;
        gpumem__request__pack(req, buf);
        {
                uint8_t *mine = malloc(n + 1);
                size_t m = 0;
                if (mine) {
                        CHECK_EQ(gm_request_pack_into(req, mine, n, &m), 0);
                        CHECK(m == n && memcmp(mine, buf, n) == 0);
                        if (n)
                                CHECK_EQ(gm_request_pack_into(req, mine, n - 1, &m), -EMSGSIZE);
                        free(mine);
                }
        }
        CHECK_EQ(gm_request_unpack_op(NULL, buf, n, &fast), 1);
        slow = gpumem__request__unpack(NULL, n, buf);
        CHECK(slow != NULL && fast != NULL);
        if (fast && slow) {
                size_t m = gpumem__request__get_packed_size(fast);
                CHECK_EQ(fast->op_case, slow->op_case);
                CHECK_EQ(m, n);
                again = malloc(m + 1);
                if (again) {
                        gpumem__request__pack(fast, again);
                        CHECK(memcmp(again, buf, n) == 0);
                }
        }
        if (fast)
                gpumem__request__free_unpacked(fast, NULL);
        if (slow)
                gpumem__request__free_unpacked(slow, NULL);
        free(again);
        free(buf);
}

static void test_request(void)
{
        Gpumem__Request req = GPUMEM__REQUEST__INIT;
        Gpumem__Ping ping = GPUMEM__PING__INIT;
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        Gpumem__AdminStatus astat = GPUMEM__ADMIN_STATUS__INIT;

        ping.has_cookie = true;
        ping.cookie = 0x676d;
        req.op_case = GPUMEM__REQUEST__OP_PING;
        req.ping = &ping;
        same_request(&req);
        alloc.has_kind = alloc.has_size = alloc.has_gpu_id = true;
        alloc.kind = GPUMEM__MEM_KIND__MEM_KIND_DEVICE;
        alloc.size = 2 << 20;
        alloc.gpu_id = 13500;
        req.op_case = GPUMEM__REQUEST__OP_ALLOC;
        req.alloc = &alloc;
        same_request(&req);
        hello.has_protocol_version = true;
        hello.protocol_version = 2;
        hello.client_name = (char *)"a client";
        req.op_case = GPUMEM__REQUEST__OP_HELLO;
        req.hello = &hello;
        same_request(&req);
        req.op_case = GPUMEM__REQUEST__OP_ADMIN_STATUS; /* an op with an empty message */
        req.admin_status = &astat;
        same_request(&req);
}

/* Bodies that are not one op field: left to the general decoding (0), or refused as it would (-EBADMSG). */
static void test_other_bodies(void)
{
        static const struct {
                const char *what;
                uint8_t body[16];
                size_t len;
                int want;
        } cases[] = {
                {"empty", {0x12}, 0, 0},                     /* a byte past the end that must not be read */
                {"two ops", {0x12, 0x00, 0x12, 0x00}, 4, 0}, /* ping twice */
                {"an op and a stray varint", {0x12, 0x00, 0x08, 0x01}, 4, 0},
                {"a varint where an op goes", {0x10, 0x05}, 2, 0}, /* field 2, wire type 0 */
                {"an unknown field", {0xfa, 0x7f, 0x00}, 3, 0},    /* field 2047 */
                {"a length past the body", {0x12, 0x05, 0x08}, 3, 0},
                {"a tag that never ends", {0x92, 0x80, 0x80, 0x80, 0x80, 0x80}, 6, 0},
                {"field 0", {0x02, 0x00}, 2, 0},
                {"an op whose message is broken", {0x12, 0x02, 0x08, 0x80}, 4, 0}, /* its varint cut off */
        };
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                Gpumem__Request *req = NULL;
                int r = gm_request_unpack_op(NULL, cases[i].body, cases[i].len, &req);
                if (r != cases[i].want)
                        fprintf(stderr, "%s: %d\n", cases[i].what, r);
                CHECK_EQ(r, cases[i].want);
                CHECK(req == NULL);
                if (i == ARRAY_SIZE(cases) - 1) /* the general decoding refuses it */
                        CHECK(gpumem__request__unpack(NULL, cases[i].len, cases[i].body) == NULL);
        }
}

/* Reply bodies that are not a status and a result once each: left to the general decoding. */
static void test_other_replies(void)
{
        static const struct {
                const char *what;
                uint8_t body[16];
                size_t len;
        } cases[] = {
                {"two statuses", {0x0a, 0x00, 0x0a, 0x00}, 4},
                {"two results", {0x5a, 0x00, 0x5a, 0x00}, 4}, /* ping (11) twice */
                {"an unknown field", {0xfa, 0x7f, 0x00}, 3},
                {"a varint", {0x08, 0x01}, 2},
                {"a length past the body", {0x0a, 0x05, 0x08}, 3},
                {"a broken status", {0x0a, 0x02, 0x08, 0x80}, 4},
        };
        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                Gpumem__Reply *rep = NULL;
                int r = gm_reply_unpack_result(NULL, cases[i].body, cases[i].len, &rep);
                if (r != 0)
                        fprintf(stderr, "%s: %d\n", cases[i].what, r);
                CHECK_EQ(r, 0);
                CHECK(rep == NULL);
        }
}

/* ---- every result and op message, filled at random: the flat packing against protobuf-c's ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

/* A value of the field's C type, often one at an edge of its range. */
static void fill_scalar(ProtobufCType type, void *p)
{
        static const uint64_t edges[] = {0,
                                         1,
                                         127,
                                         128,
                                         16383,
                                         16384,
                                         0x7fffffff,
                                         0x80000000u,
                                         0xffffffffu,
                                         UINT64_MAX,
                                         (uint64_t)INT64_MIN,
                                         0x123456789abcull};
        uint64_t v = rnd() & 1 ? edges[rnd() % ARRAY_SIZE(edges)] : rnd();

        switch (type) {
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_ENUM:
                *(uint32_t *)p = (uint32_t)v;
                break;
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_INT64:
                *(uint64_t *)p = v;
                break;
        case PROTOBUF_C_TYPE_BOOL:
                *(protobuf_c_boolean *)p = (protobuf_c_boolean)(v & 1);
                break;
        default:
                break;
        }
}

static const char *const strings[] = {"", "x", "why it failed", "a reason of some length, with \"quotes\""};

/*
 * A message of @d with random scalars, strings and repeated scalars (their arrays in @pool); message fields
 * stay NULL, but a few of the top message's are left set to an empty message so that the general way is
 * taken too (@depth 0 only).
 */
static ProtobufCMessage *random_message(const ProtobufCMessageDescriptor *d, void **pool, size_t *n_pool,
                                        int depth)
{
        uint8_t *m = calloc(1, d->sizeof_message);

        if (!m)
                return NULL;
        d->message_init((ProtobufCMessage *)m);
        pool[(*n_pool)++] = m;
        for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &d->fields[i];
                void *member = m + f->offset;
                if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
                        continue;
                if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                        if (depth == 0 && f->label == PROTOBUF_C_LABEL_OPTIONAL && rnd() % 8 == 0)
                                *(ProtobufCMessage **)member = random_message(f->descriptor, pool, n_pool, 1);
                        continue;
                }
                if (f->type == PROTOBUF_C_TYPE_STRING) {
                        if (f->label == PROTOBUF_C_LABEL_OPTIONAL && rnd() & 1)
                                *(const char **)member = strings[rnd() % ARRAY_SIZE(strings)];
                        continue;
                }
                if (f->type == PROTOBUF_C_TYPE_BYTES)
                        continue;
                if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
                        *(protobuf_c_boolean *)(m + f->quantifier_offset) = rnd() & 1;
                        fill_scalar(f->type, member);
                } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                        size_t n = rnd() % 6,
                               es = f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_INT64 ? 8
                                                                                                          : 4;
                        uint8_t *arr = n ? calloc(n, es) : NULL;
                        if (n && !arr)
                                continue;
                        for (size_t k = 0; k < n; k++)
                                fill_scalar(f->type, arr + k * es);
                        if (arr)
                                pool[(*n_pool)++] = arr;
                        *(size_t *)(m + f->quantifier_offset) = n;
                        *(void **)member = arr;
                }
        }
        return (ProtobufCMessage *)m;
}

static void test_random_messages(void)
{
        void *pool[512];

        for (unsigned i = 0; i < gpumem__reply__descriptor.n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &gpumem__reply__descriptor.fields[i];
                if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
                        continue;
                for (int it = 0; it < 200; it++) {
                        Gpumem__Reply r = GPUMEM__REPLY__INIT;
                        Gpumem__Status st = GPUMEM__STATUS__INIT;
                        size_t n_pool = 0;
                        st.has_code = rnd() & 1;
                        st.code = (int32_t)rnd();
                        st.reason = rnd() & 1 ? (char *)strings[rnd() % ARRAY_SIZE(strings)] : NULL;
                        r.status = rnd() % 4 ? &st : NULL;
                        r.result_case = (Gpumem__Reply__ResultCase)f->id;
                        *(ProtobufCMessage **)((uint8_t *)&r + f->offset) =
                                random_message(f->descriptor, pool, &n_pool, 0);
                        same_packing(&r, f->name);
                        while (n_pool)
                                free(pool[--n_pool]);
                }
        }
        for (unsigned i = 0; i < gpumem__request__descriptor.n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &gpumem__request__descriptor.fields[i];
                for (int it = 0; it < 200; it++) {
                        Gpumem__Request q = GPUMEM__REQUEST__INIT;
                        size_t n_pool = 0;
                        q.op_case = (Gpumem__Request__OpCase)f->id;
                        *(ProtobufCMessage **)((uint8_t *)&q + f->offset) =
                                random_message(f->descriptor, pool, &n_pool, 0);
                        same_request(&q);
                        while (n_pool)
                                free(pool[--n_pool]);
                }
        }
}

/* @len bytes of @buf into @mut (room for one more), one byte changed, cut short there, or one put in: the
 * new length. */
static size_t mutate(uint8_t *mut, const uint8_t *buf, size_t len)
{
        size_t at = rnd() % len;

        memcpy(mut, buf, len);
        switch (rnd() % 3) {
        case 0:
                mut[at] = (uint8_t)rnd();
                return len;
        case 1:
                return at;
        default:
                memmove(mut + at + 1, mut + at, len - at);
                mut[at] = (uint8_t)(rnd() & 1 ? rnd() : 0x80 | rnd());
                return len + 1;
        }
}

/* @check on @buf and on 30 mutations of it (made in @mut, room for @len + 1 bytes). */
static void check_mutations(const uint8_t *buf, size_t len, uint8_t *mut,
                            void (*check)(const uint8_t *, size_t))
{
        check(buf, len);
        for (int k = 0; k < 30 && len; k++)
                check(mut, mutate(mut, buf, len));
}

/* @fast and @slow (NULL: protobuf-c refused the body) packed by protobuf-c: the same bytes. Frees both. */
static void same_bytes(ProtobufCMessage *fast, ProtobufCMessage *slow, const char *what)
{
        CHECK(slow != NULL);
        if (slow) {
                size_t na = protobuf_c_message_get_packed_size(fast),
                       nb = protobuf_c_message_get_packed_size(slow);
                uint8_t *a = malloc(na + 1), *b = malloc(nb + 1);
                CHECK_EQ(na, nb);
                if (a && b && na == nb) {
                        protobuf_c_message_pack(fast, a);
                        protobuf_c_message_pack(slow, b);
                        CHECK(memcmp(a, b, na) == 0);
                        if (memcmp(a, b, na))
                                fprintf(stderr, "%s decoded differently\n", what);
                }
                free(a);
                free(b);
                protobuf_c_message_free_unpacked(slow, NULL);
        }
        protobuf_c_message_free_unpacked(fast, NULL);
}

/* Both decoders' Replies of @body: the same, whenever the envelope takes it. */
static void same_reply_decoding(const uint8_t *body, size_t len)
{
        Gpumem__Reply *fast = NULL;

        if (gm_reply_unpack_result(NULL, body, len, &fast))
                same_bytes(&fast->base, (ProtobufCMessage *)gpumem__reply__unpack(NULL, len, body),
                           "a reply");
}

/* @iters Replies of result @f at random (a status at times, with a reason when @reasons), packed, each then
 * given to @check with 30 mutations of it. */
static void mutated_replies(const ProtobufCFieldDescriptor *f, int iters, bool reasons,
                            void (*check)(const uint8_t *, size_t))
{
        void *pool[512];

        for (int it = 0; it < iters; it++) {
                Gpumem__Reply r = GPUMEM__REPLY__INIT;
                Gpumem__Status st = GPUMEM__STATUS__INIT;
                uint8_t buf[4096], mut[4097];
                size_t n_pool = 0, len;

                st.has_code = rnd() & 1;
                st.code = (int32_t)rnd();
                if (reasons && rnd() & 1)
                        st.reason = (char *)strings[rnd() % ARRAY_SIZE(strings)];
                r.status = rnd() % 4 ? &st : NULL;
                r.result_case = (Gpumem__Reply__ResultCase)f->id;
                *(ProtobufCMessage **)((uint8_t *)&r + f->offset) =
                        random_message(f->descriptor, pool, &n_pool, 1);
                len = gpumem__reply__get_packed_size(&r);
                if (len <= sizeof(buf)) {
                        gpumem__reply__pack(&r, buf);
                        check_mutations(buf, len, mut, check);
                }
                while (n_pool)
                        free(pool[--n_pool]);
        }
}

/*
 * Replies of every result at random, packed and then mutated (a byte changed, cut short, a byte put in):
 * whatever the envelope (and the results it decodes by hand) takes, protobuf-c takes too and reads the same.
 */
static void test_reply_mutations(void)
{
        for (unsigned i = 0; i < gpumem__reply__descriptor.n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &gpumem__reply__descriptor.fields[i];
                if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
                        continue;
                /* most of all the results decoded by hand */
                int iters = f->id == GPUMEM__REPLY__RESULT_POINTER_INFO ||
                                            f->id == GPUMEM__REPLY__RESULT_SVM_GET_ATTR
                                    ? 3000
                                    : 100;
                mutated_replies(f, iters, false, same_reply_decoding);
        }
}

/* What a reply read in place says for result @want, against protobuf-c's Reply @pb of the same body. */
static void same_view(const uint8_t *body, size_t len, const Gpumem__Reply *pb, uint32_t want)
{
        GmReplyView v;
        GmPointerInfoView pi;
        uint64_t attrs[64], cookie = 0;
        size_t n = 0, n_msgs = 0;
        bool has = false;
        int r = gm_reply_view(body, len, want, &v), r2 = -EPROTO;

        if (r == 0 && v.has_result) {
                switch (want) {
                case GPUMEM__REPLY__RESULT_POINTER_INFO:
                        r2 = gm_pointer_info_view(v.result, v.result_len, &pi);
                        break;
                case GPUMEM__REPLY__RESULT_SVM_GET_ATTR:
                        r2 = gm_svm_attrs_view(v.result, v.result_len, attrs, ARRAY_SIZE(attrs), &n, &n_msgs);
                        break;
                case GPUMEM__REPLY__RESULT_PING:
                        r2 = gm_u64_view(v.result, v.result_len, &has, &cookie);
                        break;
                default:
                        r2 = gm_empty_view(v.result, v.result_len);
                }
        }
        if (r < 0 || !v.has_result || r2 < 0) {
                /* refused, or another result: protobuf-c read no such result either, or a form left to it */
                bool other = !pb || pb->result_case != (Gpumem__Reply__ResultCase)want;
                CHECK(other || r == -ENOTSUP || r2 == -E2BIG);
                if (!other && r != -ENOTSUP && r2 != -E2BIG) {
                        fprintf(stderr, "result %u refused in place (%d, %d), read by protobuf-c:", want, r,
                                r2);
                        for (size_t i = 0; i < len; i++)
                                fprintf(stderr, " %02x", body[i]);
                        fprintf(stderr, "\n");
                }
                return;
        }
        CHECK(pb != NULL);
        if (!pb) {
                fprintf(stderr, "want %u:", want);
                for (size_t i = 0; i < len; i++)
                        fprintf(stderr, " %02x", body[i]);
                fprintf(stderr, "\n");
                return;
        }
        CHECK_EQ((uint32_t)pb->result_case, want);
        CHECK_EQ(pb->status != NULL && pb->status->has_code, v.has_code);
        if (pb->status && v.has_code)
                CHECK_EQ(pb->status->code, v.code);
        CHECK_EQ(pb->status != NULL && pb->status->reason != NULL, v.reason != NULL);
        if (pb->status && pb->status->reason && v.reason)
                CHECK(memcmp(pb->status->reason, v.reason, v.reason_len) == 0);
        if (pb->result_case != (Gpumem__Reply__ResultCase)want)
                return;
        if (want == GPUMEM__REPLY__RESULT_POINTER_INFO) {
                const Gpumem__PointerInfoReply *m = pb->pointer_info;
                CHECK_EQ(m->handle, pi.handle);
                CHECK_EQ((int32_t)m->kind, pi.kind);
                CHECK_EQ(m->gpu_id, pi.gpu_id);
                CHECK_EQ(m->alloc_base, pi.alloc_base);
                CHECK_EQ(m->size, pi.size);
                CHECK_EQ(m->flags, pi.flags);
                CHECK_EQ(m->cpu_accessible != 0, pi.cpu_accessible);
                CHECK_EQ(m->n_mapped_gpus, pi.n_mapped_gpus);
                for (size_t i = 0; i < m->n_mapped_gpus && i < GM_VIEW_MAX_GPUS; i++)
                        CHECK_EQ(m->mapped_gpus[i], pi.mapped_gpus[i]);
        } else if (want == GPUMEM__REPLY__RESULT_SVM_GET_ATTR) {
                CHECK_EQ(pb->svm_get_attr->n_packed_attrs, n);
                CHECK_EQ(pb->svm_get_attr->n_attrs, n_msgs);
                for (size_t i = 0; i < n && i < pb->svm_get_attr->n_packed_attrs; i++)
                        CHECK_EQ(pb->svm_get_attr->packed_attrs[i], attrs[i]);
        } else if (want == GPUMEM__REPLY__RESULT_PING) {
                CHECK_EQ(pb->ping->has_cookie != 0, has);
                CHECK_EQ(pb->ping->cookie, cookie);
        }
}

/* @body read in place for each result read so, beside protobuf-c. */
static void same_views(const uint8_t *body, size_t len)
{
        static const uint32_t wants[] = {GPUMEM__REPLY__RESULT_POINTER_INFO,
                                         GPUMEM__REPLY__RESULT_SVM_GET_ATTR, GPUMEM__REPLY__RESULT_PING,
                                         GPUMEM__REPLY__RESULT_EMPTY};
        Gpumem__Reply *pb = gpumem__reply__unpack(NULL, len, body);

        for (size_t i = 0; i < ARRAY_SIZE(wants); i++)
                same_view(body, len, pb, wants[i]);
        if (pb)
                gpumem__reply__free_unpacked(pb, NULL);
}

/*
 * Replies of the results read in place, and of others, at random (with reasons), packed and mutated: what
 * the views take, protobuf-c reads the same; what protobuf-c reads as that result, the views take (but for
 * the forms they leave to it).
 */
static void test_view_mutations(void)
{
        static const uint32_t results[] = {GPUMEM__REPLY__RESULT_POINTER_INFO,
                                           GPUMEM__REPLY__RESULT_SVM_GET_ATTR, GPUMEM__REPLY__RESULT_PING,
                                           GPUMEM__REPLY__RESULT_EMPTY, GPUMEM__REPLY__RESULT_ALLOC};

        for (size_t i = 0; i < ARRAY_SIZE(results); i++) {
                const ProtobufCFieldDescriptor *f = gm_proto_field(&gpumem__reply__descriptor, results[i]);
                mutated_replies(f, 2000, true, same_views);
        }
}

/* A varint the plain way, for reference. */
static size_t ref_varint(const uint8_t *p, size_t max, uint64_t *ret)
{
        uint64_t v = 0;

        for (size_t i = 0; i < max && i < 10; i++) {
                v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
                if (p[i] < 0x80) {
                        *ret = v;
                        return i + 1;
                }
        }
        return 0;
}

/* Varints of every length at every place of bodies long and short, whole, cut short, overlong and noisy:
 * read as the plain way reads them, never past the body's end. */
static void test_varints(void)
{
        for (int it = 0; it < 200000; it++) {
                uint8_t body[32];
                size_t len, off, n, got, want;
                uint64_t v = rnd() >> (rnd() % 64), a = 0, b = 0;

                for (size_t i = 0; i < sizeof(body); i++)
                        body[i] = (uint8_t)rnd();
                off = rnd() % 12;
                n = gm_pb_put_varint(body + off, v);
                {
                        uint8_t pad[16];
                        CHECK_EQ(gm_pb_put_varint_pad(pad, v), n); /* the padded writer: the same bytes */
                        CHECK(memcmp(pad, body + off, n) == 0);
                }
                switch (rnd() % 4) {
                case 0: /* the body ends with the varint */
                        len = off + n;
                        break;
                case 1: /* cut short */
                        len = off + rnd() % n;
                        break;
                case 2: /* noise, continuation bits set: overlong or unended */
                        for (size_t i = off; i < sizeof(body); i++)
                                body[i] |= 0x80;
                        len = off + rnd() % (sizeof(body) - off + 1);
                        break;
                default:
                        len = off + n + rnd() % (sizeof(body) - off - n + 1);
                }
                got = gm_pb_varint_at(body, len, off, &a);
                want = ref_varint(body + off, len - off, &b);
                CHECK_EQ(got, want);
                if (got && want)
                        CHECK_EQ(a, b);
                if (it % 4 == 0 && len > off) {
                        /* copies exactly as long, with no byte of room after them (the sanitizer build sees a
                         * read past the end): the varint alone, and the body with the varint at @off, whose
                         * backward and overlapping loads must not leave it either way */
                        uint8_t *exact = malloc(len - off), *whole = malloc(len);
                        if (exact) {
                                memcpy(exact, body + off, len - off);
                                CHECK_EQ(gm_pb_varint(exact, len - off, &a), want);
                                if (want)
                                        CHECK_EQ(a, b);
                        }
                        if (whole) {
                                memcpy(whole, body, len);
                                CHECK_EQ(gm_pb_varint_at(whole, len, off, &a), want);
                                if (want)
                                        CHECK_EQ(a, b);
                        }
                        free(exact);
                        free(whole);
                }
        }
}

static void same_request_decoding(const uint8_t *body, size_t len);

/* An SVM call in the client library's form reads back as what was packed, alone and as a Request's op (also
 * mutated); with too little room, -E2BIG. */
static void same_svm_call_in_place(const Gpumem__SvmGetAttr *g, const uint8_t *msg, size_t len)
{
        uint8_t req[600], mut[601];
        uint64_t out[32];
        GmSvmCallView v;
        size_t n;

        CHECK_RC(gm_svm_call_view(msg, len, out, ARRAY_SIZE(out), &v), 0);
        CHECK_EQ(v.va, g->va);
        CHECK_EQ(v.size, g->size);
        CHECK_EQ(v.n, g->n_packed_attrs);
        CHECK_EQ(v.n_msgs, 0);
        for (size_t i = 0; i < v.n && i < g->n_packed_attrs; i++)
                CHECK_EQ(out[i], g->packed_attrs[i]);
        if (g->n_packed_attrs)
                CHECK_RC(gm_svm_call_view(msg, len, out, g->n_packed_attrs - 1, &v), -E2BIG);
        n = gm_pb_put_len(
                req, rnd() & 1 ? GPUMEM__REQUEST__OP_SVM_GET_ATTR : GPUMEM__REQUEST__OP_SVM_SET_ATTR, len);
        memcpy(req + n, msg, len);
        if (rnd() % 4 == 0)
                check_mutations(req, n + len, mut, same_request_decoding);
}

/* A pointer query and a ping as the client library writes them (one varint field), and mutated. */
static void test_hand_packed_u64(void)
{
        for (int it = 0; it < 3000; it++) {
                uint8_t req[32], mut[33];
                uint64_t v = rnd() >> (rnd() % 64), got = 0;
                uint32_t op = rnd() & 1 ? GPUMEM__REQUEST__OP_PING : GPUMEM__REQUEST__OP_POINTER_INFO;
                uint8_t msg[11];
                size_t n = gm_pb_put_uint(msg, 1, v), k;
                bool has = false;

                CHECK_RC(gm_u64_view(msg, n, &has, &got), 0);
                CHECK(has);
                CHECK_EQ(got, v);
                k = gm_pb_put_len(req, op, n);
                if (k + n > sizeof(req) || n > sizeof(msg))
                        continue; /* cannot be: a tag and length of at most 10 bytes, a field of 11 */
                memcpy(req + k, msg, n);
                check_mutations(req, k + n, mut, same_request_decoding);
        }
}

/* A request whose length byte equals what follows it though it is no one-byte length (0x80 and up): the
 * views read its length as protobuf-c does. */
static void test_request_length_bytes(void)
{
        static const uint8_t tags[][2] = {{GPUMEM__REQUEST__OP_PING << 3 | 2, 0},
                                          {(uint8_t)((GPUMEM__REQUEST__OP_SVM_SET_ATTR << 3 | 2) | 0x80),
                                           GPUMEM__REQUEST__OP_SVM_SET_ATTR >> 4}};

        for (size_t t = 0; t < ARRAY_SIZE(tags); t++) {
                size_t head = t == 0 ? 1 : 2;
                for (size_t len = head + 1; len < 300; len++) {
                        uint8_t body[300];
                        memcpy(body, tags[t], head);
                        size_t at = head + 1, rest;
                        body[head] = (uint8_t)(len - head - 1);
                        /* a message the op's view takes (its field 1, then an unknown field to fill it),
                         * so that a view that took the length byte as a length would be seen to */
                        if (len - at >= 2) {
                                body[at++] = 1 << 3;
                                body[at++] = (uint8_t)(rnd() & 0x7f);
                        }
                        rest = len - at;
                        if (rest >= 2) {
                                size_t m = rest - 2 < 0x80 ? rest - 2 : rest - 3;
                                body[at++] = 15 << 3 | 2;
                                at += gm_pb_put_varint(body + at, m);
                        }
                        for (; at < len; at++)
                                body[at] = (uint8_t)rnd();
                        same_request_decoding(body, len);
                }
        }
}

/* The SVM calls packed by hand (va, size, the packed attributes) are protobuf-c's bytes. */
static void test_hand_packed_request(void)
{
        for (int it = 0; it < 2000; it++) {
                Gpumem__SvmGetAttr g = GPUMEM__SVM_GET_ATTR__INIT;
                uint64_t attrs[32];
                uint8_t a[512], b[512];
                size_t n = 0;

                g.has_va = g.has_size = true;
                g.va = rnd() >> (rnd() % 64);
                g.size = rnd() >> (rnd() % 64);
                g.n_packed_attrs = rnd() % 33;
                for (size_t i = 0; i < g.n_packed_attrs; i++)
                        attrs[i] = (uint64_t)(uint32_t)rnd() << 32 | (uint32_t)(rnd() >> (rnd() % 32));
                g.packed_attrs = attrs;
                n += gm_pb_put_uint(a + n, 1, g.va);
                n += gm_pb_put_uint(a + n, 2, g.size);
                n += gm_pb_put_packed(a + n, 4, attrs, g.n_packed_attrs);
                CHECK_EQ(gpumem__svm_get_attr__get_packed_size(&g), n);
                CHECK_EQ(gpumem__svm_get_attr__pack(&g, b), n);
                CHECK(memcmp(a, b, n) == 0);
                same_svm_call_in_place(&g, a, n);
        }
}

/* @r packed by protobuf-c is the head and @msg (@len bytes) the daemon writes by hand for its result. */
static void same_hand_reply(const Gpumem__Reply *r, const uint8_t *msg, size_t len)
{
        uint8_t a[1024], b[1024];
        size_t n = gm_reply_ok_head(a, (uint32_t)r->result_case, len);

        CHECK(n <= GM_REPLY_HEAD_MAX);
        memcpy(a + n, msg, len);
        n += len;
        CHECK_EQ(gpumem__reply__get_packed_size(r), n);
        CHECK_EQ(gpumem__reply__pack(r, b), n);
        CHECK(memcmp(a, b, n) == 0);
}

/* @msg (@len bytes, a result of @want) behind the daemon's head, and mutations of that reply, read in place
 * as protobuf-c reads them. */
static void daemon_reply_mutations(uint32_t want, const uint8_t *msg, size_t len)
{
        uint8_t reply[GM_REPLY_HEAD_MAX + GM_POINTER_INFO_MAX(64)], mut[sizeof(reply) + 1];
        size_t n = gm_reply_ok_head(reply, want, len);

        memcpy(reply + n, msg, len);
        check_mutations(reply, n + len, mut, same_views);
}

/* A pointer query's answer in the daemon's form reads back as what was packed. */
static void same_pointer_info_in_place(const GmPointerInfoOut *o, const uint8_t *msg, size_t len)
{
        uint8_t reply[GM_REPLY_HEAD_MAX + GM_POINTER_INFO_MAX(64)];
        size_t n = gm_reply_ok_head(reply, GPUMEM__REPLY__RESULT_POINTER_INFO, len);
        GmPointerInfoView pi;
        GmReplyView v;

        memcpy(reply + n, msg, len);
        CHECK_RC(gm_reply_view(reply, n + len, GPUMEM__REPLY__RESULT_POINTER_INFO, &v), 0);
        CHECK(v.has_code && v.code == 0 && !v.reason && v.has_result && !v.other);
        CHECK(v.result == reply + n && v.result_len == len);
        CHECK_RC(gm_pointer_info_view(msg, len, &pi), 0);
        CHECK_EQ(pi.handle, o->handle);
        CHECK_EQ(pi.kind, o->kind);
        CHECK_EQ(pi.gpu_id, o->gpu_id);
        CHECK_EQ(pi.alloc_base, o->alloc_base);
        CHECK_EQ(pi.size, o->size);
        CHECK_EQ(pi.flags, o->flags);
        CHECK_EQ(pi.cpu_accessible, o->cpu_accessible);
        CHECK_EQ(pi.n_mapped_gpus, o->n_mapped_gpus);
        for (size_t i = 0; i < o->n_mapped_gpus && i < GM_VIEW_MAX_GPUS; i++)
                CHECK_EQ(pi.mapped_gpus[i], o->mapped_gpus[i]);
        if (rnd() % 8 == 0)
                daemon_reply_mutations(GPUMEM__REPLY__RESULT_POINTER_INFO, msg, len);
}

/* SVM attributes in the daemon's form read back as what was packed; with too little room, -E2BIG. */
static void same_svm_attrs_in_place(const uint64_t *attrs, size_t n_attrs, const uint8_t *msg, size_t len)
{
        uint64_t out[32];
        size_t n = 99, n_msgs = 99;

        CHECK_RC(gm_svm_attrs_view(msg, len, out, ARRAY_SIZE(out), &n, &n_msgs), 0);
        CHECK_EQ(n, n_attrs);
        CHECK_EQ(n_msgs, 0);
        for (size_t i = 0; i < n && i < n_attrs; i++)
                CHECK_EQ(out[i], attrs[i]);
        if (n_attrs)
                CHECK_RC(gm_svm_attrs_view(msg, len, out, n_attrs - 1, &n, &n_msgs), -E2BIG);
        if (rnd() % 8 == 0)
                daemon_reply_mutations(GPUMEM__REPLY__RESULT_SVM_GET_ATTR, msg, len);
}

/* The daemon's hand-packed answers (ping, pointer query, SVM attributes, Empty) are protobuf-c's bytes for
 * the Reply it built before, a status of code 0 and every field of the result set. */
static void test_hand_packed_replies(void)
{
        for (int it = 0; it < 5000; it++) {
                Gpumem__Reply r = GPUMEM__REPLY__INIT;
                Gpumem__Status st = GPUMEM__STATUS__INIT;
                Gpumem__PointerInfoReply pr = GPUMEM__POINTER_INFO_REPLY__INIT;
                Gpumem__PingReply ping = GPUMEM__PING_REPLY__INIT;
                Gpumem__SvmGetAttrReply sg = GPUMEM__SVM_GET_ATTR_REPLY__INIT;
                Gpumem__Empty empty = GPUMEM__EMPTY__INIT;
                uint32_t gpus[64];
                uint64_t attrs[32];
                uint8_t msg[GM_POINTER_INFO_MAX(64)];
                GmPointerInfoOut o;
                size_t n;

                st.has_code = true;
                r.status = &st;
                o.handle = rnd() >> (rnd() % 64);
                o.kind = (int32_t)(rnd() % 3 ? rnd() % 7 : rnd());
                o.gpu_id = (uint32_t)(rnd() >> (rnd() % 64));
                o.alloc_base = rnd() >> (rnd() % 64);
                o.size = rnd() >> (rnd() % 64);
                o.flags = (uint32_t)(rnd() >> (rnd() % 64));
                o.cpu_accessible = rnd() & 1;
                o.n_mapped_gpus = rnd() % 65;
                for (size_t i = 0; i < o.n_mapped_gpus; i++)
                        gpus[i] = (uint32_t)(rnd() >> (rnd() % 64));
                o.mapped_gpus = gpus;
                pr.has_handle = pr.has_kind = pr.has_gpu_id = pr.has_alloc_base = pr.has_size = true;
                pr.has_flags = pr.has_cpu_accessible = true;
                pr.handle = o.handle;
                pr.kind = (Gpumem__MemKind)o.kind;
                pr.gpu_id = o.gpu_id;
                pr.alloc_base = o.alloc_base;
                pr.size = o.size;
                pr.flags = o.flags;
                pr.cpu_accessible = o.cpu_accessible;
                pr.n_mapped_gpus = o.n_mapped_gpus;
                pr.mapped_gpus = gpus;
                r.result_case = GPUMEM__REPLY__RESULT_POINTER_INFO;
                r.pointer_info = &pr;
                n = gm_pack_pointer_info(msg, &o);
                same_hand_reply(&r, msg, n);
                same_pointer_info_in_place(&o, msg, n);

                ping.has_cookie = true;
                ping.cookie = rnd() >> (rnd() % 64);
                r.result_case = GPUMEM__REPLY__RESULT_PING;
                r.ping = &ping;
                n = gm_pb_put_uint_pad(msg, 1, ping.cookie);
                same_hand_reply(&r, msg, n);

                sg.n_packed_attrs = rnd() % 33;
                for (size_t i = 0; i < sg.n_packed_attrs; i++)
                        attrs[i] = (uint64_t)(uint32_t)rnd() << 32 | (uint32_t)(rnd() >> (rnd() % 32));
                sg.packed_attrs = attrs;
                r.result_case = GPUMEM__REPLY__RESULT_SVM_GET_ATTR;
                r.svm_get_attr = &sg;
                n = gm_pb_put_packed(msg, 2, attrs, sg.n_packed_attrs);
                same_hand_reply(&r, msg, n);
                same_svm_attrs_in_place(attrs, sg.n_packed_attrs, msg, n);

                r.result_case = GPUMEM__REPLY__RESULT_EMPTY;
                r.empty = &empty;
                same_hand_reply(&r, msg, 0);
        }
}

/* Bodies a hand decoder must leave to protobuf-c, or read as it does: other wire types, packed or unpacked
 * the unusual way, chunks, long tags and varints, unknown fields. */
static void test_reply_odd_forms(void)
{
        static const struct {
                uint8_t id; /* the result's field number */
                uint8_t n;
                uint8_t b[24];
        } odd[] = {
                {14, 3, {0x0a, 0x01, 0x05}},       /* handle length-delimited */
                {14, 4, {0x0a, 0x02, 0x10, 0x05}}, /* the same, holding what reads as a field */
                {14, 3, {0x09 | 0, 0x01, 0x02}},   /* handle as a fixed64 tag, short */
                {14, 4, {0x32, 0x02, 0x05, 0x06}}, /* mapped GPUs packed */
                {14, 4, {0x30, 0x05, 0x32, 0x00}}, /* unpacked, then an empty packed chunk */
                {14, 3, {0x88, 0x00, 0x07}},       /* a two-byte tag for field 1 */
                {14, 2, {0x48, 0x01}},             /* unknown field 9 */
                {14,
                 11,
                 {0x40, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02}}, /* bool, 10 bytes */
                {14,
                 12,
                 {0x40, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}}, /* 11 bytes */
                {14, 4, {0x10, 0xff, 0xff, 0x0f}},             /* kind, three bytes */
                {14, 2, {0x08, 0x80}},                         /* cut inside a varint */
                {25, 2, {0x10, 0x05}},                         /* packed attrs unpacked */
                {25, 6, {0x12, 0x01, 0x05, 0x12, 0x01, 0x06}}, /* two chunks */
                {25, 2, {0x12, 0x00}},                         /* an empty chunk */
                {25, 3, {0x12, 0x02, 0x05}},                   /* a chunk longer than the body */
                {25, 4, {0x12, 0x02, 0x85, 0x80}},             /* a chunk ending inside a varint */
        };

        for (size_t i = 0; i < ARRAY_SIZE(odd); i++) {
                uint8_t body[64];
                size_t n = 0;
                body[n++] = 1 << 3 | 2; /* status: code 0 */
                body[n++] = 2;
                body[n++] = 1 << 3;
                body[n++] = 0;
                body[n++] = (uint8_t)(odd[i].id << 3 | 2);
                body[n++] = odd[i].n;
                memcpy(body + n, odd[i].b, odd[i].n);
                n += odd[i].n;
                same_reply_decoding(body, n);
                same_views(body, n);
        }
}

/* Both decoders' Requests of @body: the same, whenever the envelope takes it. */
/*
 * @body's op read in place as the daemon reads the small ops' (view.h): what it takes, protobuf-c reads the
 * same; what protobuf-c reads as such an op in its plain envelope, it takes, but for the forms left to the
 * general way (attributes as messages, more than it has room for).
 */
static void same_request_view(const uint8_t *body, size_t len)
{
        Gpumem__Request *pb = gpumem__request__unpack(NULL, len, body);
        const uint8_t *msg;
        uint64_t packed[32], v = 0;
        GmSvmCallView sv = {0};
        uint32_t op = 0;
        size_t n = 0;
        bool has = false;
        int r = gm_request_op_view(body, len, &op, &msg, &n), r2 = -EPROTO;

        if (r == 0 && (op == GPUMEM__REQUEST__OP_PING || op == GPUMEM__REQUEST__OP_POINTER_INFO))
                r2 = gm_u64_view(msg, n, &has, &v);
        else if (r == 0 && (op == GPUMEM__REQUEST__OP_SVM_SET_ATTR || op == GPUMEM__REQUEST__OP_SVM_GET_ATTR))
                r2 = gm_svm_call_view(msg, n, packed, ARRAY_SIZE(packed), &sv);
        else
                r = -EPROTO; /* not one of these ops */
        if (r == 0 && r2 == 0) {
                CHECK(pb != NULL);
                if (!pb)
                        return;
                CHECK_EQ((uint32_t)pb->op_case, op);
                if (op == GPUMEM__REQUEST__OP_PING) {
                        CHECK_EQ(pb->ping->cookie, v);
                } else if (op == GPUMEM__REQUEST__OP_POINTER_INFO) {
                        CHECK_EQ(pb->pointer_info->va, v);
                } else { /* SvmSetAttr and SvmGetAttr share their layout */
                        const Gpumem__SvmGetAttr *a = pb->svm_get_attr;
                        CHECK_EQ(a->va, sv.va);
                        CHECK_EQ(a->size, sv.size);
                        CHECK_EQ(a->n_attrs, sv.n_msgs);
                        CHECK_EQ(a->n_packed_attrs, sv.n);
                        for (size_t i = 0; i < sv.n && i < a->n_packed_attrs; i++)
                                CHECK_EQ(a->packed_attrs[i], packed[i]);
                }
        } else if (pb && r == 0 && r2 != -E2BIG) {
                CHECK((uint32_t)pb->op_case != op); /* protobuf-c must not have read it as that op either */
        }
        if (pb)
                gpumem__request__free_unpacked(pb, NULL);
}

static void same_request_decoding(const uint8_t *body, size_t len)
{
        Gpumem__Request *fast = NULL;

        if (gm_request_unpack_op(NULL, body, len, &fast))
                same_bytes(&fast->base, (ProtobufCMessage *)gpumem__request__unpack(NULL, len, body),
                           "a request");
        same_request_view(body, len);
}

/* Requests of every op at random, packed, then mutated as the replies above; and odd forms of the ops
 * decoded by hand: whatever the envelope takes, protobuf-c reads the same. */
static void test_request_mutations(void)
{
        static const struct {
                uint8_t id; /* the op's field number */
                uint8_t n;
                uint8_t b[24];
        } odd[] = {
                {2, 4, {0x08, 0x01, 0x08, 0x02}}, /* the cookie twice */
                {2, 3, {0x0a, 0x01, 0x05}},       /* length-delimited */
                {2, 4, {0x0a, 0x02, 0x08, 0x05}}, /* holding what reads as a field */
                {2, 3, {0x88, 0x00, 0x07}},       /* a two-byte tag */
                {6, 2, {0x10, 0x01}},             /* pointer info: unknown field 2 */
                {6, 12, {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
                {51, 4, {0x10, 0x01, 0x08, 0x02}},                   /* size before va */
                {51, 4, {0x08, 0x01, 0x08, 0x02}},                   /* va twice */
                {51, 2, {0x20, 0x05}},                               /* packed attributes unpacked */
                {51, 6, {0x22, 0x01, 0x05, 0x22, 0x01, 0x06}},       /* two chunks */
                {51, 2, {0x22, 0x00}},                               /* an empty chunk */
                {51, 6, {0x1a, 0x02, 0x08, 0x01, 0x22, 0x00}},       /* a message attribute */
                {50, 7, {0x08, 0x01, 0x10, 0x02, 0x22, 0x01, 0x85}}, /* a chunk ending inside a varint */
                {50, 5, {0x08, 0x01, 0x22, 0x01, 0x05}},
                {50, 3, {0x22, 0x03, 0x05}}, /* a chunk longer than the body */
        };
        void *pool[512];

        for (size_t i = 0; i < ARRAY_SIZE(odd); i++) {
                uint8_t body[64];
                size_t n = 0;
                body[n++] = (uint8_t)(odd[i].id << 3 | 2);
                body[n++] = odd[i].n;
                memcpy(body + n, odd[i].b, odd[i].n);
                n += odd[i].n;
                if (odd[i].id >= 16) { /* a two-byte tag */
                        memmove(body + 1, body, n);
                        body[0] = (uint8_t)(0x80 | (odd[i].id << 3 | 2));
                        body[1] = (uint8_t)(odd[i].id >> 4);
                        n++;
                }
                same_request_decoding(body, n);
        }
        for (unsigned i = 0; i < gpumem__request__descriptor.n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &gpumem__request__descriptor.fields[i];
                bool hand = f->id == GPUMEM__REQUEST__OP_PING || f->id == GPUMEM__REQUEST__OP_POINTER_INFO ||
                            f->id == GPUMEM__REQUEST__OP_SVM_SET_ATTR ||
                            f->id == GPUMEM__REQUEST__OP_SVM_GET_ATTR;
                for (int it = 0; it < (hand ? 3000 : 50); it++) {
                        Gpumem__Request q = GPUMEM__REQUEST__INIT;
                        uint8_t buf[4096], mut[4097];
                        size_t n_pool = 0, len;

                        q.op_case = (Gpumem__Request__OpCase)f->id;
                        *(ProtobufCMessage **)((uint8_t *)&q + f->offset) =
                                random_message(f->descriptor, pool, &n_pool, 1);
                        len = gpumem__request__get_packed_size(&q);
                        if (len <= sizeof(buf)) {
                                gpumem__request__pack(&q, buf);
                                check_mutations(buf, len, mut, same_request_decoding);
                        }
                        while (n_pool)
                                free(pool[--n_pool]);
                }
        }
}

/* The envelope's field lookup finds what protobuf-c's does, for every number of messages of one range and of
 * several (Request's ops come in runs with gaps between them), and nothing outside them. */
static void test_field_lookup(void)
{
        static const ProtobufCMessageDescriptor *const descs[] = {
                &gpumem__request__descriptor,
                &gpumem__reply__descriptor,
                &gpumem__status__descriptor,
                &gpumem__ping__descriptor,
                &gpumem__pointer_info_reply__descriptor,
                &gpumem__svm_get_attr__descriptor,
                &gpumem__svm_get_attr_reply__descriptor,
                &gpumem__hello_reply__descriptor,
                &gpumem__topology_reply__descriptor,
                &gpumem__alloc_reply__descriptor,
                &gpumem__empty__descriptor,
        };
        for (size_t d = 0; d < ARRAY_SIZE(descs); d++) {
                unsigned found = 0;
                for (uint32_t id = 0; id < 300; id++) {
                        const ProtobufCFieldDescriptor *want =
                                protobuf_c_message_descriptor_get_field(descs[d], id);
                        CHECK(gm_proto_field(descs[d], id) == want);
                        found += want != NULL;
                }
                CHECK_EQ(found, descs[d]->n_fields);
                CHECK(gm_proto_field(descs[d], UINT32_MAX) == NULL);
        }
        CHECK(gpumem__request__descriptor.n_field_ranges > 1); /* the case of several runs is covered */
}

int main(void)
{
        const char *seed = getenv("GM_TEST_SEED"); /* another sequence of random messages and mutations */

        if (seed && strtoull(seed, NULL, 0))
                rng = strtoull(seed, NULL, 0);
        static const TestCase cases[] = {
                {"the field lookup finds every field protobuf-c finds, and no other", test_field_lookup},
                {"a Reply packs as protobuf-c packs it", test_reply},
                {"a one-op Request decodes as protobuf-c decodes it", test_request},
                {"every other body is left to protobuf-c", test_other_bodies},
                {"every other reply is left to protobuf-c", test_other_replies},
                {"every result and op, filled at random, packs as protobuf-c packs it", test_random_messages},
                {"a mutated reply the envelope takes, protobuf-c reads the same", test_reply_mutations},
                {"odd forms of the results decoded by hand are read as protobuf-c reads them",
                 test_reply_odd_forms},
                {"a mutated or odd request the envelope takes, protobuf-c reads the same",
                 test_request_mutations},
                {"a varint is read in place as the plain way reads it", test_varints},
                {"a mutated reply read in place says what protobuf-c reads", test_view_mutations},
                {"an SVM call packed by hand is protobuf-c's bytes, read back in place",
                 test_hand_packed_request},
                {"the daemon's hand-packed small replies are protobuf-c's bytes, read back in place",
                 test_hand_packed_replies},
                {"a ping and a pointer query as the client writes them are read in place",
                 test_hand_packed_u64},
                {"a length byte of 0x80 or more is read as protobuf-c reads it", test_request_length_bytes},
        };
        return run_tests(cases, ARRAY_SIZE(cases));
}
