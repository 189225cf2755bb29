/* Liveness probes of peer cores: one short-lived REQ socket per probe, so a
 * late answer can never reach a socket that has moved on (nanomsg 1.1.5's REQ
 * frees a late reply to a cancelled request twice). */
#include "probe.h"

#include <stdlib.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "nnuv.h"
#include "wire.h"

struct probe {
    nnuv nn;
    uv_timer_t timer;
    const auth *auth;
    uint64_t nonce, incarnation;
    probe_cb cb;
    void *arg;
    int done;
    int open;      /* handles still open; freed at 0 */
};

static void one_closed(struct probe *pr)
{
    if (--pr->open == 0)
        free(pr);
}

static void on_nn_closed(nnuv *s)
{
    one_closed(s->data);
}

static void on_timer_closed(uv_handle_t *h)
{
    one_closed(h->data);
}

static void finish(struct probe *pr, int alive)
{
    probe_cb cb = pr->cb;
    void *arg = pr->arg;
    int notify = !pr->done;

    pr->done = 1;
    uv_timer_stop(&pr->timer);
    if (pr->nn.active)
        nnuv_close(&pr->nn, on_nn_closed);
    if (!uv_is_closing((uv_handle_t *)&pr->timer))
        uv_close((uv_handle_t *)&pr->timer, on_timer_closed);
    if (notify && cb)
        cb(arg, alive);
}

static void on_reply(nnuv *s, const uint8_t *buf, size_t len, void *ctl)
{
    struct probe *pr = s->data;
    wire_msg *m = NULL;
    err e;
    int alive;

    nnuv_ctl_free(ctl);
    if (pr->done || wire_open(pr->auth, NULL, buf, len, WIRE_MAX_REPLY, &m, &e) != CODE_OK)
        return; /* the deadline decides */
    if (m->request_id != pr->nonce) {
        wire_msg_free(m);
        return;
    }
    alive = m->body_case == TPUEMU__MESSAGE__BODY_CORE_REPORT && m->core_report &&
            m->core_report->worker && m->core_report->worker->incarnation == pr->incarnation;
    wire_msg_free(m);
    finish(pr, alive);
}

static void on_timer(uv_timer_t *t)
{
    finish(t->data, 0);
}

struct probe *probe_start(uv_loop_t *loop, const auth *a, const char *sender, const char *control_addr,
                          const char *host, int core, uint64_t incarnation, unsigned timeout_ms, probe_cb cb,
                          void *arg, err *e)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ProbeCore body = TPUEMU__PROBE_CORE__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    struct probe *pr;
    uint8_t *buf = NULL;
    size_t len = 0;
    int sock, ivl = 3600 * 1000;

    if (!control_addr || !*control_addr) {
        err_set(e, CODE_FAILED_PRECONDITION, "the peer's control address is unknown");
        return NULL;
    }
    if (!(pr = calloc(1, sizeof *pr))) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a probe");
        return NULL;
    }
    if ((sock = nn_socket(AF_SP, NN_REQ)) < 0) {
        err_set(e, CODE_INTERNAL, "nanomsg socket: %s", nn_strerror(nn_errno()));
        free(pr);
        return NULL;
    }
    nn_setsockopt(sock, NN_REQ, NN_REQ_RESEND_IVL, &ivl, sizeof ivl);
    m.body_case = TPUEMU__MESSAGE__BODY_PROBE_CORE;
    m.probe_core = &body;
    to.host_id = (char *)host;
    to.core = core;
    to.incarnation = incarnation;
    m.recipient = &to;
    if (nnuv_sockopts(sock, WIRE_MAX_REPLY, e) != CODE_OK || nnuv_connect(sock, control_addr, e) != CODE_OK ||
        wire_seal(a, sender, &m, &buf, &len, &pr->nonce, e) != CODE_OK) {
        nn_close(sock);
        free(pr);
        return NULL;
    }
    if (nn_send(sock, buf, len, NN_DONTWAIT) < 0) {
        err_set(e, CODE_UNAVAILABLE, "probe to %s: %s", control_addr, nn_strerror(nn_errno()));
        free(buf);
        nn_close(sock);
        free(pr);
        return NULL;
    }
    free(buf);
    if (nnuv_start(loop, &pr->nn, sock, 0, on_reply, e) != CODE_OK) {
        nn_close(sock);
        free(pr);
        return NULL;
    }
    pr->nn.data = pr;
    pr->auth = a;
    pr->incarnation = incarnation;
    pr->cb = cb;
    pr->arg = arg;
    pr->open = 2;
    uv_timer_init(loop, &pr->timer);
    pr->timer.data = pr;
    uv_timer_start(&pr->timer, on_timer, timeout_ms, 0);
    return pr;
}

void probe_cancel(struct probe *pr)
{
    if (!pr)
        return;
    pr->cb = NULL;
    finish(pr, 0);
}
