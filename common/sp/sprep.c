/* SP REP over TCP on libuv, with connection limits (sprep.h). */
#include "sprep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "addr.h"
#include "log.h"
#include "uvtcp.h"

#define SP_PROTO_REQ 48 /* nanomsg NN_REQ */
#define SP_PROTO_REP 49 /* nanomsg NN_REP */
#define SP_MAX_HOPS 8   /* backtrace words (devices in between add one each) */
#define READ_CHUNK (64u * 1024u)

enum rd { RD_SPHDR, RD_LEN, RD_BODY };

struct spconn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* untrusted deadline, then idle check */
    struct sprep *s;
    struct spconn *prev, *next;
    int trusted, closing, open_handles, refs; /* refs: the conn itself + each ctl held */
    uint64_t seq;          /* arrival order */
    uint64_t last_ms;      /* last request */
    size_t pending;        /* reply bytes queued */
    enum rd rd;
    uint8_t head[8];
    size_t got;
    uint8_t *body;
    int body_borrowed; /* body points into the read buffer: not ours to free */
    size_t blen;
    size_t big;            /* blen, when counted in sprep.untrusted_big */
    char peer[64];
};

struct sprep_ctl {
    struct spconn *c;
    size_t btlen;
    uint8_t bt[4 * SP_MAX_HOPS];
};

struct sprep {
    uv_loop_t *loop;
    uv_tcp_t listener;
    struct sprep_cfg cfg;
    char shown[300];
    struct spconn *conns;
    unsigned ntrusted, nuntrusted, nopen;
    size_t untrusted_big;  /* bytes of large requests being read from untrusted connections */
    int closing, listener_open;
    uint64_t seq;
    uint8_t rbuf[READ_CHUNK]; /* read buffer shared by every connection (one read at a time) */
};

struct spwrite {
    uv_write_t req;
    struct spconn *c;
    size_t bytes;
    uint8_t data[];
};

/* ---- lifetime ---- */

static void maybe_free(struct sprep *s)
{
    if (s->closing && !s->listener_open && s->nopen == 0)
        free(s);
}

static void body_free(struct spconn *c)
{
    c->s->untrusted_big -= c->big;
    c->big = 0;
    if (!c->body_borrowed)
        free(c->body);
    c->body = NULL;
    c->body_borrowed = 0;
}

static void conn_unref(struct spconn *c)
{
    if (--c->refs > 0)
        return;
    struct sprep *s = c->s;
    body_free(c);
    free(c);
    s->nopen--;
    maybe_free(s);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct spconn *c = h->data;
    if (--c->open_handles > 0)
        return;
    conn_unref(c);
}

static void conn_close(struct spconn *c)
{
    struct sprep *s = c->s;
    if (c->closing)
        return;
    c->closing = 1;
    if (c->trusted)
        s->ntrusted--;
    else
        s->nuntrusted--;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
}

static void on_listener_closed(uv_handle_t *h)
{
    struct sprep *s = h->data;
    s->listener_open = 0;
    maybe_free(s);
}

void sprep_close(sprep *s)
{
    if (!s || s->closing)
        return;
    s->closing = 1;
    s->nopen++; /* held while the connections close */
    if (s->listener_open && !uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    while (s->conns)
        conn_close(s->conns);
    s->nopen--;
    maybe_free(s);
}

void *sprep_data(const sprep *s)
{
    return s->cfg.data;
}

/* ---- limits ---- */

static void log_evict(struct sprep *s, struct spconn *c, const char *why)
{
    log_warn_limited("connection closed", "port=%s listen=%s peer=%s reason=%s trusted=%u untrusted=%u",
                     s->cfg.name, log_q(s->shown), log_q(c->peer), log_q(why), s->ntrusted, s->nuntrusted);
}

/* The oldest untrusted connection (trusted 0) or the trusted one silent for
 * longest (trusted 1), except keep. */
static struct spconn *pick(struct sprep *s, int trusted, const struct spconn *keep)
{
    struct spconn *best = NULL;
    for (struct spconn *c = s->conns; c; c = c->next) {
        if (c == keep || c->trusted != trusted)
            continue;
        if (!best || (trusted ? c->last_ms < best->last_ms : c->seq < best->seq))
            best = c;
    }
    return best;
}

static void on_timer(uv_timer_t *t)
{
    struct spconn *c = t->data;
    struct sprep *s = c->s;
    uint64_t now = uv_now(s->loop);

    if (c->closing)
        return;
    if (!c->trusted) {
        log_evict(s, c, c->rd == RD_SPHDR ? "no SP header in time" : "no authenticated request in time");
        conn_close(c);
    } else if (now - c->last_ms >= s->cfg.idle_ms) {
        log_debug("idle connection closed", "port=%s peer=%s idle_ms=%llu", s->cfg.name, log_q(c->peer),
                  (unsigned long long)(now - c->last_ms));
        conn_close(c);
    } else {
        uv_timer_start(&c->timer, on_timer, s->cfg.idle_ms - (now - c->last_ms), 0);
    }
}

static void make_trusted(struct sprep *s, struct spconn *c)
{
    if (s->ntrusted >= s->cfg.max_trusted) {
        struct spconn *old = pick(s, 1, c);
        if (old) {
            log_evict(s, old, "every trusted connection was taken: the one silent for longest made room");
            conn_close(old);
        }
    }
    c->trusted = 1;
    s->nuntrusted--;
    s->ntrusted++;
    uv_timer_start(&c->timer, on_timer, s->cfg.idle_ms, 0);
}

/* ---- writing ---- */

static void on_written(uv_write_t *req, int status)
{
    struct spwrite *w = (struct spwrite *)req;
    struct spconn *c = w->c;
    c->pending -= w->bytes;
    free(w);
    if (status < 0 && !c->closing)
        conn_close(c);
    conn_unref(c);
}

static int queue(struct spconn *c, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, int counted)
{
    struct spwrite *w;
    uv_buf_t buf;
    size_t n = alen + blen;

    if (c->closing)
        return -1;
    if (counted && c->pending + n > c->s->cfg.max_pending) {
        log_evict(c->s, c, "not reading its replies");
        conn_close(c);
        return -1;
    }
    if (!(w = malloc(sizeof *w + n))) {
        conn_close(c);
        return -1;
    }
    memcpy(w->data, a, alen);
    if (blen)
        memcpy(w->data + alen, b, blen);
    w->c = c;
    w->bytes = n;
    buf = uv_buf_init((char *)w->data, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) < 0) {
        free(w);
        conn_close(c);
        return -1;
    }
    c->pending += n;
    c->refs++;
    return 0;
}

int sprep_reply(sprep *s, void *ctl, const void *buf, size_t len, err *e)
{
    struct sprep_ctl *x = ctl;
    uint8_t head[8 + sizeof x->bt];
    uint64_t n;
    (void)s;

    if (!x)
        return err_set(e, CODE_INTERNAL, "reply without a request");
    n = x->btlen + len;
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)(n >> (56 - 8 * i));
    memcpy(head + 8, x->bt, x->btlen);
    if (!x->c->closing)
        queue(x->c, head, 8 + x->btlen, buf, len, 1);
    sprep_ctl_free(x);
    return CODE_OK;
}

void sprep_ctl_free(void *ctl)
{
    struct sprep_ctl *x = ctl;
    if (!x)
        return;
    conn_unref(x->c);
    free(x);
}

/* ---- reading ---- */

/* A whole message: split the backtrace off and hand the request up. 0, or -1
 * when the connection was closed. */
static int deliver(struct spconn *c)
{
    struct sprep *s = c->s;
    struct sprep_ctl *x;
    size_t bt = 0;

    for (;;) {
        if (bt + 4 > c->blen || bt >= sizeof x->bt) {
            log_evict(s, c, "a request without a request id");
            conn_close(c);
            return -1;
        }
        bt += 4;
        if (c->body[bt - 4] & 0x80)
            break;
    }
    if (!(x = calloc(1, sizeof *x))) {
        conn_close(c);
        return -1;
    }
    x->c = c;
    x->btlen = bt;
    memcpy(x->bt, c->body, bt);
    c->refs++;
    c->last_ms = uv_now(s->loop);
    if (!c->trusted && s->cfg.vouch && s->cfg.vouch(s->cfg.data, c->body + bt, c->blen - bt))
        make_trusted(s, c);
    s->cfg.on_msg(s, c->body + bt, c->blen - bt, x);
    return c->closing ? -1 : 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    struct spconn *c = h->data;
    (void)suggested;
    *b = uv_buf_init((char *)c->s->rbuf, READ_CHUNK);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    struct spconn *c = st->data;
    struct sprep *s = c->s;
    const uint8_t *p = (const uint8_t *)b->base;
    size_t n = nread > 0 ? (size_t)nread : 0;

    if (c->closing)
        return;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    c->refs++; /* deliver may close c: keep it until this read is parsed */
    while (n > 0 && !c->closing) {
        if (c->rd == RD_SPHDR || c->rd == RD_LEN) {
            size_t k = 8 - c->got < n ? 8 - c->got : n;
            memcpy(c->head + c->got, p, k);
            c->got += k;
            p += k;
            n -= k;
            if (c->got < 8)
                break;
            c->got = 0;
            if (c->rd == RD_SPHDR) {
                if (memcmp(c->head, "\0SP\0", 4) != 0 || c->head[6] || c->head[7] ||
                    ((c->head[4] << 8) | c->head[5]) != SP_PROTO_REQ) {
                    log_evict(s, c, "not an SP REQ peer (bad protocol header)");
                    conn_close(c);
                    break;
                }
                c->rd = RD_LEN;
                continue;
            }
            uint64_t len = 0;
            for (int i = 0; i < 8; i++)
                len = len << 8 | c->head[i];
            if (len > s->cfg.max_msg + 4 * SP_MAX_HOPS) {
                log_evict(s, c, "a request larger than the limit");
                conn_close(c);
                break;
            }
            /* a large request from a connection not yet authenticated: only
             * as many bytes of those at once as the cap allows */
            if (!c->trusted && len > SPREP_SMALL_MSG && s->cfg.max_untrusted_bytes) {
                if (s->untrusted_big + len > s->cfg.max_untrusted_bytes) {
                    log_evict(s, c, "a large request while other connections not yet authenticated were "
                              "sending theirs");
                    conn_close(c);
                    break;
                }
                c->big = (size_t)len;
                s->untrusted_big += c->big;
            }
            c->blen = (size_t)len;
            if (n >= c->blen) {
                /* the whole body came in this read: handed up from the read
                 * buffer, not copied (on_msg keeps nothing past its return) */
                int rc;
                c->body = (uint8_t *)p;
                c->body_borrowed = 1;
                p += c->blen;
                n -= c->blen;
                c->rd = RD_LEN;
                rc = deliver(c);
                body_free(c);
                if (rc < 0)
                    break;
                continue;
            }
            if (!(c->body = malloc(c->blen ? c->blen : 1))) {
                conn_close(c);
                break;
            }
            c->rd = RD_BODY;
        }
        if (c->rd == RD_BODY) {
            size_t k = c->blen - c->got < n ? c->blen - c->got : n;
            memcpy(c->body + c->got, p, k);
            c->got += k;
            p += k;
            n -= k;
            if (c->got < c->blen)
                break;
            c->got = 0;
            c->rd = RD_LEN;
            int rc = deliver(c);
            body_free(c);
            if (rc < 0)
                break;
        }
    }
    conn_unref(c);
}

/* ---- accepting ---- */

static void on_connection(uv_stream_t *server, int status)
{
    static const uint8_t sphdr[8] = {0, 'S', 'P', 0, 0, SP_PROTO_REP, 0, 0};
    struct sprep *s = server->data;
    struct spconn *c;

    if (status < 0) {
        /* out of descriptors: libuv accepted and closed the connection with
         * its reserve descriptor, so this does not spin */
        uvtcp_accept_failed(s->cfg.name, s->shown, status);
        return;
    }
    if (s->closing)
        return;
    if (s->nuntrusted >= s->cfg.max_untrusted) {
        struct spconn *old = pick(s, 0, NULL);
        if (old) {
            log_evict(s, old, "every slot for connections not yet authenticated was taken: the oldest made room");
            conn_close(old);
        }
    }
    if (!(c = calloc(1, sizeof *c))) {
        (void)uvtcp_drop(s->loop, server, NULL, 0);
        return;
    }
    c->s = s;
    c->refs = 1;
    c->seq = ++s->seq;
    c->last_ms = uv_now(s->loop);
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    s->nopen++;
    s->nuntrusted++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uvtcp_peer_name(&c->tcp, c->peer, sizeof c->peer);
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_start(&c->timer, on_timer, s->cfg.untrusted_ms, 0);
    if (queue(c, sphdr, sizeof sphdr, NULL, 0, 0) != 0)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

int sprep_start(uv_loop_t *loop, const char *host, int port, const struct sprep_cfg *cfg, sprep **out,
                int *port_out, err *e)
{
    struct sprep *s;
    struct sockaddr_storage ss;
    int sl = sizeof ss, rc;
    const char *ip = !strcmp(host, "*") || !*host ? "0.0.0.0" : !strcmp(host, "localhost") ? "127.0.0.1" : host;

    *out = NULL;
    memset(&ss, 0, sizeof ss);
    if ((strchr(ip, ':') ? uv_ip6_addr(ip, port, (struct sockaddr_in6 *)&ss)
                         : uv_ip4_addr(ip, port, (struct sockaddr_in *)&ss)) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "cannot listen on '%s': not a local IP address", host);
    if (!(s = calloc(1, sizeof *s)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the %s port", cfg->name);
    s->loop = loop;
    s->cfg = *cfg;
    addr_format(ip, port, s->shown, sizeof s->shown);
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->listener_open = 1;
    if ((rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection)) != 0 ||
        (rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &sl)) != 0) {
        int code = err_set(e, rc == UV_EADDRINUSE ? CODE_ALREADY_EXISTS : CODE_UNAVAILABLE,
                           "cannot listen on %s: %s", s->shown, uv_strerror(rc));
        sprep_close(s);
        return code;
    }
    if (port_out)
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
    *out = s;
    return CODE_OK;
}
