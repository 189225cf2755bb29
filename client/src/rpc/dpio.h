/* The client's data-plane I/O: N connections to the cores' data-plane ports
 * driven together by one poll() loop. Per connection: a queue of frames to
 * write (prefix + header, then the payload straight from the caller's
 * segments), a frame reader that puts each payload straight where the owner
 * says, and one error string naming the core and what went wrong. The owner
 * (the collectives' exchange, the training requests, the profiler) only
 * describes its frames through a dpio_ops table; dpio never calls up into it
 * any other way and keeps no pointer to it. Uses only common/ and libc.
 * Blocking: dpio_dial, dpio_connect and dpio_run wait at most until the
 * deadline they are given. Not thread-safe: one thread drives a set of
 * connections. Never installed. */
#ifndef TPUEMU_CLIENT_DPIO_H
#define TPUEMU_CLIENT_DPIO_H

#include <stddef.h>
#include <stdint.h>

#include "addr.h"
#include "auth.h"
#include "cancel.h"
#include "frame.h"
#include "status.h"

#define DPIO_HOST_MAX 64
/* How long opening and authenticating one data connection may take. */
#define DPIO_CONNECT_MS 5000u

/* One piece of a frame's payload, written straight from the caller's memory. */
struct dpio_seg {
    const void *p;
    size_t n;
};

struct dpio_out; /* a queued frame (dpio.c) */

/* One data-plane connection. The owner fills host, core and addr (and fd = -1)
 * before the first dpio_dial and may read every field above the line; the rest
 * is dpio's. A connection that was opened is closed with dpio_close. */
struct dpio_conn {
    char host[DPIO_HOST_MAX];
    int core;
    char addr[ADDR_HOST_MAX + 16]; /* "ADDR:PORT" */
    int fd;                        /* -1: not connected */
    int reading;                   /* 1: polled for input in dpio_run (the owner sets it;
                                      0 again once on_frame says "stop") */
    uint64_t max_payload;          /* largest payload a header may announce; 0: FRAME_MAX_PAYLOAD */
    int err_code;                  /* CODE_* of the last failure, CODE_OK: none */
    char err[ERR_MSG_MAX];         /* "core h1/3 closed its data connection ..." */
    /* ---- dpio's own ---- */
    struct dpio_out *oq, *oq_tail; /* frames still to write, oldest first */
    int wfailed;                   /* a write failed: the queue was dropped */
    int rd;                        /* reader state */
    uint8_t pre[FRAME_PREFIX_BYTES];
    uint8_t *hdr;                  /* FRAME_MAX_HEADER bytes, allocated on first use */
    uint32_t hlen;
    size_t got;
    uint8_t *dst;                  /* payload destination; NULL: read and drop */
    uint64_t left;                 /* payload bytes still to read */
};

/* What on_header tells the reader to do with the frame's payload. */
enum {
    DPIO_PAYLOAD = 0, /* read h->payload_bytes into *dst (NULL: read and drop them) */
    DPIO_NO_PAYLOAD = 1, /* the frame ends at its header (its payload is not read) */
    DPIO_LOST = -1,   /* the connection is done for: dpio_failf said why (or dpio says
                         "sent a frame that was not expected") */
};

/* How the owner describes its frames. arg is the owner's; i indexes the
 * connection in the array given to dpio_run. */
struct dpio_ops {
    /* A whole header arrived and decoded (version, kind and payload bound
     * checked). h is freed after the call; the owner may take a sub-message
     * out of it (leaving NULL in its place). Returns DPIO_PAYLOAD with *dst
     * set, DPIO_NO_PAYLOAD or DPIO_LOST. */
    int (*on_header)(void *arg, size_t i, Tpuemu__FrameHeader *h, void **dst);
    /* The frame is complete (its payload, got bytes of it kept, is in).
     * Returns 0 to keep reading the connection, 1 when it is done with in
     * this run: reading becomes 0 and what is still queued on it is dropped
     * (dpio_sent_all then says 0). */
    int (*on_frame)(void *arg, size_t i, uint64_t got);
    /* Connection i failed (reading: closed, reset, bad frame, or on_header
     * said so); code and msg are its err_code and err. dpio_close follows. */
    void (*on_lost)(void *arg, size_t i, int code, const char *msg);
    /* Where the owner stands, asked before every poll: DPIO_MORE,
     * DPIO_FAILING (something failed: the rest gets grace_ms) or DPIO_DONE. */
    int (*state)(void *arg);
};

enum { DPIO_MORE = 0, DPIO_FAILING, DPIO_DONE };

/* One run of the loop. label names the traffic in error messages
 * ("all-reduce #812": "... its data connection during all-reduce #812",
 * "... a malformed answer to all-reduce #812"); NULL: no label. Once state
 * says DPIO_FAILING, the deadline becomes at most grace_ms from then
 * (grace_used says so afterwards). */
struct dpio_run {
    const struct dpio_ops *ops;
    void *arg;
    const char *label;
    uint64_t deadline_ms; /* CLOCK_MONOTONIC ms (wire_now_ms) */
    uint64_t grace_ms;    /* 0: none */
    uint64_t grace_used;  /* out: grace_ms if it cut the deadline, else 0 */
    const struct cli_cancel *cancel; /* tpu_cancel's token (cancel.h); NULL: none */
};

/* Why dpio_run returned. */
enum dpio_end {
    DPIO_END_DONE = 0,  /* state said DPIO_DONE */
    DPIO_END_DEADLINE,  /* the deadline (or the grace) passed, or poll() failed */
    DPIO_END_IDLE,      /* no connection left to poll */
    DPIO_END_NOMEM,     /* out of memory before anything was done */
    DPIO_END_CANCELLED, /* tpu_cancel ran (run->cancel) */
};

/* Drives c[0..n): writes every queued frame and reads every connection that
 * is reading or has something to write, all at once, until state says done,
 * the deadline passes, or nothing is left to poll. A connection that fails
 * is reported through on_lost and closed. Partial writes and reads resume at
 * the next call. A failed write drops that connection's queue and keeps
 * reading it (the core's ERROR frame says why it stopped reading). */
enum dpio_end dpio_run(struct dpio_conn *c, size_t n, struct dpio_run *run);

/* Queues a frame: h's payload_bytes is set to the segments' total and h is
 * encoded now; the segments' memory must stay valid until written (or the
 * connection is closed). CODE_OK, CODE_INVALID_ARGUMENT (the header does not
 * fit a frame) or CODE_RESOURCE_EXHAUSTED; the owner words the message. */
int dpio_send(struct dpio_conn *c, Tpuemu__FrameHeader *h, const struct dpio_seg *segs, size_t nseg);

/* Nothing queued on c and no write failed since the last dpio_send. */
int dpio_sent_all(const struct dpio_conn *c);

/* Opens c (fd was -1) over TCP and authenticates as sender, within
 * DPIO_CONNECT_MS and deadline_ms; the socket is non-blocking. Errors are
 * UNAVAILABLE (or the core's refusal) naming the core and its address. */
int dpio_dial(struct dpio_conn *c, const auth *a, const char *sender, uint64_t deadline_ms, err *e);
/* dpio_dial for every connection of c[0..n) that is not open; stops at the first failure. */
int dpio_connect(struct dpio_conn *c, size_t n, const auth *a, const char *sender, uint64_t deadline_ms,
                 err *e);

/* Sets c's error: "core HOST/CORE " + the text. Returns code. For on_header. */
int dpio_failf(struct dpio_conn *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Closes the socket and drops everything queued and half read; c keeps its
 * name and can be dialled again. */
void dpio_close(struct dpio_conn *c);

#endif
