/* Unit tests of the model math: gradients against finite differences of an
 * independent double-precision reference, the optimizers against the Keras
 * formulas worked by hand, weight init, shard sums, mixed precision, a short
 * training run, config validation and the FLOP counts. */
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

TestSuite(model, .init = setup, .fini = teardown);

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;   /* [-1, 1) */
}

static struct model_cfg base_cfg(int in, int nl, const int *units, const enum model_act *act,
                                 enum model_loss loss)
{
    struct model_cfg c;
    memset(&c, 0, sizeof c);
    c.in_dim = in;
    c.nlayers = nl;
    for (int l = 0; l < nl; l++)
        c.units[l] = units[l], c.act[l] = act[l];
    c.loss = loss;
    c.opt = (struct model_opt_cfg){OPT_ADAM, 0.001f, 0, 0, 0.9f, 0.999f, 1e-7f, {0}};
    c.precision = MODEL_FLOAT32;
    c.seed = 42;
    c.max_rows = 64;
    return c;
}

static model *make(const struct model_cfg *c)
{
    model *m;
    err e;
    cr_assert_eq(model_new(&m, c, u, &e), CODE_OK, "%s", e.msg);
    return m;
}

/* ---- the double-precision reference: forward and loss, written from the
 * Keras formulas independently of model.c ---- */

static double ref_act(double *v, int n, enum model_act a)
{
    double mx = v[0], s = 0;
    switch (a) {
    case ACT_LINEAR:
        break;
    case ACT_RELU:
        for (int j = 0; j < n; j++)
            v[j] = v[j] > 0 ? v[j] : 0;
        break;
    case ACT_TANH:
        for (int j = 0; j < n; j++)
            v[j] = tanh(v[j]);
        break;
    case ACT_SIGMOID:
        for (int j = 0; j < n; j++)
            v[j] = 1 / (1 + exp(-v[j]));
        break;
    case ACT_SOFTMAX:
        for (int j = 1; j < n; j++)
            mx = fmax(mx, v[j]);
        for (int j = 0; j < n; j++)
            s += v[j] = exp(v[j] - mx);
        for (int j = 0; j < n; j++)
            v[j] /= s;
        break;
    case ACT_GELU:
        for (int j = 0; j < n; j++)
            v[j] = 0.5 * v[j] * (1 + erf(v[j] / sqrt(2.0)));
        break;
    case ACT_SOFTPLUS:
        for (int j = 0; j < n; j++)
            v[j] = log1p(exp(v[j]));
        break;
    case ACT_SWISH:
        for (int j = 0; j < n; j++)
            v[j] = v[j] / (1 + exp(-v[j]));
        break;
    }
    return 0;
}

static double ref_clip(double p)
{
    return fmin(fmax(p, 1e-7), 1 - 1e-7);
}

/* sum over rows of the per-row loss, parameters w in the model's layout */
static double ref_loss(const struct model_cfg *c, const double *w, const float *x, int rows, const void *y)
{
    double total = 0, a[64], z[64];
    for (int r = 0; r < rows; r++) {
        int in = c->in_dim, off = 0;
        for (int i = 0; i < in; i++)
            a[i] = x[r * in + i];
        for (int l = 0; l < c->nlayers; l++) {
            int n = c->units[l];
            for (int j = 0; j < n; j++) {
                double s = w[off + in * n + j];
                for (int i = 0; i < in; i++)
                    s += a[i] * w[off + i * n + j];
                z[j] = s;
            }
            ref_act(z, n, c->act[l]);
            memcpy(a, z, sizeof(double) * (size_t)n);
            off += in * n + n;
            in = n;
        }
        int n = in;
        double l = 0, s = 0, lse, mx = a[0];
        for (int j = 1; j < n; j++)
            mx = fmax(mx, a[j]);
        for (int j = 0; j < n; j++)
            s += exp(a[j] - mx);
        lse = mx + log(s); /* from logits: -log softmax = lse - z */
        s = 0;
        if (c->from_logits && c->loss == LOSS_SPARSE_CCE) {
            l = lse - a[((const int32_t *)y)[r]];
        } else if (c->from_logits && c->loss == LOSS_CCE) {
            for (int j = 0; j < n; j++)
                l += ((const float *)y)[r * n + j] * (lse - a[j]);
        } else if (c->loss == LOSS_SPARSE_CCE) {
            int cls = ((const int32_t *)y)[r];
            for (int j = 0; j < n; j++)
                s += ref_clip(a[j]);
            l = log(s) - log(ref_clip(a[cls]));
        } else if (c->loss == LOSS_CCE) {
            const float *yr = (const float *)y + r * n;
            for (int j = 0; j < n; j++)
                s += a[j];
            for (int j = 0; j < n; j++)
                l -= yr[j] * log(ref_clip(a[j] / s));
        } else {
            const float *yr = (const float *)y + r * n;
            for (int j = 0; j < n; j++)
                l += (a[j] - yr[j]) * (a[j] - yr[j]);
            l /= n;
        }
        total += l;
    }
    return total;
}

static void *make_labels(const struct model_cfg *c, int rows, unsigned seed)
{
    int n = c->units[c->nlayers - 1];
    if (c->loss == LOSS_SPARSE_CCE) {
        int32_t *y = malloc(sizeof *y * (size_t)rows);
        for (int r = 0; r < rows; r++)
            y[r] = (int32_t)((r * 7 + (int)seed) % n);
        return y;
    }
    float *y = malloc(sizeof *y * (size_t)(rows * n));
    for (int r = 0; r < rows; r++) {
        float s = 0;
        for (int j = 0; j < n; j++)
            s += y[r * n + j] = c->loss == LOSS_CCE ? 1.5f + frand(&seed) : frand(&seed);
        if (c->loss == LOSS_CCE)   /* soft labels, each row a distribution */
            for (int j = 0; j < n; j++)
                y[r * n + j] /= s;
    }
    return y;
}

/* Model gradients (float32 on the MXU's HIGHEST path) against central
 * differences of the double reference, h = 1e-6 (its own error ~1e-9).
 * Tolerance: |g - fd| <= 1e-6 + 1e-5 |fd| (float32 rounding; the worst seen is
 * 10x below it). */
static void check_grads_with(int nl, const int *units, const enum model_act *act, enum model_loss loss, int from_logits,
                             int det)
{
    enum { IN = 5, ROWS = 6 };
    struct model_cfg c = base_cfg(IN, nl, units, act, loss);
    c.from_logits = from_logits;
    c.deterministic = det;
    model *m = make(&c);
    size_t np = model_num_params(m);
    float x[IN * ROWS], out[ROWS * 8];
    unsigned s = 3;
    struct model_metrics mt;
    err e;
    void *y = make_labels(&c, ROWS, 1);
    double *w = malloc(sizeof *w * np);

    for (int i = 0; i < IN * ROWS; i++)
        x[i] = frand(&s);
    /* nonzero biases so their gradients are exercised off zero */
    for (int l = 0; l < nl; l++)
        for (int j = 0; j < units[l]; j++)
            model_params(m)[model_bias_offset(m, l) + (size_t)j] = 0.1f * frand(&s);
    cr_assert_eq(model_forward(m, x, ROWS, out, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(m, y, ROWS, &mt, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(mt.rows, ROWS);
    for (size_t i = 0; i < np; i++)
        w[i] = model_params(m)[i];
    double l0 = ref_loss(&c, w, x, ROWS, y);
    cr_assert(fabs(mt.loss_sum - l0) <= 1e-5 * fmax(1, fabs(l0)), "loss %.9g vs reference %.9g", mt.loss_sum, l0);
    for (size_t i = 0; i < np; i++) {
        const double h = 1e-6;
        double w0 = w[i];
        w[i] = w0 + h;
        double lp = ref_loss(&c, w, x, ROWS, y);
        w[i] = w0 - h;
        double lm = ref_loss(&c, w, x, ROWS, y);
        w[i] = w0;
        double fd = (lp - lm) / (2 * h), g = model_grads(m)[i];
        cr_assert(fabs(g - fd) <= 1e-6 + 1e-5 * fabs(fd), "%s, last act %s: param %zu of %zu: grad %.9g vs fd %.9g",
                  model_loss_name(loss), model_act_name(act[nl - 1]), i, np, g, fd);
    }
    free(w);
    free(y);
    model_free(m);
}

static void check_grads(int nl, const int *units, const enum model_act *act, enum model_loss loss)
{
    check_grads_with(nl, units, act, loss, 0, 0);
}

Test(model, grads_relu_softmax_sparse_cce_fused)
{
    check_grads(2, (int[]){7, 3}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX}, LOSS_SPARSE_CCE);
}

Test(model, grads_tanh_softmax_cce_fused)
{
    check_grads(2, (int[]){7, 3}, (enum model_act[]){ACT_TANH, ACT_SOFTMAX}, LOSS_CCE);
}

Test(model, grads_sigmoid_sigmoid_sparse_cce_clipped_formula)
{
    check_grads(2, (int[]){7, 3}, (enum model_act[]){ACT_SIGMOID, ACT_SIGMOID}, LOSS_SPARSE_CCE);
}

Test(model, grads_linear_sigmoid_cce_clipped_formula)
{
    check_grads(2, (int[]){7, 3}, (enum model_act[]){ACT_LINEAR, ACT_SIGMOID}, LOSS_CCE);
}

Test(model, grads_three_layers_mse_linear)
{
    check_grads(3, (int[]){7, 4, 3}, (enum model_act[]){ACT_RELU, ACT_TANH, ACT_LINEAR}, LOSS_MSE);
}

Test(model, grads_hidden_softmax_and_mse_through_softmax)
{
    check_grads(3, (int[]){7, 4, 3}, (enum model_act[]){ACT_SOFTMAX, ACT_SIGMOID, ACT_SOFTMAX}, LOSS_MSE);
}

Test(model, grads_single_layer_tanh_mse)
{
    check_grads(1, (int[]){3}, (enum model_act[]){ACT_TANH}, LOSS_MSE);
}

Test(model, grads_gelu_softplus_swish_hidden)
{
    check_grads(4, (int[]){7, 6, 5, 3}, (enum model_act[]){ACT_GELU, ACT_SOFTPLUS, ACT_SWISH, ACT_SOFTMAX},
                LOSS_SPARSE_CCE);
}

Test(model, grads_gelu_softplus_swish_deterministic_math)
{
    /* the fixed exp, log and erf of deterministic mode, on the portable unit */
    check_grads_with(4, (int[]){7, 6, 5, 3}, (enum model_act[]){ACT_SWISH, ACT_GELU, ACT_SOFTPLUS, ACT_SOFTMAX},
                     LOSS_SPARSE_CCE, 0, 1);
}

Test(model, grads_gelu_last_layer_mse)
{
    check_grads(2, (int[]){7, 3}, (enum model_act[]){ACT_SWISH, ACT_GELU}, LOSS_MSE);
}

Test(model, grads_sparse_cce_from_logits)
{
    check_grads_with(2, (int[]){7, 4}, (enum model_act[]){ACT_GELU, ACT_LINEAR}, LOSS_SPARSE_CCE, 1, 0);
    check_grads_with(2, (int[]){7, 4}, (enum model_act[]){ACT_RELU, ACT_LINEAR}, LOSS_SPARSE_CCE, 1, 1);
}

Test(model, grads_cce_from_logits_soft_labels)
{
    check_grads_with(2, (int[]){7, 4}, (enum model_act[]){ACT_SOFTPLUS, ACT_LINEAR}, LOSS_CCE, 1, 0);
    check_grads_with(2, (int[]){7, 4}, (enum model_act[]){ACT_TANH, ACT_LINEAR}, LOSS_CCE, 1, 1);
}

Test(model, from_logits_is_stable_for_large_logits)
{
    /* logits of +-200: exp overflows float32 without the max shift, and the
     * probabilities' clip would cap the loss at -log(1e-7) = 16.1 */
    struct model_cfg c = base_cfg(2, 1, (int[]){3}, (enum model_act[]){ACT_LINEAR}, LOSS_SPARSE_CCE);
    c.from_logits = 1;
    model *m = make(&c);
    float x[2] = {1.0f, 0.0f};
    int32_t y[1] = {1};
    struct model_metrics mt;
    err e;
    memset(model_params(m), 0, model_num_params(m) * sizeof(float));
    model_params(m)[0] = 200.0f;  /* kernel[0][0]: logit 0 = 200 */
    model_params(m)[1] = -200.0f; /* logit 1 = -200 */
    cr_assert_eq(model_forward(m, x, 1, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(m, y, 1, &mt, &e), CODE_OK, "%s", e.msg);
    /* loss = lse - z_1 = 200 + log(1 + e^-200 + e^-400) + 200 = 400 */
    cr_assert(fabs(mt.loss_sum - 400.0) < 1e-3, "loss %.9g, want 400", mt.loss_sum);
    cr_assert(isfinite(model_grads(m)[0]) && fabs(model_grads(m)[0] - 1.0f) < 1e-6, "grad %g",
              (double)model_grads(m)[0]);
    cr_assert(fabs(model_grads(m)[1] + 1.0f) < 1e-6, "grad %g", (double)model_grads(m)[1]);
    cr_assert_eq(mt.correct, 0);
    model_free(m);
}

Test(model, cross_entropy_clips_probabilities_like_keras)
{
    /* one linear layer, kernel [1 0], x = 1: output exactly [1, 0] */
    struct model_cfg c = base_cfg(1, 1, (int[]){2}, (enum model_act[]){ACT_LINEAR}, LOSS_SPARSE_CCE);
    model *m = make(&c);
    float x[2] = {1, 1}, out[4];
    int32_t y[2] = {1, 0};
    struct model_metrics mt;
    err e;
    model_params(m)[0] = 1, model_params(m)[1] = 0;
    cr_assert_eq(model_forward(m, x, 2, out, &e), CODE_OK, "%s", e.msg);
    cr_assert(out[0] == 1 && out[1] == 0);
    cr_assert_eq(model_metrics_of(m, y, 2, &mt, &e), CODE_OK, "%s", e.msg);
    /* row 0: -log(1e-7) = 16.118; row 1: -log(1 - 1e-7) ~ 0 */
    cr_assert(fabs(mt.loss_sum - 16.11809565) < 1e-4, "%.9g", mt.loss_sum);
    cr_assert_eq(mt.correct, 1);
    cr_assert_eq(model_backward(m, y, 2, &mt, &e), CODE_OK, "%s", e.msg);
    cr_assert(isfinite(model_grads(m)[0]) && isfinite(model_grads(m)[1]), "clipping keeps gradients finite");
    model_free(m);
}

/* ---- optimizers: known gradients written into model_grads ---- */

static model *opt_model(struct model_opt_cfg o)
{
    struct model_cfg c = base_cfg(2, 1, (int[]){2}, (enum model_act[]){ACT_LINEAR}, LOSS_MSE);
    c.opt = o;
    return make(&c);
}

static const float G[3][6] = {{1, -2, 0.5f, 0, 3, -0.25f}, {0.5f, -1, 2, 1, -3, 0.25f}, {-1, 4, 0, 2, 1, 1}};

Test(model, sgd_plain_momentum_nesterov_by_hand)
{
    /* constant gradient 1, lr 0.1, momentum 0.9, worked by hand:
     * plain:    w -= 0.1 each step                       -> -0.1, -0.2
     * momentum: v = -0.1, -0.19; w += v                  -> -0.1, -0.29
     * nesterov: w += 0.9 v - 0.1 g = -0.19, then -0.271  -> -0.19, -0.461 */
    const double want[3][2] = {{-0.1, -0.2}, {-0.1, -0.29}, {-0.19, -0.461}};
    for (int kind = 0; kind < 3; kind++) {
        model *m = opt_model((struct model_opt_cfg){OPT_SGD, 0.1f, kind ? 0.9f : 0, kind == 2, 0, 0, 0, {0}});
        cr_assert_eq(model_opt_num_slots(m), kind ? 1 : 0);
        memset(model_params(m), 0, 6 * sizeof(float));
        for (int step = 0; step < 2; step++) {
            for (int i = 0; i < 6; i++)
                model_grads(m)[i] = 2;
            model_apply_gradients(m, 0.5f);   /* scaled to 1 */
            for (int i = 0; i < 6; i++)
                cr_assert(fabs(model_params(m)[i] - want[kind][step]) < 1e-6, "kind %d step %d: %.9g vs %.9g",
                          kind, step, model_params(m)[i], want[kind][step]);
        }
        cr_assert_eq(model_opt_iterations(m), 2);
        model_free(m);
    }
}

Test(model, sgd_momentum_follows_keras_formula)
{
    for (int nest = 0; nest < 2; nest++) {
        model *m = opt_model((struct model_opt_cfg){OPT_SGD, 0.05f, 0.8f, nest, 0, 0, 0, {0}});
        double w[6], v[6] = {0};
        for (int i = 0; i < 6; i++)
            w[i] = model_params(m)[i];
        for (int t = 0; t < 3; t++) {
            memcpy(model_grads(m), G[t], sizeof G[t]);
            model_apply_gradients(m, 0.25f);
            for (int i = 0; i < 6; i++) {
                double g = G[t][i] * 0.25;
                v[i] = 0.8 * v[i] - 0.05 * g;
                w[i] += nest ? 0.8 * v[i] - 0.05 * g : v[i];
                cr_assert(fabs(model_params(m)[i] - w[i]) < 1e-6, "nesterov %d step %d param %d", nest, t, i);
                cr_assert(fabs(model_opt_slot(m, 0)[i] - v[i]) < 1e-6);
            }
        }
        model_free(m);
    }
}

Test(model, adam_follows_keras_formula)
{
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-7;
    model *m = opt_model((struct model_opt_cfg){OPT_ADAM, 0.01f, 0, 0, 0.9f, 0.999f, 1e-7f, {0}});
    double w[6], mm[6] = {0}, vv[6] = {0};
    cr_assert_eq(model_opt_num_slots(m), 2);
    for (int i = 0; i < 6; i++)
        w[i] = model_params(m)[i];
    /* step 1 by hand: m = 0.1 g, v = 0.001 g^2, lr_t = lr sqrt(0.001) / 0.1,
     * so the step is lr * g / (|g| + eps/sqrt(0.001)) ~ lr * sign(g) */
    memcpy(model_grads(m), G[0], sizeof G[0]);
    model_apply_gradients(m, 1.0f);
    cr_assert(fabs(model_params(m)[0] - (w[0] - 0.01 * 1 / (1 + 1e-7 / sqrt(0.001)))) < 1e-7);
    cr_assert(fabs(model_params(m)[3] - w[3]) == 0, "zero gradient, no step");
    for (int t = 0; t < 3; t++) {
        if (t > 0) {
            memcpy(model_grads(m), G[t], sizeof G[t]);
            model_apply_gradients(m, 1.0f);
        }
        double lr_t = lr * sqrt(1 - pow(b2, t + 1)) / (1 - pow(b1, t + 1));
        for (int i = 0; i < 6; i++) {
            double g = G[t][i];
            mm[i] = b1 * mm[i] + (1 - b1) * g;
            vv[i] = b2 * vv[i] + (1 - b2) * g * g;
            w[i] -= lr_t * mm[i] / (sqrt(vv[i]) + eps);
            cr_assert(fabs(model_params(m)[i] - w[i]) < 1e-6, "step %d param %d: %.9g vs %.9g", t, i,
                      model_params(m)[i], w[i]);
            cr_assert(fabs(model_opt_slot(m, 0)[i] - mm[i]) < 1e-6);
            cr_assert(fabs(model_opt_slot(m, 1)[i] - vv[i]) < 1e-6);
        }
    }
    cr_assert_eq(model_opt_iterations(m), 3);
    cr_assert_null(model_opt_slot(m, 2));
    model_free(m);
}

Test(model, adam_bias_correction_uses_the_iteration_count)
{
    /* restored at iteration 999: step 1000 uses lr_t = lr sqrt(1-b2^1000)/(1-b1^1000) */
    model *m = opt_model((struct model_opt_cfg){OPT_ADAM, 0.01f, 0, 0, 0.9f, 0.999f, 1e-7f, {0}});
    float w0 = model_params(m)[0];
    model_set_opt_iterations(m, 999);
    model_grads(m)[0] = 1;
    model_apply_gradients(m, 1.0f);
    double lr_t = 0.01 * sqrt(1 - pow(0.999, 1000)) / (1 - pow(0.9, 1000));
    double want = w0 - lr_t * 0.1 / (sqrt(0.001) + 1e-7);
    cr_assert(fabs(model_params(m)[0] - want) < 1e-6, "%.9g vs %.9g", model_params(m)[0], want);
    cr_assert_eq(model_opt_iterations(m), 1000);
    model_free(m);
}

/* ---- init ---- */

Test(model, glorot_init_is_a_function_of_the_seed)
{
    struct model_cfg c = base_cfg(30, 2, (int[]){20, 10}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX}, LOSS_CCE);
    model *a = make(&c), *b = make(&c);
    size_t np = model_num_params(a);
    cr_assert_eq(np, 30 * 20 + 20 + 20 * 10 + 10);
    cr_assert_eq(model_kernel_offset(a, 1), 30 * 20 + 20);
    cr_assert_eq(model_bias_offset(a, 1), 30 * 20 + 20 + 200);
    cr_assert_eq(memcmp(model_params(a), model_params(b), np * sizeof(float)), 0, "same seed, same bits");

    c.seed = 43;
    model *d = make(&c);
    size_t same = 0;
    for (size_t i = 0; i < np; i++)
        same += model_params(a)[i] == model_params(d)[i];
    cr_assert_lt(same, 40, "another seed gives other weights (%zu equal, the 30 biases among them)", same);

    for (int l = 0; l < 2; l++) {
        int in = l ? 20 : 30, n = c.units[l];
        float lim = (float)sqrt(6.0 / (in + n));
        const float *w = model_params(a) + model_kernel_offset(a, l);
        int outer = 0;
        double mean = 0;
        for (int i = 0; i < in * n; i++) {
            cr_assert_leq(fabsf(w[i]), lim, "layer %d value %d: %g beyond %g", l, i, w[i], lim);
            outer += fabsf(w[i]) > lim / 2;
            mean += w[i];
        }
        mean /= in * n;
        cr_assert(outer > in * n / 2 - in * n / 8 && outer < in * n / 2 + in * n / 8, "uniform: %d of %d", outer,
                  in * n);
        cr_assert(fabs(mean) < lim / 10, "mean %g", mean);
        for (int j = 0; j < n; j++)
            cr_assert_eq(model_params(a)[model_bias_offset(a, l) + (size_t)j], 0.0f);
    }

    /* re-initializing resets weights, slots and the iteration count */
    for (size_t i = 0; i < np; i++)
        model_grads(b)[i] = 1;
    model_apply_gradients(b, 1.0f);
    model_init_weights(b, 42);
    cr_assert_eq(memcmp(model_params(a), model_params(b), np * sizeof(float)), 0);
    cr_assert_eq(model_opt_iterations(b), 0);
    for (size_t i = 0; i < np; i++)
        cr_assert(model_opt_slot(b, 0)[i] == 0 && model_opt_slot(b, 1)[i] == 0);
    model_free(a);
    model_free(b);
    model_free(d);
}

/* ---- sharding: sums over halves add up to the whole ---- */

static void check_halves(enum model_precision prec, enum model_loss loss)
{
    enum { IN = 9, ROWS = 20 };
    struct model_cfg c = base_cfg(IN, 2, (int[]){7, 3}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX}, loss);
    c.precision = prec;
    model *m = make(&c);
    size_t np = model_num_params(m);
    float x[IN * ROWS];
    unsigned s = 5;
    struct model_metrics all, h1, h2;
    err e;
    float *g = malloc(sizeof *g * np), *g1 = malloc(sizeof *g1 * np);
    char *y = make_labels(&c, ROWS, 2);
    size_t ybytes = loss == LOSS_SPARSE_CCE ? sizeof(int32_t) : 3 * sizeof(float);

    for (int i = 0; i < IN * ROWS; i++)
        x[i] = frand(&s);
    cr_assert_eq(model_forward(m, x, ROWS, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(m, y, ROWS, &all, &e), CODE_OK, "%s", e.msg);
    memcpy(g, model_grads(m), np * sizeof *g);
    cr_assert_eq(model_forward(m, x, 8, NULL, &e), CODE_OK);
    cr_assert_eq(model_backward(m, y, 8, &h1, &e), CODE_OK);
    memcpy(g1, model_grads(m), np * sizeof *g);
    cr_assert_eq(model_forward(m, x + 8 * IN, ROWS - 8, NULL, &e), CODE_OK);
    cr_assert_eq(model_backward(m, y + 8 * ybytes, ROWS - 8, &h2, &e), CODE_OK);
    cr_assert_eq(h1.rows + h2.rows, all.rows);
    cr_assert_eq(h1.correct + h2.correct, all.correct);
    cr_assert(fabs(h1.loss_sum + h2.loss_sum - all.loss_sum) <= 1e-5 * all.loss_sum, "%.9g + %.9g vs %.9g",
              h1.loss_sum, h2.loss_sum, all.loss_sum);
    /* only the order of float32 sums over rows differs: tolerance 1e-5 relative */
    for (size_t i = 0; i < np; i++) {
        double sum = (double)g1[i] + model_grads(m)[i];
        cr_assert(fabs(sum - g[i]) <= 1e-5 * (1 + fabs(g[i])), "param %zu: %.9g vs %.9g", i, sum, g[i]);
    }
    free(g), free(g1), free(y);
    model_free(m);
}

Test(model, shard_sums_add_up_float32)
{
    check_halves(MODEL_FLOAT32, LOSS_SPARSE_CCE);
    check_halves(MODEL_FLOAT32, LOSS_CCE);
}

Test(model, shard_sums_add_up_mixed_bf16)
{
    check_halves(MODEL_MIXED_BF16, LOSS_SPARSE_CCE);
}

Test(model, zero_rows_give_zero_gradients)
{
    struct model_cfg c = base_cfg(4, 2, (int[]){3, 2}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX}, LOSS_SPARSE_CCE);
    model *m = make(&c);
    struct model_metrics mt;
    err e;
    for (size_t i = 0; i < model_num_params(m); i++)
        model_grads(m)[i] = 7;
    cr_assert_eq(model_forward(m, NULL, 0, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(m, NULL, 0, &mt, &e), CODE_OK, "%s", e.msg);
    cr_assert(mt.rows == 0 && mt.correct == 0 && mt.loss_sum == 0);
    for (size_t i = 0; i < model_num_params(m); i++)
        cr_assert_eq(model_grads(m)[i], 0.0f);
    model_free(m);
}

/* ---- mixed precision ---- */

Test(model, mixed_bf16_is_close_to_float32_but_rounds)
{
    enum { IN = 64, ROWS = 16, OUT = 10 };
    struct model_cfg c = base_cfg(IN, 2, (int[]){32, OUT}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX},
                                  LOSS_SPARSE_CCE);
    model *f = make(&c);
    c.precision = MODEL_MIXED_BF16;
    model *b = make(&c);
    float x[IN * ROWS], pf[ROWS * OUT], pb[ROWS * OUT];
    int32_t y[ROWS];
    unsigned s = 9;
    struct model_metrics mf, mb;
    err e;
    for (int i = 0; i < IN * ROWS; i++)
        x[i] = frand(&s);
    for (int r = 0; r < ROWS; r++)
        y[r] = r % OUT;
    cr_assert_eq(model_forward(f, x, ROWS, pf, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_forward(b, x, ROWS, pb, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(model_backward(f, y, ROWS, &mf, &e), CODE_OK);
    cr_assert_eq(model_backward(b, y, ROWS, &mb, &e), CODE_OK);
    int differ = 0;
    for (int i = 0; i < ROWS * OUT; i++) {
        cr_assert(fabsf(pf[i] - pb[i]) < 1e-2f, "output %d: %g vs %g", i, pf[i], pb[i]);
        differ += pf[i] != pb[i];
    }
    cr_assert_gt(differ, ROWS * OUT / 2, "bf16 inputs change most outputs (%d of %d)", differ, ROWS * OUT);
    cr_assert(fabs(mf.loss_sum - mb.loss_sum) < 1e-2 * mf.loss_sum, "%g vs %g", mf.loss_sum, mb.loss_sum);
    double num = 0, den = 0;
    for (size_t i = 0; i < model_num_params(f); i++) {
        double d = model_grads(f)[i] - model_grads(b)[i];
        num += d * d;
        den += (double)model_grads(f)[i] * model_grads(f)[i];
    }
    /* bf16 keeps 8 bits (2^-9 relative per input); the hidden layer's dH =
     * dZ.W2^T sums terms that cancel (each row of p - y sums to 0), which
     * magnifies that to ~3% on the first layer's gradients (the last's: 0.4%) */
    cr_assert(sqrt(num / den) < 6e-2, "gradient relative error %g", sqrt(num / den));
    cr_assert(num > 0, "and the gradients differ");
    model_free(f);
    model_free(b);
}

/* ---- training ---- */

Test(model, adam_training_on_separable_blobs_reduces_the_loss)
{
    enum { IN = 8, K = 4, ROWS = 256 };
    struct model_cfg c = base_cfg(IN, 2, (int[]){16, K}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX},
                                  LOSS_SPARSE_CCE);
    c.precision = MODEL_MIXED_BF16;
    c.max_rows = ROWS;
    c.opt.learning_rate = 0.01f;
    model *m = make(&c);
    float center[K][IN], *x = malloc(sizeof *x * IN * ROWS);
    int32_t y[ROWS];
    unsigned s = 11;
    struct model_metrics mt;
    double first = 0, last = 0;
    err e;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < IN; i++)
            center[k][i] = frand(&s) > 0 ? 1.0f : -1.0f;
    for (int r = 0; r < ROWS; r++) {
        y[r] = r % K;
        for (int i = 0; i < IN; i++)
            x[r * IN + i] = center[y[r]][i] + 0.3f * frand(&s);
    }
    for (int step = 0; step < 200; step++) {
        cr_assert_eq(model_forward(m, x, ROWS, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(model_backward(m, y, ROWS, &mt, &e), CODE_OK, "%s", e.msg);
        model_apply_gradients(m, 1.0f / ROWS);
        if (step == 0)
            first = mt.loss_sum / ROWS;
        last = mt.loss_sum / ROWS;
    }
    cr_assert_lt(last, 0.5 * first, "mean loss %g -> %g", first, last);
    cr_assert_gt(mt.correct, ROWS * 9 / 10, "accuracy %ld of %d", (long)mt.correct, ROWS);
    cr_assert_gt(model_matmul_seconds(m), 0.0);
    cr_assert_eq(model_matmul_calls(m), 200 * 5, "2 forward + 3 backward matmuls a step");
    model_reset_timers(m);
    cr_assert(model_matmul_seconds(m) == 0 && model_matmul_calls(m) == 0);
    free(x);
    model_free(m);
}

/* ---- validation ---- */

static void refused(const struct model_cfg *c, const char *want)
{
    model *m = (model *)1;
    err e;
    cr_assert_eq(model_new(&m, c, u, &e), CODE_INVALID_ARGUMENT, "expected a refusal naming '%s'", want);
    cr_assert_null(m);
    cr_assert(strstr(e.msg, want), "'%s' not in '%s'", want, e.msg);
}

Test(model, bad_configs_are_refused_naming_the_field)
{
    const struct model_cfg ok = base_cfg(4, 3, (int[]){5, 6, 3}, (enum model_act[]){ACT_RELU, ACT_TANH, ACT_SOFTMAX},
                                         LOSS_SPARSE_CCE);
    struct model_cfg c;
    model *m;
    err e;

    cr_assert_eq(model_new(&m, &ok, u, &e), CODE_OK, "%s", e.msg);
    model_free(m);
#define BAD(stmt, want) (c = ok, stmt, refused(&c, want))
    BAD(c.in_dim = 0, "in_dim 0 is outside 1..65536");
    BAD(c.in_dim = 65537, "in_dim 65537");
    BAD(c.nlayers = 0, "nlayers 0 is outside 1..16");
    BAD(c.nlayers = 17, "nlayers 17");
    BAD(c.units[2] = 0, "layer 2: units 0 is outside 1..65536");
    BAD(c.units[1] = 70000, "layer 1: units 70000");
    BAD(c.act[1] = (enum model_act)9, "layer 1: activation 9");
    BAD(c.loss = (enum model_loss)3, "loss 3");
    BAD(c.units[2] = 1, "needs at least 2 classes");
    BAD((c.loss = LOSS_CCE, c.units[2] = 1), "categorical_crossentropy needs at least 2 classes");
    BAD(c.opt.kind = (enum model_opt)2, "opt.kind 2");
    BAD(c.opt.learning_rate = 0, "opt.learning_rate 0");
    BAD(c.opt.learning_rate = -1, "opt.learning_rate -1");
    BAD(c.opt.learning_rate = INFINITY, "opt.learning_rate inf");
    BAD(c.opt.learning_rate = NAN, "opt.learning_rate");
    BAD(c.opt.beta_1 = 1, "opt.beta_1 1 is outside [0, 1)");
    BAD(c.opt.beta_2 = -0.5f, "opt.beta_2 -0.5");
    BAD(c.opt.epsilon = 0, "opt.epsilon 0");
    BAD((c.opt.kind = OPT_SGD, c.opt.momentum = 1.5f), "opt.momentum 1.5 is outside [0, 1]");
    BAD(c.precision = (enum model_precision)2, "precision 2");
    BAD(c.max_rows = 0, "max_rows 0 is outside 1..1048576");
    BAD(c.max_rows = (1 << 20) + 1, "max_rows 1048577");
    BAD(c.mxu_tile = 5000, "mxu_tile 5000");
#undef BAD
    /* MSE accepts one unit; SGD ignores the Adam fields */
    c = ok;
    c.loss = LOSS_MSE, c.units[2] = 1, c.opt.kind = OPT_SGD, c.opt.beta_1 = 5;
    cr_assert_eq(model_new(&m, &c, u, &e), CODE_OK, "%s", e.msg);
    model_free(m);
    cr_assert_eq(model_new(&m, NULL, u, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(model_new(&m, &ok, NULL, &e), CODE_INVALID_ARGUMENT);
}

Test(model, bad_calls_are_refused)
{
    struct model_cfg c = base_cfg(2, 1, (int[]){3}, (enum model_act[]){ACT_SOFTMAX}, LOSS_SPARSE_CCE);
    c.max_rows = 4;
    model *m = make(&c);
    float x[10] = {0};
    int32_t y[4] = {0, 1, 2, 0}, bad[4] = {0, 1, 3, 0}, neg[1] = {-1};
    struct model_metrics mt;
    err e;

    cr_assert_eq(model_backward(m, y, 4, &mt, &e), CODE_FAILED_PRECONDITION, "no forward yet");
    cr_assert_eq(model_metrics_of(m, y, 4, &mt, &e), CODE_FAILED_PRECONDITION);
    cr_assert_eq(model_forward(m, x, 5, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "5 rows is outside 0..4"), "%s", e.msg);
    cr_assert_eq(model_forward(m, x, -1, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(model_forward(m, NULL, 2, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(model_forward(m, x, 4, NULL, &e), CODE_OK, "%s", e.msg);
    for (size_t i = 0; i < model_num_params(m); i++)
        model_grads(m)[i] = 5;
    cr_assert_eq(model_backward(m, bad, 4, &mt, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "row 2: class id 3 is outside 0..2"), "%s", e.msg);
    cr_assert_eq(model_grads(m)[0], 5, "a refused backward leaves the gradients alone");
    cr_assert_eq(model_metrics_of(m, bad, 4, &mt, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "row 2: class id 3"), "%s", e.msg);
    cr_assert_eq(model_backward(m, y, 3, &mt, &e), CODE_INVALID_ARGUMENT, "rows differ from the forward's");
    cr_assert_eq(model_backward(m, NULL, 4, &mt, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(model_backward(m, y, 4, &mt, &e), CODE_OK, "%s", e.msg);
    model_apply_gradients(m, 0.25f);
    cr_assert_eq(model_backward(m, y, 4, &mt, &e), CODE_FAILED_PRECONDITION, "weights changed since the forward");
    cr_assert(strstr(e.msg, "forward pass on the current weights"), "%s", e.msg);
    cr_assert_eq(model_metrics_of(m, y, 4, &mt, &e), CODE_OK, "the outputs are still there to evaluate");
    cr_assert_eq(model_forward(m, x, 1, NULL, &e), CODE_OK);
    cr_assert_eq(model_metrics_of(m, neg, 1, &mt, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "row 0: class id -1"), "%s", e.msg);
    model_free(m);
}

/* ---- FLOPs ---- */

Test(model, train_flops_of_the_mnist_mlp_by_hand)
{
    struct model_cfg c = base_cfg(784, 2, (int[]){128, 10}, (enum model_act[]){ACT_RELU, ACT_SOFTMAX},
                                  LOSS_SPARSE_CCE);
    c.max_rows = 128;
    model *m = make(&c);
    double padded, fwd_padded;
    /* forward x.W1 128x128x784 and h.W2 128x10x128; backward dW1 784x128x128,
     * dW2 128x10x128, dH 128x128x10 (no dX for the first layer) */
    double fwd = 2.0 * 128 * 128 * 784 + 2.0 * 128 * 10 * 128;
    double train = fwd + 2.0 * 784 * 128 * 128 + 2.0 * 128 * 10 * 128 + 2.0 * 128 * 128 * 10;
    cr_assert_eq(fwd, 26017792.0);
    cr_assert_eq(train, 52363264.0);
    cr_assert_eq(model_forward_flops(m, 128, &fwd_padded), fwd);
    cr_assert_eq(model_train_flops(m, 128, &padded), train);
    /* padded to the 128 tile (rows to 8): K 784 -> 896, every 10 -> 128 */
    cr_assert_eq(fwd_padded, 2.0 * 128 * 128 * 896 + 2.0 * 128 * 128 * 128);
    cr_assert_eq(padded, fwd_padded + 2.0 * 784 * 128 * 128 + 2.0 * 128 * 128 * 128 + 2.0 * 128 * 128 * 128);
    cr_assert_eq(padded, 67633152.0);
    cr_assert_eq(model_train_flops(m, 0, &padded), 0.0);
    cr_assert_eq(padded, 0.0);
    model_free(m);

    c.mxu_tile = 256;
    m = make(&c);
    model_forward_flops(m, 128, &fwd_padded);
    cr_assert_eq(fwd_padded, 2.0 * 128 * 256 * 1024 + 2.0 * 128 * 256 * 256, "v6e's 256 tile");
    model_free(m);
}

Test(model, names)
{
    cr_assert_str_eq(model_act_name(ACT_RELU), "relu");
    cr_assert_str_eq(model_act_name(ACT_SIGMOID), "sigmoid");
    cr_assert_str_eq(model_act_name(ACT_GELU), "gelu");
    cr_assert_str_eq(model_act_name(ACT_SWISH), "swish");
    cr_assert_str_eq(model_loss_name(LOSS_SPARSE_CCE), "sparse_categorical_crossentropy");
    cr_assert_str_eq(model_loss_name(LOSS_MSE), "mean_squared_error");
    cr_assert_str_eq(model_opt_name(OPT_ADAM), "adam");
    cr_assert_str_eq(model_act_name((enum model_act)99), "unknown");
}

Test(model, updates_are_bit_exact_against_scalar_float_math)
{
    /* 637 parameters: the vector loops run (whichever clone this CPU picks)
     * and must give the bits of plain scalar float32 in the same order */
    struct model_cfg c = base_cfg(30, 1, (int[]){20}, (enum model_act[]){ACT_LINEAR}, LOSS_MSE);
    for (int kind = 0; kind < 4; kind++) {
        c.opt = kind == 3 ? (struct model_opt_cfg){OPT_ADAM, 0.003f, 0, 0, 0.9f, 0.999f, 1e-7f, {0}}
                          : (struct model_opt_cfg){OPT_SGD, 0.01f, kind ? 0.9f : 0, kind == 2, 0, 0, 0, {0}};
        model *m = make(&c);
        size_t np = model_num_params(m);
        float *w = malloc(sizeof *w * np), *s0 = calloc(np, sizeof *s0), *s1 = calloc(np, sizeof *s1);
        unsigned s = 17;
        memcpy(w, model_params(m), np * sizeof *w);
        for (int t = 1; t <= 3; t++) {
            const float scale = 1.0f / 3;
            for (size_t i = 0; i < np; i++)
                model_grads(m)[i] = frand(&s);
            model_apply_gradients(m, scale);
            float lr = c.opt.learning_rate, mu = c.opt.momentum, b1 = 0.9f, b2 = 0.999f;
            float lr_t = (float)((double)0.003f * sqrt(1 - pow((double)b2, t)) / (1 - pow((double)b1, t)));
            for (size_t i = 0; i < np; i++) {
                float g = model_grads(m)[i] * scale;
                if (kind == 0) {
                    w[i] -= lr * g;
                } else if (kind < 3) {
                    s0[i] = mu * s0[i] - lr * g;
                    w[i] += kind == 2 ? mu * s0[i] - lr * g : s0[i];
                } else {
                    s0[i] = b1 * s0[i] + (1.0f - b1) * g;
                    s1[i] = b2 * s1[i] + (1.0f - b2) * (g * g);
                    w[i] -= lr_t * s0[i] / (sqrtf(s1[i]) + 1e-7f);
                }
            }
            cr_assert_eq(memcmp(w, model_params(m), np * sizeof *w), 0, "optimizer %d step %d differs", kind, t);
        }
        free(w), free(s0), free(s1);
        model_free(m);
    }
}
