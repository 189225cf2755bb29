/* Heartbeat to the resolver over an spreq (one TCP connection speaking
 * nanomsg's REQ protocol, on the loop). */
#include "heartbeat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "wire.h"

#define UNREACHABLE_TICKS 3
#define HB_MIN_MS 50
#define HB_MAX_MS 60000

#define HB_STRIKES 3           /* replies in a row saying the token or version differs */
#define HB_WARN_EVERY_MS 60000u /* a transient refusal that lasts is logged this often */

/* Refusals of our own, authenticated request that retrying cannot fix. */
static int is_fatal(int code)
{
    return code == CODE_ALREADY_EXISTS || code == CODE_INVALID_ARGUMENT;
}

static void fatal(struct heartbeat *hb, int code, const char *msg)
{
    log_error("resolver refused this worker", "code=%s resolver=%s reason=%s", code_name(code),
              log_q(hb->env.resolver_url), log_q(msg));
    fprintf(stderr, "tpu-worker: %s: %s\n", code_name(code), msg);
    hb->env.refused(hb->env.arg, 3);
}

static void on_msg(spreq *q, const uint8_t *buf, size_t len);
static void on_lost(spreq *q, const err *e);

static void close_sock(struct heartbeat *hb)
{
    if (hb->rq) {
        spreq_close(hb->rq);
        hb->rq = NULL;
    }
}

/* The link to the resolver; it connects on the first send. */
static int open_sock(struct heartbeat *hb, err *e)
{
    struct spreq_cfg qc = {.max_msg = WIRE_MAX_REPLY, .on_reply = on_msg, .on_lost = on_lost, .data = hb};
    if (!(hb->rq = spreq_new(hb->env.loop, hb->env.resolver_url, &qc, e))) {
        err_prefix(e, "--resolver");
        return e->code;
    }
    return CODE_OK;
}

/* Milliseconds to the next multiple of the interval on the wall clock. Every
 * worker heartbeats on the same beat, so the resolver (and nanomsg's I/O thread)
 * wakes once for a burst of heartbeats instead of once per worker: with 64
 * workers that cuts the resolver's context switches, which dominate its CPU use,
 * several times over. */
static uint64_t to_next_beat(uint32_t ms)
{
    return ms - wire_now_unix_ms() % ms;
}

static void tick(uv_timer_t *t)
{
    struct heartbeat *hb = t->data;
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Heartbeat body = TPUEMU__HEARTBEAT__INIT;
    Tpuemu__WorkerInfo info = TPUEMU__WORKER_INFO__INIT;
    uint8_t *buf;
    size_t len;
    err e;

    uv_timer_start(&hb->timer, tick, to_next_beat(hb->interval_ms), 0);
    log_flush_suppressed(0); /* a flood of refusals that stopped is summed up */
    if (hb->last_nonce) {
        if (++hb->unanswered >= UNREACHABLE_TICKS && !hb->unreachable) {
            hb->unreachable = 1;
            log_warn("resolver unreachable", "resolver=%s missed=%u heartbeat_ms=%u",
                     log_q(hb->env.resolver_url), hb->unanswered, hb->interval_ms);
        }
        /* a new heartbeat replaces the unanswered one on the same connection
         * (a late reply to it is dropped): a slow resolver is not made
         * slower by reconnections. Only a connection silent for
         * UNREACHABLE_TICKS beats in a row is made anew, in case it is half
         * open (the resolver's host gone without a reset). */
        if (hb->unanswered % UNREACHABLE_TICKS == 0)
            close_sock(hb);
        hb->last_nonce = 0;
    }
    if (!hb->rq && open_sock(hb, &e) != CODE_OK) {
        log_error("cannot open the heartbeat link", "reason=%s", log_q(e.msg));
        return;
    }
    hb->env.info(hb->env.arg, &info);
    body.worker = &info;
    m.body_case = TPUEMU__MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &body;
    int64_t step = wire_clock_stepped_ms();
    if (step)
        log_warn("the wall clock stepped; messages keep the time they had", "step_ms=%lld", (long long)step);
    if (wire_seal(hb->env.auth, hb->env.id->sender, &m, &buf, &len, &hb->last_nonce, &e) != CODE_OK) {
        log_error("cannot build a heartbeat", "reason=%s", log_q(e.msg));
        return;
    }
    hb->asked_ms = wire_now_ms();
    if (spreq_send(hb->rq, buf, len, &e) != CODE_OK)
        log_debug("heartbeat not sent", "reason=%s", log_q(e.msg));
    else
        prom_add(&hb->sent, 1);
    free(buf);
}

static void adopt_interval(struct heartbeat *hb, uint32_t ms)
{
    if (ms < HB_MIN_MS || ms > HB_MAX_MS || ms == hb->interval_ms)
        return;
    log_info("heartbeat interval", "from_ms=%u to_ms=%u", hb->interval_ms, ms);
    hb->interval_ms = ms;
    uv_timer_start(&hb->timer, tick, to_next_beat(ms), 0);
}

static void on_reply(struct heartbeat *hb, const Tpuemu__HeartbeatReply *r)
{
    struct core_ident *id = hb->env.id;

    if (r->core < 0 || r->core > 1023 || (id->core >= 0 && r->core != id->core)) {
        log_warn("resolver assigned an unexpected core; ignoring the reply", "core=%d asked=%d",
                 (int)r->core, id->core);
        return;
    }
    prom_add(&hb->acked, 1);
    ident_set_core(id, r->core);
    if (!hb->registered)
        log_info("registered", "host=%s core=%d resolver=%s system_epoch=%llu", log_q(id->host_id),
                 id->core, log_q(hb->env.resolver_url), (unsigned long long)r->system_epoch);
    else if (hb->unreachable || hb->last_error)
        log_info("resolver reachable again", "host=%s core=%d resolver=%s", log_q(id->host_id),
                 id->core, log_q(hb->env.resolver_url));
    hb->registered = 1;
    hb->unreachable = 0;
    hb->last_error = 0;
    adopt_interval(hb, r->heartbeat_ms);
}

/* A reply says the token or the protocol version differs: fatal only when it
 * keeps saying so, so that no single message (a stranger's, or garbage on the
 * path) stops the worker. */
static void strike(struct heartbeat *hb, int code, const char *why)
{
    char msg[ERR_MSG_MAX + 600];

    hb->last_nonce = 0;
    hb->unanswered = 0;
    if (++hb->strikes < HB_STRIKES) {
        log_warn("heartbeat reply refused; retrying", "code=%s strikes=%u reason=%s", code_name(code),
                 hb->strikes, log_q(why));
        return;
    }
    if (code == CODE_UNAUTHENTICATED)
        snprintf(msg, sizeof msg, "the resolver at %s and this worker do not share the cluster token "
                 "(%u replies in a row: %s); check --token-file / $TPUEMU_TOKEN here and on the "
                 "resolver: every daemon and client needs the same token", hb->env.resolver_url,
                 hb->strikes, why);
    else
        snprintf(msg, sizeof msg, "reply from the resolver at %s (%u in a row): %s", hb->env.resolver_url,
                 hb->strikes, why);
    fatal(hb, code, msg);
}

/* A refusal that a fresh heartbeat may not meet: a replay (the original's
 * answer was lost and forgotten), clocks more than the window apart, the
 * resolver busy or restarting. */
static void transient(struct heartbeat *hb, int code, const char *msg)
{
    uint64_t now = wire_now_ms();

    if (code == hb->last_error && now - hb->last_warn_ms < HB_WARN_EVERY_MS)
        return;
    hb->last_error = code;
    hb->last_warn_ms = now;
    log_at(code == CODE_UNAVAILABLE ? LOG_INFO : LOG_WARN, "heartbeat refused; retrying",
           "code=%s resolver=%s reason=%s", code_name(code), log_q(hb->env.resolver_url), log_q(msg));
}

/* The answer to the Leave (or its deadline): the last thing the heartbeat does. */
static void leave_done(struct heartbeat *hb, const wire_msg *m)
{
    if (!m)
        log_warn("the resolver did not answer this core's leave; it will show it dead, then forget it",
                 "resolver=%s waited_ms=%u", log_q(hb->env.resolver_url), HB_LEAVE_MS);
    else if (m->body_case == TPUEMU__MESSAGE__BODY_LEAVE_REPLY)
        log_info("left the cluster", "host=%s core=%d resolver=%s", log_q(hb->env.id->host_id),
                 hb->env.id->core, log_q(hb->env.resolver_url));
    else
        log_warn("the resolver refused this core's leave", "code=%s reason=%s",
                 code_name(m->error ? (int)m->error->code : CODE_UNKNOWN),
                 log_q(m->error && m->error->message ? m->error->message : wire_body_name(m)));
    hb->leaving = 0;
    hb_stop(hb);
}

static void on_leave_timeout(uv_timer_t *t)
{
    leave_done(t->data, NULL);
}

/* The connection broke or could not be made: the next beat sends again,
 * on a new one. */
static void on_lost(spreq *q, const err *e)
{
    struct heartbeat *hb = spreq_data(q);
    if (hb->leaving)
        return; /* the deadline decides */
    log_debug("heartbeat lost", "reason=%s", log_q(e->msg));
}

static void on_msg(spreq *q, const uint8_t *buf, size_t len)
{
    struct heartbeat *hb = spreq_data(q);
    wire_msg *m;
    err e;

    if (hb->leaving) {
        if (wire_open(hb->env.auth, NULL, buf, len, WIRE_MAX_REPLY, &m, &e) != CODE_OK)
            return; /* the deadline decides */
        if (m->request_id == hb->last_nonce)
            leave_done(hb, m);
        wire_msg_free(m);
        return;
    }
    if (wire_open(hb->env.auth, NULL, buf, len, WIRE_MAX_REPLY, &m, &e) != CODE_OK) {
        if (e.code == CODE_UNAUTHENTICATED || e.code == CODE_FAILED_PRECONDITION)
            strike(hb, e.code, e.msg);
        else
            log_warn_limited("unreadable reply from the resolver", "resolver=%s reason=%s",
                     log_q(hb->env.resolver_url), log_q(e.msg));
        return;
    }
    /* Only the answer to the request in flight counts: not a late one, nor a
     * refusal of a message the resolver could not read (request_id 0), nor an
     * old reply replayed by someone on the path. */
    if (!hb->last_nonce || m->request_id != hb->last_nonce) {
        uint64_t now = wire_now_ms();
        if (m->request_id == 0 && m->body_case == TPUEMU__MESSAGE__BODY_ERROR && m->error &&
            now - hb->last_warn_ms >= HB_WARN_EVERY_MS) {
            hb->last_warn_ms = now;
            log_warn_limited("ignored a refusal that answers none of our heartbeats", "resolver=%s reason=%s",
                     log_q(hb->env.resolver_url), log_q(m->error->message ? m->error->message : ""));
        } else {
            log_debug("stale heartbeat reply ignored", NULL);
        }
        goto out;
    }
    hb->last_nonce = 0;
    hb->unanswered = 0;
    /* the resolver's signed answer to this very heartbeat says what time it
     * is there: with a token, messages are dated by it */
    if (hb->env.auth->enabled) {
        int64_t off = wire_clock_follow(m->sent_unix_ms, hb->asked_ms, wire_now_ms());
        if (off)
            log_warn("this worker's clock and the resolver's disagree; messages are dated by the resolver's",
                     "off_ms=%lld resolver=%s", (long long)off, log_q(hb->env.resolver_url));
    }
    switch (m->body_case) {
    case TPUEMU__MESSAGE__BODY_HEARTBEAT_REPLY:
        hb->strikes = 0;
        on_reply(hb, m->heartbeat_reply);
        break;
    case TPUEMU__MESSAGE__BODY_ERROR: {
        int code = m->error ? (int)m->error->code : CODE_UNKNOWN;
        const char *msg = m->error && m->error->message ? m->error->message : "";
        if (is_fatal(code)) {
            fatal(hb, code, msg);
        } else if (code == CODE_FAILED_PRECONDITION || (code == CODE_UNAUTHENTICATED && !hb->env.auth->enabled)) {
            /* another protocol version, or a resolver that wants a token we lack */
            strike(hb, code, msg);
        } else {
            /* with a token, a reply that authenticates says the tokens match:
             * UNAUTHENTICATED is then a replay or the clocks, never the token */
            if (hb->env.auth->enabled)
                hb->strikes = 0;
            transient(hb, code, msg);
        }
        break;
    }
    default:
        log_warn("unexpected reply to a heartbeat", "body=%s", log_q(wire_body_name(m)));
    }
out:
    wire_msg_free(m);
}

void hb_init(struct heartbeat *hb, const struct hb_env *env)
{
    memset(hb, 0, sizeof *hb);
    hb->env = *env;
    hb->interval_ms = 1000;
    atomic_init(&hb->sent, 0);
    atomic_init(&hb->acked, 0);
}

int hb_start(struct heartbeat *hb, err *e)
{
    int rc;

    if ((rc = open_sock(hb, e)) != CODE_OK)
        return rc;
    uv_timer_init(hb->env.loop, &hb->timer);
    hb->timer.data = hb;
    hb->started = 1;
    uv_timer_start(&hb->timer, tick, 0, 0); /* register at once, then on the beat */
    return CODE_OK;
}

void hb_stop(struct heartbeat *hb)
{
    if (!hb->started)
        return;
    hb->started = 0;
    uv_timer_stop(&hb->timer);
    uv_close((uv_handle_t *)&hb->timer, NULL);
    close_sock(hb);
}

void hb_beat_now(struct heartbeat *hb)
{
    /* a heartbeat in flight carries the news at the next beat: one sent now
     * would count it as unanswered */
    if (hb->started && !hb->leaving && hb->registered && !hb->last_nonce)
        uv_timer_start(&hb->timer, tick, 0, 0);
}

void hb_leave(struct heartbeat *hb, int preempted)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Leave body = TPUEMU__LEAVE__INIT;
    Tpuemu__CoreRef ref = TPUEMU__CORE_REF__INIT;
    const struct core_ident *id = hb->env.id;
    uint8_t *buf = NULL;
    size_t len;
    err e;

    if (!hb->started || hb->leaving)
        return;
    /* never registered, or the resolver is not answering: nothing to tell */
    if (!hb->registered || hb->unreachable || id->core < 0) {
        hb_stop(hb);
        return;
    }
    uv_timer_stop(&hb->timer);
    hb->last_nonce = 0; /* the Leave replaces an unanswered heartbeat */
    ref.host_id = (char *)id->host_id;
    ref.core = id->core;
    ref.incarnation = id->incarnation;
    body.core = &ref;
    body.preempted = preempted != 0;
    m.body_case = TPUEMU__MESSAGE__BODY_LEAVE;
    m.leave = &body;
    if ((!hb->rq && open_sock(hb, &e) != CODE_OK) ||
        wire_seal(hb->env.auth, id->sender, &m, &buf, &len, &hb->last_nonce, &e) != CODE_OK ||
        spreq_send(hb->rq, buf, len, &e) != CODE_OK) {
        log_warn("cannot tell the resolver this core leaves", "reason=%s", log_q(e.msg));
        free(buf);
        hb_stop(hb);
        return;
    }
    free(buf);
    hb->leaving = 1;
    uv_timer_start(&hb->timer, on_leave_timeout, HB_LEAVE_MS, 0);
}
