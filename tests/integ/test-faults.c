/* Backend faults: a driver failure in the middle of any broker operation leaves nothing half-made behind and
 * reaches the client as the driver's errno. Faults are armed in the daemon's model through SIGUSR2 and
 * $GPUMEMD_MODEL_FAULTS_FILE. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"
#include "gpumem-client.h"
#include "harness.h"

#define MiB (1ull << 20)

static Daemon dmn;
static DaemonState base;
static char faults_path[160];
static uint32_t gpus[16];
static size_t n_gpus;

/* Arm @spec ("IOCTL NTH ERRNO" lines; "" clears) and wait until the daemon says it did. */
static int arm(const char *spec)
{
        FILE *f = fopen(faults_path, "we");
        if (!f)
                return -errno;
        fputs(spec, f);
        fclose(f);
        pthread_mutex_lock(&dmn.notify_lock);
        dmn.notify_log[0] = '\0';
        pthread_mutex_unlock(&dmn.notify_lock);
        kill(dmn.pid, SIGUSR2);
        return daemon_wait_notify(&dmn, "model faults armed", 5000);
}

/* @call, with @spec armed, fails with -@err, its reason names the driver, and the daemon holds what it held.
 */
#define FAULT(c, spec, err, call)                                                                            \
        do {                                                                                                 \
                DaemonState _s0, _s1;                                                                        \
                char _m[512];                                                                                \
                CHECK_EQ(daemon_state(&dmn, &_s0), 0);                                                       \
                CHECK_EQ(arm(spec), 0);                                                                      \
                int _r = (call);                                                                             \
                if (_r != -(err))                                                                            \
                        check_failed(__FILE__, __LINE__, "[%s] %s -> %d (%s), want %d", spec, #call, _r,     \
                                     gm_strerror(c, _r, _m, sizeof(_m)), -(err));                            \
                gm_strerror(c, _r, _m, sizeof(_m));                                                          \
                CHECK_STR_CONTAINS(_m, strerror(err));                                                       \
                CHECK_EQ(arm(""), 0);                                                                        \
                CHECK_EQ(daemon_state(&dmn, &_s1), 0);                                                       \
                if (!daemon_state_same_but(&_s0, &_s1,                                                       \
                                           DAEMON_STATE_CONTEXTS | DAEMON_STATE_QUEUES | DAEMON_STATE_FDS))  \
                        check_failed(__FILE__, __LINE__, "[%s] left something behind", spec);                \
        } while (0)

static void check_base(const char *what)
{
        CHECK_EQ(daemon_wait_base_after(&dmn, &base, what), 0);
}

static void test_alloc(void)
{
        gm_client *c = daemon_client(&dmn, "faults");
        void *p = NULL;

        if (!c)
                return;
        /* the client's own KFD context comes first: its creation failing leaves no context */
        FAULT(c, "create_process 1 5\n", EIO, gm_malloc(c, MiB, gpus[0], 0, &p));
        FAULT(c, "alloc_memory_of_gpu 1 5\n", EIO, gm_malloc(c, 2 * MiB, gpus[0], 0, &p));
        /* allocated, then the map fails: the allocation is freed again */
        FAULT(c, "map_memory_to_gpu 1 28\n", ENOSPC, gm_malloc(c, 2 * MiB, gpus[0], 0, &p));
        /* allocated and mapped, then the CPU export fails: unmapped and freed */
        FAULT(c, "export_dmabuf 1 16\n", EBUSY, gm_malloc(c, 2 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &p));
        /* host memory: pages made and populated, then registering them fails, or mapping them */
        FAULT(c, "alloc_memory_of_gpu 1 5\n", EIO, gm_host_malloc(c, 2 * MiB, 0, -1, 0, &p));
        FAULT(c, "map_memory_to_gpu 1 28\n", ENOSPC, gm_host_malloc(c, 2 * MiB, 0, -1, 0, &p));
        /* managed memory: the SVM range refused */
        FAULT(c, "svm 1 110\n", ETIMEDOUT, gm_malloc_managed(c, 2 * MiB, 0, &p));
        /* and after all of it, the same calls work */
        CHECK_EQ(gm_malloc(c, 2 * MiB, gpus[0], GM_MEM_HOST_VISIBLE, &p), 0);
        CHECK_EQ(gm_mem_free(c, p), 0);
        CHECK_EQ(gm_host_malloc(c, 2 * MiB, 0, -1, 0, &p), 0);
        CHECK_EQ(gm_mem_free(c, p), 0);
        gm_client_close(c);
        check_base("allocation faults");
}

static void test_existing(void)
{
        gm_client *c = daemon_client(&dmn, "faults");
        void *p = NULL, *m = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        gm_handle h = 0;
        int fd = -1;

        if (!c)
                return;
        CHECK_EQ(gm_malloc(c, 2 * MiB, gpus[0], 0, &p), 0);
        CHECK_EQ(gm_pointer_get_attributes(c, p, &pa), 0);
        /* mapping on more GPUs fails: still mapped on its own GPU only */
        if (n_gpus > 2)
                FAULT(c, "map_memory_to_gpu 1 5\n", EIO, gm_mem_map_gpus(c, p, &gpus[1], 2));
        CHECK_EQ(gm_pointer_get_attributes(c, p, &pa), 0);
        CHECK_EQ(pa.n_mapped_gpus, 1);
        /* export and import */
        FAULT(c, "export_dmabuf 1 16\n", EBUSY, gm_mem_export(c, pa.handle, &fd, NULL));
        CHECK_EQ(gm_mem_export(c, pa.handle, &fd, NULL), 0);
        FAULT(c, "import_dmabuf 1 5\n", EIO, gm_mem_import(c, fd, gpus[n_gpus - 1], &h, NULL));
        CHECK_EQ(gm_mem_import(c, fd, gpus[n_gpus - 1], &h, NULL), 0);
        CHECK_EQ(gm_mem_release(c, h), 0);
        close(fd);
        /* free: unmapping fails, and the allocation is still whole; the next free works */
        FAULT(c, "unmap_memory_from_gpu 1 5\n", EIO, gm_mem_free(c, p));
        CHECK_EQ(gm_pointer_get_attributes(c, p, &pa), 0);
        CHECK_EQ(gm_mem_free(c, p), 0);
        /* SVM attributes refused: the range keeps the ones it had */
        CHECK_EQ(gm_malloc_managed(c, 2 * MiB, 0, &m), 0);
        {
                gm_svm_attr a = {GM_SVM_ATTR_GRANULARITY, 3}, q = {GM_SVM_ATTR_GRANULARITY, 0};
                CHECK_EQ(gm_svm_set_attributes(c, m, 2 * MiB, &a, 1), 0);
                a.value = 5;
                FAULT(c, "svm 1 5\n", EIO, gm_svm_set_attributes(c, m, 2 * MiB, &a, 1));
                CHECK_EQ(gm_svm_get_attributes(c, m, 2 * MiB, &q, 1), 0);
                CHECK_EQ(q.value, 3);
        }
        CHECK_EQ(gm_mem_free(c, m), 0);
        gm_client_close(c);
        check_base("faults on existing objects");
}

static void test_vmm(void)
{
        gm_client *c = daemon_client(&dmn, "faults");
        void *res = NULL;
        gm_handle h = 0;
        int acc = -1;

        if (!c)
                return;
        FAULT(c, "alloc_memory_of_gpu 1 28\n", ENOSPC, gm_mem_create(c, 2 * MiB, gpus[0], 0, &h));
        CHECK_EQ(gm_mem_address_reserve(c, 4 * MiB, 0, NULL, 0, &res), 0);
        CHECK_EQ(gm_mem_create(c, 2 * MiB, gpus[0], 0, &h), 0);
        CHECK_EQ(gm_mem_map(c, res, 2 * MiB, 0, h), 0);
        if (n_gpus > 1) {
                /* the second GPU's grant fails: the first one's is taken back */
                gm_access_desc two[2] = {{gpus[0], GM_ACCESS_READ_WRITE}, {gpus[1], GM_ACCESS_READ_WRITE}};
                FAULT(c, "gem_va 2 5\n", EIO, gm_mem_set_access(c, res, 2 * MiB, two, 2));
                CHECK_EQ(gm_mem_get_access(c, res, gpus[0], &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_NONE);
        }
        {
                /* the CPU grant (an export) fails after the GPU grant: rolled back too */
                gm_access_desc rw[2] = {{gpus[0], GM_ACCESS_READ_WRITE},
                                        {GM_LOCATION_CPU, GM_ACCESS_READ_WRITE}};
                FAULT(c, "export_dmabuf 1 5\n", EIO, gm_mem_set_access(c, res, 2 * MiB, rw, 2));
                CHECK_EQ(gm_mem_get_access(c, res, gpus[0], &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_NONE);
                CHECK_EQ(gm_mem_get_access(c, res, GM_LOCATION_CPU, &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_NONE);
                CHECK_EQ(gm_mem_set_access(c, res, 2 * MiB, rw, 2), 0);
                memset(res, 0x5a, 4096);
        }
        {
                /* read-write to read: the old grant is dropped (the first GEM_VA), the new one fails (the
                 * second): the old one is put back */
                gm_access_desc ro = {gpus[0], GM_ACCESS_READ};
                FAULT(c, "gem_va 2 5\n", EIO, gm_mem_set_access(c, res, 2 * MiB, &ro, 1));
                CHECK_EQ(gm_mem_get_access(c, res, gpus[0], &acc), 0);
                CHECK_EQ(acc, GM_ACCESS_READ_WRITE);
        }
        CHECK_EQ(gm_mem_unmap(c, res, 2 * MiB), 0);
        CHECK_EQ(gm_mem_release(c, h), 0);
        CHECK_EQ(gm_mem_address_free(c, res, 4 * MiB), 0);
        gm_client_close(c);
        check_base("VMM faults");
}

static bool daemon_has_fault_hook(void)
{
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1 | grep -q GPUMEMD_MODEL_FAULTS_FILE", getenv("GPUMEMD"));
        return system(cmd) == 0;
}

int main(void)
{
        static const TestCase cases[] = {
                {"faults while allocating", test_alloc},
                {"faults on existing objects", test_existing},
                {"faults in VMM operations", test_vmm},
        };
        char dir[] = "/tmp/gpumemd-faults-XXXXXX";
        int r;

        if (!getenv("GPUMEMD") || !daemon_has_fault_hook()) {
                printf("SKIP: this gpumemd cannot arm model faults ($GPUMEMD_MODEL_FAULTS_FILE and "
                       "SIGUSR2)\n");
                return 77;
        }
        signal(SIGPIPE, SIG_IGN);
        if (!mkdtemp(dir))
                return EXIT_FAILURE;
        snprintf(faults_path, sizeof(faults_path), "%s/faults", dir);
        setenv("GPUMEMD_MODEL_FAULTS_FILE", faults_path, 1);
        r = daemon_setup(&dmn, "mi300x", "[daemon]\nlog-level = warning\n", NULL, gpus, ARRAY_SIZE(gpus));
        if (r < 0)
                return EXIT_FAILURE;
        n_gpus = (size_t)r;
        usleep(100000);
        CHECK_EQ(daemon_base_state(&dmn, &base), 0);
        base.fds = daemon_quiet_fd_count(&dmn);
        r = run_tests(cases, ARRAY_SIZE(cases));
        r = daemon_finish(&dmn, r);
        unlink(faults_path);
        rmdir(dir);
        return r;
}
