/* Control REP socket: a dispatch table of the requests the resolver sends a core. */
#include "control.h"

#include <stdio.h>
#include <stdlib.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "coll.h"
#include "train.h"
#include "log.h"
#define TPUEMU_LINK_NO_TYPEDEF 1 /* unistd.h has link() */
#include "peers.h"
#include "wire.h"
#include "worker.h"

#define MAX_REPLICAS 4096

/* A handler fills *reply (a CoreReport, which points into w) or returns an
 * error code with e set. */
typedef int (*ctl_handler)(struct worker *w, const wire_msg *req, Tpuemu__CoreReport *reply, err *e);

static int on_reset(struct worker *w, const wire_msg *req, Tpuemu__CoreReport *reply, err *e)
{
    const Tpuemu__ResetCore *r = req->reset_core;
    (void)reply;

    if (r->epoch < w->epoch)
        return err_set(e, CODE_FAILED_PRECONDITION, "stale reset for epoch %llu, core is in epoch %llu",
                       (unsigned long long)r->epoch, (unsigned long long)w->epoch);
    if (r->num_replicas > MAX_REPLICAS || r->replica_id < -1 ||
        (r->replica_id >= 0 && (uint32_t)r->replica_id >= r->num_replicas))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "reset: replica %d of %u is not a valid replica (0..num_replicas-1, or -1; at "
                       "most %d replicas)", (int)r->replica_id, r->num_replicas, MAX_REPLICAS);
    w->epoch = r->epoch;
    w->replica_id = r->replica_id;
    w->num_replicas = r->replica_id >= 0 ? r->num_replicas : 0;
    hbm_reset(&w->hbm);
    /* every link of the old epoch closes; then the engine forgets its collectives */
    peers_reset(w, r);
    coll_reset(w);
    train_reset(w); /* after coll_reset: a step waiting on its all-reduce has been answered */
    log_info("core reset", "epoch=%llu replica=%d replicas=%u heartbeat_ms=%u dead_after=%u",
             (unsigned long long)w->epoch, w->replica_id, w->num_replicas, r->heartbeat_ms, r->dead_after);
    return CODE_OK;
}

static int on_probe(struct worker *w, const wire_msg *req, Tpuemu__CoreReport *reply, err *e)
{
    (void)w, (void)req, (void)reply, (void)e;
    log_debug("probed", "sender=%s", log_q(req->sender));
    return CODE_OK;
}

static const struct {
    Tpuemu__Message__BodyCase body;
    ctl_handler fn;
    const char *name;
} handlers[] = {
    {TPUEMU__MESSAGE__BODY_RESET_CORE, on_reset, "reset_core"},
    {TPUEMU__MESSAGE__BODY_PROBE_CORE, on_probe, "probe_core"},
};

static void send_error(struct worker *w, uint64_t request_id, int code, const char *msg)
{
    uint8_t *buf;
    size_t len;
    err e;
    if (wire_seal_error(&w->auth, worker_sender(w), request_id, code, msg, &buf, &len) != CODE_OK)
        return;
    if (nnuv_reply(&w->ctl.sock, NULL, buf, len, &e) != CODE_OK)
        log_warn("control reply not sent", "reason=%s", log_q(e.msg));
    free(buf);
}

static void on_msg(nnuv *s, const uint8_t *buf, size_t len, void *ctl)
{
    struct worker *w = s->data;
    wire_msg *req, rep = TPUEMU__MESSAGE__INIT;
    Tpuemu__CoreReport report = TPUEMU__CORE_REPORT__INIT;
    Tpuemu__WorkerInfo info = TPUEMU__WORKER_INFO__INIT;
    uint8_t *out;
    size_t outlen;
    err e;
    size_t i;

    (void)ctl;
    if (wire_open(&w->auth, w->replay, buf, len, WIRE_MAX_REQUEST, &req, &e) != CODE_OK) {
        log_warn("control request refused", "code=%s reason=%s", code_name(e.code), log_q(e.msg));
        send_error(w, wire_peek_nonce(buf, len, WIRE_MAX_REQUEST), e.code, e.msg);
        return;
    }
    for (i = 0; i < sizeof handlers / sizeof handlers[0]; i++)
        if (handlers[i].body == req->body_case)
            break;
    if (i == sizeof handlers / sizeof handlers[0]) {
        err_set(&e, CODE_INVALID_ARGUMENT, "tpu-worker does not handle '%s' messages",
                wire_body_name(req));
        log_warn("control request refused", "sender=%s code=%s reason=%s", log_q(req->sender),
                 code_name(e.code), log_q(e.msg));
        send_error(w, req->nonce, e.code, e.msg);
        goto out;
    }
    if (handlers[i].fn(w, req, &report, &e) != CODE_OK) {
        log_warn("control request failed", "sender=%s request=%s code=%s reason=%s",
                 log_q(req->sender), handlers[i].name, code_name(e.code), log_q(e.msg));
        send_error(w, req->nonce, e.code, e.msg);
        goto out;
    }
    worker_info(w, &info);
    report.worker = &info;
    rep.request_id = req->nonce;
    rep.body_case = TPUEMU__MESSAGE__BODY_CORE_REPORT;
    rep.core_report = &report;
    if (wire_seal(&w->auth, worker_sender(w), &rep, &out, &outlen, NULL, &e) != CODE_OK) {
        send_error(w, req->nonce, e.code, e.msg);
        goto out;
    }
    if (nnuv_reply(&w->ctl.sock, NULL, out, outlen, &e) != CODE_OK)
        log_warn("control reply not sent", "reason=%s", log_q(e.msg));
    free(out);
out:
    wire_msg_free(req);
}

int ctl_start(struct worker *w, err *e)
{
    int sock, rc;

    sock = nn_socket(AF_SP, NN_REP);
    if (sock < 0)
        return err_set(e, CODE_INTERNAL, "nanomsg REP socket: %s", nn_strerror(nn_errno()));
    if ((rc = nnuv_sockopts(sock, WIRE_MAX_REQUEST, e)) != CODE_OK ||
        (rc = nnuv_bind_tcp(sock, w->listen, 0, &w->ctl.port, e)) != CODE_OK) {
        nn_close(sock);
        return rc;
    }
    w->ctl.sock.data = w;
    if ((rc = nnuv_start(w->loop, &w->ctl.sock, sock, 0, on_msg, e)) != CODE_OK) {
        nn_close(sock);
        return rc;
    }
    w->ctl.started = 1;
    return CODE_OK;
}

void ctl_stop(struct worker *w)
{
    if (!w->ctl.started)
        return;
    w->ctl.started = 0;
    nnuv_close(&w->ctl.sock, NULL);
}
