/* Data-plane connection: framing reader, handshake, bounded write queue.
 * Reads go into a small staging buffer, so one read(2) takes a frame's
 * prefix, header and a small payload (and often the next frame's) at once;
 * the parser copies them out. A large payload, once the staging buffer is
 * empty, is read straight into its own buffer without a copy. */
#include "dpconn.h"

#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "dpauth.h"
#include "frame.h"
#include "tuning.h"

#define FLUSH_CLOSE_MS 1000

/* The staging buffer: 4 KiB payloads and their headers fit several times
 * over; a payload of at least DIRECT_MIN bytes still to come is read straight
 * into its destination. */
#define STAGE_BYTES (32u * 1024u)
#define DIRECT_MIN (STAGE_BYTES / 2u)

enum rd_state { RD_PREFIX, RD_HEADER, RD_PAYLOAD, RD_WAIT };
enum hs_state { HS_CONNECTING, HS_WAIT_HELLO, HS_WAIT_AUTH, HS_WAIT_AUTH_OK, HS_READY };

struct dp_conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* handshake deadline, then flush-before-close deadline */
    uv_connect_t connect;
    struct dp_conn_cfg cfg;
    enum hs_state hs;
    int accepting;
    int closing;       /* dp_conn_close was called */
    int flushing;      /* ERROR sent: close when the queue is empty */
    int open_handles;
    err why;
    char peer_addr[ADDR_HOST_MAX + 8];
    char peer_name[128];
    unsigned char my_chal[AUTH_CHALLENGE_BYTES];
    size_t pending;    /* bytes queued, not yet reported written */

    enum rd_state rd;
    size_t got;
    uint32_t hlen;
    uint8_t pre[FRAME_PREFIX_BYTES];
    uint8_t hdr[FRAME_MAX_HEADER];
    Tpuemu__FrameHeader *h; /* decoded header while its payload is read */
    uint8_t *payload;
    size_t plen;
    int into;          /* payload is the owner's buffer (payload_buf said DP_BUF_INTO) */
    int discard;       /* payload is read and dropped */
    uint8_t *stage;    /* STAGE_BYTES, allocated on the first read */
    size_t s_lo, s_hi; /* unparsed bytes: stage[s_lo, s_hi) */
    int direct;        /* the read in flight goes straight into the payload */
    int reading;       /* uv_read_start is in effect */
    int eof;           /* the peer ended the stream; staged frames still to deliver */
    uint64_t nread;
    int32_t auth_replica;
    uint64_t auth_epoch;
};

struct wreq {
    uv_write_t req;
    dp_conn *c;
    size_t bytes;
    dp_write_cb cb;
    void *arg;
    uint8_t head[]; /* prefix + header */
};

static void read_off(dp_conn *c);

static void on_handle_closed(uv_handle_t *hd)
{
    dp_conn *c = hd->data;
    if (--c->open_handles > 0)
        return;
    frame_header_free(c->h);
    if (!c->into)
        free(c->payload);
    free(c->stage);
    if (c->cfg.on_close)
        c->cfg.on_close(c, &c->why);
    free(c);
}

void dp_conn_close(dp_conn *c, const err *why)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (why)
        c->why = *why;
    read_off(c);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static void close_fmt(dp_conn *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void close_fmt(dp_conn *c, int code, const char *fmt, ...)
{
    va_list ap;
    err e;
    va_start(ap, fmt);
    err_vset(&e, code, fmt, ap);
    va_end(ap);
    dp_conn_close(c, &e);
}

static void on_written(uv_write_t *req, int status)
{
    struct wreq *w = (struct wreq *)req;
    dp_conn *c = w->c;
    c->pending -= w->bytes;
    if (w->cb)
        w->cb(w->arg, status);
    free(w);
    if (c->closing)
        return;
    if (status < 0) {
        close_fmt(c, CODE_UNAVAILABLE, "data-plane write to %s failed: %s", c->peer_addr, uv_strerror(status));
    } else if (c->flushing && c->pending == 0) {
        dp_conn_close(c, NULL); /* the reason was set by dp_conn_fail */
    }
}

/* Queues head (copied) and payload (not copied). */
static int queue_write_x(dp_conn *c, const uint8_t *head, size_t hn, const void *payload, size_t len,
                         dp_write_cb cb, void *arg, int counted)
{
    struct wreq *w;
    uv_buf_t bufs[2];
    size_t cost = hn + (counted ? len : 0);
    int rc;

    if (c->closing)
        return CODE_FAILED_PRECONDITION;
    if (cost > c->cfg.max_pending_write - c->pending || c->pending > c->cfg.max_pending_write) {
        close_fmt(c, CODE_RESOURCE_EXHAUSTED,
                 "data-plane peer %s is not reading: %zu bytes already queued, limit %zu; closing",
                 c->peer_addr, c->pending, c->cfg.max_pending_write);
        return CODE_RESOURCE_EXHAUSTED;
    }
    w = malloc(sizeof *w + hn);
    if (!w) {
        close_fmt(c, CODE_RESOURCE_EXHAUSTED, "out of memory queueing a data-plane frame");
        return CODE_RESOURCE_EXHAUSTED;
    }
    memcpy(w->head, head, hn);
    w->c = c;
    w->bytes = cost;
    w->cb = cb;
    w->arg = arg;
    bufs[0] = uv_buf_init((char *)w->head, (unsigned)hn);
    bufs[1] = uv_buf_init((char *)payload, (unsigned)len);
    rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, len ? 2 : 1, on_written);
    if (rc < 0) {
        free(w);
        close_fmt(c, CODE_UNAVAILABLE, "data-plane write to %s failed: %s", c->peer_addr, uv_strerror(rc));
        return CODE_UNAVAILABLE;
    }
    c->pending += cost;
    return CODE_OK;
}

static int queue_write(dp_conn *c, const uint8_t *head, size_t hn, const void *payload, size_t len,
                       dp_write_cb cb, void *arg)
{
    return queue_write_x(c, head, hn, payload, len, cb, arg, 1);
}

static int send_x(dp_conn *c, Tpuemu__FrameHeader *h, const void *payload, size_t len, dp_write_cb cb,
                  void *arg, int counted)
{
    uint8_t head[DPAUTH_FRAME_MAX];
    size_t hn;

    if (c->closing || c->flushing || c->hs != HS_READY)
        return CODE_FAILED_PRECONDITION;
    if (len > UINT32_MAX)
        return CODE_INVALID_ARGUMENT; /* one uv_buf_t; larger tensors go in chunks */
    h->payload_bytes = len;
    hn = frame_encode(h, head, sizeof head);
    if (hn == 0)
        return CODE_INVALID_ARGUMENT;
    return queue_write_x(c, head, hn, payload, len, cb, arg, counted);
}

int dp_conn_send(dp_conn *c, Tpuemu__FrameHeader *h, const void *payload, size_t len, dp_write_cb cb,
                 void *arg)
{
    return send_x(c, h, payload, len, cb, arg, 1);
}

int dp_conn_send_ref(dp_conn *c, Tpuemu__FrameHeader *h, const void *payload, size_t len,
                     dp_write_cb cb, void *arg)
{
    return send_x(c, h, payload, len, cb, arg, 0);
}

static void on_flush_deadline(uv_timer_t *t)
{
    dp_conn_close(t->data, NULL);
}

static void vfail(dp_conn *c, int code, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
static void vfail(dp_conn *c, int code, const char *fmt, va_list ap)
{
    uint8_t buf[DPAUTH_FRAME_MAX];
    size_t n;

    if (c->closing || c->flushing)
        return;
    err_vset(&c->why, code, fmt, ap);
    read_off(c);
    c->flushing = 1;
    n = dpauth_error(code, c->why.msg, buf, sizeof buf);
    if (n == 0 || queue_write(c, buf, n, NULL, 0, NULL, NULL) != CODE_OK) {
        dp_conn_close(c, NULL);
        return;
    }
    uv_timer_start(&c->timer, on_flush_deadline, FLUSH_CLOSE_MS, 0);
}

void dp_conn_fail(dp_conn *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, code, fmt, ap);
    va_end(ap);
}

static void on_handshake_deadline(uv_timer_t *t)
{
    dp_conn *c = t->data;
    if (c->hs == HS_CONNECTING) {
        close_fmt(c, CODE_DEADLINE_EXCEEDED, "could not connect to data-plane peer %s within %u ms", c->peer_addr,
                 c->cfg.handshake_ms);
        return;
    }
    dp_conn_fail(c, CODE_DEADLINE_EXCEEDED,
                 "data-plane handshake with %s did not complete within %u ms", c->peer_addr,
                 c->cfg.handshake_ms);
}

static void handshake_done(dp_conn *c)
{
    c->hs = HS_READY;
    uv_timer_stop(&c->timer);
    if (c->cfg.on_ready)
        c->cfg.on_ready(c);
}

/* dpauth_auth plus AUTH.replica and AUTH.epoch (a worker dialing a peer). */
static size_t build_auth(dp_conn *c, const unsigned char peer_chal[AUTH_CHALLENGE_BYTES], uint8_t *out,
                         size_t cap)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    unsigned char mac[AUTH_MAC_BYTES];

    h.kind = TPUEMU__FRAME_KIND__FRAME_AUTH;
    if (c->cfg.auth && c->cfg.auth->enabled) {
        auth_challenge_mac(c->cfg.auth, peer_chal, mac);
        h.mac.data = mac;
        h.mac.len = sizeof mac;
    }
    h.challenge.data = c->my_chal;
    h.challenge.len = AUTH_CHALLENGE_BYTES;
    h.peer = (char *)(c->cfg.self_name ? c->cfg.self_name : "");
    h.replica = c->cfg.replica;
    h.epoch = c->cfg.epoch;
    return frame_encode(&h, out, cap);
}

/* A complete frame during the handshake. */
static void handshake_frame(dp_conn *c, const Tpuemu__FrameHeader *h)
{
    uint8_t buf[DPAUTH_FRAME_MAX];
    unsigned char peer_chal[AUTH_CHALLENGE_BYTES];
    size_t n;
    err e;

    if (h->kind == TPUEMU__FRAME_KIND__FRAME_ERROR) {
        close_fmt(c, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, "%s",
                  h->status && h->status->message ? h->status->message : "peer sent ERROR");
        return;
    }
    switch (c->hs) {
    case HS_WAIT_AUTH:
        if (h->peer)
            snprintf(c->peer_name, sizeof c->peer_name, "%s", h->peer);
        c->auth_replica = h->replica;
        c->auth_epoch = h->epoch;
        if (dpauth_check_auth(c->cfg.auth, c->my_chal, h, peer_chal, &e) != CODE_OK) {
            dp_conn_fail(c, e.code, "%s", e.msg);
            return;
        }
        n = dpauth_auth_ok(c->cfg.auth, peer_chal, buf, sizeof buf);
        if (queue_write(c, buf, n, NULL, 0, NULL, NULL) == CODE_OK)
            handshake_done(c);
        return;
    case HS_WAIT_HELLO:
        if (dpauth_check_hello(h, peer_chal, &e) != CODE_OK) {
            dp_conn_fail(c, CODE_UNAVAILABLE, "%s", e.msg);
            return;
        }
        auth_random(c->my_chal, sizeof c->my_chal);
        n = build_auth(c, peer_chal, buf, sizeof buf);
        if (queue_write(c, buf, n, NULL, 0, NULL, NULL) == CODE_OK)
            c->hs = HS_WAIT_AUTH_OK;
        return;
    case HS_WAIT_AUTH_OK:
        if (dpauth_check_auth_ok(c->cfg.auth, c->my_chal, h, &e) != CODE_OK) {
            close_fmt(c, e.code, "%s", e.msg);
            return;
        }
        handshake_done(c);
        return;
    default:
        dp_conn_fail(c, CODE_INTERNAL, "unexpected frame during the data-plane handshake");
    }
}

static void frame_done(dp_conn *c);
static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void read_on(dp_conn *c)
{
    if (c->reading || c->eof || c->closing || c->flushing)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = 1;
}

static void read_off(dp_conn *c)
{
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
}

/* RD_WAIT: the header c->h is held; asks the owner where its payload goes.
 * Leaves rd at RD_WAIT when the owner is not ready: what arrives meanwhile
 * is staged until the staging buffer is full, then reading pauses. */
static void ask_payload_buf(dp_conn *c)
{
    void *dst = NULL;
    enum dp_buf a = c->cfg.payload_buf(c, c->h, &dst);

    if (c->closing || c->flushing || a == DP_BUF_FAILED)
        return;
    c->got = 0;
    c->into = 0;
    c->discard = 0;
    switch (a) {
    case DP_BUF_WAIT:
        return;
    case DP_BUF_INTO:
        c->payload = dst;
        c->into = 1;
        break;
    case DP_BUF_DISCARD:
        c->discard = 1;
        break;
    default:
        if (c->plen > 0 && !(c->payload = malloc(c->plen))) {
            dp_conn_fail(c, CODE_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte frame", c->plen);
            return;
        }
        break;
    }
    if (c->plen > 0)
        c->rd = RD_PAYLOAD;
    else
        frame_done(c);
}

/* The peer's end of the stream, once every staged byte is parsed. */
static void eof_now(dp_conn *c)
{
    if (c->hs == HS_READY && c->rd == RD_PREFIX && c->got == 0 && c->s_lo == c->s_hi)
        dp_conn_close(c, NULL);
    else
        close_fmt(c, CODE_UNAVAILABLE, "data-plane peer %s closed the connection%s", c->peer_addr,
                  c->hs != HS_READY ? " during the handshake" : " in the middle of a frame");
}

static void consume(dp_conn *c);

static void on_resume(uv_timer_t *t)
{
    dp_conn *c = t->data;
    if (c->rd != RD_WAIT || c->closing || c->flushing)
        return;
    ask_payload_buf(c);
    consume(c);
    if (c->eof && c->rd != RD_WAIT && !c->closing && !c->flushing)
        eof_now(c);
    else
        read_on(c);
}

void dp_conn_resume(dp_conn *c)
{
    if (c->rd == RD_WAIT && !c->closing && !c->flushing && c->hs == HS_READY)
        uv_timer_start(&c->timer, on_resume, 0, 0);
}

void dp_conn_discard_current(dp_conn *c)
{
    if (c->rd != RD_PAYLOAD || !c->into)
        return;
    c->payload = NULL;
    c->into = 0;
    c->discard = 1;
}

void dp_conn_set_handlers(dp_conn *c, const struct dp_conn_cfg *cfg)
{
    c->cfg.on_frame = cfg->on_frame;
    c->cfg.on_close = cfg->on_close;
    c->cfg.on_ready = cfg->on_ready;
    c->cfg.payload_buf = cfg->payload_buf;
    c->cfg.data = cfg->data;
    if (cfg->max_payload)
        c->cfg.max_payload = cfg->max_payload;
    if (cfg->max_pending_write)
        c->cfg.max_pending_write = cfg->max_pending_write;
}

uint64_t dp_conn_bytes_read(const dp_conn *c)
{
    return c->nread;
}

int32_t dp_conn_auth_replica(const dp_conn *c)
{
    return c->auth_replica;
}

uint64_t dp_conn_auth_epoch(const dp_conn *c)
{
    return c->auth_epoch;
}

/* The header in c->hdr is complete: decode it, then read its payload or deliver. */
static void header_done(dp_conn *c)
{
    uint64_t cap = c->hs == HS_READY ? c->cfg.max_payload : 0;
    err e;

    if (frame_decode(c->hdr, c->hlen, cap, &c->h, &e) != CODE_OK) {
        dp_conn_fail(c, e.code, "%s", e.msg);
        return;
    }
    c->plen = (size_t)c->h->payload_bytes;
    c->got = 0;
    if (c->hs == HS_READY && c->cfg.payload_buf) {
        c->rd = RD_WAIT;
        ask_payload_buf(c);
        return;
    }
    if (c->plen > 0) {
        c->payload = malloc(c->plen);
        if (!c->payload) {
            dp_conn_fail(c, CODE_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte frame", c->plen);
            return;
        }
        c->rd = RD_PAYLOAD;
    }
}

static void frame_done(dp_conn *c)
{
    Tpuemu__FrameHeader *h = c->h;
    uint8_t *p = c->into ? NULL : c->payload;
    size_t n = c->plen;
    int discard = c->discard;

    c->h = NULL;
    c->payload = NULL;
    c->plen = 0;
    c->rd = RD_PREFIX;
    c->got = 0;
    c->into = 0;
    c->discard = 0;
    if (discard) {
        /* dropped on purpose */
    } else if (c->hs != HS_READY) {
        handshake_frame(c, h);
    } else if (h->kind == TPUEMU__FRAME_KIND__FRAME_ERROR) {
        close_fmt(c, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, "%s",
                  h->status && h->status->message ? h->status->message : "peer sent ERROR");
    } else {
        c->cfg.on_frame(c, h, p, n);
        p = NULL;
    }
    free(p);
    frame_header_free(h);
}

/* Where the next read goes: straight into the payload when a large part of
 * it is still to come and nothing is staged, else the staging buffer's free
 * end (none when it is full: libuv then reports UV_ENOBUFS). */
static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    dp_conn *c = hd->data;
    (void)suggested;
    c->direct = 0;
    if (c->s_lo == c->s_hi)
        c->s_lo = c->s_hi = 0;
    if (c->rd == RD_PAYLOAD && c->s_lo == c->s_hi && !c->discard && c->plen - c->got >= DIRECT_MIN) {
        size_t left = c->plen - c->got;
        *buf = uv_buf_init((char *)c->payload + c->got, (unsigned)(left > (1u << 30) ? 1u << 30 : left));
        c->direct = 1;
        return;
    }
    if (!c->stage && !(c->stage = malloc(STAGE_BYTES))) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    if (c->s_hi == STAGE_BYTES && c->s_lo > 0) {
        memmove(c->stage, c->stage + c->s_lo, c->s_hi - c->s_lo);
        c->s_hi -= c->s_lo;
        c->s_lo = 0;
    }
    *buf = uv_buf_init((char *)c->stage + c->s_hi, (unsigned)(STAGE_BYTES - c->s_hi));
}

static size_t take(dp_conn *c, size_t want)
{
    size_t avail = c->s_hi - c->s_lo;
    return want < avail ? want : avail;
}

/* Parses the staged bytes: frames are delivered until the stage is empty,
 * a frame is incomplete, or a payload waits for its buffer (RD_WAIT). */
static void consume(dp_conn *c)
{
    err e;
    size_t n;

    while (!c->closing && !c->flushing && c->s_lo < c->s_hi) {
        const uint8_t *p = c->stage + c->s_lo;
        switch (c->rd) {
        case RD_WAIT:
            return;
        case RD_PREFIX:
            n = take(c, FRAME_PREFIX_BYTES - c->got);
            memcpy(c->pre + c->got, p, n);
            c->s_lo += n;
            if ((c->got += n) < FRAME_PREFIX_BYTES)
                break;
            if (frame_prefix(c->pre, &c->hlen, &e) != CODE_OK) {
                dp_conn_fail(c, e.code, "%s", e.msg);
                return;
            }
            c->rd = RD_HEADER;
            c->got = 0;
            break;
        case RD_HEADER:
            n = take(c, c->hlen - c->got);
            memcpy(c->hdr + c->got, p, n);
            c->s_lo += n;
            if ((c->got += n) < c->hlen)
                break;
            header_done(c);
            if (!c->flushing && !c->closing && c->rd == RD_HEADER)
                frame_done(c); /* no payload */
            break;
        case RD_PAYLOAD:
            n = take(c, c->plen - c->got);
            if (!c->discard)
                memcpy(c->payload + c->got, p, n);
            c->s_lo += n;
            if ((c->got += n) == c->plen)
                frame_done(c);
            break;
        }
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    dp_conn *c = s->data;
    (void)buf;

    if (c->closing || c->flushing)
        return;
    if (nread == UV_ENOBUFS) {
        if (!c->stage)
            dp_conn_fail(c, CODE_RESOURCE_EXHAUSTED, "out of memory for a data-plane read buffer");
        else
            read_off(c); /* staged bytes wait for a payload buffer: on_resume reads on */
        return;
    }
    if (nread < 0) {
        if (nread == UV_EOF) {
            read_off(c);
            c->eof = 1;
            if (c->rd != RD_WAIT) /* else the staged frames are delivered first */
                eof_now(c);
        } else {
            close_fmt(c, CODE_UNAVAILABLE, "data-plane peer %s %s%s", c->peer_addr, uv_strerror((int)nread),
                      c->hs != HS_READY ? " during the handshake" : " in the middle of a frame");
        }
        return;
    }
    if (nread == 0)
        return;
    c->nread += (uint64_t)nread;
    if (c->direct) {
        c->direct = 0;
        if ((c->got += (size_t)nread) == c->plen)
            frame_done(c);
        return;
    }
    c->s_hi += (size_t)nread;
    consume(c);
}

static dp_conn *conn_new(uv_loop_t *loop, const struct dp_conn_cfg *cfg, err *e)
{
    dp_conn *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a data-plane connection");
        return NULL;
    }
    c->cfg = *cfg;
    uv_tcp_init(loop, &c->tcp);
    uv_timer_init(loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    return c;
}

/* Socket buffers of data-plane connections. --dp-sockbuf (TPUEMU_DP_SOCKBUF) sets
 * SO_SNDBUF/SO_RCVBUF on every data-plane connection, for measuring; the
 * default 0 keeps the kernel's autotuning: fixed 4 MiB buffers measured
 * 0.51-0.64 vs 0.45-0.50 GB/s busbw at 1 MiB but 0.54-0.57 vs 0.74 at 16 MiB
 * (4 ranks over TCP on the shared 2-core VM; setting them disables
 * autotuning, whose receive side grows to 32 MiB). */

static void set_sockbuf(dp_conn *c)
{
    static int v = -1;
    if (v < 0) {
        v = (int)tuning_get()->dp_sockbuf;
    }
    if (v > 0) {
        int n = v;
        uv_send_buffer_size((uv_handle_t *)&c->tcp, &n);
        n = v;
        uv_recv_buffer_size((uv_handle_t *)&c->tcp, &n);
    }
}

static void format_sockaddr(const struct sockaddr_storage *ss, char *out, size_t n)
{
    char host[ADDR_HOST_MAX];
    int port = 0;
    host[0] = '\0';
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        uv_ip4_name(a, host, sizeof host);
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(a, host, sizeof host);
        port = ntohs(a->sin6_port);
    }
    addr_format(host[0] ? host : "?", port, out, n);
}

int dp_conn_accept(uv_stream_t *server, const struct dp_conn_cfg *cfg, dp_conn **out, err *e)
{
    struct sockaddr_storage ss;
    int sl = sizeof ss, rc;
    uint8_t buf[DPAUTH_FRAME_MAX];
    size_t n;
    dp_conn *c = conn_new(server->loop, cfg, e);

    *out = NULL;
    if (!c)
        return e->code;
    c->accepting = 1;
    c->hs = HS_WAIT_AUTH;
    snprintf(c->peer_addr, sizeof c->peer_addr, "?");
    if ((rc = uv_accept(server, (uv_stream_t *)&c->tcp)) < 0) {
        err_set(e, CODE_UNAVAILABLE, "accept: %s", uv_strerror(rc));
        c->cfg.on_close = NULL; /* the owner never saw it */
        dp_conn_close(c, NULL);
        return e->code;
    }
    memset(&ss, 0, sizeof ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0)
        format_sockaddr(&ss, c->peer_addr, sizeof c->peer_addr);
    uv_tcp_nodelay(&c->tcp, 1);
    set_sockbuf(c);
    *out = c;
    auth_random(c->my_chal, sizeof c->my_chal);
    n = dpauth_hello(c->my_chal, buf, sizeof buf);
    if (queue_write(c, buf, n, NULL, 0, NULL, NULL) != CODE_OK)
        return CODE_OK; /* closing; on_close tells the owner */
    uv_timer_start(&c->timer, on_handshake_deadline, cfg->handshake_ms, 0);
    read_on(c);
    return CODE_OK;
}

static void on_connected(uv_connect_t *req, int status)
{
    dp_conn *c = req->data;
    if (c->closing)
        return;
    if (status < 0) {
        close_fmt(c, CODE_UNAVAILABLE, "cannot connect to data-plane peer %s: %s", c->peer_addr,
                 uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    set_sockbuf(c);
    c->hs = HS_WAIT_HELLO;
    read_on(c);
}

int dp_conn_connect(uv_loop_t *loop, const struct sockaddr *sa, const struct dp_conn_cfg *cfg,
                    dp_conn **out, err *e)
{
    struct sockaddr_storage ss;
    int rc;
    dp_conn *c = conn_new(loop, cfg, e);

    *out = NULL;
    if (!c)
        return e->code;
    memset(&ss, 0, sizeof ss);
    memcpy(&ss, sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    format_sockaddr(&ss, c->peer_addr, sizeof c->peer_addr);
    c->hs = HS_CONNECTING;
    c->connect.data = c;
    if ((rc = uv_tcp_connect(&c->connect, &c->tcp, sa, on_connected)) < 0) {
        err_set(e, CODE_UNAVAILABLE, "cannot connect to data-plane peer %s: %s", c->peer_addr,
                uv_strerror(rc));
        c->cfg.on_close = NULL; /* the owner never saw it */
        dp_conn_close(c, NULL);
        return e->code;
    }
    uv_timer_start(&c->timer, on_handshake_deadline, cfg->handshake_ms, 0);
    *out = c;
    return CODE_OK;
}

const char *dp_conn_peer_addr(const dp_conn *c)
{
    return c->peer_addr;
}

const char *dp_conn_peer_name(const dp_conn *c)
{
    return c->peer_name;
}

void *dp_conn_data(const dp_conn *c)
{
    return c->cfg.data;
}
