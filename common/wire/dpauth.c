/* Data-plane handshake frames, and the blocking connecting side for tools. */
#include "dpauth.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "wire.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k

size_t dpauth_hello(const unsigned char chal[AUTH_CHALLENGE_BYTES], uint8_t *out, size_t cap)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    h.kind = KIND(HELLO);
    h.challenge.data = (uint8_t *)chal;
    h.challenge.len = AUTH_CHALLENGE_BYTES;
    return frame_encode(&h, out, cap);
}

size_t dpauth_auth(const auth *a, const unsigned char server_chal[AUTH_CHALLENGE_BYTES],
                   const unsigned char my_chal[AUTH_CHALLENGE_BYTES], const char *peer, uint8_t *out,
                   size_t cap)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    unsigned char mac[AUTH_MAC_BYTES];
    char p[128];

    h.kind = KIND(AUTH);
    if (a && a->enabled) {
        auth_challenge_mac(a, server_chal, mac);
        h.mac.data = mac;
        h.mac.len = sizeof mac;
    }
    h.challenge.data = (uint8_t *)my_chal;
    h.challenge.len = AUTH_CHALLENGE_BYTES;
    snprintf(p, sizeof p, "%s", peer ? peer : "");
    h.peer = p;
    h.replica = -1; /* a client (tools, libtpuclient); cores dial each other through dp_conn */
    return frame_encode(&h, out, cap);
}

size_t dpauth_auth_ok(const auth *a, const unsigned char client_chal[AUTH_CHALLENGE_BYTES],
                      uint8_t *out, size_t cap)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    unsigned char mac[AUTH_MAC_BYTES];

    h.kind = KIND(AUTH_OK);
    if (a && a->enabled) {
        auth_challenge_mac(a, client_chal, mac);
        h.mac.data = mac;
        h.mac.len = sizeof mac;
    }
    return frame_encode(&h, out, cap);
}

size_t dpauth_error(int code, const char *msg, uint8_t *out, size_t cap)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;
    char m[DPAUTH_ERROR_MSG_MAX + 1];

    snprintf(m, sizeof m, "%s", msg ? msg : "");
    st.code = (Tpuemu__Code)code;
    st.message = m;
    h.kind = KIND(ERROR);
    h.status = &st;
    return frame_encode(&h, out, cap);
}

int dpauth_check_auth(const auth *a, const unsigned char server_chal[AUTH_CHALLENGE_BYTES],
                      const Tpuemu__FrameHeader *h, unsigned char client_chal[AUTH_CHALLENGE_BYTES],
                      err *e)
{
    if (h->kind != KIND(AUTH))
        return err_set(e, CODE_UNAUTHENTICATED,
                       "data-plane authentication failed: expected an AUTH frame, got kind %d",
                       (int)h->kind);
    if (h->challenge.len != AUTH_CHALLENGE_BYTES)
        return err_set(e, CODE_UNAUTHENTICATED,
                       "data-plane authentication failed: the peer's challenge has %zu bytes, not %d",
                       h->challenge.len, AUTH_CHALLENGE_BYTES);
    if (a && a->enabled) {
        if (h->mac.len == 0)
            return err_set(e, CODE_UNAUTHENTICATED,
                           "data-plane authentication failed: the peer sent no MAC but this cluster "
                           "requires its token; give it --token-file or $TPUEMU_TOKEN");
        if (!auth_challenge_mac_ok(a, server_chal, h->mac.data, h->mac.len))
            return err_set(e, CODE_UNAUTHENTICATED,
                           "data-plane authentication failed: wrong MAC (the peer uses a different "
                           "cluster token)");
    }
    memcpy(client_chal, h->challenge.data, AUTH_CHALLENGE_BYTES);
    return CODE_OK;
}

int dpauth_check_hello(const Tpuemu__FrameHeader *h, unsigned char server_chal[AUTH_CHALLENGE_BYTES],
                       err *e)
{
    if (h->kind == KIND(ERROR) && h->status)
        return err_set(e, h->status->code ? (int)h->status->code : CODE_UNKNOWN, "%s",
                       h->status->message ? h->status->message : "");
    if (h->kind != KIND(HELLO) || h->challenge.len != AUTH_CHALLENGE_BYTES)
        return err_set(e, CODE_UNAVAILABLE,
                       "the data-plane peer did not start with a HELLO frame (kind %d); is it a "
                       "tpu-worker?", (int)h->kind);
    memcpy(server_chal, h->challenge.data, AUTH_CHALLENGE_BYTES);
    return CODE_OK;
}

int dpauth_check_auth_ok(const auth *a, const unsigned char my_chal[AUTH_CHALLENGE_BYTES],
                         const Tpuemu__FrameHeader *h, err *e)
{
    if (h->kind == KIND(ERROR))
        return err_set(e, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, "%s",
                       h->status && h->status->message ? h->status->message
                                                       : "the data-plane peer refused the connection");
    if (h->kind != KIND(AUTH_OK))
        return err_set(e, CODE_UNAVAILABLE,
                       "the data-plane peer answered AUTH with frame kind %d, not AUTH_OK", (int)h->kind);
    if (a && a->enabled) {
        if (h->mac.len == 0)
            return err_set(e, CODE_UNAUTHENTICATED,
                           "the data-plane peer has no cluster token but this side uses one");
        if (!auth_challenge_mac_ok(a, my_chal, h->mac.data, h->mac.len))
            return err_set(e, CODE_UNAUTHENTICATED,
                           "the data-plane peer uses a different cluster token (its AUTH_OK MAC is "
                           "wrong)");
    }
    return CODE_OK;
}

static int wait_fd(int fd, short ev, uint64_t deadline_ms, err *e)
{
    for (;;) {
        uint64_t now = wire_now_ms();
        struct pollfd p = {fd, ev, 0};
        int rc;
        if (now >= deadline_ms)
            return err_set(e, CODE_DEADLINE_EXCEEDED, "the data-plane peer did not answer in time");
        rc = poll(&p, 1, (int)(deadline_ms - now));
        if (rc > 0)
            return CODE_OK;
        if (rc < 0 && errno != EINTR)
            return err_set(e, CODE_UNAVAILABLE, "poll: %s", strerror(errno));
    }
}

int dpauth_read_all(int fd, void *buf, size_t len, uint64_t deadline_ms, err *e)
{
    size_t got = 0;
    int rc;
    while (got < len) {
        if ((rc = wait_fd(fd, POLLIN, deadline_ms, e)) != CODE_OK)
            return rc;
        ssize_t n = recv(fd, (char *)buf + got, len - got, MSG_DONTWAIT);
        if (n == 0)
            return err_set(e, CODE_UNAVAILABLE, "the data-plane peer closed the connection");
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            return err_set(e, CODE_UNAVAILABLE, "data-plane read: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    return CODE_OK;
}

int dpauth_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ms, err *e)
{
    size_t put = 0;
    int rc;
    while (put < len) {
        if ((rc = wait_fd(fd, POLLOUT, deadline_ms, e)) != CODE_OK)
            return rc;
        ssize_t n = send(fd, (const char *)buf + put, len - put, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            return err_set(e, CODE_UNAVAILABLE, "data-plane write: %s", strerror(errno));
        }
        put += (size_t)n;
    }
    return CODE_OK;
}

int dpauth_read_header(int fd, uint64_t deadline_ms, uint64_t max_payload, Tpuemu__FrameHeader **out,
                       err *e)
{
    uint8_t pre[FRAME_PREFIX_BYTES], hdr[FRAME_MAX_HEADER];
    uint32_t hlen;
    int rc;

    *out = NULL;
    if ((rc = dpauth_read_all(fd, pre, sizeof pre, deadline_ms, e)) != CODE_OK ||
        (rc = frame_prefix(pre, &hlen, e)) != CODE_OK ||
        (rc = dpauth_read_all(fd, hdr, hlen, deadline_ms, e)) != CODE_OK)
        return rc;
    return frame_decode(hdr, hlen, max_payload, out, e);
}

int dpauth_client_fd(int fd, const auth *a, const char *peer, int timeout_ms, err *e)
{
    uint64_t deadline = wire_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    unsigned char schal[AUTH_CHALLENGE_BYTES], mine[AUTH_CHALLENGE_BYTES];
    uint8_t buf[DPAUTH_FRAME_MAX];
    Tpuemu__FrameHeader *h = NULL;
    size_t n;
    int rc;

    if ((rc = dpauth_read_header(fd, deadline, 0, &h, e)) != CODE_OK) {
        /* a worker that takes no more connections accepts and closes at once */
        if (rc == CODE_UNAVAILABLE) {
            char cause[ERR_MSG_MAX + 4] = "";
            if (!strstr(e->msg, "closed the connection")) /* a reset rather than a close */
                snprintf(cause, sizeof cause, " (%s)", e->msg);
            err_set(e, rc, "it closed the data connection before the handshake began%s: it takes no more data "
                    "connections now (at its limit of data-plane connections, or shutting down)", cause);
        }
        return rc;
    }
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_ERROR) {
        rc = err_set(e, h->status && h->status->code ? (int)h->status->code : CODE_UNAVAILABLE,
                     "it refused the data connection: %s",
                     h->status && h->status->message && *h->status->message ? h->status->message
                                                                             : "(no reason given)");
        frame_header_free(h);
        return rc;
    }
    rc = dpauth_check_hello(h, schal, e);
    frame_header_free(h);
    if (rc != CODE_OK)
        return rc;
    auth_random(mine, sizeof mine);
    n = dpauth_auth(a, schal, mine, peer, buf, sizeof buf);
    if (n == 0)
        return err_set(e, CODE_INTERNAL, "data-plane AUTH frame does not fit");
    if ((rc = dpauth_write_all(fd, buf, n, deadline, e)) != CODE_OK)
        return rc;
    if ((rc = dpauth_read_header(fd, deadline, 0, &h, e)) != CODE_OK)
        return rc;
    rc = dpauth_check_auth_ok(a, mine, h, e);
    frame_header_free(h);
    return rc;
}
