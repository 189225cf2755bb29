/* coll_int: what coll.c (requests, queue, replies) and build.c (algorithm
 * choice, schedules, kernels) share. Internal to the engine. */
#ifndef TPUEMU_WORKER_COLL_COLL_INT_H
#define TPUEMU_WORKER_COLL_COLL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "algo.h"
#include "coll.h"
#include "repro.h"
#include "schedule.h"
#include "status.h"
#include "tpuemu.pb-c.h"

#define COLL_MAX_BYTES (1ull << 30)         /* all buffers of one collective on one core */
#define COLL_MAX_CHUNK (16u * 1024u * 1024u) /* <= LINK_MAX_FRAME */

struct coll;
struct dp_conn;

/* One client request, queued then running. */
struct cop {
    struct cop *next;
    struct coll *c;
    struct dp_conn *conn; /* NULL once the client went away */
    coll_done_fn done;    /* a collective of this worker's own (coll_submit): where the answer goes */
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

struct worker *coll_worker(struct coll *c);
/* HBM a collective needs on one core (buffers + pipeline slots). */
uint64_t coll_plan_bytes(const Tpuemu__CollSpec *sp, int g);
/* Chooses the algorithm and builds op->s (owning op->payload from then on). */
int coll_build(struct coll *c, struct cop *op, err *e);
/* op->algo_used: "ring", "hd", "hier", "+shm" when a link was shared memory. */
void coll_algo_name(struct cop *op);
/* host[i] = host index (0.. by first appearance) of group rank i. */
int coll_hosts(struct coll *c, const struct cop *op, int *host);

#endif
