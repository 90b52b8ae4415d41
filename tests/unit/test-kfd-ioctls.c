/* The list of KFD and DRM ioctls (thunk/kfd-ioctls.h) against itself, the uapi's numbers and the KFD model.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../common/check.h"
#include "config.h"
#include "kfd-ioctls.h"
#include "model.h"
#include "topology.h"

typedef struct Entry {
        const char *name;
        unsigned long request;
        size_t size; /* sizeof its argument struct */
        int minor;
        unsigned int type; /* the driver's: AMDKFD_IOCTL_BASE or DRM_IOCTL_BASE */
} Entry;

#define KFD_ENTRY(name, req, args, minor) {#name, req, sizeof(args), minor, AMDKFD_IOCTL_BASE},
#define DRM_ENTRY(name, req, args, minor) {#name, req, sizeof(args), minor, DRM_IOCTL_BASE},

static const Entry entries[] = {THUNK_KFD_IOCTLS(KFD_ENTRY) THUNK_DRM_IOCTLS(DRM_ENTRY)};

/* Each row on its own: its driver's type, its struct as large as the request says, a name that finds it. */
static void test_rows(void)
{
        for (size_t i = 0; i < ARRAY_SIZE(entries); i++) {
                const Entry *e = &entries[i];

                if (_IOC_TYPE(e->request) != e->type)
                        check_failed(__FILE__, __LINE__, "%s: type 0x%x, not its driver's 0x%x", e->name,
                                     (unsigned int)_IOC_TYPE(e->request), e->type);
                if (_IOC_SIZE(e->request) != e->size)
                        check_failed(__FILE__, __LINE__, "%s: _IOC_SIZE %u, but its struct has %zu bytes",
                                     e->name, (unsigned int)_IOC_SIZE(e->request), e->size);
                /* a request that carries no struct moves nothing, and one that does moves it */
                if ((_IOC_DIR(e->request) == _IOC_NONE) != (e->size == 0))
                        check_failed(__FILE__, __LINE__, "%s: direction %u for a struct of %zu bytes",
                                     e->name, (unsigned int)_IOC_DIR(e->request), e->size);
                if (!thunk_ioctl_name(e->request) || strcmp(thunk_ioctl_name(e->request), e->name) != 0)
                        check_failed(__FILE__, __LINE__, "%s: its request is named %s", e->name,
                                     thunk_ioctl_name(e->request) ? thunk_ioctl_name(e->request) : "(none)");
                if (thunk_ioctl_request(e->name) != e->request)
                        check_failed(__FILE__, __LINE__, "%s: its name finds 0x%lx", e->name,
                                     thunk_ioctl_request(e->name));
                if (e->type == AMDKFD_IOCTL_BASE && thunk_kfd_ioctl_minor(_IOC_NR(e->request)) != e->minor)
                        check_failed(__FILE__, __LINE__, "%s: minor %d, its number says %d", e->name,
                                     e->minor, thunk_kfd_ioctl_minor(_IOC_NR(e->request)));
        }
}

/* The rows together: one number and one name each, the KFD's a table without a hole, as the kernel's. */
static void test_unique(void)
{
        unsigned int kfd_next = AMDKFD_COMMAND_START;
        int last_minor = 0;

        for (size_t i = 0; i < ARRAY_SIZE(entries); i++) {
                const Entry *e = &entries[i];

                for (size_t j = 0; j < i; j++) {
                        if (entries[j].type == e->type && _IOC_NR(entries[j].request) == _IOC_NR(e->request))
                                check_failed(__FILE__, __LINE__, "%s and %s: both number 0x%02x",
                                             entries[j].name, e->name, (unsigned int)_IOC_NR(e->request));
                        if (strcasecmp(entries[j].name, e->name) == 0)
                                check_failed(__FILE__, __LINE__, "%s: listed twice", e->name);
                }
                if (e->type != AMDKFD_IOCTL_BASE)
                        continue;
                if (_IOC_NR(e->request) != kfd_next)
                        check_failed(__FILE__, __LINE__, "%s: number 0x%02x where 0x%02x comes next", e->name,
                                     (unsigned int)_IOC_NR(e->request), kfd_next);
                /* a later ABI only adds numbers at the end */
                if (e->minor < last_minor)
                        check_failed(__FILE__, __LINE__, "%s: minor %d after one of %d", e->name, e->minor,
                                     last_minor);
                kfd_next = _IOC_NR(e->request) + 1;
                last_minor = e->minor;
        }
        CHECK(thunk_ioctl_name(_IOC(_IOC_READ, AMDKFD_IOCTL_BASE, 0x60, 8)) == NULL);
        CHECK(thunk_ioctl_name(_IOC(_IOC_READ, 'x', 0x01, 8)) == NULL);
        CHECK_EQ(thunk_ioctl_request("no_such_ioctl"), 0);
        CHECK_EQ(thunk_ioctl_request("gem_va"), 0); /* only by its whole name */
        CHECK_EQ(thunk_ioctl_request("amdgpu_gem_va"), DRM_IOCTL_AMDGPU_GEM_VA);
}

/* The end of the KFD's table at each minor, as the headers of those minors say it (AMDKFD_COMMAND_END). */
static void test_table_end(void)
{
        CHECK_EQ(thunk_kfd_command_end(KFD_IOCTL_MINOR_VERSION), AMDKFD_COMMAND_END);
        CHECK_EQ(thunk_kfd_command_end(11), 0x24);
        CHECK_EQ(thunk_kfd_command_end(10), 0x24); /* older: the 1.11 table, not an empty one */
        CHECK_EQ(thunk_kfd_command_end(12), 0x25);
        for (uint32_t minor = 13; minor < 19; minor++)
                CHECK_EQ(thunk_kfd_command_end(minor), 0x27);
        CHECK_EQ(thunk_kfd_command_end(19), 0x28);
}

/*
 * The model at each ABI it runs: every KFD ioctl the ABI has, it serves or says it refuses (-EOPNOTSUPP),
 * never takes for an unknown number (-ENOTTY), which the ones of later ABIs are. A served one is asked
 * without its struct, so that it stops before its handler with -EFAULT (one without a struct runs).
 */
static void test_model(void)
{
        char err[256] = "";
        ThunkTopology *topo = NULL;
        unsigned int served = 0, refused = 0;

        ASSERT_RC(thunk_topology_load(GPUMEMD_SOURCE_PRESETDIR "/gfx908", &topo, err, sizeof(err)), 0);
        for (uint32_t minor = THUNK_MODEL_KFD_MINOR_MIN; minor <= THUNK_MODEL_KFD_MINOR_MAX; minor++) {
                ThunkModelOptions o = {.kfd_minor = minor};
                ThunkModel *m = NULL;

                ASSERT_RC(thunk_model_new(topo, &o, &m), 0);
                for (size_t i = 0; i < ARRAY_SIZE(entries); i++) {
                        const Entry *e = &entries[i];
                        int fd = -1, r;

                        if (e->type != AMDKFD_IOCTL_BASE)
                                continue;
                        ASSERT_RC(thunk_model_open_kfd(m, &fd), 0);
                        r = thunk_model_ioctl(m, fd, e->request, NULL);
                        ASSERT_RC(thunk_model_close(m, fd), 0);
                        if (e->minor > (int)minor) {
                                if (r != -ENOTTY)
                                        check_failed(__FILE__, __LINE__, "%s at 1.%u, before its 1.%d: %d",
                                                     e->name, minor, e->minor, r);
                        } else if (r == -EOPNOTSUPP) {
                                refused += minor == THUNK_MODEL_KFD_MINOR_MAX;
                        } else if (r == -EFAULT || (r == 0 && e->size == 0)) {
                                served += minor == THUNK_MODEL_KFD_MINOR_MAX;
                        } else {
                                check_failed(__FILE__, __LINE__, "%s at 1.%u: the model answers %d (%s)",
                                             e->name, minor, r, strerror(-r));
                        }
                }
                thunk_model_free(m);
        }
        thunk_topology_free(topo);
        printf("  the model at 1.%u: %u KFD ioctls served, %u refused\n", THUNK_MODEL_KFD_MINOR_MAX, served,
               refused);
}

int main(void)
{
        static const TestCase cases[] = {
                {"each row: its driver, its struct's size, its name", test_rows},
                {"one number and one name each, the KFD's table without a hole", test_unique},
                {"the end of the KFD's table at each ABI minor", test_table_end},
                {"the model serves or refuses every KFD ioctl of its ABI", test_model},
        };
        return run_tests(cases, ARRAY_SIZE(cases));
}
