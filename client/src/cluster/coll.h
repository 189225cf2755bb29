/* Collectives inside libtpuclient: the state a cluster handle keeps for them
 * (the system's cores, one data connection per core, the last call's
 * outcome). The exchange on the wire is coll_io.c's, the connections are
 * dpio.h's. Never installed. */
#ifndef TPUEMU_CLIENT_COLL_H
#define TPUEMU_CLIENT_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "cluster_int.h"
#include "coll_io.h"
#include "dpio.h"

/* Progress timeout when the cluster spec cannot tell (1000 ms x 3). */
#define COLL_DEFAULT_PROGRESS_MS 3000u

struct cli_coll {
    uint64_t epoch;
    size_t n;
    struct dpio_conn *peers; /* n, replica order: one data connection per core */
    struct cli_res *res;     /* n */
    uint64_t next_seq;
    uint32_t progress_ms;    /* heartbeat_ms x dead_after; 0: not asked yet */
    tpu_collective_stats last;
    struct tio_stream *tio;  /* training requests in flight, per replica (train_io.c): plain
                                memory, freed with the rest */
};

/* heartbeat_ms x dead_after of the cluster (asked once): how long a dead core
 * may go unnoticed. */
uint64_t cli_coll_progress_ms(tpu_cluster *c);

#endif
