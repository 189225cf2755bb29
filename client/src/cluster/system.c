/* The TPU system: initialize (a new epoch, every chosen core reset), check
 * that the epoch a handle initialized is still current, shut down, and
 * forget a dead core. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

#define CLI_ABANDON_MS 2000u

/* tpu_cancel cut an initialize short: the resolver is told to drop it if it
 * still waits for cores (else it would refuse every other initialize until
 * its deadline). Best effort, within a short deadline; a second tpu_cancel
 * cuts it short. */
static void abandon(tpu_cluster *c, uint64_t request_id)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m = NULL;
    Tpuemu__InitializeRequest body = TPUEMU__INITIALIZE_REQUEST__INIT;
    err ignored;

    if (!request_id)
        return;
    cli_cancel_rearm(&c->cancel);
    body.client_id = c->r->client_id;
    body.abandon_request_id = request_id;
    req.body_case = TPUEMU__MESSAGE__BODY_INITIALIZE;
    req.initialize = &body;
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_TOPOLOGY, CLI_ABANDON_MS, &m, &ignored) == CODE_OK)
        wire_msg_free(m); /* not expected: the answer is an error body */
}

/* The collectives' view of the new system: its cores in replica order. */
static int set_coll_system(tpu_cluster *c, const Tpuemu__Topology *tp, err *e)
{
    size_t n = tp->n_cores;
    struct cli_core_ref *refs = calloc(n ? n : 1, sizeof *refs);
    int rc;
    if (!refs)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const Tpuemu__TopologyCore *tc = tp->cores[i];
        size_t r = tc->replica_id >= 0 && (size_t)tc->replica_id < n ? (size_t)tc->replica_id : i;
        refs[r].host = tc->host_id;
        refs[r].core = tc->core;
        refs[r].data_addr = tc->data_addr;
    }
    rc = n ? cli_coll_set_system(c, tp->epoch, n, refs, 1, e) : CODE_OK;
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
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__InitializeRequest body = TPUEMU__INITIALIZE_REQUEST__INIT;
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
    if (opts) {
        body.expect = opts->expect;
        body.timeout_ms = opts->timeout_ms;
        body.allow_partial = opts->allow_partial != 0;
        body.keep_scheduled_faults = opts->keep_scheduled_faults != 0;
    }
    if (body.timeout_ms > 600000)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "initialize timeout of %u ms is too long (at most 600000 ms)", body.timeout_ms);
    wait_ms = body.timeout_ms ? body.timeout_ms : CLI_INIT_DEFAULT_TIMEOUT_MS;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_INITIALIZE;
    req.initialize = &body;
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_TOPOLOGY, wait_ms + CLI_INIT_EXTRA_MS, &m, &e) != CODE_OK) {
        if (e.code == CODE_CANCELLED)
            abandon(c, c->last_request_id);
        return cli_fail(&e);
    }
    if (!m->topology)
        goto bad;
    for (size_t i = 0; i < m->topology->n_cores; i++)
        if (!m->topology->cores[i])
            goto bad;
    t = calloc(1, sizeof *t);
    if (!t) {
        wire_msg_free(m);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    t->magic = MAGIC_TOPOLOGY;
    t->m = m;
    t->tp = m->topology;
    if (cli_topology_build(t) != TPU_OK) {
        tpu_topology_free(t);
        return TPU_INTERNAL;
    }
    if (set_coll_system(c, m->topology, &e) != CODE_OK) {
        tpu_topology_free(t);
        return cli_fail(&e);
    }
    c->epoch = m->topology->epoch;
    c->seen_epoch = m->topology->epoch;
    *out = t;
    return TPU_OK;
bad:
    wire_msg_free(m);
    return cli_failf(TPU_INTERNAL, "the resolver at %s sent a malformed topology", c->r->ep_str[c->ep]);
}

tpu_status tpu_system_check(tpu_cluster *c)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__SystemCheck body = TPUEMU__SYSTEM_CHECK__INIT;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    body.epoch = c->epoch;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_SYSTEM_CHECK;
    req.system_check = &body;
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_SYSTEM_CHECK_REPLY, c->r->timeout_ms, &m, &e) != CODE_OK)
        return cli_fail(&e);
    if (m->system_check_reply)
        c->seen_epoch = m->system_check_reply->epoch;
    wire_msg_free(m);
    return TPU_OK;
}

tpu_status tpu_shutdown_system(tpu_cluster *c)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__ShutdownRequest body = TPUEMU__SHUTDOWN_REQUEST__INIT;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    body.epoch = c->epoch;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_SHUTDOWN;
    req.shutdown = &body;
    /* the resolver waits up to 2 s for the cores' acknowledgements */
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_SHUTDOWN_REPLY, c->r->timeout_ms + 2000, &m, &e) != CODE_OK)
        return cli_fail(&e);
    if (m->shutdown_reply)
        c->seen_epoch = m->shutdown_reply->epoch;
    cli_coll_free(c); /* the system is gone: so are its data connections */
    wire_msg_free(m);
    return TPU_OK;
}

tpu_status tpu_forget_core(tpu_cluster *c, const char *host_id, int core, uint64_t *silent_ms)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__ForgetCore body = TPUEMU__FORGET_CORE__INIT;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!host_id || !*host_id || core < 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_forget_core: give a host id and a core index >= 0");
    body.host_id = (char *)host_id;
    body.core = core;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_FORGET_CORE;
    req.forget_core = &body;
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_FORGET_CORE_REPLY, c->r->timeout_ms, &m, &e) != CODE_OK)
        return cli_fail(&e);
    if (silent_ms)
        *silent_ms = m->forget_core_reply ? m->forget_core_reply->silent_ms : 0;
    wire_msg_free(m);
    return TPU_OK;
}
