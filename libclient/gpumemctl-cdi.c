/* gpumemctl cdi: a Container Device Interface spec that gives containers the daemon's socket. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "gpumemctl.h"

/* CDI names start and end with a letter or digit; a kind is VENDOR/CLASS with VENDOR a DNS name. */
static bool cdi_name_ok(const char *s, size_t max, const char *inner)
{
        size_t n = strlen(s);

        if (n == 0 || n > max || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1]))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char)s[i]) && !strchr(inner, s[i]))
                        return false;
        return true;
}

static bool cdi_kind_ok(const char *kind)
{
        const char *slash = strchr(kind, '/');
        char vendor[254], label[64];
        const char *p;

        if (!slash || (size_t)(slash - kind) >= sizeof(vendor))
                return false;
        memcpy(vendor, kind, (size_t)(slash - kind));
        vendor[slash - kind] = '\0';
        if (!vendor[0] || !cdi_name_ok(slash + 1, 63, "-_"))
                return false;
        for (p = vendor; *p;) {
                size_t n = strcspn(p, ".");
                if (n == 0 || n >= sizeof(label))
                        return false;
                memcpy(label, p, n);
                label[n] = '\0';
                if (!cdi_name_ok(label, 63, "-"))
                        return false;
                p += n;
                if (*p == '.' && *++p == '\0')
                        return false;
        }
        return true;
}

static bool cdi_path_ok(const char *path)
{
        if (path[0] != '/' || strlen(path) >= 108)
                return false;
        for (const char *p = path; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == '=')
                        return false;
        return true;
}

/* Where this process loaded libprotobuf-c from: the library gpumem-kfd needs beside it in a container. */
static int find_protobuf_c(struct dl_phdr_info *info, size_t size, void *data)
{
        const char *base = strrchr(info->dlpi_name, '/');

        (void)size;
        if (base && strncmp(base + 1, "libprotobuf-c.so.", 17) == 0) {
                snprintf(data, PATH_MAX, "%s", info->dlpi_name);
                return 1;
        }
        return 0;
}

/* One bind mount of a file into the container. */
static void cdi_mount(json_object *mounts, const char *host, const char *inside, const char *const *opts)
{
        json_object *m = json_object_new_object(), *o;

        jstr(m, "hostPath", host);
        jstr(m, "containerPath", inside);
        jstr(m, "type", "bind");
        o = jarray(m, "options");
        for (size_t i = 0; opts[i]; i++)
                json_object_array_add(o, json_object_new_string(opts[i]));
        json_object_array_add(mounts, m);
}

#define CDI_ROCM_DIR "/opt/gpumemd/lib"

/*
 * A Container Device Interface spec for the socket: the container gets a bind mount of the socket and
 * GPUMEM_SOCKET, and no device node, since gpumemd alone opens /dev/kfd. With --rocm it also gets the
 * client-side KFD (libgpumem-kfd.so and the libprotobuf-c it needs, read-only, in /opt/gpumemd/lib) and
 * LD_PRELOAD naming it, so unmodified ROCm programs in it run through gpumemd. When the socket on the host
 * belongs to a group other than root's, the container's process gets that group too (additionalGids, CDI
 * 0.7.0), so that it may connect without --group-add; otherwise, or with --no-additional-gids (for runtimes
 * older than CDI 0.7.0, such as Debian 12's Podman 4.3), the spec is version 0.5.0, which covers everything
 * else used here (env, mount type and options).
 */
int cmd_cdi(Ctl *ctl, int argc, char **argv)
{
        const char *kind = "gpumem.io/socket", *name = "default";
        const char *host = ctl->socket ? ctl->socket : GM_DEFAULT_SOCKET, *inside = NULL;
        const char *kfd_lib = GPUMEMD_KFD_LIBRARY;
        static const char *const sock_opts[] = {"bind", "nosuid", "nodev", "noexec", NULL};
        static const char *const lib_opts[] = {"bind", "ro", "nosuid", "nodev", NULL};
        char env[160], pbc[PATH_MAX] = "", in_pbc[PATH_MAX];
        bool rocm = false, gids = true;
        struct stat st;

        for (int i = 1; i < argc; i++) {
                static const char *const opts[] = {"--kind", "--name", "--socket-path", "--container-path",
                                                   "--kfd-library"};
                const char **dst[] = {&kind, &name, &host, &inside, &kfd_lib};
                size_t k, len = 0;

                if (strcmp(argv[i], "--rocm") == 0) {
                        rocm = true;
                        continue;
                }
                if (strcmp(argv[i], "--no-additional-gids") == 0) {
                        gids = false;
                        continue;
                }

                for (k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
                        len = strlen(opts[k]);
                        if (strncmp(argv[i], opts[k], len) == 0 &&
                            (argv[i][len] == '\0' || argv[i][len] == '='))
                                break;
                }
                if (k == sizeof(opts) / sizeof(opts[0])) {
                        return usage_error("cdi: unknown argument '%s'", argv[i]);
                }
                if (argv[i][len] == '=')
                        *dst[k] = argv[i] + len + 1;
                else if (i + 1 < argc)
                        *dst[k] = argv[++i];
                else {
                        return usage_error("cdi: %s needs a value", opts[k]);
                }
        }
        if (!inside)
                inside = host;
        if (!cdi_kind_ok(kind)) {
                return usage_error("cdi: '%s' is not a CDI kind (vendor.example/class)", kind);
        }
        if (!cdi_name_ok(name, 63, "-_.:")) {
                return usage_error("cdi: '%s' is not a CDI device name", name);
        }
        if (!cdi_path_ok(host) || !cdi_path_ok(inside)) {
                return usage_error("cdi: socket paths must be absolute, shorter than 108 bytes and free of "
                                   "control characters and '='");
        }
        if (rocm) {
                if (!cdi_path_ok(kfd_lib) || access(kfd_lib, R_OK) < 0)
                        return command_error(-ENOENT, "cdi", "no client-side KFD at %s (--kfd-library PATH)",
                                             kfd_lib);
                dl_iterate_phdr(find_protobuf_c, pbc);
                if (!pbc[0] || !cdi_path_ok(pbc))
                        return command_error(-ENOENT, "cdi", "cannot tell where libprotobuf-c is");
                snprintf(in_pbc, sizeof(in_pbc), "%s/%s", CDI_ROCM_DIR, strrchr(pbc, '/') + 1);
        }
        /* the socket's group, if it is there already and is not root's */
        gids = gids && stat(host, &st) == 0 && st.st_gid != 0;
        {
                json_object *spec = json_object_new_object(), *devs, *dev = json_object_new_object();
                json_object *edits = json_object_new_object(), *envs, *mounts;

                jstr(spec, "cdiVersion", gids ? "0.7.0" : "0.5.0");
                jstr(spec, "kind", kind);
                devs = jarray(spec, "devices");
                jstr(dev, "name", name);
                envs = jarray(edits, "env");
                snprintf(env, sizeof(env), "GPUMEM_SOCKET=%s", inside);
                json_object_array_add(envs, json_object_new_string(env));
                if (rocm)
                        json_object_array_add(
                                envs, json_object_new_string("LD_PRELOAD=" CDI_ROCM_DIR "/libgpumem-kfd.so"));
                if (gids)
                        json_object_array_add(jarray(edits, "additionalGids"),
                                              json_object_new_uint64(st.st_gid));
                mounts = jarray(edits, "mounts");
                cdi_mount(mounts, host, inside, sock_opts);
                if (rocm) {
                        cdi_mount(mounts, kfd_lib, CDI_ROCM_DIR "/libgpumem-kfd.so", lib_opts);
                        cdi_mount(mounts, pbc, in_pbc, lib_opts);
                }
                json_object_object_add(dev, "containerEdits", edits);
                json_object_array_add(devs, dev);
                /* a document people read and keep in /etc/cdi: indented */
                jprint(spec, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED);
        }
        return EXIT_SUCCESS;
}
