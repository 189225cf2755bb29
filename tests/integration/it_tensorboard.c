/* TensorBoard's callback on real workers (tpu_callback_tensorboard): the
 * per-epoch scalars Keras' TensorBoard callback writes, read back by an
 * independent reader of the event-file format in python3
 * (tests/support/tfevents_read.py: its own CRC32C, TFRecord framing and
 * protobuf decoding; every CRC checked), not by the writer's code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "cluster.h"
#include "colltest.h"
#include "json.h"

#define HB_MS 500
#define DIM 20
#define ROWS 512
#define VAL_ROWS 256
#define BATCH 128
#define EPOCHS 3

QUIET_WARNINGS()

static void make_data(float *x, int32_t *y, size_t rows, unsigned salt)
{
    for (size_t i = 0; i < rows; i++) {
        y[i] = (int32_t)((i + salt) % 4);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 7 + j * 13 + salt) % 17) / 17.0f + (float)y[i] * (j == (size_t)y[i]);
    }
}

/* The reader's JSON for the event files in dir: exactly one, whose name is
 * events.out.tfevents.SECONDS.HOST.PID.N.v2 for this machine and process,
 * dated within [before, after]; its events go to *events. */
static json *read_events(const char *dir, time_t before, time_t after, const json **events)
{
    char err[256], host[256] = "";
    run_result r;
    long long v;
    run_cmd((const char *const[]){"/usr/bin/env", "python3", TPUEMU_TFEVENTS_READER, dir, NULL}, NULL, 60000, &r);
    cr_assert_eq(r.code, 0, "tfevents_read.py %s: exit %d: %s", dir, r.code, r.err);
    json *j = json_parse(r.out, strlen(r.out), err, sizeof err);
    cr_assert_not_null(j, "the reader's output: %s: %s", err, r.out);
    run_result_free(&r);
    const json *files = json_get(j, "files");
    cr_assert_eq(json_len(files), 1u, "%zu event files in %s, want 1", json_len(files), dir);
    const json *f = json_at(files, 0);
    gethostname(host, sizeof host - 1);
    cr_assert_str_eq(json_str(json_get(f, "host")), host, "the file name's host");
    cr_assert(json_int(json_get(f, "pid"), &v) == 0 && v == (long long)getpid(), "the file name's pid %lld", v);
    cr_assert(json_int(json_get(f, "seconds"), &v) == 0 && v >= (long long)before && v <= (long long)after,
              "the file name's time %lld is not within the fit (%lld..%lld)", v, (long long)before, (long long)after);
    *events = json_get(f, "events");
    /* EventsWriter's first record: the file version, dated in whole seconds */
    const json *first = json_at(*events, 0);
    double wt;
    cr_assert_str_eq(json_str(json_get(first, "file_version")), "brain.Event:2");
    cr_assert(json_num(json_get(first, "wall_time"), &wt) == 0 && wt == (double)v,
              "the first event's wall_time %.3f, the name's %lld", wt, v);
    return j;
}

/* Event i of events is one scalar summary: tag at step, the float value v,
 * written as tf.summary.scalar writes it (a rank-0 DT_FLOAT tensor, plugin
 * "scalars", no simple_value), dated within the fit. */
static void check_scalar(const json *events, size_t i, const char *tag, long long step, double v, time_t before,
                         time_t after)
{
    const json *e = json_at(events, i), *vals = json_get(e, "values");
    long long s;
    double wt, got;
    cr_assert_not_null(e, "no event %zu (of %zu): want %s at step %lld", i, json_len(events), tag, step);
    cr_assert_eq(json_len(vals), 1u, "event %zu has %zu values", i, json_len(vals));
    const json *val = json_at(vals, 0);
    cr_assert_str_eq(json_str(json_get(val, "tag")), tag, "event %zu", i);
    cr_assert(json_int(json_get(e, "step"), &s) == 0 && s == step, "%s: step %lld, want %lld", tag, s, step);
    cr_assert(json_num(json_get(e, "wall_time"), &wt) == 0 && wt >= (double)before && wt <= (double)after + 1,
              "%s: wall_time %.3f is not within the fit", tag, wt);
    cr_assert_str_eq(json_str(json_get(val, "plugin_name")), "scalars", "%s's plugin", tag);
    cr_assert(json_is(json_get(val, "simple_value"), JSON_NULL), "%s is a simple_value, not a tensor", tag);
    cr_assert(json_num(json_get(val, "tensor"), &got) == 0, "%s has no tensor value", tag);
    cr_assert(got == (double)(float)v, "%s at step %lld: %.9g, want %.9g", tag, step, got, (double)(float)v);
}

/* Keras' TensorBoard(log_dir) callback writes, after every epoch, the
 * epoch's logs as scalars named epoch_NAME at step = the epoch (from 0): the
 * training ones with its train writer in LOG_DIR/train, the validation ones
 * without their val_ prefix with its validation writer in
 * LOG_DIR/validation, where on_test_end first writes
 * evaluation_NAME_vs_iterations at step = optimizer.iterations
 * (keras/callbacks.py: TensorBoard._log_epoch_metrics, on_test_end,
 * _train_dir, _val_dir). The writers are tf.summary.create_file_writer's
 * (tensorflow/python/ops/summary_ops_v2.py: file name suffix
 * ".PID.UID.v2"; tensorflow/core/util/events_writer.cc:
 * events.out.tfevents.%010lld.HOST, the first event its file_version
 * "brain.Event:2"), the scalars tf.summary.scalar's (tensorboard/plugins/
 * scalar/summary_v2.py: a float32 tensor, plugin "scalars";
 * tensorflow/core/summary/summary_file_writer.cc WriteTensor: the value in
 * tensor_content). profile_batch=0 profiles nothing. */
Test(tensorboard, epoch_scalars_are_event_files, .timeout = 180)
{
    static float x[ROWS * DIM], vx[VAL_ROWS * DIM];
    static int32_t y[ROWS], vy[VAL_ROWS];
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_dataset *ds, *val;
    tpu_model *m;
    tpu_compile_options co;
    tpu_fit_options fo;
    tpu_history *hist;
    tpu_callback cb;
    char logdir[512], dir[600];
    struct stat st;
    const json *train_ev, *val_ev;

    make_data(x, y, ROWS, 0);
    make_data(vx, vy, VAL_ROWS, 3);
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, BATCH, 1));
    CALL_OK(tpu_dataset_from_tensor_slices(vx, VAL_ROWS, DIM, vy, TPU_LABELS_SPARSE, 1, 0, &val));
    CALL_OK(tpu_dataset_batch(val, BATCH, 1));
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, 32, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, 4, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 11));
    tpu_compile_options_init(&co);
    co.batch_size = BATCH;
    CALL_OK(tpu_model_compile(m, &co));
    snprintf(logdir, sizeof logdir, "%s/tb-logs", cl_tmpdir());
    CALL_OK(tpu_callback_tensorboard(logdir, 0, 0, &cb));
    memset(&fo, 0, sizeof fo);
    fo.epochs = EPOCHS;
    fo.validation_data = val;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    time_t before = time(NULL);
    CALL_OK(tpu_model_fit(m, ds, &fo, &hist));
    time_t after = time(NULL);
    cr_assert_eq(tpu_history_num_epochs(hist), (size_t)EPOCHS);

    snprintf(dir, sizeof dir, "%s/train", logdir);
    json *tj = read_events(dir, before, after, &train_ev);
    snprintf(dir, sizeof dir, "%s/validation", logdir);
    json *vj = read_events(dir, before, after, &val_ev);
    cr_assert_eq(json_len(train_ev), 1u + 2u * EPOCHS, "%zu events in train/", json_len(train_ev));
    cr_assert_eq(json_len(val_ev), 1u + 4u * EPOCHS, "%zu events in validation/", json_len(val_ev));
    for (int ep = 0; ep < EPOCHS; ep++) {
        tpu_logs l;
        CALL_OK(tpu_history_epoch(hist, (size_t)ep, &l));
        cr_assert(l.has_val && !isnan(l.accuracy) && !isnan(l.val_accuracy), "epoch %d has no accuracy or validation",
                  ep);
        check_scalar(train_ev, 1 + 2 * (size_t)ep, "epoch_loss", ep, l.loss, before, after);
        check_scalar(train_ev, 2 + 2 * (size_t)ep, "epoch_accuracy", ep, l.accuracy, before, after);
        long long iters = (long long)(ep + 1) * (ROWS / BATCH);
        check_scalar(val_ev, 1 + 4 * (size_t)ep, "evaluation_loss_vs_iterations", iters, l.val_loss, before, after);
        check_scalar(val_ev, 2 + 4 * (size_t)ep, "evaluation_accuracy_vs_iterations", iters, l.val_accuracy, before,
                     after);
        check_scalar(val_ev, 3 + 4 * (size_t)ep, "epoch_loss", ep, l.val_loss, before, after);
        check_scalar(val_ev, 4 + 4 * (size_t)ep, "epoch_accuracy", ep, l.val_accuracy, before, after);
    }
    json_free(tj);
    json_free(vj);
    /* profile_batch=0: no profile */
    snprintf(dir, sizeof dir, "%s/train/plugins", logdir);
    cr_assert_neq(stat(dir, &st), 0, "profile_batch 0 wrote %s", dir);
    cr_assert_str_eq(tpu_callback_profiler_dir(&cb), "");

    tpu_callback_free(&cb);
    tpu_history_free(hist);
    tpu_dataset_free(ds);
    tpu_dataset_free(val);
    tpu_model_free(m);
    ct_free(t);
}

/* The reader is strict: a file whose last byte is changed fails its data
 * CRC, as TensorFlow's record reader reports DataLoss for a corrupted
 * record (tensorflow/core/lib/io/record_reader.cc). The test shows the CRCs
 * are checked, not only read. */
Test(tensorboard, a_corrupted_event_file_fails_the_reader, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    static float x[ROWS * DIM];
    static int32_t y[ROWS];
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_compile_options co;
    tpu_fit_options fo;
    tpu_callback cb;
    char logdir[512], dir[600];
    run_result r;

    make_data(x, y, ROWS, 1);
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, BATCH, 1));
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, 8, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, 4, TPU_ACT_SOFTMAX));
    tpu_compile_options_init(&co);
    co.batch_size = BATCH;
    CALL_OK(tpu_model_compile(m, &co));
    snprintf(logdir, sizeof logdir, "%s/tb-corrupt", cl_tmpdir());
    CALL_OK(tpu_callback_tensorboard(logdir, 0, 0, &cb));
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    tpu_callback_free(&cb);
    snprintf(dir, sizeof dir, "%s/validation", logdir);
    struct stat st;
    cr_assert_neq(stat(dir, &st), 0, "no validation ran, yet %s exists", dir);

    snprintf(dir, sizeof dir, "%s/train", logdir);
    /* flip one bit of the last byte (the last record's data CRC) */
    json *j = NULL;
    {
        char err[256], path[1400];
        const json *ev;
        FILE *f;
        int c;
        json_free(j = read_events(dir, 0, time(NULL), &ev));
        DIR *d = opendir(dir);
        struct dirent *de;
        path[0] = '\0';
        cr_assert_not_null(d);
        while ((de = readdir(d)))
            if (strncmp(de->d_name, "events.out.tfevents.", 20) == 0)
                snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        closedir(d);
        cr_assert(*path, "no event file in %s", dir);
        cr_assert_not_null(f = fopen(path, "r+b"), "%s", path);
        cr_assert_eq(fseek(f, -1, SEEK_END), 0);
        c = fgetc(f);
        cr_assert_neq(c, EOF);
        cr_assert_eq(fseek(f, -1, SEEK_END), 0);
        cr_assert_neq(fputc(c ^ 1, f), EOF);
        cr_assert_eq(fclose(f), 0);
        (void)err;
    }
    run_cmd((const char *const[]){"/usr/bin/env", "python3", TPUEMU_TFEVENTS_READER, dir, NULL}, NULL, 60000, &r);
    cr_assert_eq(r.code, 1, "a changed CRC byte was not noticed: exit %d", r.code);
    cr_assert(strstr(r.err, "CRC mismatch") != NULL, "the reader's error: %s", r.err);
    run_result_free(&r);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    ct_free(t);
}
