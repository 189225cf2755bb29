/* Fault injection on the wire (chaos_msg.h). */
#include "chaos_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "wire.h"

/* One sealed request to url and its reply, within timeout_ms, on a
 * connection of its own. */
static int call_core(tpu_cluster *c, const char *url, const char *name, wire_msg *req, uint32_t timeout_ms,
                     wire_msg **reply, err *e)
{
    uint8_t *buf = NULL, *msg = NULL;
    uint64_t nonce, deadline = wire_now_ms() + timeout_ms;
    size_t len, n = 0;
    spcall sc;
    addr a;
    int rc;

    *reply = NULL;
    spcall_init(&sc, WIRE_MAX_REPLY);
    if ((rc = addr_parse(url, 0, &a, e)) != CODE_OK)
        return rc;
    if ((rc = wire_seal(&c->r->auth, c->r->sender, req, &buf, &len, &nonce, e)) != CODE_OK)
        return rc;
    if ((rc = spcall_connect(&sc, a.host, a.port, timeout_ms, NULL, e)) != CODE_OK) {
        err_prefix(e, "core %s", name);
        goto out;
    }
    if ((rc = spcall_request(&sc, buf, len, deadline, &msg, &n, e)) != CODE_OK) {
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", e->msg);
        rc = err_set(e, CODE_UNAVAILABLE, "core %s at %s did not answer%s%s", name, url,
                     rc == CODE_DEADLINE_EXCEEDED ? " within the timeout" : ": ",
                     rc == CODE_DEADLINE_EXCEEDED ? "" : why);
        goto out;
    }
    rc = wire_open(&c->r->auth, NULL, msg, n, WIRE_MAX_REPLY, reply, e);
    free(msg);
    if (rc != CODE_OK) {
        err_prefix(e, "the answer of core %s at %s", name, url);
        goto out;
    }
    if ((*reply)->request_id != nonce) {
        wire_msg_free(*reply);
        *reply = NULL;
        rc = err_set(e, CODE_UNAVAILABLE, "core %s at %s answered another request", name, url);
        goto out;
    }
    if ((*reply)->body_case == TPUEMU__MESSAGE__BODY_ERROR) {
        const Tpuemu__Status *st = (*reply)->error;
        int code = st ? (int)st->code : CODE_UNKNOWN;
        if (code <= CODE_OK || code > CODE_MAX)
            code = CODE_UNKNOWN;
        rc = err_set(e, code, "core %s refused: %s", name, st && st->message ? st->message : "no reason given");
        wire_msg_free(*reply);
        *reply = NULL;
    }
out:
    spcall_close(&sc);
    free(buf);
    return rc;
}

/* f as the InjectFault message's fields, with peer as the other end of a link fault. */
static void fault_body(Tpuemu__InjectFault *body, const tpu_fault *f, const char *peer_host, int peer_core)
{
    body->kind = (Tpuemu__FaultKind)f->kind;
    body->duration_ms = f->duration_ms;
    body->percent = f->percent;
    body->delay_ms = f->delay_ms;
    body->at_step = f->at_step;
    body->notice_ms = f->notice_ms;
    body->skew_ms = f->skew_ms;
    body->latency_ms = f->latency_ms;
    body->seed = f->seed;
    body->peer_host = (char *)(peer_host ? peer_host : "");
    body->peer_core = peer_core;
}

int chaos_msg_inject(tpu_cluster *c, const struct spec_core *w, const char *host, int core, const tpu_fault *f,
                     const char *peer_host, int peer_core, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m = NULL;
    Tpuemu__InjectFault body = TPUEMU__INJECT_FAULT__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    char name[300];
    int rc;

    snprintf(name, sizeof name, "%s/%d", host, core);
    to.host_id = (char *)host;
    to.core = core;
    to.incarnation = w->incarnation;
    fault_body(&body, f, peer_host, peer_core);
    req.recipient = &to;
    req.body_case = TPUEMU__MESSAGE__BODY_INJECT_FAULT;
    req.inject_fault = &body;
    rc = call_core(c, w->control_addr, name, &req, c->r->timeout_ms, &m, e);
    wire_msg_free(m);
    return rc;
}

int chaos_msg_inject_resolver(tpu_cluster *c, const tpu_fault *f, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m = NULL;
    Tpuemu__InjectFault body = TPUEMU__INJECT_FAULT__INIT;
    int rc;

    fault_body(&body, f, f->peer_host, f->peer_core);
    req.body_case = TPUEMU__MESSAGE__BODY_INJECT_FAULT;
    req.inject_fault = &body;
    rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_INJECT_FAULT_REPLY, c->r->timeout_ms, &m, e);
    wire_msg_free(m);
    return rc;
}

int chaos_msg_scheduled(tpu_cluster *c, const struct spec_core *w, const char *host, int core, uint32_t cancel,
                        int cancel_all, tpu_scheduled_fault *out, size_t max, size_t elem_size, size_t *n,
                        size_t *cancelled, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m = NULL;
    Tpuemu__ScheduledFaults body = TPUEMU__SCHEDULED_FAULTS__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    const Tpuemu__CoreReport *r;
    char name[300];
    int rc;

    snprintf(name, sizeof name, "%s/%d", host, core);
    to.host_id = (char *)host;
    to.core = core;
    to.incarnation = w->incarnation;
    body.cancel = cancel;
    body.cancel_all = cancel_all != 0;
    req.recipient = &to;
    req.body_case = TPUEMU__MESSAGE__BODY_SCHEDULED_FAULTS;
    req.scheduled_faults = &body;
    if ((rc = call_core(c, w->control_addr, name, &req, c->r->timeout_ms, &m, e)) != CODE_OK)
        return rc;
    if (m->body_case != TPUEMU__MESSAGE__BODY_CORE_REPORT) {
        wire_msg_free(m);
        return err_set(e, CODE_UNAVAILABLE, "core %s answered with another message", name);
    }
    r = m->core_report;
    for (size_t i = 0; i < r->n_scheduled && i < max; i++) {
        const Tpuemu__ScheduledFault *x = r->scheduled[i];
        tpu_scheduled_fault f;
        memset(&f, 0, sizeof f);
        f.id = x->id;
        f.kind = (tpu_fault_kind)x->kind;
        f.at_step = x->at_step;
        f.due_in_ms = x->due_in_ms;
        f.duration_ms = x->duration_ms;
        f.percent = x->percent;
        f.notice_ms = x->notice_ms;
        snprintf(f.peer_host, sizeof f.peer_host, "%s", x->peer_host ? x->peer_host : "");
        f.peer_core = x->peer_core;
        memcpy((char *)out + i * elem_size, &f, elem_size < sizeof f ? elem_size : sizeof f);
    }
    if (n)
        *n = r->n_scheduled;
    if (cancelled)
        *cancelled = r->cancelled;
    wire_msg_free(m);
    return CODE_OK;
}
