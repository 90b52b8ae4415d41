/* The Request and Reply envelopes coded without walking every op of the oneof: one op field in, status and
 * one result field out; the small ops' messages (ping, pointer query, the packed SVM calls, a status with a
 * code alone, the empty result) coded by hand, with protobuf-c's bytes. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpumem.pb-c.h"
#include "view.h"

/*
 * A Request whose body is exactly one op field (the length-delimited message of one member of its oneof),
 * decoded with that op's own descriptor: protobuf-c's Request unpacking visits every member of the oneof,
 * most of the daemon's work for a small request. The result is what gpumem__request__unpack() gives for such
 * a body, made with @alloc (NULL: malloc, as protobuf-c's default), and is freed the same way.
 * Returns 1 and the Request, or 0 when the body is not one valid op field: the caller then decodes it the
 * general way, which gives every other body (and refuses a broken one) as before.
 */
int gm_request_unpack_op(ProtobufCAllocator *alloc, const uint8_t *body, size_t len, Gpumem__Request **ret);

/* The same for a Reply of a status and a result, each at most once (the top message allocated first, as
 * protobuf-c does): 1 and the Reply, or 0 for the general way. */
int gm_reply_unpack_result(ProtobufCAllocator *alloc, const uint8_t *body, size_t len, Gpumem__Reply **ret);

/* A Request of one op packed into @out as gpumem__request__pack() packs it: 0 and *@ret_len, or -EMSGSIZE
 * when it needs more than @cap bytes (nothing written). */
int gm_request_pack_into(const Gpumem__Request *req, uint8_t *out, size_t cap, size_t *ret_len);

/*
 * A Reply with its status and its result packed into @out, byte for byte what gpumem__reply__pack() writes,
 * each part's size computed once: 0 and *@ret_len, or -EMSGSIZE when it needs more than @cap bytes (nothing
 * is written then). A Reply with unknown fields is passed to protobuf-c.
 */
int gm_reply_pack_into(const Gpumem__Reply *r, uint8_t *out, size_t cap, size_t *ret_len);
