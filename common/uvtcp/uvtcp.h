/* What every libuv TCP listener of the daemons does the same way: naming the
 * peer, dropping a connection it will not serve, and saying that accept
 * failed. */
#ifndef TPUEMU_COMMON_UVTCP_H
#define TPUEMU_COMMON_UVTCP_H

#include <stddef.h>
#include <uv.h>

/* "ip:port" of the other side ("[v6]:port"), or "" when unknown. */
void uvtcp_peer_name(uv_tcp_t *t, char *out, size_t n);

/* Accepts the pending connection and closes it at once, so the backlog
 * drains (the daemon is stopping or out of memory). 1 if one was accepted;
 * *peer (if not NULL, n bytes) gets its name. */
int uvtcp_drop(uv_loop_t *loop, uv_stream_t *server, char *peer, size_t n);

/* A listener's accept failed (status < 0 from libuv). libuv has accepted and
 * closed the pending connection with its reserve descriptor, so the listener
 * does not spin; this writes one rate-limited warn line naming the port and,
 * when descriptors ran out, what to raise. */
void uvtcp_accept_failed(const char *port, const char *listen, int status);

#endif
