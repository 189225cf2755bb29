/* Training on the emulated pod end to end, through real workers and
 * libtpuclient's public model API (tpuemu/model.h, tpuemu/data.h): what a
 * user of fit/evaluate/predict checks.
 *
 *  - replicas stay bitwise identical after many Adam steps in mixed_bfloat16,
 *    and the weights did move;
 *  - the loss curve does not depend on the number of cores for the same
 *    global batch and seed (float32, SGD so that a wrongly scaled gradient
 *    would show);
 *  - a checkpoint (end of epoch, and mid-epoch) restored after a re-initialize
 *    continues exactly where the straight run went;
 *  - damaged and foreign checkpoints are refused, saying which;
 *  - a model that does not fit a core's HBM is RESOURCE_EXHAUSTED with the
 *    core's report, and a smaller one compiles after it;
 *  - an uneven global batch is refused with a suggestion; a legal but slow
 *    one earns exactly one warning;
 *  - evaluate and predict agree with each other and with the labels;
 *  - a core killed mid-fit is UNAVAILABLE naming it, within the heartbeat
 *    bound; after a restart training finishes from the checkpoint;
 *  - prefetch overlaps a slow input pipeline with the steps;
 *  - initializing the system again warns, and a trained model's lost
 *    variables are refused until restored or compiled again from the seed.
 *
 * The data are Gaussian blobs generated here with fixed seeds (a few hundred
 * rows of 32 features): small enough for a shared two-core machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <sodium.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "colltest.h"

/* Tests that do not test fault detection beat every 500 ms, so that a core
 * starved of CPU on a loaded machine is not taken for a dead one. */
#define HB_MS 500
#define DIM 32
#define CLASSES 4


/* Batches of 48 earn the performance warning; only
 * uneven_global_batch_refused_and_warning listens to it. */
QUIET_WARNINGS()

/* ---- data ---- */

typedef struct blobs {
    float *x;
    int32_t *y;
    size_t n, d;
} blobs;

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double gauss(uint64_t *s)
{
    double u = ((double)(sm64(s) >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    double v = (double)(sm64(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* n rows of d features in CLASSES blobs (labels i % CLASSES) of standard
 * deviation spread around centers drawn from N(0, 1). */
static blobs blobs_make(size_t n, size_t d, double spread, uint64_t seed)
{
    blobs b = {malloc(n * d * sizeof(float)), malloc(n * sizeof(int32_t)), n, d};
    double centers[CLASSES][DIM * 2];
    cr_assert(b.x && b.y && d <= DIM * 2);
    for (int k = 0; k < CLASSES; k++)
        for (size_t j = 0; j < d; j++)
            centers[k][j] = gauss(&seed);
    for (size_t i = 0; i < n; i++) {
        int k = (int)(i % CLASSES);
        b.y[i] = k;
        for (size_t j = 0; j < d; j++)
            b.x[i * d + j] = (float)(centers[k][j] + spread * gauss(&seed));
    }
    return b;
}

static void blobs_free(blobs *b)
{
    free(b->x);
    free(b->y);
}

/* from_tensor_slices(b) [.shuffle(all, seed) when seed] .batch(batch, drop) */
static tpu_dataset *make_ds(const blobs *b, size_t batch, int drop, uint64_t shuffle_seed)
{
    tpu_dataset *ds;
    CALL_OK(tpu_dataset_from_tensor_slices(b->x, b->n, b->d, b->y, TPU_LABELS_SPARSE, 1, 0, &ds));
    if (shuffle_seed)
        CALL_OK(tpu_dataset_shuffle(ds, b->n, shuffle_seed));
    CALL_OK(tpu_dataset_batch(ds, batch, drop));
    return ds;
}

/* ---- models ---- */

/* Dense(hidden, relu) -> Dense(CLASSES, softmax) on in features, seeded. */
static tpu_model *make_model(tpu_strategy *s, size_t in, size_t hidden, uint64_t seed)
{
    tpu_model *m;
    CALL_OK(tpu_model_new(s, in, &m));
    CALL_OK(tpu_model_add_dense(m, hidden, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, seed));
    return m;
}

static tpu_compile_options copts(tpu_optimizer opt, tpu_policy policy, size_t batch)
{
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = opt;
    co.policy = policy;
    co.batch_size = batch;
    return co;
}

static float *weights(tpu_model *m, int replica)
{
    size_t np = tpu_model_num_params(m);
    float *w = malloc(np * sizeof(float));
    cr_assert_not_null(w);
    CALL_OK(tpu_model_get_weights(m, replica, w, np));
    return w;
}

/* First index where a and b differ bitwise, or -1. */
static long first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return (long)i;
    return -1;
}

/* ---- a per-batch recorder (on_batch_end) ---- */

#define REC_MAX 512
typedef struct rec {
    size_t n;
    int epoch[REC_MAX];
    size_t batch[REC_MAX];
    double loss[REC_MAX]; /* the epoch's running mean, as Keras logs it */
    uint64_t step[REC_MAX];
    uint64_t input_wait_ns[REC_MAX];
} rec;

static tpu_status rec_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    rec *r = user;
    tpu_step_stats st;
    if (r->n >= REC_MAX)
        return TPU_OK;
    r->epoch[r->n] = epoch;
    r->batch[r->n] = batch;
    r->loss[r->n] = l->loss;
    r->step[r->n] = l->step;
    r->input_wait_ns[r->n] = tpu_model_last_step_stats(m, &st) == TPU_OK ? st.input_wait_ns : 0;
    r->n++;
    return TPU_OK;
}

static tpu_callback rec_cb(rec *r)
{
    tpu_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = rec_batch_end;
    cb.user = r;
    return cb;
}

static tpu_fit_options fitopts(int epochs, const tpu_callback *cbs, size_t ncb)
{
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = epochs;
    fo.callbacks = cbs;
    fo.num_callbacks = ncb;
    return fo;
}

/* Index in r of (epoch, batch), or -1. */
static long rec_find(const rec *r, int epoch, size_t batch)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->epoch[i] == epoch && r->batch[i] == batch)
            return (long)i;
    return -1;
}

static char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", cl_tmpdir(), name);
    return p;
}

/* ---- 1 ---- */

/* 4 cores on 2 hosts, 60 Adam steps in mixed_bfloat16: every replica's
 * weights are bitwise the same (the gradients are all-reduced and every core
 * applies the same update), and they are not the initial ones. */
Test(train, replicas_stay_bitwise_identical, .timeout = 90)
{
    colltest *t = ct_start(2, (int[]){2, 2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    cr_assert_eq(tpu_strategy_num_replicas_in_sync(s), 4);
    blobs b = blobs_make(960, DIM, 1.0, 1);
    tpu_dataset *ds = make_ds(&b, 48, 1, 5); /* 20 steps per epoch */
    tpu_model *m = make_model(s, DIM, 64, 1234);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_MIXED_BFLOAT16, 48);
    CALL_OK(tpu_model_compile(m, &co));
    size_t np = tpu_model_num_params(m);
    cr_assert_eq(np, (size_t)(DIM * 64 + 64 + 64 * CLASSES + CLASSES));

    float *w0 = weights(m, 0);
    for (int r = 1; r < 4; r++) {
        float *w = weights(m, r);
        long d = first_diff(w0, w, np);
        cr_assert_eq(d, -1, "after compile, replica %d (%s) differs from replica 0 at weight %ld: %a vs %a", r,
                     t->name[r], d, (double)w[d < 0 ? 0 : d], (double)w0[d < 0 ? 0 : d]);
        free(w);
    }

    tpu_history *h;
    tpu_fit_options fo = fitopts(3, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    cr_assert_eq(tpu_history_num_epochs(h), 3u);
    cr_assert_eq(tpu_model_step(m), 60u);
    tpu_logs first, last;
    CALL_OK(tpu_history_epoch(h, 0, &first));
    CALL_OK(tpu_history_epoch(h, 2, &last));
    cr_assert(last.loss < first.loss, "the loss did not go down: %g -> %g", first.loss, last.loss);
    cr_assert_gt(last.accuracy, 0.9, "last epoch's accuracy %g on separable blobs", last.accuracy);

    float *ref = weights(m, 0);
    size_t changed = 0;
    for (size_t i = 0; i < np; i++)
        changed += ref[i] != w0[i];
    cr_assert_gt(changed, np * 9 / 10, "only %zu of %zu weights changed in 60 steps", changed, np);
    for (int r = 1; r < 4; r++) {
        float *w = weights(m, r);
        long d = first_diff(ref, w, np);
        cr_assert_eq(d, -1, "after 60 steps replica %d (%s) differs from replica 0 at weight %ld: %a vs %a", r,
                     t->name[r], d, (double)w[d < 0 ? 0 : d], (double)ref[d < 0 ? 0 : d]);
        free(w);
    }
    free(ref);
    free(w0);
    tpu_history_free(h);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 2 ---- */

/* The same global batch (48: divisible by 1, 2, 3 and 4), seed and data on 1,
 * 2, 3 and 4 cores give the same loss curve. Tolerance: relative 1e-4. In
 * float32 only the order of the reductions changes with the core count (each
 * core sums its shard's gradients and losses, then the all-reduce adds the
 * shards), so each step differs by a few float32 roundings (~1e-7 relative),
 * which 30 steps of SGD carry forward without amplifying much; a gradient
 * scaled by the per-core instead of the global batch, a shard sent to the
 * wrong core or a replica left out would move the curve by far more. SGD,
 * not Adam: Adam normalizes the gradient's scale away and would hide a
 * wrong scaling. */
#define CURVE_EPOCHS 3
#define CURVE_BATCHES 10
Test(train, loss_curve_independent_of_core_count, .timeout = 120)
{
    blobs b = blobs_make(480, DIM, 1.5, 2);
    double per_batch[5][CURVE_EPOCHS * CURVE_BATCHES], per_epoch[5][CURVE_EPOCHS];
    for (int k = 1; k <= 4; k++) {
        colltest *t = ct_start(1, (int[]){k}, NULL, HB_MS);
        tpu_strategy *s;
        CALL_OK(tpu_strategy_new(t->c, &s));
        cr_assert_eq(tpu_strategy_num_replicas_in_sync(s), k);
        tpu_dataset *ds = make_ds(&b, 48, 1, 9);
        tpu_model *m = make_model(s, DIM, 32, 77);
        tpu_compile_options co = copts(tpu_optimizer_sgd(0.1f, 0.5f), TPU_POLICY_FLOAT32, 48);
        CALL_OK(tpu_model_compile(m, &co));
        static rec r;
        memset(&r, 0, sizeof r);
        tpu_callback cb = rec_cb(&r);
        tpu_fit_options fo = fitopts(CURVE_EPOCHS, &cb, 1);
        tpu_history *h;
        CALL_OK(tpu_model_fit(m, ds, &fo, &h));
        cr_assert_eq(r.n, (size_t)(CURVE_EPOCHS * CURVE_BATCHES), "%d cores: %zu batches recorded", k, r.n);
        cr_assert_eq(tpu_history_num_epochs(h), (size_t)CURVE_EPOCHS);
        for (size_t i = 0; i < r.n; i++)
            per_batch[k][i] = r.loss[i];
        for (int e = 0; e < CURVE_EPOCHS; e++) {
            tpu_logs l;
            CALL_OK(tpu_history_epoch(h, (size_t)e, &l));
            per_epoch[k][e] = l.loss;
        }
        fprintf(stderr, "loss curve on %d core(s): epochs %.9g %.9g %.9g\n", k, per_epoch[k][0], per_epoch[k][1],
                per_epoch[k][2]);
        tpu_history_free(h);
        tpu_model_free(m);
        tpu_dataset_free(ds);
        tpu_strategy_free(s);
        ct_free(t);
    }
    cr_assert_lt(per_epoch[1][CURVE_EPOCHS - 1], per_epoch[1][0] * 0.8, "the loss barely moved: %g -> %g",
                 per_epoch[1][0], per_epoch[1][CURVE_EPOCHS - 1]);
    for (int k = 2; k <= 4; k++) {
        for (int i = 0; i < CURVE_EPOCHS * CURVE_BATCHES; i++) {
            double a = per_batch[1][i], c = per_batch[k][i];
            cr_assert(fabs(a - c) <= 1e-4 * fabs(a),
                      "epoch %d batch %d: loss %.9g on 1 core, %.9g on %d cores (rel %.3g)", i / CURVE_BATCHES,
                      i % CURVE_BATCHES, a, c, k, fabs(a - c) / fabs(a));
        }
        for (int e = 0; e < CURVE_EPOCHS; e++)
            cr_assert(fabs(per_epoch[1][e] - per_epoch[k][e]) <= 1e-4 * fabs(per_epoch[1][e]),
                      "epoch %d: loss %.9g on 1 core, %.9g on %d cores", e, per_epoch[1][e], per_epoch[k][e], k);
    }
    blobs_free(&b);
}

/* ---- 3 ---- */

/* The loss of batch i alone, from the running means a recorder saw (rows per
 * batch constant): mean_i * (i - from + 1) - mean_{i-1} * (i - from), where
 * from is the first batch the run's epoch started at. */
static double batch_loss(const rec *r, long i, size_t from)
{
    size_t b = r->batch[i];
    double cur = r->loss[i] * (double)(b - from + 1);
    if (b == from)
        return cur;
    cr_assert(i > 0 && r->batch[i - 1] == b - 1);
    return cur - r->loss[i - 1] * (double)(b - from);
}

/* 2 cores. A straight run of 2 epochs; then 1 epoch with a checkpoint, a
 * re-initialize (every core reset), a new model object of the same layers and
 * seed, the checkpoint loaded, and fit(resume) to 2 epochs: the second epoch's
 * losses are bitwise the straight run's (same core count: the same
 * arithmetic in the same order), and so are the final weights. Then the same
 * from a mid-epoch checkpoint (save_every_steps), loaded before the model is
 * on the cores (pushed at its first compile). */
Test(train, checkpoint_restore_continues_exactly, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(480, DIM, 1.5, 3);
    tpu_dataset *ds = make_ds(&b, 48, 1, 21); /* 10 batches, reshuffled every epoch */
    tpu_compile_options co = copts(tpu_optimizer_adam(0.005f), TPU_POLICY_MIXED_BFLOAT16, 48);
    size_t np;

    /* the straight run */
    static rec straight;
    tpu_model *a = make_model(s, DIM, 32, 4242);
    CALL_OK(tpu_model_compile(a, &co));
    np = tpu_model_num_params(a);
    tpu_callback cb = rec_cb(&straight);
    tpu_fit_options fo = fitopts(2, &cb, 1);
    CALL_OK(tpu_model_fit(a, ds, &fo, NULL));
    cr_assert_eq(straight.n, 20u);
    float *wa = weights(a, 0);
    tpu_model_free(a);

    /* one epoch with a checkpoint at its end */
    const char *path = tmp_path("epoch.ckpt");
    static rec first;
    tpu_model *bm = make_model(s, DIM, 32, 4242);
    CALL_OK(tpu_model_compile(bm, &co));
    tpu_callback cbs[2] = {rec_cb(&first)};
    CALL_OK(tpu_callback_checkpoint(path, 0, &cbs[1]));
    fo = fitopts(1, cbs, 2);
    CALL_OK(tpu_model_fit(bm, ds, &fo, NULL));
    cr_assert_eq(first.n, 10u);
    for (size_t i = 0; i < 10; i++)
        cr_assert(memcmp(&first.loss[i], &straight.loss[i], sizeof(double)) == 0,
                  "epoch 0 batch %zu: %.17g, the straight run had %.17g (same seed, same data)", i, first.loss[i],
                  straight.loss[i]);
    cr_assert_eq(access(path, F_OK), 0, "the checkpoint callback wrote no %s", path);
    tpu_callback_free(&cbs[1]);
    tpu_model_free(bm);

    /* every core reset; a new model object; the checkpoint; resume */
    ct_reinit(t);
    static rec resumed;
    tpu_model *c = make_model(s, DIM, 32, 4242);
    CALL_OK(tpu_model_compile(c, &co));
    CALL_OK(tpu_model_load_checkpoint(c, path));
    cr_assert_eq(tpu_model_step(c), 10u);
    cr_assert_eq(tpu_model_epoch(c), 1);
    cr_assert_eq(tpu_model_batch_in_epoch(c), 0u);
    cb = rec_cb(&resumed);
    fo = fitopts(2, &cb, 1);
    fo.resume = 1;
    CALL_OK(tpu_model_fit(c, ds, &fo, NULL));
    cr_assert_eq(resumed.n, 10u, "the resumed fit ran %zu batches, not the 10 of epoch 1", resumed.n);
    for (size_t i = 0; i < resumed.n; i++) {
        long j = rec_find(&straight, resumed.epoch[i], resumed.batch[i]);
        cr_assert_eq(resumed.epoch[i], 1);
        cr_assert_geq(j, 0);
        cr_assert(memcmp(&resumed.loss[i], &straight.loss[j], sizeof(double)) == 0,
                  "resumed epoch 1 batch %zu: loss %.17g, the straight run had %.17g", resumed.batch[i],
                  resumed.loss[i], straight.loss[j]);
    }
    cr_assert_eq(tpu_model_step(c), 20u);
    float *wc = weights(c, 0);
    long d = first_diff(wa, wc, np);
    cr_assert_eq(d, -1, "after the resumed epoch weight %ld is %a, the straight run's %a", d,
                 (double)wc[d < 0 ? 0 : d], (double)wa[d < 0 ? 0 : d]);
    free(wc);
    tpu_model_free(c);

    /* mid-epoch: saves after steps 7 and 14; the file keeps the last one,
     * epoch 1 batch 4, or a step or more later when the next executions were
     * already queued on the cores (infeed_depth 2) -- then it must say so */
    const char *mid = tmp_path("mid.ckpt");
    tpu_model *dm = make_model(s, DIM, 32, 4242);
    CALL_OK(tpu_model_compile(dm, &co));
    CALL_OK(tpu_callback_checkpoint(mid, 7, &cbs[1]));
    fo = fitopts(2, &cbs[1], 1);
    CALL_OK(tpu_model_fit(dm, ds, &fo, NULL));
    tpu_callback_free(&cbs[1]);
    tpu_model_free(dm);

    ct_reinit(t);
    static rec rmid;
    tpu_model *em = make_model(s, DIM, 32, 4242);
    tpu_compile_options co0 = co;
    co0.batch_size = 0; /* not on the cores yet: the state is pushed at the first fit */
    CALL_OK(tpu_model_compile(em, &co0));
    CALL_OK(tpu_model_load_checkpoint(em, mid));
    uint64_t at = tpu_model_step(em);
    size_t from = (size_t)at - 10;
    fprintf(stderr, "mid-epoch checkpoint: step %llu\n", (unsigned long long)at);
    cr_assert(at >= 14 && at < 14 + co.infeed_depth, "the mid-epoch checkpoint is at step %llu, not 14..%u",
              (unsigned long long)at, 13 + co.infeed_depth);
    cr_assert_eq(tpu_model_epoch(em), 1);
    cr_assert_eq(tpu_model_batch_in_epoch(em), from);
    cb = rec_cb(&rmid);
    fo = fitopts(2, &cb, 1);
    fo.resume = 1;
    CALL_OK(tpu_model_fit(em, ds, &fo, NULL));
    cr_assert_eq(rmid.n, 10 - from, "the fit resumed at epoch 1 batch %zu ran %zu batches, not %zu", from, rmid.n,
                 10 - from);
    /* Each batch's own loss (from the running means; the resumed epoch's mean
     * starts where it resumed): equal up to the double arithmetic of recovering it,
     * 1e-9 relative (the bitwise check is the weights below). */
    for (size_t i = 0; i < rmid.n; i++) {
        long j = rec_find(&straight, rmid.epoch[i], rmid.batch[i]);
        cr_assert_eq(rmid.epoch[i], 1);
        cr_assert_eq(rmid.batch[i], from + i);
        cr_assert_geq(j, 0);
        double got = batch_loss(&rmid, (long)i, from), want = batch_loss(&straight, j, 0);
        cr_assert(fabs(got - want) <= 1e-9 * fabs(want), "resumed mid-epoch, epoch 1 batch %zu: loss %.17g, the "
                  "straight run had %.17g", rmid.batch[i], got, want);
    }
    float *we = weights(em, 0);
    d = first_diff(wa, we, np);
    cr_assert_eq(d, -1, "after resuming mid-epoch weight %ld is %a, the straight run's %a", d,
                 (double)we[d < 0 ? 0 : d], (double)wa[d < 0 ? 0 : d]);
    free(we);
    tpu_model_free(em);

    free(wa);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 4 ---- */

static void flip_byte(const char *src, const char *dst, long at)
{
    FILE *f = fopen(src, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    cr_assert(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    if (at < 0)
        at = n / 2;
    buf[at] ^= 0x40;
    cr_assert_not_null(f = fopen(dst, "wb"));
    cr_assert_eq(fwrite(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    free(buf);
}

/* A checkpoint with one byte flipped is DATA_LOSS naming the file; one of
 * another architecture is INVALID_ARGUMENT naming both models; neither
 * changes the model, and the good file still loads. */
Test(train, damaged_checkpoint_is_refused, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(192, DIM, 1.0, 4);
    tpu_dataset *ds = make_ds(&b, 48, 1, 0);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_FLOAT32, 48);
    const char *good = tmp_path("good.ckpt"), *bad = tmp_path("bad.ckpt"), *other = tmp_path("other.ckpt");
    /* another architecture's checkpoint: 32 -> 24 relu -> 4 softmax */
    tpu_model *o = make_model(s, DIM, 24, 5);
    CALL_OK(tpu_model_compile(o, &co));
    CALL_OK(tpu_model_save_checkpoint(o, other));
    tpu_model_free(o);

    tpu_model *m = make_model(s, DIM, 16, 5);
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    CALL_OK(tpu_model_save_checkpoint(m, good));
    size_t np = tpu_model_num_params(m);
    float *w1 = weights(m, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL)); /* move on from the checkpoint */
    float *w2 = weights(m, 1);
    cr_assert_neq(first_diff(w1, w2, np), -1);

    flip_byte(good, bad, -1);
    tpu_status st = tpu_model_load_checkpoint(m, bad);
    cr_assert_eq(st, TPU_DATA_LOSS, "a flipped byte: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), bad), "the error should name %s: %s", bad, tpu_last_error());
    flip_byte(good, bad, 3); /* in the header */
    st = tpu_model_load_checkpoint(m, bad);
    cr_assert_eq(st, TPU_DATA_LOSS, "a flipped header byte: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), bad), "the error should name %s: %s", bad, tpu_last_error());

    st = tpu_model_load_checkpoint(m, other);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT, "another model's checkpoint: %s: %s", tpu_status_name(st), tpu_last_error());
    const char *msg = tpu_last_error();
    cr_assert(strstr(msg, other), "the error should name %s: %s", other, msg);
    cr_assert(strstr(msg, "32 -> 24 relu") && strstr(msg, "32 -> 16 relu"),
              "the error should describe both models (32 -> 24 relu ..., 32 -> 16 relu ...): %s", msg);

    /* the refusals changed nothing (the weights are the second epoch's); the
     * good checkpoint still loads, on every replica */
    float *w3 = weights(m, 1);
    cr_assert_eq(first_diff(w2, w3, np), -1, "a refused checkpoint changed the weights");
    cr_assert_eq(tpu_model_step(m), 8u);
    free(w3);
    CALL_OK(tpu_model_load_checkpoint(m, good));
    w3 = weights(m, 1);
    long d = first_diff(w1, w3, np);
    cr_assert_eq(d, -1, "after loading %s weight %ld is %a, it was saved as %a", good, d, (double)w3[d < 0 ? 0 : d],
                 (double)w1[d < 0 ? 0 : d]);
    cr_assert_eq(tpu_model_step(m), 4u);
    free(w1), free(w2), free(w3);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* Rewrites one u64 (or float, when f is not NULL) of section sec at byte
 * offset at of its data, in a copy of src at dst, and seals the copy again
 * with the format's unkeyed BLAKE2b: what anyone can do to a checkpoint. */
static void reseal(const char *src, const char *dst, const char *sec, size_t at, uint64_t v, const float *f)
{
    FILE *fp = fopen(src, "rb");
    cr_assert_not_null(fp);
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp), off = 16;
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc(n);
    cr_assert(buf && fread(buf, 1, n, fp) == n);
    fclose(fp);
    int found = 0;
    while (off + 32 < n && !found) {
        size_t nl = (size_t)buf[off] | (size_t)buf[off + 1] << 8;
        const char *name = (const char *)buf + off + 2;
        uint64_t bytes;
        memcpy(&bytes, buf + off + 2 + nl, 8); /* little-endian machine */
        off += 2 + nl + 8;
        off += (8 - off % 8) % 8;
        if (nl == strlen(sec) && memcmp(name, sec, nl) == 0) {
            cr_assert_leq(at + (f ? 4 : 8), bytes);
            if (f)
                memcpy(buf + off + at, f, sizeof *f);
            else
                memcpy(buf + off + at, &v, 8);
            found = 1;
        }
        off += bytes;
    }
    cr_assert(found, "no section %s in %s", sec, src);
    crypto_generichash(buf + n - 32, 32, buf, n - 32, NULL, 0);
    cr_assert_not_null(fp = fopen(dst, "wb"));
    cr_assert_eq(fwrite(buf, 1, n, fp), n);
    fclose(fp);
    free(buf);
}

/* A checkpoint whose checksum matches but whose contents are hostile is
 * refused naming the field or the tensor, and changes nothing: the checksum
 * is unkeyed, so anyone can seal any contents. Position fields (u64s:
 * step, epoch, batch, iterations, seed, num_params, num_slots, model_id)
 * past any run, and a NaN or infinite weight or optimizer value. A position
 * past this run (a later epoch than the run has) is refused by a resume. */
Test(train, hostile_checkpoint_contents_are_refused, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(192, DIM, 1.0, 4);
    tpu_dataset *ds = make_ds(&b, 48, 1, 0);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_FLOAT32, 48);
    const char *good = tmp_path("h-good.ckpt"), *bad = tmp_path("h-bad.ckpt");
    tpu_model *m = make_model(s, DIM, 16, 5);
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    CALL_OK(tpu_model_save_checkpoint(m, good));
    size_t np = tpu_model_num_params(m);
    float *w1 = weights(m, 0);
    static const struct {
        size_t at;
        uint64_t v;
        const char *want;
    } pos[] = {
        {8, UINT64_C(1) << 31, "epoch"},
        {8, UINT32_MAX, "epoch"},
        {8, UINT64_C(1) << 63, "epoch"},
        {0, UINT64_MAX, "step"},
        {24, UINT64_MAX, "iterations"},
        {16, UINT64_C(1) << 62, "batch"},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        reseal(good, bad, "position", pos[i].at, pos[i].v, NULL);
        tpu_status st = tpu_model_load_checkpoint(m, bad);
        cr_assert_eq(st, TPU_DATA_LOSS, "%s = %llu: %s: %s", pos[i].want, (unsigned long long)pos[i].v,
                     tpu_status_name(st), tpu_last_error());
        cr_assert(strstr(tpu_last_error(), bad) && strstr(tpu_last_error(), pos[i].want), "%s",
                  tpu_last_error());
    }
    const float nan = NAN, inf = INFINITY;
    /* the first kernel value, the last bias of the output layer, an Adam slot */
    struct {
        size_t at;
        const float *v;
        const char *want;
    } bad_state[] = {
        {0, &nan, "dense/kernel holds NaN"},
        {(np - 1) * 4, &inf, "dense_1/bias holds an infinity"},
        {(np + 3) * 4, &nan, "optimizer's m/dense/kernel"},
        {(2 * np + np - 1) * 4, &nan, "optimizer's v/dense_1/bias"},
    };
    for (size_t i = 0; i < sizeof bad_state / sizeof bad_state[0]; i++) {
        reseal(good, bad, "state", bad_state[i].at, 0, bad_state[i].v);
        tpu_status st = tpu_model_load_checkpoint(m, bad);
        cr_assert_eq(st, TPU_DATA_LOSS, "%s: %s: %s", bad_state[i].want, tpu_status_name(st), tpu_last_error());
        cr_assert(strstr(tpu_last_error(), bad_state[i].want), "'%s' not in: %s", bad_state[i].want,
                  tpu_last_error());
    }
    float *w2 = weights(m, 1);
    cr_assert_eq(first_diff(w1, w2, np), -1, "a refused checkpoint changed the weights");
    cr_assert_eq(tpu_model_step(m), 4u);

    /* in range for any run, but past this one's: resume at epoch 6 of 2 */
    reseal(good, bad, "position", 8, 5, NULL);
    CALL_OK(tpu_model_load_checkpoint(m, bad));
    tpu_fit_options ro = fitopts(2, NULL, 0);
    ro.resume = 1;
    tpu_status st = tpu_model_fit(m, ds, &ro, NULL);
    cr_assert_eq(st, TPU_OUT_OF_RANGE, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "epoch 6"), "%s", tpu_last_error());
    free(w1), free(w2);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* Sets a copy of src at dst to format version 1 and seals it with the
 * unkeyed checksum: a keyed checkpoint "downgraded" by someone who can write
 * the file. */
static void downgrade(const char *src, const char *dst)
{
    FILE *fp = fopen(src, "rb");
    cr_assert_not_null(fp);
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc(n);
    cr_assert(buf && fread(buf, 1, n, fp) == n);
    fclose(fp);
    buf[8] = 1;
    crypto_generichash(buf + n - 32, 32, buf, n - 32, NULL, 0);
    cr_assert_not_null(fp = fopen(dst, "wb"));
    cr_assert_eq(fwrite(buf, 1, n, fp), n);
    fclose(fp);
    free(buf);
}

static void expect_refused(tpu_model *m, const char *path, tpu_status want, const char *msg)
{
    tpu_status st = tpu_model_load_checkpoint(m, path);
    cr_assert_eq(st, want, "%s: want %s, got %s: %s", path, tpu_status_name(want), tpu_status_name(st),
                 tpu_last_error());
    cr_assert(strstr(tpu_last_error(), path) && strstr(tpu_last_error(), msg), "'%s' and '%s' not in: %s", path, msg,
              tpu_last_error());
}

/* On a cluster with a token, a checkpoint is sealed with a key derived from
 * it: it loads with that token; with another token, damaged, or changed and
 * sealed again with the unkeyed checksum (with or without the keyed
 * version) it is refused saying so, and changes nothing. An unkeyed file
 * loads only with TPUEMU_CHECKPOINT_ALLOW_UNKEYED=1. */
Test(train, checkpoint_sealed_with_the_cluster_token, .timeout = 60)
{
    colltest *t = ct_start_token(1, (int[]){2}, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(192, DIM, 1.0, 4);
    tpu_dataset *ds = make_ds(&b, 48, 1, 0);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_FLOAT32, 48);
    const char *good = tmp_path("k-good.ckpt"), *bad = tmp_path("k-bad.ckpt"), *other = tmp_path("k-token");
    tpu_model *m = make_model(s, DIM, 16, 5);
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    CALL_OK(tpu_model_save_checkpoint(m, good));
    size_t np = tpu_model_num_params(m);
    float *w1 = weights(m, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL)); /* move on from the checkpoint */
    float *w2 = weights(m, 1);
    cr_assert_neq(first_diff(w1, w2, np), -1);

    /* another cluster's token: the file is read before anything is sent */
    FILE *f = fopen(other, "w");
    cr_assert_not_null(f);
    fputs("another-cluster-token-fedcba9876543210\n", f);
    fclose(f);
    chmod(other, 0600);
    CALL_OK(tpu_resolver_set_token_file(t->r, other));
    expect_refused(m, good, TPU_UNAUTHENTICATED, "its seal does not match this cluster's token");
    CALL_OK(tpu_resolver_set_token_file(t->r, t->cl->token_file));

    flip_byte(good, bad, -1);
    expect_refused(m, bad, TPU_UNAUTHENTICATED, "changed or damaged");
    reseal(good, bad, "position", 8, 0, NULL); /* epoch 0, the unkeyed checksum */
    expect_refused(m, bad, TPU_UNAUTHENTICATED, "its seal does not match this cluster's token");
    downgrade(bad, bad);
    expect_refused(m, bad, TPU_UNAUTHENTICATED, "sealed with an unkeyed checksum only");
    float *w3 = weights(m, 1);
    cr_assert_eq(first_diff(w2, w3, np), -1, "a refused checkpoint changed the weights");
    cr_assert_eq(tpu_model_step(m), 8u);
    free(w3);

    /* an unkeyed file (as a cluster without a token writes) when the user says so */
    downgrade(good, bad);
    cr_assert_eq(setenv("TPUEMU_CHECKPOINT_ALLOW_UNKEYED", "1", 1), 0);
    tpu_status st = tpu_model_load_checkpoint(m, bad);
    unsetenv("TPUEMU_CHECKPOINT_ALLOW_UNKEYED");
    cr_assert_eq(st, TPU_OK, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_eq(tpu_model_step(m), 4u);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));

    CALL_OK(tpu_model_load_checkpoint(m, good));
    w3 = weights(m, 1);
    long d = first_diff(w1, w3, np);
    cr_assert_eq(d, -1, "after loading %s weight %ld is %a, it was saved as %a", good, d, (double)w3[d < 0 ? 0 : d],
                 (double)w1[d < 0 ? 0 : d]);
    cr_assert_eq(tpu_model_step(m), 4u);
    free(w1), free(w2), free(w3);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 5 ---- */

/* Cores of 32 MiB HBM: a Dense(4096) model with 4096 rows per core needs
 * 64 MiB of activations alone: RESOURCE_EXHAUSTED with the core's report,
 * which reads like XLA's TPU compile failure as TensorFlow shows it from a
 * Keras fit on Cloud TPU (XLA's TPU compiler; openxla/xla
 * docs/errors/error_1000.md, "Compile Time: HBM OOM"): "XLA:TPU compile permanent error. Ran
 * out of memory in memory space hbm. Used X of Y hbm. Exceeded hbm capacity
 * by Z." then "Total hbm usage >= T:" with its reserved, program and
 * arguments lines, whose sum is T; then the largest allocations, what to
 * change and which core. The same model at 64 rows per core (~14 MiB with the
 * all-reduce's buffers) compiles after it and trains. */
Test(train, compile_out_of_hbm_is_resource_exhausted, .timeout = 60)
{
    static const char *const wargs[] = {"--hbm-bytes", "32M", NULL};
    colltest *t = ct_start(1, (int[]){2}, wargs, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_model *m = make_model(s, DIM, 4096, 6);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.001f), TPU_POLICY_FLOAT32, 2 * 4096);
    tpu_status st = tpu_model_compile(m, &co);
    cr_assert_eq(st, TPU_RESOURCE_EXHAUSTED, "%s: %s", tpu_status_name(st), tpu_last_error());
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", tpu_last_error());
    fprintf(stderr, "out of HBM: %s\n", msg);
    cr_assert(strstr(msg, t->name[0]) || strstr(msg, t->name[1]), "the report should name the core (%s or %s): %s",
              t->name[0], t->name[1], msg);
    const char *lead = "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used ";
    cr_assert(strncmp(msg, lead, strlen(lead)) == 0, "XLA's report should lead: %s", msg);
    cr_assert(strstr(msg, " of 32.00M hbm. Exceeded hbm capacity by "), "%s", msg);
    /* the usage block: reserved + program + arguments = total, in MiB (2 decimals) */
    double total = 0, res = -1, prog = -1, args = -1;
    const char *tb = strstr(msg, "\n\nTotal hbm usage >= ");
    cr_assert_not_null(tb, "no usage block: %s", msg);
    cr_assert_eq(sscanf(tb, "\n\nTotal hbm usage >= %lfM:\n    reserved %lfB\n    program %lfM\n    arguments %lfM\n",
                        &total, &res, &prog, &args), 4, "the usage block does not read as expected: %s", msg);
    cr_assert_eq(res, 0, "nothing was on the cores before the compile: %s", msg);
    cr_assert(fabs(prog + args - total) <= 0.02, "%.2f + %.2f != %.2f: %s", prog, args, total, msg);
    cr_assert_gt(prog, 64, "the activations alone are 64 MiB of the program: %s", msg);
    cr_assert(strstr(msg, "Largest allocations in hbm:\n  1. "), "the report should list the largest allocations: %s",
              msg);
    cr_assert(strstr(msg, "smaller per-core batch"), "the report should say what to change: %s", msg);
    cr_assert(strstr(msg, "(compiling the model on core h0/"), "and where: %s", msg);

    co.batch_size = 2 * 64;
    CALL_OK(tpu_model_compile(m, &co));
    cr_assert_geq(tpu_model_hbm_capacity(m), 32000000u);
    cr_assert_leq(tpu_model_hbm_capacity(m), 32u << 20);
    cr_assert_gt(tpu_model_hbm_used(m), 0u);
    cr_assert_leq(tpu_model_hbm_used(m), tpu_model_hbm_capacity(m));
    blobs b = blobs_make(256, DIM, 1.0, 7);
    tpu_dataset *ds = make_ds(&b, 128, 1, 0);
    tpu_fit_options fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    cr_assert_eq(tpu_model_step(m), 2u);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 6 ---- */

typedef struct warns {
    int n;
    char last[512];
} warns;

static void on_warning(const char *message, void *user)
{
    warns *w = user;
    w->n++;
    snprintf(w->last, sizeof w->last, "%s", message);
}

/* 3 cores: a global batch of 100 is refused, suggesting a multiple of 3; 48
 * (16 per core, not a multiple of 128) trains with exactly one warning over
 * two fits and an evaluate; 384 (128 x 3) trains without one. */
Test(train, uneven_global_batch_refused_and_warning, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){3}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    static warns w;
    tpu_set_warning_handler(on_warning, &w);
    blobs b = blobs_make(768, DIM, 1.0, 8);
    tpu_model *m = make_model(s, DIM, 16, 9);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_FLOAT32, 0);
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo = fitopts(1, NULL, 0);

    tpu_dataset *d100 = make_ds(&b, 100, 1, 0);
    tpu_status st = tpu_model_fit(m, d100, &fo, NULL);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT, "batch 100 on 3 cores: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "100") && strstr(tpu_last_error(), "multiple of 3"),
              "the error should name the batch and suggest a multiple of 3: %s", tpu_last_error());
    cr_assert_eq(tpu_model_step(m), 0u);
    cr_assert_eq(w.n, 0, "a refused fit warned: %s", w.last);

    tpu_dataset *d48 = make_ds(&b, 48, 1, 0);
    CALL_OK(tpu_model_fit(m, d48, &fo, NULL));
    cr_assert_eq(tpu_model_step(m), 16u);
    CALL_OK(tpu_model_fit(m, d48, &fo, NULL));
    CALL_OK(tpu_model_evaluate(m, d48, NULL, NULL));
    cr_assert_eq(w.n, 1, "batch 48 on 3 cores: %d warnings (last: %s)", w.n, w.last);
    cr_assert(strstr(w.last, "48") && strstr(w.last, "384"), "the warning should name 48 and suggest 384: %s", w.last);

    tpu_dataset *d384 = make_ds(&b, 384, 1, 0);
    CALL_OK(tpu_model_fit(m, d384, &fo, NULL));
    cr_assert_eq(w.n, 1, "batch 384 on 3 cores warned: %s", w.last);
    tpu_set_warning_handler(ignore_warning, NULL);

    tpu_dataset_free(d100);
    tpu_dataset_free(d48);
    tpu_dataset_free(d384);
    tpu_model_free(m);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 7 ---- */

/* After training, evaluate's loss is the mean cross-entropy of predict's
 * probabilities (relative 1e-4: the cores compute the loss in float32 from
 * the same outputs) and its accuracy is exactly the fraction of rows whose
 * argmax is the label; evaluating twice gives the same numbers and leaves the
 * weights alone; every row's probabilities sum to 1; a buffer one row short
 * is OUT_OF_RANGE. 502 rows in batches of 48 without drop_remainder: the
 * last batch of 22 (11 per core) counts too. */
Test(train, evaluate_and_predict, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(502, DIM, 2.0, 10); /* overlapping: accuracy below 1 */
    tpu_dataset *train = make_ds(&b, 48, 1, 11);
    tpu_dataset *test = make_ds(&b, 48, 0, 0); /* 10 x 48 + 22 (11 per core) */
    tpu_model *m = make_model(s, DIM, 32, 12);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_FLOAT32, 48);
    CALL_OK(tpu_model_compile(m, &co));
    tpu_fit_options fo = fitopts(3, NULL, 0);
    tpu_history *h;
    CALL_OK(tpu_model_fit(m, train, &fo, &h));
    tpu_logs last;
    CALL_OK(tpu_history_epoch(h, 2, &last));
    tpu_history_free(h);

    size_t np = tpu_model_num_params(m);
    float *w0 = weights(m, 0);
    double loss, acc, loss2, acc2;
    CALL_OK(tpu_model_evaluate(m, test, &loss, &acc));
    CALL_OK(tpu_model_evaluate(m, test, &loss2, &acc2));
    cr_assert(memcmp(&loss, &loss2, sizeof loss) == 0 && memcmp(&acc, &acc2, sizeof acc) == 0,
              "evaluate twice: %.17g/%.17g then %.17g/%.17g", loss, acc, loss2, acc2);
    float *w1 = weights(m, 1);
    cr_assert_eq(first_diff(w0, w1, np), -1, "evaluate changed the weights");
    cr_assert(isfinite(loss) && loss > 0, "loss %g", loss);
    /* the training metric ran over changing weights; it is in the same region */
    cr_assert(fabs(acc - last.accuracy) < 0.1, "evaluate's accuracy %g, the last epoch's %g", acc, last.accuracy);
    cr_assert(acc > 0.5 && acc < 1.0, "accuracy %g (4 overlapping blobs)", acc);

    float *p = malloc(b.n * CLASSES * sizeof(float));
    size_t rows = 0;
    cr_assert_not_null(p);
    tpu_dataset *px;
    CALL_OK(tpu_dataset_from_tensor_slices(b.x, b.n, b.d, NULL, TPU_LABELS_NONE, 0, 0, &px));
    CALL_OK(tpu_dataset_batch(px, 48, 0));
    CALL_OK(tpu_model_predict(m, px, p, b.n, &rows));
    cr_assert_eq(rows, b.n);
    double ce = 0;
    size_t correct = 0;
    for (size_t i = 0; i < b.n; i++) {
        double sum = 0;
        int arg = 0;
        for (int k = 0; k < CLASSES; k++) {
            float v = p[i * CLASSES + k];
            cr_assert(v >= 0 && v <= 1, "row %zu class %d: probability %g", i, k, (double)v);
            sum += v;
            if (v > p[i * CLASSES + arg])
                arg = k;
        }
        cr_assert(fabs(sum - 1) <= 1e-5, "row %zu: probabilities sum to %.9g", i, sum);
        correct += arg == b.y[i];
        ce -= log(fmax(p[i * CLASSES + b.y[i]], 1e-30));
    }
    ce /= (double)b.n;
    double pacc = (double)correct / (double)b.n;
    fprintf(stderr, "evaluate: loss %.9g accuracy %.6f; from predict: %.9g %.6f\n", loss, acc, ce, pacc);
    cr_assert(fabs(ce - loss) <= 1e-4 * loss, "evaluate's loss %.9g, predict's cross-entropy %.9g", loss, ce);
    cr_assert(fabs(pacc - acc) < 0.5 / (double)b.n, "evaluate's accuracy %.9g, predict's argmax %.9g", acc, pacc);

    /* predict on the labelled dataset gives the same rows */
    float *p2 = malloc(b.n * CLASSES * sizeof(float));
    cr_assert_not_null(p2);
    CALL_OK(tpu_model_predict(m, test, p2, b.n, &rows));
    cr_assert_eq(rows, b.n);
    cr_assert_eq(first_diff(p, p2, b.n * CLASSES), -1, "predict differs with and without labels");

    tpu_status st = tpu_model_predict(m, px, p2, b.n - 1, &rows);
    cr_assert_eq(st, TPU_OUT_OF_RANGE, "room for %zu of %zu rows: %s: %s", b.n - 1, b.n, tpu_status_name(st),
                 tpu_last_error());
    /* and the model still works after it */
    CALL_OK(tpu_model_evaluate(m, test, &loss2, NULL));
    cr_assert(memcmp(&loss, &loss2, sizeof loss) == 0, "evaluate after a refused predict: %.17g, %.17g", loss, loss2);

    free(p), free(p2), free(w0), free(w1);
    tpu_dataset_free(px);
    tpu_dataset_free(train);
    tpu_dataset_free(test);
    tpu_model_free(m);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* what evaluate's and predict's callbacks saw */
typedef struct pass_log {
    int begins, ends;
    size_t batch_begins, batch_ends, last_batch;
    double end_loss;
    int cancel_after; /* on_batch_end returns TPU_CANCELLED after this batch (-1: never) */
} pass_log;

static tpu_status pass_begin(tpu_model *m, void *user)
{
    (void)m;
    ((pass_log *)user)->begins++;
    return TPU_OK;
}

static tpu_status pass_batch_begin(tpu_model *m, int epoch, size_t batch, void *user)
{
    pass_log *l = user;
    (void)m;
    cr_assert_eq(epoch, 0);
    cr_assert_eq(batch, l->batch_begins, "on_batch_begin %zu after %zu begins", batch, l->batch_begins);
    l->batch_begins++;
    return TPU_OK;
}

static tpu_status pass_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *lg, void *user)
{
    pass_log *l = user;
    (void)m, (void)epoch, (void)lg;
    l->batch_ends++;
    l->last_batch = batch;
    return l->cancel_after >= 0 && batch >= (size_t)l->cancel_after ? TPU_CANCELLED : TPU_OK;
}

static tpu_status pass_end(tpu_model *m, const tpu_logs *lg, void *user)
{
    pass_log *l = user;
    (void)m;
    l->ends++;
    l->end_loss = lg->loss;
    return TPU_OK;
}

static tpu_status pass_fail(tpu_model *m, int epoch, size_t batch, const tpu_logs *lg, void *user)
{
    (void)m, (void)epoch, (void)lg, (void)user;
    return batch == 2 ? TPU_ABORTED : TPU_OK;
}

/* Keras' evaluate(callbacks=) and predict(callbacks=): begin, every batch
 * (exactly the dataset's batches), end with evaluate's logs; TPU_CANCELLED
 * ends the pass early; another status fails the call with it. */
Test(train, evaluate_and_predict_take_callbacks, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(480, DIM, 2.0, 10);
    tpu_dataset *test = make_ds(&b, 48, 0, 0); /* 10 batches */
    tpu_model *m = make_model(s, DIM, 32, 12);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.01f), TPU_POLICY_FLOAT32, 48);
    CALL_OK(tpu_model_compile(m, &co));

    pass_log l = {.cancel_after = -1};
    tpu_callback cb = {.on_train_begin = pass_begin,
                       .on_batch_begin = pass_batch_begin,
                       .on_batch_end = pass_batch_end,
                       .on_train_end = pass_end,
                       .user = &l};
    tpu_eval_options eo;
    tpu_eval_options_init(&eo);
    cr_assert(eo.callbacks == NULL && eo.num_callbacks == 0);
    eo.callbacks = &cb;
    eo.num_callbacks = 1;
    double loss, acc, loss0;
    CALL_OK(tpu_model_evaluate(m, test, &loss0, NULL));
    CALL_OK(tpu_model_evaluate_with(m, test, &eo, &loss, &acc));
    cr_assert(memcmp(&loss, &loss0, sizeof loss) == 0, "with callbacks %.17g, without %.17g", loss, loss0);
    cr_assert(l.begins == 1 && l.ends == 1, "begin %d, end %d", l.begins, l.ends);
    cr_assert(l.batch_begins == 10 && l.batch_ends == 10 && l.last_batch == 9, "batches: %zu begun, %zu ended",
              l.batch_begins, l.batch_ends);
    cr_assert(memcmp(&l.end_loss, &loss, sizeof loss) == 0, "on_train_end's loss %g, evaluate's %g", l.end_loss, loss);

    float *p = malloc(b.n * CLASSES * sizeof(float));
    size_t rows = 0;
    cr_assert_not_null(p);
    memset(&l, 0, sizeof l);
    l.cancel_after = 3;
    CALL_OK(tpu_model_predict_with(m, test, &eo, p, b.n, &rows));
    /* the executions already in flight (infeed depth 2) still end */
    cr_assert(l.begins == 1 && l.ends == 1 && l.batch_ends >= 4 && l.batch_ends <= 6,
              "cancelled after batch 3: %zu batches ended", l.batch_ends);
    cr_assert(rows == l.batch_ends * 48, "a pass cancelled after %zu of 10 batches gave %zu rows", l.batch_ends, rows);
    cr_assert(isnan(l.end_loss), "predict's logs carry no loss");

    memset(&l, 0, sizeof l);
    cb.on_batch_end = pass_fail;
    tpu_status st = tpu_model_evaluate_with(m, test, &eo, &loss, NULL);
    cr_assert_eq(st, TPU_ABORTED, "a hook's status: %s: %s", tpu_status_name(st), tpu_last_error());
    /* the model works after it; the plain calls take no callbacks */
    CALL_OK(tpu_model_evaluate_with(m, test, NULL, &loss, NULL));
    cr_assert(memcmp(&loss, &loss0, sizeof loss) == 0);
    eo.callbacks = NULL;
    cr_assert_eq(tpu_model_evaluate_with(m, test, &eo, &loss, NULL), TPU_INVALID_ARGUMENT);

    free(p);
    tpu_dataset_free(test);
    tpu_model_free(m);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 8 ---- */

#define KILL_HB_MS 200
typedef struct killer {
    colltest *t;
    int victim; /* replica */
    int epoch;
    size_t batch;
    int64_t at; /* ms, when it was killed */
} killer;

static tpu_status kill_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    killer *k = user;
    (void)m, (void)l;
    if (!k->at && epoch == k->epoch && batch == k->batch) {
        k->at = cl_now_ms();
        cluster_kill_worker(k->t->cl, k->t->worker_of[k->victim]);
    }
    return TPU_OK;
}

static int is_back(cluster *c, void *arg)
{
    int i = *(int *)arg;
    uint32_t pid = 0;
    tpu_core_state s = cluster_core_state(c, c->workers[i].host, c->workers[i].core, &pid);
    return (s == TPU_CORE_IDLE || s == TPU_CORE_READY) && pid == (uint32_t)c->workers[i].pid;
}

/* 4 cores on 2 hosts, a checkpoint every epoch; kill -9 core h1/0 after
 * batch 5 of epoch 1: fit is UNAVAILABLE naming h1/0 within the heartbeat
 * bound (200 ms x 3 here; a killed core's connections close at once) plus
 * 2 s of slack for a loaded machine. The worker restarted, the system
 * re-initialized, the model compiled again and the checkpoint loaded, fit
 * finishes the 3 epochs with the weights of a run that was never
 * interrupted (same 4 cores). */
Test(train, core_killed_mid_fit_is_unavailable_naming_it, .timeout = 90)
{
    colltest *t = ct_start(2, (int[]){2, 2}, NULL, KILL_HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(480, DIM, 1.5, 13);
    tpu_dataset *ds = make_ds(&b, 48, 1, 14);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.005f), TPU_POLICY_MIXED_BFLOAT16, 48);

    /* the uninterrupted run */
    tpu_model *ref = make_model(s, DIM, 32, 15);
    CALL_OK(tpu_model_compile(ref, &co));
    size_t np = tpu_model_num_params(ref);
    tpu_fit_options fo = fitopts(3, NULL, 0);
    CALL_OK(tpu_model_fit(ref, ds, &fo, NULL));
    float *wref = weights(ref, 0);
    tpu_model_free(ref);

    int victim = -1;
    for (int r = 0; r < t->n; r++)
        if (!strcmp(t->name[r], "h1/0"))
            victim = r;
    cr_assert_geq(victim, 0, "no replica on h1/0");
    const char *path = tmp_path("kill.ckpt");
    tpu_model *m = make_model(s, DIM, 32, 15);
    CALL_OK(tpu_model_compile(m, &co));
    static killer k;
    k = (killer){t, victim, 1, 5, 0};
    tpu_callback cbs[2];
    CALL_OK(tpu_callback_checkpoint(path, 0, &cbs[0]));
    memset(&cbs[1], 0, sizeof cbs[1]);
    cbs[1].on_batch_end = kill_batch_end;
    cbs[1].user = &k;
    fo = fitopts(3, cbs, 2);
    tpu_history *h;
    tpu_status st = tpu_model_fit(m, ds, &fo, &h);
    int64_t took = cl_now_ms() - k.at;
    cr_assert_neq(k.at, 0, "the fit never reached epoch 1 batch 5");
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", tpu_last_error());
    fprintf(stderr, "fit after kill -9 of %s: %s after %lld ms: %s\n", t->name[victim], tpu_status_name(st),
            (long long)took, msg);
    cr_assert_eq(st, TPU_UNAVAILABLE, "%s: %s", tpu_status_name(st), msg);
    cr_assert(strstr(msg, "h1/0"), "the error should name the killed core h1/0: %s", msg);
    cr_assert_leq(took, 3 * KILL_HB_MS + 2000, "fit failed %lld ms after the kill", (long long)took);
    cr_assert_eq(tpu_history_num_epochs(h), 1u, "the history should hold the finished epoch 0");
    tpu_history_free(h);

    /* restart, re-initialize, compile, load, finish */
    int w = t->worker_of[victim];
    cluster_restart_worker(t->cl, w);
    cr_assert(cluster_wait_until(is_back, t->cl, &w, 15000), "the restarted worker did not register");
    ct_reinit(t);
    cr_assert_eq(t->n, 4);
    CALL_OK(tpu_model_compile(m, &co));
    CALL_OK(tpu_model_load_checkpoint(m, path));
    cr_assert_eq(tpu_model_epoch(m), 1);
    cr_assert_eq(tpu_model_step(m), 10u);
    fo = fitopts(3, &cbs[0], 1);
    fo.resume = 1;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    cr_assert_eq(tpu_history_num_epochs(h), 2u);
    tpu_history_free(h);
    cr_assert_eq(tpu_model_step(m), 30u);
    cr_assert_eq(tpu_model_epoch(m), 3);
    for (int r = 0; r < t->n; r++) {
        float *wr = weights(m, r);
        long d = first_diff(wref, wr, np);
        cr_assert_eq(d, -1, "replica %d (%s): weight %ld is %a, the uninterrupted run's %a", r, t->name[r], d,
                     (double)wr[d < 0 ? 0 : d], (double)wref[d < 0 ? 0 : d]);
        free(wr);
    }
    tpu_callback_free(&cbs[0]);
    free(wref);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 9 ---- */

#define SLOW_MAP_MS 20
#define SLOW_STEP_MS 40
static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int slow_map(float *x, void *y, size_t rows, size_t x_dim, void *user)
{
    (void)x, (void)y, (void)rows, (void)x_dim, (void)user;
    sleep_ms(SLOW_MAP_MS);
    return 0;
}

/* the recorder, then SLOW_STEP_MS more per batch: a slow step that costs no CPU */
static tpu_status slow_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    tpu_status st = rec_batch_end(m, epoch, batch, l, user);
    sleep_ms(SLOW_STEP_MS);
    return st;
}

static double time_fit(tpu_model *m, tpu_dataset *ds, rec *r)
{
    tpu_callback cb;
    memset(r, 0, sizeof *r);
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = slow_batch_end;
    cb.user = r;
    tpu_fit_options fo = fitopts(tpu_model_epoch(m) + 1, &cb, 1);
    fo.initial_epoch = tpu_model_epoch(m);
    int64_t t0 = cl_now_ms();
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    cr_assert_eq(r->n, tpu_dataset_num_batches(ds));
    return (double)(cl_now_ms() - t0);
}

static uint64_t median_wait(const rec *r)
{
    uint64_t v[REC_MAX];
    size_t n = 0;
    for (size_t i = 1; i < r->n; i++) /* the first batch has nothing to overlap with */
        v[n++] = r->input_wait_ns[i];
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint64_t x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n ? v[n / 2] : 0;
}

/* A map that sleeps 20 ms per batch, and a loop that spends 40 ms per batch
 * elsewhere (an on_batch_end that sleeps: a slow step that takes no CPU from
 * the shared machine). Without prefetch fit waits for the map every batch
 * (input wait >= 20 ms: the sleep is a floor the scheduler can only raise) and
 * each batch costs 20 + 40 ms + the step; with prefetch(4) the background
 * thread, twice as fast as the loop, has the next batch ready (median input
 * wait under 1 ms) and a batch costs 40 ms + the step: the whole fit takes
 * clearly less. Expected 0.67x of the time without prefetch when the steps
 * are fast, and under 0.85x (the bound) as long as a step takes under 90 ms,
 * which it does on the most loaded machine (a few ms here). */
Test(train, prefetch_overlaps, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(1440, DIM, 1.0, 16);
    tpu_dataset *plain = make_ds(&b, 48, 1, 0), *pre = make_ds(&b, 48, 1, 0); /* 30 batches */
    CALL_OK(tpu_dataset_map(plain, slow_map, NULL));
    CALL_OK(tpu_dataset_map(pre, slow_map, NULL));
    CALL_OK(tpu_dataset_prefetch(pre, 4));
    tpu_model *m = make_model(s, DIM, 32, 17);
    tpu_compile_options co = copts(tpu_optimizer_adam(0.001f), TPU_POLICY_FLOAT32, 48);
    CALL_OK(tpu_model_compile(m, &co));
    static rec r;
    double t_plain = time_fit(m, plain, &r);
    uint64_t w_plain = median_wait(&r);
    double t_pre = time_fit(m, pre, &r);
    uint64_t w_pre = median_wait(&r);
    fprintf(stderr, "prefetch: 30 batches, %d ms map + %d ms loop: %.0f ms (median input wait %.2f ms) without, "
            "%.0f ms (%.2f ms) with prefetch(4)\n", SLOW_MAP_MS, SLOW_STEP_MS, t_plain, (double)w_plain / 1e6, t_pre,
            (double)w_pre / 1e6);
    cr_assert_geq(w_plain, (uint64_t)SLOW_MAP_MS * 1000000u * 9 / 10,
                  "without prefetch the median input wait is %.2f ms; the map alone sleeps %d ms",
                  (double)w_plain / 1e6, SLOW_MAP_MS);
    cr_assert_lt(w_pre, 1000000u, "with prefetch the median input wait is %.2f ms (without: %.2f ms)",
                 (double)w_pre / 1e6, (double)w_plain / 1e6);
    cr_assert_lt(t_pre, 0.85 * t_plain, "with prefetch fit took %.0f ms, without %.0f ms", t_pre, t_plain);
    tpu_model_free(m);
    tpu_dataset_free(plain);
    tpu_dataset_free(pre);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 10 ---- */

/* warns, counting only the warnings about initializing the system again */
static void on_reinit_warning(const char *message, void *user)
{
    if (strstr(message, "TPU system") && strstr(message, "initialized"))
        on_warning(message, user);
}

/* Re-initializing the TPU system under a trained model, as TensorFlow does it:
 *  - tensorflow/python/tpu/tpu_strategy_util.py, initialize_tpu_system: a TPU
 *    system initialized already earns the warning "TPU system %s has already
 *    been initialized. Reinitializing the TPU can cause previously created
 *    variables on TPU to be lost." (the first initialize earns none);
 *  - the variables are then gone from the cores, and TensorFlow reading a
 *    variable whose device state is gone fails with FailedPreconditionError
 *    (tensorflow/core/kernels/resource_variable_ops.cc, ReadVariablesOp: "the
 *    following variables were found uninitialized"): fit, evaluate,
 *    get_weights and a checkpoint save are FAILED_PRECONDITION saying the
 *    variables were lost, and change nothing (the step, the file);
 *  - restoring a checkpoint goes on exactly where the straight run goes
 *    (bitwise the same weights after the next epoch), and an explicit compile
 *    starts again from the seed at step 0 (bitwise the first epoch's weights
 *    again after one epoch). */
Test(train, reinitializing_loses_the_variables_until_restored, .timeout = 90)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(480, DIM, 1.5, 21);
    tpu_dataset *ds = make_ds(&b, 48, 1, 22); /* 10 steps per epoch */
    tpu_compile_options co = copts(tpu_optimizer_adam(0.005f), TPU_POLICY_FLOAT32, 48);
    static warns w;
    w.n = 0;
    tpu_set_warning_handler(on_reinit_warning, &w); /* batch 48 earns another warning */

    /* the straight run: 2 epochs, the weights after each */
    tpu_model *ref = make_model(s, DIM, 32, 23);
    CALL_OK(tpu_model_compile(ref, &co));
    size_t np = tpu_model_num_params(ref);
    tpu_fit_options fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(ref, ds, &fo, NULL));
    float *w1 = weights(ref, 0);
    fo = fitopts(2, NULL, 0);
    fo.initial_epoch = 1;
    CALL_OK(tpu_model_fit(ref, ds, &fo, NULL));
    float *w2 = weights(ref, 0);
    tpu_model_free(ref);

    /* one epoch, saved; then the system initialized again */
    const char *path = tmp_path("reinit.ckpt");
    tpu_model *m = make_model(s, DIM, 32, 23);
    CALL_OK(tpu_model_compile(m, &co));
    fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    CALL_OK(tpu_model_save_checkpoint(m, path));
    cr_assert_eq(tpu_model_step(m), 10u);
    cr_assert_eq(w.n, 0, "no initialize again yet, but a warning: %s", w.last);
    ct_reinit(t);
    cr_assert_eq(w.n, 1, "initializing again should warn once (%d warnings; last: %s)", w.n, w.last);
    char expect[512];
    snprintf(expect, sizeof expect, "TPU system %s has already been initialized. Reinitializing the TPU can cause "
             "previously created variables on TPU to be lost.", tpu_resolver_master(t->r));
    cr_assert(strncmp(w.last, expect, strlen(expect)) == 0, "the warning is not TensorFlow's: %s", w.last);

    /* every use of the lost variables is refused, changing nothing */
    struct stat st0, st1;
    cr_assert_eq(stat(path, &st0), 0);
    fo = fitopts(2, NULL, 0);
    fo.initial_epoch = 1;
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    cr_assert_eq(st, TPU_FAILED_PRECONDITION, "fit on lost variables: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "variables on the TPU were lost") &&
              strstr(tpu_last_error(), "dense/kernel") && strstr(tpu_last_error(), "tpu_model_load_checkpoint") &&
              strstr(tpu_last_error(), "tpu_model_compile"),
              "the error should say they were lost, which, and the ways back: %s", tpu_last_error());
    cr_assert_eq(tpu_model_step(m), 10u, "a refused fit moved the step");
    cr_assert_eq(tpu_model_evaluate(m, ds, NULL, NULL), TPU_FAILED_PRECONDITION, "evaluate: %s", tpu_last_error());
    float *scratch = malloc(np * sizeof(float));
    cr_assert_not_null(scratch);
    cr_assert_eq(tpu_model_get_weights(m, 0, scratch, np), TPU_FAILED_PRECONDITION, "get_weights: %s",
                 tpu_last_error());
    cr_assert_eq(tpu_model_save_checkpoint(m, path), TPU_FAILED_PRECONDITION, "save: %s", tpu_last_error());
    cr_assert_eq(stat(path, &st1), 0);
    cr_assert(st0.st_mtim.tv_sec == st1.st_mtim.tv_sec && st0.st_mtim.tv_nsec == st1.st_mtim.tv_nsec &&
              st0.st_size == st1.st_size, "a refused save touched the checkpoint");

    /* restored: the next epoch is the straight run's */
    CALL_OK(tpu_model_load_checkpoint(m, path));
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    cr_assert_eq(tpu_model_step(m), 20u);
    float *wr = weights(m, 0);
    long d = first_diff(w2, wr, np);
    cr_assert_eq(d, -1, "after the restore and epoch 2, weight %ld is %a, the straight run's %a", d,
                 (double)wr[d < 0 ? 0 : d], (double)w2[d < 0 ? 0 : d]);
    free(wr);

    /* initialized again; compiled again: from the seed, at step 0 */
    ct_reinit(t);
    cr_assert_eq(w.n, 2, "%d warnings; last: %s", w.n, w.last);
    CALL_OK(tpu_model_compile(m, &co));
    cr_assert_eq(tpu_model_step(m), 0u, "a compile from the seed starts the count again");
    cr_assert_eq(tpu_model_epoch(m), 0);
    fo = fitopts(1, NULL, 0);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    cr_assert_eq(tpu_model_step(m), 10u);
    wr = weights(m, 0);
    d = first_diff(w1, wr, np);
    cr_assert_eq(d, -1, "one epoch from the seed again: weight %ld is %a, the first epoch's %a", d,
                 (double)wr[d < 0 ? 0 : d], (double)w1[d < 0 ? 0 : d]);
    free(wr);
    tpu_set_warning_handler(ignore_warning, NULL);

    free(scratch), free(w1), free(w2);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}
