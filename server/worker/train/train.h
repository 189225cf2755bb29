/* train: the training service of one emulated core. A client compiles a model
 * onto every core (FRAME_COMPILE: HBM charged for weights, optimizer slots,
 * gradients, activations and infeed buffers; weights from the model's seed,
 * so every replica starts identical), then streams FRAME_STEPS with this
 * core's shard of each global batch. A training step runs forward and
 * backward on the libuv thread pool (the loop keeps serving heartbeats and
 * collective chunks), all-reduces the gradients with every other replica
 * through the collectives engine (coll_submit, sequence numbers chosen by the
 * client so every core agrees), and applies the optimizer update. Updates are
 * applied lazily, right before the model is next used (the next step, an
 * evaluation, a state read), so the answer to a STEPS frame goes out as soon as
 * its last all-reduce is in.
 *
 * Requests on one connection are answered in order, one FRAME_MODEL_RESULT
 * each. A client may send STEPS frames ahead of their answers (prefetch: the
 * next step's infeed arrives while this one computes), up to the model's
 * infeed_depth; more is refused with RESOURCE_EXHAUSTED.
 *
 * Initializing the system drops the compiled model (train_reset). Loop thread
 * only. The service knows its core and the engine through its env, never the
 * daemon. */
#ifndef TPUEMU_WORKER_TRAIN_H
#define TPUEMU_WORKER_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "coll.h"
#include "dpconn.h"
#include "hbm.h"
#include "notice.h"
#include "ident.h"
#include "preset.h"
#include "prom.h"
#include "status.h"
#include "tpuemu.pb-c.h"
#include "trace.h"

struct train;

/* Most steps one STEPS frame may carry (Keras' steps_per_execution). */
#define TRAIN_MAX_STEPS 128

/* Counters the service bumps (relaxed atomic adds) and its owner reads. */
struct train_stats {
    prom_counter steps;     /* training steps done (gradients all-reduced) */
    prom_hist step_seconds; /* each one's time: compute, all-reduce, the update before it */
    /* the last step finished (loop thread only): its global number (0: none),
     * its time and its all-reduce's */
    uint64_t last_step, last_step_ns, last_allreduce_ns;
};

/* What the service needs from its owner; every pointer must outlive it. */
struct train_env {
    uv_loop_t *loop;                 /* steps compute on its thread pool */
    const struct core_ident *id;     /* epoch, replica and replicas; names in messages */
    hbm *hbm;                        /* models are charged to it */
    struct trace *trace;             /* the profiler's ring */
    const struct tpu_preset *preset; /* the matrix unit's tile */
    int throttle_pct;                /* compute runs at this % of its speed (100: full) */
    struct coll *coll;               /* all-reduces the gradients */
    struct train_stats *stats;       /* initialized by train_stats_init */
    /* called on the loop thread once a training step (its global number,
     * 1-based) has finished on this core; may be NULL */
    void (*on_step)(void *arg, uint64_t step);
    void *on_step_arg;
    /* what is coming to this core, carried in every answer; while its
     * maintenance is under way, work is refused. May be NULL. */
    const struct notice *notice;
    /* fan-out (fanout.c): the cluster key for the connections to a core's
     * children, and where replica r is: its data address and "host/core"
     * (CODE_OK; else it is not in the system). May be NULL: no fan-out. */
    const auth *auth;
    int (*replica_addr)(void *arg, uint32_t r, char *where, size_t acap, char *name, size_t ncap);
    void *replica_addr_arg;
};

void train_stats_init(struct train_stats *s);

/* CODE_OK, or an error code when out of memory or without a matrix unit
 * (logged); *out is NULL then. */
int train_new(const struct train_env *env, struct train **out);
void train_free(struct train *t);
/* On the loop thread when the daemon stops: closes the service's handle. */
void train_stop(struct train *t);

/* Is h a training frame (COMPILE, STEPS, STATE_GET, STATE_SET)? */
int train_is_frame(const Tpuemu__FrameHeader *h);
/* Before its payload is read: CODE_OK if h's payload size is what the
 * compiled model expects (so nothing is allocated from an unchecked size),
 * else an error saying what is wrong. */
int train_check_payload(struct train *t, const Tpuemu__FrameHeader *h, err *e);
/* A training frame from a client connection; payload (malloc'd, NULL when
 * len is 0) belongs to the callee. */
void train_on_client_frame(struct train *t, dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload,
                           size_t len);
/* c is closing: its requests are not answered; those not started are dropped,
 * and the collectives they would have joined are aborted on every peer. */
void train_on_client_close(struct train *t, dp_conn *c);
/* The system was reset (after coll_reset; the env's ident names the new
 * epoch): the model is dropped (once the step running on the thread pool, if
 * any, has come back). */
void train_reset(struct train *t);
/* From now on training compute runs at pct % (1..100) of its speed. */
void train_set_throttle(struct train *t, int pct);

#endif
