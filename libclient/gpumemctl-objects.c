/* gpumemctl's commands on what the clients hold: allocations, named shares, quotas. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumemctl.h"

static const char *const kind_names[] = {
        [GM_KIND_DEVICE] = "device", [GM_KIND_HOST] = "host",     [GM_KIND_MANAGED] = "managed",
        [GM_KIND_VMM] = "vmm",       [GM_KIND_IMPORT] = "import", [GM_KIND_SHARE] = "share",
};

static const char *kind_name(int kind)
{
        return kind >= 0 && (size_t)kind < ARRAY_SIZE(kind_names) && kind_names[kind] ? kind_names[kind]
                                                                                      : "reserved";
}

static int parse_u64(const char *s, uint64_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 0);
        if (errno || *end || !*s || *s == '-')
                return -EINVAL;
        *ret = v;
        return 0;
}

static const char allocation_columns[] =
        "CLIENT:6r HANDLE:18 KIND:7 SIZE:10r GPU:6r VA:18 EXPORTS:7r MAPPED_ON:0.2w";

int cmd_allocations(Ctl *ctl, int argc, char **argv)
{
        uint64_t client = 0, cursor = 0, total = 0;
        json_object *doc = NULL, *list = NULL;
        Table tb = {0};
        char b1[32];
        int r;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--client") == 0 && i + 1 < argc) {
                        if (parse_u64(argv[++i], &client) < 0 || client == 0) {
                                return usage_error("allocations: '%s' is not a client id", argv[i]);
                        }
                } else {
                        return usage_error("usage: allocations [--client ID]");
                }
        }
        if (ctl->json) {
                doc = jdoc();
                list = jarray(doc, "allocations");
        } else if ((r = table_new(ctl, &tb, "allocations", allocation_columns))) {
                return r;
        }
        do {
                gm_alloc_info *a = NULL;
                size_t n = 0;
                r = gm_admin_allocations(ctl->c, client, 0, &cursor, &a, &n);
                if (r < 0) {
                        json_object_put(doc);
                        scols_unref_table(tb.tb);
                        return fail(ctl, "allocations", r);
                }
                for (size_t i = 0; i < n; i++, total++) {
                        if (ctl->json) {
                                json_object *o = json_object_new_object(), *m;
                                char h[24];
                                snprintf(h, sizeof(h), "0x%016" PRIx64, a[i].id);
                                ju64(o, "client_id", a[i].client_id);
                                jstr(o, "handle", h);
                                jstr(o, "kind", kind_name(a[i].kind));
                                ju64(o, "size", a[i].size);
                                ju64(o, "gpu_id", a[i].gpu_id);
                                ju64(o, "va", a[i].va);
                                ju64(o, "exports", a[i].exports);
                                m = jarray(o, "mapped_gpus");
                                for (size_t k = 0; k < a[i].n_mapped_gpus; k++)
                                        json_object_array_add(m, json_object_new_uint64(a[i].mapped_gpus[k]));
                                json_object_array_add(list, o);
                        } else {
                                char on[512] = "";
                                size_t off = 0;
                                for (size_t k = 0; k < a[i].n_mapped_gpus && off < sizeof(on); k++)
                                        off += (size_t)snprintf(on + off, sizeof(on) - off, "%s%u",
                                                                k ? "," : "", a[i].mapped_gpus[k]);
                                table_row(&tb);
                                table_cell(&tb, "CLIENT", "%" PRIu64, a[i].client_id);
                                table_cell(&tb, "HANDLE", "0x%016" PRIx64, a[i].id);
                                table_cell(&tb, "KIND", "%s", kind_name(a[i].kind));
                                table_cell(&tb, "SIZE", "%s", human_bytes(a[i].size, b1, sizeof(b1)));
                                if (a[i].gpu_id)
                                        table_cell(&tb, "GPU", "%u", a[i].gpu_id);
                                if (a[i].va)
                                        table_cell(&tb, "VA", "0x%" PRIx64, a[i].va);
                                table_cell(&tb, "EXPORTS", "%u", a[i].exports);
                                table_cell(&tb, "MAPPED_ON", "%s", on);
                        }
                }
                gm_alloc_info_free(a, n);
        } while (cursor);
        if (ctl->json) {
                jprint(doc, JSON_C_TO_STRING_PLAIN);
                return EXIT_SUCCESS;
        }
        r = table_print(&tb);
        /* the count is for people: a script asked for the rows alone (-n) gets only them */
        if (!r && !ctl->noheadings && !ctl->raw)
                printf("%" PRIu64 " object%s\n", total, total == 1 ? "" : "s");
        return r;
}

static const char share_columns[] = "NAME:0.3t OWNER:6r CLASS:0.1t KIND:6 SIZE:10r ROLE:10 READERS:7r AGE:8r "
                                    "| PERSISTENT:3 GPU:6r VA:18 OPENS:6r PUBLISHED:20";

static void share_json(json_object *j, const void *item)
{
        const gm_share_info *s = item;

        J_STR(name);
        J_U64(owner_client_id);
        jstr(j, "class", s->owner_class);
        jstr(j, "kind", kind_name(s->kind));
        J_U64(size), J_U64(gpu_id);
        ju64(j, "va", (uint64_t)(uintptr_t)s->ptr);
        jstr(j, "role", s->read_only ? "read-only" : "read-write");
        jbool(j, "persistent", s->persistent);
        J_U64(readers), J_U64(opens), J_U64(published_usec);
}

static int print_shares(Ctl *ctl, const gm_share_info *sh, size_t n)
{
        Table tb;
        int r = table_new(ctl, &tb, "shared", share_columns);

        if (r)
                return r;
        for (size_t i = 0; i < n; i++) {
                char b[32], age[32], when[32];
                fmt_age(sh[i].published_usec, age, sizeof(age));
                fmt_time(sh[i].published_usec, when, sizeof(when));
                table_row(&tb);
                table_cell(&tb, "NAME", "%s", sh[i].name);
                if (sh[i].owner_client_id)
                        table_cell(&tb, "OWNER", "%" PRIu64, sh[i].owner_client_id);
                table_cell(&tb, "CLASS", "%s", sh[i].owner_class);
                table_cell(&tb, "KIND", "%s", kind_name(sh[i].kind));
                table_cell(&tb, "SIZE", "%s", human_bytes(sh[i].size, b, sizeof(b)));
                table_cell(&tb, "ROLE", "%s", sh[i].read_only ? "read-only" : "read-write");
                table_cell(&tb, "READERS", "%u", sh[i].readers);
                table_cell(&tb, "AGE", "%s", age);
                table_cell(&tb, "PERSISTENT", "%s", sh[i].persistent ? "yes" : "no");
                if (sh[i].gpu_id)
                        table_cell(&tb, "GPU", "%u", sh[i].gpu_id);
                table_cell(&tb, "VA", "%p", sh[i].ptr);
                table_cell(&tb, "OPENS", "%" PRIu64, sh[i].opens);
                table_cell(&tb, "PUBLISHED", "%s", when);
        }
        return table_print(&tb);
}

static int shared_list(Ctl *ctl)
{
        gm_share_info *sh = NULL;
        size_t n = 0;
        int r = gm_admin_shares(ctl->c, &sh, &n);

        if (r < 0)
                return fail(ctl, "shared", r);
        r = ctl->json ? jlist("shares", sh, n, sizeof(*sh), share_json) : print_shares(ctl, sh, n);
        free(sh);
        return r;
}

int cmd_shared(Ctl *ctl, int argc, char **argv)
{
        int r;

        if (argc == 1 || (argc == 2 && strcmp(argv[1], "list") == 0))
                return shared_list(ctl);
        if (argc != 3 || strcmp(argv[1], "revoke") != 0)
                return usage_error("usage: shared [list] | shared revoke NAME");
        r = gm_share_revoke(ctl->c, argv[2]);
        if (r < 0)
                return fail(ctl, "shared revoke", r);
        return print_done(ctl, "revoked", json_object_new_string(argv[2]), "share '%s' revoked\n", argv[2]);
}

static const char *const resource_names[] = {
        [GM_RESOURCE_VRAM] = "vram",         [GM_RESOURCE_HOST] = "host",
        [GM_RESOURCE_MANAGED] = "managed",   [GM_RESOURCE_HANDLES] = "handles",
        [GM_RESOURCE_FDS] = "fds",           [GM_RESOURCE_CONNECTIONS] = "connections",
        [GM_RESOURCE_INFLIGHT] = "inflight", [GM_RESOURCE_WINDOWS] = "windows",
        [GM_RESOURCE_QUEUES] = "queues",     [GM_RESOURCE_MAPPINGS] = "mappings",
        [GM_RESOURCE_SHARES] = "shares",
};

static const char *resource_name(int r)
{
        return r > 0 && r < (int)ARRAY_SIZE(resource_names) ? resource_names[r] : "unknown";
}

static bool resource_is_bytes(int r)
{
        return r == GM_RESOURCE_VRAM || r == GM_RESOURCE_HOST || r == GM_RESOURCE_MANAGED;
}

static int parse_limit(const char *s, bool bytes, uint64_t *ret)
{
        char *end;
        unsigned long long v;
        unsigned shift = 0;

        if (strcmp(s, "unlimited") == 0) {
                *ret = GM_UNLIMITED;
                return 0;
        }
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || end == s || *s == '-')
                return -EINVAL;
        if (*end && bytes) {
                const char *u = "KMGT";
                const char *p = strchr(u, toupper((unsigned char)*end));
                if (!p || !*end)
                        return -EINVAL;
                shift = 10 * (unsigned)(p - u + 1);
                end++;
                if (*end == 'i')
                        end++;
                if (*end == 'B')
                        end++;
        }
        if (*end || (shift && v > (UINT64_MAX >> shift)))
                return -EINVAL;
        *ret = (uint64_t)v << shift;
        return 0;
}

static const char *limit_text(uint64_t v, bool bytes, char *buf, size_t len)
{
        if (v == GM_UNLIMITED)
                return "unlimited";
        if (bytes)
                return human_bytes(v, buf, len);
        snprintf(buf, len, "%" PRIu64, v);
        return buf;
}

static const char quota_columns[] = "CLASS:0.15t RESOURCE:11 GPU:6r USED:10r LIMIT:10r";

static int print_quotas(Ctl *ctl, const gm_quota *q, size_t n)
{
        Table tb;
        char b[32];
        int r = table_new(ctl, &tb, "quota show", quota_columns);

        if (r)
                return r;
        for (size_t i = 0; i < n; i++) {
                bool bytes = resource_is_bytes(q[i].resource);
                /* per-GPU rows only where a per-GPU limit or use exists */
                if (q[i].gpu_id && q[i].limit == GM_UNLIMITED && q[i].used == 0)
                        continue;
                table_row(&tb);
                table_cell(&tb, "CLASS", "%s", q[i].class_name);
                table_cell(&tb, "RESOURCE", "%s", resource_name(q[i].resource));
                if (q[i].gpu_id)
                        table_cell(&tb, "GPU", "%u", q[i].gpu_id);
                else
                        table_cell(&tb, "GPU", "all");
                table_cell(&tb, "USED", "%s", limit_text(q[i].used, bytes, b, sizeof(b)));
                table_cell(&tb, "LIMIT", "%s", limit_text(q[i].limit, bytes, b, sizeof(b)));
        }
        return table_print(&tb);
}

static void quota_json(json_object *j, const void *item)
{
        const gm_quota *s = item;

        jstr(j, "class", s->class_name);
        jstr(j, "resource", resource_name(s->resource));
        J_U64(gpu_id), J_U64(used);
        jlimit(j, "limit", s->limit);
}

int cmd_quota(Ctl *ctl, int argc, char **argv)
{
        int r;

        if (argc >= 2 && strcmp(argv[1], "show") == 0) {
                gm_quota *q = NULL;
                size_t n = 0;
                if (argc > 3) {
                        return usage_error("usage: quota show [CLASS]");
                }
                r = gm_admin_quota_get(ctl->c, argc == 3 ? argv[2] : NULL, &q, &n);
                if (r < 0)
                        return fail(ctl, "quota show", r);
                r = ctl->json ? jlist("quotas", q, n, sizeof(*q), quota_json) : print_quotas(ctl, q, n);
                gm_quota_free(q, n);
                return r;
        }
        if (argc >= 5 && strcmp(argv[1], "set") == 0) {
                const char *cls = argv[2];
                int res = 0;
                uint64_t limit = 0, gpu = 0;
                bool force = false;
                for (int i = 1; i < (int)ARRAY_SIZE(resource_names); i++)
                        if (strcmp(argv[3], resource_names[i]) == 0)
                                res = i;
                if (!res) {
                        return usage_error(
                                "quota set: unknown resource '%s' (vram, host, managed, handles, fds, "
                                "connections, inflight, windows, queues, mappings, shares)",
                                argv[3]);
                }
                if (parse_limit(argv[4], resource_is_bytes(res), &limit) < 0) {
                        return usage_error("quota set: '%s' is not a limit (a number%s, or 'unlimited')",
                                           argv[4], resource_is_bytes(res) ? " with K, M, G or T" : "");
                }
                for (int i = 5; i < argc; i++) {
                        if (strcmp(argv[i], "--force") == 0) {
                                force = true;
                        } else if (strcmp(argv[i], "--gpu") == 0 && i + 1 < argc) {
                                if (parse_u64(argv[++i], &gpu) < 0 || gpu == 0 || gpu > UINT32_MAX) {
                                        return usage_error("quota set: '%s' is not a GPU id", argv[i]);
                                }
                        } else {
                                return usage_error("quota set: unknown argument '%s'", argv[i]);
                        }
                }
                r = gm_admin_quota_set(ctl->c, cls, res, (uint32_t)gpu, limit, force);
                if (r < 0)
                        return fail(ctl, "quota set", r);
                if (ctl->json) {
                        json_object *o = jdoc();
                        jstr(o, "class", cls);
                        jstr(o, "resource", resource_names[res]);
                        ju64(o, "gpu_id", gpu);
                        jlimit(o, "limit", limit);
                        jprint(o, JSON_C_TO_STRING_PLAIN);
                } else
                        printf("class %s: %s%s limit set\n", cls, resource_names[res], gpu ? " per-GPU" : "");
                return EXIT_SUCCESS;
        }
        return usage_error("usage: quota show [CLASS] | quota set CLASS RESOURCE LIMIT [--gpu ID] [--force]");
}
