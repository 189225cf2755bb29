/* The client side of training on the wire: requests (COMPILE, STEPS,
 * STATE_GET, STATE_SET) queued on the data connection of every core, and
 * dpio's loop (dpio.h) that writes queued requests and reads answers of all
 * cores at once. Requests may be queued ahead of their answers (prefetch): while the
 * caller waits for one answer, the next requests' infeed keeps flowing.
 * Each core answers its requests in order. Never installed. */
#ifndef TPUEMU_CLIENT_TRAIN_IO_H
#define TPUEMU_CLIENT_TRAIN_IO_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "coll_io.h"
#include "dpio.h"
#include "tpuemu/model.h"

struct hin_spec;

#define TIO_MAX_STEPS 128
#define TIO_MAX_SEGS (2 * TIO_MAX_STEPS)

/* One core's answer to one request. Filled by tio_wait. */
struct tio_ans {
    int done;
    int code;
    int said; /* the core sent this answer (0: the client made it up: a timeout, a lost link) */
    char msg[ERR_MSG_MAX];
    void *dst; /* payload destination (set by the caller), NULL: none expected */
    size_t dst_cap;
    size_t got; /* payload bytes received */
    size_t nstats;
    struct tio_stat {
        double loss_sum;
        int64_t correct, rows;
        uint64_t compute_ns, matmul_ns, allreduce_ns, optimizer_ns, infeed_wait_ns;
        uint64_t allreduce_min_ns; /* a fanned-out answer: its cores' least non-zero all-reduce */
    } stats[TIO_MAX_STEPS];
    uint64_t hbm_used, hbm_capacity;
    tpu_notice notice; /* what is coming to the core (kind NONE: nothing) */
    int notice_replica; /* whose notice it is: a fanned-out answer's, else -1 (this core's) */
    uint32_t cores;     /* a fanned-out answer: the cores it answers for (0: one) */
    uint64_t num_params, iterations;
    uint32_t num_slots;
};

/* A layer of a model to compile (LayerSpec on the wire): the kind, units
 * and activation as tpuemu/model.h numbers them, and the options of its kind. */
#define TIO_MAX_RANK 8
struct tio_layer {
    uint32_t kind, units, activation;
    uint32_t kernel_h, kernel_w, stride_h, stride_w; /* Conv2D, pooling */
    int padding_same;
    float rate;                             /* Dropout */
    uint32_t input_dim;                     /* Embedding: the vocabulary */
    int positions;                          /* Embedding: plus a learned position embedding */
    uint32_t num_heads, key_dim, value_dim; /* MultiHeadAttention */
    uint32_t add_from;                      /* Add: the layer whose input is the other operand */
    float epsilon, momentum;                /* normalizations */
    int synchronized;                       /* BatchNormalization over every replica */
    size_t target_rank;                     /* Reshape */
    uint32_t target_shape[TIO_MAX_RANK];
};

/* A model to compile on every core (ModelSpec on the wire). */
struct tio_model {
    uint64_t model_id, seed;
    uint32_t input_dim;
    size_t input_rank; /* 0: (input_dim) */
    uint32_t input_shape[TIO_MAX_RANK];
    const struct tio_layer *layers;
    size_t nlayers;
    tpu_loss loss;
    const tpu_optimizer *optimizer;
    int mixed_bfloat16, deterministic, gradient_checkpointing, from_logits;
    uint32_t batch_per_core, infeed_depth, steps_per_execution, label_dim;
};

/* A request other than STEPS. */
enum tio_kind {
    TIO_COMPILE = 1,
    TIO_STATE_GET,
    TIO_STATE_SET
};
struct tio_req {
    enum tio_kind kind;
    uint64_t seq;                    /* from the cluster's collectives (cli_coll.next_seq) */
    const struct tio_model *model;   /* COMPILE */
    uint64_t model_id;               /* STATE_GET, STATE_SET */
    uint64_t num_params, iterations; /* STATE_SET: what its payload holds */
    uint32_t num_slots;
};

/* Queues the request q with the payload segs[0..nseg) on replica r's
 * connection, and ans as the slot its answer goes to. segs and ans must stay
 * valid until the answer is in (tio_wait) or tio_abort. Connects first if
 * needed. CODE_INVALID_ARGUMENT if the request does not fit a frame header. */
int tio_post_req(tpu_cluster *c, size_t r, const struct tio_req *q, const struct dpio_seg *segs, size_t nseg,
                 struct tio_ans *ans, err *e);

/* A STEPS request: run steps training steps (or evaluation or prediction
 * steps) of model_id, each core on its rows of each step's batch. */
struct tio_steps {
    uint64_t model_id;
    tpu_step_fn mode; /* train, evaluate or predict */
    uint32_t steps;
    const uint32_t *rows;        /* [steps]: this core's rows of each step (set per core) */
    const uint32_t *global_rows; /* [steps]: the whole batch's rows */
    uint64_t first_step;         /* the model's step count the first of them makes */
    /* collectives each training step runs before its gradients' all-reduce
     * (synchronized BatchNormalization's sums); their numbers come first */
    uint64_t colls_per_step;
    /* set by tio_steps_begin: the request's sequence number, and the first of
     * the collectives a training request runs (1 + colls_per_step a step) */
    uint64_t seq, coll_seq;
    /* the client's part, for the profiler (the first core's request only; 0 else) */
    uint64_t client_input_start_ns, client_input_wait_ns, client_post_ns;
    uint32_t client_pid;
    /* host-side input (NULL: the client sends the infeed): the pipeline
     * spec, its pipelines, the epoch and each step's batch; the replica's
     * pipeline is input_pipeline_id */
    const struct hin_spec *hin;
    uint32_t hin_num, hin_id;
    uint64_t hin_epoch;
    const uint64_t *hin_batches; /* [steps] */
    int x_bf16;                  /* x goes as bfloat16 (a mixed_bfloat16 model, lspec_input_bf16) */
    /* fan-out (host-side input only; docs/design/fanout.md): replica 0 passes
     * the request on down a tree of this degree over the fanout_cores
     * replicas and answers for all of them; fanout_wait_ms: how long the
     * cores wait for the others once one failed. 0: this core alone */
    uint32_t fanout, fanout_cores, fanout_wait_ms;
};

/* a: the answer of a core that a fanned-out request reaches through
 * replica 0 (answered there): done and OK (only done, code, said and msg
 * are set: read nothing else of it). */
void tio_ans_none(struct tio_ans *a);

/* Takes s's sequence numbers from the cluster's collectives, after every
 * request and all-reduce already given out. */
void tio_steps_begin(tpu_cluster *c, struct tio_steps *s);

/* tio_post of the STEPS request s on replica r, with its infeed segs[0..nseg)
 * (each step's features, then its labels unless predicting). */
int tio_post_steps(tpu_cluster *c, size_t r, const struct tio_steps *s, const struct dpio_seg *segs, size_t nseg,
                   struct tio_ans *ans, err *e);

/* Drives every connection until ans[r] is done for every replica r (ans is an
 * array of num_replicas slots, e.g. those of one request), or deadline_ms
 * (CLOCK_MONOTONIC ms). Once one replica failed (this request, or any
 * later one in flight on its connection: pipelined steps), the others get at
 * most grace_ms more. Returns the number of failed replicas (unanswered ones get
 * DEADLINE_EXCEEDED or UNAVAILABLE). */
size_t tio_wait(tpu_cluster *c, struct tio_ans *const *ans, uint64_t deadline_ms, uint64_t grace_ms);

/* tio_wait, except that tpu_cancel(c) leaves every answer pending (the
 * requests stay in flight, the streams in step) and returns TIO_INTERRUPTED:
 * the caller may wait for them again (fit's clean stop). */
#define TIO_INTERRUPTED ((size_t)-1)
size_t tio_wait_soft(tpu_cluster *c, struct tio_ans *const *ans, uint64_t deadline_ms, uint64_t grace_ms);

/* tio_wait (soft: tio_wait_soft) for replicas 0..n only, reading only their
 * connections: a fanned-out request's, whose answer replica 0 gives for
 * every core, with nothing pending on the others (a wait then costs the
 * same on any number of cores). */
size_t tio_wait_first(tpu_cluster *c, struct tio_ans *const *ans, size_t n, uint64_t deadline_ms, uint64_t grace_ms,
                      int soft);

/* Drops everything queued and pending and closes the connections (after a
 * failure: their streams are no longer in step). */
void tio_abort(tpu_cluster *c);

/* The most telling failure among ans[0..n): a core's own report of another
 * core's death beats "connection closed"; first by replica otherwise. */
/* How much a failed answer says of the failure: -1 for none (not done, or
 * OK), TIO_RANK_CULPRIT for one that names the core that stopped. */
#define TIO_RANK_CULPRIT ERR_RANK_CULPRIT
int tio_rank(const struct tio_ans *a);
const struct tio_ans *tio_worst(struct tio_ans *const *ans, size_t n);

#endif
