/* The model math of one emulated core: a sequential stack of Dense layers,
 * its forward pass, the loss and its gradients, and the optimizers, as Keras
 * computes them. The worker's training service (train.c) runs a step as
 *
 *   model_forward(m, x, rows)                      activations kept for backward
 *   model_backward(m, y, rows, &metrics)           grads = d(sum of per-row losses)/d(params)
 *   ...all-reduce model_grads(m) (SUM over every replica's shard)...
 *   model_apply_gradients(m, 1.0f / global_rows)   the optimizer update
 *
 * so every replica, given bitwise identical reduced gradients, applies the
 * bitwise identical update and stays identical.
 *
 * Layout: every trainable value lives in one contiguous float array
 * (model_params), layer by layer: kernel [in x units] row-major, then bias
 * [units]. Gradients (model_grads) and each optimizer slot use the same
 * layout, so one all-reduce moves every gradient and a checkpoint is a few
 * flat arrays.
 *
 * Precision: MODEL_MIXED_BF16 is Keras' mixed_bfloat16 policy: float32
 * variables, each matmul on the MXU with bfloat16 inputs and float32
 * accumulation (forward and both backward matmuls), elementwise math and the
 * loss in float32. MODEL_FLOAT32 runs the matmuls in float32 (MXU_HIGHEST).
 *
 * Not thread-safe: one model per thread at a time (it uses the caller's mxu). */
#ifndef TPUEMU_WORKER_MODEL_H
#define TPUEMU_WORKER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "layershape.h"
#include "lrsched.h"
#include "mxu.h"
#include "status.h"

#define MODEL_MAX_LAYERS 16
#define MODEL_MAX_UNITS 65536

/* gelu (Keras' default approximate=False, the erf form), softplus and swish
 * keep their pre-activations for the backward pass (norm.h). */
enum model_act {
    ACT_LINEAR = 0,
    ACT_RELU = 1,
    ACT_SOFTMAX = 2,
    ACT_TANH = 3,
    ACT_SIGMOID = 4,
    ACT_GELU = 5,
    ACT_SOFTPLUS = 6,
    ACT_SWISH = 7,
};
#define ACT_LAST ACT_SWISH
/* SPARSE_CCE: y is int32 class ids; CCE: y is rows x units floats (one-hot or
 * soft, each row summing to 1); MSE: y is rows x units floats. Cross-entropies
 * are computed from the probabilities as Keras does, with them clipped to
 * [1e-7, 1 - 1e-7] (keras.backend, from_logits=False):
 *   SPARSE_CCE: c = clip(p);           loss = log(sum_j c_j) - log(c_y)
 *   CCE:        c = clip(p / sum(p));  loss = -sum_j y_j log(c_j)
 *   MSE:        loss = mean_j (p_j - y_j)^2
 * (after a softmax the sums are 1). With a softmax last layer the gradient is
 * taken through the fused softmax + cross-entropy (p - y), which is what
 * Keras' clipped formula differentiates to inside the clip range; any other
 * last layer differentiates the clipped formula (zero outside the range).
 * With from_logits (model_cfg) the cross-entropies take the last layer's
 * output as logits, through a numerically stable log-softmax (norm.h).
 * Accuracy: argmax of the output (first maximum) against the class id
 * (SPARSE_CCE) or the argmax of y (CCE). */
enum model_loss { LOSS_SPARSE_CCE = 0, LOSS_CCE = 1, LOSS_MSE = 2 };
enum model_opt { OPT_SGD = 0, OPT_ADAM = 1 };
enum model_precision { MODEL_FLOAT32 = 0, MODEL_MIXED_BF16 = 1 };

struct model_opt_cfg {
    enum model_opt kind;
    float learning_rate; /* Keras defaults: SGD 0.01, Adam 0.001 */
    float momentum;      /* SGD: 0 = plain SGD */
    int nesterov;        /* SGD */
    float beta_1, beta_2, epsilon; /* Adam: 0.9, 0.999, 1e-7 */
    /* A learning-rate schedule (kind LRS_CONSTANT, the zero value: none, learning_rate
     * applies): each update uses lrs_value(&sched, iterations) for its learning rate,
     * iterations counted before that update (Keras' learning_rate(self.iterations)). */
    struct lr_schedule sched;
};

struct model_cfg {
    int in_dim;                       /* features per row */
    int nlayers;                      /* 1..MODEL_MAX_LAYERS */
    int units[MODEL_MAX_LAYERS];      /* 1..MODEL_MAX_UNITS */
    enum model_act act[MODEL_MAX_LAYERS];
    enum model_loss loss;
    struct model_opt_cfg opt;
    enum model_precision precision;
    uint64_t seed;                    /* glorot-uniform kernels from it; biases zero */
    int max_rows;                     /* largest per-core batch forward/backward will see */
    unsigned mxu_tile;                /* the mxu's systolic array size, for the padded FLOPs
                                         only; 0 = 128 */
    /* Results independent of the host CPU: every matmul on the portable matrix
     * unit (mxu_matmul_fixed) instead of oneDNN, and exp, log and tanh from
     * detmath.h instead of libm. The same math (bf16 inputs, float32 sums),
     * summed in a fixed order; slower. */
    int deterministic;
    /* Layers other than Dense (layershape.h): layer l is kind[l].kind with
     * its options there, units[l] and act[l] its units or filters and its
     * activation (Dense, Conv2D; the others take ACT_LINEAR). The zero value
     * is Dense. The last layer must be a Dense with a (units) output. */
    struct lspec kind[MODEL_MAX_LAYERS];
    /* The input's shape per example; rank 0: (in_dim). Its size must be in_dim. */
    struct lshape in_shape;
    /* Dropout masks depend on seed, this salt (the replica: each draws its
     * own) and the count of training forward passes. */
    uint64_t dropout_salt;
    /* Gradient checkpointing (rematerialization): the layers form segments
     * of ceil(sqrt(nlayers)); only each segment's last output is kept for
     * the backward pass, which computes the others again, segment by
     * segment, just before it needs them (the last segment's are still
     * there). The same bits as without it; HBM holds the kept outputs and
     * one segment's. */
    int remat;
    /* The cross-entropies take the last layer's output as logits (Keras'
     * from_logits=True); MSE ignores it. */
    int from_logits;
};

/* A sum over every replica the training service lends the core (the core
 * sits below the collectives): n floats of buf summed elementwise over the
 * replicas, in place, the same bits on each; every replica calls it the same
 * number of times in the same order. Nonzero (with e) on failure. */
typedef int (*model_allreduce_fn)(void *ctx, float *buf, size_t n, err *e);

/* Per step metrics over the rows of one shard (summed, so shards add up). */
struct model_metrics {
    double loss_sum;   /* sum over rows of the per-row loss */
    int64_t correct;   /* rows whose argmax matches the label (accuracy); MSE: 0 */
    int64_t rows;
};

typedef struct model model;

/* Checks cfg (CODE_INVALID_ARGUMENT naming the bad field: "layer 2: units 0
 * is outside 1..65536"; layers count from 0, as in units[]),
 * allocates parameters, gradients, optimizer slots and activation buffers for
 * max_rows rows, and initializes the weights from cfg->seed. u must outlive
 * the model. CODE_RESOURCE_EXHAUSTED if host memory runs out. */
int model_new(model **out, const struct model_cfg *cfg, mxu *u, err *e);
void model_free(model *m);
const struct model_cfg *model_config(const model *m);

/* Re-initializes the weights from seed (glorot uniform: U(-l, l),
 * l = sqrt(6 / (fan_in + fan_out)), from a counter-based generator so the same
 * seed gives the same weights on every machine), zeroes the biases, the
 * optimizer slots and the iteration count. */
void model_init_weights(model *m, uint64_t seed);

/* Trainable values: count and the arrays (layout above). */
size_t model_num_params(const model *m);
float *model_params(model *m);
float *model_grads(model *m);
/* Offsets into the parameter array of layer l's kernel and bias. */
size_t model_kernel_offset(const model *m, int l);
size_t model_bias_offset(const model *m, int l);

/* Layer l's non-trainable values in the parameter array (BatchNormalization:
 * moving_mean then moving_variance, channels each) and where they start.
 * They are not trained: backward puts the step's batch statistics in their
 * places in model_grads (times the rows), the all-reduce averages them over
 * the replicas, and model_apply_gradients moves the statistics toward that
 * average with the layer's momentum. */
size_t model_stats_count(const model *m, int l, size_t *offset);

/* Optimizer state: nslots arrays of model_num_params floats (SGD with
 * momentum: 1, plain SGD: 0, Adam: 2 = m then v) and the iteration count. */
int model_opt_num_slots(const model *m);
float *model_opt_slot(model *m, int i);
uint64_t model_opt_iterations(const model *m);
void model_set_opt_iterations(model *m, uint64_t it);

/* Forward pass over rows rows of x (rows x in_dim). Keeps what backward needs:
 * its activations, and the pointer x itself (borrowed, not copied: x must
 * stay valid and unchanged until the model_backward of this pass).
 * out, if not NULL, gets the last layer's activations (rows x units). rows in
 * 0..max_rows (0 is allowed and does nothing). CODE_INVALID_ARGUMENT beyond. */
int model_forward(model *m, const float *x, int rows, float *out, err *e);

/* Synchronized BatchNormalization (lspec.synchronized: Keras'
 * SyncBatchNormalization) takes its batch statistics over every replica's
 * shard during training: each such layer sums over the replicas, through fn,
 * its shard's sums and count, then the squared deviations, in the forward
 * pass, and the sums of the gradient it needs in the backward pass:
 * model_sync_calls per training step (3 per layer; a replica without rows
 * joins them with zeros). Without fn (one replica) the layer is
 * BatchNormalization. Gradient checkpointing is refused with it. */
void model_set_allreduce(model *m, model_allreduce_fn fn, void *ctx);
int model_sync_calls(const model *m);

/* Training (1) or inference (0, the default) for the forward passes that
 * follow: Dropout drops only while training, as Keras' training=True. */
void model_set_training(model *m, int training);
/* The count of training forward passes Dropout's masks are drawn from (the
 * same count gives the same masks): read it, or set it to redo a pass. */
uint64_t model_dropout_pass(const model *m);
void model_set_dropout_pass(model *m, uint64_t pass);

/* Whether layer l's output is kept for the backward pass (cfg.remat: a
 * segment's last layer), and the layer forwards recomputed so far. */
int model_layer_checkpointed(const model *m, int l);
uint64_t model_remat_calls(const model *m);

/* Loss and metrics of the last forward pass against y (int32 class ids for
 * SPARSE_CCE, rows x units floats otherwise) without gradients (evaluate).
 * CODE_INVALID_ARGUMENT for a class id outside 0..units-1, naming the row,
 * or rows other than the last forward's; CODE_FAILED_PRECONDITION if no
 * forward pass ran since the weights were initialized. */
int model_metrics_of(model *m, const void *y, int rows, struct model_metrics *out, err *e);

/* Backward pass of the last forward pass: metrics as model_metrics_of, and
 * model_grads = gradient of the SUM of the per-row losses (not the mean: the
 * caller divides by the global batch after the all-reduce). rows must equal
 * the last forward's (CODE_INVALID_ARGUMENT), and that forward must have run
 * on the current weights (CODE_FAILED_PRECONDITION after model_init_weights
 * or model_apply_gradients). rows 0 gives zero gradients. A bad class id
 * leaves the gradients untouched; after a matrix unit failure (CODE_INTERNAL)
 * they are unspecified. */
int model_backward(model *m, const void *y, int rows, struct model_metrics *out, err *e);

/* One optimizer step with gradients model_grads * scale, as Keras' optimizer
 * applies it (SGD: v = momentum*v - lr*g; w += v (nesterov: w += momentum*v -
 * lr*g); Adam: t += 1; lr_t = lr*sqrt(1-b2^t)/(1-b1^t); m = b1*m + (1-b1)*g;
 * v = b2*v + (1-b2)*g^2; w -= lr_t*m/(sqrt(v) + eps)), lr from the schedule when there is one
 * (model_learning_rate). Increments the
 * iteration count. */
void model_apply_gradients(model *m, float scale);

/* The learning rate the next model_apply_gradients uses (the schedule's value
 * at the iteration count, or opt.learning_rate). */
float model_learning_rate(const model *m);

/* Matmul FLOPs of one training step / forward pass over rows rows (useful
 * FLOPs, 2*m*n*k summed; the backward pass skips the input gradient of the
 * first layer), and those padded to the MXU tile (what the MXU spends). */
double model_train_flops(const model *m, int rows, double *padded);
double model_forward_flops(const model *m, int rows, double *padded);
/* Seconds spent in matmuls since the last model_reset_timers (forward and
 * backward), and their count. */
double model_matmul_seconds(const model *m);

/* The profiler's view of a pass: with a recorder set, forward and backward
 * append one record per layer pass and one per matmul (op 0 forward,
 * 1 weight gradient, 2 input gradient; its m x k times k x n shape; a
 * forward record with op 1 is a layer recomputed in the backward pass), with
 * CLOCK_MONOTONIC times (the clock of uv_hrtime), until cap records are in.
 * Setting it (NULL: off) empties it. */
enum model_rec_kind { MODEL_REC_FORWARD = 0, MODEL_REC_BACKWARD = 1, MODEL_REC_MATMUL = 2 };
struct model_rec {
    enum model_rec_kind kind;
    int layer, op;
    int64_t m, n, k;
    uint64_t t0, t1;
    /* a layer pass without matmuls (pooling, normalization, an embedding's
     * lookup, Add, Dropout): the bytes it reads and writes (0 otherwise) */
    uint64_t bytes;
};
void model_set_recorder(model *m, struct model_rec *buf, size_t cap);
size_t model_recorded(const model *m);
uint64_t model_now_ns(void);
uint64_t model_matmul_calls(const model *m);
void model_reset_timers(model *m);

const char *model_act_name(enum model_act a);   /* "relu" */
const char *model_loss_name(enum model_loss l); /* "sparse_categorical_crossentropy" */
const char *model_opt_name(enum model_opt o);   /* "adam" */

#endif
