/* A blocking nanomsg-compatible REQ client (the SP protocol over TCP, as
 * sprep.h describes it) for callers without an event loop: one TCP
 * connection, one request at a time, every wait bounded by a deadline.
 *
 * The client library's calls use this instead of a nanomsg REQ socket.
 * nanomsg 1.1.5's connecting socket binds a local port before each connect;
 * when none is free (a machine running a large pod holds most of them) its
 * retry aborts the whole process on an assertion, and a training driver
 * runs for hours. Here a connect that fails is an error returned to the
 * caller, and a connection is made again only inside a call.
 *
 * A connection that breaks before the reply comes is made again and the
 * same bytes are sent again, while the deadline allows (what a nanomsg REQ
 * peer does: the far side answers a byte-identical resend from its
 * duplicate-request cache). A reply to an earlier request (a late one) is
 * dropped, matched by the SP request id. Not thread-safe. */
#ifndef TPUEMU_COMMON_SPCALL_H
#define TPUEMU_COMMON_SPCALL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "status.h"

typedef struct spcall {
    int fd;                      /* -1: not connected */
    struct sockaddr_storage peer; /* where the connection goes (made again there) */
    socklen_t peer_len;
    uint32_t next_id;
    size_t max_reply;            /* largest reply body; a larger one breaks the connection */
    char shown[300];             /* "host:port", in messages */
    int wake_fd;                 /* -1: none; readable: give up waiting (CODE_CANCELLED) */
} spcall;

/* Sets c up, unconnected. */
void spcall_init(spcall *c, size_t max_reply);

/* Connects to host:port (name looked up now) within timeout_ms and trades
 * the SP headers. On failure *sys_errno (may be NULL) says why: ECONNREFUSED,
 * ETIMEDOUT, or another errno; and e names the address. */
int spcall_connect(spcall *c, const char *host, int port, uint32_t timeout_ms, int *sys_errno, err *e);

/* Sends body as one request and waits for its reply until deadline_ms
 * (wire_now_ms clock). *reply (malloc'd, *reply_len bytes, the body after
 * the backtrace) is the caller's. CODE_DEADLINE_EXCEEDED when the deadline
 * passed; CODE_UNAVAILABLE when the connection could not be kept;
 * CODE_CANCELLED when c->wake_fd became readable while it waited (the
 * connection is closed then: the reply may still come). */
int spcall_request(spcall *c, const void *body, size_t len, uint64_t deadline_ms, uint8_t **reply,
                   size_t *reply_len, err *e);

/* Closes the connection (spcall_connect may be called again). */
void spcall_close(spcall *c);

#endif
