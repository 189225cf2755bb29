/* algo: the schedule generators of the collectives (ring.c, hd.c, hier.c).
 * Each appends one algorithm's operations for this core to a schedule
 * (schedule.h) and returns a barrier op that completes when they all did.
 * Every core of the group calls the same generator with the same arguments
 * (except `me`), so sends and receives pair up in order.
 *
 * Data layout: the reduce phase works on buffer x.wbuf (element size x.wesz,
 * reduce kernel x.rkern), the gather phase moves buffer x.obuf (x.oesz);
 * when x.fin is set, a K_FIN op turns each final range of wbuf into obuf
 * (MEAN scaling, rounding to bfloat16, leaving fixed point). Offsets are in
 * elements of the collective's buffer; a sub-range (hier) is just another
 * [base, base + count). */
#ifndef TPUEMU_WORKER_COLL_ALGO_H
#define TPUEMU_WORKER_COLL_ALGO_H

#include <stdint.h>

#include "schedule.h"

struct direct; /* coll_int.h */

/* LOCAL kernels (sched op kern); run by coll.c */
enum {
    K_F32_SUM, K_F32_MAX, K_F32_MIN, K_I64_SUM, /* dst op= src, len bytes */
    K_FIN,  /* final range: len elements from global element aux */
    K_COPY, /* memcpy len bytes */
    K_PRO,  /* prologue of the whole collective (convert the input) */
    K_EXP,  /* reproducible mode: block exponents of the input */
    K_FIX,  /* reproducible mode: input -> fixed point */
    K_DIN,  /* direct (direct.c): this core's range of the input into its host segment */
    K_DRED, /* direct: reduce this core's slice across every segment of the host */
    K_DPUB, /* direct: this core's final slice into its segment's result area */
    K_DOUT, /* direct: every core's result slice out of its segment */
    K_DALL, /* direct, one barrier: the whole buffer reduced from every segment into the output */
    K_HS,   /* direct hand-shake: this core's verdict word */
};


struct xfer {
    int wbuf, rkern;
    unsigned wesz;
    int obuf;
    unsigned oesz;
    int fin;
    uint64_t chunk; /* elements per chunk (>= 1) */
};

struct gen {
    struct sched *s;
    const int *mem; /* the participants (group ranks) in ring order */
    int m, me;      /* how many; my index in mem */
    int dep;        /* every op depends on it (-1: none) */
    uint32_t step;  /* next step number; generators advance it */
    struct xfer x;
    uint64_t rd_max; /* gen_hd_allreduce: recursive doubling of the whole range
                        below this many elements (latency: log2 p steps, not 2 log2 p) */
    const int *host; /* gen_hd_allreduce: the host of each group rank (NULL: unknown),
                        so that its largest halves stay inside hosts */
};

enum { RING_RS = 1, RING_AG = 2, RING_FIN = 4 };

/* Ring over mem with blocks [bo[b], bo[b+1]) (m + 1 entries): the reduce-
 * scatter leaves block me reduced on core me, the all-gather spreads each
 * core's block to all. */
int gen_ring(struct gen *g, const uint64_t *bo, int flags);
/* Recursive halving (reduce-scatter) + doubling (all-gather) over
 * [base, base + count) with the non-power-of-two fix-up; recursive doubling
 * of the whole range when count < the power of two or count < g->rd_max. */
int gen_hd_allreduce(struct gen *g, uint64_t base, uint64_t count);
/* Power-of-two m only: recursive halving reduce-scatter / recursive doubling
 * all-gather over blocks bo (m + 1 entries). */
int gen_hd_blocks(struct gen *g, const uint64_t *bo, int flags);
/* Broadcast from mem[root] of obuf [base, base + count): a pipelined chain
 * (ring) or a binomial tree (hd). */
int gen_bcast_chain(struct gen *g, int root, uint64_t base, uint64_t count);
int gen_bcast_tree(struct gen *g, int root, uint64_t base, uint64_t count);

/* Hierarchical all-reduce: host[i] = host index of mem[i]. Reduce-scatter
 * inside each host, all-reduce of each core's part across hosts (ring or hd
 * by `cross_hd`), all-gather inside the host. Needs every host to have the
 * same number of cores; returns -2 when the topology does not fit. With d
 * (not NULL: the cores of this host agreed on it) the phases inside the host
 * are gen_direct's instead of rings (same slices, same step numbers, so hosts
 * that chose differently still meet in the cross phase). */
int gen_hier_allreduce(struct gen *g, const int *host, uint64_t count, int cross_hd, struct direct *d);

/* Chunk i of [lo, hi) in pieces of c elements. */
static inline uint64_t gen_nchunks(uint64_t lo, uint64_t hi, uint64_t c)
{
    return hi > lo ? (hi - lo + c - 1) / c : 0;
}

/* The direct intra-host all-reduce (direct.c), as NCCL's single-node and
 * OpenMPI's vader/coll-sm schemes: each core of the host copies its range
 * [base, base + count) once into its host segment, one barrier, each reduces
 * its 1/L slice straight from the L segments (in core order: the same bits
 * whichever core does it) into its segment's result area, a second barrier,
 * each copies the whole result out. Barriers are 8-byte messages to every
 * other core of the host over the links (shared-memory rings), so a core that
 * dies, hangs or is cut off fails the collective as any chunk does. flags:
 * RING_RS (copy in, barrier, reduce: into wbuf, or with RING_FIN finished
 * into the result area), RING_AG (publish obuf's slice unless RING_FIN did,
 * barrier, copy out). The step numbers advance as gen_ring's over L cores.
 * gen_direct_one: small buffers on one host, one barrier: each core copies
 * its input in, barrier, each reduces the whole buffer from the L segments
 * (same order, same bits) straight into its output. Each core alternates
 * between its two areas and says in its barrier word which one it wrote,
 * so it never overwrites what a slower peer still reads. */
int gen_direct(struct gen *g, struct direct *d, int flags);
int gen_direct_one(struct gen *g, struct direct *d);

#endif
