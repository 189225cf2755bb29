/* Convolutional models on the emulated pod end to end, through real workers
 * and the public model API (tpuemu/model.h): what a user of Conv2D,
 * pooling, Dropout and Flatten checks.
 *
 *  - a small CNN's summary has Keras' rows (names, output shapes, parameter
 *    counts); it learns a task a linear model on the pixels cannot do well,
 *    and its replicas stay bitwise identical (each drops its own units, the
 *    gradients are all-reduced);
 *  - Dropout is off in evaluate: two evaluations give the same loss;
 *  - a layer that cannot take its input is refused when added, naming the
 *    rule; a model ending in a Conv2D is refused at compile;
 *  - a CNN too big for a core's HBM reports its convolution's patches among
 *    the largest allocations.
 *  - BatchNormalization and LayerNormalization train (with gelu and a loss
 *    from logits); evaluate uses the moving statistics, which are the same
 *    on every replica.
 *
 * The images are 8x8x1, generated here with fixed seeds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "colltest.h"

#define HB_MS 500
#define SIDE 8
#define CLASSES 4

QUIET_WARNINGS()

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unif(uint64_t *s)
{
    return (float)((double)(sm64(s) >> 11) * 0x1p-53);
}

/* n images: noise in [0, 0.5), and a 3-pixel stroke anywhere in the image:
 * class 0 horizontal, 1 vertical, 2 the diagonal, 3 the anti-diagonal. The
 * stroke's place varies, so the class is in the local pattern, which a
 * convolution sees wherever it is. */
static void strokes(size_t n, uint64_t seed, float **xo, int32_t **yo)
{
    float *x = calloc(n * SIDE * SIDE, sizeof *x);
    int32_t *y = calloc(n, sizeof *y);
    static const int dy[CLASSES] = {0, 1, 1, 1}, dx[CLASSES] = {1, 0, 1, -1};
    cr_assert(x && y);
    for (size_t i = 0; i < n; i++) {
        int k = (int)(i % CLASSES);
        int r0 = 1 + (int)(sm64(&seed) % (SIDE - 4)), c0 = 1 + (int)(sm64(&seed) % (SIDE - 4));
        float *im = x + i * SIDE * SIDE;
        for (int p = 0; p < SIDE * SIDE; p++)
            im[p] = 0.5f * unif(&seed);
        if (k == 3)
            c0 += 2;
        for (int t = 0; t < 3; t++)
            im[(r0 + t * dy[k]) * SIDE + c0 + t * dx[k]] = 1.0f;
        y[i] = k;
    }
    *xo = x;
    *yo = y;
}

static tpu_dataset *make_ds(const float *x, const int32_t *y, size_t n, size_t batch)
{
    tpu_dataset *ds;
    CALL_OK(tpu_dataset_from_tensor_slices(x, n, SIDE * SIDE, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, batch, 1));
    return ds;
}

static tpu_model *make_cnn(tpu_strategy *s, size_t filters, uint64_t seed)
{
    tpu_model *m;
    CALL_OK(tpu_model_new(s, SIDE * SIDE, &m));
    CALL_OK(tpu_model_set_input_shape(m, (size_t[]){SIDE, SIDE, 1}, 3));
    CALL_OK(tpu_model_add_conv2d(m, filters, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_max_pooling2d(m, 2, 2, 0, 0, TPU_PADDING_VALID));
    CALL_OK(tpu_model_add_dropout(m, 0.25f));
    CALL_OK(tpu_model_add_flatten(m));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, seed));
    return m;
}

Test(layers, cnn_summary_trains_and_replicas_stay_identical, .timeout = 240)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    float *x;
    int32_t *y;
    char sum[2048];
    CALL_OK(tpu_strategy_new(t->c, &s));
    strokes(1024, 11, &x, &y);
    tpu_dataset *ds = make_ds(x, y, 1024, 64);
    tpu_model *m = make_cnn(s, 8, 99);

    tpu_model_summary(m, sum, sizeof sum);
    fprintf(stderr, "%s", sum);
    static const char *const rows[] = {
        "conv2d (Conv2D, relu)        (None, 8, 8, 8)                  80",
        "max_pooling2d (MaxPooling2D) (None, 4, 4, 8)                   0",
        "dropout (Dropout)            (None, 4, 4, 8)                   0",
        "flatten (Flatten)            (None, 128)                       0",
        "dense (Dense, softmax)       (None, 4)                       516",
        "Total params: 596 ",
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        cr_assert(strstr(sum, rows[i]), "the summary lacks the row '%s':\n%s", rows[i], sum);
    cr_assert_eq(tpu_model_num_params(m), 596u);

    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.01f);
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 6;
    tpu_history *h;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    tpu_logs first, last;
    CALL_OK(tpu_history_epoch(h, 0, &first));
    CALL_OK(tpu_history_epoch(h, 5, &last));
    fprintf(stderr, "epoch 1: loss %.4f accuracy %.4f; epoch 6: loss %.4f accuracy %.4f\n", first.loss,
            first.accuracy, last.loss, last.accuracy);
    cr_assert_lt(last.loss, 0.6 * first.loss, "the loss went from %g to %g only", first.loss, last.loss);

    /* held-out images: Dropout off, the same answer twice */
    float *xt;
    int32_t *yt;
    strokes(512, 12345, &xt, &yt);
    tpu_dataset *dt = make_ds(xt, yt, 512, 64);
    double l1, a1, l2, a2;
    CALL_OK(tpu_model_evaluate(m, dt, &l1, &a1));
    CALL_OK(tpu_model_evaluate(m, dt, &l2, &a2));
    fprintf(stderr, "held out: loss %.4f accuracy %.4f\n", l1, a1);
    cr_assert_eq(l1, l2, "two evaluations differ (%.9g, %.9g): Dropout is on in evaluate?", l1, l2);
    cr_assert_gt(a1, 0.9, "held-out accuracy %g", a1);

    size_t np = tpu_model_num_params(m);
    float *w0 = malloc(np * sizeof *w0), *w1 = malloc(np * sizeof *w1);
    cr_assert(w0 && w1);
    CALL_OK(tpu_model_get_weights(m, 0, w0, np));
    CALL_OK(tpu_model_get_weights(m, 1, w1, np));
    cr_assert_eq(memcmp(w0, w1, np * sizeof *w0), 0, "the replicas' weights differ after training");
    free(w0);
    free(w1);
    tpu_history_free(h);
    tpu_dataset_free(dt);
    tpu_dataset_free(ds);
    free(xt);
    free(yt);
    free(x);
    free(y);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}

Test(layers, shapes_that_do_not_fit_are_refused, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){1}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_model *m;
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_model_new(s, 64, &m));
    tpu_status st = tpu_model_add_conv2d(m, 4, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "layer 0: Conv2D needs a (height, width, channels) input, not (None, 64)"),
              "%s", tpu_last_error());
    st = tpu_model_set_input_shape(m, (size_t[]){8, 9, 1}, 3);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "72 values per example, but the model takes input_dim 64"), "%s",
              tpu_last_error());
    CALL_OK(tpu_model_set_input_shape(m, (size_t[]){8, 8, 1}, 3));
    st = tpu_model_add_max_pooling2d(m, 9, 9, 0, 0, TPU_PADDING_VALID);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "MaxPooling2D: a (9, 9) window with padding \"valid\" does not fit"), "%s",
              tpu_last_error());
    CALL_OK(tpu_model_add_conv2d(m, 4, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.batch_size = 8;
    st = tpu_model_compile(m, &co);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "the last layer must be a Dense with a (units) output, not Conv2D with output "
                                       "(None, 8, 8, 4)"), "%s", tpu_last_error());
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}

Test(layers, out_of_hbm_names_the_convolution, .timeout = 60)
{
    static const char *const wargs[] = {"--hbm-bytes", "32M", NULL};
    colltest *t = ct_start(1, (int[]){1}, wargs, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_model *m = make_cnn(s, 64, 1);
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.batch_size = 2048;   /* the patches: 2048 x 64 pixels x 9 f32 = 4.5M; activations 2048 x 8x8x64 = 32M */
    tpu_status st = tpu_model_compile(m, &co);
    cr_assert_eq(st, TPU_RESOURCE_EXHAUSTED, "%s: %s", tpu_status_name(st), tpu_last_error());
    fprintf(stderr, "out of HBM: %s\n", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "conv2d/activations"), "the report should name the convolution: %s",
              tpu_last_error());
    co.batch_size = 64;
    CALL_OK(tpu_model_compile(m, &co));
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}

/* Seven 3x3 convolutions of 16 filters, GlobalAveragePooling2D, Dense: the
 * convolutions' patches and activations are most of its HBM. */
static tpu_model *make_deep(tpu_strategy *s, int remat)
{
    tpu_model *m;
    CALL_OK(tpu_model_new(s, SIDE * SIDE, &m));
    CALL_OK(tpu_model_set_input_shape(m, (size_t[]){SIDE, SIDE, 1}, 3));
    for (int i = 0; i < 7; i++)
        CALL_OK(tpu_model_add_conv2d(m, 16, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_global_average_pooling2d(m));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 2024));
    CALL_OK(tpu_model_set_gradient_checkpointing(m, remat));
    return m;
}

static tpu_compile_options det_opts(size_t batch)
{
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.005f);
    co.deterministic = 1;
    co.batch_size = batch;
    return co;
}

/* The walk-through's answer to "memory overflow": at a per-core batch of 192
 * the model does not fit 32 MiB of HBM (XLA's report, which suggests
 * gradient checkpointing); with checkpointing it compiles, its HBM peak well
 * below what the first compile needed, and trains to the same losses and
 * weights, bit for bit (deterministic mode), as the model without it on
 * cores with room for it. */
Test(layers, gradient_checkpointing_fits_what_did_not, .timeout = 300)
{
    static const char *const small[] = {"--hbm-bytes", "32M", NULL};
    const size_t batch = 2 * 192, n = 4 * batch;
    float *x;
    int32_t *y;
    strokes(n, 5, &x, &y);

    colltest *t = ct_start(1, (int[]){2}, small, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_model *m = make_deep(s, 0);
    tpu_compile_options co = det_opts(batch);
    tpu_status st = tpu_model_compile(m, &co);
    cr_assert_eq(st, TPU_RESOURCE_EXHAUSTED, "%s: %s", tpu_status_name(st), tpu_last_error());
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", tpu_last_error());
    fprintf(stderr, "without checkpointing: %s\n", msg);
    double used_mib = 0;
    const char *u = strstr(msg, "Ran out of memory in memory space hbm. Used ");
    cr_assert(u && sscanf(u, "Ran out of memory in memory space hbm. Used %lfM", &used_mib) == 1, "%s", msg);
    cr_assert(strstr(msg, "gradient checkpointing: tpu_model_set_gradient_checkpointing"),
              "the report should suggest gradient checkpointing: %s", msg);
    tpu_model_free(m);

    m = make_deep(s, 1);
    CALL_OK(tpu_model_compile(m, &co));
    double peak_mib = (double)tpu_model_hbm_used(m) / (1024.0 * 1024.0);
    fprintf(stderr, "HBM needed without checkpointing %.2f MiB, peak with it %.2f MiB of 32\n", used_mib, peak_mib);
    cr_assert_lt(peak_mib, 0.6 * used_mib, "checkpointing's peak %.2f MiB is not well below %.2f MiB", peak_mib,
                 used_mib);
    tpu_dataset *ds = make_ds(x, y, n, batch);
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 2;
    tpu_history *h;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    size_t np = tpu_model_num_params(m);
    float *wr = malloc(np * sizeof *wr), *wp = malloc(np * sizeof *wp);
    cr_assert(wr && wp);
    CALL_OK(tpu_model_get_weights(m, 0, wr, np));

    /* the same model without checkpointing, on cores with room for it */
    colltest *t2 = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s2;
    CALL_OK(tpu_strategy_new(t2->c, &s2));
    tpu_model *p = make_deep(s2, 0);
    CALL_OK(tpu_model_compile(p, &co));
    cr_assert_gt((double)tpu_model_hbm_used(p) / (1024.0 * 1024.0), 0.9 * used_mib);
    tpu_dataset *ds2 = make_ds(x, y, n, batch);
    tpu_history *h2;
    CALL_OK(tpu_model_fit(p, ds2, &fo, &h2));
    CALL_OK(tpu_model_get_weights(p, 0, wp, np));
    for (size_t e = 0; e < 2; e++) {
        tpu_logs a, b;
        CALL_OK(tpu_history_epoch(h, e, &a));
        CALL_OK(tpu_history_epoch(h2, e, &b));
        fprintf(stderr, "epoch %zu: loss %.9g with checkpointing, %.9g without\n", e + 1, a.loss, b.loss);
        cr_assert_eq(memcmp(&a.loss, &b.loss, sizeof a.loss), 0, "epoch %zu: loss %a with checkpointing, %a without",
                     e + 1, a.loss, b.loss);
    }
    cr_assert_eq(memcmp(wr, wp, np * sizeof *wr), 0, "the weights differ with checkpointing");
    free(wr);
    free(wp);
    tpu_history_free(h);
    tpu_history_free(h2);
    tpu_dataset_free(ds);
    tpu_dataset_free(ds2);
    tpu_model_free(m);
    tpu_model_free(p);
    tpu_strategy_free(s);
    tpu_strategy_free(s2);
    ct_free(t);
    ct_free(t2);
    free(x);
    free(y);
}

/* A compile refused for want of HBM, then one that fits, then steps slower
 * than the time fit gives the other cores once one has failed (here 4 s):
 * the refusal is over and must not count as a failure of the steps, which
 * take 6 s each and train. */
Test(layers, slow_steps_after_a_refused_compile_train, .timeout = 300)
{
    static const char *const args[] = {"--hbm-bytes", "32M", "--test-step-ms", "6000", NULL};
    const size_t batch = 2 * 192;
    float *x;
    int32_t *y;
    strokes(batch, 6, &x, &y);

    colltest *t = ct_start(1, (int[]){2}, args, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_model *m = make_deep(s, 0);
    tpu_compile_options co = det_opts(batch);
    tpu_status st = tpu_model_compile(m, &co);
    cr_assert_eq(st, TPU_RESOURCE_EXHAUSTED, "%s: %s", tpu_status_name(st), tpu_last_error());
    tpu_model_free(m);

    m = make_deep(s, 1);
    CALL_OK(tpu_model_compile(m, &co));
    tpu_dataset *ds = make_ds(x, y, batch, batch);
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    tpu_history *h;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    cr_assert_eq(tpu_history_num_epochs(h), 1);
    tpu_logs lg;
    CALL_OK(tpu_history_epoch(h, 0, &lg));
    cr_assert_eq(lg.step, 1, "%llu steps", (unsigned long long)lg.step);
    cr_assert(isfinite(lg.loss) && lg.loss > 0, "loss %g", lg.loss);
    tpu_history_free(h);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
    free(x);
    free(y);
}

/* BatchNormalization, LayerNormalization, gelu and a loss from logits end to
 * end on 2 replicas: Keras' summary rows (BatchNormalization's 4 x channels
 * parameters, half of them not trained), the model learns, evaluate uses the
 * moving statistics (the same answer twice), and the moving statistics moved
 * from their initial 0 and 1 and are the same bits on both replicas although
 * each normalized its own shard with its own batch statistics. */
static tpu_model *make_norm_model(tpu_strategy *s)
{
    tpu_model *m;
    CALL_OK(tpu_model_new(s, SIDE * SIDE, &m));
    CALL_OK(tpu_model_set_input_shape(m, (size_t[]){SIDE, SIDE, 1}, 3));
    CALL_OK(tpu_model_add_conv2d(m, 8, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
    /* momentum 0.9: Keras' 0.99 moves the statistics 55 % of the way in the
     * 80 steps here (0.99^80 = 0.45), and evaluate would normalize with
     * statistics still half their initial 0 and 1, as Keras' would */
    CALL_OK(tpu_model_add_batch_normalization(m, 0.9f, 0));
    CALL_OK(tpu_model_add_max_pooling2d(m, 2, 2, 0, 0, TPU_PADDING_VALID));
    CALL_OK(tpu_model_add_flatten(m));
    CALL_OK(tpu_model_add_dense(m, 16, TPU_ACT_GELU));
    CALL_OK(tpu_model_add_layer_normalization(m, 0));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_LINEAR));
    CALL_OK(tpu_model_set_seed(m, 5));
    return m;
}

Test(layers, normalization_trains_and_moving_statistics_agree_across_replicas, .timeout = 240)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_model *m;
    float *x;
    int32_t *y;
    char sum[2048];
    CALL_OK(tpu_strategy_new(t->c, &s));
    strokes(1024, 21, &x, &y);
    tpu_dataset *ds = make_ds(x, y, 1024, 64);
    m = make_norm_model(s);
    cr_assert_eq(tpu_model_add_batch_normalization(m, 1.5f, 0), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "BatchNormalization: momentum 1.5 is outside [0, 1]"), "%s", tpu_last_error());

    tpu_model_summary(m, sum, sizeof sum);
    fprintf(stderr, "%s", sum);
    static const char *const rows[] = {
        "batch_normalization (BatchNormalization) (None, 8, 8, 8)                  32",
        "dense (Dense, gelu)          (None, 16)                     2064",
        "layer_normalization (LayerNormalization) (None, 16)                       32",
        "Total params: 2276 ",
        "Trainable params: 2260 ",
        "Non-trainable params: 16 ",
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        cr_assert(strstr(sum, rows[i]), "the summary lacks the row '%s':\n%s", rows[i], sum);

    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.01f);
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.from_logits = 1;
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 5;
    tpu_history *h;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    tpu_logs first, last;
    CALL_OK(tpu_history_epoch(h, 0, &first));
    CALL_OK(tpu_history_epoch(h, 4, &last));
    fprintf(stderr, "epoch 1: loss %.4f accuracy %.4f; epoch 5: loss %.4f accuracy %.4f\n", first.loss, first.accuracy,
            last.loss, last.accuracy);
    cr_assert_lt(last.loss, 0.6 * first.loss, "the loss went from %g to %g only", first.loss, last.loss);

    float *xt;
    int32_t *yt;
    strokes(512, 54321, &xt, &yt);
    tpu_dataset *dt = make_ds(xt, yt, 512, 64);
    double l1, a1, l2, a2;
    CALL_OK(tpu_model_evaluate(m, dt, &l1, &a1));
    CALL_OK(tpu_model_evaluate(m, dt, &l2, &a2));
    fprintf(stderr, "held out: loss %.4f accuracy %.4f\n", l1, a1);
    cr_assert_eq(l1, l2, "two evaluations differ (%.9g, %.9g): batch statistics in evaluate?", l1, l2);
    cr_assert_gt(a1, 0.85, "held-out accuracy %g", a1);

    size_t np = tpu_model_num_params(m);
    float *w0 = malloc(np * sizeof *w0), *w1 = malloc(np * sizeof *w1);
    cr_assert(w0 && w1);
    CALL_OK(tpu_model_get_weights(m, 0, w0, np));
    CALL_OK(tpu_model_get_weights(m, 1, w1, np));
    cr_assert_eq(memcmp(w0, w1, np * sizeof *w0), 0, "the replicas' variables differ after training");
    /* conv2d kernel 72 + bias 8; then gamma 8, beta 8, moving_mean 8, moving_variance 8 */
    const float *mm = w0 + 96, *mv = w0 + 104;
    for (int c = 0; c < 8; c++) {
        cr_assert(mm[c] > 0.0f, "channel %d: moving_mean %g did not move from 0 (relu outputs are >= 0)", c,
                  (double)mm[c]);
        cr_assert(mv[c] != 1.0f && mv[c] > 0.0f, "channel %d: moving_variance %g", c, (double)mv[c]);
    }

    /* a checkpoint carries the moving statistics: a fresh model loading it
     * (it takes the cores' place) evaluates to the same loss */
    char path[80];
    snprintf(path, sizeof path, "/tmp/it_layers_norm.%d.ckpt", (int)getpid());
    CALL_OK(tpu_model_save_checkpoint(m, path));
    tpu_model *m2 = make_norm_model(s);
    CALL_OK(tpu_model_compile(m2, &co));
    CALL_OK(tpu_model_load_checkpoint(m2, path));
    unlink(path);
    double l3, a3;
    CALL_OK(tpu_model_evaluate(m2, dt, &l3, &a3));
    cr_assert_eq(l3, l1, "the restored model evaluates to %.9g, not %.9g", l3, l1);
    tpu_model_free(m2);
    free(w0);
    free(w1);
    tpu_history_free(h);
    tpu_dataset_free(dt);
    tpu_dataset_free(ds);
    free(xt);
    free(yt);
    free(x);
    free(y);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}

/* HBM for BatchNormalization: the same CNN with and without it compiled at
 * one batch; the difference is its activations and the normalized input the
 * backward pass keeps (2 x 64 rows x 8x8x64 f32 = 2 MiB) plus its variables
 * (gamma, beta with gradients and Adam's slots, the moving statistics: about
 * 3.5 KiB). */
Test(layers, batch_normalization_is_charged_to_hbm, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){1}, NULL, HB_MS);
    tpu_strategy *s;
    uint64_t used[2];
    CALL_OK(tpu_strategy_new(t->c, &s));
    for (int bn = 0; bn < 2; bn++) {
        tpu_model *m;
        CALL_OK(tpu_model_new(s, SIDE * SIDE, &m));
        CALL_OK(tpu_model_set_input_shape(m, (size_t[]){SIDE, SIDE, 1}, 3));
        CALL_OK(tpu_model_add_conv2d(m, 64, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
        if (bn)
            CALL_OK(tpu_model_add_batch_normalization(m, 0, 0));
        CALL_OK(tpu_model_add_global_average_pooling2d(m));
        CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
        tpu_compile_options co;
        tpu_compile_options_init(&co);
        co.batch_size = 64;
        CALL_OK(tpu_model_compile(m, &co));
        used[bn] = tpu_model_hbm_used(m);
        tpu_model_free(m);
    }
    uint64_t extra = used[1] - used[0], acts = 2u * 64u * 8u * 8u * 64u * 4u;
    fprintf(stderr, "HBM without BatchNormalization %llu B, with it %llu B: +%llu B\n", (unsigned long long)used[0],
            (unsigned long long)used[1], (unsigned long long)extra);
    cr_assert(used[1] > used[0] && extra >= acts + 4 * 64 * 4 && extra <= acts + 16384,
              "BatchNormalization added %llu B of HBM, not its activations (%llu B) and variables",
              (unsigned long long)extra, (unsigned long long)acts);
    tpu_strategy_free(s);
    ct_free(t);
}

/* SyncBatchNormalization: on 2 replicas, each with half of every batch, the
 * batch statistics are the whole batch's, so training gives the weights a
 * single core gets from the same batches with BatchNormalization (to float
 * rounding: the sums run in another order); BatchNormalization on the same
 * 2 replicas, which normalizes each half by itself, ends far from them. */
static float *train_bn(int replicas, int sync, size_t *np)
{
    colltest *t = ct_start(1, (int[]){replicas}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_model *m;
    float *x, *w;
    int32_t *y;
    CALL_OK(tpu_strategy_new(t->c, &s));
    strokes(256, 31, &x, &y);
    tpu_dataset *ds = make_ds(x, y, 256, 64);
    CALL_OK(tpu_model_new(s, SIDE * SIDE, &m));
    CALL_OK(tpu_model_set_input_shape(m, (size_t[]){SIDE, SIDE, 1}, 3));
    CALL_OK(tpu_model_add_conv2d(m, 4, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
    CALL_OK(sync ? tpu_model_add_sync_batch_normalization(m, 0.9f, 0) : tpu_model_add_batch_normalization(m, 0.9f, 0));
    CALL_OK(tpu_model_add_flatten(m));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 3));
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_sgd(0.05f, 0);
    co.deterministic = 1;
    co.steps_per_execution = 2;
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 2;
    tpu_history *h;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    *np = tpu_model_num_params(m);
    w = malloc(*np * sizeof *w);
    cr_assert(w);
    CALL_OK(tpu_model_get_weights(m, 0, w, *np));
    if (replicas > 1) { /* and the replicas agree bit for bit */
        float *w1 = malloc(*np * sizeof *w1);
        cr_assert(w1);
        CALL_OK(tpu_model_get_weights(m, 1, w1, *np));
        cr_assert_eq(memcmp(w, w1, *np * sizeof *w), 0, "the replicas' variables differ");
        free(w1);
    }
    tpu_history_free(h);
    tpu_dataset_free(ds);
    free(x);
    free(y);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
    return w;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

Test(layers, sync_batch_normalization_on_2_replicas_is_one_core_on_the_global_batch, .timeout = 240)
{
    size_t n1, n2, n3;
    float *one = train_bn(1, 0, &n1), *sync = train_bn(2, 1, &n2), *local = train_bn(2, 0, &n3);
    cr_assert(n1 == n2 && n2 == n3);
    double ds = max_diff(one, sync, n1), dl = max_diff(one, local, n1);
    fprintf(stderr,
            "largest difference from one core with the global batch: SyncBatchNormalization %.3g, "
            "BatchNormalization %.3g\n",
            ds, dl);
    cr_assert_lt(ds, 1e-4, "SyncBatchNormalization on 2 replicas differs from one core by %g", ds);
    cr_assert_gt(dl, 100 * ds, "per-replica statistics (%g) are not told apart from synchronized ones (%g)", dl, ds);
    free(one);
    free(sync);
    free(local);
}
