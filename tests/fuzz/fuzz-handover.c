/* libFuzzer target: the hand-over state's reader (handover_state_parse), on framed bytes as they come and on
 * any bytes framed here, so that the decoder and the format checks behind the frame are reached too. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/state-frame.h"
#include "base/handover.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Hide (@hide) or show again the unknown fields of every message of @st. protobuf-c keeps what it skipped
 * as it came, and it takes some bytes as unknown fields (a tag of 0 written in two bytes) that it then
 * refuses once it writes them itself: the round trip below is held to the fields this reader knows.
 */
static size_t hidden[4096];
static size_t n_hidden;

static void hide_one(ProtobufCMessage *m, bool hide)
{
        if (hide) {
                if (n_hidden < sizeof(hidden) / sizeof(hidden[0]))
                        hidden[n_hidden++] = m->n_unknown_fields;
                m->n_unknown_fields = 0;
        } else if (n_hidden < sizeof(hidden) / sizeof(hidden[0])) {
                m->n_unknown_fields = hidden[n_hidden++];
        }
}

static void hide_unknown(Gpumemd__HandoverState *st, bool hide)
{
        n_hidden = 0;
        hide_one(&st->base, hide);
        for (size_t i = 0; i < st->n_clients; i++) {
                Gpumemd__HandoverClient *c = st->clients[i];
                hide_one(&c->base, hide);
                for (size_t j = 0; j < c->n_objects; j++) {
                        Gpumemd__HandoverObject *o = c->objects[j];
                        hide_one(&o->base, hide);
                        for (size_t k = 0; k < o->n_svm; k++)
                                hide_one(&o->svm[k]->base, hide);
                }
                for (size_t j = 0; j < c->n_vmm_maps; j++)
                        hide_one(&c->vmm_maps[j]->base, hide);
        }
        for (size_t i = 0; i < st->n_shares; i++)
                hide_one(&st->shares[i]->base, hide);
}

/* what walk() read, kept so that the reads are made */
static volatile uint64_t sink;

/* A state the parser took: every field it names can be walked, and packing it again (its known fields)
 * gives a state it takes. */
static void walk(Gpumemd__HandoverState *st)
{
        uint8_t *again = NULL;
        size_t len = 0;
        uint64_t sum = 0;
        Gpumemd__HandoverState *st2 = NULL;
        int r;

        for (size_t i = 0; i < st->n_clients; i++) {
                const Gpumemd__HandoverClient *c = st->clients[i];
                sum += c->id + (c->name ? strlen(c->name) : 0);
                for (size_t j = 0; j < c->n_objects; j++) {
                        const Gpumemd__HandoverObject *o = c->objects[j];
                        sum += o->va + o->size + o->n_mapped;
                        for (size_t k = 0; k < o->n_svm; k++)
                                sum += o->svm[k]->n_attrs;
                }
                for (size_t j = 0; j < c->n_vmm_maps; j++)
                        sum += c->vmm_maps[j]->va + c->vmm_maps[j]->n_grants;
        }
        for (size_t i = 0; i < st->n_shares; i++)
                sum += st->shares[i]->size + (st->shares[i]->name ? strlen(st->shares[i]->name) : 0);
        sink += sum;
        hide_unknown(st, true);
        r = handover_state_pack(st, &again, &len);
        hide_unknown(st, false); /* freed with the message */
        if (r == 0) {
                if (handover_state_parse(again, len, &st2, NULL, 0) != 0)
                        abort();
                gpumemd__handover_state__free_unpacked(st2, NULL);
                free(again);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        Gpumemd__HandoverState *st = NULL;
        char why[256];
        uint8_t *framed;

        if (handover_state_parse(data, size, &st, why, sizeof(why)) == 0) {
                walk(st);
                gpumemd__handover_state__free_unpacked(st, NULL);
        }
        /* the same bytes as a body, behind a frame that holds */
        framed = malloc(size + 24);
        if (!framed)
                return 0;
        (void)state_frame(data, size, framed);
        st = NULL;
        if (handover_state_parse(framed, size + 24, &st, why, sizeof(why)) == 0) {
                walk(st);
                gpumemd__handover_state__free_unpacked(st, NULL);
        }
        free(framed);
        return 0;
}
