/* A fault-injecting TCP proxy for the control plane: listens on a loopback
 * port, forwards every connection to a target (the resolver), and parses the
 * SP-over-TCP framing both ways (an 8-byte protocol header, then frames of an
 * 8-byte big-endian length and a payload that starts with the 4-byte REQ
 * request id), so a test can act on whole requests and replies:
 *
 *   - drop the next replies: the reply is not forwarded and both connections
 *     are reset at that moment, after the target has handled the request;
 *     nanomsg's REQ socket then reconnects and resends the same bytes;
 *   - inject a reply: the next request is not forwarded and the client gets
 *     the given body instead, under that request's SP id (what someone on the
 *     path can do with a reply recorded earlier).
 *
 * It runs in its own thread; every call here is thread-safe. Connections are
 * bounded (16); loopback only. */
#ifndef TPUEMU_TESTS_PROXY_H
#define TPUEMU_TESTS_PROXY_H

#include <stddef.h>
#include <stdint.h>

typedef struct proxy proxy;

struct proxy_stats {
    int accepted;  /* client connections */
    int requests;  /* request frames forwarded to the target */
    int replies;   /* reply frames forwarded to the client */
    int dropped;   /* replies dropped (with a reset) */
    int resent;    /* requests byte-identical to one whose reply was dropped */
    int injected;  /* replies injected */
};

/* Starts forwarding 127.0.0.1:PORT (PORT chosen by the kernel) to target
 * "127.0.0.1:PORT". NULL on failure. */
proxy *proxy_start(const char *target);
/* Stops the thread, closes everything. */
void proxy_free(proxy *p);
/* "127.0.0.1:PORT" to give the client. */
const char *proxy_addr(const proxy *p);

/* The next n replies from the target are dropped, each resetting both
 * connections. */
void proxy_drop_replies(proxy *p, int n);
/* The next request is answered with body (copied) instead of being forwarded. */
void proxy_inject_reply(proxy *p, const void *body, size_t len);
/* The next n requests are answered by fn instead of being forwarded: fn gets
 * the request's body (the envelope the client sent) and returns a malloc'd
 * reply body in *out (freed by the proxy), or NULL to forward the request
 * after all. fn runs on the proxy's thread. */
typedef uint8_t *(*proxy_responder)(const uint8_t *req, size_t len, void *arg, size_t *out_len);
void proxy_respond(proxy *p, int n, proxy_responder fn, void *arg);
void proxy_get_stats(proxy *p, struct proxy_stats *s);

#endif
