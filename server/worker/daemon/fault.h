/* Injected faults (InjectFault on the control port: tpuctl chaos,
 * tpu_inject_fault): the worker kills itself, stops every thread for a while,
 * or runs its training compute slower, so that a training job and cluster
 * tooling can be tested against what real pods do. A fault is checked whole
 * before anything happens (an out-of-range field is refused, nothing
 * injected), logged when it takes effect and counted by kind for /metrics.
 * HBM pressure is an allocation in the core's HBM table, listed by name in
 * the out-of-memory errors it causes; an initialize empties HBM, and it.
 * Kill and pause take effect FAULT_DELAY_MS after they are accepted, so the
 * reply is on its way first. A fault may instead wait (FAULT_MAX_SCHEDULED
 * at once) for a delay or for the end of a training step of this core: it is
 * checked when it is accepted, and applied (or logged as not applicable, such
 * as HBM pressure that no longer fits) when its time comes.
 *
 * Preemption and maintenance come as Cloud TPU's do: a notice first (in the
 * core's struct notice, which the heartbeat and every training answer carry),
 * then, notice_ms later, the event: a preempted core terminates (the resolver
 * lists it PREEMPTED); a core in maintenance leaves its system, refuses work
 * for the window, then is back, restarted. One notice at a time.
 *
 * Link faults (delay, loss, partition) concern what this core sends to one
 * peer core; the transport holds those sends back (peers.h:
 * peers_link_fault), reached through env.link_fault, and logs their end. */
#ifndef TPUEMU_WORKER_FAULT_H
#define TPUEMU_WORKER_FAULT_H

#include <sys/types.h>

#include <uv.h>

#include "hbm.h"
#include "ident.h"
#include "notice.h"
#include "trace.h"
#include "prom.h"
#include "status.h"
#include "tpuemu.pb-c.h"

#define FAULT_DELAY_MS 50u
#define FAULT_MAX_MS 600000u /* the longest pause or slow-down: 10 minutes */
/* A pause counts as under way until this long after it ends (another kill or
 * pause is refused until then), so that requests sent while the worker was
 * stopped are answered alike however soon it runs again. */
#define FAULT_PAUSE_GRACE_MS 1000u
#define FAULT_KINDS 11       /* FaultKind values, 0 unused */
#define FAULT_MAX_LATENCY_MS 60000u /* link-delay: the longest a chunk is held */
#define FAULT_MAX_SKEW_MS 3600000
#define FAULT_MAX_SCHEDULED 16
#define FAULT_MAX_DELAY_MS 3600000u /* an hour */
#define FAULT_HBM_NAME "chaos: HBM pressure (tpuctl chaos hbm)"

struct fault_env {
    uv_loop_t *loop;
    /* training compute at pct % of its speed from now on */
    void (*set_throttle)(void *arg, int pct);
    void *arg;
    int base_pct;            /* --throttle-pct: what a slow-down returns to */
    hbm *hbm;                /* the core's, for HBM pressure (loop thread only) */
    struct notice *notice;   /* the core's, set here */
    struct trace *trace;     /* the profiler's ring: each fault is an event in it (may be NULL) */
    /* a notice was given or is over: tell the resolver now */
    void (*notified)(void *arg);
    /* the preemption has come: terminate */
    void (*preempted)(void *arg);
    /* the maintenance window begins (1: leave the system, refuse work) or ends (0) */
    void (*maintenance)(void *arg, int begin);
    /* link faults: whether host/core may be the other end of a link of this
     * core (CODE_OK, or the error), and the fault started on that link (as
     * peers_link_fault) */
    int (*link_check)(void *arg, const char *host, int core, err *e);
    int (*link_fault)(void *arg, int kind, const char *host, int core, uint32_t latency_ms, uint32_t percent,
                      uint32_t duration_ms, uint32_t seed, err *e);
};

/* A fault's fields, as InjectFault gives them. */
struct fault_args {
    int kind;
    uint32_t duration_ms, percent, notice_ms, latency_ms, seed;
    int32_t skew_ms;
    char peer_host[IDENT_HOST_ID_MAX + 1]; /* link faults: the other end */
    int peer_core;
};

/* A fault waiting for its time or its step. */
struct fault_sched {
    uv_timer_t timer;        /* delay_ms */
    uint32_t id;             /* for chaos list / cancel */
    struct fault *f;
    struct fault_args a;     /* a.kind 0: the slot is free */
    uint64_t at_step;        /* 0: by time */
    int trained;             /* the core trained a step since it was scheduled: its run is under way */
};

struct fault {
    struct fault_env env;
    struct fault_sched sched[FAULT_MAX_SCHEDULED];
    uv_timer_t act;          /* a kill or pause, FAULT_DELAY_MS after it was accepted */
    uv_timer_t slow;         /* the end of a slow-down */
    uv_timer_t reap;         /* waits for a pause's helper process */
    uv_timer_t hbm_end;      /* the end of HBM pressure */
    uv_timer_t event;        /* a notice's event: the preemption, the start of maintenance */
    uv_timer_t window;       /* the end of maintenance */
    uv_timer_t skew_end;     /* the end of a clock skew */
    uint32_t hbm_id;         /* its allocation; 0: none */
    uint64_t hbm_bytes;      /* its size */
    int pending;             /* the kill or pause act will do; 0: none */
    uint32_t pause_ms;
    pid_t helper;            /* of the pause in effect; 0: none */
    int started;             /* fault_init done, fault_stop not yet */
    uint32_t next_id;        /* of the next scheduled fault */
    /* the last listing's storage (a CoreReport points into it until sent) */
    Tpuemu__ScheduledFault listed[FAULT_MAX_SCHEDULED];
    Tpuemu__ScheduledFault *listed_p[FAULT_MAX_SCHEDULED];
    char listed_host[FAULT_MAX_SCHEDULED][IDENT_HOST_ID_MAX + 1];
    prom_counter injected[FAULT_KINDS]; /* by FaultKind */
    /* the faults that took effect, and the last one ("slow 50% for 3000 ms"),
     * told in heartbeats for the cluster console's event log */
    uint32_t recorded;
    char last[96];
};

void fault_init(struct fault *f, const struct fault_env *env);
/* Checks f and schedules it: CODE_OK, or an error code with e set and
 * nothing changed. */
int fault_inject(struct fault *f, const Tpuemu__InjectFault *req, err *e);
/* The faults waiting on this core, after cancelling the one numbered cancel
 * (0: none; NOT_FOUND with e set if none waits under it) or all of them
 * (cancel_all): fills report's scheduled list (valid until the next call) and
 * cancelled count. */
int fault_scheduled(struct fault *f, uint32_t cancel, int cancel_all, Tpuemu__CoreReport *report, err *e);
/* A new system: the faults waiting for a step whose run is over (the core
 * trained since they were scheduled) are cancelled; a fault scheduled before
 * the run it is for (no step trained since) waits for that run. Returns how
 * many were cancelled. */
int fault_clear_steps(struct fault *f);
/* Fires the faults scheduled for step (loop thread, after the step). */
void fault_on_step(struct fault *f, uint64_t step);
/* "kill", "pause", "slow", "hbm", "preempt", "maintenance", "skew", "link-delay", "link-loss", "partition" */
const char *fault_kind_name(int kind);
/* Cancels what is scheduled and closes the timers (the loop can then end). */
void fault_stop(struct fault *f);

#endif
