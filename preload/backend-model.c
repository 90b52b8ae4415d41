/* The in-process backend of the KFD interposition layer: a KFD model of a topology preset, in the process. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend.h"
#include "config.h"
#include "model.h"
#include "topology.h"

/* The process's one model (the layer starts the backend once); the model itself has no globals. */
static struct {
        char preset_dir[PATH_MAX];
        ThunkModel *model;
} mb;

static bool dir_exists(const char *p)
{
        struct stat st;

        return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* GPUMEM_MODEL_PRESET: a directory, or a preset's name (installed, else in the source tree). */
static void find_preset(void)
{
        const char *preset = getenv("GPUMEM_MODEL_PRESET");

        if (!preset || !*preset)
                preset = "gfx908";
        if (strchr(preset, '/')) {
                snprintf(mb.preset_dir, sizeof(mb.preset_dir), "%s", preset);
                return;
        }
        snprintf(mb.preset_dir, sizeof(mb.preset_dir), "%s/%s", GPUMEMD_PRESETDIR, preset);
        if (!dir_exists(mb.preset_dir))
                snprintf(mb.preset_dir, sizeof(mb.preset_dir), "%s/%s", GPUMEMD_SOURCE_PRESETDIR, preset);
}

static int m_start(const PreloadHost *host, ThunkSeam *ret_seam, char *topology_dir, size_t len, char *msg,
                   size_t msglen)
{
        ThunkTopology *topo = NULL;
        ThunkModelOptions o = {0};
        const char *v = getenv("GPUMEM_MODEL_KFD_MINOR");
        char err[256] = "";
        int r;

        (void)host;
        find_preset();
        if (v)
                o.kfd_minor = (uint32_t)strtoul(v, NULL, 10);
        v = getenv("GPUMEM_MODEL_DOORBELLS");
        o.doorbells = !v || strcmp(v, "0") != 0; /* as the hardware runs queues, unless asked not to */
        r = thunk_topology_load(mb.preset_dir, &topo, err, sizeof(err));
        if (r < 0) {
                snprintf(msg, msglen, "cannot load the topology preset %s: %s", mb.preset_dir, err);
                return r;
        }
        r = thunk_model_new(topo, &o, &mb.model);
        thunk_topology_free(topo);
        if (r < 0) {
                snprintf(msg, msglen, "cannot create the KFD model of %s: %s", mb.preset_dir, strerror(-r));
                return r;
        }
        /* the device calls are the model's own seam, as the thunk reaches it */
        thunk_model_seam(mb.model, ret_seam);
        snprintf(topology_dir, len, "%s", mb.preset_dir);
        snprintf(msg, msglen, "KFD model of %s", mb.preset_dir);
        return 0;
}

static int m_stats(char *buf, size_t len)
{
        ThunkModelStats s;
        uint64_t vram = 0;

        thunk_model_get_stats(mb.model, &s);
        for (uint32_t i = 0; i < s.n_gpus; i++)
                vram += s.vram_used[i];
        return snprintf(buf, len,
                        "contexts=%u kfd_fds=%u render_fds=%u render_files=%u mems=%llu bufs=%llu "
                        "imports=%llu mappings=%llu gem_handles=%llu svm_ranges=%llu system_used=%llu "
                        "ttm_used=%llu vram_used=%llu queues=%u events=%u",
                        s.contexts, s.kfd_fds, s.render_fds, s.render_files, (unsigned long long)s.mems,
                        (unsigned long long)s.bufs, (unsigned long long)s.imports,
                        (unsigned long long)s.mappings, (unsigned long long)s.gem_handles,
                        (unsigned long long)s.svm_ranges, (unsigned long long)s.system_used,
                        (unsigned long long)s.ttm_used, (unsigned long long)vram, s.queues, s.events);
}

const PreloadBackend preload_backend = {
        .log_name = "gpumem-preload",
        .env_prefix = "GPUMEM_MODEL_",
        .stats_tag = "gpumem-model-stats",
        /* the model's buffers (model-mem.c): what a kernel hands out as dmabufs */
        .dmabuf_memfds = (const char *const[]){"gpumem-bo", "gpumem-heap", NULL},
        .start = m_start,
        .stats = m_stats,
};
