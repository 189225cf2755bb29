/* tpu_topology: read-only views of the Topology an initialize returned. */
#include "client.h"

#include <stdlib.h>
#include <string.h>

#define TOPO(t) (CHECK_HANDLE((t), MAGIC_TOPOLOGY, "tpu_topology"), (t)->m->topology)

void tpu_topology_free(tpu_topology *t)
{
    if (!t)
        return;
    CHECK_HANDLE(t, MAGIC_TOPOLOGY, "tpu_topology");
    wire_msg_free(t->m);
    t->magic = MAGIC_DEAD;
    free(t);
}

uint64_t tpu_topology_epoch(const tpu_topology *t)
{
    return TOPO(t)->epoch;
}

size_t tpu_topology_mesh_shape(const tpu_topology *t, int out[4])
{
    const Tpuemu__Topology *tp = TOPO(t);
    size_t n = tp->n_mesh_shape < 4 ? tp->n_mesh_shape : 4;
    for (size_t i = 0; i < n; i++)
        out[i] = (int)tp->mesh_shape[i];
    return n;
}

int tpu_topology_num_replicas(const tpu_topology *t)
{
    return (int)TOPO(t)->n_cores;
}

int tpu_topology_num_tasks(const tpu_topology *t)
{
    return (int)TOPO(t)->num_tasks;
}

int tpu_topology_num_tpus_per_task(const tpu_topology *t)
{
    return (int)TOPO(t)->num_tpus_per_task;
}

const char *tpu_topology_tpu_type(const tpu_topology *t)
{
    return TOPO(t)->tpu_type;
}

const char *tpu_topology_owner(const tpu_topology *t)
{
    return TOPO(t)->owner;
}

tpu_status tpu_topology_core_get(const tpu_topology *t, int replica, tpu_topology_core *out)
{
    const Tpuemu__Topology *tp = TOPO(t);
    const Tpuemu__TopologyCore *tc = NULL;

    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_topology_core_get: out is NULL");
    if (replica < 0 || (size_t)replica >= tp->n_cores)
        return cli_failf(TPU_OUT_OF_RANGE, "replica %d is out of range: the topology has %zu replicas",
                         replica, tp->n_cores);
    /* cores come in replica order; search only if the resolver did otherwise */
    if (tp->cores[replica]->replica_id == replica)
        tc = tp->cores[replica];
    for (size_t i = 0; !tc && i < tp->n_cores; i++)
        if (tp->cores[i]->replica_id == replica)
            tc = tp->cores[i];
    if (!tc)
        return cli_failf(TPU_INTERNAL, "the topology has no core with replica id %d", replica);
    memset(out, 0, sizeof *out);
    out->replica_id = tc->replica_id;
    out->host_id = tc->host_id;
    out->core = tc->core;
    out->task_id = (int)tc->task_id;
    for (size_t i = 0; i < tc->n_coords && i < 4; i++)
        out->coords[i] = (int)tc->coords[i];
    out->data_addr = tc->data_addr;
    return TPU_OK;
}

const char *tpu_topology_control_addr(const tpu_topology *t, int replica)
{
    const Tpuemu__Topology *tp = TOPO(t);
    for (size_t i = 0; i < tp->n_cores; i++)
        if (tp->cores[i]->replica_id == replica)
            return tp->cores[i]->control_addr;
    return NULL;
}

size_t tpu_topology_num_missing(const tpu_topology *t)
{
    return TOPO(t)->n_missing;
}

const char *tpu_topology_missing(const tpu_topology *t, size_t i)
{
    const Tpuemu__Topology *tp = TOPO(t);
    return i < tp->n_missing ? tp->missing[i] : NULL;
}
