/* One collective on the wire, as the cores see it: FRAME_COLL + every
 * replica's input out, each core's FRAME_COLL_RESULT in, over the data
 * connections of dpio.h. Knows nothing of the cluster handle: coll.c hands it
 * the connections, the epoch and where the outcomes go. Never installed. */
#ifndef TPUEMU_CLIENT_COLL_IO_H
#define TPUEMU_CLIENT_COLL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "dpio.h"
#include "status.h"
#include "tpuemu/tpuemu.h"

#define COLL_ALGO_MAX 32

/* The kinds of collectives (CollKind on the wire). */
enum coll_kind {
    COLL_IO_ALL_REDUCE = 1,
    COLL_IO_BROADCAST = 2,
    COLL_IO_ALL_GATHER = 3,
    COLL_IO_REDUCE_SCATTER = 4
};

/* What every core is asked to run (CollSpec on the wire). */
struct coll_io_spec {
    enum coll_kind kind;
    int op, dtype, algo; /* tpu_reduce_op, tpu_dtype, tpu_algo (the wire's values) */
    uint64_t count;      /* elements per replica (all-gather: input; reduce-scatter: output x n) */
    int root;            /* broadcast: the source replica */
    int reproducible;
    const uint32_t *group_of_replica; /* the group of each replica; NULL: one group */
    size_t n_group_of_replica;
    uint32_t iters;       /* run this many times back to back; 0: once */
    uint64_t chunk_bytes; /* 0: auto */
};

/* One replica's outcome of the last call. */
struct cli_res {
    int code;                 /* CODE_* */
    char msg[ERR_MSG_MAX];
    int from_core;            /* 1: the core said so (COLL_RESULT/ERROR); 0: seen by the client */
    uint64_t mono_ms;         /* when it came; 0: never */
    uint64_t ns;              /* the core's time per iteration */
    uint64_t p50_ns;          /* the median of its iterations' times (0: one iteration) */
    char algo[COLL_ALGO_MAX]; /* the core's algo_used */
};

/* What one replica sends and receives in a call. in may be NULL when in_len
 * is 0; out receives exactly out_len bytes. in and out may be the same buffer
 * (in place): the result is read only after the whole input was written. */
struct cli_part {
    const void *in;
    size_t in_len;
    void *out;
    size_t out_len;
};

/* The data connections of a cluster handle's system and what rides on them
 * (c->coll): the system's cores, one data connection per core, the last
 * collective's outcome, the training requests in flight (train_io.c). */
struct cli_coll {
    uint64_t epoch;
    size_t n;
    struct dpio_conn *peers; /* n, replica order: one data connection per core */
    struct cli_res *res;     /* n */
    uint64_t next_seq;
    uint32_t progress_ms; /* heartbeat_ms x dead_after; 0: not asked yet */
    tpu_collective_stats last;
    /* training requests in flight, per replica (train_io.c): plain memory,
     * freed with the rest */
    struct tio_stream *tio;
};

/* Sends FRAME_COLL{seq, epoch, spec} + parts[r].in on conns[r] to every core
 * r of n and reads each FRAME_COLL_RESULT into parts[r].out, all sockets at
 * once, until every core answered or failed, or deadline_ms (CLOCK_MONOTONIC
 * ms) passed. Once one replica failed, the others get at most grace_ms more.
 * Fills res[0..n); returns how many replicas failed. Connections that did
 * not end cleanly are closed. what: "all-reduce", ... for messages. When
 * tpu_cancel ran (cancel, NULL: none), the replicas not answered yet get
 * CODE_CANCELLED. */
size_t coll_io_run(struct dpio_conn *conns, size_t n, uint64_t epoch, const struct coll_io_spec *spec, uint64_t seq,
                   const char *what, const struct cli_part *parts, struct cli_res *res, uint64_t deadline_ms,
                   uint64_t grace_ms, const struct cli_cancel *cancel);

#endif
