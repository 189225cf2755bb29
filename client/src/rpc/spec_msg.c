/* The cluster spec read as plain C (spec_msg.h). */
#include "spec_msg.h"

#include <stdio.h>
#include <string.h>

#include "call.h"
#include "wire.h"

#define STR(s) ((s) ? (s) : "")

int spec_msg_fetch(tpu_cluster *c, wire_msg **out, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest body = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    int rc;

    req.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    req.cluster_spec_request = &body;
    body.tpu_name = c->r->tpu_name;
    rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC, c->r->timeout_ms, out, e);
    if (rc != CODE_OK && c->r->tpu_name[0]) {
        /* as tensorflow/python/tpu/client/client.py words a failed lookup */
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", e->msg);
        return err_set(e, rc,
                       "Could not lookup TPU metadata from name '%s'. Please doublecheck the tpu "
                       "argument in the TPUClusterResolver constructor. Exception: %s (the Cloud TPU API: "
                       "the resolver at %s, $TPUEMU_TPU_API)",
                       c->r->tpu_name, why, c->r->ep_str[c->ep]);
    }
    if (rc != CODE_OK)
        return rc;
    if (!(*out)->cluster_spec)
        goto bad;
    for (size_t i = 0; i < (*out)->cluster_spec->n_cores; i++)
        if (!(*out)->cluster_spec->cores[i] || !(*out)->cluster_spec->cores[i]->worker)
            goto bad;
    c->seen_epoch = (*out)->cluster_spec->system_epoch;
    return CODE_OK;
bad:
    wire_msg_free(*out);
    *out = NULL;
    return err_set(e, CODE_INTERNAL,
                   "the resolver at %s sent a cluster spec with a core missing its "
                   "description",
                   c->r->ep_str[c->ep]);
}

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
    out->owner = STR(cs->owner);
    out->resolver_version = STR(cs->resolver_version);
    out->tpu_name = STR(cs->tpu_name);
}

void spec_worker_at(const tpu_cluster_spec *spec, size_t i, struct spec_worker *out)
{
    const Tpuemu__CoreInfo *ci = spec->m->cluster_spec->cores[i];
    const Tpuemu__WorkerInfo *w = ci->worker; /* spec_msg_fetch checked it */
    out->host_id = STR(w->host_id);
    out->data_addr = STR(w->data_addr);
    out->control_addr = STR(w->control_addr);
    out->tpu_type = STR(w->tpu_type);
    out->core = w->core;
    out->epoch = w->epoch;
    out->replica_id = w->replica_id;
    out->live = ci->state == TPUEMU__CORE_STATE__CORE_IDLE || ci->state == TPUEMU__CORE_STATE__CORE_READY;
}

void spec_core_info(const tpu_cluster_spec *spec, size_t i, tpu_core_info *out)
{
    const Tpuemu__CoreInfo *ci = spec->m->cluster_spec->cores[i];
    const Tpuemu__WorkerInfo *w = ci->worker;
    memset(out, 0, sizeof *out);
    out->host_id = w->host_id;
    out->core = w->core;
    out->control_addr = w->control_addr;
    out->data_addr = w->data_addr;
    out->tpu_type = w->tpu_type;
    out->hbm_capacity = w->hbm_capacity;
    out->hbm_used = w->hbm_used;
    out->hbm_peak = w->hbm_peak;
    out->state = ci->state >= TPUEMU__CORE_STATE__CORE_IDLE && ci->state <= TPUEMU__CORE_STATE__CORE_MAINTENANCE
                     ? (tpu_core_state)ci->state
                     : TPU_CORE_UNKNOWN;
    out->heartbeat_age_ms = ci->heartbeat_age_ms;
    out->replica_id = out->state == TPU_CORE_READY ? w->replica_id : -1;
    out->pid = w->pid;
    out->version = w->version;
    out->hbm_ooms = w->hbm_ooms;
    cli_notice_from(w->notice, &out->notice);
}
