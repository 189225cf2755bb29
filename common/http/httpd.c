/* The metrics and health server (httpd.h): accept with a connection bound,
 * read one request head into a fixed buffer under a deadline, parse it
 * strictly, answer, shut the write side down and read what is left until the
 * client closes (so a client still sending does not get a reset that eats the
 * answer), then close. It must not allocate from what a client sends, nor
 * keep a connection past its deadline. */
#include "httpd.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <arpa/inet.h>

#include "addr.h"
#include "httphead.h"
#include "log.h"
#include "uvtcp.h"

void hbuf_printf(hbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->oom)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t want = b->cap ? b->cap * 2 : 4096;
        while (want < b->len + (size_t)n + 1)
            want *= 2;
        char *p = realloc(b->p, want);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = want;
    }
}

void hbuf_put(hbuf *b, const void *p, size_t n)
{
    if (b->oom || !n)
        return;
    if (b->cap - b->len <= n) {
        size_t want = b->cap ? b->cap : 4096;
        while (want <= b->len + n) {
            if (want > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            want *= 2;
        }
        char *q = realloc(b->p, want);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = want;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void hbuf_free(hbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

enum cstate { C_READING, C_WRITING, C_LINGER };

struct hconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    uv_shutdown_t sd;
    struct httpd *h;
    struct hconn *prev, *next;
    enum cstate state;
    int closing, open_handles;
    size_t len;
    char *out;
    char peer[64];
    char buf[HTTPD_MAX_REQUEST + 1];
};

struct httpd {
    uv_loop_t *loop;
    uv_tcp_t listener;
    const char *name;
    char shown[300];
    const struct httpd_route *routes;
    size_t nroutes;
    void *user;
    struct hconn *conns;
    unsigned nconns;
    int closing, listener_open;
};

/* ---- lifetime ---- */

static void maybe_free(struct httpd *h)
{
    if (h->closing && !h->listener_open && h->nconns == 0)
        free(h);
}

static void on_listener_closed(uv_handle_t *hd)
{
    struct httpd *h = hd->data;
    h->listener_open = 0;
    maybe_free(h);
}

static void on_conn_handle_closed(uv_handle_t *hd)
{
    struct hconn *c = hd->data;
    struct httpd *h = c->h;

    if (--c->open_handles > 0)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->nconns--;
    free(c->out);
    free(c);
    maybe_free(h);
}

static void conn_close(struct hconn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
}

void httpd_close(httpd *h)
{
    if (!h || h->closing)
        return;
    h->closing = 1;
    if (h->listener_open && !uv_is_closing((uv_handle_t *)&h->listener))
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
    for (struct hconn *c = h->conns; c; c = c->next)
        conn_close(c);
    maybe_free(h);
}

/* ---- logging ---- */

static void log_refusal(struct httpd *h, const char *peer, int status, const char *reason, const char *method,
                        const char *path)
{
    log_warn_limited("http request refused", "server=%s listen=%s peer=%s status=%d method=%s path=%s reason=%s",
                     h->name, log_q(h->shown), log_q(peer), status, log_q(method), log_q(path), log_q(reason));
}

/* ---- answering ---- */

static void on_deadline(uv_timer_t *t);

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 304:
        return "Not Modified";
    case 400: return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct hconn *c = req->data;
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    c->state = C_LINGER;
    uv_timer_start(&c->timer, on_deadline, HTTPD_LINGER_MS, 0);
}

static void on_written(uv_write_t *req, int status)
{
    struct hconn *c = req->data;
    if (c->closing)
        return;
    if (status < 0 || uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, on_shutdown) < 0)
        conn_close(c);
}

/* Queues the whole answer; head_only leaves the body out (HEAD). */
static void respond(struct hconn *c, int status, const char *content_type, const char *extra, const char *body,
                    size_t blen, int head_only)
{
    char head[768];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sCache-Control: no-store\r\n"
                     "Connection: close\r\n\r\n",
                     status, reason_phrase(status), content_type, blen, extra ? extra : "");
    size_t hl = n > 0 && (size_t)n < sizeof head ? (size_t)n : 0, total = hl + (head_only ? 0 : blen);
    uv_buf_t b;

    c->state = C_WRITING;
    uv_timer_start(&c->timer, on_deadline, HTTPD_READ_TIMEOUT_MS, 0);
    if (!hl || !(c->out = malloc(total ? total : 1))) {
        conn_close(c);
        return;
    }
    memcpy(c->out, head, hl);
    if (!head_only && blen)
        memcpy(c->out + hl, body, blen);
    b = uv_buf_init(c->out, (unsigned)total);
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0)
        conn_close(c);
}

static void refuse(struct hconn *c, int status, const char *reason, const char *method, const char *path)
{
    char body[256];
    int n = snprintf(body, sizeof body, "%d %s: %s\n", status, reason_phrase(status), reason);
    log_refusal(c->h, c->peer, status, reason, method, path);
    respond(c, status, "text/plain; charset=utf-8", status == 405 ? "Allow: GET, HEAD\r\n" : NULL, body,
            n > 0 && (size_t)n < sizeof body ? (size_t)n : 0, 0);
}

static void handle(struct hconn *c, size_t hlen)
{
    struct httpd *h = c->h;
    struct http_head q;
    const char *why = "";
    const struct httpd_route *rt = NULL;
    int status, head;
    size_t plen;
    hbuf body = {0};

    uv_timer_stop(&c->timer);
    if ((status = http_head_parse(c->buf, hlen, &q, &why)) != 0) {
        refuse(c, status, why, q.method ? q.method : "", q.target ? q.target : "");
        return;
    }
    plen = strcspn(q.target, "?#");
    for (size_t i = 0; i < h->nroutes; i++)
        if (strlen(h->routes[i].path) == plen && !strncmp(h->routes[i].path, q.target, plen))
            rt = &h->routes[i];
    if (!rt) {
        char known[160];
        size_t kl = (size_t)snprintf(known, sizeof known, "no such path (there are");
        for (size_t i = 0; i < h->nroutes && kl < sizeof known; i++)
            kl += (size_t)snprintf(known + kl, sizeof known - kl, "%s %s", i ? "," : "", h->routes[i].path);
        if (kl < sizeof known)
            snprintf(known + kl, sizeof known - kl, ")");
        refuse(c, 404, known, q.method, q.target);
        return;
    }
    head = !strcmp(q.method, "HEAD");
    if (!head && strcmp(q.method, "GET") != 0) {
        refuse(c, 405, "only GET and HEAD are served", q.method, q.target);
        return;
    }
    if (q.has_body) {
        refuse(c, 413, "a GET or HEAD request takes no body", q.method, q.target);
        return;
    }
    struct httpd_req rq = {q.method, q.target[plen] == '?' ? q.target + plen + 1 : "", q.authorization, NULL, NULL};
    status = rt->fn(h->user, &rq, &body);
    if (rq.extra_headers && strlen(rq.extra_headers) >= 200)
        rq.extra_headers = NULL;
    if (body.oom) {
        hbuf_free(&body);
        refuse(c, 500, "out of memory for the answer", q.method, q.target);
        return;
    }
    log_debug("http request", "server=%s peer=%s method=%s path=%s status=%d bytes=%zu", h->name, log_q(c->peer),
              q.method, log_q(q.target), status, body.len);
    respond(c, status, rq.content_type ? rq.content_type : rt->content_type, rq.extra_headers, body.p ? body.p : "",
            body.len, head);
    hbuf_free(&body);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *b)
{
    struct hconn *c = hd->data;
    (void)suggested;
    if (c->state == C_READING)
        *b = uv_buf_init(c->buf + c->len, (unsigned)(HTTPD_MAX_REQUEST - c->len));
    else /* what comes after the request is read and dropped */
        *b = uv_buf_init(c->buf, HTTPD_MAX_REQUEST);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    struct hconn *c = s->data;
    size_t from, hlen;
    (void)b;

    if (c->closing)
        return;
    if (nread < 0) {
        if (c->state == C_READING && c->len)
            log_debug("http client went away mid-request", "server=%s peer=%s bytes=%zu", c->h->name,
                      log_q(c->peer), c->len);
        if (c->state != C_WRITING) /* a write in flight finishes or fails on its own */
            conn_close(c);
        else
            uv_read_stop(s);
        return;
    }
    if (nread == 0 || c->state != C_READING)
        return;
    from = c->len;
    c->len += (size_t)nread;
    if ((hlen = http_head_end(c->buf, c->len, from)) != 0) {
        c->buf[hlen] = '\0';
        handle(c, hlen);
    } else if (c->len >= HTTPD_MAX_REQUEST) {
        refuse(c, 431, "the request head is larger than 8 KiB", "", "");
    }
}

static void on_deadline(uv_timer_t *t)
{
    struct hconn *c = t->data;
    if (c->state != C_READING) {
        conn_close(c);
    } else if (c->len == 0) {
        log_debug("http client sent nothing; closed", "server=%s peer=%s", c->h->name, log_q(c->peer));
        conn_close(c);
    } else {
        refuse(c, 408, "the request head did not arrive within 5 s", "", "");
    }
}

/* Past the connection bound: a fixed 503 and a close, with no buffer, timer
 * or parsing (the answer fits any socket buffer, so the write does not wait). */
struct overflow {
    uv_tcp_t tcp;
    uv_write_t wr;
};

static void on_overflow_closed(uv_handle_t *hd)
{
    free(hd->data);
}

static void on_overflow_written(uv_write_t *req, int status)
{
    struct overflow *o = req->data;
    (void)status;
    uv_close((uv_handle_t *)&o->tcp, on_overflow_closed);
}

static void overflow(struct httpd *h, uv_stream_t *server)
{
    static const char answer[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                 "Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";
    struct overflow *o = calloc(1, sizeof *o);
    uv_buf_t b = uv_buf_init((char *)answer, sizeof answer - 1);

    if (!o)
        return; /* it waits in the backlog until memory comes back */
    uv_tcp_init(h->loop, &o->tcp);
    o->tcp.data = o->wr.data = o;
    if (uv_accept(server, (uv_stream_t *)&o->tcp) != 0) {
        uv_close((uv_handle_t *)&o->tcp, on_overflow_closed);
        return;
    }
    char peer[64];
    uvtcp_peer_name(&o->tcp, peer, sizeof peer);
    log_refusal(h, peer, 503, "too many connections", "", "");
    if (uv_write(&o->wr, (uv_stream_t *)&o->tcp, &b, 1, on_overflow_written) != 0)
        uv_close((uv_handle_t *)&o->tcp, on_overflow_closed);
}

/* HTTPD_MAX_CONNS connections are open and another arrives: the oldest one
 * still waiting for its request head (or lingering after its answer) goes. A
 * probe sends its request at once and is answered in a round trip, so only a
 * client that holds a connection open without asking stays long enough to be
 * the oldest: strangers cannot hold the port and starve /healthz. Connections
 * being answered are left alone (each has its deadline). 1 if one went. */
static int evict_oldest_idle(struct httpd *h)
{
    struct hconn *oldest = NULL;

    for (struct hconn *c = h->conns; c; c = c->next) /* newest first */
        if (!c->closing && (c->state == C_READING || c->state == C_LINGER))
            oldest = c;
    if (!oldest)
        return 0;
    if (oldest->state == C_READING)
        log_refusal(h, oldest->peer, 408, "closed for a newer connection: every connection was taken and this "
                    "one had not sent its request", "", "");
    conn_close(oldest);
    return 1;
}

static void on_connection(uv_stream_t *server, int status)
{
    struct httpd *h = server->data;
    struct hconn *c;

    if (status < 0) {
        /* libuv accepted and closed the connection with its reserve
         * descriptor, so the listener does not spin on EMFILE */
        uvtcp_accept_failed(h->name, h->shown, status);
        return;
    }
    if (h->closing)
        return;
    /* closing connections still count until their handles are closed, later
     * in this loop turn: at most as many again */
    if (h->nconns >= HTTPD_MAX_CONNS && (h->nconns >= 2 * HTTPD_MAX_CONNS || !evict_oldest_idle(h))) {
        overflow(h, server);
        return;
    }
    if (!(c = calloc(1, sizeof *c))) {
        overflow(h, server);
        return;
    }
    c->h = h;
    uv_tcp_init(h->loop, &c->tcp);
    uv_timer_init(h->loop, &c->timer);
    c->tcp.data = c->timer.data = c->wr.data = c->sd.data = c;
    c->open_handles = 2;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h->nconns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uvtcp_peer_name(&c->tcp, c->peer, sizeof c->peer);
    uv_timer_start(&c->timer, on_deadline, HTTPD_READ_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

/* ---- listening ---- */

static const char *local_ip(const char *host)
{
    if (!strcmp(host, "*") || !*host)
        return "0.0.0.0";
    if (!strcmp(host, "localhost"))
        return "127.0.0.1";
    return host;
}

int httpd_start(uv_loop_t *loop, const char *name, const char *host, int port, const struct httpd_route *routes,
                size_t n, void *user, httpd **out, err *e)
{
    struct httpd *h;
    struct sockaddr_storage ss;
    const char *ip = local_ip(host);
    int rc;

    *out = NULL;
    if (port < 1 || port > 65535)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s port %d is outside 1..65535", name, port);
    memset(&ss, 0, sizeof ss);
    if ((strchr(ip, ':') ? uv_ip6_addr(ip, port, (struct sockaddr_in6 *)&ss)
                         : uv_ip4_addr(ip, port, (struct sockaddr_in *)&ss)) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "cannot serve %s on '%s': not a local IP address", name, host);
    if (!(h = calloc(1, sizeof *h)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the %s server", name);
    h->loop = loop;
    h->name = name;
    h->routes = routes;
    h->nroutes = n;
    h->user = user;
    addr_format(ip, port, h->shown, sizeof h->shown);
    uv_tcp_init(loop, &h->listener);
    h->listener.data = h;
    h->listener_open = 1;
    if ((rc = uv_tcp_bind(&h->listener, (const struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&h->listener, 128, on_connection)) != 0) {
        int code = err_set(e, rc == UV_EADDRINUSE ? CODE_ALREADY_EXISTS : CODE_UNAVAILABLE,
                           "cannot serve %s on %s: %s%s", name, h->shown, uv_strerror(rc),
                           rc == UV_EADDRINUSE ? " (choose another --metrics-port)" : "");
        httpd_close(h);
        return code;
    }
    *out = h;
    return CODE_OK;
}
