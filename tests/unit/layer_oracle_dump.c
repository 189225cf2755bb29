/* Runs the core's forward pass over small models, one per layer case, and
 * writes each case's layers, input, weights and outputs as JSON lines on
 * stdout, for layer_oracle.py to recompute independently with numpy. Every
 * case ends in Flatten (where needed) and a linear Dense, the model's
 * required last layer, so the output is a linear map of the layer's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

struct lcase {
    const char *name;
    int h, w, c;
    int n;                   /* layers before the final Dense */
    struct lspec l[6];
    int units[6];
    enum model_act act[6];
    struct lshape in; /* rank 0: (h, w, c) */
};

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void arr(const char *key, const float *v, size_t n)
{
    printf(", \"%s\": [", key);
    for (size_t i = 0; i < n; i++)
        printf("%s%.9g", i ? ", " : "", (double)v[i]);
    printf("]");
}

/* The cross-entropies from logits: one Dense(5, linear) whose kernel is
 * scaled so that the logits reach beyond +-88 (exp overflows float32 beyond
 * 88 without the max shift), its logits, labels and the core's summed loss
 * as {"loss": ...} lines. */
static int loss_cases(mxu *u)
{
    for (int k = 0; k < 2; k++) {
        enum {
            ROWS = 4,
            IN = 3,
            N = 5
        };
        struct model_cfg cfg;
        model *m;
        err e;
        unsigned s = 77u + (unsigned)k;
        float x[ROWS * IN], z[ROWS * N], yf[ROWS * N];
        int32_t ids[ROWS];
        struct model_metrics mt;
        memset(&cfg, 0, sizeof cfg);
        cfg.in_dim = IN;
        cfg.nlayers = 1;
        cfg.units[0] = N;
        cfg.loss = k == 0 ? LOSS_SPARSE_CCE : LOSS_CCE;
        cfg.from_logits = 1;
        cfg.opt = (struct model_opt_cfg){OPT_SGD, 0.01f, 0, 0, 0, 0, 0, {0}};
        cfg.precision = MODEL_FLOAT32;
        cfg.seed = 9;
        cfg.max_rows = ROWS;
        cfg.deterministic = 1;
        if (model_new(&m, &cfg, u, &e) != CODE_OK) {
            fprintf(stderr, "layer_oracle_dump: loss case %d: %s\n", k, e.msg);
            return 1;
        }
        for (size_t i = 0; i < model_num_params(m); i++)
            model_params(m)[i] = 100.0f * frand(&s);
        for (int i = 0; i < ROWS * IN; i++)
            x[i] = frand(&s);
        for (int r = 0; r < ROWS; r++) {
            float sum = 0.0f;
            ids[r] = (int32_t)((r * 3 + k) % N);
            for (int j = 0; j < N; j++)
                sum += yf[r * N + j] = 1.1f + frand(&s);
            for (int j = 0; j < N; j++)
                yf[r * N + j] /= sum;
        }
        if (model_forward(m, x, ROWS, z, &e) != CODE_OK ||
            model_metrics_of(m, k == 0 ? (const void *)ids : (const void *)yf, ROWS, &mt, &e) != CODE_OK) {
            fprintf(stderr, "layer_oracle_dump: loss case %d: %s\n", k, e.msg);
            return 1;
        }
        printf("{\"loss\": \"%s\", \"n\": %d", model_loss_name(cfg.loss), N);
        arr("logits", z, ROWS * N);
        if (k == 0) {
            printf(", \"labels\": [");
            for (int r = 0; r < ROWS; r++)
                printf("%s%d", r ? ", " : "", (int)ids[r]);
            printf("]");
        } else {
            arr("labels", yf, ROWS * N);
        }
        printf(", \"loss_sum\": %.17g}\n", mt.loss_sum);
        model_free(m);
    }
    return 0;
}

static size_t stats_at(const model *m, int l)
{
    size_t off = 0;
    model_stats_count(m, l, &off);
    return off;
}

int main(void)
{
    static const struct lcase cases[] = {
        {"conv2d_same_relu",
         5,
         5,
         3,
         2,
         {{.kind = LK_CONV2D, .kh = 3, .kw = 3, .same = 1}, {.kind = LK_FLATTEN}},
         {4, 0},
         {ACT_RELU, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"conv2d_valid_strided_tanh",
         7,
         6,
         2,
         2,
         {{.kind = LK_CONV2D, .kh = 3, .kw = 2, .sh = 2, .sw = 2}, {.kind = LK_FLATTEN}},
         {3, 0},
         {ACT_TANH, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"conv2d_same_stride2_even",
         6,
         6,
         2,
         2,
         {{.kind = LK_CONV2D, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .same = 1}, {.kind = LK_FLATTEN}},
         {2, 0},
         {ACT_SIGMOID, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"max_pooling2d_valid",
         6,
         5,
         2,
         2,
         {{.kind = LK_MAX_POOL2D, .kh = 2, .kw = 2}, {.kind = LK_FLATTEN}},
         {0, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"max_pooling2d_same_overlapping",
         7,
         7,
         2,
         2,
         {{.kind = LK_MAX_POOL2D, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .same = 1}, {.kind = LK_FLATTEN}},
         {0, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"average_pooling2d_same_edges",
         5,
         5,
         3,
         2,
         {{.kind = LK_AVG_POOL2D, .kh = 2, .kw = 2, .same = 1}, {.kind = LK_FLATTEN}},
         {0, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"global_average_pooling2d", 4, 3, 5, 1, {{.kind = LK_GLOBAL_AVG_POOL2D}}, {0}, {ACT_LINEAR}, {0, {0, 0, 0}}},
        {"reshape_dense_last_axis",
         4,
         3,
         2,
         3,
         {{.kind = LK_RESHAPE, .target = {2, {6, 4, 0}}}, {.kind = LK_DENSE}, {.kind = LK_FLATTEN}},
         {0, 5, 0},
         {ACT_LINEAR, ACT_TANH, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"dropout_at_inference",
         3,
         3,
         2,
         2,
         {{.kind = LK_DROPOUT, .rate = 0.5f}, {.kind = LK_FLATTEN}},
         {0, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"dense_gelu_softplus_swish",
         3,
         2,
         2,
         4,
         {{.kind = LK_FLATTEN}, {.kind = LK_DENSE}, {.kind = LK_DENSE}, {.kind = LK_DENSE}},
         {0, 6, 5, 4},
         {ACT_LINEAR, ACT_GELU, ACT_SOFTPLUS, ACT_SWISH},
         {0, {0, 0, 0}}},
        {"embedding",
         0,
         0,
         0,
         2,
         {{.kind = LK_EMBEDDING, .vocab = 11}, {.kind = LK_FLATTEN}},
         {4, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {1, {5, 0, 0}}},
        {"embedding_with_positions_global_average_pooling1d",
         0,
         0,
         0,
         2,
         {{.kind = LK_EMBEDDING, .vocab = 6, .positions = 1}, {.kind = LK_GLOBAL_AVG_POOL1D}},
         {3, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {1, {7, 0, 0}}},
        {"multi_head_attention",
         0,
         0,
         0,
         2,
         {{.kind = LK_MULTI_HEAD_ATTENTION, .heads = 3, .key_dim = 2, .value_dim = 4}, {.kind = LK_FLATTEN}},
         {0, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {2, {6, 5, 0}}},
        {"attention_with_residuals",
         0,
         0,
         0,
         6,
         {{.kind = LK_MULTI_HEAD_ATTENTION, .heads = 2, .key_dim = 4},
          {.kind = LK_ADD, .from = 0},
          {.kind = LK_DENSE},
          {.kind = LK_DENSE},
          {.kind = LK_ADD, .from = 2},
          {.kind = LK_GLOBAL_AVG_POOL1D}},
         {0, 0, 8, 4, 0, 0},
         {ACT_LINEAR, ACT_LINEAR, ACT_RELU, ACT_LINEAR, ACT_LINEAR, ACT_LINEAR},
         {2, {5, 4, 0}}},
        {"layer_normalization_channels_and_features",
         3,
         3,
         4,
         4,
         {{.kind = LK_LAYER_NORM, .epsilon = 1e-3f},
          {.kind = LK_FLATTEN},
          {.kind = LK_DENSE},
          {.kind = LK_LAYER_NORM, .epsilon = 0.5f}},
         {0, 0, 5, 0},
         {ACT_LINEAR, ACT_LINEAR, ACT_RELU, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"batch_normalization_inference_moving_statistics",
         3,
         3,
         4,
         2,
         {{.kind = LK_BATCH_NORM, .epsilon = 1e-3f, .momentum = 0.99f}, {.kind = LK_FLATTEN}},
         {0, 0},
         {ACT_LINEAR, ACT_LINEAR},
         {0, {0, 0, 0}}},
        {"batch_normalization_training_batch_statistics",
         3,
         3,
         4,
         4,
         {{.kind = LK_BATCH_NORM, .epsilon = 1e-3f, .momentum = 0.99f},
          {.kind = LK_FLATTEN},
          {.kind = LK_DENSE},
          {.kind = LK_BATCH_NORM, .epsilon = 1e-2f, .momentum = 0.9f}},
         {0, 0, 4, 0},
         {ACT_LINEAR, ACT_LINEAR, ACT_TANH, ACT_LINEAR},
         {0, {0, 0, 0}}},
    };
    mxu *u;
    err e;
    if (mxu_new(&u, 128, &e) != CODE_OK) {
        fprintf(stderr, "layer_oracle_dump: %s\n", e.msg);
        return 1;
    }
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const struct lcase *lc = &cases[k];
        struct model_cfg cfg;
        model *m;
        unsigned s = 1000u + (unsigned)k;
        const int rows = 3;
        memset(&cfg, 0, sizeof cfg);
        cfg.in_shape = lc->in.rank ? lc->in : (struct lshape){3, {lc->h, lc->w, lc->c}};
        cfg.in_dim = (int)lshape_size(&cfg.in_shape);
        for (int l = 0; l < lc->n; l++) {
            cfg.kind[l] = lc->l[l];
            cfg.units[l] = lc->units[l];
            cfg.act[l] = lc->act[l];
        }
        cfg.units[lc->n] = 3;
        cfg.act[lc->n] = ACT_LINEAR;
        cfg.nlayers = lc->n + 1;
        cfg.loss = LOSS_MSE;
        cfg.opt = (struct model_opt_cfg){OPT_SGD, 0.01f, 0, 0, 0, 0, 0, {0}};
        cfg.precision = MODEL_FLOAT32;
        cfg.seed = 5;
        cfg.max_rows = rows;
        cfg.deterministic = 1;
        if (model_new(&m, &cfg, u, &e) != CODE_OK) {
            fprintf(stderr, "layer_oracle_dump: case %s: %s\n", lc->name, e.msg);
            return 1;
        }
        size_t nx = (size_t)rows * (size_t)cfg.in_dim, np = model_num_params(m);
        float *x = malloc(nx * sizeof *x), out[3 * 3];
        for (size_t i = 0; i < nx; i++) /* token ids for an Embedding */
            x[i] = lc->l[0].kind == LK_EMBEDDING ? (float)(i * 7 % (size_t)lc->l[0].vocab) : frand(&s);
        for (size_t i = 0; i < np; i++)   /* biases too, so the oracle sees them */
            model_params(m)[i] += 0.05f * frand(&s);
        for (int l = 0; l < cfg.nlayers; l++) { /* moving statistics far from their initial 0 and 1 */
            size_t off, ns = model_stats_count(m, l, &off);
            for (size_t i = 0; i < ns; i++)
                model_params(m)[off + i] = i < ns / 2 ? 0.5f * frand(&s) : 0.3f + 0.5f * (1.0f + frand(&s));
        }
        for (size_t i = 0; i < nx && lc->l[0].kind != LK_EMBEDDING; i++) /* off 0: the normalizations' shift shows */
            x[i] = 0.7f + 2.0f * x[i];
        /* a case named "..._training_..." runs fit's forward pass (batch statistics) */
        int training = strstr(lc->name, "_training_") != NULL;
        model_set_training(m, training);
        if (model_forward(m, x, rows, out, &e) != CODE_OK) {
            fprintf(stderr, "layer_oracle_dump: case %s: %s\n", lc->name, e.msg);
            return 1;
        }
        printf("{\"name\": \"%s\", \"rows\": %d, \"training\": %d, \"input_shape\": [", lc->name, rows, training);
        for (int i = 0; i < cfg.in_shape.rank; i++)
            printf("%s%d", i ? ", " : "", cfg.in_shape.d[i]);
        printf("], \"layers\": [");
        for (int l = 0; l < cfg.nlayers; l++) {
            const struct lspec *sp = &cfg.kind[l];
            printf("%s{\"kind\": %d, \"units\": %d, \"act\": \"%s\", \"k\": [%d, %d], \"s\": [%d, %d], "
                   "\"same\": %d, \"rate\": %g, \"target\": [%d, %d, %d], \"target_rank\": %d, \"w\": %zu, "
                   "\"b\": %zu, \"vocab\": %d, \"positions\": %d, \"heads\": %d, \"key_dim\": %d, "
                   "\"value_dim\": %d, \"from\": %d, \"epsilon\": %.9g, \"stats\": %zu}",
                   l ? ", " : "", (int)sp->kind, cfg.units[l], model_act_name(cfg.act[l]), sp->kh, sp->kw, sp->sh,
                   sp->sw, sp->same, (double)sp->rate, sp->target.d[0], sp->target.d[1], sp->target.d[2],
                   sp->target.rank, model_kernel_offset(m, l), model_bias_offset(m, l), sp->vocab, sp->positions,
                   sp->heads, sp->key_dim, sp->value_dim, sp->from, (double)sp->epsilon, stats_at(m, l));
        }
        printf("]");
        arr("x", x, nx);
        arr("params", model_params(m), np);
        arr("out", out, (size_t)rows * 3);
        printf("}\n");
        free(x);
        model_free(m);
    }
    if (loss_cases(u) != 0)
        return 1;
    mxu_free(u);
    return 0;
}
