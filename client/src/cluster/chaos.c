/* Fault injection (tpu_inject_fault): an InjectFault sent straight to the
 * core's control port, addressed to that core and process, over a connection
 * of its own for the one call. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_int.h"
#include "wire.h"

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

/* The worker of core host/core in the spec, or NULL. */
static const Tpuemu__WorkerInfo *find_core(const tpu_cluster_spec *spec, const char *host, int core)
{
    const Tpuemu__ClusterSpec *cs = spec->m->cluster_spec;
    const Tpuemu__WorkerInfo *w = NULL;
    for (size_t i = 0; cs && i < cs->n_cores; i++) {
        const Tpuemu__WorkerInfo *x = cs->cores[i]->worker;
        if (x && x->host_id && !strcmp(x->host_id, host) && x->core == core && x->control_addr)
            w = x;
    }
    return w;
}

static tpu_status not_found(const tpu_cluster_spec *spec, const char *what, const char *host, int core)
{
    const Tpuemu__ClusterSpec *cs = spec->m->cluster_spec;
    return cli_failf(TPU_NOT_FOUND, "%s %s/%d is not in the cluster (the resolver knows %zu cores)", what, host, core,
                     cs ? cs->n_cores : 0);
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

/* f into core w (host/core), with peer as the other end of a link fault. */
static int inject_one(tpu_cluster *c, const Tpuemu__WorkerInfo *w, const char *host, int core, const tpu_fault *f,
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
    const Tpuemu__WorkerInfo *w;
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
    if (!(w = find_core(spec, host_id, core)))
        st = not_found(spec, "core", host_id, core);
    else if (IS_LINK(f->kind) && !find_core(spec, f->peer_host, f->peer_core))
        st = not_found(spec, "the other end of the link, core", f->peer_host, f->peer_core);
    else if (inject_one(c, w, host_id, core, f, f->peer_host, f->peer_core, &e) != CODE_OK)
        st = cli_fail(&e);
    tpu_cluster_spec_free(spec);
    return st;
}

tpu_status tpu_inject_link_fault(tpu_cluster *c, const char *a_host, int a_core, const char *b_host, int b_core,
                                 const tpu_fault *f)
{
    const Tpuemu__WorkerInfo *wa, *wb;
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
    if (!(wa = find_core(spec, a_host, a_core)))
        st = not_found(spec, "core", a_host, a_core);
    else if (!(wb = find_core(spec, b_host, b_core)))
        st = not_found(spec, "core", b_host, b_core);
    else if (inject_one(c, wa, a_host, a_core, f, b_host, b_core, &e) != CODE_OK)
        st = cli_fail(&e);
    else if (inject_one(c, wb, b_host, b_core, f, a_host, a_core, &e) != CODE_OK)
        st = cli_failf(e.code, "%s (core %s/%d has the fault: only what it sends to %s/%d is faulted)", e.msg, a_host,
                       a_core, b_host, b_core);
    tpu_cluster_spec_free(spec);
    return st;
}

/* A ScheduledFaults request to core host/core: its reply in *out (freed by
 * the caller). */
static tpu_status scheduled(tpu_cluster *c, const char *fn, const char *host_id, int core, uint32_t cancel,
                            int cancel_all, wire_msg **out)
{
    const Tpuemu__WorkerInfo *w;
    tpu_cluster_spec *spec;
    tpu_status st = TPU_OK;
    wire_msg req = TPUEMU__MESSAGE__INIT;
    Tpuemu__ScheduledFaults body = TPUEMU__SCHEDULED_FAULTS__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    char name[300];
    err e;

    *out = NULL;
    if (!host_id || !*host_id || core < 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: give a host id and a core index >= 0", fn);
    if (tpu_cluster_spec_get(c, &spec) != TPU_OK)
        return tpu_last_status();
    if (!(w = find_core(spec, host_id, core))) {
        st = not_found(spec, "core", host_id, core);
    } else {
        snprintf(name, sizeof name, "%s/%d", host_id, core);
        to.host_id = (char *)host_id;
        to.core = core;
        to.incarnation = w->incarnation;
        body.cancel = cancel;
        body.cancel_all = cancel_all != 0;
        req.recipient = &to;
        req.body_case = TPUEMU__MESSAGE__BODY_SCHEDULED_FAULTS;
        req.scheduled_faults = &body;
        if (call_core(c, w->control_addr, name, &req, c->r->timeout_ms, out, &e) != CODE_OK)
            st = cli_fail(&e);
        else if ((*out)->body_case != TPUEMU__MESSAGE__BODY_CORE_REPORT) {
            wire_msg_free(*out);
            *out = NULL;
            st = cli_failf(TPU_UNAVAILABLE, "core %s answered with another message", name);
        }
    }
    tpu_cluster_spec_free(spec);
    return st;
}

tpu_status tpu_list_faults(tpu_cluster *c, const char *host_id, int core, tpu_scheduled_fault *out, size_t max,
                           size_t elem_size, size_t *n)
{
    wire_msg *m;
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (!n || (max && !out) || (max && elem_size < offsetof(tpu_scheduled_fault, peer_core) + sizeof(int)))
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_list_faults: give n, and out with elem_size "
                         "sizeof(tpu_scheduled_fault) when max > 0");
    *n = 0;
    if (scheduled(c, "tpu_list_faults", host_id, core, 0, 0, &m) != TPU_OK)
        return tpu_last_status();
    const Tpuemu__CoreReport *r = m->core_report;
    for (size_t i = 0; i < r->n_scheduled; i++) {
        const Tpuemu__ScheduledFault *x = r->scheduled[i];
        tpu_scheduled_fault f;
        if (i >= max)
            continue;
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
    *n = r->n_scheduled;
    wire_msg_free(m);
    return TPU_OK;
}

tpu_status tpu_cancel_faults(tpu_cluster *c, const char *host_id, int core, uint32_t id, size_t *cancelled)
{
    wire_msg *m;
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (cancelled)
        *cancelled = 0;
    if (scheduled(c, "tpu_cancel_faults", host_id, core, id, id == 0, &m) != TPU_OK)
        return tpu_last_status();
    if (cancelled)
        *cancelled = m->core_report->cancelled;
    wire_msg_free(m);
    return TPU_OK;
}

tpu_status tpu_inject_resolver_fault(tpu_cluster *c, const tpu_fault *f)
{
    wire_msg req = TPUEMU__MESSAGE__INIT, *m = NULL;
    Tpuemu__InjectFault body = TPUEMU__INJECT_FAULT__INIT;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!f)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_inject_resolver_fault: no fault");
    fault_body(&body, f, f->peer_host, f->peer_core);
    req.body_case = TPUEMU__MESSAGE__BODY_INJECT_FAULT;
    req.inject_fault = &body;
    if (call_do(c, &req, TPUEMU__MESSAGE__BODY_INJECT_FAULT_REPLY, c->r->timeout_ms, &m, &e) != CODE_OK)
        return cli_fail(&e);
    wire_msg_free(m);
    return TPU_OK;
}
