/* Control REP socket: a dispatch table of the requests the resolver sends a core. */
#include "control.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drc.h"
#include "log.h"
#include "wire.h"

/* A handler fills *reply (a CoreReport) or returns an error code with e set. */
typedef int (*ctl_handler)(struct control *ctl, const wire_msg *req, Tpuemu__CoreReport *reply, err *e);

static int on_reset(struct control *ctl, const wire_msg *req, Tpuemu__CoreReport *reply, err *e)
{
    (void)reply;
    return ctl->env.reset(ctl->env.arg, req->reset_core, e);
}

static int on_probe(struct control *ctl, const wire_msg *req, Tpuemu__CoreReport *reply, err *e)
{
    (void)ctl, (void)req, (void)reply, (void)e;
    log_debug("probed", "sender=%s", log_q(req->sender));
    return CODE_OK;
}

static int on_fault(struct control *ctl, const wire_msg *req, Tpuemu__CoreReport *reply, err *e)
{
    (void)reply;
    log_info("fault injection asked", "sender=%s", log_q(req->sender));
    return ctl->env.fault(ctl->env.arg, req->inject_fault, e);
}

static int on_faults(struct control *ctl, const wire_msg *req, Tpuemu__CoreReport *reply, err *e)
{
    log_info("scheduled faults asked", "sender=%s cancel=%u cancel_all=%d", log_q(req->sender),
             req->scheduled_faults->cancel, (int)req->scheduled_faults->cancel_all);
    return ctl->env.faults(ctl->env.arg, req->scheduled_faults, reply, e);
}

static const struct {
    Tpuemu__Message__BodyCase body;
    ctl_handler fn;
    const char *name;
} handlers[] = {
    {TPUEMU__MESSAGE__BODY_RESET_CORE, on_reset, "reset_core"},
    {TPUEMU__MESSAGE__BODY_PROBE_CORE, on_probe, "probe_core"},
    {TPUEMU__MESSAGE__BODY_INJECT_FAULT, on_fault, "inject_fault"},
    {TPUEMU__MESSAGE__BODY_SCHEDULED_FAULTS, on_faults, "scheduled_faults"},
};

/* Sends the sealed answer buf to rq (consumed). keep: the request passed
 * authentication and was entered in the reply cache, which keeps the answer
 * for a resend (and hands back a resend that came meanwhile). */
static void send_reply(struct control *ctl, void *rq, int keep, uint64_t request_id, const uint8_t *buf, size_t len)
{
    void *dup = keep ? drc_answer(ctl->drc, request_id, buf, len) : NULL;
    err e;
    if (sprep_reply(ctl->sock, rq, buf, len, &e) != CODE_OK)
        log_warn("control reply not sent", "reason=%s", log_q(e.msg));
    if (dup && sprep_reply(ctl->sock, dup, buf, len, &e) != CODE_OK)
        log_warn("control reply not sent", "reason=%s", log_q(e.msg));
}

/* Answers the request of rq (consumed) with an error. */
static void send_error(struct control *ctl, void *rq, int keep, uint64_t request_id, int code, const char *msg)
{
    uint8_t *buf;
    size_t len;
    if (wire_seal_error(ctl->env.auth, ctl->env.id->sender, request_id, code, msg, &buf, &len) != CODE_OK) {
        sprep_ctl_free(rq);
        return;
    }
    send_reply(ctl, rq, keep, request_id, buf, len);
    free(buf);
}

/* Is req for this very core and process? A message signed for another one
 * (captured on its way there and replayed here within the replay window,
 * which is per process) must change nothing. PERMISSION_DENIED with e set if
 * not. */
static int check_recipient(const struct control *ctl, const wire_msg *req, err *e)
{
    const struct core_ident *id = ctl->env.id;
    const Tpuemu__CoreRef *to = req->recipient;

    if (!to)
        return err_set(e, CODE_PERMISSION_DENIED, "'%s' names no recipient; core %s/%d (incarnation %016llx) "
                       "takes control messages addressed to it only", wire_body_name(req), id->host_id, id->core,
                       (unsigned long long)id->incarnation);
    if (!to->host_id || strcmp(to->host_id, id->host_id) != 0 || to->core != id->core ||
        to->incarnation != id->incarnation)
        return err_set(e, CODE_PERMISSION_DENIED, "'%s' is addressed to core %s/%d (incarnation %016llx), "
                       "this is core %s/%d (incarnation %016llx): refused, nothing changed (a message for "
                       "another core replayed here, or for an earlier process of this core)",
                       wire_body_name(req), to->host_id ? to->host_id : "", (int)to->core,
                       (unsigned long long)to->incarnation, id->host_id, id->core,
                       (unsigned long long)id->incarnation);
    return CODE_OK;
}

static void on_msg(sprep *s, const uint8_t *buf, size_t len, void *rq)
{
    struct control *ctl = sprep_data(s);
    wire_msg *req, rep = TPUEMU__MESSAGE__INIT;
    Tpuemu__CoreReport report = TPUEMU__CORE_REPORT__INIT;
    Tpuemu__WorkerInfo info = TPUEMU__WORKER_INFO__INIT;
    uint8_t *out;
    size_t outlen;
    const uint8_t *prev;
    size_t plen;
    uint64_t now = wire_now_ms();
    err e;
    size_t i;

    /* a resend of the same bytes (its connection broke before the answer
     * came): the first answer again, nothing done twice */
    switch (drc_lookup(ctl->drc, buf, len, rq, now, &prev, &plen)) {
    case DRC_DONE:
        ctl->resends++;
        log_info_limited("duplicate request answered again", "bytes=%zu", len);
        if (sprep_reply(s, rq, prev, plen, &e) != CODE_OK)
            log_warn("control reply not sent", "reason=%s", log_q(e.msg));
        return;
    case DRC_PENDING: /* answered with the first copy's answer */
        ctl->resends++;
        return;
    default:
        break;
    }
    if (wire_open(ctl->env.auth, ctl->env.replay, buf, len, WIRE_MAX_CONTROL, &req, &e) != CODE_OK) {
        log_warn_limited("control request refused", "code=%s reason=%s", code_name(e.code), log_q(e.msg));
        send_error(ctl, rq, 0, wire_peek_nonce(buf, len, WIRE_MAX_CONTROL), e.code, e.msg);
        return;
    }
    drc_begin(ctl->drc, buf, len, req->nonce, now);
    for (i = 0; i < sizeof handlers / sizeof handlers[0]; i++)
        if (handlers[i].body == req->body_case)
            break;
    if (i == sizeof handlers / sizeof handlers[0]) {
        err_set(&e, CODE_INVALID_ARGUMENT, "tpu-worker does not handle '%s' messages",
                wire_body_name(req));
        log_warn_limited("control request refused", "sender=%s code=%s reason=%s", log_q(req->sender),
                 code_name(e.code), log_q(e.msg));
        send_error(ctl, rq, 1, req->nonce, e.code, e.msg);
        goto out;
    }
    if (check_recipient(ctl, req, &e) != CODE_OK) {
        log_warn_limited("control request refused", "sender=%s request=%s code=%s reason=%s", log_q(req->sender),
                 handlers[i].name, code_name(e.code), log_q(e.msg));
        send_error(ctl, rq, 1, req->nonce, e.code, e.msg);
        goto out;
    }
    if (handlers[i].fn(ctl, req, &report, &e) != CODE_OK) {
        log_warn("control request failed", "sender=%s request=%s code=%s reason=%s",
                 log_q(req->sender), handlers[i].name, code_name(e.code), log_q(e.msg));
        send_error(ctl, rq, 1, req->nonce, e.code, e.msg);
        goto out;
    }
    ctl->env.info(ctl->env.arg, &info);
    report.worker = &info;
    rep.request_id = req->nonce;
    rep.body_case = TPUEMU__MESSAGE__BODY_CORE_REPORT;
    rep.core_report = &report;
    if (wire_seal(ctl->env.auth, ctl->env.id->sender, &rep, &out, &outlen, NULL, &e) != CODE_OK) {
        send_error(ctl, rq, 1, req->nonce, e.code, e.msg);
        goto out;
    }
    send_reply(ctl, rq, 1, req->nonce, out, outlen);
    free(out);
out:
    wire_msg_free(req);
}

/* sprep's vouch: a request that proves its sender holds the cluster token. */
static int vouch(void *data, const uint8_t *buf, size_t len)
{
    return wire_vouches(((struct control *)data)->env.auth, buf, len);
}

int ctl_start(struct control *ctl, const struct ctl_env *env, err *e)
{
    int rc;
    const struct sprep_cfg cfg = {
        .name = "control",
        .max_msg = WIRE_MAX_CONTROL,
        .max_pending = 4 * WIRE_MAX_REPLY,
        .max_untrusted_bytes = 2 * WIRE_MAX_CONTROL, /* strangers cannot make it hold more */
        .max_trusted = CTL_MAX_TRUSTED,
        .max_untrusted = CTL_MAX_UNTRUSTED,
        .untrusted_ms = CTL_UNTRUSTED_MS,
        .idle_ms = CTL_IDLE_MS,
        .on_msg = on_msg,
        .vouch = vouch,
        .data = ctl,
    };

    ctl->env = *env;
    ctl->resends = 0;
    if (!(ctl->drc = drc_new(CTL_DRC_ENTRIES, CTL_DRC_BYTES, AUTH_WINDOW_MS, sprep_ctl_free)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the control port's reply cache");
    if ((rc = sprep_start(env->loop, strcmp(env->listen, "*") ? env->listen : "0.0.0.0", 0, &cfg, &ctl->sock,
                          &ctl->port, e)) != CODE_OK) {
        drc_free(ctl->drc);
        ctl->drc = NULL;
        return rc;
    }
    ctl->started = 1;
    return CODE_OK;
}

void ctl_stop(struct control *ctl)
{
    if (!ctl->started)
        return;
    ctl->started = 0;
    sprep_close(ctl->sock);
    ctl->sock = NULL;
    drc_free(ctl->drc);
    ctl->drc = NULL;
}
