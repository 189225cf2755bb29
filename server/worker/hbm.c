/* HBM accounting. */
#include "hbm.h"

#define GIB_F (1024.0 * 1024.0 * 1024.0)

void hbm_init(hbm *h, uint64_t capacity)
{
    h->capacity = capacity;
    h->used = 0;
    h->peak = 0;
}

int hbm_alloc(hbm *h, uint64_t bytes, err *e)
{
    if (bytes > hbm_free_bytes(h))
        return err_set(e, CODE_RESOURCE_EXHAUSTED,
                       "attempting to reserve %.2f GiB of HBM with %.2f GiB free of %.2f GiB",
                       (double)bytes / GIB_F, (double)hbm_free_bytes(h) / GIB_F,
                       (double)h->capacity / GIB_F);
    h->used += bytes;
    if (h->used > h->peak)
        h->peak = h->used;
    return CODE_OK;
}

void hbm_release(hbm *h, uint64_t bytes)
{
    h->used = bytes > h->used ? 0 : h->used - bytes;
}

void hbm_reset(hbm *h)
{
    h->used = 0;
    h->peak = 0;
}
