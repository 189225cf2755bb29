/* The profiler on real workers (tpuemu/profile.h, tpuctl profile): what a
 * user reading a profile checks.
 *
 *  - after a training run, a capture has every core's steps, each layer's
 *    forward and backward, the matmuls with their shapes, the all-reduce and
 *    its chunks; the trace file lands under LOGDIR/plugins/profile/RUN/ and
 *    passes the strict trace-event check (phases, nesting, units, flows);
 *    the clock offsets of workers on this machine are 0 within their bound;
 *    the step's parts add up; MXU utilization is the padded-shape figure;
 *  - one core slowed on purpose (--throttle-pct) is named as the straggler,
 *    and with all cores equal none is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/profile.h>

#include "colltest.h"
#include "trace_check.h"

#define HB_MS 500
#define DIM 100
#define ROWS 1024

#define CALL_OK(expr)                                                                                 \
    do {                                                                                              \
        tpu_status st_ = (expr);                                                                      \
        if (st_ != TPU_OK)                                                                            \
            cr_assert_fail("%s: %s: %s", #expr, tpu_status_name(st_), tpu_last_error());             \
    } while (0)

static void ignore_warning(const char *message, void *user)
{
    (void)message, (void)user;
}

__attribute__((constructor)) static void quiet_warnings(void)
{
    tpu_set_warning_handler(ignore_warning, NULL);
}

/* ROWS rows of DIM features, labels i % 4, batches of `batch`; a
 * Dense(hidden, relu) -> Dense(4, softmax) model trained for `epochs`. */
static tpu_model *train(colltest *t, size_t batch, size_t hidden, int epochs)
{
    static float x[ROWS * DIM];
    static int32_t y[ROWS];
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_compile_options co;
    tpu_fit_options fo;
    tpu_history *h;
    for (size_t i = 0; i < ROWS; i++) {
        y[i] = (int32_t)(i % 4);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 7 + j * 13) % 17) / 17.0f + (float)y[i] * (j == (size_t)y[i]);
    }
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, batch, 1));
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, hidden, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, 4, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 7));
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f);
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = batch;
    CALL_OK(tpu_model_compile(m, &co));
    memset(&fo, 0, sizeof fo);
    fo.epochs = epochs;
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    tpu_history_free(h);
    tpu_dataset_free(ds);
    return m;
}

/* The single file under dir/plugins/profile/RUN/ that ends in .trace.json.gz. */
static void find_trace(const char *logdir, const char *path)
{
    char want[1024];
    snprintf(want, sizeof want, "%s/plugins/profile/", logdir);
    cr_assert(strncmp(path, want, strlen(want)) == 0, "trace %s is not under %s", path, want);
    cr_assert(strstr(path + strlen(want), "/") != NULL, "no RUN directory in %s", path);
    size_t n = strlen(path);
    cr_assert(n > 14 && strcmp(path + n - 14, ".trace.json.gz") == 0, "trace file name %s", path);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "trace %s was not written", path);
    fclose(f);
}

Test(profile, trace_of_a_training_run, .timeout = 120)
{
    colltest *t = ct_start(2, (int[]){2, 2}, NULL, HB_MS);
    tpu_model *m = train(t, 256, 128, 2); /* 4 steps per epoch, 64 rows per core */
    tpu_profile *p;
    tpu_profile_summary sum;
    char logdir[512], path[4600], why[512];
    struct trace_check_stats st;

    CALL_OK(tpu_profile_capture(t->c, 0, &p));
    cr_assert_eq(tpu_profile_num_cores(p), 4u);
    for (size_t i = 0; i < 4; i++) {
        tpu_profile_core pc;
        CALL_OK(tpu_profile_core_info(p, i, &pc));
        cr_assert_eq(pc.replica_id, (int)i);
        cr_assert_gt(pc.events, 8u * (2 + 4 + 3 + 2), "core %s/%d: %llu events", pc.host_id, pc.core,
                     (unsigned long long)pc.events);
        cr_assert_eq(pc.dropped, 0u);
        /* one machine, one CLOCK_MONOTONIC: the estimate is 0 within its bound */
        cr_assert_leq(llabs(pc.clock_offset_ns), (long long)pc.clock_error_ns + 1000,
                      "core %d: offset %lld ns, bound %llu ns", (int)i, (long long)pc.clock_offset_ns,
                      (unsigned long long)pc.clock_error_ns);
    }
    CALL_OK(tpu_profile_summarize(p, &sum));
    /* 8 steps per core, of which the 7 after the first have a period */
    cr_assert_eq(sum.steps, 4u * 7u, "%zu core-steps with a period", sum.steps);
    double total = 0;
    for (int c = 0; c < 5; c++) {
        cr_assert_geq(sum.fraction[c], 0.0);
        total += sum.fraction[c];
    }
    cr_assert(fabs(total - 1.0) < 0.02, "the parts of the step add up to %.3f", total);
    cr_assert_gt(sum.fraction[TPU_PROFILE_COMPUTE], 0.0);
    cr_assert_gt(sum.fraction[TPU_PROFILE_ALLREDUCE], 0.0);
    /* 64 x 100 . 100 x 128, 64 x 128 . 128 x 4 and their gradients, padded to 8 rows and 128 */
    double fl = 0, pad = 0;
    const double mm[5][3] = {{64, 128, 100}, {64, 4, 128}, {100, 128, 64}, {128, 4, 64}, {64, 128, 4}};
    for (int i = 0; i < 5; i++) {
        fl += mm[i][0] * mm[i][1] * mm[i][2];
        pad += ceil(mm[i][0] / 8) * 8 * ceil(mm[i][1] / 128) * 128 * ceil(mm[i][2] / 128) * 128;
    }
    cr_assert(fabs(sum.mxu_utilization - fl / pad) < 1e-6, "MXU utilization %.6f, want %.6f", sum.mxu_utilization,
              fl / pad);

    snprintf(logdir, sizeof logdir, "%s/logs", cl_tmpdir());
    CALL_OK(tpu_profile_write(p, logdir, path, sizeof path));
    find_trace(logdir, path);
    cr_assert_eq(trace_check_file(path, why, sizeof why, &st), 0, "%s: %s", path, why);
    cr_assert_eq(st.processes, 2u, "a process per host: %zu", st.processes);
    cr_assert_geq(st.threads, 4u);
    cr_assert_gt(st.flows, 0u, "no flow from a chunk's send to its receive");
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}

/* Three cores; the third computes at 20% speed: the others wait for it at
 * every all-reduce. */
Test(profile, slowed_core_is_the_straggler, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    cluster_add_worker(t->cl, "h1", 0, (const char *const[]){"--throttle-pct", "20", NULL});
    for (int i = 0; i < 100; i++) { /* bounded: 10 s for it to register */
        tpu_cluster_spec *cs;
        CALL_OK(tpu_cluster_spec_get(t->c, &cs));
        size_t n = tpu_cluster_spec_num_cores(cs);
        tpu_cluster_spec_free(cs);
        if (n == 3)
            break;
        usleep(100000);
    }
    ct_reinit(t);
    cr_assert_eq(t->n, 3);
    tpu_model *m = train(t, 384, 256, 6); /* 12 steps: enough all-reduces to tell */
    tpu_profile *p;
    tpu_profile_summary sum;
    tpu_profile_core pc;

    CALL_OK(tpu_profile_capture(t->c, 0, &p));
    CALL_OK(tpu_profile_summarize(p, &sum));
    cr_assert_geq(sum.straggler, 0, "no straggler found (last core %d in %.0f%% of steps, by %.3f ms; step %.3f ms)",
                  sum.last_core, 100 * sum.last_share, sum.last_by_ms, sum.step_ms);
    CALL_OK(tpu_profile_core_info(p, (size_t)sum.straggler, &pc));
    cr_assert_str_eq(pc.host_id, "h1", "the straggler is %s/%d, not the throttled h1/0", pc.host_id, pc.core);
    cr_assert_eq(pc.core, 0);
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}
