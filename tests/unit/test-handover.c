/* The hand-over state: sealed, framed, versioned; what an older daemon wrote is read, anything else refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "../common/state-frame.h"
#include "base/handover.h"

/*
 * A state as format 1, revision 1 wrote it (gpumemd 0.1.0): kept byte for byte, so that every later daemon
 * is tested on reading it. One client: id 7, "pinger", protocol 2, window 0x18000200000+0x1000000000, class
 * "default", cgroup "/", 31 requests; next client id 9; the listening socket "gm-listen", bound; model.
 */
static const char golden_hex[] =
        "474d4453544154457f00000000000000af9e87f54cfdfff3080110011a05302e312e3028093209676d2d6c697374656e"
        "380142192f72756e2f6770756d656d642f6770756d656d642e736f636b4a056d6f64656c52410807120b676d2d636c69"
        "656e742d371a0a676d2d70696466642d37220670696e676572280238808080818030408080808080024a076465666175"
        "6c7452012f601f";

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
        size_t n = 0;

        for (; s[0] && s[1] && n < cap; s += 2) {
                unsigned v;
                if (sscanf(s, "%2x", &v) != 1)
                        break;
                out[n++] = (uint8_t)v;
        }
        return n;
}

static void sample(Gpumemd__HandoverState *st, Gpumemd__HandoverClient *c, Gpumemd__HandoverClient **cp)
{
        gpumemd__handover_state__init(st);
        gpumemd__handover_client__init(c);
        c->has_id = c->has_protocol_version = c->has_window_base = c->has_window_size = c->has_requests =
                true;
        c->id = 7;
        c->fd_name = "gm-client-7";
        c->pidfd_name = "gm-pidfd-7";
        c->name = "pinger";
        c->protocol_version = 2;
        c->window_base = 0x18000200000ull;
        c->window_size = 0x1000000000ull;
        c->class_name = "default";
        c->cgroup = "/";
        c->requests = 31;
        cp[0] = c;
        st->has_format = st->has_revision = st->has_next_client_id = st->has_listen_bound = true;
        st->format = 1;
        st->revision = 1;
        st->writer_version = "0.1.0";
        st->next_client_id = 9;
        st->listen_name = "gm-listen";
        st->listen_bound = true;
        st->socket_path = "/run/gpumemd/gpumemd.sock";
        st->backend = "model";
        st->n_clients = 1;
        st->clients = cp;
}

/* Revision 2: the client holds one object, device memory at the start of its window on two GPUs. */
static void sample_objects(Gpumemd__HandoverState *st, Gpumemd__HandoverObject *o,
                           Gpumemd__HandoverObject **op, uint32_t *mapped)
{
        Gpumemd__HandoverClient *c = st->clients[0];

        gpumemd__handover_object__init(o);
        o->has_handle = o->has_kind = o->has_va = o->has_size = o->has_gpu_id = o->has_flags = true;
        o->has_numa_node = o->has_exports = o->has_handed_out = true;
        o->handle = 0x1234abcd5678ull;
        o->kind = 1;
        o->va = 0x18000200000ull;
        o->size = 2u << 20;
        o->gpu_id = 4242;
        o->flags = 1;
        o->numa_node = -1;
        o->exports = 1;
        o->handed_out = true;
        mapped[0] = 4242;
        mapped[1] = 4243;
        o->mapped = mapped;
        o->n_mapped = 2;
        o->has_fd_index = true;
        o->fd_index = 2;
        op[0] = o;
        c->objects = op;
        c->n_objects = 1;
        st->revision = 2;
        c->fd_name = c->pidfd_name = NULL; /* from revision 2 through the channel */
        c->has_fd_index = c->has_pidfd_index = true;
        c->fd_index = 0;
        c->pidfd_index = 1;
        st->channel_name = "gm-fds";
        st->has_channel_fds = true;
        st->channel_fds = 3;
}

/* Revision 3: besides, a VMM reservation, a VMM handle named only by its mapping, and that mapping with a
 * GPU's grant and the CPU's access. */
typedef struct SampleVmm {
        Gpumemd__HandoverObject res, phys, *op[3];
        Gpumemd__HandoverVmmMap map, *mp[1];
        uint32_t grants[2];
} SampleVmm;

static void sample_vmm(Gpumemd__HandoverState *st, SampleVmm *v)
{
        Gpumemd__HandoverClient *c = st->clients[0];

        gpumemd__handover_object__init(&v->res);
        v->res.has_handle = v->res.has_kind = v->res.has_va = v->res.has_size = true;
        v->res.handle = 0x77aa;
        v->res.kind = 100;
        v->res.va = 0x18000400000ull;
        v->res.size = 8u << 20;
        gpumemd__handover_object__init(&v->phys);
        v->phys.has_handle = v->phys.has_kind = v->phys.has_size = v->phys.has_gpu_id = true;
        v->phys.has_client_refs = v->phys.has_fd_index = true;
        v->phys.handle = 0x88bb;
        v->phys.kind = 4;
        v->phys.size = 4u << 20;
        v->phys.gpu_id = 4243;
        v->phys.client_refs = 0;
        v->phys.fd_index = 3;
        v->op[0] = c->objects[0];
        v->op[1] = &v->res;
        v->op[2] = &v->phys;
        c->objects = v->op;
        c->n_objects = 3;
        gpumemd__handover_vmm_map__init(&v->map);
        v->map.has_va = v->map.has_size = v->map.has_offset = v->map.has_handle = v->map.has_cpu_access =
                true;
        v->map.va = 0x18000600000ull;
        v->map.size = 2u << 20;
        v->map.offset = 2u << 20;
        v->map.handle = 0x88bb;
        v->map.cpu_access = 3;
        v->grants[0] = 4242;
        v->grants[1] = 1;
        v->map.grants = v->grants;
        v->map.n_grants = 2;
        v->mp[0] = &v->map;
        c->vmm_maps = v->mp;
        c->n_vmm_maps = 1;
        st->revision = 3;
        st->channel_fds = 4;
}

/* Revision 4: besides, a foreign, read-only import of 2 MiB on the second GPU. */
typedef struct SampleImport {
        SampleVmm vmm;
        Gpumemd__HandoverObject imp, *op[4];
} SampleImport;

static void sample_import(Gpumemd__HandoverState *st, SampleImport *v)
{
        Gpumemd__HandoverClient *c = st->clients[0];

        sample_vmm(st, &v->vmm);
        gpumemd__handover_object__init(&v->imp);
        v->imp.has_handle = v->imp.has_kind = v->imp.has_size = v->imp.has_gpu_id = true;
        v->imp.has_client_refs = v->imp.has_fd_index = v->imp.has_foreign = v->imp.has_read_only = true;
        v->imp.handle = 0x99cc;
        v->imp.kind = 5;
        v->imp.size = 2u << 20;
        v->imp.gpu_id = 4243;
        v->imp.client_refs = 1;
        v->imp.fd_index = 4;
        v->imp.foreign = true;
        v->imp.read_only = true;
        for (size_t i = 0; i < 3; i++)
                v->op[i] = c->objects[i];
        v->op[3] = &v->imp;
        c->objects = v->op;
        c->n_objects = 4;
        st->revision = 4;
        st->channel_fds = 5;
}

/* Revision 5: besides, a persistent named share of the client's device memory, which it also reads. */
typedef struct SampleShare {
        SampleImport imp;
        Gpumemd__HandoverObject reader, *op[5];
        Gpumemd__HandoverShare share, *sp[1];
        uint32_t gpus[1];
} SampleShare;

static void sample_share(Gpumemd__HandoverState *st, SampleShare *v)
{
        Gpumemd__HandoverClient *c = st->clients[0];
        Gpumemd__HandoverShare *sh = &v->share;

        sample_import(st, &v->imp);
        gpumemd__handover_object__init(&v->reader);
        v->reader.has_handle = v->reader.has_kind = v->reader.has_size = v->reader.has_read_only = true;
        v->reader.handle = 0xaadd;
        v->reader.kind = 6;
        v->reader.size = 2u << 20;
        v->reader.read_only = true;
        v->reader.share_name = "weights/a";
        v->gpus[0] = 4242;
        v->reader.mapped = v->gpus;
        v->reader.n_mapped = 1;
        for (size_t i = 0; i < 4; i++)
                v->op[i] = c->objects[i];
        v->op[4] = &v->reader;
        c->objects = v->op;
        c->n_objects = 5;
        gpumemd__handover_share__init(sh);
        sh->name = "weights/a";
        sh->class_name = "default";
        sh->has_kind = sh->has_gpu_id = sh->has_va = sh->has_size = sh->has_read_only = sh->has_persistent =
                true;
        sh->has_owner_id = sh->has_src_handle = sh->has_published_real_usec = sh->has_opens = true;
        sh->has_fd_index = true;
        sh->kind = 1;
        sh->gpu_id = 4242;
        sh->va = 0x10000000000ull;
        sh->size = 2u << 20;
        sh->persistent = true;
        sh->owner_id = 7;
        sh->src_handle = 0x1234abcd5678ull;
        sh->published_real_usec = 1796232962154132ull;
        sh->opens = 3;
        sh->fd_index = 5;
        v->sp[0] = sh;
        st->shares = v->sp;
        st->n_shares = 1;
        st->has_share_region_base = st->has_share_region_size = true;
        st->share_region_base = 0x10000000000ull;
        st->share_region_size = 0x4000000000ull;
        st->revision = 5;
        st->channel_fds = 6;
}

static void check_sample(const Gpumemd__HandoverState *st)
{
        CHECK_EQ(st->format, 1);
        CHECK_EQ(st->next_client_id, 9);
        CHECK(st->listen_bound);
        CHECK(st->backend && strcmp(st->backend, "model") == 0);
        CHECK_EQ(st->n_clients, 1);
        if (st->n_clients != 1)
                return;
        CHECK_EQ(st->clients[0]->id, 7);
        if (st->revision < 2) /* from 2 the client's fds come through the channel */
                CHECK(st->clients[0]->fd_name && strcmp(st->clients[0]->fd_name, "gm-client-7") == 0);
        CHECK(strcmp(st->clients[0]->name, "pinger") == 0);
        CHECK_EQ(st->clients[0]->window_base, 0x18000200000ull);
        CHECK_EQ(st->clients[0]->window_size, 0x1000000000ull);
        CHECK_EQ(st->clients[0]->requests, 31);
}

static void test_roundtrip(void)
{
        Gpumemd__HandoverState st, *back = NULL;
        Gpumemd__HandoverClient c, *cp[1];
        char why[256];
        int fd = -1;

        sample(&st, &c, cp);
        CHECK_RC(handover_state_seal(&st, &fd), 0);
        CHECK_EQ(fcntl(fd, F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
                 F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
        CHECK(write(fd, "x", 1) < 0); /* nobody changes it now */
        CHECK_RC(handover_state_open(fd, &back, why, sizeof(why)), 0);
        if (back) {
                check_sample(back);
                gpumemd__handover_state__free_unpacked(back, NULL);
        }
        close(fd);
}

/* A kept state read, and its sample's fields checked; NULL when it is refused. */
static Gpumemd__HandoverState *parse_golden(const char *hex)
{
        uint8_t buf[1024] = {0};
        size_t n = unhex(hex, buf, sizeof(buf));
        Gpumemd__HandoverState *st = NULL;
        char why[256];

        CHECK_RC(handover_state_parse(buf, n, &st, why, sizeof(why)), 0);
        if (st)
                check_sample(st);
        return st;
}

static void test_golden(void)
{
        Gpumemd__HandoverState *st = parse_golden(golden_hex);

        if (st)
                gpumemd__handover_state__free_unpacked(st, NULL);
}

/* A state as format 1, revision 2 wrote it: the sample above with one object (sample_objects). */
static const char golden2_hex[] =
        "474d4453544154459f00000000000000516de9835666284c080110021a05302e312e3028093209676d2d6c697374656e"
        "380142192f72756e2f6770756d656d642f6770756d656d642e736f636b4a056d6f64656c52570807220670696e676572"
        "280238808080818030408080808080024a0764656661756c7452012f601f6a2908f8acb5decac6041001188080808180"
        "30208080800128922130013801400148015204922193215802700078025a06676d2d6664736003";

static void test_golden2(void)
{
        Gpumemd__HandoverState *st = parse_golden(golden2_hex);

        if (!st)
                return;
        CHECK_EQ(st->revision, 2);
        CHECK(st->channel_name && strcmp(st->channel_name, "gm-fds") == 0);
        CHECK_EQ(st->channel_fds, 3);
        CHECK_EQ(st->clients[0]->pidfd_index, 1);
        CHECK_EQ(st->clients[0]->n_objects, 1);
        if (st->clients[0]->n_objects == 1) {
                const Gpumemd__HandoverObject *o = st->clients[0]->objects[0];
                CHECK_EQ(o->handle, 0x1234abcd5678ull);
                CHECK_EQ(o->va, 0x18000200000ull);
                CHECK_EQ(o->size, 2u << 20);
                CHECK_EQ(o->numa_node, -1);
                CHECK_EQ(o->n_mapped, 2);
                CHECK(o->n_mapped == 2 && o->mapped[1] == 4243);
                CHECK(o->handed_out);
                CHECK_EQ(o->fd_index, 2);
        }
        gpumemd__handover_state__free_unpacked(st, NULL);
}

/* A state as format 1, revision 3 wrote it: the sample with objects, and VMM memory (sample_vmm). */
static const char golden3_hex[] =
        "474d445354415445e7000000000000000c8ca2256bb086b9080110031a05302e312e3028093209676d2d6c697374656e"
        "380142192f72756e2f6770756d656d642f6770756d656d642e736f636b4a056d6f64656c529e010807220670696e6765"
        "72280238808080818030408080808080024a0764656661756c7452012f601f6a2908f8acb5decac60410011880808081"
        "80302080808001289221300138014001480152049221932158026a1208aaef0110641880808082803020808080046a12"
        "08bb910210042080808002289321580368007000780282011c088080808380301080808001188080800120bb91022803"
        "32039221015a06676d2d6664736004";

static void test_golden3(void)
{
        Gpumemd__HandoverState *st = parse_golden(golden3_hex);

        if (!st)
                return;
        CHECK_EQ(st->revision, 3);
        CHECK_EQ(st->channel_fds, 4);
        CHECK_EQ(st->clients[0]->n_objects, 3);
        CHECK_EQ(st->clients[0]->n_vmm_maps, 1);
        if (st->clients[0]->n_objects == 3 && st->clients[0]->n_vmm_maps == 1) {
                const Gpumemd__HandoverObject *r = st->clients[0]->objects[1],
                                              *p = st->clients[0]->objects[2];
                const Gpumemd__HandoverVmmMap *m = st->clients[0]->vmm_maps[0];
                CHECK_EQ(r->kind, 100);
                CHECK(!r->has_fd_index); /* a reservation has no memory to hand over */
                CHECK_EQ(r->size, 8u << 20);
                CHECK_EQ(p->kind, 4);
                CHECK(p->has_client_refs);
                CHECK_EQ(p->client_refs, 0);
                CHECK_EQ(p->fd_index, 3);
                CHECK_EQ(m->va, 0x18000600000ull);
                CHECK_EQ(m->offset, 2u << 20);
                CHECK_EQ(m->handle, 0x88bb);
                CHECK_EQ(m->cpu_access, 3);
                CHECK_EQ(m->n_grants, 2);
                CHECK(m->n_grants == 2 && m->grants[0] == 4242 && m->grants[1] == 1);
        }
        gpumemd__handover_state__free_unpacked(st, NULL);
}

/* A state as format 1, revision 4 wrote it: the revision 3 sample, and an import (sample_import). */
static const char golden4_hex[] =
        "474d445354415445ff00000000000000188b83034f61844a080110041a05302e312e3028093209676d2d6c697374656e"
        "380142192f72756e2f6770756d656d642f6770756d656d642e736f636b4a056d6f64656c52b6010807220670696e6765"
        "72280238808080818030408080808080024a0764656661756c7452012f601f6a2908f8acb5decac60410011880808081"
        "80302080808001289221300138014001480152049221932158026a1208aaef0110641880808082803020808080046a12"
        "08bb910210042080808002289321580368006a1608ccb302100520808080012893215804680170017801700078028201"
        "1c088080808380301080808001188080800120bb9102280332039221015a06676d2d6664736005";

static void test_golden4(void)
{
        Gpumemd__HandoverState *st = parse_golden(golden4_hex);

        if (!st)
                return;
        CHECK_EQ(st->revision, 4);
        CHECK_EQ(st->channel_fds, 5);
        CHECK_EQ(st->clients[0]->n_objects, 4);
        CHECK_EQ(st->clients[0]->n_vmm_maps, 1);
        if (st->clients[0]->n_objects == 4) {
                const Gpumemd__HandoverObject *o = st->clients[0]->objects[3];
                CHECK_EQ(o->kind, 5);
                CHECK_EQ(o->handle, 0x99cc);
                CHECK_EQ(o->gpu_id, 4243);
                CHECK_EQ(o->client_refs, 1);
                CHECK_EQ(o->fd_index, 4);
                CHECK(o->has_foreign && o->foreign);
                CHECK(o->has_read_only && o->read_only);
        }
        gpumemd__handover_state__free_unpacked(st, NULL);
}

/* A state as format 1, revision 5 wrote it: the revision 4 sample, and a named share (sample_share). */
static const char golden5_hex[] =
        "474d4453544154456e0100000000000089ad78c466e7ecd1080110051a05302e312e3028093209676d2d6c697374656e"
        "380142192f72756e2f6770756d656d642f6770756d656d642e736f636b4a056d6f64656c52d5010807220670696e6765"
        "72280238808080818030408080808080024a0764656661756c7452012f601f6a2908f8acb5decac60410011880808081"
        "80302080808001289221300138014001480152049221932158026a1208aaef0110641880808082803020808080046a12"
        "08bb910210042080808002289321580368006a1608ccb3021005208080800128932158046801700178016a1d08ddd502"
        "10062080808001520292217801820109776569676874732f617000780282011c08808080838030108080800118808080"
        "0120bb9102280332039221015a06676d2d66647360066a400a09776569676874732f6110011892212080808080802028"
        "8080800130003801400748f8acb5decac604520764656661756c745894bd929da1b59803600368057080808080802078"
        "808080808008";

static void test_golden5(void)
{
        Gpumemd__HandoverState *st = parse_golden(golden5_hex);

        if (!st)
                return;
        CHECK_EQ(st->revision, 5);
        CHECK_EQ(st->share_region_base, 0x10000000000ull);
        CHECK_EQ(st->share_region_size, 0x4000000000ull);
        CHECK_EQ(st->n_shares, 1);
        if (st->n_shares == 1) {
                const Gpumemd__HandoverShare *sh = st->shares[0];
                CHECK(sh->name && strcmp(sh->name, "weights/a") == 0);
                CHECK(sh->class_name && strcmp(sh->class_name, "default") == 0);
                CHECK_EQ(sh->va, 0x10000000000ull);
                CHECK(sh->persistent && !sh->read_only);
                CHECK_EQ(sh->owner_id, 7);
                CHECK_EQ(sh->src_handle, 0x1234abcd5678ull);
                CHECK_EQ(sh->opens, 3);
                CHECK_EQ(sh->fd_index, 5);
        }
        CHECK_EQ(st->clients[0]->n_objects, 5);
        if (st->clients[0]->n_objects == 5) {
                const Gpumemd__HandoverObject *o = st->clients[0]->objects[4];
                CHECK_EQ(o->kind, 6);
                CHECK(o->share_name && strcmp(o->share_name, "weights/a") == 0);
                CHECK(o->read_only);
                CHECK(!o->has_fd_index); /* its memory comes with the share */
                CHECK(o->n_mapped == 1 && o->mapped[0] == 4242);
        }
        gpumemd__handover_state__free_unpacked(st, NULL);
}

static void test_refused(void)
{
        Gpumemd__HandoverState st, *back = NULL;
        Gpumemd__HandoverClient c, *cp[1];
        uint8_t *buf = NULL, body[1024], out[1100];
        size_t len = 0, blen;
        char why[256];
        int fd;

        sample(&st, &c, cp);
        CHECK_RC(handover_state_pack(&st, &buf, &len), 0);
        if (!buf)
                return;
        /* not sealed: refused before it is read */
        fd = memfd_create("unsealed", MFD_CLOEXEC);
        CHECK_EQ(write(fd, buf, len), (ssize_t)len);
        CHECK_RC(handover_state_open(fd, &back, why, sizeof(why)), -EPERM);
        close(fd);
        /* cut short, a flipped byte, no magic */
        CHECK_RC(handover_state_parse(buf, len - 1, &back, why, sizeof(why)), -EBADMSG);
        buf[len - 3] ^= 0x40;
        CHECK_RC(handover_state_parse(buf, len, &back, why, sizeof(why)), -EBADMSG);
        CHECK_STR_CONTAINS(why, "checksum");
        buf[len - 3] ^= 0x40;
        buf[0] = 'X';
        CHECK_RC(handover_state_parse(buf, len, &back, why, sizeof(why)), -EBADMSG);
        CHECK_RC(handover_state_parse(buf, 3, &back, why, sizeof(why)), -EBADMSG);
        free(buf);
        /* a newer format: refused, saying which */
        st.format = HANDOVER_FORMAT + 1;
        st.writer_version = "9.0";
        blen = gpumemd__handover_state__pack(&st, body);
        CHECK_RC(handover_state_parse(out, state_frame(body, blen, out), &back, why, sizeof(why)),
                 -EPROTONOSUPPORT);
        CHECK_STR_CONTAINS(why, "format 2");
        CHECK_STR_CONTAINS(why, "9.0");
        /* no format at all */
        st.has_format = false;
        blen = gpumemd__handover_state__pack(&st, body);
        CHECK_RC(handover_state_parse(out, state_frame(body, blen, out), &back, why, sizeof(why)), -EBADMSG);
        CHECK(back == NULL);
}

/* A later revision of format 1 adds fields: this daemon skips them and reads the rest. */
static void test_newer_revision(void)
{
        Gpumemd__HandoverState st, *back = NULL;
        Gpumemd__HandoverClient c, *cp[1];
        uint8_t body[1024], out[1100];
        size_t blen;
        char why[256];

        sample(&st, &c, cp);
        st.revision = 7;
        blen = gpumemd__handover_state__pack(&st, body);
        /* field 100 (a varint, 1) and field 101 (bytes "new"), unknown to this reader */
        const uint8_t extra[] = {0xa0, 0x06, 0x01, 0xaa, 0x06, 0x03, 'n', 'e', 'w'};
        memcpy(body + blen, extra, sizeof(extra));
        blen += sizeof(extra);
        CHECK_RC(handover_state_parse(out, state_frame(body, blen, out), &back, why, sizeof(why)), 0);
        if (back) {
                check_sample(back);
                CHECK_EQ(back->revision, 7);
                gpumemd__handover_state__free_unpacked(back, NULL);
        }
}

/* Named fds: names systemd would refuse are refused, and what is left is closed. */
static void test_fds(void)
{
        HandoverFds s = {0};
        int p[2];

        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        CHECK_RC(handover_fds_add(&s, "gm-a", p[0]), 0);
        CHECK_RC(handover_fds_add(&s, "bad:name", dup(p[1])), -EINVAL);
        CHECK_RC(handover_fds_add(&s, "", dup(p[1])), -EINVAL);
        CHECK_RC(handover_fds_add(&s, "gm-b", p[1]), 0);
        CHECK_EQ(handover_fds_take(&s, "gm-a"), p[0]);
        CHECK_RC(handover_fds_take(&s, "gm-a"), -ENOENT);
        close(p[0]);
        handover_fds_done(&s);
        CHECK(fcntl(p[1], F_GETFD) < 0); /* closed with the set */
        CHECK_EQ(s.n, 0);
}

/* Many fds through one socket, in order, and nothing left open when it is dropped unread. */
static void test_channel(void)
{
        enum { N = 1200 };
        int p[2], *fds = calloc(N, sizeof(int)), *back = NULL, ch = -1, base;
        size_t n = 0;

        if (!fds)
                return;
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        base = count_fds(0);
        /* every other fd the read end, else the write end: the order shows in which end comes back */
        for (int i = 0; i < N; i++)
                fds[i] = p[i % 2];
        CHECK_RC(handover_channel_pack(fds, N, &ch), 0);
        CHECK_EQ(count_fds(0), base + 1);
        CHECK_RC(handover_channel_unpack(ch, &back, &n, NULL), 0);
        CHECK_EQ(n, N);
        for (size_t i = 0; back && i < n; i++) {
                int fl = fcntl(back[i], F_GETFL);
                CHECK_EQ(fl & O_ACCMODE, i % 2 ? O_WRONLY : O_RDONLY);
                CHECK(fcntl(back[i], F_GETFD) & FD_CLOEXEC);
                close(back[i]);
        }
        free(back);
        close(ch);
        /* dropped unread: the kernel lets go of what was in flight */
        CHECK_RC(handover_channel_pack(fds, N, &ch), 0);
        close(ch);
        CHECK_EQ(count_fds(0), base);
        close(p[0]);
        close(p[1]);
        free(fds);
}

/*
 * A reader whose fd table is full: the fds that did not fit read as -1 in their places, those after them
 * come where they belong, and the reader is told how many it lost (in a child, under a low RLIMIT_NOFILE).
 */
static void test_channel_full_table(void)
{
        enum { N = 600, ROOM = 200 };
        int p[2], fds[N], ch = -1, status = 0;
        pid_t pid;

        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        for (int i = 0; i < N; i++)
                fds[i] = p[i % 2];
        CHECK_RC(handover_channel_pack(fds, N, &ch), 0);
        pid = fork();
        if (pid == 0) {
                struct rlimit rl = {ROOM, ROOM};
                int *back = NULL, bad = 0;
                size_t n = 0, lost = 0, holes = 0;

                /* room for ROOM fds in all: the first message's 250 do not all fit */
                if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || handover_channel_unpack(ch, &back, &n, &lost) < 0)
                        _exit(2);
                for (size_t i = 0; i < n; i++) {
                        if (back[i] < 0) {
                                holes++;
                                continue;
                        }
                        /* an fd that came is the one sent in its place */
                        bad += (fcntl(back[i], F_GETFL) & O_ACCMODE) != (i % 2 ? O_WRONLY : O_RDONLY);
                        close(back[i]);
                }
                _exit(n == N && lost == holes && lost > 0 && lost < N && bad == 0 ? 0 : 1);
        }
        CHECK(pid > 0);
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(ch);
        close(p[0]);
        close(p[1]);
}

/*
 * The store protocol: each fd in a datagram of its own with FDSTORE=1 and its name; a service manager that
 * does not read (its queue full) makes the store give up with -ETIMEDOUT instead of holding the daemon.
 */
static void test_store(void)
{
        char dir[] = "/tmp/gm-store-XXXXXX", path[64], buf[256];
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        HandoverFds fds = {0};
        int rx, p[2], got = 0;

        if (!mkdtemp(dir))
                return;
        snprintf(path, sizeof(path), "%s/notify", dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        rx = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        CHECK_EQ(bind(rx, (struct sockaddr *)&sa, sizeof(sa)), 0);
        setenv("NOTIFY_SOCKET", path, 1);
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        CHECK_RC(handover_fds_add(&fds, "gm-one", dup(p[0])), 0);
        CHECK_RC(handover_fds_add_no_poll(&fds, "gm-two", dup(p[1])), 0);
        CHECK_RC(handover_store(&fds), 0);
        for (int i = 0; i < 2; i++) {
                union {
                        struct cmsghdr h;
                        char b[CMSG_SPACE(sizeof(int))];
                } ctl;
                struct iovec iov = {buf, sizeof(buf) - 1};
                struct msghdr mh = {
                        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof(ctl)};
                ssize_t n = recvmsg(rx, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL;
                if (n <= 0 || !c || c->cmsg_type != SCM_RIGHTS)
                        continue;
                buf[n] = '\0';
                CHECK_STR_CONTAINS(buf, "FDSTORE=1\nFDNAME=gm-");
                /* one that hangs up while stored is not to be polled, the other is */
                CHECK_EQ(strstr(buf, "FDPOLL=0") != NULL, strstr(buf, "gm-two") != NULL);
                {
                        int fd;
                        memcpy(&fd, CMSG_DATA(c), sizeof(int));
                        close(fd);
                }
                got++;
        }
        CHECK_EQ(got, 2);
        /* nobody reads now: the queue fills, and the store gives up */
        for (int i = 0; i < 300; i++) {
                char name[32];
                snprintf(name, sizeof(name), "gm-%d", i);
                if (handover_fds_add(&fds, name, dup(p[0])) < 0)
                        break;
        }
        CHECK_RC(handover_store(&fds), -ETIMEDOUT);
        unsetenv("NOTIFY_SOCKET");
        CHECK_RC(handover_store(&fds), -ENOTCONN);
        handover_fds_done(&fds);
        close(rx);
        close(p[0]);
        close(p[1]);
        unlink(path);
        rmdir(dir);
}

int main(int argc, char **argv)
{
        static const TestCase cases[] = {
                {"sealed state written and read back", test_roundtrip},
                {"the state format 1 revision 1 wrote is read", test_golden},
                {"the state format 1 revision 2 wrote is read", test_golden2},
                {"the state format 1 revision 3 wrote is read", test_golden3},
                {"the state format 1 revision 4 wrote is read", test_golden4},
                {"the state format 1 revision 5 wrote is read", test_golden5},
                {"unsealed, damaged, newer or formatless states are refused", test_refused},
                {"a newer revision's fields are skipped", test_newer_revision},
                {"named fds", test_fds},
                {"fds through the channel, in order", test_channel},
                {"a reader with a full fd table loses only what did not fit", test_channel_full_table},
                {"systemd's fd-store protocol, and a manager that does not read", test_store},
        };

        /* --print-golden [2|3|4|5]: the sample as this daemon writes it, to keep as a golden state when the
         * format moves on (the goldens above stay) */
        if (argc > 1 && strcmp(argv[1], "--print-golden") == 0) {
                Gpumemd__HandoverState st;
                Gpumemd__HandoverClient c, *cp[1];
                uint8_t *buf = NULL;
                size_t len = 0;
                Gpumemd__HandoverObject o, *op[1];
                uint32_t mapped[2];
                SampleVmm v;
                SampleImport vi;
                SampleShare vs;
                int rev = argc > 2 ? atoi(argv[2]) : 1;
                sample(&st, &c, cp);
                if (rev >= 2)
                        sample_objects(&st, &o, op, mapped);
                if (rev == 3)
                        sample_vmm(&st, &v);
                if (rev == 4)
                        sample_import(&st, &vi);
                if (rev >= 5)
                        sample_share(&st, &vs);
                if (handover_state_pack(&st, &buf, &len) < 0)
                        return EXIT_FAILURE;
                for (size_t i = 0; i < len; i++)
                        printf("%02x", buf[i]);
                printf("\n");
                free(buf);
                return EXIT_SUCCESS;
        }
        return run_tests(cases, ARRAY_SIZE(cases));
}
