/* The TPU system's control calls on the wire (system_msg.h). */
#include "system_msg.h"

#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "wire.h"

int system_msg_initialize(tpu_cluster *c, const struct sys_init *in, uint32_t wait_ms, tpu_topology **out, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__InitializeRequest body = TPUEMU__INITIALIZE_REQUEST__INIT;
    tpu_topology *t;
    int rc;

    *out = NULL;
    body.expect = in->expect;
    body.timeout_ms = in->timeout_ms;
    body.allow_partial = in->allow_partial != 0;
    body.keep_scheduled_faults = in->keep_scheduled_faults != 0;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_INITIALIZE;
    req.initialize = &body;
    if ((rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_TOPOLOGY, wait_ms, &m, e)) != CODE_OK)
        return rc;
    if (!m->topology)
        goto bad;
    for (size_t i = 0; i < m->topology->n_cores; i++)
        if (!m->topology->cores[i])
            goto bad;
    if (!(t = calloc(1, sizeof *t))) {
        wire_msg_free(m);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    t->magic = MAGIC_TOPOLOGY;
    if (topo_msgs_new(t, m, e) != CODE_OK) {
        wire_msg_free(m);
        free(t);
        return e->code;
    }
    *out = t;
    return CODE_OK;
bad:
    wire_msg_free(m);
    return err_set(e, CODE_INTERNAL, "the resolver at %s sent a malformed topology", c->r->ep_str[c->ep]);
}

void system_msg_abandon(tpu_cluster *c, uint64_t request_id, uint32_t wait_ms)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m = NULL;
    Tpuemu__InitializeRequest body = TPUEMU__INITIALIZE_REQUEST__INIT;
    err ignored;

    body.client_id = c->r->client_id;
    body.abandon_request_id = request_id;
    req.body_case = TPUEMU__MESSAGE__BODY_INITIALIZE;
    req.initialize = &body;
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_TOPOLOGY, wait_ms, &m, &ignored) == CODE_OK)
        wire_msg_free(m); /* not expected: the answer is an error body */
}

int system_msg_check(tpu_cluster *c, uint64_t epoch, uint64_t *seen, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__SystemCheck body = TPUEMU__SYSTEM_CHECK__INIT;
    int rc;

    body.epoch = epoch;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_SYSTEM_CHECK;
    req.system_check = &body;
    if ((rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_SYSTEM_CHECK_REPLY, c->r->timeout_ms, &m, e)) != CODE_OK)
        return rc;
    if (m->system_check_reply)
        *seen = m->system_check_reply->epoch;
    wire_msg_free(m);
    return CODE_OK;
}

int system_msg_shutdown(tpu_cluster *c, uint64_t epoch, uint64_t *seen, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__ShutdownRequest body = TPUEMU__SHUTDOWN_REQUEST__INIT;
    int rc;

    body.epoch = epoch;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_SHUTDOWN;
    req.shutdown = &body;
    /* the resolver waits up to 2 s for the cores' acknowledgements */
    if ((rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_SHUTDOWN_REPLY, c->r->timeout_ms + 2000, &m, e)) != CODE_OK)
        return rc;
    if (m->shutdown_reply)
        *seen = m->shutdown_reply->epoch;
    wire_msg_free(m);
    return CODE_OK;
}

int system_msg_forget(tpu_cluster *c, const char *host_id, int core, uint64_t *silent_ms, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__ForgetCore body = TPUEMU__FORGET_CORE__INIT;
    int rc;

    body.host_id = (char *)host_id;
    body.core = core;
    body.client_id = c->r->client_id;
    req.body_case = TPUEMU__MESSAGE__BODY_FORGET_CORE;
    req.forget_core = &body;
    if ((rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_FORGET_CORE_REPLY, c->r->timeout_ms, &m, e)) != CODE_OK)
        return rc;
    if (silent_ms)
        *silent_ms = m->forget_core_reply ? m->forget_core_reply->silent_ms : 0;
    wire_msg_free(m);
    return CODE_OK;
}
