/* libgpumem_client's backend rows: the default one (the daemon maps memory itself) and the lookup by name. */
#include "client-backend.h"

#include <string.h>

#include "macro.h"

/*
 * The default row: the daemon's mappings are this process's own (backends "kfd" and "model"), the pointers
 * the caller holds are the daemon's VAs, and there is nothing to take in, set or let go of here.
 */
static int none_open(gm_client *c)
{
        (void)c;
        return 0;
}

static void none_close(gm_client *c)
{
        (void)c;
}

static uint64_t none_to_va(const gm_client *c, uint64_t ptr)
{
        (void)c;
        return ptr;
}

static uint64_t none_to_ptr(const gm_client *c, uint64_t va)
{
        (void)c;
        return va;
}

static int none_map_new(gm_client *c, const GmBackendNew *n, GmBackendMem *ret)
{
        (void)c, (void)n, (void)ret;
        return 0;
}

static void none_unmap_alloc(gm_client *c, GmBackendMem *m, uint64_t va, uint64_t size)
{
        (void)c, (void)m, (void)va, (void)size;
}

static void none_release(gm_client *c, gm_handle handle)
{
        (void)c, (void)handle;
}

static int none_map(gm_client *c, uint64_t va, uint64_t size, uint64_t offset, gm_handle handle)
{
        (void)c, (void)va, (void)size, (void)offset, (void)handle;
        return 0;
}

static int none_unmap(gm_client *c, uint64_t va, uint64_t size)
{
        (void)c, (void)va, (void)size;
        return 0;
}

static int none_access(gm_client *c, const GmBackendMem *m, uint64_t va, uint64_t size, uint32_t gpu_id,
                       int access)
{
        (void)c, (void)m, (void)va, (void)size, (void)gpu_id, (void)access;
        return 0;
}

const GmBackend gm_backend_default = GM_BACKEND_ROW(NULL, none);

/* The backends whose memory this process takes in itself; any other name gets the default row. */
static const GmBackend *const rows[] = {&gm_backend_cuda};

const GmBackend *gm_backend_find(const char *name)
{
        for (size_t i = 0; i < ARRAY_SIZE(rows); i++)
                if (name && strcmp(rows[i]->name, name) == 0)
                        return rows[i];
        return &gm_backend_default;
}
