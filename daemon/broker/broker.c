/* The broker itself: the driver's GPUs in the broker's order, its start and end, every client's totals. */
#include "broker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>

#include "broker-private.h"

/* The GPUs @o's memory is mapped on, appended to @ids (room for BROKER_MAX_GPUS), in the broker's order
 * (the driver's, of which the broker keeps the first BROKER_MAX_GPUS). */
void broker_mapped_gpus_into(const Broker *b, const Obj *o, uint32_t *ids, size_t *n)
{
        uint64_t mask = o->mem ? driver_mem_mapped_mask(b->drv, o->mem) : 0;

        for (size_t g = 0; mask && g < b->n_gpus; g++, mask >>= 1)
                if (mask & 1)
                        ids[(*n)++] = b->gpu_ids[g];
}

int broker_gpu_index(const Broker *b, uint32_t gpu_id)
{
        for (size_t i = 0; i < b->n_gpus; i++)
                if (b->gpu_ids[i] == gpu_id)
                        return (int)i;
        return -1;
}

size_t broker_gpu_count(const Broker *b)
{
        return b->n_gpus;
}

uint32_t broker_gpu_id(const Broker *b, size_t index)
{
        return index < b->n_gpus ? b->gpu_ids[index] : 0;
}

const char *broker_human(uint64_t v, char *buf, size_t len)
{
        if (v >= (1ull << 30) && v % (1ull << 30) == 0)
                snprintf(buf, len, "%llu GiB", (unsigned long long)(v >> 30));
        else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
                snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
        else if (v >= (1ull << 10) && v % (1ull << 10) == 0)
                snprintf(buf, len, "%llu KiB", (unsigned long long)(v >> 10));
        else
                snprintf(buf, len, "%llu bytes", (unsigned long long)v);
        return buf;
}

int broker_new(Driver *drv, Broker **ret)
{
        Broker *b = calloc(1, sizeof(*b));

        if (!b)
                return -ENOMEM;
        b->notify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (b->notify_fd < 0) {
                int r = -errno;
                free(b);
                return r;
        }
        pthread_mutex_init(&b->lock, NULL);
        b->max_mappings = b->max_mappings_uid = b->max_host_uid = UINT64_MAX;
        b->max_listeners_uid = UINT32_MAX;
        pthread_mutex_init(&b->share_lock, NULL);
        pthread_mutex_init(&b->sharers_lock, NULL);
        pthread_mutex_init(&b->primary_listen_lock, NULL);
        b->drv = drv;
        b->primary = driver_ctx_primary(drv);
        b->n_gpus = driver_gpu_count(drv);
        if (b->n_gpus > BROKER_MAX_GPUS)
                b->n_gpus = BROKER_MAX_GPUS;
        for (size_t i = 0; i < b->n_gpus; i++) {
                DriverGpu g = {0};
                (void)driver_gpu(drv, i, &g);
                b->gpu_ids[i] = g.gpu_id;
                b->gpu_vram[i] = g.vram_bytes;
                b->gpu_numa[i] = g.numa_node;
                if (g.alloc_granularity > b->dev_gran)
                        b->dev_gran = g.alloc_granularity;
        }
        if (b->dev_gran < BROKER_PAGE_SIZE || (b->dev_gran & (b->dev_gran - 1)))
                b->dev_gran = BROKER_PAGE_SIZE;
        b->totals.n_gpus = (uint32_t)b->n_gpus;
        memcpy(b->totals.gpu_ids, b->gpu_ids, sizeof(b->gpu_ids));
        *ret = b;
        return 0;
}

Broker *broker_free(Broker *b)
{
        size_t it = 0;
        Linger *l;

        if (!b)
                return NULL;
        /* the accounts are gone already: nothing is refunded, only freed */
        while (hashmap_next(&b->lingering, &it, NULL, (void **)&l))
                while (l) {
                        Linger *next = l->next;
                        free(l);
                        l = next;
                }
        broker_shares_done(b);
        /* every client left the primary context's listeners: the broker stops hearing it */
        if (b->primary_heard)
                (void)driver_ctx_set_interrupt(b->drv, b->primary, NULL, NULL);
        pthread_mutex_destroy(&b->sharers_lock);
        pthread_mutex_destroy(&b->primary_listen_lock);
        hashmap_done(&b->lingering);
        hashmap_done(&b->dead_files);
        hashmap_done(&b->files);
        safe_close(b->notify_fd);
        pthread_mutex_destroy(&b->lock);
        free(b);
        return NULL;
}

void broker_totals(Broker *b, BrokerUsage *ret)
{
        pthread_mutex_lock(&b->lock);
        *ret = b->totals;
        pthread_mutex_unlock(&b->lock);
}
