/* Heartbeat: the worker's link to the resolver (an spreq: one TCP connection
 * speaking nanomsg's REQ protocol). Each tick sends a fresh Heartbeat carrying
 * the whole WorkerInfo, so a restarted resolver relearns this core from the
 * next tick. An unanswered request is replaced by the next tick's on the same
 * connection (its late reply is dropped by request id): a resolver that is
 * slow, not gone, is not made slower by reconnections. A connection
 * unanswered for UNREACHABLE_TICKS beats is made anew (it may be half open).
 * The reply assigns the core index and the interval.
 *
 * A reply counts only when it answers the request in flight (request_id is
 * its nonce); anything else, such as an old refusal replayed on the path, is
 * ignored. Refusals that retrying fixes (a replay, clocks apart, the resolver
 * busy) are logged (at most once a minute while they last) and the next tick
 * sends a fresh heartbeat. The daemon stops with exit status 3 only for what a
 * person must fix: another live worker holding this core, settings the
 * resolver refuses, and, once HB_STRIKES replies in a row say so, a token or
 * protocol version that differs from the resolver's; the message says what to
 * do.
 *
 * A worker that stops cleanly leaves: hb_leave() sends a Leave naming this
 * core and incarnation (in place of any unanswered heartbeat) and closes once it is answered or
 * HB_LEAVE_MS passed, so the resolver forgets the core at once instead of
 * waiting for it as a dead one. */
#ifndef TPUEMU_WORKER_HEARTBEAT_H
#define TPUEMU_WORKER_HEARTBEAT_H

#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "ident.h"
#include "prom.h"
#include "spreq.h"
#include "status.h"
#include "tpuemu.pb-c.h"

/* What the heartbeat needs from its owner; every pointer must outlive it. */
struct hb_env {
    uv_loop_t *loop;
    const auth *auth;
    const char *resolver_url;  /* tcp://host:port */
    struct core_ident *id;     /* the core index the resolver assigns is set here */
    /* Fills out (an initialized WorkerInfo) for the next heartbeat. */
    void (*info)(void *arg, Tpuemu__WorkerInfo *out);
    /* The resolver refused this worker for good (logged): stop the daemon. */
    void (*refused)(void *arg, int exit_code);
    void *arg;
};

struct heartbeat {
    struct hb_env env;
    spreq *rq;            /* the link to the resolver; NULL until the first beat after a reconnect */
    uv_timer_t timer;
    int started;
    unsigned interval_ms; /* 1000 until the resolver says otherwise */
    uint64_t last_nonce;  /* of the request in flight; 0: none */
    uint64_t asked_ms;    /* when it was sent (wire_now_ms) */
    unsigned unanswered;  /* ticks in a row without a reply */
    int registered;       /* got a HeartbeatReply since start */
    int unreachable;      /* "resolver unreachable" was logged */
    int last_error;       /* code of the last error reply, to log changes once */
    prom_counter sent, acked; /* heartbeats sent, and accepted by the resolver */
    uint64_t last_warn_ms; /* when a transient refusal was last logged */
    unsigned strikes;     /* replies in a row saying the token or version differs */
    int leaving;          /* a Leave is on its way; only its answer counts */
};

#define HB_LEAVE_MS 1000u /* how long a stopping worker waits for its Leave's answer */

/* Before anything reads it (the metrics may, before hb_start). */
void hb_init(struct heartbeat *hb, const struct hb_env *env);
/* Connects to env->resolver_url and sends the first heartbeat at once. */
int hb_start(struct heartbeat *hb, err *e);
void hb_stop(struct heartbeat *hb);
/* Sends the next heartbeat now (news for the resolver, such as a notice),
 * unless one is in flight: the news then goes with the next beat. */
void hb_beat_now(struct heartbeat *hb);
/* Stops heartbeating and tells the resolver this core leaves (when it was
 * registered and the resolver answers), preempted or stopped; the handles
 * close by themselves after the answer or HB_LEAVE_MS. hb_stop() may still
 * be called after it. */
void hb_leave(struct heartbeat *hb, int preempted);

#endif
