/* Health with Cloud TPU's names (tpuemu.h): a core's from what the resolver
 * lists of it, the cluster's from its cores'. tpuctl health prints these. */
#include <stdio.h>
#include <string.h>

#include "cluster_int.h"

#define LOW_MEMORY_PCT 90u

const char *tpu_notice_kind_name(tpu_notice_kind k)
{
    switch (k) {
    case TPU_NOTICE_PREEMPTION:
        return "PREEMPTION";
    case TPU_NOTICE_MAINTENANCE:
        return "MAINTENANCE";
    default:
        return "NONE";
    }
}

const char *tpu_health_name(tpu_health h)
{
    switch (h) {
    case TPU_HEALTHY:
        return "HEALTHY";
    case TPU_HEALTH_TIMEOUT:
        return "TIMEOUT";
    case TPU_UNHEALTHY_TENSORFLOW:
        return "UNHEALTHY_TENSORFLOW";
    case TPU_UNHEALTHY_MAINTENANCE:
        return "UNHEALTHY_MAINTENANCE";
    default:
        return "HEALTH_UNSPECIFIED";
    }
}

const char *tpu_symptom_name(tpu_symptom s)
{
    switch (s) {
    case TPU_SYMPTOM_LOW_MEMORY:
        return "LOW_MEMORY";
    case TPU_SYMPTOM_OUT_OF_MEMORY:
        return "OUT_OF_MEMORY";
    case TPU_SYMPTOM_EXECUTE_TIMED_OUT:
        return "EXECUTE_TIMED_OUT";
    case TPU_SYMPTOM_MESH_BUILD_FAIL:
        return "MESH_BUILD_FAIL";
    case TPU_SYMPTOM_HBM_OUT_OF_MEMORY:
        return "HBM_OUT_OF_MEMORY";
    default:
        return "";
    }
}

static double secs(uint64_t ms)
{
    return (double)ms / 1000.0;
}

tpu_status tpu_cluster_spec_core_health(const tpu_cluster_spec *s, size_t i, tpu_core_health *out)
{
    tpu_core_info ci;
    char *d;
    size_t n;

    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_cluster_spec_core_health: out is NULL");
    if (tpu_cluster_spec_core(s, i, &ci) != TPU_OK)
        return tpu_last_status();
    memset(out, 0, sizeof *out);
    d = out->details;
    n = sizeof out->details;
    out->health = TPU_HEALTHY;
    switch (ci.state) {
    case TPU_CORE_DEAD:
        out->health = TPU_HEALTH_TIMEOUT;
        snprintf(d, n, "no heartbeat for %.1f s", secs(ci.heartbeat_age_ms));
        return TPU_OK;
    case TPU_CORE_PREEMPTED:
        out->health = TPU_HEALTH_UNSPECIFIED;
        snprintf(d, n, "preempted %.1f s ago: its worker terminated after the notice; a worker started "
                 "again registers anew", secs(ci.heartbeat_age_ms));
        return TPU_OK;
    case TPU_CORE_MAINTENANCE:
        out->health = TPU_UNHEALTHY_MAINTENANCE;
        snprintf(d, n, "maintenance event: down for %.1f more s, then back, restarted",
                 secs(ci.notice.event_in_ms));
        return TPU_OK;
    case TPU_CORE_IDLE:
        if (tpu_cluster_spec_initialized(s)) {
            out->health = TPU_UNHEALTHY_TENSORFLOW;
            snprintf(d, n, "restarted: not part of initialized system epoch %llu",
                     (unsigned long long)tpu_cluster_spec_epoch(s));
            return TPU_OK;
        }
        break;
    default:
        break;
    }
    if (ci.hbm_ooms) {
        out->symptom = TPU_SYMPTOM_HBM_OUT_OF_MEMORY;
        snprintf(d, n, "%u compile%s refused for want of HBM since the last initialize", ci.hbm_ooms,
                 ci.hbm_ooms == 1 ? "" : "s");
    } else if (ci.hbm_capacity && ci.hbm_used >= ci.hbm_capacity / 100u * LOW_MEMORY_PCT) {
        out->symptom = TPU_SYMPTOM_LOW_MEMORY;
        snprintf(d, n, "%.1f%% of its HBM in use", 100.0 * (double)ci.hbm_used / (double)ci.hbm_capacity);
    } else if (ci.notice.kind == TPU_NOTICE_PREEMPTION) {
        snprintf(d, n, "preemption notice: terminated in %.1f s", secs(ci.notice.event_in_ms));
    } else if (ci.notice.kind == TPU_NOTICE_MAINTENANCE) {
        snprintf(d, n, "maintenance notice: down in %.1f s for %.1f s", secs(ci.notice.event_in_ms),
                 secs(ci.notice.window_ms));
    }
    return TPU_OK;
}

tpu_health tpu_cluster_spec_health(const tpu_cluster_spec *s)
{
    size_t n = tpu_cluster_spec_num_cores(s), silent = 0, maint = 0, bad = 0;
    tpu_core_health h;

    for (size_t i = 0; i < n; i++) {
        if (tpu_cluster_spec_core_health(s, i, &h) != TPU_OK)
            continue;
        silent += h.health == TPU_HEALTH_TIMEOUT || h.health == TPU_HEALTH_UNSPECIFIED;
        maint += h.health == TPU_UNHEALTHY_MAINTENANCE;
        bad += h.health != TPU_HEALTHY;
    }
    if (!n)
        return TPU_HEALTH_UNSPECIFIED;
    if (silent == n)
        return TPU_HEALTH_TIMEOUT;
    if (maint)
        return TPU_UNHEALTHY_MAINTENANCE;
    return bad ? TPU_UNHEALTHY_TENSORFLOW : TPU_HEALTHY;
}
