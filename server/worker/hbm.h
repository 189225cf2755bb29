/* HBM of one emulated core as an accounting allocator: a hard capacity, the
 * bytes in use and the peak since the last reset. It reserves no real memory
 * (a v5p core "has" 95 GiB); it only decides whether a reservation fits, so
 * the emulator can fail with RESOURCE_EXHAUSTED where the chip would.
 * Not thread-safe: one core, one loop thread. */
#ifndef TPUEMU_WORKER_HBM_H
#define TPUEMU_WORKER_HBM_H

#include <stdint.h>

#include "status.h"

typedef struct hbm {
    uint64_t capacity;
    uint64_t used;
    uint64_t peak;   /* largest `used` since hbm_init/hbm_reset */
} hbm;

void hbm_init(hbm *h, uint64_t capacity);

/* Reserves bytes: CODE_OK, or CODE_RESOURCE_EXHAUSTED with the numbers in e
 * ("attempting to reserve 3.00 GiB of HBM with 1.50 GiB free of 16.00 GiB")
 * and nothing changed. */
int hbm_alloc(hbm *h, uint64_t bytes, err *e);

/* Returns bytes reserved earlier; more than is in use is a bug in the caller
 * and clamps to zero. */
void hbm_release(hbm *h, uint64_t bytes);

/* Empties the core's HBM (a system reset). */
void hbm_reset(hbm *h);

static inline uint64_t hbm_free_bytes(const hbm *h)
{
    return h->capacity - h->used;
}

#endif
