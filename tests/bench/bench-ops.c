/* gpumem-bench: the broker operations it times, through libgpumem_client. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

int op_ping(Ops *o)
{
        return gm_ping(o->c);
}

static int op_topology(Ops *o)
{
        gm_topology *t = NULL;
        int r = gm_topology_get(o->c, false, &t);
        gm_topology_free(t);
        return r;
}

int op_alloc_free(Ops *o)
{
        void *p = NULL;
        int r = gm_malloc(o->c, 4 * KIB, o->gpu[0], 0, &p);
        return r < 0 ? r : gm_mem_free(o->c, p);
}

int op_map_unmap(Ops *o)
{
        int r = gm_mem_map_gpus(o->c, o->dev, &o->gpu[1], 1);
        return r < 0 ? r : gm_mem_unmap_gpus(o->c, o->dev, &o->gpu[1], 1);
}

static int op_vmm(Ops *o)
{
        gm_access_desc acc = {.gpu_id = o->gpu[0], .access = GM_ACCESS_READ_WRITE};
        gm_handle h = 0;
        void *va = NULL;
        int r;

        if ((r = gm_mem_address_reserve(o->c, 2 * MIB, 0, NULL, 0, &va)) < 0)
                return r;
        if ((r = gm_mem_create(o->c, 2 * MIB, o->gpu[0], 0, &h)) < 0 ||
            (r = gm_mem_map(o->c, va, 2 * MIB, 0, h)) < 0 ||
            (r = gm_mem_set_access(o->c, va, 2 * MIB, &acc, 1)) < 0 ||
            (r = gm_mem_unmap(o->c, va, 2 * MIB)) < 0 || (r = gm_mem_release(o->c, h)) < 0)
                return r;
        return gm_mem_address_free(o->c, va, 2 * MIB);
}

static int op_export(Ops *o)
{
        size_t size = 0;
        int fd = -1;
        int r = gm_mem_export(o->c, o->dev_handle, &fd, &size);
        if (r < 0)
                return r;
        close(fd);
        return 0;
}

static int op_svm_set(Ops *o)
{
        gm_svm_attr a = {GM_SVM_ATTR_PREFERRED_LOC, o->gpu[o->flip++ & 1]};
        return gm_svm_set_attributes(o->c, o->managed, o->managed_size, &a, 1);
}

static int op_svm_get(Ops *o)
{
        gm_svm_attr a[2] = {{GM_SVM_ATTR_PREFERRED_LOC, 0}, {GM_SVM_ATTR_ACCESS, o->gpu[0]}};
        return gm_svm_get_attributes(o->c, o->managed, o->managed_size, a, 2);
}

int op_pointer(Ops *o)
{
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        int r = gm_pointer_get_attributes(o->c, (char *)o->dev + 100, &pa);
        return r < 0 ? r : (pa.base == o->dev ? 0 : -EPROTO);
}

void measure_samples(OpFn fn, Ops *o, size_t iters, const char *name, uint64_t *s)
{
        size_t warm = iters / 10 + 1;

        for (size_t i = 0; i < warm + iters; i++) {
                uint64_t t0 = now_ns();
                int r = fn(o);
                uint64_t t1 = now_ns();
                if (r < 0)
                        die("%s failed: %s", name, strerror(-r));
                if (i >= warm)
                        s[i - warm] = t1 - t0;
        }
}

Lat measure_op(OpFn fn, Ops *o, size_t iters, const char *name)
{
        uint64_t *s = calloc(iters, sizeof(*s));
        Lat l;

        if (!s)
                die("out of memory");
        measure_samples(fn, o, iters, name, s);
        l = lat_of(s, iters);
        free(s);
        return l;
}

int ops_setup(Ops *o, const char *sock, const char *name)
{
        gm_topology *t = NULL;
        gm_pointer_attributes pa = {.struct_size = sizeof(pa)};
        size_t n = 0;
        int r;

        memset(o, 0, sizeof(*o));
        r = gm_client_connect(sock, name, &o->c);
        if (r < 0)
                return r;
        r = gm_topology_get(o->c, false, &t);
        if (r < 0)
                return r;
        for (size_t i = 0; i < t->n_nodes && n < 2; i++)
                if (t->nodes[i].is_gpu)
                        o->gpu[n++] = t->nodes[i].gpu_id;
        gm_topology_free(t);
        if (n == 0)
                return -ENODEV;
        if (n == 1)
                o->gpu[1] = o->gpu[0];
        if ((r = gm_malloc(o->c, 2 * MIB, o->gpu[0], 0, &o->dev)) < 0 ||
            (r = gm_pointer_get_attributes(o->c, o->dev, &pa)) < 0)
                return r;
        o->dev_handle = pa.handle;
        o->managed_size = 2 * MIB;
        return gm_malloc_managed(o->c, o->managed_size, 0, &o->managed);
}

void ops_done(Ops *o)
{
        gm_client_close(o->c);
        o->c = NULL;
}

const BrokerOp broker_ops[] = {
        {"ping", op_ping, 1, false, true, "small"},
        {"topology", op_topology, 1, false, false, "topology-size"},
        {"alloc+free (4 KiB device)", op_alloc_free, 2, false, false, "small"},
        {"map+unmap (second GPU)", op_map_unmap, 2, false, false, "small"},
        {"vmm sequence (7 ops)", op_vmm, 7, false, false, "small"},
        {"dmabuf export (+fd)", op_export, 1, true, false, "small"},
        {"svm set attributes", op_svm_set, 1, false, true, "small"},
        {"svm get attributes", op_svm_get, 1, false, true, "small"},
        {"pointer query", op_pointer, 1, false, true, "small"},
};
