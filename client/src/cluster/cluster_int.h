/* What the rooms above (train/) need of the cluster room beyond the public
 * API, and what its files share. Never installed. */
#ifndef TPUEMU_CLIENT_CLUSTER_INT_H
#define TPUEMU_CLIENT_CLUSTER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "call.h"
#include "client.h"

/* tpu_initialize_system; restoring: the caller puts its model's state back
 * on the new system itself (elastic fit), so no warning that re-initializing
 * loses the variables on the cores (system.c). */
tpu_status cli_initialize_system(tpu_cluster *c, const tpu_init_options *opts, tpu_topology **out, int restoring);

/* Fills t's TensorFlow view from t->tp (the resolver's coordinates). A
 * coordinate outside the mesh is TPU_INTERNAL (a malformed topology;
 * topology.c). */
tpu_status cli_topology_build(tpu_topology *t);

/* Collectives (coll.c): the handle now belongs to the system of this epoch,
 * whose n cores are given in replica order (strings copied). Drops any
 * previous data connections; sequence numbers restart at first_seq. */
struct cli_core_ref {
    const char *host;
    int core;
    const char *data_addr; /* "ADDR:PORT" */
};
int cli_coll_set_system(tpu_cluster *c, uint64_t epoch, size_t n, const struct cli_core_ref *cores, uint64_t first_seq,
                        err *e);
void cli_coll_free(tpu_cluster *c);

#endif
