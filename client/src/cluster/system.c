/* The TPU system: initialize (a new epoch, every chosen core reset), check
 * that the epoch a handle initialized is still current, shut down, and
 * forget a dead core. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

#include "system_msg.h"

#define CLI_ABANDON_MS 2000u

/* tpu_cancel cut an initialize short: the resolver is told to drop it if it
 * still waits for cores (else it would refuse every other initialize until
 * its deadline). Best effort, within a short deadline; a second tpu_cancel
 * cuts it short. */
static void abandon(tpu_cluster *c, uint64_t request_id)
{
    if (!request_id)
        return;
    cli_cancel_rearm(&c->cancel);
    system_msg_abandon(c, request_id, CLI_ABANDON_MS);
}

/* The collectives' view of the new system: its cores in replica order. */
static int set_coll_system(tpu_cluster *c, const tpu_topology *t, err *e)
{
    size_t n = topo_ncores(t);
    struct cli_core_ref *refs = calloc(n ? n : 1, sizeof *refs);
    int rc;
    if (!refs)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < n; i++) {
        struct topo_core tc;
        topo_core_at(t, i, &tc);
        size_t r = tc.replica_id >= 0 && (size_t)tc.replica_id < n ? (size_t)tc.replica_id : i;
        refs[r].host = tc.host_id;
        refs[r].core = tc.core;
        refs[r].data_addr = tc.data_addr;
    }
    rc = n ? cli_coll_set_system(c, topo_epoch(t), n, refs, 1, e) : CODE_OK;
    if (!n)
        cli_coll_free(c);
    free(refs);
    return rc;
}

tpu_status tpu_initialize_system(tpu_cluster *c, const tpu_init_options *opts, tpu_topology **out)
{
    return cli_initialize_system(c, opts, out, 0);
}

tpu_status cli_initialize_system(tpu_cluster *c, const tpu_init_options *opts, tpu_topology **out, int restoring)
{
    struct sys_init in;
    tpu_topology *t;
    uint32_t wait_ms;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_initialize_system: out is NULL");
    *out = NULL;
    /* TensorFlow's initialize_tpu_system (tensorflow/python/tpu/tpu_strategy_util.py)
     * warns when the TPU it names was initialized already; the words are its own */
    if (c->coll && !restoring)
        cli_warn("TPU system %s has already been initialized. Reinitializing the TPU can cause previously "
                 "created variables on TPU to be lost. (epoch %llu: a model trained on it must load a "
                 "checkpoint or be compiled again)", tpu_resolver_master(c->r),
                 (unsigned long long)c->coll->epoch);
    memset(&in, 0, sizeof in);
    if (opts) {
        in.expect = opts->expect;
        in.timeout_ms = opts->timeout_ms;
        in.allow_partial = opts->allow_partial != 0;
        in.keep_scheduled_faults = opts->keep_scheduled_faults != 0;
    }
    if (in.timeout_ms > 600000)
        return cli_failf(TPU_INVALID_ARGUMENT, "initialize timeout of %u ms is too long (at most 600000 ms)",
                         in.timeout_ms);
    wait_ms = in.timeout_ms ? in.timeout_ms : CLI_INIT_DEFAULT_TIMEOUT_MS;
    if (system_msg_initialize(c, &in, wait_ms + CLI_INIT_EXTRA_MS, &t, &e) != CODE_OK) {
        if (e.code == CODE_CANCELLED)
            abandon(c, c->last_request_id);
        return cli_fail(&e);
    }
    if (cli_topology_build(t) != TPU_OK) {
        tpu_topology_free(t);
        return TPU_INTERNAL;
    }
    if (set_coll_system(c, t, &e) != CODE_OK) {
        tpu_topology_free(t);
        return cli_fail(&e);
    }
    c->epoch = topo_epoch(t);
    c->seen_epoch = topo_epoch(t);
    *out = t;
    return TPU_OK;
}

tpu_status tpu_system_check(tpu_cluster *c)
{
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (system_msg_check(c, c->epoch, &c->seen_epoch, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}

tpu_status tpu_shutdown_system(tpu_cluster *c)
{
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (system_msg_shutdown(c, c->epoch, &c->seen_epoch, &e) != CODE_OK)
        return cli_fail(&e);
    cli_coll_free(c); /* the system is gone: so are its data connections */
    return TPU_OK;
}

tpu_status tpu_forget_core(tpu_cluster *c, const char *host_id, int core, uint64_t *silent_ms)
{
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!host_id || !*host_id || core < 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_forget_core: give a host id and a core index >= 0");
    if (system_msg_forget(c, host_id, core, silent_ms, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}
