/* Custom training loops through real workers and libtpuclient's public
 * TPUStrategy API (tpuemu/model.h): what a user of
 * experimental_distribute_dataset, distribute_datasets_from_function,
 * strategy.run, strategy.reduce and experimental_local_results checks,
 * against TensorFlow's behaviour:
 *
 *  - each replica's shard is the one tf.data's rebatch gives it (full and
 *    partial batches, a hand computation on 11 rows);
 *  - reduce SUM and MEAN, over replicas and over the batch, give the exact
 *    values (integer-valued data), and the steps' per-replica values agree
 *    with evaluate and predict;
 *  - a custom loop of train steps leaves bitwise the weights fit leaves after
 *    the same steps on the same data;
 *  - bad arguments are refused, saying what is wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "colltest.h"

#define HB_MS 500
#define CLASSES 4

QUIET_WARNINGS()

/* ---- data ---- */

/* n rows of 2 features, row i = (i, 100 + i), label i % CLASSES */
static tpu_dataset *rows_ds(size_t n, size_t batch, int drop)
{
    float *x = malloc(n * 2 * sizeof(float));
    int32_t *y = malloc(n * sizeof(int32_t));
    tpu_dataset *ds;
    cr_assert(x && y);
    for (size_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = (float)(100 + i);
        y[i] = (int32_t)(i % CLASSES);
    }
    CALL_OK(tpu_dataset_from_tensor_slices(x, n, 2, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    free(x);
    free(y);
    if (batch)
        CALL_OK(tpu_dataset_batch(ds, batch, drop));
    return ds;
}

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n rows of d features in CLASSES separable blobs (label i % CLASSES) */
typedef struct blobs {
    float *x;
    int32_t *y;
    size_t n, d;
} blobs;

static blobs blobs_make(size_t n, size_t d, uint64_t seed)
{
    blobs b = {malloc(n * d * sizeof(float)), malloc(n * sizeof(int32_t)), n, d};
    cr_assert(b.x && b.y);
    for (size_t i = 0; i < n; i++) {
        int k = (int)(i % CLASSES);
        b.y[i] = k;
        for (size_t j = 0; j < d; j++) {
            double u = (double)(sm64(&seed) >> 11) / 9007199254740992.0 - 0.5;
            b.x[i * d + j] = (float)((j % CLASSES == (size_t)k ? 2.0 : 0.0) + u);
        }
    }
    return b;
}

static void blobs_free(blobs *b)
{
    free(b->x);
    free(b->y);
}

static tpu_dataset *blobs_ds(const blobs *b, size_t batch, uint64_t shuffle_seed)
{
    tpu_dataset *ds;
    CALL_OK(tpu_dataset_from_tensor_slices(b->x, b->n, b->d, b->y, TPU_LABELS_SPARSE, 1, 0, &ds));
    if (shuffle_seed)
        CALL_OK(tpu_dataset_shuffle(ds, b->n, shuffle_seed));
    CALL_OK(tpu_dataset_batch(ds, batch, 1));
    return ds;
}

static tpu_model *make_model(tpu_strategy *s, size_t in, uint64_t seed)
{
    tpu_model *m;
    CALL_OK(tpu_model_new(s, in, &m));
    CALL_OK(tpu_model_add_dense(m, 16, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, seed));
    return m;
}

static void compile(tpu_model *m, tpu_optimizer opt, size_t batch)
{
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = opt;
    co.metrics_accuracy = 1;
    co.batch_size = batch;
    CALL_OK(tpu_model_compile(m, &co));
}

/* Checks that x (an input of n replicas) has, on replica r, the rows listed
 * in want[r] (-1 ends a list) of rows_ds's data. */
static void check_shards(tpu_strategy *s, const tpu_per_replica *x, int n, const int want[][8], const char *what)
{
    tpu_local_value lv[8];
    size_t got;
    cr_assert_eq(tpu_per_replica_num_replicas(x), n);
    CALL_OK(tpu_strategy_experimental_local_results(s, x, lv, 8, &got));
    cr_assert_eq(got, (size_t)n);
    for (int r = 0; r < n; r++) {
        size_t k = 0;
        while (want[r][k] >= 0)
            k++;
        cr_assert_eq(lv[r].rank, 2);
        cr_assert_eq(lv[r].dims[0], k, "%s: replica %d has %zu rows, TensorFlow gives it %zu", what, r, lv[r].dims[0], k);
        cr_assert_eq(lv[r].dims[1], 2u);
        cr_assert_null(lv[r].v);
        for (size_t i = 0; i < k; i++) {
            cr_assert_eq(lv[r].x[2 * i], (float)want[r][i], "%s: replica %d row %zu is data row %g, not %d", what, r,
                         i, (double)lv[r].x[2 * i], want[r][i]);
            cr_assert_eq(lv[r].x[2 * i + 1], (float)(100 + want[r][i]));
            cr_assert_eq(((const int32_t *)lv[r].y)[i], want[r][i] % CLASSES);
        }
    }
}

/* ---- 1 ---- */

/* strategy.experimental_distribute_dataset splits every global batch with
 * tf.data's rebatch and batch_sizes_for_worker(global_batch, 1, replicas, 0)
 * (tensorflow/python/data/experimental/ops/distribute.py: the first
 * global mod replicas shards have floor + 1 rows, the rest floor), in replica
 * order (tensorflow/python/distribute/input_lib.py); a last partial batch is
 * taken by the replicas in order up to their sizes, the others get an empty
 * shard (distribute.py's _RebatchDataset, kernel test testPartialBatch and
 * testEmptySplits in rebatch_dataset_test.py). 11 rows, batch(5), 3 replicas:
 * sizes [2, 2, 1]; steps {0 1 | 2 3 | 4}, {5 6 | 7 8 | 9}, {10 | - | -}.
 * Iterating again is the next pass. A train step on the partial batch runs
 * with the empty shards (TensorFlow's replicas get zero-row tensors) and the
 * replicas stay identical. reduce of the input per replica (a
 * PerReplica of x, as TensorFlow reduces any per-replica tensor,
 * tensorflow/python/distribute/distribute_lib.py StrategyBase.reduce): axis 0
 * SUM sums the global batch's rows, MEAN divides by its 5 rows; across
 * replicas (axis None) the shapes 2, 2, 1 differ and it is refused. */
Test(strategy, distribute_dataset_shards_as_tensorflow, .timeout = 90)
{
    colltest *t = ct_start(1, (int[]){3}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_dataset *ds = rows_ds(11, 5, 0);
    tpu_dist_dataset *dd;
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    tpu_model *m = make_model(s, 2, 3);
    compile(m, tpu_optimizer_sgd(0.01f, 0), 5);
    static const int want[3][3][8] = {
        {{0, 1, -1}, {2, 3, -1}, {4, -1}},
        {{5, 6, -1}, {7, 8, -1}, {9, -1}},
        {{10, -1}, {-1}, {-1}},
    };
    for (int pass = 0; pass < 2; pass++) {
        tpu_dist_iter *it;
        tpu_per_replica *x;
        CALL_OK(tpu_dist_dataset_iter(dd, &it));
        for (int step = 0; step < 3; step++) {
            char what[64];
            snprintf(what, sizeof what, "pass %d step %d", pass, step);
            CALL_OK(tpu_dist_iter_next(it, &x));
            cr_assert_not_null(x, "%s: the iterator ended early", what);
            check_shards(s, x, 3, want[step], what);
            if (step == 0) {
                double out[2];
                size_t got;
                CALL_OK(tpu_strategy_reduce(s, TPU_SUM, x, 0, out, 2, &got));
                cr_assert_eq(got, 2u);
                cr_assert_eq(out[0], 0 + 1 + 2 + 3 + 4.0);
                cr_assert_eq(out[1], 500 + 10.0);
                CALL_OK(tpu_strategy_reduce(s, TPU_MEAN, x, 0, out, 2, &got));
                cr_assert_eq(out[0], 2.0);
                cr_assert_eq(out[1], 102.0);
                cr_assert_eq(tpu_strategy_reduce(s, TPU_SUM, x, TPU_AXIS_NONE, out, 2, &got), TPU_INVALID_ARGUMENT);
                cr_assert(strstr(tpu_last_error(), "same shape"), "%s", tpu_last_error());
            }
            if (step == 2) { /* one row on replica 0 of a partial batch: MEAN over the batch divides by 1 */
                double out[2];
                size_t got;
                CALL_OK(tpu_strategy_reduce(s, TPU_MEAN, x, 0, out, 2, &got));
                cr_assert_eq(out[0], 10.0);
                cr_assert_eq(out[1], 110.0);
                if (pass == 0) { /* a train step with empty shards: replicas 1, 2 add no gradient */
                    tpu_step_outputs o;
                    tpu_local_value lv[3];
                    CALL_OK(tpu_strategy_run(s, TPU_STEP_TRAIN, m, x, &o));
                    CALL_OK(tpu_strategy_experimental_local_results(s, o.examples, lv, 3, &got));
                    cr_assert(lv[0].v[0] == 1 && lv[1].v[0] == 0 && lv[2].v[0] == 0, "examples %g %g %g",
                              lv[0].v[0], lv[1].v[0], lv[2].v[0]);
                    CALL_OK(tpu_strategy_experimental_local_results(s, o.loss_sum, lv, 3, &got));
                    cr_assert(isfinite(lv[0].v[0]) && lv[0].v[0] > 0 && lv[1].v[0] == 0 && lv[2].v[0] == 0,
                              "loss sums %g %g %g", lv[0].v[0], lv[1].v[0], lv[2].v[0]);
                    tpu_step_outputs_free(&o);
                    size_t np = tpu_model_num_params(m);
                    float *w0 = malloc(np * sizeof(float)), *w = malloc(np * sizeof(float));
                    cr_assert(w0 && w);
                    CALL_OK(tpu_model_get_weights(m, 0, w0, np));
                    for (int r = 1; r < 3; r++) {
                        CALL_OK(tpu_model_get_weights(m, r, w, np));
                        cr_assert(memcmp(w, w0, np * sizeof(float)) == 0, "replica %d differs after the step", r);
                    }
                    free(w0);
                    free(w);
                }
            }
            tpu_per_replica_free(x);
        }
        CALL_OK(tpu_dist_iter_next(it, &x));
        cr_assert_null(x, "pass %d: more than 3 steps from 11 rows in batches of 5", pass);
        tpu_dist_iter_free(it);
    }
    tpu_dist_dataset_free(dd);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 2 ---- */

static int fn_calls;
static tpu_input_context fn_ctx;

static tpu_status per_replica_fn(const tpu_input_context *ctx, void *user, tpu_dataset **out)
{
    size_t per = tpu_input_context_per_replica_batch_size(ctx, *(const size_t *)user);
    fn_calls++;
    fn_ctx = *ctx;
    if (!per)
        return tpu_last_status();
    *out = rows_ds(11, per, 0);
    return TPU_OK;
}

/* strategy.distribute_datasets_from_function(fn) calls fn once per input
 * pipeline with an InputContext (num_input_pipelines 1, input_pipeline_id 0,
 * num_replicas_in_sync; tensorflow/python/distribute/distribute_lib.py
 * InputContext), whose get_per_replica_batch_size(global) is global /
 * replicas and raises ValueError when it does not divide; the function's
 * dataset is batched per replica and on one worker its consecutive batches go
 * to the replicas in turn (input_lib.py's DistributedDatasetsFromFunction);
 * replicas past the last batch get empty shards. Global 6 over 3 replicas:
 * batch(2) of 11 rows: {0 1 | 2 3 | 4 5}, {6 7 | 8 9 | 10}. Equal shapes:
 * reduce across replicas (axis None) adds row by row, MEAN divides by 3. */
Test(strategy, datasets_from_function, .timeout = 90)
{
    colltest *t = ct_start(1, (int[]){3}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    size_t global = 6;
    tpu_dist_dataset *dd;
    fn_calls = 0;
    CALL_OK(tpu_strategy_distribute_datasets_from_function(s, per_replica_fn, &global, &dd));
    cr_assert_eq(fn_calls, 1);
    cr_assert_eq(fn_ctx.num_input_pipelines, 1);
    cr_assert_eq(fn_ctx.input_pipeline_id, 0);
    cr_assert_eq(fn_ctx.num_replicas_in_sync, 3);
    static const int want[2][3][8] = {
        {{0, 1, -1}, {2, 3, -1}, {4, 5, -1}},
        {{6, 7, -1}, {8, 9, -1}, {10, -1}},
    };
    tpu_dist_iter *it;
    tpu_per_replica *x;
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    for (int step = 0; step < 2; step++) {
        char what[32];
        snprintf(what, sizeof what, "step %d", step);
        CALL_OK(tpu_dist_iter_next(it, &x));
        cr_assert_not_null(x);
        check_shards(s, x, 3, want[step], what);
        if (step == 0) {
            double out[4];
            size_t got;
            CALL_OK(tpu_strategy_reduce(s, TPU_SUM, x, TPU_AXIS_NONE, out, 4, &got));
            cr_assert_eq(got, 4u); /* 2 rows x 2 features */
            cr_assert_eq(out[0], 0 + 2 + 4.0);
            cr_assert_eq(out[1], 100 + 102 + 104.0);
            cr_assert_eq(out[2], 1 + 3 + 5.0);
            cr_assert_eq(out[3], 101 + 103 + 105.0);
            CALL_OK(tpu_strategy_reduce(s, TPU_MEAN, x, TPU_AXIS_NONE, out, 4, &got));
            cr_assert_eq(out[0], 2.0);
            cr_assert_eq(out[1], 102.0);
            cr_assert_eq(out[2], 3.0);
            cr_assert_eq(out[3], 103.0);
        }
        tpu_per_replica_free(x);
    }
    CALL_OK(tpu_dist_iter_next(it, &x));
    cr_assert_null(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);

    /* 7 does not split over 3 replicas: the function's failure is the call's */
    global = 7;
    cr_assert_eq(tpu_strategy_distribute_datasets_from_function(s, per_replica_fn, &global, &dd), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "not divisible by num_replicas_in_sync (3)"), "%s", tpu_last_error());
    cr_assert_null(dd);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 3 ---- */

/* strategy.run(step_fn, args=(x,)) returns per-replica values, one per
 * replica (tensorflow/python/distribute/tpu_strategy.py TPUStrategyV2.run);
 * strategy.reduce(SUM, v, axis=None) adds them, MEAN divides by the
 * replicas; with axis=0 it reduces the batch too and MEAN divides by the
 * rows of all replicas, "the correct denominator" of a partial batch
 * (distribute_lib.py StrategyBase.reduce). The step's values here: per
 * replica its examples (4 each of 12: SUM 12, MEAN 4, exactly), its summed
 * loss and correct predictions, whose SUMs are evaluate's loss x 12 and
 * accuracy x 12; tf.nn.compute_average_loss's per-replica loss (summed loss /
 * global batch, tensorflow/python/ops/nn_impl.py) reduced with SUM is the
 * batch's mean loss. Predictions per replica (rows x classes) are predict's
 * rows of that replica; with a batch of 10 over 3 replicas (shards 4, 3, 3)
 * axis None is refused and axis 0 MEAN divides by 10. */
Test(strategy, run_and_reduce, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){3}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(12, 8, 3);
    tpu_dataset *ds = blobs_ds(&b, 12, 0);
    tpu_model *m = make_model(s, 8, 77);
    compile(m, tpu_optimizer_adam(0.01f), 12);

    double ev_loss, ev_acc;
    CALL_OK(tpu_model_evaluate(m, ds, &ev_loss, &ev_acc));
    float pred[12 * CLASSES];
    size_t prow;
    CALL_OK(tpu_model_predict(m, ds, pred, 12, &prow));
    cr_assert_eq(prow, 12u);

    tpu_dist_dataset *dd;
    tpu_dist_iter *it;
    tpu_per_replica *x;
    tpu_step_outputs o;
    double v[CLASSES];
    size_t got;
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    CALL_OK(tpu_dist_iter_next(it, &x));
    cr_assert_not_null(x);

    CALL_OK(tpu_strategy_run(s, TPU_STEP_EVALUATE, m, x, &o));
    cr_assert_not_null(o.loss);
    cr_assert_not_null(o.correct);
    cr_assert_null(o.predictions);
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.examples, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_eq(got, 1u);
    cr_assert_eq(v[0], 12.0);
    CALL_OK(tpu_strategy_reduce(s, TPU_MEAN, o.examples, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_eq(v[0], 4.0);
    tpu_local_value lv[3];
    CALL_OK(tpu_strategy_experimental_local_results(s, o.correct, lv, 3, &got));
    cr_assert_eq(got, 3u);
    double correct = 0;
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(lv[r].rank, 0);
        correct += lv[r].v[0];
    }
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.correct, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_eq(v[0], correct);
    cr_assert_eq(v[0], round(ev_acc * 12), "SUM of correct %g, evaluate's accuracy %g x 12", v[0], ev_acc);
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.loss_sum, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_float_eq(v[0] / 12, ev_loss, 1e-9 * fabs(ev_loss) + 1e-12, "SUM of loss_sum / 12 %.17g, evaluate %.17g",
                       v[0] / 12, ev_loss);
    double sum_loss = v[0];
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.loss, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_float_eq(v[0], sum_loss / 12, 1e-12 * fabs(sum_loss) + 1e-15);
    tpu_step_outputs_free(&o);

    CALL_OK(tpu_strategy_run(s, TPU_STEP_PREDICT, m, x, &o));
    cr_assert_null(o.loss);
    cr_assert_not_null(o.predictions);
    CALL_OK(tpu_strategy_experimental_local_results(s, o.predictions, lv, 3, &got));
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(lv[r].rank, 2);
        cr_assert_eq(lv[r].dims[0], 4u);
        cr_assert_eq(lv[r].dims[1], (size_t)CLASSES);
        for (size_t i = 0; i < 4 * CLASSES; i++)
            cr_assert_eq(lv[r].v[i], (double)pred[(size_t)r * 4 * CLASSES + i],
                         "replica %d prediction %zu: %g, predict's %g", r, i, lv[r].v[i],
                         (double)pred[(size_t)r * 4 * CLASSES + i]);
    }
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.predictions, 0, v, CLASSES, &got));
    cr_assert_eq(got, (size_t)CLASSES);
    double total = 0;
    for (int k = 0; k < CLASSES; k++) {
        double col = 0;
        for (int i = 0; i < 12; i++)
            col += (double)pred[i * CLASSES + k];
        cr_assert_float_eq(v[k], col, 1e-9);
        total += v[k];
    }
    cr_assert_float_eq(total, 12.0, 1e-4, "softmax rows sum to 1: 12 rows sum to %g", total);
    tpu_step_outputs_free(&o);
    tpu_per_replica_free(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);
    tpu_dataset_free(ds);

    /* 10 rows over 3 replicas: 4, 3, 3 */
    ds = blobs_ds(&b, 10, 0);
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    CALL_OK(tpu_dist_iter_next(it, &x));
    CALL_OK(tpu_strategy_run(s, TPU_STEP_PREDICT, m, x, &o));
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.examples, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_eq(v[0], 10.0);
    CALL_OK(tpu_strategy_experimental_local_results(s, o.examples, lv, 3, &got));
    cr_assert_eq(lv[0].v[0], 4.0);
    cr_assert_eq(lv[1].v[0], 3.0);
    cr_assert_eq(lv[2].v[0], 3.0);
    cr_assert_eq(tpu_strategy_reduce(s, TPU_SUM, o.predictions, TPU_AXIS_NONE, v, CLASSES, &got),
                 TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "replica 0 has 4 rows, replica 1 3"), "%s", tpu_last_error());
    CALL_OK(tpu_strategy_reduce(s, TPU_MEAN, o.predictions, 0, v, CLASSES, &got));
    total = 0;
    for (int k = 0; k < CLASSES; k++)
        total += v[k];
    cr_assert_float_eq(total, 1.0, 1e-5, "MEAN over the batch of softmax rows: %g, not 1 (denominator 10)", total);
    tpu_step_outputs_free(&o);
    tpu_per_replica_free(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);
    tpu_dataset_free(ds);

    tpu_model_free(m);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 4 ---- */

static float *weights(tpu_model *m, int replica)
{
    size_t np = tpu_model_num_params(m);
    float *w = malloc(np * sizeof(float));
    cr_assert_not_null(w);
    CALL_OK(tpu_model_get_weights(m, replica, w, np));
    return w;
}

/* A custom training loop is what model.fit runs under a TPUStrategy (Keras'
 * train_step under strategy.run, keras/engine/training.py make_train_function;
 * the TPU guide's "Train a model using a custom training loop": the same
 * model, loss and optimizer, gradients summed over replicas and scaled by
 * the global batch). So 2 epochs of TRAIN steps over the distributed dataset
 * (shuffled with the same seed: each iterator is the next epoch, as each
 * Keras epoch iterates the dataset anew) leave the weights fit leaves after 2
 * epochs, bitwise, on every replica, and the same step count. */
Test(strategy, custom_loop_equals_fit, .timeout = 150)
{
    colltest *t = ct_start(2, (int[]){2, 2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));
    blobs b = blobs_make(384, 8, 11);
    tpu_dataset *ds = blobs_ds(&b, 32, 9); /* 12 steps per epoch, 8 rows per replica */

    tpu_model *m = make_model(s, 8, 4321);
    compile(m, tpu_optimizer_adam(0.01f), 32);
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 2;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    cr_assert_eq(tpu_model_step(m), 24u);
    size_t np = tpu_model_num_params(m);
    float *fit_w = weights(m, 0);
    tpu_model_free(m);

    m = make_model(s, 8, 4321);
    compile(m, tpu_optimizer_adam(0.01f), 32);
    float *w0 = weights(m, 0);
    tpu_dist_dataset *dd;
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    double first_loss = NAN, last_loss = NAN;
    for (int epoch = 0; epoch < 2; epoch++) {
        tpu_dist_iter *it;
        tpu_per_replica *x;
        double total = 0;
        int steps = 0;
        CALL_OK(tpu_dist_dataset_iter(dd, &it));
        for (; steps < 100; steps++) {
            tpu_step_outputs o;
            double l;
            size_t got;
            CALL_OK(tpu_dist_iter_next(it, &x));
            if (!x)
                break;
            CALL_OK(tpu_strategy_run(s, TPU_STEP_TRAIN, m, x, &o));
            CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.loss, TPU_AXIS_NONE, &l, 1, &got));
            total += l;
            tpu_step_outputs_free(&o);
            tpu_per_replica_free(x);
        }
        tpu_dist_iter_free(it);
        cr_assert_eq(steps, 12);
        if (epoch == 0)
            first_loss = total / steps;
        last_loss = total / steps;
    }
    cr_assert_lt(last_loss, first_loss, "the loop's mean loss did not go down: %g -> %g", first_loss, last_loss);
    cr_assert_eq(tpu_model_step(m), 24u);
    size_t moved = 0;
    for (int r = 0; r < 4; r++) {
        float *w = weights(m, r);
        for (size_t i = 0; i < np; i++) {
            cr_assert(memcmp(&w[i], &fit_w[i], sizeof(float)) == 0,
                      "replica %d weight %zu after the loop: %a, after fit: %a", r, i, (double)w[i], (double)fit_w[i]);
            moved += r == 0 && w[i] != w0[i];
        }
        free(w);
    }
    cr_assert_gt(moved, np / 2, "only %zu of %zu weights moved", moved, np);
    free(w0);
    free(fit_w);
    tpu_dist_dataset_free(dd);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    blobs_free(&b);
    tpu_strategy_free(s);
    ct_free(t);
}

/* ---- 5 ---- */

static tpu_status unbatched_fn(const tpu_input_context *ctx, void *user, tpu_dataset **out)
{
    (void)ctx, (void)user;
    *out = rows_ds(8, 0, 0);
    return TPU_OK;
}

#define REFUSED(expr, code, text)                                                                     \
    do {                                                                                              \
        tpu_status st_ = (expr);                                                                      \
        cr_assert_eq(st_, code, "%s: %s (%s), not %s", #expr, tpu_status_name(st_), tpu_last_error(), \
                     tpu_status_name(code));                                                          \
        cr_assert(strstr(tpu_last_error(), text), "%s: the error does not say \"%s\": %s", #expr, text,  \
                  tpu_last_error());                                                                  \
    } while (0)

/* Bad arguments are refused as TensorFlow refuses them, with the reason:
 * experimental_distribute_dataset of an unbatched dataset (TPUStrategy needs
 * a batch dimension to split: input_lib.py / the TPU guide's "the global
 * batch"), a step function that is none, an argument that is not a
 * distributed input, a model not compiled, inputs of the wrong width or with
 * labels the loss cannot take (Keras' sparse categorical cross-entropy
 * refuses labels outside the classes), reduce with an op other than SUM or
 * MEAN (tf.distribute.ReduceOp has only those, reduce_util.py), an axis
 * other than None or 0 here, axis 0 of a scalar (TensorFlow: axis out of
 * range), a too small result buffer, a second iterator while one lives, a
 * model of another strategy (TensorFlow: variables created in another
 * strategy's scope), and a dataset function whose dataset is not batched. */
Test(strategy, bad_arguments_refused, .timeout = 90)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s, *s2;
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_strategy_new(t->c, &s2));
    tpu_dist_dataset *dd = NULL;
    tpu_dataset *raw = rows_ds(8, 0, 0);
    REFUSED(tpu_strategy_experimental_distribute_dataset(s, raw, &dd), TPU_INVALID_ARGUMENT, "not batched");
    cr_assert_null(dd);
    REFUSED(tpu_strategy_distribute_datasets_from_function(s, unbatched_fn, NULL, &dd), TPU_INVALID_ARGUMENT,
            "not batched");
    tpu_dataset_free(raw);

    tpu_dataset *ds = rows_ds(8, 4, 1); /* 2 features, labels 0..3 */
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    tpu_dist_iter *it, *it2;
    tpu_per_replica *x;
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    REFUSED(tpu_dist_dataset_iter(dd, &it2), TPU_FAILED_PRECONDITION, "has an iterator already");
    CALL_OK(tpu_dist_iter_next(it, &x));

    tpu_model *m = make_model(s, 2, 5);
    tpu_step_outputs o;
    REFUSED(tpu_strategy_run(s, TPU_STEP_TRAIN, m, x, &o), TPU_FAILED_PRECONDITION, "compile the model first");
    compile(m, tpu_optimizer_sgd(0.1f, 0), 4);
    REFUSED(tpu_strategy_run(s, (tpu_step_fn)9, m, x, &o), TPU_INVALID_ARGUMENT, "not a tpu_step_fn");
    REFUSED(tpu_strategy_run(s2, TPU_STEP_TRAIN, m, x, &o), TPU_INVALID_ARGUMENT, "another strategy");
    CALL_OK(tpu_strategy_run(s, TPU_STEP_EVALUATE, m, x, &o));
    tpu_step_outputs o2;
    REFUSED(tpu_strategy_run(s, TPU_STEP_TRAIN, m, o.examples, &o2), TPU_INVALID_ARGUMENT, "not an input");
    cr_assert_null(o2.examples, "a failed run leaves its outputs NULL");
    tpu_step_outputs_free(&o);

    double v[4];
    size_t got;
    CALL_OK(tpu_strategy_run(s, TPU_STEP_EVALUATE, m, x, &o));
    REFUSED(tpu_strategy_reduce(s, TPU_MAX, o.loss, TPU_AXIS_NONE, v, 4, &got), TPU_INVALID_ARGUMENT,
            "SUM and MEAN only");
    REFUSED(tpu_strategy_reduce(s, TPU_SUM, o.loss, 1, v, 4, &got), TPU_INVALID_ARGUMENT, "axis 1");
    REFUSED(tpu_strategy_reduce(s, TPU_SUM, o.loss, 0, v, 4, &got), TPU_INVALID_ARGUMENT, "axis 0 of a scalar");
    REFUSED(tpu_strategy_reduce(s, TPU_SUM, x, 0, v, 1, &got), TPU_INVALID_ARGUMENT, "has 2 values; out has room for 1");
    cr_assert_eq(got, 2u, "a too small buffer still says how many values the result has");
    tpu_step_outputs_free(&o);
    tpu_per_replica_free(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);
    tpu_dataset_free(ds);
    tpu_model_free(m);

    /* the wrong width, labels outside the classes, no labels for training */
    tpu_model *m3 = make_model(s, 3, 5);
    compile(m3, tpu_optimizer_sgd(0.1f, 0), 4);
    ds = rows_ds(8, 4, 1);
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    CALL_OK(tpu_dist_iter_next(it, &x));
    REFUSED(tpu_strategy_run(s, TPU_STEP_TRAIN, m3, x, &o), TPU_INVALID_ARGUMENT,
            "the input's rows have 2 features; the model takes 3");
    tpu_per_replica_free(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);
    tpu_dataset_free(ds);
    tpu_model_free(m3);

    m = make_model(s, 2, 5);
    compile(m, tpu_optimizer_sgd(0.1f, 0), 4);
    float xs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t ys[4] = {0, 1, 7, 2};
    CALL_OK(tpu_dataset_from_tensor_slices(xs, 4, 2, ys, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, 4, 1));
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    CALL_OK(tpu_dist_iter_next(it, &x));
    REFUSED(tpu_strategy_run(s, TPU_STEP_TRAIN, m, x, &o), TPU_INVALID_ARGUMENT,
            "label 7 in row 0 of replica 1's shard is outside 0..3");
    tpu_per_replica_free(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);
    tpu_dataset_free(ds);
    CALL_OK(tpu_dataset_from_tensor_slices(xs, 4, 2, NULL, TPU_LABELS_NONE, 0, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, 4, 1));
    CALL_OK(tpu_strategy_experimental_distribute_dataset(s, ds, &dd));
    CALL_OK(tpu_dist_dataset_iter(dd, &it));
    CALL_OK(tpu_dist_iter_next(it, &x));
    REFUSED(tpu_strategy_run(s, TPU_STEP_TRAIN, m, x, &o), TPU_INVALID_ARGUMENT, "the input has no labels");
    CALL_OK(tpu_strategy_run(s, TPU_STEP_PREDICT, m, x, &o)); /* predicting needs none */
    CALL_OK(tpu_strategy_reduce(s, TPU_SUM, o.examples, TPU_AXIS_NONE, v, 1, &got));
    cr_assert_eq(v[0], 4.0);
    tpu_step_outputs_free(&o);
    tpu_per_replica_free(x);
    tpu_dist_iter_free(it);
    tpu_dist_dataset_free(dd);
    tpu_dataset_free(ds);
    tpu_model_free(m);

    tpu_strategy_free(s2);
    tpu_strategy_free(s);
    ct_free(t);
}
