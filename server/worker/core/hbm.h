/* HBM of one emulated core as an accounting allocator: a hard capacity, and a
 * table of labelled allocations (what each block holds - weights, optimizer
 * slots, gradients, activations, infeed buffers - its name and its shape).
 * It reserves no real memory (a v5p core "has" 95 GiB); it decides whether a
 * reservation fits, so the emulator fails with RESOURCE_EXHAUSTED where the
 * chip would, with XLA's wording and the largest allocations listed.
 * Initializing the TPU system empties it (hbm_reset).
 * Not thread-safe: one core, one thread. */
#ifndef TPUEMU_WORKER_HBM_H
#define TPUEMU_WORKER_HBM_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

enum hbm_kind {
    HBM_WEIGHTS,
    HBM_OPTIMIZER,     /* optimizer slots: momentum, Adam's m and v */
    HBM_GRADIENTS,
    HBM_ACTIVATIONS,   /* kept for the backward pass; scale with the per-core batch */
    HBM_INFEED,        /* input shards; scale with the per-core batch */
    HBM_OTHER,
    HBM_KINDS
};

#define HBM_RANK_MAX 8
#define HBM_NAME_MAX 48

/* One allocation, as listed by hbm_largest. */
struct hbm_block {
    uint32_t id;                  /* handle for hbm_release, never 0 */
    enum hbm_kind kind;
    char name[HBM_NAME_MAX];      /* "dense_1/kernel" (truncated) */
    char dtype[8];                /* "f32", "bf16", "s32", "u8" */
    int rank;
    int64_t dims[HBM_RANK_MAX];
    uint64_t bytes;
};

typedef struct hbm {
    uint64_t capacity;
    uint64_t used;
    uint64_t peak;                /* largest `used` since hbm_init/hbm_reset */
    uint64_t by_kind[HBM_KINDS];
    struct hbm_block *blocks;     /* owned */
    size_t nblocks, cap;
    uint32_t next_id;
    uint32_t ooms;                /* allocations refused for want of room since hbm_init/hbm_reset */
} hbm;

/* An empty HBM of capacity bytes. Owns nothing until the first allocation. */
void hbm_init(hbm *h, uint64_t capacity);
/* Frees the allocation table (host memory); h is then empty and reusable. */
void hbm_destroy(hbm *h);

/* Reserves an array of dtype with the given shape (rank 0..8; bytes are the
 * product of dims times the element size) labelled kind/name. On success sets
 * *id (if id is not NULL). Errors, with nothing changed:
 *  - CODE_INVALID_ARGUMENT: unknown dtype or kind, bad rank, a negative dim,
 *    a size that overflows 64 bits;
 *  - CODE_RESOURCE_EXHAUSTED: it does not fit. The message reads like XLA's:
 *    "Ran out of memory in memory space hbm. Used 17.25G of 16.00G hbm.
 *    Exceeded hbm capacity by 1.25G." then the request, the largest
 *    allocations (label, shape, size) and what to do (a smaller per-core batch,
 *    fewer layers, recomputation).
 *  - CODE_RESOURCE_EXHAUSTED too when host memory for the table runs out. */
int hbm_alloc(hbm *h, enum hbm_kind kind, const char *name, const char *dtype, const int64_t *dims, int rank,
              uint32_t *id, err *e);

/* One array of a compiled program, for hbm_alloc_program. */
struct hbm_req {
    enum hbm_kind kind;
    const char *name;
    const char *dtype;
    int rank;
    int64_t dims[HBM_RANK_MAX];
};

/* Reserves a compiled program's n arrays all together, or none: ids[i] gets
 * req[i]'s handle. Weights, optimizer slots and infeed buffers are the
 * program's arguments, the rest its temporaries. Errors as hbm_alloc's, but
 * an over-capacity one reads like XLA's TPU compile failure, counting the
 * whole program (what is already allocated is "reserved"):
 *    "XLA:TPU compile permanent error. Ran out of memory in memory space hbm.
 *    Used 19.02G of 16.00G hbm. Exceeded hbm capacity by 3.02G.
 *
 *    Total hbm usage >= 19.02G:
 *        reserved          0B
 *        program       17.25G
 *        arguments      1.77G
 *
 *      Largest allocations in hbm:" ... then what to change. */
int hbm_alloc_program(hbm *h, const struct hbm_req *req, size_t n, uint32_t *ids, err *e);

/* Returns allocation id. CODE_NOT_FOUND if it is not live (released twice, or
 * allocated before the last reset). */
int hbm_release(hbm *h, uint32_t id, err *e);

/* Empties the core's HBM (system initialize) and restarts the peak. */
void hbm_reset(hbm *h);

static inline uint64_t hbm_free_bytes(const hbm *h)
{
    return h->capacity - h->used;
}

/* Up to n live allocations, largest first (ties: oldest first), into out;
 * returns how many were written. */
size_t hbm_largest(const hbm *h, struct hbm_block *out, size_t n);

/* "weights", "optimizer slots", "gradients", "activations", "infeed buffers", "other". */
const char *hbm_kind_name(enum hbm_kind kind);

/* XLA-style size: "0B", "512B", "1.50K", "17.25G" (powers of 1024). */
void hbm_format_size(uint64_t bytes, char *buf, size_t n);

/* "bf16[128,784]" into buf. */
void hbm_format_shape(const struct hbm_block *b, char *buf, size_t n);

#endif
