/* The cluster spec read as plain C (spec_msg.h). */
#include "spec_msg.h"

#include <string.h>

#include "wire.h"

int spec_find_core(const tpu_cluster_spec *spec, const char *host, int core, struct spec_core *out)
{
    const Tpuemu__ClusterSpec *cs = spec->m->cluster_spec;
    const Tpuemu__WorkerInfo *w = NULL;
    for (size_t i = 0; cs && i < cs->n_cores; i++) {
        const Tpuemu__WorkerInfo *x = cs->cores[i]->worker;
        if (x && x->host_id && !strcmp(x->host_id, host) && x->core == core && x->control_addr)
            w = x;
    }
    if (!w)
        return 0;
    out->control_addr = w->control_addr;
    out->incarnation = w->incarnation;
    return 1;
}

size_t spec_ncores(const tpu_cluster_spec *spec)
{
    const Tpuemu__ClusterSpec *cs = spec->m->cluster_spec;
    return cs ? cs->n_cores : 0;
}

void spec_system(const tpu_cluster_spec *spec, struct spec_system *out)
{
    const Tpuemu__ClusterSpec *cs = spec->m->cluster_spec;
    memset(out, 0, sizeof *out);
    if (!cs)
        return;
    out->initialized = cs->initialized;
    out->epoch = cs->system_epoch;
    out->heartbeat_ms = cs->heartbeat_ms;
    out->dead_after = cs->dead_after;
}

void spec_worker_at(const tpu_cluster_spec *spec, size_t i, struct spec_worker *out)
{
    const Tpuemu__WorkerInfo *w = spec->m->cluster_spec->cores[i]->worker;
    out->host_id = w && w->host_id ? w->host_id : "";
    out->data_addr = w && w->data_addr ? w->data_addr : "";
    out->core = w ? w->core : -1;
    out->epoch = w ? w->epoch : 0;
    out->replica_id = w ? w->replica_id : -1;
}
