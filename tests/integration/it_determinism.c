/* Deterministic training and learning-rate schedules on the emulated pod,
 * through real workers and the public model API (tpuemu/model.h):
 *
 *  - with tpu_compile_options.deterministic the same training run gives
 *    bitwise identical weights whichever kernels oneDNN would pick for the
 *    host CPU: the workers run with oneDNN restricted to SSE4.1, to AVX2 and
 *    unrestricted (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA, the variables
 *    oneDNN reads at start-up), in mixed_bfloat16 and in float32; the
 *    default mode's hashes are reported beside them (on a CPU where oneDNN's
 *    kernels round differently per ISA they differ, which is what the
 *    deterministic mode removes; oneDNN 2.x has no bf16 matmul below
 *    AVX-512, so the default mixed_bfloat16 run fails there);
 *  - a learning-rate schedule is applied on the cores at the optimizer's
 *    iteration count, as Keras' optimizer calls learning_rate(iterations):
 *    CosineDecay warming up from 0 gives a first update of 0, and
 *    PiecewiseConstantDecay to 0 after a boundary freezes the weights from
 *    that step on (keras/src/optimizers/schedules/learning_rate_schedule.py,
 *    keras/src/optimizers/base_optimizer.py);
 *  - a malformed schedule is refused at compile, naming the field.
 *
 * A TPU's results do not depend on the host it is attached to; the cores of
 * an emulated pod run on host CPUs whose matmul kernels (oneDNN picks them by
 * ISA) and libm variants (glibc picks FMA ones at run time) round
 * differently, which the deterministic mode takes out of the result. */
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
#define DIM 24
#define CLASSES 4
#define ROWS 320
#define BATCH 32 /* 10 steps an epoch on 2 cores */

QUIET_WARNINGS()

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ROWS rows of DIM features in [-1, 1), labels from the sign pattern of
 * the first features (learnable, not separable by a margin) */
static void make_data(float *x, int32_t *y)
{
    uint64_t s = 7;
    for (size_t i = 0; i < ROWS; i++) {
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((double)(sm64(&s) >> 11) * 0x1p-52 - 1.0);
        y[i] = (x[i * DIM] > 0) * 2 + (x[i * DIM + 1] + x[i * DIM + 2] > 0);
    }
}

static tpu_model *make_model(tpu_strategy *s, size_t hidden, uint64_t seed)
{
    tpu_model *m;
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, hidden, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, seed));
    return m;
}

static float *weights(tpu_model *m, int replica)
{
    size_t np = tpu_model_num_params(m);
    float *w = malloc(np * sizeof(float));
    cr_assert_not_null(w);
    CALL_OK(tpu_model_get_weights(m, replica, w, np));
    return w;
}

static uint64_t fnv(const float *w, size_t n)
{
    const unsigned char *p = (const unsigned char *)w;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n * sizeof *w; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static tpu_dataset *make_ds(float *x, int32_t *y)
{
    tpu_dataset *ds;
    CALL_OK(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, TPU_BORROW, &ds));
    CALL_OK(tpu_dataset_shuffle(ds, ROWS, 3));
    CALL_OK(tpu_dataset_batch(ds, BATCH, 1));
    return ds;
}

/* ---- 1 ---- */

enum { DET_BF16, DET_F32, DEF_F32, DEF_BF16, NRUNS };
static const char *const run_name[NRUNS] = {"deterministic mixed_bfloat16", "deterministic float32",
                                            "default float32", "default mixed_bfloat16"};
#define NISA 3
static const char *const isa_name[NISA] = {"SSE41", "AVX2", NULL};

/* One training run: Adam with a cosine schedule warming up over 5 steps,
 * 3 epochs of 10 steps on 2 cores. The hash of replica 0's weights, or 0 when
 * the run failed (its status in *st, the message in why). */
static uint64_t train_hash(tpu_strategy *s, float *x, int32_t *y, int deterministic, tpu_policy policy,
                           tpu_status *st, char *why, size_t whylen, int *moved)
{
    tpu_model *m = make_model(s, 48, 99);
    tpu_dataset *ds = make_ds(x, y);
    tpu_compile_options co;
    tpu_fit_options fo;
    uint64_t h = 0;
    float *w0 = NULL, *w;

    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam_schedule(tpu_cosine_decay_warmup(0.0f, 25, 0.0f, 0.02f, 5));
    co.policy = policy;
    co.batch_size = BATCH;
    co.deterministic = deterministic;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 3;
    *why = 0;
    if ((*st = tpu_model_compile(m, &co)) == TPU_OK) {
        w0 = weights(m, 0);
        *st = tpu_model_fit(m, ds, &fo, NULL);
    }
    if (*st == TPU_OK) {
        size_t np = tpu_model_num_params(m), changed = 0;
        cr_assert_eq(tpu_model_step(m), 30u);
        w = weights(m, 0);
        h = fnv(w, np);
        for (size_t i = 0; i < np; i++)
            changed += w[i] != w0[i];
        *moved = changed > np / 2;
        float *w1 = weights(m, 1);
        cr_assert(memcmp(w, w1, np * sizeof *w) == 0, "the two replicas differ");
        free(w1);
        free(w);
    } else {
        snprintf(why, whylen, "%s: %s", tpu_status_name(*st), tpu_last_error());
    }
    free(w0);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    return h;
}

/* The same seed, data and schedule on workers whose oneDNN is limited to
 * SSE4.1, to AVX2, and not limited: in deterministic mode the weights are
 * bitwise the same (hash equal) in mixed_bfloat16 and in float32. */
Test(determinism, weights_identical_whichever_cpu_isa, .timeout = 300)
{
    float *x = malloc(ROWS * DIM * sizeof(float));
    int32_t *y = malloc(ROWS * sizeof(int32_t));
    uint64_t h[NISA][NRUNS];
    tpu_status st[NISA][NRUNS];
    char why[NISA][NRUNS][256];
    int moved[NISA][NRUNS] = {{0}};
    cr_assert(x && y);
    make_data(x, y);

    for (int i = 0; i < NISA; i++) {
        if (isa_name[i]) { /* the workers inherit it */
            setenv("ONEDNN_MAX_CPU_ISA", isa_name[i], 1);
            setenv("DNNL_MAX_CPU_ISA", isa_name[i], 1);
        } else {
            unsetenv("ONEDNN_MAX_CPU_ISA");
            unsetenv("DNNL_MAX_CPU_ISA");
        }
        colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
        tpu_strategy *s;
        CALL_OK(tpu_strategy_new(t->c, &s));
        cr_assert_eq(tpu_strategy_num_replicas_in_sync(s), 2);
        for (int r = 0; r < NRUNS; r++)
            h[i][r] = train_hash(s, x, y, r == DET_BF16 || r == DET_F32,
                                 r == DET_F32 || r == DEF_F32 ? TPU_POLICY_FLOAT32 : TPU_POLICY_MIXED_BFLOAT16,
                                 &st[i][r], why[i][r], sizeof why[i][r], &moved[i][r]);
        tpu_strategy_free(s);
        ct_free(t);
    }
    unsetenv("ONEDNN_MAX_CPU_ISA");
    unsetenv("DNNL_MAX_CPU_ISA");

    for (int r = 0; r < NRUNS; r++)
        for (int i = 0; i < NISA; i++)
            cr_log_info("%-30s oneDNN ISA %-7s %s %016llx %s", run_name[r], isa_name[i] ? isa_name[i] : "default",
                        st[i][r] == TPU_OK ? "weights" : "failed", (unsigned long long)h[i][r], why[i][r]);
    for (int r = DET_BF16; r <= DET_F32; r++)
        for (int i = 0; i < NISA; i++) {
            cr_assert_eq(st[i][r], TPU_OK, "%s with oneDNN ISA %s: %s", run_name[r],
                         isa_name[i] ? isa_name[i] : "default", why[i][r]);
            cr_assert(moved[i][r], "%s: the weights did not move", run_name[r]);
            cr_assert_eq(h[i][r], h[0][r], "%s: weights hash %016llx with oneDNN ISA %s, %016llx with %s", run_name[r],
                         (unsigned long long)h[i][r], isa_name[i] ? isa_name[i] : "default",
                         (unsigned long long)h[0][r], isa_name[0]);
        }
    /* The default mode trains in mixed_bfloat16 whatever the CPU: where oneDNN has
     * no bf16 matmul (below AVX-512), the matrix unit runs on the portable kernel,
     * the same bf16 inputs and float32 sums (on a TPU the policy never depends on
     * the host; Keras' mixed_bfloat16 policy, keras/mixed_precision/policy.py,
     * runs on any device). */
    for (int i = 0; i < NISA; i++) {
        cr_assert_eq(st[i][DEF_BF16], TPU_OK, "%s with oneDNN ISA %s: %s", run_name[DEF_BF16],
                     isa_name[i] ? isa_name[i] : "default", why[i][DEF_BF16]);
        cr_assert(moved[i][DEF_BF16], "%s: the weights did not move", run_name[DEF_BF16]);
    }
    {
        int differ = st[0][DEF_F32] == TPU_OK && st[1][DEF_F32] == TPU_OK && st[2][DEF_F32] == TPU_OK &&
                     (h[0][DEF_F32] != h[1][DEF_F32] || h[1][DEF_F32] != h[2][DEF_F32]);
        cr_log_info("default float32 %s between oneDNN ISAs on this CPU", differ ? "DIFFERS" : "does not differ");
    }
    free(x);
    free(y);
}

/* ---- 2 ---- */

/* Keras' optimizer takes learning_rate(iterations) before incrementing them:
 * CosineDecay(0, warmup_target=0.05, warmup_steps=4) gives 0 at step 0, so the
 * first SGD update leaves the weights as they were; PiecewiseConstantDecay
 * ([9], [0.05, 0]) gives 0.05 for steps 0..9 and 0 from step 10 on, so an
 * epoch after the tenth step leaves them too. */
Test(determinism, schedule_follows_the_optimizer_step, .timeout = 120)
{
    float *x = malloc(ROWS * DIM * sizeof(float));
    int32_t *y = malloc(ROWS * sizeof(int32_t));
    cr_assert(x && y);
    make_data(x, y);
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    size_t np;

    /* warm-up from 0: step 0 does not move, step 1 does */
    {
        tpu_model *m = make_model(s, 16, 5);
        tpu_dataset *one;
        tpu_compile_options co;
        tpu_fit_options fo;
        tpu_compile_options_init(&co);
        co.optimizer = tpu_optimizer_sgd_schedule(tpu_cosine_decay_warmup(0.0f, 100, 0.0f, 0.05f, 4), 0.0f);
        cr_assert_eq(tpu_lr_schedule_value(&co.optimizer.schedule, 0), 0.0f);
        cr_assert_eq(tpu_lr_schedule_value(&co.optimizer.schedule, 2), 0.025f);
        co.policy = TPU_POLICY_FLOAT32;
        co.batch_size = BATCH;
        CALL_OK(tpu_model_compile(m, &co));
        np = tpu_model_num_params(m);
        CALL_OK(tpu_dataset_from_tensor_slices(x, BATCH, DIM, y, TPU_LABELS_SPARSE, 1, TPU_BORROW, &one));
        CALL_OK(tpu_dataset_batch(one, BATCH, 1)); /* one step an epoch */
        memset(&fo, 0, sizeof fo);
        fo.epochs = 1;
        float *w0 = weights(m, 0);
        CALL_OK(tpu_model_fit(m, one, &fo, NULL));
        cr_assert_eq(tpu_model_step(m), 1u);
        float *w1 = weights(m, 0);
        cr_assert(memcmp(w0, w1, np * sizeof *w0) == 0, "the update at step 0 (learning rate 0) moved the weights");
        fo.initial_epoch = 1, fo.epochs = 2;
        CALL_OK(tpu_model_fit(m, one, &fo, NULL));
        float *w2 = weights(m, 0);
        cr_assert(memcmp(w1, w2, np * sizeof *w1) != 0, "the update at step 1 (learning rate 0.0125) did not move them");
        free(w0), free(w1), free(w2);
        tpu_dataset_free(one);
        tpu_model_free(m);
    }
    /* piecewise: frozen after step 10 */
    {
        uint64_t bounds[1] = {9};
        float values[2] = {0.05f, 0.0f};
        tpu_lr_schedule pw;
        CALL_OK(tpu_piecewise_constant_decay(bounds, 1, values, &pw));
        tpu_model *m = make_model(s, 16, 6);
        tpu_dataset *ds = make_ds(x, y);
        tpu_compile_options co;
        tpu_fit_options fo;
        tpu_compile_options_init(&co);
        co.optimizer = tpu_optimizer_sgd_schedule(pw, 0.0f);
        co.policy = TPU_POLICY_FLOAT32;
        co.batch_size = BATCH;
        CALL_OK(tpu_model_compile(m, &co));
        memset(&fo, 0, sizeof fo);
        fo.epochs = 1;
        float *w0 = weights(m, 0);
        CALL_OK(tpu_model_fit(m, ds, &fo, NULL)); /* steps 0..9 at 0.05 */
        float *w10 = weights(m, 0);
        cr_assert(memcmp(w0, w10, np * sizeof *w0) != 0, "10 steps at 0.05 did not move the weights");
        fo.initial_epoch = 1, fo.epochs = 2;
        CALL_OK(tpu_model_fit(m, ds, &fo, NULL)); /* steps 10..19 at 0 */
        cr_assert_eq(tpu_model_step(m), 20u);
        float *w20 = weights(m, 0);
        cr_assert(memcmp(w10, w20, np * sizeof *w10) == 0, "steps 10..19 (learning rate 0) moved the weights");
        free(w0), free(w10), free(w20);
        tpu_dataset_free(ds);
        tpu_model_free(m);
    }
    /* a malformed schedule is refused at compile, naming the field */
    {
        tpu_model *m = make_model(s, 16, 7);
        tpu_compile_options co;
        tpu_compile_options_init(&co);
        co.optimizer = tpu_optimizer_adam_schedule(tpu_exponential_decay(0.01f, 0, 0.9f, 0));
        co.batch_size = BATCH;
        cr_assert_eq(tpu_model_compile(m, &co), TPU_INVALID_ARGUMENT);
        cr_assert(strstr(tpu_last_error(), "decay_steps 0 must be > 0"), "%s", tpu_last_error());
        co.optimizer = tpu_optimizer_adam_schedule(tpu_cosine_decay(0.01f, 100, 1.5f));
        cr_assert_eq(tpu_model_compile(m, &co), TPU_INVALID_ARGUMENT);
        cr_assert(strstr(tpu_last_error(), "alpha 1.5 is outside [0, 1]"), "%s", tpu_last_error());
        tpu_model_free(m);
    }
    tpu_strategy_free(s);
    ct_free(t);
    free(x);
    free(y);
}

/* ---- 3 ---- */

/* A mixed_bfloat16 model whose first layer is a Dense takes its infeed as
 * bfloat16 (half the bytes): the layer rounds x to bfloat16 anyway, so the
 * weights are bitwise those of the same run fed float32 (TPUEMU_INFEED_F32=1
 * in the client's environment), in both modes, on 2 cores. */
Test(determinism, bf16_infeed_gives_the_float32_infeeds_weights, .timeout = 120)
{
    float *x = malloc(ROWS * DIM * sizeof(float));
    int32_t *y = malloc(ROWS * sizeof(int32_t));
    cr_assert(x && y);
    make_data(x, y);
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));

    for (int det = 0; det <= 1; det++) {
        float *w[2], *w0 = NULL;
        uint64_t hbm[2];
        size_t np = 0;
        for (int k = 0; k < 2; k++) { /* k = 0: bfloat16, 1: float32 */
            tpu_compile_options co;
            tpu_fit_options fo;
            tpu_dataset *ds = make_ds(x, y);
            tpu_model *m = make_model(s, 48, 99);
            if (k == 1)
                setenv("TPUEMU_INFEED_F32", "1", 1);
            tpu_compile_options_init(&co);
            co.optimizer = tpu_optimizer_adam(0.01f);
            co.policy = TPU_POLICY_MIXED_BFLOAT16;
            co.batch_size = BATCH;
            co.deterministic = det;
            CALL_OK(tpu_model_compile(m, &co));
            if (k == 0)
                w0 = weights(m, 0);
            memset(&fo, 0, sizeof fo);
            fo.epochs = 2;
            CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
            unsetenv("TPUEMU_INFEED_F32");
            np = tpu_model_num_params(m);
            w[k] = weights(m, 0);
            hbm[k] = tpu_model_hbm_used(m);
            tpu_dataset_free(ds);
            tpu_model_free(m);
        }
        size_t changed = 0, differ = 0;
        for (size_t i = 0; i < np; i++) {
            changed += w[0][i] != w0[i];
            differ += memcmp(&w[0][i], &w[1][i], sizeof(float)) != 0;
        }
        cr_assert(changed > np / 2, "%s mode: training moved only %zu of %zu weights",
                  det ? "deterministic" : "default", changed, np);
        cr_assert_eq(differ, 0u, "%s mode: %zu of %zu weights differ between the bfloat16 and the float32 infeed",
                     det ? "deterministic" : "default", differ, np);
        /* the model's HBM holds its infeed as bfloat16 whichever the client sends */
        cr_assert(hbm[0] > 0 && hbm[0] == hbm[1], "HBM used: %llu and %llu", (unsigned long long)hbm[0],
                  (unsigned long long)hbm[1]);
        free(w[0]);
        free(w[1]);
        free(w0);
    }
    tpu_strategy_free(s);
    ct_free(t);
    free(x);
    free(y);
}
