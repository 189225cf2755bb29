/* Liveness probes of peer cores over the project's own SP client (spreq):
 * one short-lived link per probe, so a late answer can never reach a link
 * that has moved on. No nanomsg socket: nanomsg 1.1.5's connecting socket
 * aborts the process when its reconnect cannot bind a local port (every
 * ephemeral port taken, as 1,024 cores on one machine can take them), and a
 * probe is sent exactly when peers are silent and links are being remade. */
#include "probe.h"

#include <stdlib.h>
#include <string.h>

#include "spreq.h"
#include "wire.h"

/* A connection refused or broken before the answer is tried again this often
 * until the deadline (the peer may be restarting its listener, or the
 * machine short of ports for a moment). */
#define PROBE_RETRY_MS 200

struct probe {
    spreq *q;
    uv_timer_t timer, retry;
    uv_loop_t *loop;
    const auth *auth;
    char sender[256], host[256];
    int core;
    uint64_t nonce, incarnation, deadline;
    probe_cb cb;
    void *arg;
    int done;
    int open;      /* timer handles still open; freed at 0 */
};

static void on_timer_closed(uv_handle_t *h)
{
    struct probe *pr = h->data;
    if (--pr->open == 0)
        free(pr);
}

static void finish(struct probe *pr, int alive)
{
    probe_cb cb = pr->cb;
    void *arg = pr->arg;
    int notify = !pr->done;

    if (pr->done)
        return;
    pr->done = 1;
    if (pr->q) {
        spreq_close(pr->q); /* no callback after this */
        pr->q = NULL;
    }
    uv_close((uv_handle_t *)&pr->timer, on_timer_closed);
    uv_close((uv_handle_t *)&pr->retry, on_timer_closed);
    if (notify && cb)
        cb(arg, alive);
}

static void on_reply(spreq *q, const uint8_t *buf, size_t len)
{
    struct probe *pr = spreq_data(q);
    wire_msg *m = NULL;
    err e;
    int alive;

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

/* Seals a fresh ProbeCore (a new nonce each attempt: the peer refuses the
 * same bytes twice) and sends it. */
static int send_probe(struct probe *pr, err *e)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ProbeCore body = TPUEMU__PROBE_CORE__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;

    m.body_case = TPUEMU__MESSAGE__BODY_PROBE_CORE;
    m.probe_core = &body;
    to.host_id = pr->host;
    to.core = pr->core;
    to.incarnation = pr->incarnation;
    m.recipient = &to;
    if ((rc = wire_seal(pr->auth, pr->sender, &m, &buf, &len, &pr->nonce, e)) != CODE_OK)
        return rc;
    rc = spreq_send(pr->q, buf, len, e);
    free(buf);
    return rc;
}

static void on_retry(uv_timer_t *t)
{
    struct probe *pr = t->data;
    err e;
    if (!pr->done && send_probe(pr, &e) != CODE_OK)
        uv_timer_start(&pr->retry, on_retry, PROBE_RETRY_MS, 0);
}

static void on_lost(spreq *q, const err *why)
{
    struct probe *pr = spreq_data(q);
    (void)why;
    /* refused or broken: try again while the deadline allows; the
     * deadline's timer gives the verdict */
    if (!pr->done && uv_now(pr->loop) + PROBE_RETRY_MS < pr->deadline)
        uv_timer_start(&pr->retry, on_retry, PROBE_RETRY_MS, 0);
}

static void on_timer(uv_timer_t *t)
{
    finish(t->data, 0);
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

struct probe *probe_start(uv_loop_t *loop, const auth *a, const char *sender, const char *control_addr,
                          const char *host, int core, uint64_t incarnation, unsigned timeout_ms, probe_cb cb,
                          void *arg, err *e)
{
    struct spreq_cfg cfg = {0};
    struct probe *pr;

    if (!control_addr || !*control_addr) {
        err_set(e, CODE_FAILED_PRECONDITION, "the peer's control address is unknown");
        return NULL;
    }
    if (!(pr = calloc(1, sizeof *pr))) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a probe");
        return NULL;
    }
    pr->loop = loop;
    pr->auth = a;
    copy_str(pr->sender, sizeof pr->sender, sender ? sender : "");
    copy_str(pr->host, sizeof pr->host, host ? host : "");
    pr->core = core;
    pr->incarnation = incarnation;
    cfg.max_msg = WIRE_MAX_REPLY;
    cfg.on_reply = on_reply;
    cfg.on_lost = on_lost;
    cfg.data = pr;
    if (!(pr->q = spreq_new(loop, control_addr, &cfg, e))) {
        free(pr);
        return NULL;
    }
    uv_timer_init(loop, &pr->timer);
    uv_timer_init(loop, &pr->retry);
    pr->timer.data = pr;
    pr->retry.data = pr;
    pr->open = 2;
    pr->deadline = uv_now(loop) + timeout_ms;
    if (send_probe(pr, e) != CODE_OK) {
        err_prefix(e, "probe to %s", control_addr);
        pr->cb = NULL;
        finish(pr, 0);
        return NULL;
    }
    pr->cb = cb;
    pr->arg = arg;
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
