/* The tpu-resolver daemon's one context, and the request plumbing shared by
 * handlers.c (dispatch, registration, cluster spec) and system.c (initialize,
 * shutdown, system check). Loop thread only; no global state besides this. */
#ifndef TPUEMU_RESOLVER_RESOLVER_H
#define TPUEMU_RESOLVER_RESOLVER_H

#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "auth.h"
#include "drc.h"
#include "events.h"
#include "metrics.h"
#include "sprep.h"
#include "registry.h"
#include "system.h"
#include "wire.h"

#define RSV_SENDER "resolver"
#define RSV_MAX_CLAIMS 64 /* probes of previous holders waiting at once */
#define RSV_UNTRUSTED_MS 10000u /* a connection's time to send an authenticated request */
#define RSV_IDLE_MS 120000u     /* an authenticated connection silent this long is closed (at least) */
#define RSV_LEFT_MAX 256  /* incarnations that left, remembered for the replay window */

/* A request whose reply may wait: the raw REP routing header and the nonce
 * the reply's request_id must carry (the refused message's own, if it could
 * be read; 0 if not). Owned by whoever holds it until rsv_reply*() consumes
 * it. The reply to a request that was opened is kept in the duplicate-request
 * cache; a refusal (refused != 0) is not. */
typedef struct rreq {
    void *ctl;
    uint64_t id;
    int refused;
} rreq;

/* A heartbeat claiming a (host, core) that a live entry holds, waiting for
 * the probe of that entry. */
struct claim {
    struct claim *next;
    uint64_t tag;
    rreq req;
    winfo w;             /* the claimant */
    uint64_t old_inc;    /* the holder probed */
};

typedef struct resolver {
    uv_loop_t *loop;
    auth auth;
    replay *replay;
    drc *drc;            /* answers byte-identical resends with the original reply */
    sprep *rep;          /* the control port (workers and clients) */
    uv_timer_t dead_timer;
    uint64_t dead_timer_ms;    /* when it last ran (wire_now_ms) */
    uint64_t trim_ms;          /* when the heap was last trimmed (memtrim.h) */
    uv_signal_t sigint, sigterm;
    /* the heartbeat interval the workers are told: --heartbeat-ms, stretched
     * on a machine running more emulated cores than its CPUs keep up with
     * (machine_stretch; rsv_machine_update). The dead-core time is
     * dead_after of them. */
    uint32_t heartbeat_ms, heartbeat_flag_ms, dead_after, max_cores;
    uint32_t machine_cores, machine_cpus; /* the busiest machine's (0: none told) */
    /* after the interval shrank: cores may beat at the old one until they
     * hear the new; the dead-core check allows for it until then */
    uint32_t heartbeat_old_ms;
    uint64_t heartbeat_old_until;
    uint64_t forget_after_ms; /* a dead core silent this long is forgotten; 0: never */
    char tpu_name[64];        /* --name: the TPU node name clients may look up; "" if none */
    registry reg;
    /* incarnations that left lately: a heartbeat of theirs still on its way
     * (sent just before the Leave) must not register the core again */
    struct { uint64_t inc, at_ms; } left[RSV_LEFT_MAX];
    size_t left_next;
    rsys sys;
    struct claim *claims;
    size_t nclaims;
    uint64_t next_tag;   /* tags pending operations so late callbacks find nothing */
    struct rmetrics metrics;
    struct rsv_events events; /* for the console */
    int stopping;
    /* a fault injected into the resolver itself (chaos.c) */
    uv_timer_t fault_timer;
    int fault_kind;          /* the kill or pause about to be done; 0: none */
    uint32_t fault_ms;
    pid_t fault_helper;      /* of the pause in effect; 0: none */
    uint64_t fault_until_ms; /* uv_now when the pause and its grace are over */
} resolver;

/* Liveness (liveness.c). Counts the live cores on each machine (boot id)
 * and sets heartbeat_ms from the busiest machine's cores per CPU; logs a
 * change. */
void rsv_machine_update(resolver *r);
/* How long a core may stay silent before it is dead (ms). */
uint64_t rsv_dead_ms(const resolver *r);

/* Seals m as the reply to req and sends it; consumes req->ctl. */
void rsv_reply(resolver *r, rreq *req, wire_msg *m);
void rsv_reply_error(resolver *r, rreq *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The sprep callback of the control port. */
void rsv_on_request(sprep *s, const uint8_t *buf, size_t len, void *ctl);

/* The entry's control link, made on first use; NULL with e set on failure. */
struct corelink *rsv_link(resolver *r, rentry *en, err *e);
void rsv_drop_link(rentry *en);

/* Graceful stop: answers every waiting claim with UNAVAILABLE. */
void rsv_stop_claims(resolver *r);

/* Forgetting cores (forget.c). rsv_forget() logs, counts and removes en (its
 * link closed, the entry freed); the caller then calls sys_on_change(), so
 * that an initialize waiting for a count of cores looks again. */
void rsv_forget(resolver *r, rentry *en, enum forget_reason why);
const char *rsv_forget_reason_name(enum forget_reason why);
/* 1 if incarnation inc sent a Leave within the replay window. */
int rsv_left_lately(const resolver *r, uint64_t inc);
/* Leave (a worker stopping) and ForgetCore (an operator) requests. */
void rsv_leave(resolver *r, rreq *req, const Tpuemu__Leave *q);
void rsv_forget_core(resolver *r, rreq *req, const Tpuemu__ForgetCore *q);
/* InjectFault aimed at the resolver: kill or pause (chaos.c). */
void rsv_inject_fault(resolver *r, rreq *req, const Tpuemu__InjectFault *q);
/* The dead-check timer: forgets cores dead for longer than forget_after_ms. */
void rsv_expire(resolver *r);

#endif
