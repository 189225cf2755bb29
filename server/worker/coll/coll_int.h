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
    const char *algo_used;
    char algo_buf[24];
};

/* 1 when coll_build may choose the hierarchical algorithm for op, and so
 * needs the host of every group rank. */
int coll_needs_hosts(const struct cop *op);
/* Chooses the algorithm and builds op->s over transport x (owning
 * op->payload from then on). host[i] = host index (0.. by first appearance)
 * of group rank i, when coll_needs_hosts(op), else NULL. */
int coll_build(struct cop *op, struct xport x, const int *host, err *e);
/* op->algo_used: "ring", "hd", "hier", "+shm" when a link was shared memory. */
void coll_algo_name(struct cop *op);

#endif
