/* A small HTTP/1.1 server on a daemon's libuv loop, for its Prometheus metrics
 * and health check, and the blocking client that probes it.
 *
 * The server answers GET and HEAD of a fixed table of paths, one request per
 * connection (Connection: close). It must never let a client hurt the daemon:
 * the request head is bounded (HTTPD_MAX_REQUEST, else 431), a body is refused
 * (413), a client has HTTPD_READ_TIMEOUT_MS to send its request (else 408) and
 * as long again to take the answer, at most HTTPD_MAX_CONNS connections are
 * open (a new one closes the oldest that has not sent its request yet; with
 * none such, it gets a 503), and anything malformed is a 400. Unknown
 * paths are 404, other methods 405. Each refusal is one logfmt warn line,
 * rate-limited as every line a stranger can cause (log_limited).
 * Loop thread only. */
#ifndef TPUEMU_COMMON_HTTPD_H
#define TPUEMU_COMMON_HTTPD_H

#include <stddef.h>

#include <uv.h>

#include "status.h"

#define HTTPD_MAX_REQUEST 8192     /* request line + headers */
#define HTTPD_READ_TIMEOUT_MS 5000 /* to send the whole request head; again to take the answer */
#define HTTPD_LINGER_MS 1000       /* after the answer, reading what the client still sends */
#define HTTPD_MAX_CONNS 64

/* A growing text buffer for response bodies. On allocation failure oom is set
 * and further appends are dropped (the server then answers 500). */
typedef struct hbuf {
    char *p;
    size_t len, cap;
    int oom;
} hbuf;

void hbuf_printf(hbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hbuf_put(hbuf *b, const void *p, size_t n);
void hbuf_free(hbuf *b);

/* The request a route answers. The strings point into the connection's
 * buffer and live while the handler runs. */
struct httpd_req {
    const char *method;        /* "GET" or "HEAD" */
    const char *query;         /* what follows '?' in the target ("" if nothing) */
    const char *authorization; /* the Authorization header's value; NULL if none */
    /* set by the handler if it wants them: */
    const char *content_type;  /* instead of the route's */
    const char *extra_headers; /* whole lines with their CRLFs ("WWW-Authenticate: ...\r\n"), < 200 bytes */
};

/* Fills body and returns the HTTP status to answer with (200, 401, 503, ...).
 * Called on the loop thread while a request is being answered. */
typedef int (*httpd_fn)(void *user, struct httpd_req *q, hbuf *body);

struct httpd_route {
    const char *path;         /* "/metrics"; a query string in the request is ignored */
    const char *content_type; /* "text/plain; version=0.0.4" */
    httpd_fn fn;
};

typedef struct httpd httpd;

/* Listens on host:port (an IP address; "*", "0.0.0.0" and "::" are wildcards,
 * "localhost" is 127.0.0.1). routes (n entries) and user must outlive the
 * server. On failure *out is NULL and e says why (the port taken, not a local
 * address); nothing is left open once the loop has run. name ("metrics") is
 * used in log lines. */
int httpd_start(uv_loop_t *loop, const char *name, const char *host, int port, const struct httpd_route *routes,
                size_t n, void *user, httpd **out, err *e);
/* Stops listening and closes every connection; the server frees itself once
 * its handles are closed. NULL is fine. */
void httpd_close(httpd *h);

/* The client: GET path from host:port within timeout_ms in all (connect,
 * send, read). A wildcard or "localhost" host means 127.0.0.1. CODE_OK with
 * *status and the body's first line in body (NUL-terminated, truncated to n),
 * else UNAVAILABLE or DEADLINE_EXCEEDED with e saying what happened. Blocks. */
int httpd_get(const char *host, int port, const char *path, int timeout_ms, int *status, char *body, size_t n,
              err *e);

/* What the daemons' --probe (path /healthz: alive) and --probe-ready (path
 * /readyz: ready to serve) do: GET path on host:port with a 2 s deadline.
 * Returns the exit status: 0 when it answers 200, 1 otherwise (the reason on
 * stderr), 2 when port is 0 (no metrics port configured). prog names the
 * program in messages. */
int httpd_probe_main(const char *prog, const char *host, int port, const char *path);

#endif
