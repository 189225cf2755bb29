/* An SP REQ endpoint on libuv (see spreq.h). */
#include "spreq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"

#define SP_PROTO_REQ 48 /* nanomsg NN_REQ */
#define SP_PROTO_REP 49 /* nanomsg NN_REP */
#define SP_HDR 8
#define SP_MAX_HOPS 8   /* backtrace words a reply may carry (devices in between add one each) */

enum { C_RESOLVING, C_CONNECTING, C_OPEN, C_DEAD };

/* One connection attempt and, once made, the connection; freed when its
 * handle (or its name lookup) is let go. */
struct conn {
    spreq *q;               /* NULL once detached (the spreq moved on or closed) */
    int state;
    uv_getaddrinfo_t gai;
    uv_connect_t cr;
    uv_tcp_t tcp;
    int tcp_inited;
    uint8_t *in;
    size_t in_len, in_cap;
    int got_hdr;
};

struct spreq {
    uv_loop_t *loop;
    struct spreq_cfg cfg;
    addr a;
    char shown[ADDR_HOST_MAX + 16];
    struct conn *c;         /* the current connection or attempt, or NULL */
    uint32_t next_id;
    uint32_t id;            /* of the outstanding request; 0: none */
    uint8_t *body;          /* its bytes, until written */
    size_t body_len;
    int closing;
    int want_open;          /* spreq_connect: on_open or on_lost is owed */
    unsigned refs;          /* 1 for the owner + connections not yet let go */
};

struct wreq {
    uv_write_t w;
    uint8_t hdr[SP_HDR + 4];
    uint8_t *body;
};

void *spreq_data(const spreq *q)
{
    return q->cfg.data;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void unref(spreq *q)
{
    if (--q->refs == 0) {
        free(q->body);
        free(q);
    }
}

static void conn_free(struct conn *c)
{
    spreq *q = c->q;
    free(c->in);
    free(c);
    if (q)
        unref(q);
}

static void on_tcp_closed(uv_handle_t *h)
{
    conn_free(h->data);
}

/* The connection is done for: its handle goes; the spreq (if still its
 * owner) forgets it and, with a request outstanding, tells the owner. */
static void conn_break(struct conn *c, const char *why, int uvcode)
{
    spreq *q = c->q;
    int was = c->state;

    c->state = C_DEAD;
    if (q && q->c == c) {
        q->c = NULL;
        if ((q->id || q->want_open) && !q->closing) {
            err e;
            q->id = 0;
            q->want_open = 0;
            free(q->body);
            q->body = NULL;
            if (uvcode)
                err_set(&e, CODE_UNAVAILABLE, "%s %s: %s", why, q->shown, uv_strerror(uvcode));
            else
                err_set(&e, CODE_UNAVAILABLE, "%s %s", why, q->shown);
            q->cfg.on_lost(q, &e);
        }
    }
    if (c->tcp_inited) {
        if (!uv_is_closing((uv_handle_t *)&c->tcp))
            uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
    } else if (was != C_RESOLVING) {
        conn_free(c);
    } /* resolving: the lookup's callback frees it */
}

static void on_written(uv_write_t *w, int status)
{
    struct wreq *r = (struct wreq *)w;
    struct conn *c = w->handle->data;
    free(r->body);
    free(r);
    if (status < 0 && c->state == C_OPEN)
        conn_break(c, "sending to", status);
}

/* Writes the outstanding request (its bytes go to the write). */
static void write_body(spreq *q)
{
    struct conn *c = q->c;
    struct wreq *r;
    uv_buf_t b[2];

    if (!c || c->state != C_OPEN || !q->body)
        return;
    if (!(r = calloc(1, sizeof *r))) {
        conn_break(c, "out of memory sending to", 0);
        return;
    }
    put_be64(r->hdr, (uint64_t)q->body_len + 4);
    put_be32(r->hdr + SP_HDR, q->id);
    r->body = q->body;
    b[0] = uv_buf_init((char *)r->hdr, sizeof r->hdr);
    b[1] = uv_buf_init((char *)q->body, (unsigned)q->body_len);
    q->body = NULL;
    if (uv_write(&r->w, (uv_stream_t *)&c->tcp, b, 2, on_written) != 0) {
        free(r->body);
        free(r);
        conn_break(c, "sending to", 0);
    }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    struct conn *c = h->data;
    size_t want = 16384;
    (void)hint;
    if (c->in_cap - c->in_len < want) {
        uint8_t *n = realloc(c->in, c->in_len + want);
        if (!n) {
            *b = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
            return;
        }
        c->in = n;
        c->in_cap = c->in_len + want;
    }
    *b = uv_buf_init((char *)c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

/* Parses what arrived: the peer's protocol header, then replies. */
static void parse(struct conn *c)
{
    size_t off = 0;

    if (!c->got_hdr) {
        if (c->in_len < SP_HDR)
            return;
        if (c->in[0] != 0 || c->in[1] != 'S' || c->in[2] != 'P' || c->in[3] != 0 || c->in[4] != 0 ||
            c->in[5] != SP_PROTO_REP) {
            conn_break(c, "not a nanomsg REP socket (wrong protocol header) at", 0);
            return;
        }
        c->got_hdr = 1;
        off = SP_HDR;
    }
    while (c->state == C_OPEN && c->in_len - off >= 8) {
        spreq *q = c->q;
        uint64_t len = get_be64(c->in + off);
        size_t hops = 0, k;
        if (len < 4 || len > q->cfg.max_msg + 4 * SP_MAX_HOPS) {
            conn_break(c, "a reply of a size out of bounds from", 0);
            return;
        }
        if (c->in_len - off - 8 < len)
            break;
        /* the backtrace: words up to the first with the top bit set */
        for (k = 0; k + 4 <= len && hops < SP_MAX_HOPS; k += 4, hops++)
            if (c->in[off + 8 + k] & 0x80)
                break;
        if (k + 4 > len || hops >= SP_MAX_HOPS) {
            conn_break(c, "a reply without a request id from", 0);
            return;
        }
        uint32_t id = get_be32(c->in + off + 8 + k);
        const uint8_t *body = c->in + off + 8 + k + 4;
        size_t blen = (size_t)len - k - 4;
        off += 8 + (size_t)len;
        if (q->id && id == q->id) {
            int moved;
            q->id = 0;
            q->refs++; /* on_reply may send, cancel or close */
            q->cfg.on_reply(q, body, blen);
            moved = q->c != c;
            unref(q);
            if (moved)
                return;
        } /* else a late reply to a request given up on: dropped */
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct conn *c = s->data;
    (void)b;
    if (c->state != C_OPEN || !c->q)
        return;
    if (n < 0) {
        conn_break(c, n == UV_EOF ? "the connection was closed by" : "the connection broke to",
                   n == UV_EOF ? 0 : (int)n);
        return;
    }
    c->in_len += (size_t)n;
    parse(c);
}

static void on_connect(uv_connect_t *cr, int status)
{
    static const uint8_t hdr[SP_HDR] = {0, 'S', 'P', 0, 0, SP_PROTO_REQ, 0, 0};
    struct conn *c = cr->data;
    uv_buf_t b = uv_buf_init((char *)hdr, sizeof hdr);
    struct wreq *r;

    if (c->state != C_CONNECTING || !c->q)
        return; /* detached: its close is under way */
    if (status < 0) {
        conn_break(c, "connecting to", status);
        return;
    }
    c->state = C_OPEN;
    uv_tcp_nodelay(&c->tcp, 1);
    if (!(r = calloc(1, sizeof *r)) || uv_write(&r->w, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        free(r);
        conn_break(c, "sending to", 0);
        return;
    }
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_break(c, "reading from", 0);
        return;
    }
    write_body(c->q);
    if (c->q && c->q->want_open && c->q->c == c) {
        spreq *q = c->q;
        q->want_open = 0;
        if (q->cfg.on_open && !q->closing) {
            q->refs++; /* on_open may send, cancel or close */
            q->cfg.on_open(q);
            unref(q);
        }
    }
}

static void on_resolved(uv_getaddrinfo_t *g, int status, struct addrinfo *res)
{
    struct conn *c = g->data;
    spreq *q = c->q;
    int rc;

    if (!q || c->state != C_RESOLVING) { /* detached while looking up */
        uv_freeaddrinfo(res);
        conn_free(c);
        return;
    }
    if (status < 0) {
        uv_freeaddrinfo(res);
        c->state = C_CONNECTING; /* so conn_break frees it */
        conn_break(c, "cannot resolve the host of", status);
        return;
    }
    c->state = C_CONNECTING;
    if ((rc = uv_tcp_init(q->loop, &c->tcp)) != 0) {
        uv_freeaddrinfo(res);
        conn_break(c, "cannot open a socket to", rc);
        return;
    }
    c->tcp_inited = 1;
    c->tcp.data = c;
    rc = uv_tcp_connect(&c->cr, &c->tcp, res->ai_addr, on_connect);
    uv_freeaddrinfo(res);
    if (rc != 0)
        conn_break(c, "connecting to", rc);
}

static int start_conn(spreq *q, err *e)
{
    struct addrinfo hints;
    char port[16];
    struct conn *c = calloc(1, sizeof *c);
    int rc;

    if (!c)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory connecting to %s", q->shown);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", q->a.port);
    c->q = q;
    c->state = C_RESOLVING;
    c->gai.data = c->cr.data = c;
    q->refs++;
    q->c = c;
    if ((rc = uv_getaddrinfo(q->loop, &c->gai, on_resolved, q->a.host, port, &hints)) != 0) {
        q->c = NULL;
        c->q = NULL;
        unref(q);
        free(c);
        return err_set(e, rc == UV_EMFILE || rc == UV_ENFILE ? CODE_RESOURCE_EXHAUSTED : CODE_UNAVAILABLE,
                       "cannot look up %s: %s", q->shown, uv_strerror(rc));
    }
    return CODE_OK;
}

spreq *spreq_new(uv_loop_t *loop, const char *url, const struct spreq_cfg *cfg, err *e)
{
    spreq *q = calloc(1, sizeof *q);
    if (!q) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (addr_parse(url, 0, &q->a, e) != CODE_OK) {
        free(q);
        return NULL;
    }
    if (q->a.port <= 0) {
        err_set(e, CODE_INVALID_ARGUMENT, "'%s' has no port", url);
        free(q);
        return NULL;
    }
    q->loop = loop;
    q->cfg = *cfg;
    q->refs = 1;
    q->next_id = 1;
    addr_format(q->a.host, q->a.port, q->shown, sizeof q->shown);
    return q;
}

/* Sends the request (id, body) on an open connection with nothing queued
 * from the caller's memory, as far as the socket takes it at once; the rest,
 * if any, is copied and queued. 1 if that was done (or the connection broke
 * trying), 0 if the request must be queued whole. A resolver resetting 1,024
 * cores sends 1,024 large requests in one loop turn: copying each for the
 * write queue held them all at once (100 MB of fresh pages, each a costly
 * fault on a VM), where the kernel takes most of them on the spot. */
static int write_now(spreq *q, const uint8_t *body, size_t len)
{
    struct conn *c = q->c;
    uint8_t hdr[SP_HDR + 4];
    uv_buf_t b[2];
    size_t total = sizeof hdr + len, done, rest;
    struct wreq *r;
    int n;

    if (!c || c->state != C_OPEN || len > UINT32_MAX)
        return 0;
    put_be64(hdr, (uint64_t)len + 4);
    put_be32(hdr + SP_HDR, q->id);
    b[0] = uv_buf_init((char *)hdr, sizeof hdr);
    b[1] = uv_buf_init((char *)body, (unsigned)len);
    n = uv_try_write((uv_stream_t *)&c->tcp, b, 2);
    if (n == UV_EAGAIN || n == UV_ENOSYS)
        return 0; /* a write is queued already (order), or nothing went */
    if (n < 0) {
        conn_break(c, "sending to", n);
        return 1;
    }
    if ((done = (size_t)n) == total)
        return 1;
    rest = total - done;
    if (!(r = calloc(1, sizeof *r)) || !(r->body = malloc(rest))) {
        free(r);
        conn_break(c, "out of memory sending to", 0);
        return 1;
    }
    if (done < sizeof hdr) {
        memcpy(r->body, hdr + done, sizeof hdr - done);
        memcpy(r->body + sizeof hdr - done, body, len);
    } else {
        memcpy(r->body, body + (done - sizeof hdr), rest);
    }
    b[0] = uv_buf_init((char *)r->body, (unsigned)rest);
    if (uv_write(&r->w, (uv_stream_t *)&c->tcp, b, 1, on_written) != 0) {
        free(r->body);
        free(r);
        conn_break(c, "sending to", 0);
    }
    return 1;
}

int spreq_send(spreq *q, const void *body, size_t len, err *e)
{
    uint8_t *copy;
    int rc;

    if (q->closing)
        return err_set(e, CODE_UNAVAILABLE, "the link to %s is closing", q->shown);
    free(q->body);
    q->body = NULL;
    q->id = 0x80000000u | (q->next_id++ & 0x7fffffffu);
    if (write_now(q, body, len))
        return CODE_OK;
    if (!(copy = malloc(len ? len : 1))) {
        q->id = 0;
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory sending to %s", q->shown);
    }
    memcpy(copy, body, len);
    q->body = copy;
    q->body_len = len;
    if (!q->c && (rc = start_conn(q, e)) != CODE_OK) {
        free(q->body);
        q->body = NULL;
        q->id = 0;
        return rc;
    }
    write_body(q);
    return CODE_OK;
}

int spreq_connect(spreq *q, err *e)
{
    if (q->closing)
        return err_set(e, CODE_UNAVAILABLE, "the link to %s is closing", q->shown);
    if (q->c && q->c->state == C_OPEN)
        return CODE_OK;
    q->want_open = 1;
    if (!q->c) {
        int rc = start_conn(q, e);
        if (rc != CODE_OK)
            q->want_open = 0;
        return rc;
    }
    return CODE_OK;
}

int spreq_is_open(const spreq *q)
{
    return q->c && q->c->state == C_OPEN && !q->closing;
}

void spreq_cancel(spreq *q)
{
    struct conn *c = q->c;
    q->id = 0;
    q->want_open = 0;
    free(q->body);
    q->body = NULL;
    /* a connection not made yet may never be (a host that does not answer):
     * the next request starts a fresh attempt */
    if (c && c->state != C_OPEN) {
        q->c = NULL;
        c->q = NULL;
        unref(q);
        if (c->state == C_RESOLVING)
            uv_cancel((uv_req_t *)&c->gai);
        else
            conn_break(c, "", 0);
    }
}

void spreq_close(spreq *q)
{
    struct conn *c = q->c;
    q->closing = 1;
    q->id = 0;
    if (c) {
        q->c = NULL;
        c->q = NULL;
        unref(q);
        if (c->state == C_RESOLVING)
            uv_cancel((uv_req_t *)&c->gai);
        else
            conn_break(c, "", 0);
    }
    unref(q);
}
