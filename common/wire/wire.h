/* Control-plane messages: sealing a Message into an Envelope (version, MAC) and
 * opening one, checking in this order: size cap before anything, envelope
 * decode, protocol version, MAC, message decode, replay window. Nothing is
 * allocated from a size the peer chose without a bound. */
#ifndef TPUEMU_COMMON_WIRE_H
#define TPUEMU_COMMON_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "status.h"
#include "tpuemu.pb-c.h"

#define WIRE_VERSION 1u
/* Largest request a daemon accepts (also set as NN_RCVMAXSIZE on its sockets). */
#define WIRE_MAX_REQUEST (64u * 1024u)
/* Largest request a worker's control port accepts: the resolver's ResetCore
 * lists every core of the system (about 100 bytes each: 8,192 cores fit). */
#define WIRE_MAX_CONTROL (2u * 1024u * 1024u)
/* Largest reply a client accepts (a cluster spec of 64 cores is about 16 KiB). */
#define WIRE_MAX_REPLY (1024u * 1024u)

typedef Tpuemu__Message wire_msg;

uint64_t wire_now_unix_ms(void); /* CLOCK_REALTIME (plus the skew below), for the replay window */
/* Makes this process's wall clock, as the wire sees it (message dates and the
 * replay window), skew_ms off (an injected clock skew; 0: right again). */
void wire_set_clock_skew_ms(int64_t skew_ms);
uint64_t wire_now_ms(void);      /* CLOCK_MONOTONIC, for ages and deadlines */

/* A daemon that runs for weeks sees its wall clock stepped now and then (by
 * NTP, by hand, by a restored VM) by minutes: its messages would then be
 * dated outside the others' replay window, and theirs outside its own. With
 * wire_clock_hold_steps(1), wire_now_unix_ms() holds off every step of the
 * wall clock of more than WIRE_CLOCK_STEP_MS (it goes on as the boot clock
 * does), and wire_clock_follow() sets it to a trusted peer's clock when the
 * two are more than WIRE_CLOCK_FOLLOW_MS apart: the worker follows the
 * resolver's clock, from the signed answers to its heartbeats, so a step that
 * set a wrong clock right is taken after all. Off by default (the resolver
 * and the clients read the wall clock as it is). */
#define WIRE_CLOCK_STEP_MS 1000
#define WIRE_CLOCK_FOLLOW_MS 2000
#define WIRE_CLOCK_FOLLOW_RTT_MS 1000u /* a slower round trip says too little about the peer's clock */
void wire_clock_hold_steps(int on);
/* Steps held off since the last call, in ms (+: the wall clock jumped ahead). */
int64_t wire_clock_stepped_ms(void);
/* A trusted peer's clock: their_unix_ms, the date of its answer to a request
 * sent at asked_ms and answered at answered_ms (wire_now_ms). Returns the
 * correction made (0: the clocks agree within WIRE_CLOCK_FOLLOW_MS, or the
 * round trip was too slow to tell). */
int64_t wire_clock_follow(uint64_t their_unix_ms, uint64_t asked_ms, uint64_t answered_ms);

/* Fills m's nonce (fresh random), sent_unix_ms and sender, then packs it into a
 * sealed envelope in a malloc'd buffer the caller frees. Returns the nonce in
 * *nonce_out if not NULL (a reply's request_id must match it). */
int wire_seal(const auth *a, const char *sender, wire_msg *m, uint8_t **out, size_t *outlen,
              uint64_t *nonce_out, err *e);
/* The same, dated sent_unix_ms instead of now (tests: a sender whose clock
 * is fast or slow). */
int wire_seal_at(const auth *a, const char *sender, uint64_t sent_unix_ms, wire_msg *m, uint8_t **out,
                 size_t *outlen, uint64_t *nonce_out, err *e);

/* Opens an envelope. r may be NULL (replies are matched by request id instead).
 * On success *out is a decoded message to release with wire_msg_free(). On
 * failure *out is NULL and e says what was wrong with the input:
 *   INVALID_ARGUMENT    oversized, undecodable, no body
 *   FAILED_PRECONDITION protocol version mismatch
 *   UNAUTHENTICATED     missing/wrong MAC, stale or replayed */
int wire_open(const auth *a, replay *r, const uint8_t *buf, size_t len, size_t cap,
              wire_msg **out, err *e);
void wire_msg_free(wire_msg *m);
/* 1 if buf is an envelope of this protocol version (at most WIRE_MAX_CONTROL
 * bytes) with a body, MAC'd under a's key when a has one: its sender holds the
 * cluster token (without a token: it speaks the protocol). The body is not
 * decoded and there is no replay check: the handler does both next. What a
 * control port's connection budget trusts (sprep.h). */
int wire_vouches(const auth *a, const uint8_t *buf, size_t len);

/* The nonce of a message that wire_open() refused, read without trusting it,
 * so that the refusal can name the request it answers; 0 when the envelope or
 * the body cannot be decoded at all (then the refusal answers no request). */
uint64_t wire_peek_nonce(const uint8_t *buf, size_t len, size_t cap);

/* Builds and seals an error reply to request_id. */
int wire_seal_error(const auth *a, const char *sender, uint64_t request_id, int code,
                    const char *message, uint8_t **out, size_t *outlen);

/* Short printable sample of untrusted bytes for a log line ("47 45 54 20 ..."). */
void wire_sample(const uint8_t *buf, size_t len, char *out, size_t outlen);

/* Name of the body case for logs and errors: "heartbeat", "unknown(99)". */
const char *wire_body_name(const wire_msg *m);

#endif
