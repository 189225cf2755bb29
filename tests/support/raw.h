/* Speaking the wires by hand, for tests that send what a well-behaved peer
 * never would: raw SP (a nanomsg REQ socket and crafted bytes), plain TCP, and
 * the data-plane frames. Every call has a deadline. */
#ifndef TPUEMU_TESTS_RAW_H
#define TPUEMU_TESTS_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "frame.h"
#include "wire.h"

/* NN_REQ connected to tcp://addr ("HOST:PORT" or "tcp://HOST:PORT"); -1 on error. */
int raw_req_open(const char *addr, int timeout_ms);
void raw_req_close(int sock);
/* Sends bytes, waits for one reply (malloc'd into *reply). 0, or -1 on timeout/error. */
int raw_req_call(int sock, const void *buf, size_t len, uint8_t **reply, size_t *rlen);

/* Seals m with a (NULL: no token), sends it, opens the reply with a. Returns
 * the wire_open code, or -1 if no reply came; *nonce gets the request nonce. */
int raw_call_msg(int sock, const auth *a, wire_msg *m, wire_msg **reply, uint64_t *nonce);

/* Like wire_seal, but dated sent_unix_ms instead of now (a fast or slow
 * sender's clock). *out is malloc'd; *nonce gets the nonce if not NULL. */
int raw_seal_at(const auth *a, wire_msg *m, uint64_t sent_unix_ms, uint8_t **out, size_t *len,
                uint64_t *nonce);

/* Plain TCP. */
int tcp_connect_addr(const char *hostport, int timeout_ms); /* "127.0.0.1:1234"; -1 on error */
int tcp_send_all(int fd, const void *buf, size_t len);
/* Reads exactly n bytes; 0, or -1 on EOF/error/timeout. */
int tcp_read_n(int fd, void *buf, size_t n, int timeout_ms);
/* 1 if the peer closes (EOF or reset) within timeout_ms, discarding data. */
int tcp_wait_closed(int fd, int timeout_ms);

/* Data-plane frames: writes one frame (header + payload). */
int dp_send(int fd, Tpuemu__FrameHeader *h, const void *payload, size_t plen);
/* Reads one frame header (payload, if any, into *payload, malloc'd, at most 1 MiB). */
int dp_recv(int fd, int timeout_ms, Tpuemu__FrameHeader **h, uint8_t **payload);
/* Connects, reads HELLO, answers AUTH (mac from a; wrong_mac sends a random one;
 * a NULL or disabled auth sends none) and returns the server's answer frame. */
int dp_handshake(const char *data_addr, const auth *a, int wrong_mac, int *fd_out,
                 Tpuemu__FrameHeader **answer, uint8_t client_chal[AUTH_CHALLENGE_BYTES]);

/* GET path from 127.0.0.1:port: the HTTP status (0 if no answer) and the
 * whole body (malloc'd, NUL-terminated; NULL without an answer) in *body if
 * body is not NULL. */
int http_get_all(int port, const char *path, char **body);
/* The value of the sample `name{labels}` (labels exactly as rendered, or NULL
 * for none) in 127.0.0.1:port's /metrics, -1 if it is not there; the GET's
 * status in *status. */
double http_metric(int port, const char *name, const char *labels, int *status);

#endif
