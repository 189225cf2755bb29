/* Hand-made wire traffic for the bad-input and security tests. */
#include "raw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

int raw_req_open(const char *addr, int timeout_ms)
{
    char url[300];
    int s = nn_socket(AF_SP, NN_REQ), max = -1;
    if (s < 0)
        return -1;
    snprintf(url, sizeof url, "%s%s", strncmp(addr, "tcp://", 6) ? "tcp://" : "", addr);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max);
    int linger = 0;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_LINGER, &linger, sizeof linger);
    /* no automatic resend: one request, one answer or a timeout */
    int resend = 600000;
    nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend);
    if (nn_connect(s, url) < 0) {
        nn_close(s);
        return -1;
    }
    return s;
}

void raw_req_close(int sock)
{
    if (sock >= 0)
        nn_close(sock);
}

int raw_req_call(int sock, const void *buf, size_t len, uint8_t **reply, size_t *rlen)
{
    void *msg = NULL;
    *reply = NULL;
    *rlen = 0;
    if (nn_send(sock, buf, len, 0) < 0)
        return -1;
    int n = nn_recv(sock, &msg, NN_MSG, 0);
    if (n < 0)
        return -1;
    *reply = malloc((size_t)n + 1);
    memcpy(*reply, msg, (size_t)n);
    *rlen = (size_t)n;
    nn_freemsg(msg);
    return 0;
}

int raw_call_msg(int sock, const auth *a, wire_msg *m, wire_msg **reply, uint64_t *nonce)
{
    uint8_t *buf, *rep;
    size_t len, rlen;
    err e;
    *reply = NULL;
    if (wire_seal(a, "client test", m, &buf, &len, nonce, &e) != CODE_OK)
        return -1;
    int rc = raw_req_call(sock, buf, len, &rep, &rlen);
    free(buf);
    if (rc < 0)
        return -1;
    rc = wire_open(a, NULL, rep, rlen, WIRE_MAX_REPLY, reply, &e);
    free(rep);
    return rc;
}

int raw_seal_at(const auth *a, wire_msg *m, uint64_t sent_unix_ms, uint8_t **out, size_t *len,
                uint64_t *nonce)
{
    err e;
    return wire_seal_at(a, "client test", sent_unix_ms, m, out, len, nonce, &e) == CODE_OK ? 0 : -1;
}

int tcp_connect_addr(const char *hostport, int timeout_ms)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    struct sockaddr_in sa;
    int fd;
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return -1;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int tcp_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int tcp_read_n(int fd, void *buf, size_t n, int timeout_ms)
{
    uint8_t *p = buf;
    while (n > 0) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, timeout_ms);
        if (r <= 0)
            return -1;
        ssize_t got = recv(fd, p, n, 0);
        if (got <= 0)
            return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int tcp_wait_closed(int fd, int timeout_ms)
{
    uint8_t buf[4096];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long left = timeout_ms - ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0)
            return 0;
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got <= 0)
            return 1;
    }
}

int dp_send(int fd, Tpuemu__FrameHeader *h, const void *payload, size_t plen)
{
    uint8_t buf[FRAME_PREFIX_BYTES + FRAME_MAX_HEADER];
    size_t n = frame_encode(h, buf, sizeof buf);
    if (!n || tcp_send_all(fd, buf, n) < 0)
        return -1;
    if (plen && tcp_send_all(fd, payload, plen) < 0)
        return -1;
    return 0;
}

int dp_recv(int fd, int timeout_ms, Tpuemu__FrameHeader **h, uint8_t **payload)
{
    uint8_t pre[FRAME_PREFIX_BYTES], hdr[FRAME_MAX_HEADER];
    uint32_t hlen;
    err e;
    *h = NULL;
    if (payload)
        *payload = NULL;
    if (tcp_read_n(fd, pre, sizeof pre, timeout_ms) < 0 || frame_prefix(pre, &hlen, &e) != CODE_OK ||
        tcp_read_n(fd, hdr, hlen, timeout_ms) < 0 || frame_decode(hdr, hlen, 1u << 20, h, &e) != CODE_OK)
        return -1;
    if ((*h)->payload_bytes) {
        uint8_t *p = malloc((size_t)(*h)->payload_bytes);
        if (tcp_read_n(fd, p, (size_t)(*h)->payload_bytes, timeout_ms) < 0) {
            free(p);
            frame_header_free(*h);
            *h = NULL;
            return -1;
        }
        if (payload)
            *payload = p;
        else
            free(p);
    }
    return 0;
}

int dp_handshake(const char *data_addr, const auth *a, int wrong_mac, int *fd_out,
                 Tpuemu__FrameHeader **answer, uint8_t client_chal[AUTH_CHALLENGE_BYTES])
{
    Tpuemu__FrameHeader *hello, auth_f = TPUEMU__FRAME_HEADER__INIT;
    unsigned char mac[AUTH_MAC_BYTES];
    int fd = tcp_connect_addr(data_addr, 2000);
    *answer = NULL;
    *fd_out = fd;
    if (fd < 0)
        return -1;
    if (dp_recv(fd, 3000, &hello, NULL) < 0)
        return -2;
    if (hello->kind != TPUEMU__FRAME_KIND__FRAME_HELLO || hello->challenge.len != AUTH_CHALLENGE_BYTES) {
        frame_header_free(hello);
        return -3;
    }
    auth_random(client_chal, AUTH_CHALLENGE_BYTES);
    auth_f.kind = TPUEMU__FRAME_KIND__FRAME_AUTH;
    auth_f.challenge.data = client_chal;
    auth_f.challenge.len = AUTH_CHALLENGE_BYTES;
    auth_f.peer = "client test";
    if (wrong_mac) {
        auth_random(mac, sizeof mac);
        auth_f.mac.data = mac;
        auth_f.mac.len = sizeof mac;
    } else if (a && a->enabled) {
        auth_challenge_mac(a, hello->challenge.data, mac);
        auth_f.mac.data = mac;
        auth_f.mac.len = sizeof mac;
    }
    frame_header_free(hello);
    if (dp_send(fd, &auth_f, NULL, 0) < 0)
        return -4;
    if (dp_recv(fd, 3000, answer, NULL) < 0)
        return -5;
    return 0;
}

/* ---- HTTP, as a probe or a scraper asks ---- */

int http_get_all(int port, const char *path, char **body)
{
    char hp[32], req[256], *buf = calloc(1, 1 << 20), *b;
    size_t n = 0;
    int fd, status = 0;

    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    if (body)
        *body = NULL;
    if ((fd = tcp_connect_addr(hp, 2000)) < 0) {
        free(buf);
        return 0;
    }
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    tcp_send_all(fd, req, strlen(req));
    while (n < (1u << 20) - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 3000) <= 0)
            break;
        ssize_t k = read(fd, buf + n, (1u << 20) - 1 - n);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        status = 0;
    if (body) {
        b = strstr(buf, "\r\n\r\n");
        *body = strdup(b ? b + 4 : "");
    }
    free(buf);
    return status;
}

double http_metric(int port, const char *name, const char *labels, int *status)
{
    char *body, key[256];
    double v = -1;
    *status = http_get_all(port, "/metrics", &body);
    if (!body)
        return v;
    snprintf(key, sizeof key, "\n%s%s%s%s ", name, labels ? "{" : "", labels ? labels : "", labels ? "}" : "");
    const char *p = strstr(body, key);
    if (p)
        v = strtod(p + strlen(key), NULL);
    free(body);
    return v;
}
