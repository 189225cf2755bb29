/* tpuemu/model.h: data-parallel training on the emulated pod, as Keras does it
 * under a TPUStrategy.
 *
 *   tpu_strategy *s;  tpu_model *m;  tpu_compile_options co;
 *   tpu_strategy_new(cluster, &s);                      // after tpu_initialize_system
 *   tpu_model_new(s, 784, &m);                          // with strategy.scope():
 *   tpu_model_add_dense(m, 128, TPU_ACT_RELU);          //   Sequential([Dense(128, relu),
 *   tpu_model_add_dense(m, 10, TPU_ACT_SOFTMAX);        //               Dense(10, softmax)])
 *   tpu_compile_options_init(&co);                      // adam, sparse CCE, accuracy
 *   co.policy = TPU_POLICY_MIXED_BFLOAT16;
 *   tpu_model_compile(m, &co);
 *   tpu_model_fit(m, dataset, &fit_options, &history);
 *
 * The model lives on the cores: compiling sends it to every core of the
 * system, which charges its HBM (weights, optimizer slots, gradients,
 * activations for the per-core batch, infeed buffers) and initializes the
 * weights from the model's seed, so every replica starts identical. Each
 * step splits the global batch into one shard per replica (rows in replica
 * order), every core runs forward and backward on its shard, the gradients
 * are all-reduced between the cores (summed, then divided by the global
 * batch), and every core applies the same optimizer update: replicas stay
 * bitwise identical. The client streams the next steps' shards while the
 * current one runs (up to infeed_depth executions ahead).
 *
 * After tpu_initialize_system (a new epoch) a trained model's variables are
 * lost with the old system: fit, evaluate, predict, get_weights and
 * save_checkpoint fail with TPU_FAILED_PRECONDITION saying so (TensorFlow's
 * FailedPreconditionError for variables found uninitialized) until
 * tpu_model_load_checkpoint brings the state back or tpu_model_compile starts
 * again from the seed at step 0. Elastic fit restores its state itself. Errors follow
 * tpuemu.h: TPU_RESOURCE_EXHAUSTED when the model or batch does not fit a
 * core's HBM (with the core's report), TPU_UNAVAILABLE naming a core that died
 * mid-step, TPU_FAILED_PRECONDITION after someone else re-initialized the
 * system, TPU_DATA_LOSS for a damaged checkpoint. One thread at a time per
 * model; calls block, each with deadlines. */
#ifndef TPUEMU_MODEL_H
#define TPUEMU_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tpuemu/data.h"
#include "tpuemu/tpuemu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- strategy ---- */

typedef struct tpu_strategy tpu_strategy;

/* TPUStrategy(resolver): the initialized (or attached) system of c. c must
 * outlive the strategy. TPU_FAILED_PRECONDITION if c has no system. */
TPU_API tpu_status tpu_strategy_new(tpu_cluster *c, tpu_strategy **out);
TPU_API void tpu_strategy_free(tpu_strategy *s);
/* Replicas of c's current system (re-read after a re-initialize). */
TPU_API int tpu_strategy_num_replicas_in_sync(const tpu_strategy *s);
TPU_API tpu_cluster *tpu_strategy_cluster(const tpu_strategy *s);

/* ---- model ---- */

typedef enum tpu_activation {
    TPU_ACT_LINEAR = 0,
    TPU_ACT_RELU = 1,
    TPU_ACT_SOFTMAX = 2,
    TPU_ACT_TANH = 3,
    TPU_ACT_SIGMOID = 4,
    TPU_ACT_GELU = 5,     /* Keras' gelu with approximate=False: 0.5 x (1 + erf(x / sqrt(2))) */
    TPU_ACT_SOFTPLUS = 6, /* log(1 + exp(x)) */
    TPU_ACT_SWISH = 7,    /* x sigmoid(x) (Keras' "swish", also "silu") */
} tpu_activation;

typedef enum tpu_loss {
    TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY = 0, /* labels: int32 class ids */
    TPU_LOSS_CATEGORICAL_CROSSENTROPY = 1,        /* labels: one-hot rows */
    TPU_LOSS_MEAN_SQUARED_ERROR = 2,
} tpu_loss;

typedef enum tpu_policy {
    TPU_POLICY_FLOAT32 = 0,
    TPU_POLICY_MIXED_BFLOAT16 = 1, /* bf16 matmul inputs, f32 variables and loss */
} tpu_policy;

typedef enum tpu_optimizer_kind { TPU_OPT_SGD = 0, TPU_OPT_ADAM = 1 } tpu_optimizer_kind;

/* A learning-rate schedule (tf.keras.optimizers.schedules), given to an
 * optimizer in place of a constant learning rate. The cores evaluate it at
 * the optimizer's iteration count before each update (0 for the first, as
 * Keras' optimizer calls learning_rate(self.iterations)); the count is the
 * one a checkpoint saves, so a resumed fit goes on along the schedule.
 *   ExponentialDecay:       initial * decay_rate^(step / decay_steps)
 *                           (staircase: the quotient's floor)
 *   PiecewiseConstantDecay: values[0] while step <= boundaries[0], values[i]
 *                           while boundaries[i-1] < step <= boundaries[i],
 *                           values[n] after the last boundary
 *   CosineDecay:            s = min(step, decay_steps);
 *                           initial * ((1 - alpha) * 0.5 * (1 + cos(pi s / decay_steps)) + alpha);
 *                           with a warmup_target (TF 2.13+): linear from
 *                           initial to warmup_target over warmup_steps, then
 *                           the cosine from warmup_target over decay_steps
 * Values are computed in double with fixed (host-independent) cos and pow
 * and rounded to float. Make one with the constructors below. */
typedef enum tpu_lr_schedule_kind {
    TPU_LR_CONSTANT = 0,                 /* no schedule: the optimizer's learning_rate */
    TPU_LR_EXPONENTIAL_DECAY = 1,
    TPU_LR_PIECEWISE_CONSTANT_DECAY = 2,
    TPU_LR_COSINE_DECAY = 3,
} tpu_lr_schedule_kind;

#define TPU_LR_MAX_BOUNDARIES 16

typedef struct tpu_lr_schedule {
    tpu_lr_schedule_kind kind;
    float initial_learning_rate;         /* ExponentialDecay, CosineDecay */
    uint64_t decay_steps;                /* ExponentialDecay, CosineDecay: > 0 */
    float decay_rate;                    /* ExponentialDecay */
    int staircase;                       /* ExponentialDecay */
    float alpha;                         /* CosineDecay: floor as a fraction, in [0, 1] */
    int has_warmup_target;               /* CosineDecay: warmup_target given (Keras: not None) */
    float warmup_target;                 /* CosineDecay */
    uint64_t warmup_steps;               /* CosineDecay */
    size_t num_boundaries;               /* PiecewiseConstantDecay: 1..16 */
    uint64_t boundaries[TPU_LR_MAX_BOUNDARIES];
    float values[TPU_LR_MAX_BOUNDARIES + 1];
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_lr_schedule;

/* tf.keras.optimizers.schedules.ExponentialDecay(initial_learning_rate,
 * decay_steps, decay_rate, staircase). */
TPU_API tpu_lr_schedule tpu_exponential_decay(float initial_learning_rate, uint64_t decay_steps, float decay_rate,
                                              int staircase);
/* CosineDecay(initial_learning_rate, decay_steps, alpha) without warm-up. */
TPU_API tpu_lr_schedule tpu_cosine_decay(float initial_learning_rate, uint64_t decay_steps, float alpha);
/* CosineDecay(initial_learning_rate, decay_steps, alpha, warmup_target=,
 * warmup_steps=): linear warm-up, then cosine decay. */
TPU_API tpu_lr_schedule tpu_cosine_decay_warmup(float initial_learning_rate, uint64_t decay_steps, float alpha,
                                                float warmup_target, uint64_t warmup_steps);
/* PiecewiseConstantDecay(boundaries, values): n boundaries (1..16, strictly
 * increasing) and n + 1 values. TPU_INVALID_ARGUMENT otherwise. */
TPU_API tpu_status tpu_piecewise_constant_decay(const uint64_t *boundaries, size_t n, const float *values,
                                                tpu_lr_schedule *out);
/* schedule(step): the learning rate the cores use for the update at optimizer
 * step `step` (bit for bit what they compute). NaN for a malformed schedule. */
TPU_API float tpu_lr_schedule_value(const tpu_lr_schedule *s, uint64_t step);

typedef struct tpu_optimizer {
    tpu_optimizer_kind kind;
    float learning_rate;        /* without a schedule */
    float momentum;             /* SGD */
    int nesterov;               /* SGD */
    float beta_1, beta_2, epsilon; /* Adam */
    tpu_lr_schedule schedule;   /* kind TPU_LR_CONSTANT (zero): none */
    uint64_t reserved[8];       /* zero: room to grow (docs/api/conventions.md) */
} tpu_optimizer;

/* Keras' defaults: SGD(learning_rate 0.01 when 0 is given, momentum),
 * Adam(learning_rate 0.001 when 0, beta_1 0.9, beta_2 0.999, epsilon 1e-7). */
TPU_API tpu_optimizer tpu_optimizer_sgd(float learning_rate, float momentum);
TPU_API tpu_optimizer tpu_optimizer_adam(float learning_rate);
/* The optimizer with a schedule as its learning rate: SGD(learning_rate=s,
 * momentum), Adam(learning_rate=s). */
TPU_API tpu_optimizer tpu_optimizer_sgd_schedule(tpu_lr_schedule s, float momentum);
TPU_API tpu_optimizer tpu_optimizer_adam_schedule(tpu_lr_schedule s);

typedef struct tpu_model tpu_model;

/* A Sequential model taking rows of input_dim floats, built in strategy s
 * (which must outlive it). The seed of the initial weights is random unless
 * set with tpu_model_set_seed. */
TPU_API tpu_status tpu_model_new(tpu_strategy *s, size_t input_dim, tpu_model **out);
TPU_API void tpu_model_free(tpu_model *m);
/* Dense(units, activation), up to 65536 units: on a (features) input as an
 * MLP's; on a longer shape over its last axis, as Keras does. Before compile. */
TPU_API tpu_status tpu_model_add_dense(tpu_model *m, size_t units, tpu_activation act);
/* The shape of one example (keras.Input(shape=...)): 1 to 3 dimensions,
 * (height, width, channels) for images (NHWC, channels_last), whose product
 * is the model's input_dim; the dataset's rows hold the values in that
 * order. Before any layer. Without it an example is (input_dim). */
TPU_API tpu_status tpu_model_set_input_shape(tpu_model *m, const size_t *dims, size_t rank);

typedef enum tpu_padding { TPU_PADDING_VALID = 0, TPU_PADDING_SAME = 1 } tpu_padding;

/* The layers below follow Keras' defaults and shape rules; each call checks
 * the layer takes the shape the layers before it give
 * (TPU_INVALID_ARGUMENT naming the layer and the rule otherwise). A stride
 * of 0 is Keras' default (Conv2D 1, pooling the pool size). At most 16
 * layers in all; the last one must be a Dense with a (units) output.
 * Weights are in Keras' order, layer by layer: kernel then bias; a Conv2D
 * kernel is (kernel_h, kernel_w, input channels, filters), glorot-uniform
 * over its receptive field. */
/* Conv2D(filters, (kernel_h, kernel_w), strides, padding, activation). */
TPU_API tpu_status tpu_model_add_conv2d(tpu_model *m, size_t filters, size_t kernel_h, size_t kernel_w,
                                        size_t stride_h, size_t stride_w, tpu_padding padding, tpu_activation act);
/* MaxPooling2D(pool_size, strides, padding) and AveragePooling2D (the mean
 * of the window's pixels inside the input). */
TPU_API tpu_status tpu_model_add_max_pooling2d(tpu_model *m, size_t pool_h, size_t pool_w, size_t stride_h,
                                               size_t stride_w, tpu_padding padding);
TPU_API tpu_status tpu_model_add_average_pooling2d(tpu_model *m, size_t pool_h, size_t pool_w, size_t stride_h,
                                                   size_t stride_w, tpu_padding padding);
/* GlobalAveragePooling2D(): (h, w, c) -> (c). */
TPU_API tpu_status tpu_model_add_global_average_pooling2d(tpu_model *m);
/* Flatten() and Reshape(target_shape): views, no copy. */
TPU_API tpu_status tpu_model_add_flatten(tpu_model *m);
TPU_API tpu_status tpu_model_add_reshape(tpu_model *m, const size_t *dims, size_t rank);
/* Dropout(rate): during fit only, each replica draws its own mask each step
 * (kept values scaled by 1/(1 - rate)); evaluate and predict pass the
 * values through. rate in [0, 1). */
TPU_API tpu_status tpu_model_add_dropout(tpu_model *m, float rate);
/* Embedding(input_dim, output_dim): the model's input rows are token ids
 * (sequence_length floats per example, each an integer in
 * 0..input_dim-1; tpu_model_set_input_shape is not needed), each looked up
 * in a (input_dim, output_dim) table initialized as Keras' "uniform"
 * (-0.05 to 0.05): (sequence_length) -> (sequence_length, output_dim). The
 * first layer only. An id that is not an integer in range fails the step
 * with TPU_INVALID_ARGUMENT naming the row and position. */
TPU_API tpu_status tpu_model_add_embedding(tpu_model *m, size_t input_dim, size_t output_dim);
/* keras_nlp's TokenAndPositionEmbedding(vocabulary_size, sequence_length,
 * embedding_dim): Embedding plus a learned (sequence_length, embedding_dim)
 * position embedding added at each position (both "uniform"), so the layers
 * after it can tell the order of the tokens. Weights: the token table, then
 * the positions'. */
TPU_API tpu_status tpu_model_add_token_and_position_embedding(tpu_model *m, size_t vocabulary_size,
                                                              size_t embedding_dim);
/* GlobalAveragePooling1D(): (steps, features) -> (features). */
TPU_API tpu_status tpu_model_add_global_average_pooling1d(tpu_model *m);
/* MultiHeadAttention(num_heads, key_dim, value_dim) called as layer(x, x):
 * self-attention over a (sequence_length, features) input, output of the
 * input's shape. value_dim 0 is Keras' default (key_dim). Weights in Keras'
 * order: query kernel (features, num_heads, key_dim) and bias (num_heads,
 * key_dim), key kernel and bias, value kernel (features, num_heads,
 * value_dim) and bias, output kernel (num_heads, value_dim, features) and
 * bias (features); glorot-uniform kernels with Keras' fans, zero biases.
 * On the matrix unit it is four projections and, per example and head, the
 * products Q K^T and P V (docs/guide/training.md). */
TPU_API tpu_status tpu_model_add_multi_head_attention(tpu_model *m, size_t num_heads, size_t key_dim, size_t value_dim);
/* A residual connection, Keras' Add()([x, y]) with x the input of layer
 * from_layer (0 counts from the first layer; layer 0's input is the
 * model's) and y the output of the layer before this one; both must have
 * the same shape. With it a Sequential stack expresses a transformer
 * encoder block: MultiHeadAttention, Add (from the attention layer),
 * LayerNormalization, Dense (ff, relu), Dense (features), Add (from the
 * first Dense), LayerNormalization. */
TPU_API tpu_status tpu_model_add_residual(tpu_model *m, size_t from_layer);
/* LayerNormalization(axis=-1, epsilon): each position's features normalized
 * to mean 0 and variance 1 over the last axis, then scaled by gamma and
 * shifted by beta (initialized 1 and 0). epsilon 0: Keras' 1e-3. Weights in
 * Keras' order: gamma, beta (features each). */
TPU_API tpu_status tpu_model_add_layer_normalization(tpu_model *m, float epsilon);
/* BatchNormalization(axis=-1, momentum, epsilon): each channel of the last
 * axis normalized with the batch's mean and variance during fit, and with
 * the moving statistics in evaluate and predict (Keras' training=False);
 * then gamma and beta. 0 gives Keras' defaults: momentum 0.99, epsilon 1e-3.
 * As under TPUStrategy, each replica normalizes with its own shard's
 * statistics; the moving statistics are kept identical on every replica:
 * each step they move toward the replicas' batch statistics averaged in the
 * gradient all-reduce (moving = moving - (moving - average) (1 - momentum)).
 * Weights in Keras' order: gamma, beta, moving_mean, moving_variance
 * (channels each; the last two are not trained and have no optimizer
 * slots). */
TPU_API tpu_status tpu_model_add_batch_normalization(tpu_model *m, float momentum, float epsilon);
/* SyncBatchNormalization (BatchNormalization(synchronized=True)): during
 * fit each channel's batch mean and variance are those of the global batch,
 * summed over every replica's shard through all-reduces in the forward pass
 * (the shards' sums and counts, then the squared deviations) and the
 * backward pass (the sums of the gradient the input's gradient needs): the
 * same statistics a single core would compute on the whole batch, for 3
 * extra collectives per layer and step. Otherwise as
 * tpu_model_add_batch_normalization. Not with gradient checkpointing. */
TPU_API tpu_status tpu_model_add_sync_batch_normalization(tpu_model *m, float momentum, float epsilon);
/* Gradient checkpointing (rematerialization; tf.recompute_grad, jax.checkpoint):
 * the cores keep only the output of every ceil(sqrt(layers))-th layer for the
 * backward pass and compute the other activations again, one segment of
 * layers at a time, just before the backward pass needs them. HBM then holds
 * the kept outputs and one segment's activations (and convolution patches)
 * instead of all of them, so a batch whose activations do not fit may; each
 * step runs every segment's forward pass but the last one's twice (the
 * profiler's FLOPs count it). The results are the same bits. Before compile. */
TPU_API tpu_status tpu_model_set_gradient_checkpointing(tpu_model *m, int enabled);
/* Seed of the glorot-uniform initial weights (the same on every replica). Before compile. */
TPU_API tpu_status tpu_model_set_seed(tpu_model *m, uint64_t seed);

typedef struct tpu_compile_options {
    tpu_optimizer optimizer;
    tpu_loss loss;
    int metrics_accuracy;          /* report accuracy */
    unsigned steps_per_execution;  /* steps per call to the cores (1..128) */
    tpu_policy policy;
    size_t batch_size;             /* global batch to compile for now; 0: at the first fit/evaluate/predict */
    unsigned infeed_depth;         /* executions the client may run ahead (1..16) */
    /* Results that do not depend on the host CPUs, as a TPU's do not: every
     * core multiplies on a portable matrix unit (bf16 inputs, float32 sums in a
     * fixed order, no FMA) instead of oneDNN's kernel for its CPU, and takes
     * exp, log and tanh from a fixed implementation instead of libm; the same
     * seed and data then give bitwise identical weights on any x86-64 host.
     * Slower (docs/design/emulated-core.md). Also runs mixed_bfloat16 on hosts
     * without AVX-512, where oneDNN has no bf16 matmul. */
    int deterministic;
    /* Nonzero: the cross-entropy losses take the last layer's output as
     * logits (Keras' SparseCategoricalCrossentropy(from_logits=True) and
     * CategoricalCrossentropy(from_logits=True)), computed through a stable
     * log-softmax on the cores; the last layer is then usually linear.
     * Accuracy is the argmax of the logits. Mean squared error ignores it. */
    uint64_t from_logits;
    uint64_t reserved[7]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_compile_options;

/* Adam, sparse categorical cross-entropy, accuracy, 1 step per execution,
 * float32, batch size decided by the first fit, infeed depth 2. */
TPU_API void tpu_compile_options_init(tpu_compile_options *o);

/* model.compile(): checks the options and, when batch_size is given (or the
 * model was compiled before), compiles onto every core. Compiling again with
 * another batch size keeps the weights; after a re-initialize it starts
 * from the seed again, the step, epoch and batch at 0 (load a checkpoint to
 * continue instead).
 * Errors: TPU_INVALID_ARGUMENT, TPU_RESOURCE_EXHAUSTED (a core's HBM report:
 * what did not fit, the largest allocations, what to do), TPU_UNAVAILABLE. */
TPU_API tpu_status tpu_model_compile(tpu_model *m, const tpu_compile_options *o);

TPU_API size_t tpu_model_num_params(const tpu_model *m);
/* Keras-like summary table into buf (NUL-terminated, truncated to n). */
TPU_API size_t tpu_model_summary(const tpu_model *m, char *buf, size_t n);
/* HBM in use on the most loaded core after the last compile or step. */
TPU_API uint64_t tpu_model_hbm_used(const tpu_model *m);
TPU_API uint64_t tpu_model_hbm_capacity(const tpu_model *m);

/* ---- training ---- */

/* What fit reports after a batch or an epoch. accuracy is NaN when not
 * computed (no accuracy metric, or MSE). */
typedef struct tpu_logs {
    int epoch;
    double loss, accuracy;
    int has_val;
    double val_loss, val_accuracy;
    size_t batch;         /* batches done in this epoch */
    size_t batches;       /* batches in an epoch */
    uint64_t step;        /* global steps done */
    double elapsed_s;     /* since the epoch began */
    double examples_per_s;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_logs;

/* Time of the last step, as the client and the cores saw it (nanoseconds;
 * per-core figures are the slowest core's, but for allreduce_min_ns). */
typedef struct tpu_step_stats {
    uint64_t step;
    uint64_t wall_ns;        /* client: this step's share of its execution */
    uint64_t input_wait_ns;  /* client: waiting for the dataset */
    uint64_t compute_ns;     /* forward + backward */
    uint64_t matmul_ns;      /* of which in the matrix unit */
    uint64_t allreduce_ns;   /* from the core's arrival to its result: the first to
                                * arrive waits there for the others */
    uint64_t allreduce_min_ns; /* the shortest core's: the last to arrive waits for
                                * no one, so this is the exchange itself */
    uint64_t optimizer_ns;
    uint64_t infeed_wait_ns; /* cores waiting for their shard */
    size_t rows;             /* global batch */
    uint64_t reserved[8];    /* zero: room to grow (docs/api/conventions.md) */
} tpu_step_stats;
TPU_API tpu_status tpu_model_last_step_stats(const tpu_model *m, tpu_step_stats *out);

/* A callback's hooks may be NULL. A hook returns TPU_OK to go on,
 * TPU_CANCELLED to stop training cleanly (fit returns TPU_OK with the
 * epochs done), anything else to stop fit with that status. destroy (may be
 * NULL) frees user when the callback is no longer needed (tpu_callback_clear). */
typedef struct tpu_callback {
    tpu_status (*on_train_begin)(tpu_model *m, void *user);
    tpu_status (*on_epoch_begin)(tpu_model *m, int epoch, void *user);
    tpu_status (*on_batch_begin)(tpu_model *m, int epoch, size_t batch, void *user);
    tpu_status (*on_batch_end)(tpu_model *m, int epoch, size_t batch, const tpu_logs *logs, void *user);
    tpu_status (*on_epoch_end)(tpu_model *m, int epoch, const tpu_logs *logs, void *user);
    tpu_status (*on_train_end)(tpu_model *m, const tpu_logs *logs, void *user);
    void (*destroy)(void *user);
    void *user;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_callback;
/* Calls cb->destroy(cb->user) and zeroes *cb (the struct's contents). */
TPU_API void tpu_callback_clear(tpu_callback *cb);
/* Deprecated name of tpu_callback_clear (kept until the next SOVERSION). */
TPU_API void tpu_callback_free(tpu_callback *cb);

/* Keras' progress bar: on a terminal one line per epoch redrawn after each
 * execution ("12/58 [====>.....] - 1s 21ms/step - loss: 0.52 - accuracy:
 * 0.81"), elsewhere one plain line per epoch. out must outlive the callback. */
TPU_API tpu_status tpu_callback_progress(FILE *out, tpu_callback *cb);
/* ModelCheckpoint: saves to path (atomically) after every epoch, or every
 * save_every_steps steps when that is > 0. */
TPU_API tpu_status tpu_callback_checkpoint(const char *path, uint64_t save_every_steps, tpu_callback *cb);
/* TensorBoard(log_dir, profile_batch='first,last'): when batch last (1-based,
 * counted from the start of training, as Keras counts them: once per
 * execution, so with steps_per_execution k a "batch" is k steps) is done,
 * reads every core's events of batches first..last (tpuemu/profile.h),
 * writes the trace to logdir/train/plugins/profile/RUN/HOST.trace.json.gz
 * (RUN: the local time, YYYY_MM_DD_HH_MM_SS), and beside it the overview
 * (HOST.overview.json), its picture (steps.svg) and the client's per-step
 * times (steps.json), and reports where they are with the overview to the
 * FILE * of tpu_callback_profiler_report (none by default). It also writes
 * the epoch scalars as tpu_callback_tensorboard does. */
TPU_API tpu_status tpu_callback_profiler(const char *logdir, uint64_t first, uint64_t last, tpu_callback *cb);
/* Keras' TensorBoard(log_dir, profile_batch): after every epoch, the
 * scalars epoch_loss and epoch_accuracy (step: the epoch, from 0) in an
 * event file under log_dir/train, and when validation ran, the validation's
 * epoch_loss and epoch_accuracy and evaluation_loss_vs_iterations and
 * evaluation_accuracy_vs_iterations (step: the global step) under
 * log_dir/validation; the files are named
 * events.out.tfevents.SECONDS.HOST.PID.N.v2, TensorBoard reads them. first =
 * last = 0 profiles nothing (profile_batch=0); else batches first..last are
 * profiled as tpu_callback_profiler does. */
TPU_API tpu_status tpu_callback_tensorboard(const char *log_dir, uint64_t first, uint64_t last, tpu_callback *cb);
/* Where a profiler or TensorBoard callback reports each profile it wrote
 * ("Profile of batches ...", the overview, "Trace: PATH", "Picture: PATH"):
 * out (NULL: nowhere, the default), which must outlive the callback.
 * TPU_INVALID_ARGUMENT when cb is not such a callback. */
TPU_API tpu_status tpu_callback_profiler_report(tpu_callback *cb, FILE *out);
/* The run directory the profiler callback wrote ("" before it wrote one). */
TPU_API const char *tpu_callback_profiler_dir(const tpu_callback *cb);

/* Elastic training: fit goes on when cores are lost (tpu_fit_options.elastic). */
typedef enum tpu_elastic_batch {
    TPU_ELASTIC_KEEP_GLOBAL_BATCH = 0,  /* the global batch stays: each survivor takes a larger shard (rows
                                           split as evenly as they go), steps per epoch unchanged */
    TPU_ELASTIC_KEEP_PER_REPLICA_BATCH, /* each replica keeps its shard: the global batch shrinks with the
                                           replicas (the dataset is batched anew; refused for a pipeline with
                                           a map() or cache() after its batch()) */
} tpu_elastic_batch;

typedef struct tpu_elastic_options {
    int max_losses;            /* losses to go on through, 1..1000; 0: elastic training off */
    uint32_t wait_ms;          /* how long to wait for the lost cores to come back before going on
                                  without them; 0: 30000; at most 3600000 */
    int min_replicas;          /* fewer live cores than this: fit fails; 0: 1 */
    tpu_elastic_batch batch;
    /* Where training goes on from: this checkpoint file (tpu_callback_checkpoint's or the
     * preemption checkpoint) when it exists and is newer than the snapshot in memory; else the
     * snapshot fit keeps in memory (read from replica 0 when fit starts, every snapshot_steps
     * steps and at a notice). NULL: the snapshot only. */
    const char *checkpoint;
    uint64_t snapshot_steps;   /* 0: 50 */
    uint64_t reserved[8];      /* zero: room to grow (docs/api/conventions.md) */
} tpu_elastic_options;

/* One event of elastic training, in the history. */
typedef enum tpu_elastic_event_kind {
    TPU_ELASTIC_NOTICE = 1,    /* a preemption or maintenance notice: a snapshot at a step boundary, and on */
    TPU_ELASTIC_RESTORED,      /* the lost cores came back in time: the same replicas, state restored */
    TPU_ELASTIC_SHRUNK,        /* went on with fewer replicas, re-sharded, state restored */
    TPU_ELASTIC_GREW,          /* lost cores came back: taken back at a snapshot step, re-sharded */
} tpu_elastic_event_kind;

typedef struct tpu_elastic_event {
    tpu_elastic_event_kind kind;
    uint64_t step;             /* global steps done when it happened */
    uint64_t restored_step;    /* the step training went on from (RESTORED, SHRUNK; step for NOTICE, GREW) */
    int replicas_before, replicas_after;
    size_t global_batch_before, global_batch_after;
    double seconds;            /* waiting for cores, re-initializing, restoring */
    char from[256];            /* "memory" or the checkpoint file restored */
    char cause[512];           /* the error or the notice, naming the core */
    uint64_t reserved[8];      /* zero: room to grow (docs/api/conventions.md) */
} tpu_elastic_event;

typedef struct tpu_fit_options {
    int epochs;                       /* train epochs [initial_epoch, epochs), as Keras counts */
    int initial_epoch;
    int resume;                       /* start where the model is (a loaded checkpoint: its epoch and batch) */
    tpu_dataset *validation_data;     /* evaluated after each epoch; may be NULL */
    const tpu_callback *callbacks;
    size_t num_callbacks;
    /* Like TensorFlow's PreemptionCheckpointHandler: when a training answer
     * carries a preemption or maintenance notice (tpu_model_notice), no more
     * steps are sent, every replica stops at the same step boundary (the last
     * one sent), the model is saved to this path (atomically, as
     * tpu_model_save_checkpoint) and fit returns TPU_PREEMPTED. Started again
     * with resume after loading it, fit goes on from that step. NULL: fit
     * does not watch for notices. */
    const char *preemption_checkpoint;
    /* Elastic training (max_losses > 0): when a step fails because a core is
     * lost (TPU_UNAVAILABLE or TPU_DEADLINE_EXCEEDED naming it: killed,
     * hung, preempted, down for maintenance), fit waits up to wait_ms for
     * the cluster to have its replicas live again, else goes on with the
     * live cores: it initializes the TPU system again, compiles the model
     * onto it, restores the newest state (checkpoint file or snapshot),
     * re-shards by batch and continues; each loss and each notice is an event
     * in the history (tpu_history_event). With elastic training a notice does
     * not stop fit: the preemption checkpoint (when set) is saved and a
     * snapshot taken at that step boundary, and training goes on until the
     * event comes. */
    tpu_elastic_options elastic;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_fit_options;

typedef struct tpu_history tpu_history;
TPU_API size_t tpu_history_num_epochs(const tpu_history *h);
TPU_API tpu_status tpu_history_epoch(const tpu_history *h, size_t i, tpu_logs *out);
/* Elastic training's events, in order (notices and losses). */
TPU_API size_t tpu_history_num_events(const tpu_history *h);
TPU_API tpu_status tpu_history_event(const tpu_history *h, size_t i, tpu_elastic_event *out);
TPU_API const char *tpu_elastic_event_kind_name(tpu_elastic_event_kind k); /* "NOTICE", "RESTORED", "SHRUNK", "GREW" */
TPU_API void tpu_history_free(tpu_history *h);

/* model.fit(dataset): the dataset must be batched with a global batch that
 * splits evenly over the replicas (TPU_INVALID_ARGUMENT otherwise, saying
 * what to use); a per-core batch that is not a multiple of 8, or a global
 * batch not a multiple of 128, earns one performance warning (tpu_set_warning_handler).
 * history (may be NULL) gets the per-epoch logs, also when fit fails. */
TPU_API tpu_status tpu_model_fit(tpu_model *m, tpu_dataset *ds, const tpu_fit_options *o, tpu_history **history);
/* model.evaluate(dataset): mean loss and accuracy (NaN if not computed) over the dataset. */
TPU_API tpu_status tpu_model_evaluate(tpu_model *m, tpu_dataset *ds, double *loss, double *accuracy);
/* model.predict(dataset): the last layer's outputs, rows x units floats, into out
 * (room for out_rows rows). TPU_OUT_OF_RANGE if the dataset has more rows. */
TPU_API tpu_status tpu_model_predict(tpu_model *m, tpu_dataset *ds, float *out, size_t out_rows, size_t *rows);

/* Options of evaluate and predict, as Keras' evaluate(..., callbacks=) and
 * predict(..., callbacks=) take them. Each callback's on_train_begin runs
 * before the pass (Keras' on_test_begin / on_predict_begin), on_batch_begin
 * and on_batch_end around every execution (epoch 0, the batch's index in the
 * pass; evaluate's logs carry the loss and accuracy so far), and
 * on_train_end after it (evaluate's final logs; predict's loss and accuracy
 * are NaN); the epoch hooks are not called. A hook returning TPU_CANCELLED
 * ends the pass early (the results cover the batches done); another status
 * fails the call with it. tpu_eval_options_init (or = {0}) zeroes it. */
typedef struct tpu_eval_options {
    const tpu_callback *callbacks;
    size_t num_callbacks;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_eval_options;
TPU_API void tpu_eval_options_init(tpu_eval_options *o);
/* tpu_model_evaluate and tpu_model_predict with options (o may be NULL). */
TPU_API tpu_status tpu_model_evaluate_with(tpu_model *m, tpu_dataset *ds, const tpu_eval_options *o, double *loss,
                                           double *accuracy);
TPU_API tpu_status tpu_model_predict_with(tpu_model *m, tpu_dataset *ds, const tpu_eval_options *o, float *out,
                                          size_t out_rows, size_t *rows);

/* The notice (preemption, maintenance) the last training answers carried:
 * of all replicas, the one whose event comes soonest; kind TPU_NOTICE_NONE
 * when none did. *replica (may be NULL) gets its replica, -1 for none. A
 * training loop learns of a notice this way, without asking the resolver. */
TPU_API tpu_status tpu_model_notice(const tpu_model *m, tpu_notice *out, int *replica);

/* Where training is: the global step, and the epoch and batch the next fit
 * with resume starts at. */
TPU_API uint64_t tpu_model_step(const tpu_model *m);
TPU_API int tpu_model_epoch(const tpu_model *m);
TPU_API size_t tpu_model_batch_in_epoch(const tpu_model *m);

/* Weights of one replica (model_num_params floats, layer by layer: kernel
 * [in x units] row-major, then bias), read from its core. */
TPU_API tpu_status tpu_model_get_weights(tpu_model *m, int replica, float *out, size_t n);

/* Saves weights, optimizer state, step, epoch and batch and the seeds to path
 * atomically (temp file, fsync, rename) with a checksum, keyed with the
 * cluster token when the client has one. */
TPU_API tpu_status tpu_model_save_checkpoint(tpu_model *m, const char *path);
/* Loads a checkpoint into every core of the compiled model (or at its first
 * compile) and sets the step, epoch and batch for fit's resume.
 * TPU_DATA_LOSS for a damaged file, TPU_INVALID_ARGUMENT for another model's;
 * TPU_UNAUTHENTICATED when the file's keyed seal does not match the client's
 * token, when it has a keyed seal and the client no token, or when the client
 * has a token and the file only the unkeyed checksum (unless
 * $TPUEMU_CHECKPOINT_ALLOW_UNKEYED is 1). */
TPU_API tpu_status tpu_model_load_checkpoint(tpu_model *m, const char *path);

/* Warnings (batch sizes, elastic training's events, initializing a TPU
 * system again): fn(message, user). The library never prints: by default,
 * and with fn NULL, warnings are dropped. Process-wide. */
typedef void (*tpu_warning_fn)(const char *message, void *user);
TPU_API void tpu_set_warning_handler(tpu_warning_fn fn, void *user);
/* A ready handler: writes "tpuemu: warning: MESSAGE\n" to the FILE * given as
 * user (NULL: nothing), as tpuctl does with stderr:
 *   tpu_set_warning_handler(tpu_warning_to_file, stderr); */
TPU_API void tpu_warning_to_file(const char *message, void *file);

/* ---- custom training loops (tf.distribute.TPUStrategy) ----
 *
 *   tpu_dist_dataset *dd;  tpu_dist_iter *it;  tpu_per_replica *x;  tpu_step_outputs o;
 *   tpu_strategy_experimental_distribute_dataset(s, ds, &dd); // ds batched by the global batch
 *   for (int epoch = 0; epoch < EPOCHS; epoch++) {
 *       double total = 0, loss;  size_t got;
 *       tpu_dist_dataset_iter(dd, &it);                         // for x in dist_dataset:
 *       while (tpu_dist_iter_next(it, &x) == TPU_OK && x) {
 *           tpu_strategy_run(s, TPU_STEP_TRAIN, m, x, &o);      //   strategy.run(train_step, args=(x,))
 *           tpu_strategy_reduce(s, TPU_SUM, o.loss, TPU_AXIS_NONE, &loss, 1, &got);
 *           total += loss;                                      //   strategy.reduce(SUM, per_replica_losses)
 *           tpu_step_outputs_clear(&o);  tpu_per_replica_free(x);
 *       }
 *       tpu_dist_iter_free(it);
 *   }
 *
 * A step function is one of the built-in steps of a compiled model, run on
 * every core on that core's shard (the same requests fit sends, one step at a
 * time): TPU_STEP_TRAIN is forward, backward, the gradients all-reduced (summed
 * and divided by the rows of the global batch) and the optimizer applied on
 * every replica; TPU_STEP_EVALUATE is forward with the loss and accuracy;
 * TPU_STEP_PREDICT is forward with the last layer's outputs. Each returns
 * per-replica values (one value per replica), reduced on the client with
 * tpu_strategy_reduce or read one by one with
 * tpu_strategy_experimental_local_results. */

typedef struct tpu_dist_dataset tpu_dist_dataset;
typedef struct tpu_dist_iter tpu_dist_iter;
/* One value per replica: an input (each replica's shard of a global batch:
 * rows of x and their labels) or a tensor of doubles per replica (a scalar,
 * a vector of rows, or rows x columns). */
typedef struct tpu_per_replica tpu_per_replica;

/* strategy.experimental_distribute_dataset(ds): ds must be batched (the
 * global batch); each batch is split into num_replicas_in_sync shards in
 * replica order, as tf.data's rebatch with
 * batch_sizes_for_worker(global_batch, 1, replicas, 0) splits it: the first
 * (global_batch mod replicas) replicas get one row more than the others
 * (floor(global/replicas)); a last partial batch fills the replicas in order,
 * each up to its size, and the replicas past its end get empty shards. ds
 * must outlive dd and not be iterated elsewhere while dd's iterator lives.
 * Errors: TPU_INVALID_ARGUMENT (not batched). */
TPU_API tpu_status tpu_strategy_experimental_distribute_dataset(tpu_strategy *s, tpu_dataset *ds,
                                                                tpu_dist_dataset **out);

/* What strategy.distribute_datasets_from_function gives the function
 * (tf.distribute.InputContext): one input pipeline here (one client). */
typedef struct tpu_input_context {
    int num_input_pipelines;   /* 1 */
    int input_pipeline_id;     /* 0 */
    int num_replicas_in_sync;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_input_context;
/* InputContext.get_per_replica_batch_size(global_batch): global / replicas;
 * 0 (and TPU_INVALID_ARGUMENT recorded) when it does not divide evenly, as
 * TensorFlow raises ValueError. */
TPU_API size_t tpu_input_context_per_replica_batch_size(const tpu_input_context *ctx, size_t global_batch);
/* Makes the pipeline's dataset, batched by the per-replica batch. The
 * dataset is owned by the distributed dataset from then on (freed with it). */
typedef tpu_status (*tpu_dataset_fn)(const tpu_input_context *ctx, void *user, tpu_dataset **out);
/* strategy.distribute_datasets_from_function(fn): fn is called once; its
 * dataset's batches are dealt to the replicas in turn (replica r of step k
 * gets batch k x replicas + r); at the end, replicas past the last batch get
 * empty shards. */
TPU_API tpu_status tpu_strategy_distribute_datasets_from_function(tpu_strategy *s, tpu_dataset_fn fn, void *user,
                                                                  tpu_dist_dataset **out);
/* Where the input pipelines of a dataset distributed from files run. */
typedef enum tpu_input_placement {
    /* each core's host process (the tpu-worker) runs the core's pipeline:
     * no training data passes through the client, which only drives the
     * steps (TensorFlow's per-host input pipelines and infeed) */
    TPU_INPUT_ON_HOSTS = 0,
    /* the client runs the same pipelines and sends each core its rows: the
     * client-fed path, with the same batches bit for bit */
    TPU_INPUT_ON_CLIENT = 1,
} tpu_input_placement;
/* strategy.distribute_datasets_from_function for a dataset read from files
 * (tpuemu/data.h's tpu_file_dataset, batched by the per-replica batch): one
 * input pipeline per replica (num_input_pipelines = num_replicas_in_sync,
 * input_pipeline_id = the replica: each tpu-worker process is the host of
 * its core and runs its pipeline), each over its
 * shard of the rows. Global batch k is every replica's batch k, replica r's
 * in rows [r x batch, (r + 1) x batch), so fit's even split gives each
 * replica its pipeline's batch. An epoch is as many steps as the pipeline
 * with the fewest full batches yields. *out is a dataset fit, evaluate and
 * predict take (free it with tpu_dataset_free; fd may be freed at once); it
 * fits this strategy's number of replicas only (elastic fit refuses it:
 * TPU_INVALID_ARGUMENT). With TPU_INPUT_ON_HOSTS, iterating it on
 * the client yields each batch's size with x and y NULL; the hosts read the
 * files when the first step comes, and a file a host cannot read, or that
 * differs from the client's, fails that step with the host's error naming
 * the file. Errors: TPU_INVALID_ARGUMENT (not batched, a shard with less
 * than one batch, an unknown placement). */
TPU_API tpu_status tpu_strategy_distribute_datasets_from_files(tpu_strategy *s, const tpu_file_dataset *fd,
                                                               tpu_input_placement where, tpu_dataset **out);
/* Frees dd, its live iterator (if any) and the dataset of a dataset function
 * (a dataset given to experimental_distribute_dataset stays the caller's). */
TPU_API void tpu_dist_dataset_free(tpu_dist_dataset *dd);

/* iter(dist_dataset): one pass over the dataset. Each new iterator is the
 * next epoch (0, 1, ...: a shuffle() reshuffles, as iterating a
 * tf.data.Dataset again does). One iterator at a time per distributed
 * dataset. */
TPU_API tpu_status tpu_dist_dataset_iter(tpu_dist_dataset *dd, tpu_dist_iter **out);
/* next(iterator): the next global batch as a per-replica input (the shards
 * are copied: the value stays valid after the iterator moves on or is
 * freed), or *out NULL at the end of the pass (StopIteration). */
TPU_API tpu_status tpu_dist_iter_next(tpu_dist_iter *it, tpu_per_replica **out);
TPU_API void tpu_dist_iter_free(tpu_dist_iter *it);

/* The built-in step functions tpu_strategy_run applies on the cores. */
typedef enum tpu_step_fn {
    TPU_STEP_TRAIN = 1,     /* forward, backward, gradients all-reduced, optimizer applied */
    TPU_STEP_EVALUATE = 2,  /* forward: loss and accuracy */
    TPU_STEP_PREDICT = 3,   /* forward: the last layer's outputs */
} tpu_step_fn;

/* What a step returns: per-replica values (NULL when the step does not
 * produce them). Scalars per replica unless said otherwise. */
typedef struct tpu_step_outputs {
    /* tf.nn.compute_average_loss(per_example_loss, global_batch_size=G):
     * the sum of the replica's per-example losses / G, G the rows of the
     * global batch; reduce SUM gives the step's mean loss. TRAIN, EVALUATE. */
    tpu_per_replica *loss;
    tpu_per_replica *loss_sum;     /* the sum of the replica's per-example losses. TRAIN, EVALUATE */
    tpu_per_replica *correct;      /* examples predicted right (NULL for MSE). TRAIN, EVALUATE */
    tpu_per_replica *examples;     /* the replica's rows. every step */
    tpu_per_replica *predictions;  /* rows x units of the last layer. PREDICT */
    uint64_t reserved[8];          /* zero: room to grow (docs/api/conventions.md) */
} tpu_step_outputs;

/* strategy.run(fn, args=(x,)): fn on every replica with its shard of x (from
 * tpu_dist_iter_next, of this strategy's replicas), on model m (compiled in
 * s; compiled onto the cores for the largest shard first if needed). TRAIN
 * advances the model's step as one step of fit does: a loop of TRAIN steps
 * over the batches fit would see leaves the same weights as fit.
 * Errors: TPU_INVALID_ARGUMENT (an unknown fn, x not an input, x's rows not
 * the model's width, labels the loss cannot take, x for another number of
 * replicas, m of another strategy), TPU_FAILED_PRECONDITION (m not compiled,
 * no TPU system), and a step's failures as fit has them. On failure out is
 * all NULL. */
TPU_API tpu_status tpu_strategy_run(tpu_strategy *s, tpu_step_fn fn, tpu_model *m, const tpu_per_replica *x,
                                    tpu_step_outputs *out);
/* Frees what *o holds and zeroes it (the struct's contents). */
TPU_API void tpu_step_outputs_clear(tpu_step_outputs *o);
/* Deprecated name of tpu_step_outputs_clear (kept until the next SOVERSION). */
TPU_API void tpu_step_outputs_free(tpu_step_outputs *o);
TPU_API void tpu_per_replica_free(tpu_per_replica *pr);
TPU_API int tpu_per_replica_num_replicas(const tpu_per_replica *pr);

/* tf.distribute.ReduceOp.SUM and MEAN are tpuemu.h's TPU_SUM and TPU_MEAN. */
#define TPU_AXIS_NONE (-1)

/* strategy.reduce(op, value, axis): axis TPU_AXIS_NONE adds the replicas'
 * values element by element (every replica's value must have the same
 * shape), MEAN dividing by the number of replicas; axis 0 (the batch) first
 * reduces each replica's value along its rows, then over the replicas, MEAN
 * dividing by the rows of all replicas (the global batch: the right
 * denominator for a partial batch). An input's value is its x (rows x
 * features). The result (*got doubles: 1 for a scalar, else the remaining
 * shape's size) goes to out (room for n).
 * Errors: TPU_INVALID_ARGUMENT (an op other than TPU_SUM and TPU_MEAN, axis not -1 or 0, axis 0 of a
 * scalar, shapes that differ with axis TPU_AXIS_NONE, out too small: *got
 * says how many are needed). MEAN over axis 0 of no rows at all is NaN
 * (0 / 0, as TensorFlow's division gives). */
TPU_API tpu_status tpu_strategy_reduce(const tpu_strategy *s, tpu_reduce_op op, const tpu_per_replica *value, int axis,
                                       double *out, size_t n, size_t *got);

/* One replica's part of a per-replica value. */
typedef struct tpu_local_value {
    int rank;              /* 0: a scalar; 1: [dims[0]]; 2: [dims[0] x dims[1]] */
    size_t dims[2];
    const double *v;       /* a tensor's values (NULL for an input) */
    const float *x;        /* an input's shard: dims[0] rows of dims[1] floats (NULL for a tensor) */
    const void *y;         /* and its labels as the dataset has them (NULL: none) */
    uint64_t reserved[8];  /* zero: room to grow (docs/api/conventions.md) */
} tpu_local_value;

/* strategy.experimental_local_results(value): the value of each replica in
 * replica order, into out[0..n) (n >= the value's replicas), pointing into
 * value (valid while it lives). *got: the replicas. */
TPU_API tpu_status tpu_strategy_experimental_local_results(const tpu_strategy *s, const tpu_per_replica *value,
                                                           tpu_local_value *out, size_t n, size_t *got);

#ifdef __cplusplus
}
#endif

#endif
