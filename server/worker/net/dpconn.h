/* One data-plane TCP connection: the framing reader, the handshake, and a
 * bounded write queue. The same object serves both ends: a worker accepting
 * clients and peers (dp_conn_accept), and a worker dialing its ring neighbour
 * (dp_conn_connect). After the handshake every frame goes to on_frame.
 *
 * Reading: the 4-byte prefix, then the header (bounded by FRAME_MAX_HEADER,
 * checked by frame_decode against max_payload), then exactly payload_bytes
 * into a buffer sized from the checked header. Nothing is allocated from an
 * unchecked size. Anything malformed gets an ERROR frame and a close. Bytes
 * are read through a 32 KiB staging buffer (one read(2) for a small frame
 * whole), except the bulk of a large payload, read straight into place.
 *
 * Zero-copy receive (worker-to-worker links): with payload_buf set, the owner
 * picks the destination of each payload once its header is decoded: its own
 * buffer (a posted receive), a throw-away read (discard), or "not yet": then
 * the header is held, what follows is staged until the staging buffer is
 * full, reading pauses (uv_read_stop), the kernel's socket buffer pushes back
 * on the sender, and dp_conn_resume asks again.
 *
 * Writing: dp_conn_send writes the header and the caller's payload straight from
 * its buffer (no copy). Bytes queued but not yet written are bounded by
 * max_pending_write; a peer that does not read is closed. dp_conn_send_ref
 * counts only the header against that bound: for payloads the caller owns and
 * bounds itself (a collective's buffer).
 *
 * Lifetime: the connection frees itself after on_close returns; on_close is
 * called exactly once, from a libuv close callback. Loop thread only. */
#ifndef TPUEMU_WORKER_DPCONN_H
#define TPUEMU_WORKER_DPCONN_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "status.h"
#include "tpuemu.pb-c.h"

typedef struct dp_conn dp_conn;

/* Bytes a connection may queue for writing (copied payloads and headers)
 * before its peer, which does not read, is dropped. */
#define DP_MAX_PENDING (4u * 1024u * 1024u)

/* Called once per dp_conn_send: status 0 when written, a libuv error (<0) when
 * the connection closed first. The payload may be reused from here. */
typedef void (*dp_write_cb)(void *arg, int status);

/* payload_buf answers */
enum dp_buf { DP_BUF_MALLOC, DP_BUF_INTO, DP_BUF_DISCARD, DP_BUF_WAIT, DP_BUF_FAILED };

struct dp_conn_cfg {
    const auth *auth;          /* cluster key; must outlive the connection */
    const char *self_name;     /* AUTH.peer when connecting: "worker h0/3" */
    uint64_t max_payload;      /* largest payload accepted in one frame */
    size_t max_pending_write;  /* bytes queued for writing before the peer is dropped */
    unsigned handshake_ms;     /* connect + handshake deadline */
    /* Handshake complete (may be NULL). */
    void (*on_ready)(dp_conn *c);
    /* A frame after the handshake. payload is malloc'd (NULL when len is 0) and
     * belongs to the callee, which frees it with free(). The callee may call
     * dp_conn_send, dp_conn_fail or dp_conn_close. ERROR frames from the peer
     * do not come here: they close the connection with the peer's status. */
    void (*on_frame)(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len);
    /* The connection is gone. why->code is CODE_OK for an orderly close (the
     * peer hung up after the handshake, or the owner closed it), else why it
     * was refused or failed. c is freed right after this returns. */
    void (*on_close)(dp_conn *c, const err *why);
    /* Optional: where the payload of h (payload_bytes > 0, after the handshake)
     * goes. DP_BUF_INTO with *buf set: read straight into it (exactly
     * payload_bytes), and on_frame gets payload NULL with len set; DP_BUF_MALLOC:
     * as without the callback; DP_BUF_DISCARD: read and drop, on_frame is not
     * called; DP_BUF_WAIT: pause reading until dp_conn_resume; DP_BUF_FAILED: the
     * callee closed or failed the connection. */
    enum dp_buf (*payload_buf)(dp_conn *c, const Tpuemu__FrameHeader *h, void **buf);
    void *data;                /* the owner's */
    /* connecting side: AUTH.replica and AUTH.epoch (worker-to-worker links;
     * leave 0/-1 otherwise) */
    int32_t replica;
    uint64_t epoch;
};

/* Accepts one pending connection from server, sends HELLO, starts the
 * handshake deadline. On success on_close follows sooner or later (even when
 * the first write already failed); on an error return *out is NULL, nothing is
 * left behind and on_close is not called. */
int dp_conn_accept(uv_stream_t *server, const struct dp_conn_cfg *cfg, dp_conn **out, err *e);

/* Dials sa (an IPv4 or IPv6 address) and runs the connecting side of the
 * handshake within handshake_ms; on_ready tells when frames may be sent,
 * on_close when it failed. Error returns as for dp_conn_accept. */
int dp_conn_connect(uv_loop_t *loop, const struct sockaddr *sa, const struct dp_conn_cfg *cfg,
                    dp_conn **out, err *e);

/* Queues one frame: h (version set here) and len payload bytes, which must stay
 * valid until cb (may be NULL) is called. h->payload_bytes is set to len.
 * CODE_FAILED_PRECONDITION before the handshake is done or while closing;
 * CODE_RESOURCE_EXHAUSTED (and the connection is closed) when the write queue
 * would exceed its bound. cb is called in every case where CODE_OK was returned. */
int dp_conn_send(dp_conn *c, Tpuemu__FrameHeader *h, const void *payload, size_t len, dp_write_cb cb,
                 void *arg);

/* As dp_conn_send, but the payload is not counted against max_pending_write. */
int dp_conn_send_ref(dp_conn *c, Tpuemu__FrameHeader *h, const void *payload, size_t len,
                     dp_write_cb cb, void *arg);

/* Reading paused by DP_BUF_WAIT: asks payload_buf again (from the loop, not
 * from inside this call). No-op otherwise. */
void dp_conn_resume(dp_conn *c);
/* The payload being read into a DP_BUF_INTO buffer is dropped instead from
 * now on (its owner gave the buffer up); on_frame is not called for it. */
void dp_conn_discard_current(dp_conn *c);
/* Replaces the callbacks and data (e.g. when a link takes an accepted connection over). */
void dp_conn_set_handlers(dp_conn *c, const struct dp_conn_cfg *cfg);
/* Bytes read so far (progress, for timeouts). */
uint64_t dp_conn_bytes_read(const dp_conn *c);
/* Accepting side, after the handshake: the peer's AUTH.replica (-1 or 0 from
 * clients) and AUTH.epoch (0 from clients). */
int32_t dp_conn_auth_replica(const dp_conn *c);
uint64_t dp_conn_auth_epoch(const dp_conn *c);

/* Sends ERROR{code, message} and closes once it is written (at most 1 s). The
 * message also becomes the on_close reason. */
void dp_conn_fail(dp_conn *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Closes now; pending writes are cancelled. why may be NULL (orderly). */
void dp_conn_close(dp_conn *c, const err *why);

const char *dp_conn_peer_addr(const dp_conn *c); /* "127.0.0.1:53412" */
const char *dp_conn_peer_name(const dp_conn *c); /* AUTH.peer of the other side, or "" */
void *dp_conn_data(const dp_conn *c);

#endif
