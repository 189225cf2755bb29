/* One control-plane call: seal the request, send it on a cooked REQ socket,
 * wait for the reply within a deadline, open it and turn an error body into
 * an error. Also the plain TCP connect check that tells a dead endpoint fast,
 * before nanomsg would quietly keep reconnecting. Blocking; no threads. */
#include "client.h"
#include "nnuv.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

static uint32_t remaining(uint64_t deadline)
{
    uint64_t now = wire_now_ms();
    return now >= deadline ? 0 : (uint32_t)(deadline - now);
}

/* Non-blocking TCP connect to host:port within timeout_ms. */
static int tcp_probe(const addr *a, const char *ep, uint32_t timeout_ms, err *e)
{
    struct addrinfo hints, *res = NULL, *ai;
    char port[16];
    int rc, refused = 0, last_errno = 0;
    uint64_t deadline = wire_now_ms() + timeout_ms;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", a->port);
    rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc != 0)
        return err_set(e, CODE_UNAVAILABLE, "cannot resolve the resolver address %s: %s; check --tpu / $TPU_NAME",
                       ep, gai_strerror(rc));
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            do {
                rc = poll(&p, 1, (int)remaining(deadline));
            } while (rc < 0 && errno == EINTR);
            if (rc == 0) {
                close(fd);
                freeaddrinfo(res);
                return err_set(e, CODE_UNAVAILABLE, "the resolver at %s did not answer within %u ms",
                               ep, timeout_ms);
            }
            if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                rc = 0;
            else {
                errno = soerr ? soerr : errno;
                rc = -1;
            }
        }
        if (rc == 0) {
            close(fd);
            freeaddrinfo(res);
            return CODE_OK;
        }
        last_errno = errno;
        if (errno == ECONNREFUSED)
            refused = 1;
        close(fd);
    }
    freeaddrinfo(res);
    if (refused)
        return err_set(e, CODE_UNAVAILABLE,
                       "nothing is listening at %s (connection refused); start tpu-resolver there "
                       "or set --tpu / $TPU_NAME", ep);
    return err_set(e, CODE_UNAVAILABLE, "cannot connect to the resolver at %s: %s; check --tpu / $TPU_NAME",
                   ep, strerror(last_errno));
}

void call_close(tpu_cluster *c)
{
    if (c->sock >= 0)
        nn_close(c->sock);
    c->sock = -1;
}

int call_open(tpu_cluster *c, size_t i, uint32_t timeout_ms, err *e)
{
    const addr *a = &c->r->eps[i];
    char url[ADDR_HOST_MAX + 32];
    int s;
    int rc;

    call_close(c);
    c->ep = i;
    if ((rc = tcp_probe(a, c->r->ep_str[i], timeout_ms, e)) != CODE_OK)
        return rc;
    s = nn_socket(AF_SP, NN_REQ);
    if (s < 0)
        return err_set(e, CODE_INTERNAL, "nanomsg socket: %s", nn_strerror(nn_errno()));
    addr_nn_url(a->host, a->port, url, sizeof url);
    if (nnuv_sockopts(s, WIRE_MAX_REPLY, e) != CODE_OK || nnuv_connect(s, url, e) != CODE_OK) {
        nn_close(s);
        return e->code;
    }
    c->sock = s;
    return CODE_OK;
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
    int rc, to, ivl, resends = 0;
    wire_msg *m = NULL;
    char ignored[ERR_MSG_MAX] = "";

    *reply = NULL;
    *transient = 0;
    if (c->sock < 0)
        return err_set(e, CODE_UNAVAILABLE, "not connected to the resolver at %s", ep);
    if ((rc = wire_seal(&c->r->auth, c->r->sender, req, &buf, &len, &nonce, e)) != CODE_OK)
        return rc;
    to = (int)timeout_ms;
    /* No timed resends: one request per call. (A resend after a reconnect is
     * answered from the resolver's duplicate-request cache.) */
    ivl = timeout_ms > 2000000000u ? 2000000000 : (int)timeout_ms + 1000;
    nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &to, sizeof to);
    nn_setsockopt(c->sock, NN_REQ, NN_REQ_RESEND_IVL, &ivl, sizeof ivl);
    while ((rc = nn_send(c->sock, buf, len, 0)) < 0 && nn_errno() == EINTR && remaining(deadline))
        ;
    if (rc < 0) {
        if (nn_errno() == ETIMEDOUT || nn_errno() == EINTR)
            rc = err_set(e, CODE_UNAVAILABLE, "the resolver at %s did not take the request within %u ms",
                         ep, timeout_ms);
        else
            rc = err_set(e, CODE_UNAVAILABLE, "sending to the resolver at %s: %s", ep,
                         nn_strerror(nn_errno()));
        goto out;
    }
    for (;;) {
        void *msg = NULL;
        uint32_t left = remaining(deadline);
        int n;

        if (left == 0) {
            rc = no_answer(c, timeout_ms, ignored, e);
            goto out;
        }
        to = (int)left;
        nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to);
        n = nn_recv(c->sock, &msg, NN_MSG, 0);
        if (n < 0) {
            int en = nn_errno();
            if (en == EINTR)
                continue;
            if (en == ETIMEDOUT)
                rc = no_answer(c, timeout_ms, ignored, e);
            else
                rc = err_set(e, CODE_UNAVAILABLE, "receiving from the resolver at %s: %s", ep,
                             nn_strerror(en));
            goto out;
        }
        rc = wire_open(&c->r->auth, NULL, msg, (size_t)n, WIRE_MAX_REPLY, &m, e);
        if (rc != CODE_OK) {
            rc = open_failed(c, msg, (size_t)n, e);
            nn_freemsg(msg);
            goto out;
        }
        nn_freemsg(msg);
        /* Only the answer to this request counts: not a late one to an older
         * request, nor a refusal that answers no request (id 0), nor an old
         * reply replayed on the path. The REQ socket took it as the reply,
         * so send the same bytes again: if the resolver has handled them, it
         * answers from its duplicate-request cache; if not, it handles them. */
        if (m->request_id == nonce)
            break;
        if (m->request_id == 0 && m->body_case == TPUEMU__MESSAGE__BODY_ERROR && m->error)
            snprintf(ignored, sizeof ignored, "%s", m->error->message ? m->error->message : "");
        wire_msg_free(m);
        m = NULL;
        if (resends++ < 3 && nn_send(c->sock, buf, len, 0) < 0 && nn_errno() != EINTR) {
            rc = err_set(e, CODE_UNAVAILABLE, "sending to the resolver at %s: %s", ep,
                         nn_strerror(nn_errno()));
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
    if (c->sock < 0 && (rc = call_open(c, c->ep, timeout_ms, e)) != CODE_OK)
        return rc;
    rc = call_once(c, req, want, timeout_ms, reply, &transient, e);
    /* a replay refusal (our resend's answer forgotten) or clocks apart: once
     * more with a fresh request, which the resolver did not act on before */
    if (transient)
        rc = call_once(c, req, want, timeout_ms, reply, &transient, e);
    /* After a call that got no answer, a late reply could still arrive on this
     * REQ socket; nanomsg 1.1.5 frees such a reply twice once the socket has
     * moved on to a new request. Dial afresh for the next call instead. */
    if (rc == CODE_UNAVAILABLE)
        call_close(c);
    return rc;
}
