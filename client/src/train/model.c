/* Models through libtpuclient: the strategy, building and compiling a model
 * onto every core, its state (weights, optimizer slots) and checkpoints. The
 * step loop is fit.c; the wire is train_io.c. */
#include "model_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "auth.h"
#include "ckpt.h"
#include "lrsched.h"

#define CALL_FLOOR_MS 30000u
#define CALL_BYTES_PER_MS 20000u
#define CKPT_FORMAT "tpuemu model checkpoint 1"

uint64_t model_deadline(tpu_cluster *c, size_t bytes)
{
    /* at least twice the cluster's dead-core time: a cluster run with a long
     * one (many more cores than CPUs) has slow steps that are not failures */
    uint64_t floor = 2 * cli_coll_progress_ms(c);
    return wire_now_ms() + (floor > CALL_FLOOR_MS ? floor : CALL_FLOOR_MS) + bytes / CALL_BYTES_PER_MS;
}

/* ---- strategy ---- */

tpu_status tpu_strategy_new(tpu_cluster *c, tpu_strategy **out)
{
    tpu_strategy *s;
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    *out = NULL;
    if (!c->coll || c->coll->n == 0)
        return cli_failf(TPU_FAILED_PRECONDITION,
                         "no TPU system: call tpu_initialize_system (or tpu_attach_system) before making a strategy");
    if (!(s = calloc(1, sizeof *s)))
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    s->magic = MAGIC_STRATEGY;
    s->c = c;
    *out = s;
    return TPU_OK;
}

void tpu_strategy_free(tpu_strategy *s)
{
    if (!s)
        return;
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    s->magic = MAGIC_DEAD;
    free(s);
}

int tpu_strategy_num_replicas_in_sync(const tpu_strategy *s)
{
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    return s->c->coll ? (int)s->c->coll->n : 0;
}

tpu_cluster *tpu_strategy_cluster(const tpu_strategy *s)
{
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    return s->c;
}

/* ---- options ---- */

tpu_optimizer tpu_optimizer_sgd(float learning_rate, float momentum)
{
    tpu_optimizer o;
    memset(&o, 0, sizeof o);
    o.kind = TPU_OPT_SGD;
    o.learning_rate = learning_rate > 0 ? learning_rate : 0.01f;
    o.momentum = momentum;
    return o;
}

tpu_optimizer tpu_optimizer_adam(float learning_rate)
{
    tpu_optimizer o;
    memset(&o, 0, sizeof o);
    o.kind = TPU_OPT_ADAM;
    o.learning_rate = learning_rate > 0 ? learning_rate : 0.001f;
    o.beta_1 = 0.9f;
    o.beta_2 = 0.999f;
    o.epsilon = 1e-7f;
    return o;
}

tpu_optimizer tpu_optimizer_sgd_schedule(tpu_lr_schedule s, float momentum)
{
    tpu_optimizer o = tpu_optimizer_sgd(0, momentum);
    o.schedule = s;
    return o;
}

tpu_optimizer tpu_optimizer_adam_schedule(tpu_lr_schedule s)
{
    tpu_optimizer o = tpu_optimizer_adam(0);
    o.schedule = s;
    return o;
}

tpu_lr_schedule tpu_exponential_decay(float initial_learning_rate, uint64_t decay_steps, float decay_rate,
                                      int staircase)
{
    tpu_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.kind = TPU_LR_EXPONENTIAL_DECAY;
    s.initial_learning_rate = initial_learning_rate;
    s.decay_steps = decay_steps;
    s.decay_rate = decay_rate;
    s.staircase = staircase != 0;
    return s;
}

tpu_lr_schedule tpu_cosine_decay(float initial_learning_rate, uint64_t decay_steps, float alpha)
{
    tpu_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.kind = TPU_LR_COSINE_DECAY;
    s.initial_learning_rate = initial_learning_rate;
    s.decay_steps = decay_steps;
    s.alpha = alpha;
    return s;
}

tpu_lr_schedule tpu_cosine_decay_warmup(float initial_learning_rate, uint64_t decay_steps, float alpha,
                                        float warmup_target, uint64_t warmup_steps)
{
    tpu_lr_schedule s = tpu_cosine_decay(initial_learning_rate, decay_steps, alpha);
    s.has_warmup_target = 1;
    s.warmup_target = warmup_target;
    s.warmup_steps = warmup_steps;
    return s;
}

/* the common library's form of a public schedule */
static void sched_to_lrs(const tpu_lr_schedule *s, struct lr_schedule *l)
{
    memset(l, 0, sizeof *l);
    l->kind = (enum lrs_kind)s->kind;
    l->initial = s->initial_learning_rate;
    l->decay_steps = s->decay_steps;
    l->decay_rate = s->decay_rate;
    l->staircase = s->staircase != 0;
    l->alpha = s->alpha;
    l->has_warmup = s->has_warmup_target != 0;
    l->warmup_target = s->warmup_target;
    l->warmup_steps = s->warmup_steps;
    l->nbounds = s->num_boundaries <= TPU_LR_MAX_BOUNDARIES ? s->num_boundaries : TPU_LR_MAX_BOUNDARIES + 1;
    for (size_t i = 0; i < TPU_LR_MAX_BOUNDARIES; i++)
        l->bounds[i] = s->boundaries[i];
    for (size_t i = 0; i <= TPU_LR_MAX_BOUNDARIES; i++)
        l->values[i] = s->values[i];
}

static int sched_check(const tpu_lr_schedule *s, char *why, size_t n)
{
    struct lr_schedule l;
    if (!s || (unsigned)s->kind > TPU_LR_COSINE_DECAY) {
        snprintf(why, n, "learning-rate schedule kind %d is unknown (TPU_LR_CONSTANT, TPU_LR_EXPONENTIAL_DECAY, "
                         "TPU_LR_PIECEWISE_CONSTANT_DECAY, TPU_LR_COSINE_DECAY)", s ? (int)s->kind : -1);
        return -1;
    }
    sched_to_lrs(s, &l);
    return lrs_check(&l, why, n);
}

tpu_status tpu_piecewise_constant_decay(const uint64_t *boundaries, size_t n, const float *values,
                                        tpu_lr_schedule *out)
{
    tpu_lr_schedule s;
    char why[200];
    if (!out || (n && (!boundaries || !values)))
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_piecewise_constant_decay: missing boundaries, values or out");
    memset(out, 0, sizeof *out);
    if (n < 1 || n > TPU_LR_MAX_BOUNDARIES)
        return cli_failf(TPU_INVALID_ARGUMENT, "PiecewiseConstantDecay: %zu boundaries; give 1 to %d and one value "
                         "more", n, TPU_LR_MAX_BOUNDARIES);
    memset(&s, 0, sizeof s);
    s.kind = TPU_LR_PIECEWISE_CONSTANT_DECAY;
    s.num_boundaries = n;
    memcpy(s.boundaries, boundaries, n * sizeof *boundaries);
    memcpy(s.values, values, (n + 1) * sizeof *values);
    if (sched_check(&s, why, sizeof why) != 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s", why);
    *out = s;
    return TPU_OK;
}

float tpu_lr_schedule_value(const tpu_lr_schedule *s, uint64_t step)
{
    struct lr_schedule l;
    char why[200];
    if (sched_check(s, why, sizeof why) != 0)
        return NAN;
    sched_to_lrs(s, &l);
    return lrs_value(&l, step);
}

void tpu_compile_options_init(tpu_compile_options *o)
{
    memset(o, 0, sizeof *o);
    o->optimizer = tpu_optimizer_adam(0);
    o->loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    o->metrics_accuracy = 1;
    o->steps_per_execution = 1;
    o->policy = TPU_POLICY_FLOAT32;
    o->infeed_depth = 2;
}

/* ---- the model ---- */

tpu_status tpu_model_new(tpu_strategy *s, size_t input_dim, tpu_model **out)
{
    tpu_model *m;
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    *out = NULL;
    if (input_dim < 1 || input_dim > MODEL_UNITS_MAX)
        return cli_failf(TPU_INVALID_ARGUMENT, "input_dim %zu is outside 1..%d", input_dim, MODEL_UNITS_MAX);
    if (!(m = calloc(1, sizeof *m)))
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    m->magic = MAGIC_MODEL;
    m->notice_replica = -1;
    m->s = s;
    m->id = auth_random64();
    m->in_dim = input_dim;
    m->seed = auth_random64();
    *out = m;
    return TPU_OK;
}

void tpu_model_free(tpu_model *m)
{
    if (!m)
        return;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    m->magic = MAGIC_DEAD;
    fit_cache_free(m);
    free(m->pending_state);
    free(m);
}

int model_layer_geom(const tpu_model *m, size_t l, struct lshape *in, struct lgeom *g, char *why, size_t n)
{
    struct lshape sh = m->in_shape.rank ? m->in_shape : (struct lshape){1, {(int)m->in_dim, 0, 0}};
    for (size_t i = 0; i <= l; i++) {
        struct lspec sp = m->spec[i];
        sp.units = (int)m->units[i];
        sp.act = (int)m->act[i];
        if (i == l && in)
            *in = sh;
        if (lshape_apply(&sp, &sh, g, why, n) != 0)
            return -1;
        sh = g->out;
    }
    return 0;
}

void model_layer_name(const tpu_model *m, size_t l, char *buf, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < l; i++)
        k += m->spec[i].kind == m->spec[l].kind;
    if (k)
        snprintf(buf, n, "%s_%d", lkind_prefix(m->spec[l].kind), k);
    else
        snprintf(buf, n, "%s", lkind_prefix(m->spec[l].kind));
}

/* Appends a layer after checking it takes the shape the layers before it
 * give (Keras raises at add time too). */
static tpu_status add_layer(tpu_model *m, const struct lspec *sp, size_t units, tpu_activation act)
{
    struct lgeom g;
    char why[200];
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    if (m->configured)
        return cli_failf(TPU_FAILED_PRECONDITION, "the model is compiled: add layers before tpu_model_compile");
    if (m->nlayers >= MODEL_LAYERS_MAX)
        return cli_failf(TPU_INVALID_ARGUMENT, "a model has at most %d layers", MODEL_LAYERS_MAX);
    if ((sp->kind == LK_DENSE || sp->kind == LK_CONV2D) && (units < 1 || units > MODEL_UNITS_MAX))
        return cli_failf(TPU_INVALID_ARGUMENT, "%s(%zu): %s must be in 1..%d", lkind_name(sp->kind), units,
                         sp->kind == LK_DENSE ? "units" : "filters", MODEL_UNITS_MAX);
    if ((unsigned)act > TPU_ACT_SWISH)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s(%zu): activation %d is unknown", lkind_name(sp->kind), units,
                         (int)act);
    if (sp->kind == LK_EMBEDDING && m->nlayers != 0)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "layer %zu: Embedding takes the token ids the model is given: it must "
                         "be the first layer",
                         m->nlayers);
    if (sp->kind == LK_ADD && (size_t)sp->from >= m->nlayers)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "layer %zu: Add takes the input of a layer before it (0..%zu), not of "
                         "layer %d",
                         m->nlayers, m->nlayers ? m->nlayers - 1 : 0, sp->from);
    m->spec[m->nlayers] = *sp;
    m->units[m->nlayers] = units;
    m->act[m->nlayers] = act;
    if (sp->kind == LK_ADD) {
        struct lshape a, b;
        char as[64], bs[64];
        if (model_layer_geom(m, (size_t)sp->from, &a, &g, why, sizeof why) == 0 &&
            model_layer_geom(m, m->nlayers, &b, &g, why, sizeof why) == 0 && memcmp(&a, &b, sizeof a) != 0) {
            lshape_format(&a, as, sizeof as);
            lshape_format(&b, bs, sizeof bs);
            memset(&m->spec[m->nlayers], 0, sizeof m->spec[0]);
            return cli_failf(TPU_INVALID_ARGUMENT,
                             "layer %zu: Add needs inputs of one shape, but layer %d takes %s "
                             "and this one %s",
                             m->nlayers, sp->from, as, bs);
        }
    }
    if (model_layer_geom(m, m->nlayers, NULL, &g, why, sizeof why) != 0) {
        memset(&m->spec[m->nlayers], 0, sizeof m->spec[0]);
        m->units[m->nlayers] = 0;
        m->act[m->nlayers] = TPU_ACT_LINEAR;
        return cli_failf(TPU_INVALID_ARGUMENT, "layer %zu: %s", m->nlayers, why);
    }
    m->nlayers++;
    return TPU_OK;
}

tpu_status tpu_model_add_dense(tpu_model *m, size_t units, tpu_activation act)
{
    struct lspec sp = {.kind = LK_DENSE};
    return add_layer(m, &sp, units, act);
}

tpu_status tpu_model_set_input_shape(tpu_model *m, const size_t *dims, size_t rank)
{
    struct lshape sh = {0, {0, 0, 0}};
    size_t n = 1;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    if (m->configured || m->nlayers)
        return cli_failf(TPU_FAILED_PRECONDITION, "set the input shape before adding layers");
    if (rank < 1 || rank > LSHAPE_MAX_RANK || !dims)
        return cli_failf(TPU_INVALID_ARGUMENT, "an input shape has 1..%d dimensions, not %zu", LSHAPE_MAX_RANK, rank);
    for (size_t i = 0; i < rank; i++) {
        if (dims[i] < 1 || dims[i] > MODEL_UNITS_MAX)
            return cli_failf(TPU_INVALID_ARGUMENT, "input shape dimension %zu is %zu, outside 1..%d", i, dims[i],
                             MODEL_UNITS_MAX);
        sh.d[i] = (int)dims[i];
        n *= dims[i];
    }
    sh.rank = (int)rank;
    if (n != m->in_dim)
        return cli_failf(TPU_INVALID_ARGUMENT, "an input shape of %zu values per example, but the model takes "
                         "input_dim %zu", n, m->in_dim);
    m->in_shape = sh;
    return TPU_OK;
}

static tpu_status add_window(tpu_model *m, enum lkind k, size_t units, size_t kh, size_t kw, size_t sh, size_t sw,
                             tpu_padding padding, tpu_activation act)
{
    struct lspec sp = {.kind = k};
    if (kh < 1 || kw < 1 || kh > 64 || kw > 64 || sh > 64 || sw > 64)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: window (%zu, %zu) and strides (%zu, %zu) must be in 1..64 "
                         "(strides 0: the default)", lkind_name(k), kh, kw, sh, sw);
    if ((unsigned)padding > TPU_PADDING_SAME)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: padding %d is neither TPU_PADDING_VALID nor TPU_PADDING_SAME",
                         lkind_name(k), (int)padding);
    sp.kh = (int)kh, sp.kw = (int)kw, sp.sh = (int)sh, sp.sw = (int)sw;
    sp.same = padding == TPU_PADDING_SAME;
    return add_layer(m, &sp, units, act);
}

tpu_status tpu_model_add_conv2d(tpu_model *m, size_t filters, size_t kernel_h, size_t kernel_w, size_t stride_h,
                                size_t stride_w, tpu_padding padding, tpu_activation act)
{
    return add_window(m, LK_CONV2D, filters, kernel_h, kernel_w, stride_h, stride_w, padding, act);
}

tpu_status tpu_model_add_max_pooling2d(tpu_model *m, size_t pool_h, size_t pool_w, size_t stride_h, size_t stride_w,
                                       tpu_padding padding)
{
    return add_window(m, LK_MAX_POOL2D, 0, pool_h, pool_w, stride_h, stride_w, padding, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_average_pooling2d(tpu_model *m, size_t pool_h, size_t pool_w, size_t stride_h,
                                           size_t stride_w, tpu_padding padding)
{
    return add_window(m, LK_AVG_POOL2D, 0, pool_h, pool_w, stride_h, stride_w, padding, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_global_average_pooling2d(tpu_model *m)
{
    struct lspec sp = {.kind = LK_GLOBAL_AVG_POOL2D};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_flatten(tpu_model *m)
{
    struct lspec sp = {.kind = LK_FLATTEN};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_dropout(tpu_model *m, float rate)
{
    struct lspec sp = {.kind = LK_DROPOUT, .rate = rate};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_layer_normalization(tpu_model *m, float epsilon)
{
    struct lspec sp = {.kind = LK_LAYER_NORM, .epsilon = epsilon == 0.0f ? 1e-3f : epsilon};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_batch_normalization(tpu_model *m, float momentum, float epsilon)
{
    struct lspec sp = {.kind = LK_BATCH_NORM,
                       .momentum = momentum == 0.0f ? 0.99f : momentum,
                       .epsilon = epsilon == 0.0f ? 1e-3f : epsilon};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_sync_batch_normalization(tpu_model *m, float momentum, float epsilon)
{
    struct lspec sp = {.kind = LK_BATCH_NORM,
                       .momentum = momentum == 0.0f ? 0.99f : momentum,
                       .epsilon = epsilon == 0.0f ? 1e-3f : epsilon,
                       .synchronized = 1};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_reshape(tpu_model *m, const size_t *dims, size_t rank)
{
    struct lspec sp = {.kind = LK_RESHAPE};
    if (rank < 1 || rank > LSHAPE_MAX_RANK || !dims)
        return cli_failf(TPU_INVALID_ARGUMENT, "Reshape: a target shape has 1..%d dimensions, not %zu",
                         LSHAPE_MAX_RANK, rank);
    for (size_t i = 0; i < rank; i++) {
        if (dims[i] < 1 || dims[i] > LSHAPE_MAX_SIZE)
            return cli_failf(TPU_INVALID_ARGUMENT, "Reshape: target dimension %zu is %zu", i, dims[i]);
        sp.target.d[i] = (int)dims[i];
    }
    sp.target.rank = (int)rank;
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

static tpu_status add_embedding(tpu_model *m, size_t input_dim, size_t output_dim, int positions)
{
    struct lspec sp = {.kind = LK_EMBEDDING, .positions = positions};
    if (input_dim < 1 || input_dim > LSHAPE_MAX_SIZE || output_dim < 1 || output_dim > MODEL_UNITS_MAX)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "Embedding(%zu, %zu): input_dim must be in 1..%d and output_dim in "
                         "1..%d",
                         input_dim, output_dim, LSHAPE_MAX_SIZE, MODEL_UNITS_MAX);
    sp.vocab = (int)input_dim;
    return add_layer(m, &sp, output_dim, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_embedding(tpu_model *m, size_t input_dim, size_t output_dim)
{
    return add_embedding(m, input_dim, output_dim, 0);
}

tpu_status tpu_model_add_token_and_position_embedding(tpu_model *m, size_t vocabulary_size, size_t embedding_dim)
{
    return add_embedding(m, vocabulary_size, embedding_dim, 1);
}

tpu_status tpu_model_add_global_average_pooling1d(tpu_model *m)
{
    struct lspec sp = {.kind = LK_GLOBAL_AVG_POOL1D};
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_multi_head_attention(tpu_model *m, size_t num_heads, size_t key_dim, size_t value_dim)
{
    struct lspec sp = {.kind = LK_MULTI_HEAD_ATTENTION};
    if (num_heads < 1 || num_heads > 256 || key_dim < 1 || key_dim > 4096 || value_dim > 4096)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "MultiHeadAttention(num_heads=%zu, key_dim=%zu, value_dim=%zu): "
                         "num_heads must be in 1..256, key_dim in 1..4096, value_dim in 0..4096 (0: key_dim)",
                         num_heads, key_dim, value_dim);
    sp.heads = (int)num_heads, sp.key_dim = (int)key_dim, sp.value_dim = (int)value_dim;
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_add_residual(tpu_model *m, size_t from_layer)
{
    struct lspec sp = {.kind = LK_ADD};
    sp.from = from_layer > MODEL_LAYERS_MAX ? MODEL_LAYERS_MAX : (int)from_layer;
    return add_layer(m, &sp, 0, TPU_ACT_LINEAR);
}

tpu_status tpu_model_set_gradient_checkpointing(tpu_model *m, int enabled)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    if (m->configured)
        return cli_failf(TPU_FAILED_PRECONDITION, "the model is compiled: set gradient checkpointing before "
                         "tpu_model_compile");
    m->remat = enabled != 0;
    return TPU_OK;
}

tpu_status tpu_model_set_seed(tpu_model *m, uint64_t seed)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    if (m->configured)
        return cli_failf(TPU_FAILED_PRECONDITION, "the model is compiled: set the seed before tpu_model_compile");
    m->seed = seed;
    return TPU_OK;
}

uint64_t model_sync_calls_per_step(const tpu_model *m)
{
    uint64_t n = 0;
    for (size_t l = 0; l < m->nlayers; l++)
        n += m->spec[l].kind == LK_BATCH_NORM && m->spec[l].synchronized ? 3 : 0;
    return n;
}

size_t model_nparams(const tpu_model *m)
{
    size_t n = 0;
    struct lgeom g;
    char why[8];
    for (size_t l = 0; l < m->nlayers; l++)
        if (model_layer_geom(m, l, NULL, &g, why, sizeof why) == 0)
            n += g.kernel + g.bias + g.stats;
    return n;
}

int model_nslots(const tpu_model *m)
{
    if (m->co.optimizer.kind == TPU_OPT_ADAM)
        return 2;
    return m->co.optimizer.momentum > 0 ? 1 : 0;
}

size_t tpu_model_num_params(const tpu_model *m)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    return model_nparams(m);
}

uint64_t tpu_model_hbm_used(const tpu_model *m)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    return m->hbm_used;
}

uint64_t tpu_model_hbm_capacity(const tpu_model *m)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    return m->hbm_capacity;
}

uint64_t tpu_model_step(const tpu_model *m)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    return m->step;
}

int tpu_model_epoch(const tpu_model *m)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    return m->cur_epoch;
}

size_t tpu_model_batch_in_epoch(const tpu_model *m)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    return m->cur_batch;
}

tpu_status tpu_model_last_step_stats(const tpu_model *m, tpu_step_stats *out)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    *out = m->last;
    return m->last.step ? TPU_OK : cli_failf(TPU_FAILED_PRECONDITION, "no step has run yet");
}

static const char *act_name(tpu_activation a)
{
    static const char *const n[] = {"linear", "relu", "softmax", "tanh", "sigmoid", "gelu", "softplus", "swish"};
    return (unsigned)a <= TPU_ACT_SWISH ? n[a] : "?";
}

/* "784 -> 128 relu -> 10 softmax, adam": what a checkpoint must match. */
static void describe(const tpu_model *m, char *buf, size_t n)
{
    size_t off = (size_t)snprintf(buf, n, "%zu", m->in_dim);
    for (size_t l = 0; l < m->nlayers && off < n; l++) {
        struct lshape in;
        struct lgeom g;
        char why[8], os[64];
        if (m->spec[l].kind == LK_DENSE && model_layer_geom(m, l, &in, &g, why, sizeof why) == 0 && in.rank == 1) {
            off += (size_t)snprintf(buf + off, n - off, " -> %zu %s", m->units[l], act_name(m->act[l]));
            continue;
        }
        if (model_layer_geom(m, l, NULL, &g, why, sizeof why) != 0)
            continue;
        lshape_format(&g.out, os, sizeof os);
        int act = g.kernel && m->spec[l].kind != LK_LAYER_NORM && m->spec[l].kind != LK_BATCH_NORM;
        off += (size_t)snprintf(buf + off, n - off, " -> %s%s%s %s", lkind_name(m->spec[l].kind), act ? " " : "",
                                act ? act_name(m->act[l]) : "", os);
    }
    if (off < n)
        snprintf(buf + off, n - off, ", %s with %d slot(s)", m->co.optimizer.kind == TPU_OPT_ADAM ? "adam" : "sgd",
                 model_nslots(m));
}

size_t tpu_model_summary(const tpu_model *m, char *buf, size_t n)
{
    size_t off = 0, frozen = 0;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
#define PUT(...) (off += (size_t)snprintf(buf + (off < n ? off : n), off < n ? n - off : 0, __VA_ARGS__))
    if (n)
        buf[0] = '\0';
    PUT("Model: \"sequential\"\n");
    PUT("%-28s %-22s %12s\n", "Layer (type)", "Output Shape", "Param #");
    PUT("%.64s\n", "================================================================");
    for (size_t l = 0; l < m->nlayers; l++) {
        char name[80], lname[40], shape[64], why[8];
        struct lgeom g;
        if (model_layer_geom(m, l, NULL, &g, why, sizeof why) != 0)
            break;
        model_layer_name(m, l, lname, sizeof lname);
        if (m->spec[l].kind == LK_DENSE || m->spec[l].kind == LK_CONV2D)
            snprintf(name, sizeof name, "%s (%s, %s)", lname, lkind_name(m->spec[l].kind), act_name(m->act[l]));
        else
            snprintf(name, sizeof name, "%s (%s)", lname, lkind_name(m->spec[l].kind));
        lshape_format(&g.out, shape, sizeof shape);
        PUT("%-28s %-22s %12zu\n", name, shape, g.kernel + g.bias + g.stats);
        frozen += g.stats;
    }
    PUT("%.64s\n", "================================================================");
    PUT("Total params: %zu (%.2f KB)\n", model_nparams(m), model_nparams(m) * 4.0 / 1024);
    if (frozen) /* Keras splits the total when some are not trained */
        PUT("Trainable params: %zu (%.2f KB)\nNon-trainable params: %zu (%.2f KB)\n", model_nparams(m) - frozen,
            (model_nparams(m) - frozen) * 4.0 / 1024, frozen, frozen * 4.0 / 1024);
#undef PUT
    return off;
}

/* ---- compile ---- */

/* Were the model's variables lost with the system they lived on? They were
 * when it was compiled onto cores of an earlier epoch and trained (or given
 * a state) there, and no restored state waits to be pushed: a model only
 * compiled still holds its seed's values, which a compile reproduces. */
static int vars_lost(const tpu_model *m)
{
    const struct cli_coll *k = m->s->c->coll;
    return m->epoch && k && m->epoch != k->epoch && !m->pending_state && (m->step || m->iterations);
}

/* TensorFlow reading a variable whose device state is gone fails with
 * FailedPreconditionError (tensorflow/core/kernels/resource_variable_ops.cc:
 * "the following variables were found uninitialized"); so does this. */
static int vars_lost_error(const tpu_model *m, err *e)
{
    char names[200], lname[24];
    size_t off = 0;
    names[0] = '\0';
    size_t shown = 0, l = 0;
    for (; l < m->nlayers && shown < 3; l++) {
        if (m->spec[l].kind != LK_DENSE && m->spec[l].kind != LK_CONV2D)
            continue;
        model_layer_name(m, l, lname, sizeof lname);
        off += (size_t)snprintf(names + off, sizeof names - off, "%s%s/kernel, %s/bias", shown ? ", " : "", lname,
                                lname);
        shown++;
    }
    if (l < m->nlayers)
        snprintf(names + off, sizeof names - off, ", ...");
    return err_set(e, CODE_FAILED_PRECONDITION,
                   "the model's variables on the TPU were lost: the TPU system was initialized again "
                   "(epoch %llu -> %llu) after the model was trained on it to step %llu, so its variables (%s) "
                   "and optimizer slots were found uninitialized; restore them (tpu_model_load_checkpoint) or "
                   "start again from the seed at step 0 (tpu_model_compile)",
                   (unsigned long long)m->epoch, (unsigned long long)m->s->c->coll->epoch,
                   (unsigned long long)m->step, names);
}

tpu_status tpu_model_compile(tpu_model *m, const tpu_compile_options *o)
{
    tpu_compile_options co;
    err e;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    if (o)
        co = *o;
    else
        tpu_compile_options_init(&co);
    if (m->nlayers == 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "the model has no layers: add a Dense layer first");
    if ((unsigned)co.loss > TPU_LOSS_MEAN_SQUARED_ERROR)
        return cli_failf(TPU_INVALID_ARGUMENT, "loss %d is unknown", (int)co.loss);
    {
        struct lshape in;
        struct lgeom g;
        char why[200], os[64];
        if (model_layer_geom(m, m->nlayers - 1, &in, &g, why, sizeof why) != 0)
            return cli_failf(TPU_INVALID_ARGUMENT, "%s", why);
        if (m->spec[m->nlayers - 1].kind != LK_DENSE || g.out.rank != 1) {
            lshape_format(&g.out, os, sizeof os);
            return cli_failf(TPU_INVALID_ARGUMENT, "the last layer must be a Dense with a (units) output, not %s with "
                             "output %s: add Flatten (or GlobalAveragePooling2D) and a Dense",
                             lkind_name(m->spec[m->nlayers - 1].kind), os);
        }
    }
    if (co.loss != TPU_LOSS_MEAN_SQUARED_ERROR && m->units[m->nlayers - 1] < 2)
        return cli_failf(TPU_INVALID_ARGUMENT, "a cross-entropy loss needs at least 2 units in the last layer, not %zu",
                         m->units[m->nlayers - 1]);
    if ((unsigned)co.optimizer.kind > TPU_OPT_ADAM)
        return cli_failf(TPU_INVALID_ARGUMENT, "optimizer %d is unknown (TPU_OPT_SGD, TPU_OPT_ADAM)",
                         (int)co.optimizer.kind);
    if (co.optimizer.schedule.kind != TPU_LR_CONSTANT) {
        char why[200];
        if (sched_check(&co.optimizer.schedule, why, sizeof why) != 0)
            return cli_failf(TPU_INVALID_ARGUMENT, "%s", why);
    } else if (!(co.optimizer.learning_rate > 0) || !isfinite(co.optimizer.learning_rate))
        return cli_failf(TPU_INVALID_ARGUMENT, "learning_rate %g must be a positive number (tpu_optimizer_adam(0) "
                         "gives Keras' default)", (double)co.optimizer.learning_rate);
    if (co.optimizer.kind == TPU_OPT_ADAM &&
        (!(co.optimizer.beta_1 >= 0 && co.optimizer.beta_1 < 1) || !(co.optimizer.beta_2 >= 0 && co.optimizer.beta_2 < 1) ||
         !(co.optimizer.epsilon > 0)))
        return cli_failf(TPU_INVALID_ARGUMENT, "Adam needs 0 <= beta_1, beta_2 < 1 and epsilon > 0 (got %g, %g, %g); "
                         "tpu_optimizer_adam() sets Keras' defaults", (double)co.optimizer.beta_1,
                         (double)co.optimizer.beta_2, (double)co.optimizer.epsilon);
    if (co.optimizer.kind == TPU_OPT_SGD && !(co.optimizer.momentum >= 0 && co.optimizer.momentum < 1))
        return cli_failf(TPU_INVALID_ARGUMENT, "SGD momentum %g is outside [0, 1)", (double)co.optimizer.momentum);
    if (co.steps_per_execution == 0)
        co.steps_per_execution = 1;
    if (co.steps_per_execution > TIO_MAX_STEPS)
        return cli_failf(TPU_INVALID_ARGUMENT, "steps_per_execution %u is more than %d", co.steps_per_execution,
                         TIO_MAX_STEPS);
    if (co.infeed_depth == 0)
        co.infeed_depth = 2;
    if (co.infeed_depth > 16)
        return cli_failf(TPU_INVALID_ARGUMENT, "infeed_depth %u is outside 1..16", co.infeed_depth);
    if ((unsigned)co.policy > TPU_POLICY_MIXED_BFLOAT16)
        return cli_failf(TPU_INVALID_ARGUMENT, "policy %d is unknown", (int)co.policy);
    if (m->configured && (co.optimizer.kind != m->co.optimizer.kind ||
                          (co.optimizer.momentum > 0) != (m->co.optimizer.momentum > 0)))
        m->epoch = 0; /* other optimizer slots: the cores start over from the seed */
    if (vars_lost(m)) { /* asked for: the variables start over from the seed, and so does the count */
        m->epoch = 0;
        m->step = 0;
        m->cur_epoch = 0;
        m->cur_batch = 0;
        m->iterations = 0;
    }
    m->co = co;
    m->configured = 1;
    if (co.batch_size || m->batch_per_core) {
        size_t n = m->s->c->coll ? m->s->c->coll->n : 1;
        size_t gb = co.batch_size ? co.batch_size : m->batch_per_core * n;
        m->batch_per_core = 0; /* compile again: the options may have changed */
        if (model_ensure_compiled(m, gb, &e) != CODE_OK)
            return cli_fail(&e);
    }
    return TPU_OK;
}

/* One request to every replica (or only to `only` when >= 0), waited for.
 * ans[r].dst must be set by the caller where a payload comes back. */
static int request_all(tpu_model *m, struct tio_req *q, const struct dpio_seg *segs, size_t nseg, int only,
                       struct tio_ans *ans, size_t bytes, const char *what, err *e)
{
    tpu_cluster *c = m->s->c;
    struct cli_coll *k = c->coll;
    size_t n = k->n;
    struct tio_ans **pa = calloc(n, sizeof *pa);
    int rc = CODE_OK;

    if (!pa)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    q->seq = k->next_seq++;
    for (size_t r = 0; r < n; r++) {
        pa[r] = &ans[r];
        if (only >= 0 && (size_t)only != r) {
            ans[r].done = 1;
            ans[r].code = CODE_OK;
            continue;
        }
        if ((rc = tio_post_req(c, r, q, segs, nseg, &ans[r], e)) != CODE_OK) {
            tio_abort(c);
            free(pa);
            err_prefix(e, "%s", what);
            return rc;
        }
    }
    size_t failed = tio_wait(c, pa, model_deadline(c, bytes), cli_coll_grace_ms(c));
    if (failed) {
        const struct tio_ans *w = tio_worst(pa, n);
        int lost = 0;
        for (size_t r = 0; r < n; r++)
            lost |= ans[r].code == CODE_UNAVAILABLE || ans[r].code == CODE_DEADLINE_EXCEEDED ||
                    ans[r].code == CODE_CANCELLED || !ans[r].done;
        if (w && !strncmp(w->msg, "XLA:", 4)) /* XLA's report (it says what it was doing) leads, as on a TPU */
            rc = err_set(e, w->code, "%s", w->msg);
        else
            rc = err_set(e, w ? w->code : CODE_UNKNOWN, "%s: %s", what, w ? w->msg : "failed");
        if (lost)
            tio_abort(c);
    }
    free(pa);
    return rc;
}

static int push_state(tpu_model *m, const float *state, size_t nfloats, uint32_t nslots, uint64_t iterations, err *e)
{
    size_t n = m->s->c->coll->n, np = model_nparams(m);
    struct tio_ans *ans = calloc(n, sizeof *ans);
    struct tio_req q = {TIO_STATE_SET, 0, NULL, m->id, np, iterations, nslots};
    struct dpio_seg seg = {state, nfloats * sizeof(float)};
    int rc;
    if (!ans)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    if (nfloats != np * (1 + nslots)) {
        free(ans);
        return err_set(e, CODE_INTERNAL, "state of %zu floats for %zu parameters and %u slots", nfloats, np, nslots);
    }
    rc = request_all(m, &q, &seg, 1, -1, ans, seg.n, "loading the model's state", e);
    free(ans);
    if (rc == CODE_OK)
        m->iterations = iterations;
    return rc;
}

int model_ensure_compiled(tpu_model *m, size_t global_batch, err *e)
{
    tpu_cluster *c = m->s->c;
    struct cli_coll *k = c->coll;
    size_t n, per;
    int rc;

    if (!m->configured)
        return err_set(e, CODE_FAILED_PRECONDITION, "the model is not compiled: call tpu_model_compile first");
    if (!k || k->n == 0)
        return err_set(e, CODE_FAILED_PRECONDITION, "no TPU system: initialize it first");
    if (vars_lost(m))
        return vars_lost_error(m, e);
    n = k->n;
    per = (global_batch + n - 1) / n;
    if (per == 0)
        per = 1;
    if (m->epoch == k->epoch && m->n == n && m->batch_per_core >= per)
        return CODE_OK;

    struct tio_layer ls[MODEL_LAYERS_MAX];
    struct tio_model ms;
    struct tio_req q = {TIO_COMPILE, 0, &ms, 0, 0, 0, 0};
    memset(ls, 0, sizeof ls);
    for (size_t l = 0; l < m->nlayers; l++) {
        ls[l].units = (uint32_t)m->units[l];
        ls[l].activation = (uint32_t)m->act[l];
        ls[l].kind = (uint32_t)m->spec[l].kind;
        ls[l].kernel_h = (uint32_t)m->spec[l].kh;
        ls[l].kernel_w = (uint32_t)m->spec[l].kw;
        ls[l].stride_h = (uint32_t)m->spec[l].sh;
        ls[l].stride_w = (uint32_t)m->spec[l].sw;
        ls[l].padding_same = m->spec[l].same != 0;
        ls[l].rate = m->spec[l].rate;
        ls[l].input_dim = (uint32_t)m->spec[l].vocab;
        ls[l].positions = m->spec[l].positions != 0;
        ls[l].num_heads = (uint32_t)m->spec[l].heads;
        ls[l].key_dim = (uint32_t)m->spec[l].key_dim;
        ls[l].value_dim = (uint32_t)m->spec[l].value_dim;
        ls[l].add_from = (uint32_t)m->spec[l].from;
        ls[l].epsilon = m->spec[l].epsilon;
        ls[l].momentum = m->spec[l].momentum;
        ls[l].synchronized = m->spec[l].synchronized != 0;
        ls[l].target_rank = (size_t)m->spec[l].target.rank;
        for (int i = 0; i < m->spec[l].target.rank && i < TIO_MAX_RANK; i++)
            ls[l].target_shape[i] = (uint32_t)m->spec[l].target.d[i];
    }
    memset(&ms, 0, sizeof ms);
    ms.input_rank = (size_t)m->in_shape.rank;
    for (int i = 0; i < m->in_shape.rank && i < TIO_MAX_RANK; i++)
        ms.input_shape[i] = (uint32_t)m->in_shape.d[i];
    ms.model_id = m->id;
    ms.input_dim = (uint32_t)m->in_dim;
    ms.nlayers = m->nlayers;
    ms.layers = ls;
    ms.loss = m->co.loss;
    ms.optimizer = &m->co.optimizer;
    ms.mixed_bfloat16 = m->co.policy == TPU_POLICY_MIXED_BFLOAT16;
    ms.seed = m->seed;
    ms.batch_per_core = (uint32_t)per;
    ms.infeed_depth = m->co.infeed_depth;
    ms.steps_per_execution = m->co.steps_per_execution;
    ms.deterministic = m->co.deterministic != 0;
    ms.gradient_checkpointing = m->remat != 0;
    ms.from_logits = m->co.from_logits != 0;
    ms.label_dim = m->co.loss == TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ? 1 : (uint32_t)m->units[m->nlayers - 1];

    struct tio_ans *ans = calloc(n, sizeof *ans);
    if (!ans)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    int fresh = m->epoch != k->epoch;
    rc = request_all(m, &q, NULL, 0, -1, ans, 0, "compiling the model", e);
    if (rc == CODE_OK) {
        m->hbm_used = m->hbm_capacity = 0;
        for (size_t r = 0; r < n; r++) {
            if (ans[r].hbm_used > m->hbm_used)
                m->hbm_used = ans[r].hbm_used;
            if (!m->hbm_capacity || ans[r].hbm_capacity < m->hbm_capacity)
                m->hbm_capacity = ans[r].hbm_capacity;
        }
        m->epoch = k->epoch;
        m->n = n;
        m->batch_per_core = per;
        if (fresh)
            m->iterations = 0;
    } else {
        m->epoch = 0;
    }
    free(ans);
    if (rc == CODE_OK && m->pending_state) {
        rc = push_state(m, m->pending_state, m->pending_floats, m->pending_slots, m->pending_iterations, e);
        if (rc == CODE_OK) {
            free(m->pending_state);
            m->pending_state = NULL;
        }
    }
    return rc;
}

/* ---- state ---- */

/* Weights and slots of one replica into buf (np * (1 + slots) floats). */
static int pull_state(tpu_model *m, int replica, float *buf, size_t nfloats, uint64_t *iterations, err *e)
{
    size_t n = m->s->c->coll->n;
    struct tio_ans *ans = calloc(n, sizeof *ans);
    struct tio_req q = {TIO_STATE_GET, 0, NULL, m->id, 0, 0, 0};
    int rc;
    if (!ans)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    ans[replica].dst = buf;
    ans[replica].dst_cap = nfloats * sizeof(float);
    rc = request_all(m, &q, NULL, 0, replica, ans, nfloats * sizeof(float), "reading the model's state", e);
    if (rc == CODE_OK && (ans[replica].num_params != model_nparams(m) ||
                          ans[replica].num_slots != (uint32_t)model_nslots(m)))
        rc = err_set(e, CODE_INTERNAL, "replica %d holds a model of %llu parameters and %u optimizer slots; this one "
                     "has %zu and %d", replica, (unsigned long long)ans[replica].num_params, ans[replica].num_slots,
                     model_nparams(m), model_nslots(m));
    else if (rc == CODE_OK && ans[replica].got != nfloats * sizeof(float))
        rc = err_set(e, CODE_INTERNAL, "replica %d returned %zu bytes of state, %zu expected", replica,
                     ans[replica].got, nfloats * sizeof(float));
    if (rc == CODE_OK && iterations)
        *iterations = ans[replica].iterations;
    free(ans);
    return rc;
}

static int need_compiled(tpu_model *m, err *e)
{
    if (vars_lost(m))
        return vars_lost_error(m, e);
    if (!m->configured || !m->s->c->coll || m->epoch != m->s->c->coll->epoch)
        return err_set(e, CODE_FAILED_PRECONDITION,
                       "the model is not compiled on the current TPU system%s: compile it (with a batch size) or fit first",
                       m->epoch ? " (it was re-initialized)" : "");
    return CODE_OK;
}

tpu_status tpu_model_get_weights(tpu_model *m, int replica, float *out, size_t n)
{
    err e;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    if (need_compiled(m, &e) != CODE_OK)
        return cli_fail(&e);
    size_t np = model_nparams(m), ns = (size_t)model_nslots(m);
    if (replica < 0 || (size_t)replica >= m->s->c->coll->n)
        return cli_failf(TPU_OUT_OF_RANGE, "replica %d is not one of 0..%zu", replica, m->s->c->coll->n - 1);
    if (n < np)
        return cli_failf(TPU_INVALID_ARGUMENT, "room for %zu floats; the model has %zu parameters", n, np);
    float *buf = malloc(np * (1 + ns) * sizeof(float));
    if (!buf)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    if (pull_state(m, replica, buf, np * (1 + ns), NULL, &e) != CODE_OK) {
        free(buf);
        return cli_fail(&e);
    }
    memcpy(out, buf, np * sizeof(float));
    free(buf);
    return TPU_OK;
}

/* The largest position a checkpoint may hold: more epochs than a fit can run
 * (fit.c's HISTORY_MAX) or more steps than 2^40 is not a file this library
 * wrote. */
#define CKPT_MAX_EPOCH 100000u
#define CKPT_MAX_STEP (UINT64_C(1) << 40)

/* The key a checkpoint is sealed with: derived from the cluster token when
 * the client has one (NULL without: the file gets the unkeyed checksum). */
static const unsigned char *ckpt_key(const tpu_model *m, unsigned char key[CKPT_KEY_BYTES])
{
    const auth *a = &m->s->c->r->auth;
    if (!a->enabled)
        return NULL;
    auth_subkey(a, "tpuemu checkpoint seal v1", key);
    return key;
}

struct ckpt_pos {
    uint64_t step, epoch, batch, iterations, seed, num_params, num_slots, model_id;
};

tpu_status tpu_model_save_checkpoint(tpu_model *m, const char *path)
{
    err e;
    char desc[512];
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    if (!path || !*path)
        return cli_failf(TPU_INVALID_ARGUMENT, "no checkpoint path");
    if (need_compiled(m, &e) != CODE_OK)
        return cli_fail(&e);
    size_t np = model_nparams(m), ns = (size_t)model_nslots(m);
    float *buf = malloc(np * (1 + ns) * sizeof(float));
    uint64_t it = 0;
    if (!buf)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    if (pull_state(m, 0, buf, np * (1 + ns), &it, &e) != CODE_OK) {
        free(buf);
        return cli_fail(&e);
    }
    /* From a callback inside fit, the next executions of this epoch (up to
     * infeed_depth - 1) are already queued on the cores ahead of the state
     * read, so the state is that many steps past the client's position:
     * record the position the state is at, or a resume repeats those steps. */
    uint64_t ahead = it > m->iterations ? it - m->iterations : 0;
    struct ckpt_pos pos = {m->step + ahead, (uint64_t)m->cur_epoch, m->cur_batch + ahead, it, m->seed, np, ns, m->id};
    describe(m, desc, sizeof desc);
    struct ckpt_section sec[4] = {
        {"format", CKPT_FORMAT, sizeof CKPT_FORMAT - 1},
        {"model", desc, strlen(desc)},
        {"position", &pos, sizeof pos},
        {"state", buf, np * (1 + ns) * sizeof(float)},
    };
    unsigned char key[CKPT_KEY_BYTES];
    int rc = ckpt_write_sealed(path, sec, 4, ckpt_key(m, key), &e);
    sodium_memzero(key, sizeof key);
    free(buf);
    return rc == CODE_OK ? TPU_OK : cli_fail(&e);
}

static int check_position(const tpu_model *m, const char *path, const struct ckpt_pos *p, err *e)
{
    (void)m;
    const char *field = NULL;
    uint64_t v = 0, max = 0;
    if (p->epoch > CKPT_MAX_EPOCH)
        field = "epoch", v = p->epoch, max = CKPT_MAX_EPOCH;
    else if (p->step > CKPT_MAX_STEP)
        field = "step", v = p->step, max = CKPT_MAX_STEP;
    else if (p->iterations > CKPT_MAX_STEP)
        field = "iterations", v = p->iterations, max = CKPT_MAX_STEP;
    else if (p->batch > CKPT_MAX_STEP)
        field = "batch", v = p->batch, max = CKPT_MAX_STEP;
    if (field)
        return err_set(e, CODE_DATA_LOSS, "%s: its position's %s is %llu, out of range (0..%llu): not a checkpoint "
                       "this library wrote", path, field, (unsigned long long)v, (unsigned long long)max);
    return CODE_OK;
}

/* The name of the variable (or optimizer slot) holding float i of a state:
 * the parameters layer by layer (kernel, then bias), then each slot. */
static void state_name(const tpu_model *m, size_t i, char *buf, size_t n)
{
    static const char *const adam[] = {"m", "v"};
    size_t np = model_nparams(m), slot = i / np, k = i % np, l = 0;
    char lname[40], why[8];
    struct lgeom g = {0};
    for (; l < m->nlayers; l++) {
        if (model_layer_geom(m, l, NULL, &g, why, sizeof why) != 0)
            break;
        if (k < g.kernel + g.bias + g.stats)
            break;
        k -= g.kernel + g.bias + g.stats;
    }
    if (l >= m->nlayers)
        l = m->nlayers - 1;
    model_layer_name(m, l, lname, sizeof lname);
    const char *var = k < g.kernel ? "kernel" : k < g.kernel + g.bias ? "bias" : "moving_statistics";
    if (m->spec[l].kind == LK_LAYER_NORM || m->spec[l].kind == LK_BATCH_NORM)
        var = k < g.kernel                       ? "gamma"
              : k < g.kernel + g.bias            ? "beta"
              : k < g.kernel + g.bias + g.kernel ? "moving_mean"
                                                 : "moving_variance";
    if (slot == 0)
        snprintf(buf, n, "%s/%s", lname, var);
    else if (m->co.optimizer.kind == TPU_OPT_ADAM)
        snprintf(buf, n, "the optimizer's %s/%s/%s", adam[(slot - 1) & 1], lname, var);
    else
        snprintf(buf, n, "the optimizer's momentum/%s/%s", lname, var);
}

static int check_state(const tpu_model *m, const char *path, const float *st, err *e)
{
    size_t n = model_nparams(m) * (1 + (size_t)model_nslots(m));
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, st + i, sizeof v);
        if (!isfinite(v)) {
            char name[96];
            state_name(m, i, name, sizeof name);
            return err_set(e, CODE_DATA_LOSS, "%s: %s holds %s (value %zu of the state): refusing to load a "
                           "non-finite weight", path, name, isnan(v) ? "NaN" : "an infinity", i);
        }
    }
    return CODE_OK;
}

/* Reads a checkpoint file of this model into a snapshot. */
int model_snap_read(tpu_model *m, const char *path, struct model_snap *out, err *e)
{
    ckpt *ck = NULL;
    uint64_t nb;
    char desc[512];
    int rc;

    memset(out, 0, sizeof *out);
    unsigned char key[CKPT_KEY_BYTES];
    const unsigned char *k = ckpt_key(m, key);
    const char *allow = getenv("TPUEMU_CHECKPOINT_ALLOW_UNKEYED");
    int keyed = 0;
    rc = ckpt_read_sealed(path, k, allow && strcmp(allow, "1") == 0, &ck, &keyed, e);
    sodium_memzero(key, sizeof key);
    if (rc != CODE_OK)
        return rc;
    if (k && !keyed)
        cli_warn("checkpoint %s: loading it although it is sealed with an unkeyed checksum only "
                 "(TPUEMU_CHECKPOINT_ALLOW_UNKEYED=1): nothing proves who wrote it",
                 path);
    const char *fmt = ckpt_get(ck, "format", &nb);
    if (!fmt || nb != sizeof CKPT_FORMAT - 1 || memcmp(fmt, CKPT_FORMAT, nb) != 0) {
        ckpt_free(ck);
        return err_set(e, CODE_DATA_LOSS, "%s: not a tpuemu model checkpoint (no 'format' section of version 1)", path);
    }
    const char *md = ckpt_get(ck, "model", &nb);
    describe(m, desc, sizeof desc);
    if (!md || nb != strlen(desc) || memcmp(md, desc, nb) != 0) {
        char theirs[512];
        snprintf(theirs, sizeof theirs, "%.*s", md ? (int)(nb < 500 ? nb : 500) : 0, md ? md : "");
        ckpt_free(ck);
        return err_set(e, CODE_INVALID_ARGUMENT, "%s holds another model (%s); this one is %s", path, theirs, desc);
    }
    const struct ckpt_pos *pp = ckpt_get(ck, "position", &nb);
    size_t np = model_nparams(m), ns = (size_t)model_nslots(m);
    const float *st = NULL;
    uint64_t sb = 0;
    if (pp && nb == sizeof *pp)
        st = ckpt_get(ck, "state", &sb);
    if (!pp || nb != sizeof *pp || !st || sb != np * (1 + ns) * sizeof(float) || pp->num_params != np ||
        pp->num_slots != ns) {
        ckpt_free(ck);
        return err_set(e, CODE_DATA_LOSS, "%s: its position or state section does not match its model (%s)", path,
                       desc);
    }
    /* An unkeyed checksum only proves the file is as its writer left it,
     * and even a keyed seal does not prove the writer was this library: every field is range-checked and every
     * weight and optimizer value must be finite before anything is used. */
    if ((rc = check_position(m, path, pp, e)) != CODE_OK || (rc = check_state(m, path, st, e)) != CODE_OK) {
        ckpt_free(ck);
        return rc;
    }
    if (!(out->state = malloc(sb))) {
        ckpt_free(ck);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    memcpy(out->state, st, sb);
    out->floats = np * (1 + ns);
    out->slots = (uint32_t)ns;
    out->step = pp->step;
    out->epoch = (int)pp->epoch;
    out->batch = (size_t)pp->batch;
    out->iterations = pp->iterations;
    ckpt_free(ck);
    return CODE_OK;
}

/* Replica 0's state now, at the position it is at. */
int model_snap_take(tpu_model *m, struct model_snap *out, err *e)
{
    int rc;
    size_t np = model_nparams(m), ns = (size_t)model_nslots(m);
    memset(out, 0, sizeof *out);
    if ((rc = need_compiled(m, e)) != CODE_OK)
        return rc;
    if (!(out->state = malloc(np * (1 + ns) * sizeof(float))))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    uint64_t it = 0;
    if ((rc = pull_state(m, 0, out->state, np * (1 + ns), &it, e)) != CODE_OK) {
        model_snap_free(out);
        return rc;
    }
    uint64_t ahead = it > m->iterations ? it - m->iterations : 0; /* as in tpu_model_save_checkpoint */
    out->floats = np * (1 + ns);
    out->slots = (uint32_t)ns;
    out->step = m->step + ahead;
    out->epoch = m->cur_epoch;
    out->batch = m->cur_batch + ahead;
    out->iterations = it;
    return CODE_OK;
}

/* The model goes on from s: its state is pushed to the cores now when the
 * model is compiled on the current system, else at the next compile. */
int model_snap_apply(tpu_model *m, const struct model_snap *s, err *e)
{
    int rc = CODE_OK;
    if (m->s->c->coll && m->epoch == m->s->c->coll->epoch) {
        rc = push_state(m, s->state, s->floats, s->slots, s->iterations, e);
    } else {
        free(m->pending_state);
        if (!(m->pending_state = malloc(s->floats * sizeof(float))))
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(m->pending_state, s->state, s->floats * sizeof(float));
        m->pending_floats = s->floats;
        m->pending_slots = s->slots;
        m->pending_iterations = s->iterations;
    }
    if (rc != CODE_OK)
        return rc;
    m->step = s->step;
    m->cur_epoch = s->epoch;
    m->cur_batch = s->batch;
    m->iterations = s->iterations;
    return CODE_OK;
}

void model_snap_free(struct model_snap *s)
{
    free(s->state);
    s->state = NULL;
}

tpu_status tpu_model_load_checkpoint(tpu_model *m, const char *path)
{
    struct model_snap sn;
    err e;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    if (!m->configured)
        return cli_failf(TPU_FAILED_PRECONDITION, "compile the model (tpu_model_compile) before loading a checkpoint");
    if (!path || !*path)
        return cli_failf(TPU_INVALID_ARGUMENT, "no checkpoint path");
    if (model_snap_read(m, path, &sn, &e) != CODE_OK)
        return cli_fail(&e);
    int rc = model_snap_apply(m, &sn, &e);
    model_snap_free(&sn);
    return rc == CODE_OK ? TPU_OK : cli_fail(&e);
}
