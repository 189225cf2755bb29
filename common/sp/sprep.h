/* A nanomsg-compatible REP endpoint (the SP protocol over TCP) on a libuv
 * loop, with the per-connection control nanomsg does not give: nanomsg's own
 * listener accepts without a bound and spins on EMFILE, so idle connections
 * from anyone could take every descriptor and the loop's CPU.
 *
 * Wire (what nanomsg 1.x REQ peers speak): each side sends an 8-byte header
 * (00 'S' 'P' 00, the protocol as 16 bits big-endian, 00 00) at once; then
 * messages, each an 8-byte big-endian length and that many bytes. A request
 * begins with its backtrace: 32-bit big-endian words up to and including the
 * first with the top bit set (the REQ socket's request id); the reply carries
 * the same backtrace in front of its body.
 *
 * Connection limits, by kind of peer:
 *   - untrusted: connected, no vouched message yet (cfg.vouch says whether a
 *     message proves the peer holds the cluster token). At most
 *     max_untrusted; a new connection past that closes the oldest untrusted
 *     one. Each has untrusted_ms from its connect to send a vouched message.
 *   - trusted: has sent one. At most max_trusted; one more closes the trusted
 *     connection silent for longest. One silent for idle_ms is closed.
 * Untrusted connections never take a trusted slot, so strangers without the
 * token cannot keep workers and clients out. A nanomsg REQ peer whose
 * connection is closed reconnects and resends its request by itself.
 *
 * Running out of descriptors: libuv keeps a reserve descriptor and accepts
 * and closes a pending connection with it (no busy loop); that is logged,
 * rate-limited. Every size is bounded before it is allocated (max_msg).
 * Loop thread only. */
#ifndef TPUEMU_COMMON_SPREP_H
#define TPUEMU_COMMON_SPREP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "status.h"

typedef struct sprep sprep;

#define SPREP_SMALL_MSG (64u * 1024u)

/* One request: buf (len bytes, after the backtrace) is valid only during the
 * call; ctl is the way back to its connection, to hand to exactly one
 * sprep_reply() or sprep_ctl_free(), now or later. */
typedef void (*sprep_msg_cb)(sprep *s, const uint8_t *buf, size_t len, void *ctl);
/* 1 if this request proves its sender holds the cluster token. */
typedef int (*sprep_vouch_cb)(void *data, const uint8_t *buf, size_t len);

struct sprep_cfg {
    const char *name;       /* in log lines: "control" */
    size_t max_msg;         /* largest request body; a larger one closes the connection */
    size_t max_pending;     /* reply bytes queued per connection before it is closed (a peer not reading) */
    size_t max_untrusted_bytes; /* requests over SPREP_SMALL_MSG from untrusted connections, all
                                   together, being read at once (0: each up to max_msg) */
    unsigned max_trusted;
    unsigned max_untrusted;
    unsigned untrusted_ms;  /* to send a vouched request, from connect */
    unsigned idle_ms;       /* a trusted connection silent this long is closed */
    sprep_msg_cb on_msg;
    sprep_vouch_cb vouch;
    void *data;             /* the owner's; passed to vouch */
};

/* Listens on host:port (port 0: the kernel picks; *port_out gets it). */
int sprep_start(uv_loop_t *loop, const char *host, int port, const struct sprep_cfg *cfg, sprep **out,
                int *port_out, err *e);
/* Queues the reply to the request of ctl (consumed). When its connection is
 * gone the reply is dropped and CODE_OK returned (nanomsg does the same). */
int sprep_reply(sprep *s, void *ctl, const void *buf, size_t len, err *e);
void sprep_ctl_free(void *ctl);
void *sprep_data(const sprep *s);
/* Stops listening and closes every connection; s is freed once all are
 * closed (a ctl still held keeps only its own small record). */
void sprep_close(sprep *s);

#endif
