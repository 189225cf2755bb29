/* A topology handle's messages read as plain C: the Topology an initialize
 * answers with (system_msg.c), or one made from TensorFlow's TopologyProto
 * bytes; and TopologyProto packed from TensorFlow's view. For the cluster
 * room's topology.c, which builds and serves that view. Never installed. */
#ifndef TPUEMU_CLIENT_TOPO_MSG_H
#define TPUEMU_CLIENT_TOPO_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* The topology as a whole; strings are the handle's ("" when unsaid). */
struct topo_info {
    uint64_t epoch;
    size_t nmesh;           /* mesh_shape's entries (4 when sound) */
    uint32_t mesh_shape[4]; /* the first 4 */
    size_t ncores, nmissing;
    uint32_t num_tasks, num_tpus_per_task;
    const char *tpu_type, *owner;
};
void topo_info(const tpu_topology *t, struct topo_info *out);
uint64_t topo_epoch(const tpu_topology *t);
size_t topo_ncores(const tpu_topology *t);

/* Core i (< ncores) in the order the topology lists them (replica order
 * when the resolver kept to it). */
struct topo_core {
    int replica_id;
    const char *host_id, *data_addr, *control_addr;
    int core;
    uint32_t task_id;
    size_t ncoords;     /* 4 when sound */
    uint32_t coords[4]; /* the first 4 */
};
void topo_core_at(const tpu_topology *t, size_t i, struct topo_core *out);
/* "host/core (why)" of expected core i (< nmissing) left out. */
const char *topo_missing(const tpu_topology *t, size_t i);
/* Gives t its messages (t->msgs): m, the answer to an initialize (NULL:
 * none yet; topo_tf_parse adds its own). m is t's from now on, freed with
 * it; when this fails (out of memory) nothing is taken. */
int topo_msgs_new(tpu_topology *t, wire_msg *m, err *e);
/* Frees the handle's messages (tpu_topology_free). */
void topo_msgs_free(tpu_topology *t);

/* TensorFlow's TopologyProto of bytes, checked as Topology._parse_topology
 * checks it (its messages): *out a new handle (magic set) whose cores are
 * the devices in task, device order, for cli_topology_build. CODE_OK, or
 * CODE_INVALID_ARGUMENT saying what is wrong, or CODE_RESOURCE_EXHAUSTED. */
int topo_tf_parse(const void *bytes, size_t len, tpu_topology **out, err *e);
/* TopologyProto of a mesh, ntasks x per devices and their coordinates dc
 * ([ntasks][per][4]): *out malloc'd, *n bytes. */
int topo_tf_pack(const int mesh[4], int ntasks, int per, const int *dc, uint8_t **out, size_t *n, err *e);

#endif
