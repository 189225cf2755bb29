/* Unit tests of the core's layers beyond Dense: every layer's backward pass
 * against central finite differences of the loss in float32 (on the
 * portable matrix unit, so the bits do not depend on the host), the shape
 * rules and their errors, Dropout's masks, and that a Dense-only model
 * described with explicit kinds computes what the plain Dense stack does.
 * The forward passes are checked against an independent numpy reference by
 * layer_oracle.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "model.h"

static mxu *u;

static void setup(void)
{
    err e;
    cr_assert_eq(mxu_new(&u, 128, &e), CODE_OK, "%s", e.msg);
}

static void teardown(void)
{
    mxu_free(u);
}

TestSuite(layers, .init = setup, .fini = teardown);

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;   /* [-1, 1) */
}

static struct model_cfg cfg0(int h, int w, int c)
{
    struct model_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.in_dim = h * w * c;
    cfg.in_shape = (struct lshape){3, {h, w, c}};
    cfg.loss = LOSS_SPARSE_CCE;
    cfg.opt = (struct model_opt_cfg){OPT_SGD, 0.01f, 0, 0, 0, 0, 0, {0}};
    cfg.precision = MODEL_FLOAT32;
    cfg.seed = 7;
    cfg.max_rows = 8;
    cfg.deterministic = 1;
    return cfg;
}

static void add(struct model_cfg *c, enum lkind k, int units, enum model_act act)
{
    c->kind[c->nlayers].kind = k;
    c->units[c->nlayers] = units;
    c->act[c->nlayers] = act;
    c->nlayers++;
}

static void add_win(struct model_cfg *c, enum lkind k, int units, enum model_act act, int kh, int kw, int sh, int sw,
                    int same)
{
    struct lspec *s = &c->kind[c->nlayers];
    s->kh = kh, s->kw = kw, s->sh = sh, s->sw = sw, s->same = same;
    add(c, k, units, act);
}

static double loss_of(model *m, const float *x, const int32_t *y, int rows)
{
    struct model_metrics mt;
    err e;
    cr_assert_eq(model_forward(m, x, rows, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_metrics_of(m, y, rows, &mt, &e), CODE_OK, "%s", e.msg);
    return mt.loss_sum;
}

/* Whether parameter i is a non-trainable statistic (BatchNormalization's). */
static int is_stat(const model *m, int nlayers, size_t i)
{
    for (int l = 0; l < nlayers; l++) {
        size_t off, n = model_stats_count(m, l, &off);
        if (i >= off && i < off + n)
            return 1;
    }
    return 0;
}

/* Every parameter's gradient (all of them, or every stride-th) against the
 * central difference (L(w + h) - L(w - h)) / 2h of the summed loss. float32
 * forward passes: h 2e-3, tolerance 2e-3 absolute plus 2% relative. */
static void gradcheck(const struct model_cfg *cfg, int rows, int training, size_t stride)
{
    model *m;
    err e;
    unsigned s = 12345;
    float x[8 * 1024];
    int32_t y[8];
    size_t np, checked = 0;
    struct model_metrics mt;
    uint64_t pass;

    cr_assert_eq(model_new(&m, cfg, u, &e), CODE_OK, "%s", e.msg);
    cr_assert_leq((size_t)rows * (size_t)cfg->in_dim, sizeof x / sizeof *x);
    for (int i = 0; i < rows * cfg->in_dim; i++) /* token ids for an Embedding */
        x[i] = cfg->kind[0].kind == LK_EMBEDDING ? (float)((unsigned)(i * 5 + 1) % (unsigned)cfg->kind[0].vocab)
                                                 : frand(&s);
    for (int r = 0; r < rows; r++)
        y[r] = (int32_t)((unsigned)(r * 7 + 3) % (unsigned)cfg->units[cfg->nlayers - 1]);
    np = model_num_params(m);
    /* biases start at zero: give them values so the check sees them */
    for (size_t i = 0; i < np; i++)
        model_params(m)[i] += 0.1f * frand(&s);
    model_set_training(m, training);
    pass = model_dropout_pass(m);
    cr_assert_eq(model_forward(m, x, rows, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(m, y, rows, &mt, &e), CODE_OK, "%s", e.msg);
    float *g = malloc(np * sizeof *g);
    cr_assert_not_null(g);
    memcpy(g, model_grads(m), np * sizeof *g);
    for (size_t i = 0; i < np; i += stride) {
        float *w = model_params(m) + i, w0 = *w, h = 2e-3f;
        double lp, lm, num;
        if (is_stat(m, cfg->nlayers, i)) /* not trained: no gradient (their place holds statistics) */
            continue;
        *w = w0 + h;
        model_set_dropout_pass(m, pass);
        lp = loss_of(m, x, y, rows);
        *w = w0 - h;
        model_set_dropout_pass(m, pass);
        lm = loss_of(m, x, y, rows);
        *w = w0;
        num = (lp - lm) / (2.0 * (double)h);
        cr_expect(fabs(num - (double)g[i]) <= 2e-3 + 0.02 * fabs(num),
                  "parameter %zu of %zu: backward gives %.6g, finite differences %.6g", i, np, (double)g[i], num);
        checked++;
    }
    cr_assert_gt(checked, 10, "only %zu parameters checked", checked);
    free(g);
    model_free(m);
}

Test(layers, conv2d_same_strided_gradients)
{
    struct model_cfg c = cfg0(7, 6, 2);
    add_win(&c, LK_CONV2D, 3, ACT_TANH, 3, 3, 2, 1, 1);
    add_win(&c, LK_CONV2D, 2, ACT_SIGMOID, 2, 3, 1, 2, 0);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 4, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, max_pooling_gradients)
{
    struct model_cfg c = cfg0(6, 6, 2);
    add_win(&c, LK_CONV2D, 3, ACT_TANH, 3, 3, 1, 1, 1);
    add_win(&c, LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 2, 0, 0, 0);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, overlapping_same_pooling_gradients)
{
    struct model_cfg c = cfg0(5, 5, 2);
    add_win(&c, LK_CONV2D, 2, ACT_TANH, 2, 2, 1, 1, 0);
    add_win(&c, LK_MAX_POOL2D, 0, ACT_LINEAR, 3, 3, 2, 2, 1);
    add_win(&c, LK_AVG_POOL2D, 0, ACT_LINEAR, 2, 2, 1, 1, 1);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, average_and_global_pooling_gradients)
{
    struct model_cfg c = cfg0(6, 4, 3);
    add_win(&c, LK_CONV2D, 4, ACT_TANH, 1, 1, 1, 1, 0);
    add_win(&c, LK_AVG_POOL2D, 0, ACT_LINEAR, 2, 2, 0, 0, 0);
    add(&c, LK_GLOBAL_AVG_POOL2D, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 4, 0, 1);
}

Test(layers, reshape_and_dense_over_the_last_axis_gradients)
{
    struct model_cfg c = cfg0(4, 3, 2);
    c.kind[0].target = (struct lshape){2, {6, 4}};
    add(&c, LK_RESHAPE, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 5, ACT_TANH);          /* per position, on (6, 4) */
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, dropout_gradients_follow_the_mask)
{
    struct model_cfg c = cfg0(1, 1, 12);
    c.in_shape = (struct lshape){1, {12, 0, 0}};
    add(&c, LK_DENSE, 10, ACT_TANH);
    c.kind[1].rate = 0.4f;
    add(&c, LK_DROPOUT, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 5, 1, 1);
}

Test(layers, dropout_drops_at_the_rate_and_scales_only_in_training)
{
    struct model_cfg c = cfg0(1, 1, 64);
    model *m;
    err e;
    float x[8 * 64], a0[8 * 64];
    int zeros = 0;
    c.in_shape.rank = 0;
    c.kind[0].rate = 0.25f;
    add(&c, LK_DROPOUT, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_OK, "%s", e.msg);
    for (int i = 0; i < 8 * 64; i++)
        x[i] = 1.0f + (float)i;
    /* inference: the identity */
    cr_assert_eq(model_forward(m, x, 8, NULL, &e), CODE_OK, "%s", e.msg);
    model_set_training(m, 1);
    cr_assert_eq(model_forward(m, x, 8, NULL, &e), CODE_OK, "%s", e.msg);
    /* the dropout layer's output is not exposed; check it through the mask
     * semantics: 1 - rate kept, scaled by 1/(1 - rate) -> see the Dense
     * input via a one-layer model instead */
    model_free(m);

    c.nlayers = 0;
    c.in_shape.rank = 0;
    c.kind[0].rate = 0.25f;
    add(&c, LK_DROPOUT, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 64, ACT_LINEAR);
    c.loss = LOSS_MSE;
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_OK, "%s", e.msg);
    /* identity kernel, zero bias: the output is the dropout's output */
    memset(model_params(m), 0, model_num_params(m) * sizeof(float));
    for (int i = 0; i < 64; i++)
        model_params(m)[model_kernel_offset(m, 1) + (size_t)i * 64 + (size_t)i] = 1.0f;
    cr_assert_eq(model_forward(m, x, 8, a0, &e), CODE_OK, "%s", e.msg);
    for (int i = 0; i < 8 * 64; i++)
        cr_assert_eq(a0[i], x[i], "inference changed element %d: %g != %g", i, (double)a0[i], (double)x[i]);
    model_set_training(m, 1);
    cr_assert_eq(model_forward(m, x, 8, a0, &e), CODE_OK, "%s", e.msg);
    for (int i = 0; i < 8 * 64; i++) {
        if (a0[i] == 0.0f)
            zeros++;
        else
            cr_assert_float_eq(a0[i], x[i] / 0.75f, 1e-3f * x[i], "element %d kept as %g, not %g", i, (double)a0[i],
                               (double)(x[i] / 0.75f));
    }
    /* 512 draws at 0.25: 128 expected, sd 9.8 */
    cr_assert(zeros > 80 && zeros < 176, "%d of 512 dropped at rate 0.25", zeros);
    /* the next pass draws another mask */
    {
        float a1[8 * 64];
        int differ = 0;
        cr_assert_eq(model_forward(m, x, 8, a1, &e), CODE_OK, "%s", e.msg);
        for (int i = 0; i < 8 * 64; i++)
            differ += (a1[i] == 0.0f) != (a0[i] == 0.0f);
        cr_assert_gt(differ, 50, "two passes dropped nearly the same units (%d differ)", differ);
    }
    model_free(m);
}

Test(layers, explicit_dense_kinds_match_the_dense_stack_bitwise)
{
    int units[3] = {16, 8, 4};
    struct model_cfg a = cfg0(1, 1, 20), b;
    model *ma, *mb;
    err e;
    unsigned s = 3;
    float x[8 * 20], oa[8 * 4], ob[8 * 4];
    int32_t y[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    a.in_shape.rank = 0;
    a.deterministic = 0;
    a.precision = MODEL_MIXED_BF16;
    for (int l = 0; l < 3; l++)
        add(&a, LK_DENSE, units[l], l == 2 ? ACT_SOFTMAX : ACT_RELU);
    b = a;
    b.in_shape = (struct lshape){3, {2, 2, 5}};
    b.kind[0].kind = LK_FLATTEN;   /* shift: Flatten first, then the same Dense layers */
    b.nlayers = 0;
    add(&b, LK_FLATTEN, 0, ACT_LINEAR);
    for (int l = 0; l < 3; l++)
        add(&b, LK_DENSE, units[l], l == 2 ? ACT_SOFTMAX : ACT_RELU);
    cr_assert_eq(model_new(&ma, &a, u, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_new(&mb, &b, u, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_num_params(ma), model_num_params(mb));
    memcpy(model_params(mb), model_params(ma), model_num_params(ma) * sizeof(float));
    for (int i = 0; i < 8 * 20; i++)
        x[i] = frand(&s);
    cr_assert_eq(model_forward(ma, x, 8, oa, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_forward(mb, x, 8, ob, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(memcmp(oa, ob, sizeof oa), 0, "a Flatten in front changed the outputs");
    cr_assert_eq(model_backward(ma, y, 8, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(mb, y, 8, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(memcmp(model_grads(ma), model_grads(mb), model_num_params(ma) * sizeof(float)), 0,
                 "a Flatten in front changed the gradients");
    model_free(ma);
    model_free(mb);
}

static void expect_refused(struct model_cfg *c, const char *needle)
{
    model *m = NULL;
    err e;
    cr_assert_eq(model_new(&m, c, u, &e), CODE_INVALID_ARGUMENT, "accepted a model that should fail with '%s'",
                 needle);
    cr_assert_null(m);
    cr_assert(strstr(e.msg, needle), "error '%s' does not say '%s'", e.msg, needle);
}

Test(layers, bad_shapes_are_refused_naming_the_layer)
{
    struct model_cfg c = cfg0(4, 4, 1);
    c.in_shape = (struct lshape){1, {16, 0, 0}};
    add_win(&c, LK_CONV2D, 2, ACT_RELU, 3, 3, 1, 1, 0);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "layer 0: Conv2D needs a (height, width, channels) input, not (None, 16)");

    c = cfg0(4, 4, 1);
    add_win(&c, LK_MAX_POOL2D, 0, ACT_LINEAR, 5, 5, 0, 0, 0);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "layer 0: MaxPooling2D: a (5, 5) window with padding \"valid\" does not fit");

    c = cfg0(4, 4, 1);
    add_win(&c, LK_CONV2D, 2, ACT_RELU, 3, 3, 1, 1, 1);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "must be a Dense with a (units) output, not Dense with output (None, 4, 4, 2)");

    c = cfg0(4, 4, 1);
    c.kind[0].target = (struct lshape){2, {5, 3}};
    add(&c, LK_RESHAPE, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "Reshape: total size of the new array must be unchanged");

    c = cfg0(4, 4, 1);
    c.kind[0].rate = 1.0f;
    add(&c, LK_DROPOUT, 0, ACT_LINEAR);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "layer 0: Dropout: rate 1 is outside [0, 1)");

    c = cfg0(4, 4, 1);
    add(&c, LK_FLATTEN, 0, ACT_RELU);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "layer 0: Flatten takes no activation");

    c = cfg0(4, 4, 1);
    c.in_dim = 15;
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "in_shape holds 16 floats, but in_dim is 15");

    c = cfg0(4, 4, 1);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    c.kind[0].kind = (enum lkind)42;
    expect_refused(&c, "layer 0: kind 42 is unknown");
}

Test(layers, conv_flops_count_the_patches_matmuls)
{
    struct model_cfg c = cfg0(8, 8, 3);
    model *m;
    err e;
    double padded = 0, f;
    add_win(&c, LK_CONV2D, 16, ACT_RELU, 3, 3, 1, 1, 1);
    add(&c, LK_GLOBAL_AVG_POOL2D, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 10, ACT_SOFTMAX);
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_OK, "%s", e.msg);
    f = model_forward_flops(m, 4, &padded);
    /* conv: (4*64) x 27 . 27 x 16; dense: 4 x 16 . 16 x 10 */
    cr_assert_float_eq(f, 2.0 * 256 * 27 * 16 + 2.0 * 4 * 16 * 10, 1e-6);
    cr_assert_float_eq(padded, 2.0 * 256 * 128 * 128 + 2.0 * 8 * 128 * 128, 1e-6);
    cr_assert_eq(model_num_params(m), (size_t)(27 * 16 + 16 + 16 * 10 + 10));
    model_free(m);
}

/* Gradient checkpointing recomputes the segments' activations in the
 * backward pass: the same gradients, bit for bit, and the recomputed layers
 * counted (9 layers: segments of 3, the first two run again). */
Test(layers, gradient_checkpointing_gives_the_same_bits)
{
    struct model_cfg a = cfg0(8, 8, 2), b;
    model *ma, *mb;
    err e;
    unsigned s = 77;
    float x[8 * 128];
    int32_t y[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    a.deterministic = 0;
    a.precision = MODEL_MIXED_BF16;
    add_win(&a, LK_CONV2D, 4, ACT_RELU, 3, 3, 1, 1, 1);
    add_win(&a, LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 2, 0, 0, 0);
    add_win(&a, LK_CONV2D, 6, ACT_TANH, 3, 3, 1, 1, 1);
    add_win(&a, LK_AVG_POOL2D, 0, ACT_LINEAR, 2, 2, 0, 0, 0);
    a.kind[a.nlayers].rate = 0.3f;
    add(&a, LK_DROPOUT, 0, ACT_LINEAR);
    add(&a, LK_FLATTEN, 0, ACT_LINEAR);
    add(&a, LK_DENSE, 16, ACT_SIGMOID);
    add(&a, LK_DENSE, 8, ACT_RELU);
    add(&a, LK_DENSE, 3, ACT_SOFTMAX);
    b = a;
    b.remat = 1;
    cr_assert_eq(model_new(&ma, &a, u, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_new(&mb, &b, u, &e), CODE_OK, "%s", e.msg);
    for (int l = 0; l < 9; l++)
        cr_assert_eq(model_layer_checkpointed(mb, l), l == 2 || l == 5 || l == 8, "layer %d", l);
    for (int i = 0; i < 8 * 128; i++)
        x[i] = frand(&s);
    model_set_training(ma, 1);
    model_set_training(mb, 1);
    for (int step = 0; step < 3; step++) {
        cr_assert_eq(model_forward(ma, x, 8, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(model_forward(mb, x, 8, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(model_backward(ma, y, 8, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(model_backward(mb, y, 8, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(memcmp(model_grads(ma), model_grads(mb), model_num_params(ma) * sizeof(float)), 0,
                     "step %d: the gradients differ with checkpointing", step);
        model_apply_gradients(ma, 0.125f);
        model_apply_gradients(mb, 0.125f);
    }
    cr_assert_eq(model_remat_calls(ma), 0u);
    cr_assert_eq(model_remat_calls(mb), 3u * 6u, "recomputed %llu layer passes in 3 steps, not 18",
                 (unsigned long long)model_remat_calls(mb));
    double pa, pb, fa = model_train_flops(ma, 8, &pa), fb = model_train_flops(mb, 8, &pb);
    cr_assert_gt(fb, fa, "the recomputation's FLOPs are not counted");
    model_free(ma);
    model_free(mb);
}

/* ---- the sequence layers ---- */

static struct model_cfg seq_cfg(int steps, int features)
{
    struct model_cfg c = cfg0(1, 1, steps * features);
    c.in_shape = features ? (struct lshape){2, {steps, features, 0}} : (struct lshape){1, {steps, 0, 0}};
    c.in_dim = steps * (features ? features : 1);
    return c;
}

static void add_mha(struct model_cfg *c, int heads, int key_dim, int value_dim)
{
    struct lspec *s = &c->kind[c->nlayers];
    s->heads = heads, s->key_dim = key_dim, s->value_dim = value_dim;
    add(c, LK_MULTI_HEAD_ATTENTION, 0, ACT_LINEAR);
}

static void add_add(struct model_cfg *c, int from)
{
    c->kind[c->nlayers].from = from;
    add(c, LK_ADD, 0, ACT_LINEAR);
}

Test(layers, embedding_with_positions_gradients)
{
    struct model_cfg c = seq_cfg(6, 0);
    c.kind[0].vocab = 7;
    c.kind[0].positions = 1;
    add(&c, LK_EMBEDDING, 4, ACT_LINEAR);
    add(&c, LK_GLOBAL_AVG_POOL1D, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, multi_head_attention_gradients)
{
    struct model_cfg c = seq_cfg(5, 3);
    add(&c, LK_DENSE, 4, ACT_TANH); /* per position: so the attention's input gradient is checked too */
    add_mha(&c, 2, 3, 2);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, transformer_encoder_block_gradients)
{
    /* Embedding, attention + residual, feed-forward + residual, pooling */
    struct model_cfg c = seq_cfg(5, 0);
    c.kind[0].vocab = 9;
    c.kind[0].positions = 1;
    add(&c, LK_EMBEDDING, 4, ACT_LINEAR);
    add_mha(&c, 2, 2, 0);
    add_add(&c, 1); /* the attention's input + its output */
    add(&c, LK_DENSE, 6, ACT_TANH);
    add(&c, LK_DENSE, 4, ACT_LINEAR);
    add_add(&c, 3); /* the feed-forward's input + its output */
    add(&c, LK_GLOBAL_AVG_POOL1D, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 3, 0, 1);
}

Test(layers, embedding_rejects_token_ids_outside_its_table)
{
    struct model_cfg c = seq_cfg(4, 0);
    model *m;
    err e;
    float x[2 * 4] = {0, 1, 2, 3, 4, 5, 6, 10};
    c.kind[0].vocab = 10;
    add(&c, LK_EMBEDDING, 3, ACT_LINEAR);
    add(&c, LK_GLOBAL_AVG_POOL1D, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_forward(m, x, 2, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_expect(strstr(e.msg, "row 1, position 3: token id 10 is not an integer in 0..9"), "%s", e.msg);
    x[7] = 2.5f;
    cr_assert_eq(model_forward(m, x, 2, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_expect(strstr(e.msg, "token id 2.5"), "%s", e.msg);
    x[7] = -1.0f;
    cr_assert_eq(model_forward(m, x, 2, NULL, &e), CODE_INVALID_ARGUMENT);
    x[7] = 9.0f;
    cr_assert_eq(model_forward(m, x, 2, NULL, &e), CODE_OK, "%s", e.msg);
    model_free(m);
}

Test(layers, sequence_layer_shape_rules)
{
    model *m;
    err e;
    struct model_cfg c = seq_cfg(4, 0);
    add(&c, LK_DENSE, 3, ACT_RELU);
    c.kind[1].vocab = 5;
    add(&c, LK_EMBEDDING, 3, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_INVALID_ARGUMENT);
    cr_expect(strstr(e.msg, "layer 1: Embedding takes token ids: it must be the first layer"), "%s", e.msg);

    c = seq_cfg(4, 3);
    add(&c, LK_DENSE, 5, ACT_RELU);
    add_add(&c, 0); /* (4, 5) + the (4, 3) input */
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_INVALID_ARGUMENT);
    cr_expect(strstr(e.msg, "Add needs inputs of one shape, but layer 0 takes (None, 4, 3) and this one (None, 4, 5)"),
              "%s", e.msg);

    c = seq_cfg(12, 0);
    add_mha(&c, 2, 4, 0);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_INVALID_ARGUMENT);
    cr_expect(strstr(e.msg, "MultiHeadAttention needs a (sequence_length, features) input, not (None, 12)"), "%s",
              e.msg);
}

static void add_norm(struct model_cfg *c, enum lkind k, float eps, float momentum)
{
    c->kind[c->nlayers].epsilon = eps;
    c->kind[c->nlayers].momentum = momentum;
    add(c, k, 0, ACT_LINEAR);
}

Test(layers, layer_normalization_gradients)
{
    /* over the channels of an image, and over a Dense's features */
    struct model_cfg c = cfg0(4, 3, 2);
    add_win(&c, LK_CONV2D, 5, ACT_LINEAR, 3, 3, 1, 1, 1);
    add_norm(&c, LK_LAYER_NORM, 1e-3f, 0);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 6, ACT_GELU);
    add_norm(&c, LK_LAYER_NORM, 1e-3f, 0);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 4, 1, 1);
}

Test(layers, batch_normalization_gradients_training_and_inference)
{
    struct model_cfg c = cfg0(4, 3, 2);
    add_win(&c, LK_CONV2D, 4, ACT_LINEAR, 3, 3, 1, 1, 1);
    add_norm(&c, LK_BATCH_NORM, 1e-3f, 0.99f);
    add_win(&c, LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 2, 0, 0, 0);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 5, ACT_SWISH);
    add_norm(&c, LK_BATCH_NORM, 1e-3f, 0.99f);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 6, 1, 1); /* batch statistics: every row's gradient runs through the others' */
    gradcheck(&c, 6, 0, 1); /* moving statistics (given values by the check's noise) */
}

/* The moving statistics: not trained, identical on replicas that each saw
 * their own shard, and moved toward the replicas' batch statistics averaged
 * by rows, with Keras' momentum: moving -= (moving - batch) * (1 - momentum). */
Test(layers, batch_normalization_moving_statistics_average_over_replicas)
{
    enum {
        C = 3,
        ROWS = 8
    };
    struct model_cfg c = cfg0(1, 1, C);
    model *r[2];
    err e;
    unsigned s = 5;
    float x[ROWS * C];
    int32_t y[ROWS];
    size_t off;
    c.in_shape = (struct lshape){1, {C, 0, 0}};
    add_norm(&c, LK_BATCH_NORM, 1e-3f, 0.9f);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    for (int i = 0; i < ROWS * C; i++)
        x[i] = 2.0f + 3.0f * frand(&s) * (float)(1 + i % C);
    for (int i = 0; i < ROWS; i++)
        y[i] = i % 2;
    for (int k = 0; k < 2; k++) { /* replica k: rows 3 (k = 0) or 5 (k = 1) of the batch of 8 */
        cr_assert_eq(model_new(&r[k], &c, u, &e), CODE_OK, "%s", e.msg);
        model_set_training(r[k], 1);
        cr_assert_eq(model_stats_count(r[k], 0, &off), 2u * C);
        cr_assert_eq(model_params(r[k])[off], 0.0f);     /* moving_mean starts at 0 */
        cr_assert_eq(model_params(r[k])[off + C], 1.0f); /* moving_variance at 1 */
        const float *xs = k ? x + 3 * C : x;
        int rows = k ? 5 : 3;
        cr_assert_eq(model_forward(r[k], xs, rows, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(model_backward(r[k], k ? y + 3 : y, rows, NULL, &e), CODE_OK, "%s", e.msg);
    }
    /* the all-reduce: the sum over the replicas, on each */
    size_t np = model_num_params(r[0]);
    for (size_t i = 0; i < np; i++) {
        float sum = model_grads(r[0])[i] + model_grads(r[1])[i];
        model_grads(r[0])[i] = model_grads(r[1])[i] = sum;
    }
    model_apply_gradients(r[0], 1.0f / ROWS);
    model_apply_gradients(r[1], 1.0f / ROWS);
    cr_assert_eq(memcmp(model_params(r[0]), model_params(r[1]), np * sizeof(float)), 0,
                 "the replicas' variables differ after the update");
    for (int ch = 0; ch < C; ch++) {
        double mean[2] = {0, 0}, var[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            int r0 = k ? 3 : 0, n = k ? 5 : 3;
            for (int i = r0; i < r0 + n; i++)
                mean[k] += x[i * C + ch] / (double)n;
            for (int i = r0; i < r0 + n; i++)
                var[k] += (x[i * C + ch] - mean[k]) * (x[i * C + ch] - mean[k]) / (double)n;
        }
        double bm = (3 * mean[0] + 5 * mean[1]) / ROWS, bv = (3 * var[0] + 5 * var[1]) / ROWS;
        double want_m = 0.0 - (0.0 - bm) * 0.1, want_v = 1.0 - (1.0 - bv) * 0.1;
        cr_assert(fabs(model_params(r[0])[off + ch] - want_m) < 1e-5 * (1 + fabs(want_m)),
                  "channel %d: moving_mean %.7g, want %.7g", ch, (double)model_params(r[0])[off + ch], want_m);
        cr_assert(fabs(model_params(r[0])[off + C + ch] - want_v) < 1e-5 * (1 + fabs(want_v)),
                  "channel %d: moving_variance %.7g, want %.7g", ch, (double)model_params(r[0])[off + C + ch], want_v);
        cr_assert_eq(model_grads(r[0])[off + ch], 0.0f, "the statistics' places are not cleared");
    }
    /* inference uses them: the output differs from a training pass on the same rows */
    float o_inf[ROWS * 2], o_tr[ROWS * 2];
    model_set_training(r[0], 0);
    cr_assert_eq(model_forward(r[0], x, ROWS, o_inf, &e), CODE_OK, "%s", e.msg);
    model_set_training(r[0], 1);
    cr_assert_eq(model_forward(r[0], x, ROWS, o_tr, &e), CODE_OK, "%s", e.msg);
    cr_assert_neq(memcmp(o_inf, o_tr, sizeof o_inf), 0, "inference used the batch statistics");
    model_free(r[0]);
    model_free(r[1]);
}

Test(layers, normalization_options_are_checked)
{
    struct model_cfg c = cfg0(1, 1, 4);
    c.in_shape = (struct lshape){1, {4, 0, 0}};
    add_norm(&c, LK_LAYER_NORM, 0.0f, 0);
    add(&c, LK_DENSE, 2, ACT_SOFTMAX);
    expect_refused(&c, "layer 0: LayerNormalization: epsilon 0 is not a finite number above 0");
    c.kind[0] = (struct lspec){.kind = LK_BATCH_NORM, .epsilon = 1e-3f, .momentum = 1.5f};
    expect_refused(&c, "layer 0: BatchNormalization: momentum 1.5 is outside [0, 1]");
}

/* Synchronized BatchNormalization on one replica (no sums to make): its own
 * forward and backward code, checked as the others; with gradient
 * checkpointing it is refused. it_layers compares it on 2 replicas with one
 * core on the global batch. */
Test(layers, sync_batch_normalization_gradients_and_refusals)
{
    struct model_cfg c = cfg0(4, 3, 2);
    add_win(&c, LK_CONV2D, 4, ACT_LINEAR, 3, 3, 1, 1, 1);
    c.kind[c.nlayers].synchronized = 1;
    add_norm(&c, LK_BATCH_NORM, 1e-3f, 0.99f);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR);
    add(&c, LK_DENSE, 3, ACT_SOFTMAX);
    gradcheck(&c, 6, 1, 1);
    c.remat = 1;
    expect_refused(&c, "layer 1: synchronized BatchNormalization does not run with gradient checkpointing");
    c.remat = 0;
    c.kind[0].synchronized = 1;
    expect_refused(&c, "layer 0: only BatchNormalization is synchronized");
}
