/* coll_int: what coll.c (requests, queue, replies) hands build.c (algorithm
 * choice, schedules, kernels): a validated request and the transport. build.c
 * never calls back into coll.c. Internal to the engine. */
#ifndef TPUEMU_WORKER_COLL_COLL_INT_H
#define TPUEMU_WORKER_COLL_COLL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "algo.h"
#include "dpconn.h"
#include "repro.h"
#include "schedule.h"
#include "status.h"
#include "tpuemu.pb-c.h"
#include "xport.h"

#define COLL_MAX_BYTES (1ull << 30)         /* all buffers of one collective on one core */
#define COLL_MAX_CHUNK (16u * 1024u * 1024u) /* <= XPORT_MAX_CHUNK */
#define COLL_CHUNK (512u * 1024u)           /* default chunk (build.c says why) */
#define COLL_DEPTH 8                        /* default receive slots in flight */

struct coll;

#define DIRECT_MAX_L 64 /* cores of one host in a direct all-reduce */
/* Fewer cores of a host than this keep the rings: on 2 cores halving-doubling
 * is one exchange, reduced straight from the ring, and was as fast or faster
 * (side by side, 5-7 alternating rounds on the 2-core VM: 4 KiB 10.0 against
 * 10.4 us, 16 KiB 14.0 against 13.9, 64 KiB 48 against 34, 256 KiB 262 against
 * 183, 512 KiB 547 against 394; 3 cores, 64 KiB: 67 against 96 us). */
#define DIRECT_MIN_L 3

/* The direct intra-host all-reduce of one collective (direct.c): the cores
 * of this host in the group, agreed on by a hand-shake (coll.c). */
struct direct {
    int L, j;                     /* cores of this host in the group; my index among them */
    int loc[DIRECT_MAX_L];        /* their group ranks, in group order */
    size_t cap;                   /* bytes of the smallest segment's area (0: not agreed) */
    uint64_t base, count;         /* the range (elements) set by the generator */
    uint64_t bo[DIRECT_MAX_L + 1];/* slice bounds relative to base */
    size_t one_max;               /* agreed: below this many float32 bytes, one barrier (K_DALL) */
    int bf16_in;                  /* K_DIN converts the bfloat16 input (flat) instead of copying wbuf */
    int fin;                      /* K_DRED finishes (MEAN, bfloat16) into the result area */
    int q;                        /* this run's input area (0/1); the result area is the other */
    int *last;                    /* the core's area peers may still read after its last collective (coll.c) */
    int broken;                   /* a segment was missing when a kernel ran */
};

/* One client request, queued then running. */
struct cop {
    struct cop *next;
    struct coll *c;
    dp_conn *conn;        /* NULL once the client went away */
    /* a collective of this worker's own (coll_submit): where the answer goes (coll_done_fn) */
    void (*done)(void *arg, const err *e, const uint8_t *out, size_t out_len);
    void *done_arg;
    int borrowed;         /* payload is the submitter's: never freed here */
    uint64_t seq, epoch;
    const char *what;     /* "all-reduce", ... */
    int kind, op, bf16, algo, root, repro;
    uint64_t count, chunk_bytes;
    uint32_t iters, iters_done;
    int g, me, *members;  /* the group: replica ids in order, my index */
    uint8_t *payload;     /* the client's input until the schedule owns it */
    size_t len;
    uint64_t hbm_bytes;
    int reserved;
    uint32_t hbm_id;
    struct sched *s;
    uint8_t *input;       /* the buffer iterations restore, and its saved copy */
    size_t input_len;
    uint8_t *input_copy;
    const uint8_t *out;   /* the result (inside a schedule buffer) */
    size_t out_len;
    uint64_t t0, total_ns;
    uint32_t *iter_ns;    /* each iteration's time when iters > 1 (saturating), for the median */
    const char *algo_used;
    char algo_buf[24];
    struct direct dir;    /* dir.cap != 0: the host's cores agreed on the direct path */
};

/* 1 when coll_build needs the host of every group rank for op: it may
 * choose the hierarchical algorithm, or halving-doubling's order of steps
 * depends on them. */
int coll_needs_hosts(const struct cop *op);
/* Chooses the algorithm and builds op->s over transport x (owning
 * op->payload from then on). host[i] = host index (0.. by first appearance)
 * of group rank i, when coll_needs_hosts(op), else NULL. */
int coll_build(struct cop *op, struct xport x, const int *host, err *e);
/* op->algo_used: "ring", "hd", "hier", "direct", "+shm" when a link was shared memory. */
void coll_algo_name(struct cop *op);

/* direct.c: the LOCAL kernels K_DIN..K_HS (run_local hands them over). */
void direct_run_local(struct sched *s, const struct sop *o);
/* 1 when op may take the direct path (an all-reduce, not reproducible, over
 * a transport with host segments): it then needs the hosts of its group and
 * the agreement of this host's cores. */
int direct_candidate(const struct cop *op, struct xport x);
/* The cores of the group on my host (host[] as coll_needs_hosts gives it)
 * into op->dir (L, j, loc); L. */
int direct_local_set(struct cop *op, const int *host);
/* The hand-shake among op->dir's cores, a schedule of its own run before the
 * collective's (same seq, steps of its own): two rounds of one word to every
 * other core of the host; the second carries whether this core has every
 * other's segment mapped (and its own). NULL when out of memory. */
struct sched *direct_handshake(struct cop *op, struct xport x, err *e);
/* After it ran: the agreed area size in bytes (0: not every core could),
 * and in *one_max the agreed bound of the one-barrier variant. */
size_t direct_agreed(struct sched *hs, const struct cop *op, size_t *one_max);

#endif
