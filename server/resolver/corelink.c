/* corelink: calls from the resolver to one worker's control port, with a
 * deadline each, over an spreq (one TCP connection, never blocking). */
#include "corelink.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdlimit.h"
#include "log.h"
#include "wire.h"

struct cl_peers *cl_peers_new(const struct peertab_row *rows, size_t n, uint32_t heartbeat_ms,
                              uint32_t dead_after, err *e)
{
    struct cl_peers *p = calloc(1, sizeof *p);
    if (!p) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory listing %zu cores", n);
        return NULL;
    }
    p->refs = 1;
    p->n = n;
    p->heartbeat_ms = heartbeat_ms;
    p->dead_after = dead_after;
    if (peertab_pack(rows, n, &p->table, &p->table_len, e) != CODE_OK) {
        free(p);
        return NULL;
    }
    return p;
}

void cl_peers_unref(struct cl_peers *p)
{
    if (!p || --p->refs > 0)
        return;
    free(p->table);
    free(p);
}

static void pop_head(corelink *l, struct cl_call *out)
{
    *out = l->q[0];
    cl_peers_unref(out->peers);
    out->peers = NULL;
    memmove(&l->q[0], &l->q[1], (size_t)(l->qn - 1) * sizeof l->q[0]);
    l->qn--;
    l->inflight = 0;
    l->opening = 0;
    l->nonce = 0;
    l->lost[0] = '\0';
    l->losses = 0;
}

/* Puts q[0] on the wire. On failure the call is popped and e says why. */
static int send_head(corelink *l, err *e)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ProbeCore probe = TPUEMU__PROBE_CORE__INIT;
    Tpuemu__ResetCore reset = TPUEMU__RESET_CORE__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    struct cl_call *c = &l->q[0], done;
    uint64_t now = wire_now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;

    if (c->deadline_ms <= now) {
        pop_head(l, &done);
        return err_set(e, CODE_DEADLINE_EXCEEDED, "its deadline passed while an earlier call to it waited");
    }
    if (!spreq_is_open(l->rq)) {
        /* sealed once the connection is made (on_open): a reset is large, and
         * one per core waiting for its connection would each be copied */
        if ((rc = spreq_connect(l->rq, e)) != CODE_OK) {
            pop_head(l, &done);
            return rc;
        }
        l->inflight = 1;
        l->opening = 1;
        return CODE_OK;
    }
    if (c->is_probe) {
        m.body_case = TPUEMU__MESSAGE__BODY_PROBE_CORE;
        m.probe_core = &probe;
    } else {
        reset.epoch = c->epoch;
        reset.replica_id = c->replica_id;
        reset.num_replicas = c->num_replicas;
        if (c->peers) {
            reset.peer_table.len = c->peers->table_len;
            reset.peer_table.data = c->peers->table;
            reset.heartbeat_ms = c->peers->heartbeat_ms;
            reset.dead_after = c->peers->dead_after;
            reset.machine_cores = c->peers->machine_cores;
            reset.machine_cpus = c->peers->machine_cpus;
            reset.keep_scheduled_faults = c->peers->keep_faults != 0;
        }
        m.body_case = TPUEMU__MESSAGE__BODY_RESET_CORE;
        m.reset_core = &reset;
    }
    to.host_id = l->host;
    to.core = l->core;
    to.incarnation = l->incarnation;
    m.recipient = &to;
    if ((rc = wire_seal(l->auth, "resolver", &m, &buf, &len, &l->nonce, e)) != CODE_OK) {
        pop_head(l, &done);
        return rc;
    }
    rc = spreq_send(l->rq, buf, len, e);
    free(buf);
    if (rc != CODE_OK) {
        pop_head(l, &done);
        return rc;
    }
    l->inflight = 1;
    return CODE_OK;
}

/* Links with a connection, against the share of the open-file limit the
 * resolver keeps for them (corelink_set_max_sockets). */
static unsigned g_links, g_max_links = 1u << 30;

void corelink_set_max_sockets(unsigned n)
{
    g_max_links = n;
}

static void on_timer(uv_timer_t *t);
static void pump(corelink *l);
static int enqueue(corelink *l, struct cl_call *c, uint32_t timeout_ms, err *e);

/* tag: the link, for its first probe (made at registration); 0 for later ones */
static void keepalive_done(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                           const Tpuemu__WorkerInfo *w)
{
    const corelink *l = (const corelink *)(uintptr_t)tag;
    (void)ctx, (void)idx, (void)w;
    if (code == CODE_OK || code == CODE_CANCELLED)
        return;
    if (l) /* an initialize would fail the same way: said now, with the address */
        log_warn_limited("core's control port does not answer the resolver", "host=%s core=%d control=%s reason=%s",
                         log_q(l->host), l->core, log_q(l->url), log_q(msg));
    else
        log_debug("keep-alive probe of core failed", "code=%d reason=%s", code, log_q(msg));
}

static void keepalive(corelink *l)
{
    struct cl_call c = {.is_probe = 1, .cb = keepalive_done, .tag = l->keepalives ? 0 : (uint64_t)(uintptr_t)l};
    err e;
    if (enqueue(l, &c, CORELINK_KEEPALIVE_TIMEOUT_MS, &e) == CODE_OK)
        l->keepalives++;
}

/* The queue is empty: a kept link waits for its keep-alive. */
static void idle(corelink *l)
{
    if (l->keep && !l->closing && l->qn == 0)
        uv_timer_start(&l->timer, on_timer, l->keep_ms, 0);
}

/* The connection q[0] waited for is made: it goes on the wire now. */
static void on_open(spreq *q)
{
    corelink *l = spreq_data(q);

    if (!l->opening || l->closing || l->qn == 0)
        return;
    l->opening = 0;
    l->inflight = 0;
    pump(l);
}

/* Sends queued calls until one is on the wire; failures complete their call. */
static void pump(corelink *l)
{
    while (l->qn > 0 && !l->inflight && !l->closing) {
        struct cl_call c = l->q[0];
        err e;
        if (send_head(l, &e) == CODE_OK) {
            uv_timer_start(&l->timer, on_timer, l->q[0].deadline_ms - wire_now_ms(), 0);
            return;
        }
        c.cb(l->ctx, c.tag, c.idx, e.code, e.msg, NULL);
    }
    idle(l);
}

/* The call's deadline, or the moment to send it again after its connection
 * was lost. */
static void on_timer(uv_timer_t *t)
{
    corelink *l = t->data;
    uint64_t now = wire_now_ms();
    struct cl_call c;
    char msg[sizeof l->lost + 64];

    if (l->closing)
        return;
    if (l->qn == 0) { /* a kept link idle for keep_ms */
        if (l->keep && spreq_is_open(l->rq))
            keepalive(l);
        return;   /* not connected: the next call connects */
    }
    if (l->q[0].deadline_ms > now) {
        if (!l->inflight)
            pump(l); /* the connection was lost: again, on a new one */
        else         /* fired early by rounding */
            uv_timer_start(&l->timer, on_timer, l->q[0].deadline_ms - now, 0);
        return;
    }
    if (l->lost[0])
        snprintf(msg, sizeof msg, "no answer before the deadline (%s)", l->lost);
    else
        snprintf(msg, sizeof msg, "no answer before the deadline");
    pop_head(l, &c);
    spreq_cancel(l->rq); /* a late reply to it is dropped */
    c.cb(l->ctx, c.tag, c.idx, CODE_DEADLINE_EXCEEDED, msg, NULL);
    pump(l);
}

static void on_reply(spreq *q, const uint8_t *buf, size_t len)
{
    corelink *l = spreq_data(q);
    wire_msg *m = NULL;
    struct cl_call c;
    err e;

    if (wire_open(l->auth, NULL, buf, len, WIRE_MAX_REPLY, &m, &e) != CODE_OK) {
        log_warn_limited("bad reply from core", "control=%s reason=%s", log_q(l->url), log_q(e.msg));
        return; /* the call's deadline will complete it */
    }
    if (!l->inflight || m->request_id != l->nonce) {
        log_debug("stale reply from core dropped", "control=%s", log_q(l->url));
        wire_msg_free(m);
        return;
    }
    uv_timer_stop(&l->timer);
    pop_head(l, &c);
    if (m->body_case == TPUEMU__MESSAGE__BODY_CORE_REPORT && m->core_report && m->core_report->worker) {
        c.cb(l->ctx, c.tag, c.idx, CODE_OK, "", m->core_report->worker);
    } else if (m->body_case == TPUEMU__MESSAGE__BODY_ERROR && m->error) {
        int code = (int)m->error->code == CODE_OK ? CODE_UNKNOWN : (int)m->error->code;
        c.cb(l->ctx, c.tag, c.idx, code, m->error->message ? m->error->message : "", NULL);
    } else {
        char msg[128];
        snprintf(msg, sizeof msg, "unexpected '%s' reply", wire_body_name(m));
        c.cb(l->ctx, c.tag, c.idx, CODE_INTERNAL, msg, NULL);
    }
    wire_msg_free(m);
    pump(l);
}

/* The call on the wire will get no answer (the core's connection broke or
 * could not be made): it is sent again on a new one after a pause, until its
 * deadline; the reason goes into the deadline's error. */
static void on_lost(spreq *q, const err *e)
{
    corelink *l = spreq_data(q);
    uint64_t now = wire_now_ms(), wait;

    if (!l->inflight || l->closing || l->qn == 0)
        return;
    l->inflight = 0;
    l->opening = 0;
    l->nonce = 0;
    snprintf(l->lost, sizeof l->lost, "%.*s", (int)sizeof l->lost - 1, e->msg);
    /* CORELINK_RETRY_MS, doubling with each loss of the same call: a core
     * that refuses the call by closing is not sent it several times a second */
    unsigned pause = CORELINK_RETRY_MS << (l->losses < 4 ? l->losses : 4);
    l->losses++;
    wait = l->q[0].deadline_ms > now ? l->q[0].deadline_ms - now : 0;
    uv_timer_start(&l->timer, on_timer, wait < pause ? wait : pause, 0);
}

corelink *corelink_new(uv_loop_t *loop, const auth *a, void *ctx, const char *url, const char *host, int core,
                       uint64_t incarnation, err *e)
{
    corelink *l = calloc(1, sizeof *l);

    if (!l) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    l->auth = a;
    l->ctx = ctx;
    l->loop = loop;
    snprintf(l->url, sizeof l->url, "%s", url);
    snprintf(l->host, sizeof l->host, "%s", host);
    l->core = core;
    l->incarnation = incarnation;
    uint32_t h = 2166136261u; /* FNV-1a of the address and core: the jitter */
    for (const char *p = url; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ (uint32_t)core) * 16777619u;
    l->keep_ms = CORELINK_KEEPALIVE_MS + h % CORELINK_KEEPALIVE_JITTER_MS;
    if (g_links >= g_max_links) {
        err_set(e, CODE_RESOURCE_EXHAUSTED,
                "the resolver's open-file limit (%ld) leaves room for links to %u cores, and they are all in "
                "use (the rest is kept for connections from workers and clients): raise its open-file limit "
                "(LimitNOFILE=, ulimit -n, docker --ulimit nofile=) or run fewer cores",
                fdlimit_current(), g_max_links);
        free(l);
        return NULL;
    }
    struct spreq_cfg qc = {.max_msg = WIRE_MAX_REPLY, .on_reply = on_reply, .on_lost = on_lost, .on_open = on_open, .data = l};
    if (!(l->rq = spreq_new(loop, url, &qc, e))) {
        free(l);
        return NULL;
    }
    g_links++;
    uv_timer_init(loop, &l->timer);
    l->timer.data = l;
    l->open_handles++;
    return l;
}

int corelink_is_open(const corelink *l)
{
    return !l->closing && spreq_is_open(l->rq);
}

void corelink_keep_open(corelink *l)
{
    if (l->keep || l->closing)
        return;
    l->keep = 1;
    if (l->qn == 0)
        keepalive(l);
}

static int enqueue(corelink *l, struct cl_call *c, uint32_t timeout_ms, err *e)
{
    if (l->closing || l->qn >= CORELINK_QUEUE) {
        cl_peers_unref(c->peers); /* not queued: the call's reference goes */
        if (l->closing)
            return err_set(e, CODE_UNAVAILABLE, "connection to %s is closing", l->url);
        return err_set(e, CODE_UNAVAILABLE, "%d calls to %s are already waiting", l->qn, l->url);
    }
    c->deadline_ms = wire_now_ms() + timeout_ms;
    l->q[l->qn++] = *c;
    if (!l->inflight) {
        int rc = send_head(l, e);
        if (rc != CODE_OK) {
            idle(l);
            return rc;
        }
        uv_timer_start(&l->timer, on_timer, timeout_ms, 0);
    }
    return CODE_OK;
}

int corelink_probe(corelink *l, uint32_t timeout_ms, corelink_cb cb, uint64_t tag, int idx, err *e)
{
    struct cl_call c = {.is_probe = 1, .cb = cb, .tag = tag, .idx = idx};
    return enqueue(l, &c, timeout_ms, e);
}

int corelink_reset(corelink *l, uint64_t epoch, int32_t replica_id, uint32_t num_replicas,
                   struct cl_peers *peers, uint32_t timeout_ms, corelink_cb cb, uint64_t tag, int idx,
                   err *e)
{
    struct cl_call c = {.epoch = epoch, .replica_id = replica_id, .num_replicas = num_replicas,
                        .peers = peers, .cb = cb, .tag = tag, .idx = idx};
    if (peers)
        peers->refs++;
    return enqueue(l, &c, timeout_ms, e);
}

static void one_closed(corelink *l)
{
    if (--l->open_handles > 0)
        return;
    for (int i = 0; i < l->qn; i++)
        cl_peers_unref(l->q[i].peers);
    for (int i = 0; i < l->qn; i++)
        l->q[i].cb(l->ctx, l->q[i].tag, l->q[i].idx, CODE_CANCELLED,
                   "the connection to the core was closed (the core was replaced or the resolver "
                   "is stopping)", NULL);
    free(l);
}

static void on_timer_closed(uv_handle_t *h)
{
    one_closed(h->data);
}

void corelink_close(corelink *l)
{
    if (l->closing)
        return;
    l->closing = 1;
    uv_timer_stop(&l->timer);
    spreq_close(l->rq);
    l->rq = NULL;
    g_links--;
    uv_close((uv_handle_t *)&l->timer, on_timer_closed);
}
