/* train_int: what the parts of the training service share, from the top:
 *   train.c   the request queue: frames in, one request at a time, the API
 *   steps.c   the step machine: forward/backward on the thread pool, the
 *             gradient all-reduce, the update; state reads and writes
 *   answer.c  answers to requests (MODEL_RESULT), and aborting the
 *             collectives a dropped request would have joined
 *   charge.c  compiled models and their HBM charges
 * Each calls only the ones below it; the step machine hands a finished
 * request back to the queue through train.next. Internal to train/. */
#ifndef TPUEMU_WORKER_TRAIN_TRAIN_INT_H
#define TPUEMU_WORKER_TRAIN_TRAIN_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "hostin.h"
#include "model.h"
#include "train.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k
#define TRAIN_MAX_DEPTH 16
#define TRAIN_QUEUE_SLACK 4
#define TRAIN_MAX_PIPES \
    4 /* host-side input pipelines kept open per core */ /* requests beyond infeed_depth: compile, state, evaluate */
/* per layer: kernel, bias, up to 2 optimizer slots of each, their gradients,
 * activations; then the backward delta and the infeed's x and y */
#define TRAIN_MAX_BLOCKS (MODEL_MAX_LAYERS * 40 + 4)
/* fan-out (fanout.c): most children a core passes a request on to, and the
 * time a connection to one may take to open on a loaded machine */
#define TRAIN_MAX_FANOUT 16
#define TRAIN_FANOUT_DIAL_MS 10000u

struct fan;
struct fan_link;

struct tmodel {
    uint64_t id;
    model *m;
    int in_dim, out_dim, label_dim, sparse, batch, depth, spe, nlayers;
    uint32_t ids[TRAIN_MAX_BLOCKS];
    size_t nids;
    int pending;         /* gradients reduced, update not yet applied */
    int failed;          /* a gradient all-reduce failed: no training until a reset */
    err fail_err;
    float pending_scale;
    int bf16_in;             /* mixed_bfloat16 and lspec_input_bf16: the infeed's x may be bfloat16 */
    float *xw;               /* batch x in_dim: a bfloat16 x widened for the model (made at the first) */
    Tpuemu__ModelSpec *spec; /* a copy, for recharging after a failed recompile */
};

struct treq {
    struct treq *next;
    struct train *t;
    dp_conn *conn;       /* NULL once the client went away */
    int kind;
    uint64_t seq, epoch, model_id;
    /* STEPS */
    int mode, has_labels;
    int x_bf16; /* x comes as bfloat16 (StepsSpec.x_dtype) */
    uint32_t steps, i;
    uint32_t rows[TRAIN_MAX_STEPS], global_rows[TRAIN_MAX_STEPS];
    uint64_t coll_seq, first_step;
    /* host-side input: the pipeline and where each step is in it (NULL: the
     * client sent the infeed) */
    struct hin_spec *hin;
    uint32_t hin_id, hin_num;
    uint64_t hin_epoch, hin_batch[TRAIN_MAX_STEPS];
    uint64_t hin_open_ns; /* the pipeline was opened for this request and took this long (0: it was open) */
    uint8_t *payload;    /* the infeed, or STATE_SET's state */
    size_t off;          /* payload offset of step i */
    Tpuemu__StepStat stats[TRAIN_MAX_STEPS];
    uint64_t t_ar;       /* all-reduce start */
    /* the profiler's records (trace.h) of the step the pool ran last */
    struct model_rec rec[MODEL_MAX_LAYERS * 4];
    uint64_t t_step0, t_opt0, t_opt1;
    uint64_t st0[TRAIN_MAX_STEPS], st1[TRAIN_MAX_STEPS]; /* evaluate, predict: each step */
    /* answers */
    uint8_t *out;        /* predictions or state */
    size_t out_len;
    Tpuemu__StateInfo state;
    int has_state;
    Tpuemu__ModelSpec *spec; /* COMPILE */
    err e;               /* the pool's verdict */
    struct fan *fan;     /* fanned out: the answer joins this fan's (fanout.c) */
};

struct train {
    struct train_env env;
    /* env.throttle_pct, changed at run time by train_set_throttle (a fault)
     * while a pool thread may read it */
    atomic_int throttle_pct;
    /* The request in hand (cur) is done, answered or dropped: the queue
     * (train.c) takes the next. Set by train_new; the step machine calls it. */
    void (*next)(struct train *t);
    mxu *u;
    struct tmodel *tm;
    uint64_t lost_model;       /* the id of the model the last reset dropped (0: none) */
    struct tmodel *orphan; /* dropped by a reset while the pool had it */
    /* the model the step in hand runs on, taken when it is queued: a reset
     * on the loop may drop tm before the pool's thread starts the step */
    struct tmodel *pool_tm;
    struct treq *head, *tail;
    unsigned n;
    struct treq *cur;
    int busy;
    uv_work_t work;
    uint64_t last_compute_ns; /* the last training step's, for run_step's choice */
    int inline_depth;         /* run_step calls nested on the loop's stack (single core) */
    uint64_t idle_since;   /* when the last STEPS finished and nothing was queued */
    /* the training client's clock: ours minus its, the least seen over its
     * requests (their latency is at least 0), and whose it is */
    int64_t client_off;
    uint32_t client_pid;
    /* synchronized BatchNormalization's sums (sync.c): posted by the pool's
     * thread, submitted on the loop */
    uv_async_t *sync_async;
    uv_mutex_t sync_mu;
    uv_cond_t sync_cv;
    struct sync_call *sync_req;
    uint64_t sync_seq, sync_epoch; /* the next sum's collective, the step's epoch */
    int sync_closed;
    /* host-side input: the pipelines this core's host runs, most recently
     * used first (a training and a validation dataset take turns each epoch;
     * steps.c, used on the pool's thread while a request fills its infeed) */
    struct hin_pipe *pipes[TRAIN_MAX_PIPES];
    /* fan-out (fanout.c): answers in the order they go out, the connections
     * to this core's children, the timer of the waits after a failure */
    struct fan *fans;
    struct fan_link *fan_links[TRAIN_MAX_FANOUT];
    uv_timer_t *fan_timer;
    int fan_stopped;
};

/* ---- charge.c ---- */
void tm_free(struct tmodel *tm);
/* A deep copy of s (NULL when out of memory); free with
 * tpuemu__model_spec__free_unpacked. */
Tpuemu__ModelSpec *tm_spec_copy(const Tpuemu__ModelSpec *s);
/* Applies the gradients reduced by the last step, if not done yet. */
void tm_flush_update(struct tmodel *tm);
/* COMPILE r: builds the model, charges its HBM (the old model's charge is
 * given back, or kept when the new one does not fit) and makes it t->tm. */
int tm_compile(struct train *t, struct treq *r, err *e);

/* ---- fanout.c ---- */
/* CODE_OK if s's fan-out fields (if any) fit this core's system. */
int fan_check(const struct train *t, const Tpuemu__StepsSpec *s, err *e);
/* The STEPS request h, with a fanout, came on c: passes it on to this core's
 * children and returns the fan this core's own answer joins (fan_own). */
int fan_start(struct train *t, dp_conn *c, const Tpuemu__FrameHeader *h, struct fan **out, err *e);
/* r's own answer (status e) joins its fan; the caller frees r. */
void fan_own(struct train *t, struct fan *f, const struct treq *r, const err *e);
/* A plain answer to r that would overtake a fan's on its connection: kept
 * (r belongs to the fan queue now) and sent in turn; 0: send it now. */
int fan_hold(struct train *t, struct treq *r, const err *e);
/* The connection c is closing: nothing more is sent on it. */
void fan_conn_closed(struct train *t, dp_conn *c);
/* The service stops: the links to the children close. */
void fan_stop(struct train *t);
/* After the loop ran dry: frees what is left. */
void fan_free_all(struct train *t);

/* ---- answer.c ---- */
void treq_free(struct treq *r);
/* Sends the answer (if the client is still there) and frees r; a fanned-out
 * request's joins its fan, and a plain one waits behind the fans before it. */
void treq_answer(struct train *t, struct treq *r, const err *e);
/* treq_answer's last part: sends now. */
void treq_send(struct train *t, struct treq *r, const err *e);
void treq_answerf(struct train *t, struct treq *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The collectives r's steps from `from` on would have run: fail them on every peer. */
void treq_abort_rest(struct train *t, struct treq *r, uint32_t from, const err *e);

/* ---- sync.c ---- */
int sync_init(struct train *t);
/* On the loop, before it stops: no more sums; a waiting one fails. */
void sync_close(struct train *t);
void sync_destroy(struct train *t);
/* The step about to run: its first sum's collective number and epoch. */
void sync_begin_step(struct train *t, uint64_t first_seq, uint64_t epoch);
/* model_allreduce_fn, ctx the train: blocks the pool's thread until the
 * replicas' sum is in buf. */
int sync_allreduce(void *ctx, float *buf, size_t n, err *e);

/* ---- steps.c ---- */
/* A STEPS request's host input into a pipeline spec: CODE_OK, or what is
 * wrong with it (for tm, may be NULL). *out is malloc'd. */
int steps_host_input(const struct tmodel *tm, const Tpuemu__StepsSpec *s, struct hin_spec **out, err *e);
/* Infeed bytes of one step of rows rows. */
size_t steps_bytes(const struct tmodel *tm, uint32_t rows, int has_labels, int x_bf16);
/* Runs the STEPS request r (t->cur) to its answer; then t->next. */
void steps_start(struct train *t, struct treq *r);
/* STATE_GET, STATE_SET: answered at once; then the caller goes on. */
void steps_state_get(struct train *t, struct treq *r);
void steps_state_set(struct train *t, struct treq *r);

#endif
