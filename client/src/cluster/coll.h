/* Collectives inside libtpuclient: what the cluster room adds to the state a
 * cluster handle keeps for them (struct cli_coll, rpc/coll_io.h). The
 * exchange on the wire is coll_io.c's, the connections are dpio.h's. Never
 * installed. */
#ifndef TPUEMU_CLIENT_COLL_H
#define TPUEMU_CLIENT_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "cluster_int.h"
#include "coll_io.h"
#include "dpio.h"

/* Progress timeout when the cluster spec cannot tell (1000 ms x 3). */
#define COLL_DEFAULT_PROGRESS_MS 3000u

/* heartbeat_ms x dead_after of the cluster (asked once): how long a dead core
 * may go unnoticed. */
uint64_t cli_coll_progress_ms(tpu_cluster *c);

/* Once one core failed a request, how long the others may still take to
 * answer: 2 x the progress timeout + 1 s (the workers of a fanned-out STEPS
 * wait as long for their children). */
uint64_t cli_coll_grace_ms(tpu_cluster *c);

#endif
