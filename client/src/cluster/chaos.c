/* Fault injection (tpu_inject_fault): an InjectFault sent straight to the
 * core's control port, addressed to that core and process, over a connection
 * of its own for the one call. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos_msg.h"
#include "cluster_int.h"

static const char *const kind_names[] = {NULL,   "kill",       "pause",     "slow",     "hbm",      "preempt",
                                         "maintenance", "skew", "link-delay", "link-loss", "partition"};
#define NKINDS 10
#define KINDS_LIST "kill, pause, slow, hbm, preempt, maintenance, skew, link-delay, link-loss, partition"
#define IS_LINK(k) ((k) == TPU_FAULT_LINK_DELAY || (k) == TPU_FAULT_LINK_LOSS || (k) == TPU_FAULT_PARTITION)

const char *tpu_fault_kind_name(tpu_fault_kind k)
{
    return (int)k >= 1 && (int)k <= NKINDS ? kind_names[k] : NULL;
}

tpu_status tpu_fault_kind_parse(const char *name, tpu_fault_kind *out)
{
    for (int k = 1; k <= NKINDS; k++)
        if (name && !strcmp(name, kind_names[k])) {
            *out = (tpu_fault_kind)k;
            return TPU_OK;
        }
    return cli_failf(TPU_INVALID_ARGUMENT, "'%s' is not a fault kind (" KINDS_LIST ")", name ? name : "");
}

/* Core host/core of spec, or a failure naming it. */
static tpu_status find_core(const tpu_cluster_spec *spec, const char *what, const char *host, int core,
                            struct spec_core *out)
{
    if (spec_find_core(spec, host, core, out))
        return TPU_OK;
    return cli_failf(TPU_NOT_FOUND, "%s %s/%d is not in the cluster (the resolver knows %zu cores)", what, host, core,
                     spec_ncores(spec));
}

static tpu_status check_kind(const tpu_fault *f)
{
    if (!tpu_fault_kind_name(f->kind))
        return cli_failf(TPU_INVALID_ARGUMENT, "fault kind %d is not kill (1), pause (2), slow (3), hbm (4), "
                         "preempt (5), maintenance (6), skew (7), link-delay (8), link-loss (9) or partition (10)",
                         (int)f->kind);
    return TPU_OK;
}

tpu_status tpu_inject_fault(tpu_cluster *c, const char *host_id, int core, const tpu_fault *f)
{
    struct spec_core w, peer;
    tpu_cluster_spec *spec;
    tpu_status st = TPU_OK;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!host_id || !*host_id || core < 0 || !f)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_inject_fault: give a host id, a core index >= 0 and a fault");
    if (check_kind(f) != TPU_OK)
        return tpu_last_status();
    if (IS_LINK(f->kind) && (!f->peer_host || !*f->peer_host || f->peer_core < 0))
        return cli_failf(TPU_INVALID_ARGUMENT, "fault '%s' needs the core at the other end of the link (peer_host, "
                         "peer_core)", tpu_fault_kind_name(f->kind));
    if (tpu_cluster_spec_get(c, &spec) != TPU_OK)
        return tpu_last_status();
    st = find_core(spec, "core", host_id, core, &w);
    if (st == TPU_OK && IS_LINK(f->kind))
        st = find_core(spec, "the other end of the link, core", f->peer_host, f->peer_core, &peer);
    if (st == TPU_OK && chaos_msg_inject(c, &w, host_id, core, f, f->peer_host, f->peer_core, &e) != CODE_OK)
        st = cli_fail(&e);
    tpu_cluster_spec_free(spec);
    return st;
}

tpu_status tpu_inject_link_fault(tpu_cluster *c, const char *a_host, int a_core, const char *b_host, int b_core,
                                 const tpu_fault *f)
{
    struct spec_core wa, wb;
    tpu_cluster_spec *spec;
    tpu_status st = TPU_OK;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!a_host || !*a_host || a_core < 0 || !b_host || !*b_host || b_core < 0 || !f)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_inject_link_fault: give two cores (host id, core index >= 0) "
                         "and a fault");
    if (check_kind(f) != TPU_OK)
        return tpu_last_status();
    if (!IS_LINK(f->kind))
        return cli_failf(TPU_INVALID_ARGUMENT, "fault '%s' is not a link fault (link-delay, link-loss, partition)",
                         tpu_fault_kind_name(f->kind));
    if (!strcmp(a_host, b_host) && a_core == b_core)
        return cli_failf(TPU_INVALID_ARGUMENT, "the two ends of the link are one core, %s/%d: a link joins two cores",
                         a_host, a_core);
    if (tpu_cluster_spec_get(c, &spec) != TPU_OK)
        return tpu_last_status();
    /* both ends first: a core that is not there leaves the other untouched */
    st = find_core(spec, "core", a_host, a_core, &wa);
    if (st == TPU_OK)
        st = find_core(spec, "core", b_host, b_core, &wb);
    if (st != TPU_OK)
        ; /* named above */
    else if (chaos_msg_inject(c, &wa, a_host, a_core, f, b_host, b_core, &e) != CODE_OK)
        st = cli_fail(&e);
    else if (chaos_msg_inject(c, &wb, b_host, b_core, f, a_host, a_core, &e) != CODE_OK)
        st = cli_failf(e.code, "%s (core %s/%d has the fault: only what it sends to %s/%d is faulted)", e.msg, a_host,
                       a_core, b_host, b_core);
    tpu_cluster_spec_free(spec);
    return st;
}

/* A ScheduledFaults request to core host/core (chaos_msg_scheduled). */
static tpu_status scheduled(tpu_cluster *c, const char *fn, const char *host_id, int core, uint32_t cancel,
                            int cancel_all, tpu_scheduled_fault *out, size_t max, size_t elem_size, size_t *n,
                            size_t *cancelled)
{
    struct spec_core w;
    tpu_cluster_spec *spec;
    tpu_status st;
    err e;

    if (!host_id || !*host_id || core < 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: give a host id and a core index >= 0", fn);
    if (tpu_cluster_spec_get(c, &spec) != TPU_OK)
        return tpu_last_status();
    if ((st = find_core(spec, "core", host_id, core, &w)) == TPU_OK &&
        chaos_msg_scheduled(c, &w, host_id, core, cancel, cancel_all, out, max, elem_size, n, cancelled, &e) != CODE_OK)
        st = cli_fail(&e);
    tpu_cluster_spec_free(spec);
    return st;
}

tpu_status tpu_list_faults(tpu_cluster *c, const char *host_id, int core, tpu_scheduled_fault *out, size_t max,
                           size_t elem_size, size_t *n)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (!n || (max && !out) || (max && elem_size < offsetof(tpu_scheduled_fault, peer_core) + sizeof(int)))
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_list_faults: give n, and out with elem_size "
                         "sizeof(tpu_scheduled_fault) when max > 0");
    *n = 0;
    return scheduled(c, "tpu_list_faults", host_id, core, 0, 0, out, max, elem_size, n, NULL);
}

tpu_status tpu_cancel_faults(tpu_cluster *c, const char *host_id, int core, uint32_t id, size_t *cancelled)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (cancelled)
        *cancelled = 0;
    return scheduled(c, "tpu_cancel_faults", host_id, core, id, id == 0, NULL, 0, 0, NULL, cancelled);
}

tpu_status tpu_inject_resolver_fault(tpu_cluster *c, const tpu_fault *f)
{
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!f)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_inject_resolver_fault: no fault");
    if (chaos_msg_inject_resolver(c, f, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}
