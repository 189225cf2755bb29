/* One control-plane call: seal the request, send it as an SP request,
 * wait for the reply within a deadline, open it and turn an error body into
 * an error. Over the project's own blocking SP client (spcall.h), which
 * tells a dead endpoint at once and never reconnects outside a call.
 * Blocking; no threads. */
#include "call.h"
#include "spcall.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t remaining(uint64_t deadline)
{
    uint64_t now = wire_now_ms();
    return now >= deadline ? 0 : (uint32_t)(deadline - now);
}

void call_close(tpu_cluster *c)
{
    spcall_close(&c->call);
}

int call_open(tpu_cluster *c, size_t i, uint32_t timeout_ms, err *e)
{
    const addr *a = &c->r->eps[i];
    const char *ep = c->r->ep_str[i];
    int rc, en = 0;

    call_close(c);
    c->ep = i;
    rc = spcall_connect(&c->call, a->host, a->port, timeout_ms, &en, e);
    if (rc == CODE_OK)
        return CODE_OK;
    if (en == ECONNREFUSED)
        return err_set(e, CODE_UNAVAILABLE,
                       "nothing is listening at %s (connection refused); start tpu-resolver there "
                       "or set --tpu / $TPU_NAME", ep);
    if (en == ETIMEDOUT)
        return err_set(e, CODE_UNAVAILABLE, "the resolver at %s did not answer within %u ms", ep, timeout_ms);
    if (en == EPROTO)
        return err_set(e, CODE_UNAVAILABLE, "%s is not a tpu-resolver (it does not speak the control protocol); "
                       "check --tpu / $TPU_NAME", ep);
    if (c->r->list_word[i] && strncmp(e->msg, "cannot resolve ", 15) == 0) {
        /* a TPU name cannot be an item of a list: it was read as a host */
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", e->msg);
        return err_set(
            e, CODE_UNAVAILABLE,
            "cannot reach the resolver: %.400s; '%.256s' in the comma list of --tpu / $TPU_NAME was taken as "
            "a host name with the default port %d (in a list every item is a host, never a TPU name): "
            "write it as HOST:PORT or grpc://HOST:PORT",
            why, a->host, a->port);
    }
    {
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", e->msg);
        return err_set(e, CODE_UNAVAILABLE, "cannot reach the resolver: %s; check --tpu / $TPU_NAME", why);
    }
}

/* Says why a reply failed to open, in terms of the resolver and our token. */
static int open_failed(tpu_cluster *c, const uint8_t *buf, size_t len, err *e)
{
    const char *ep = c->r->ep_str[c->ep];
    if (e->code == CODE_UNAUTHENTICATED) {
        Tpuemu__Envelope *env = tpuemu__envelope__unpack(NULL, len, buf);
        int nomac = env && env->mac.len == 0;
        if (env)
            tpuemu__envelope__free_unpacked(env, NULL);
        if (nomac)
            return err_set(e, CODE_UNAUTHENTICATED,
                           "the resolver at %s has no cluster token but this client uses one "
                           "(unset $TPUEMU_TOKEN / --token-file, or give the resolver the token)", ep);
        return err_set(e, CODE_UNAUTHENTICATED,
                       "the resolver at %s uses a different cluster token (check --token-file / "
                       "$TPUEMU_TOKEN)", ep);
    }
    err_prefix(e, "bad reply from the resolver at %s", ep);
    return e->code;
}

/* No answer by the deadline; says so, and what the resolver refused meanwhile
 * without naming our request (which we did not take as the answer). */
static int no_answer(tpu_cluster *c, uint32_t timeout_ms, const char *ignored, err *e)
{
    const char *ep = c->r->ep_str[c->ep];
    if (*ignored)
        return err_set(e, CODE_UNAVAILABLE, "the resolver at %s did not answer within %u ms (it refused "
                       "a message it could not read: %s)", ep, timeout_ms, ignored);
    return err_set(e, CODE_UNAVAILABLE, "the resolver at %s did not answer within %u ms", ep, timeout_ms);
}

static int cancelled(tpu_cluster *c, const wire_msg *req, err *e)
{
    return err_set(e, CODE_CANCELLED, "the %s call to the resolver at %s was cancelled (tpu_cancel)",
                   wire_body_name(req), c->r->ep_str[c->ep]);
}

/* *transient is set when the resolver answered our request, authenticated
 * under our token, with UNAUTHENTICATED: a replay or clocks apart, which a
 * fresh request may not meet. */
static int call_once(tpu_cluster *c, wire_msg *req, int want, uint32_t timeout_ms, wire_msg **reply,
                     int *transient, err *e)
{
    const char *ep = c->r->ep_str[c->ep];
    uint64_t deadline = wire_now_ms() + timeout_ms, nonce = 0;
    uint8_t *buf = NULL;
    size_t len;
    int rc, resends = 0;
    wire_msg *m = NULL;
    char ignored[ERR_MSG_MAX] = "";

    *reply = NULL;
    *transient = 0;
    if (c->call.fd < 0 && !c->call.peer_len)
        return err_set(e, CODE_UNAVAILABLE, "not connected to the resolver at %s", ep);
    if ((rc = wire_seal(&c->r->auth, c->r->sender, req, &buf, &len, &nonce, e)) != CODE_OK)
        return rc;
    c->last_request_id = nonce;
    for (;;) {
        uint8_t *msg = NULL;
        size_t n = 0;

        if (cli_cancel_requested(&c->cancel)) {
            rc = cancelled(c, req, e);
            goto out;
        }
        if (!remaining(deadline)) {
            rc = no_answer(c, timeout_ms, ignored, e);
            goto out;
        }
        c->call.wake_fd = cli_cancel_fd(&c->cancel);
        rc = spcall_request(&c->call, buf, len, deadline, &msg, &n, e);
        c->call.wake_fd = -1;
        if (rc == CODE_CANCELLED) {
            rc = cancelled(c, req, e);
            goto out;
        }
        if (rc == CODE_DEADLINE_EXCEEDED) {
            rc = no_answer(c, timeout_ms, ignored, e);
            goto out;
        }
        if (rc != CODE_OK) {
            err_prefix(e, "the resolver at %s", ep);
            rc = CODE_UNAVAILABLE;
            e->code = rc;
            goto out;
        }
        rc = wire_open(&c->r->auth, NULL, msg, n, WIRE_MAX_REPLY, &m, e);
        if (rc != CODE_OK) {
            rc = open_failed(c, msg, n, e);
            free(msg);
            goto out;
        }
        free(msg);
        /* Only the answer to this request counts: not a refusal that answers
         * no request (id 0), nor an old reply replayed on the path. Send the
         * same bytes again: if the resolver has handled them, it answers
         * from its duplicate-request cache; if not, it handles them. */
        if (m->request_id == nonce)
            break;
        if (m->request_id == 0 && m->body_case == TPUEMU__MESSAGE__BODY_ERROR && m->error)
            snprintf(ignored, sizeof ignored, "%s", m->error->message ? m->error->message : "");
        wire_msg_free(m);
        m = NULL;
        if (resends++ >= 3) {
            rc = no_answer(c, timeout_ms, ignored, e);
            goto out;
        }
    }
    if (m->body_case == TPUEMU__MESSAGE__BODY_ERROR) {
        int code = m->error ? (int)m->error->code : CODE_UNKNOWN;
        if (code <= CODE_OK || code > CODE_MAX)
            code = CODE_UNKNOWN;
        err_set(e, code, "%s", m->error && m->error->message && *m->error->message
                                   ? m->error->message
                                   : "the resolver reported an error without a message");
        if (code == CODE_UNAUTHENTICATED) /* say who refused */
            err_prefix(e, "the resolver at %s refused the request", ep);
        *transient = code == CODE_UNAUTHENTICATED && c->r->auth.enabled;
        wire_msg_free(m);
        rc = code;
        goto out;
    }
    if ((int)m->body_case != want) {
        err_set(e, CODE_INTERNAL,
                "the resolver at %s answered with a '%s' message; is it the same tpuemu release?", ep,
                wire_body_name(m));
        wire_msg_free(m);
        rc = CODE_INTERNAL;
        goto out;
    }
    *reply = m;
    rc = CODE_OK;
out:
    free(buf);
    return rc;
}

int call_do(tpu_cluster *c, wire_msg *req, int want, uint32_t timeout_ms, wire_msg **reply, err *e)
{
    int rc, transient = 0;

    *reply = NULL;
    if (c->call.fd < 0 && (rc = call_open(c, c->ep, timeout_ms, e)) != CODE_OK)
        return rc;
    rc = call_once(c, req, want, timeout_ms, reply, &transient, e);
    /* a replay refusal (our resend's answer forgotten) or clocks apart: once
     * more with a fresh request, which the resolver did not act on before */
    if (transient)
        rc = call_once(c, req, want, timeout_ms, reply, &transient, e);
    /* After a call that got no answer, dial afresh for the next call (the
     * resolver may have moved, or the connection be half-open). */
    if (rc == CODE_UNAVAILABLE || rc == CODE_CANCELLED)
        call_close(c);
    return rc;
}

void cli_notice_from(const Tpuemu__Notice *n, tpu_notice *out)
{
    memset(out, 0, sizeof *out);
    if (!n || (n->kind != TPUEMU__NOTICE_KIND__NOTICE_PREEMPTION && n->kind != TPUEMU__NOTICE_KIND__NOTICE_MAINTENANCE))
        return;
    out->kind = (tpu_notice_kind)n->kind;
    out->event_in_ms = n->event_in_ms;
    out->window_ms = n->window_ms;
    out->under_way = n->under_way;
}
