/* The profiler on real workers (tpuemu/profile.h, tpuctl profile): what a
 * user reading a profile checks.
 *
 *  - after a training run, a capture has every core's steps, each layer's
 *    forward and backward, the matmuls with their shapes, the all-reduce and
 *    its chunks; the trace file lands under LOGDIR/plugins/profile/RUN/ and
 *    passes the strict trace-event check (phases, nesting, units, flows);
 *    the clock offsets of workers on this machine are 0 within their bound;
 *    the step's parts add up; MXU utilization is the padded-shape figure;
 *    the client's dataset waits and infeeds are a process of their own; the
 *    overview JSON beside the trace has the roofline estimate of the step on
 *    the real generation, computed here by hand from the published peaks;
 *  - a diagnosis per lesson of the walk-through, each on a real run: a slow
 *    dataset without prefetch is "input" (HIGHLY input-bound, in the classes
 *    of TensorFlow's overview page), and prefetch() changes that; a
 *    per-core batch of 8 gives a low MXU utilization and the batch advice; a
 *    layer of 100 units has its padding to 128 named; HBM nearly full is
 *    "memory"; one core slowed on purpose (--throttle-pct) is named as the
 *    straggler;
 *  - TensorBoard's callback: the profile under LOGDIR/train/plugins/profile/
 *    RUN/, RUN the local time; profile_batch counts executions. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/profile.h>

#include "calls.h"
#include "frame.h"
#include "raw.h"
#include "colltest.h"
#include "json.h"
#include "xml.h"
#include "trace_check.h"

#define HB_MS 500
#define DIM 100
#define ROWS 1024 /* the default */
#define MAX_ROWS 65536


QUIET_WARNINGS()

/* How a test trains: see train_with. */
struct how {
    size_t batch, hidden;
    int epochs;
    size_t rows;            /* 0: ROWS */
    unsigned infeed_depth;  /* 0: the default */
    unsigned steps_per_execution; /* 0: the default (1) */
    struct pace *paced;     /* a map() paced by the loop (see paced_map); NULL: none */
    int prefetch;           /* prefetch(TPU_AUTOTUNE) after it */
    const tpu_callback *callbacks;
    size_t num_callbacks;
};

struct pace;
static int paced_map(float *x, void *y, size_t rows, size_t x_dim, void *user);

/* h->rows (or ROWS) rows of DIM features, labels i % 4, batches of h->batch; a
 * Dense(hidden, relu) -> Dense(4, softmax) model trained for h->epochs. */
static tpu_model *train_with(colltest *t, const struct how *h)
{
    static float x[MAX_ROWS * DIM];
    static int32_t y[MAX_ROWS];
    size_t rows = h->rows ? h->rows : ROWS;
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_compile_options co;
    tpu_fit_options fo;
    tpu_history *hist;
    cr_assert_leq(rows, MAX_ROWS);
    for (size_t i = 0; i < rows; i++) {
        y[i] = (int32_t)(i % 4);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 7 + j * 13) % 17) / 17.0f + (float)y[i] * (j == (size_t)y[i]);
    }
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_dataset_from_tensor_slices(x, rows, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, h->batch, 1));
    if (h->paced)
        CALL_OK(tpu_dataset_map(ds, paced_map, h->paced));
    if (h->prefetch)
        CALL_OK(tpu_dataset_prefetch(ds, TPU_AUTOTUNE));
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, h->hidden, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, 4, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 7));
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f);
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = h->batch;
    if (h->infeed_depth)
        co.infeed_depth = h->infeed_depth;
    if (h->steps_per_execution)
        co.steps_per_execution = h->steps_per_execution;
    CALL_OK(tpu_model_compile(m, &co));
    memset(&fo, 0, sizeof fo);
    fo.epochs = h->epochs;
    fo.callbacks = h->callbacks;
    fo.num_callbacks = h->num_callbacks;
    CALL_OK(tpu_model_fit(m, ds, &fo, &hist));
    tpu_history_free(hist);
    tpu_dataset_free(ds);
    return m;
}

/* The CPUs this process may run on (its workers inherit them). */
static unsigned my_cpus(void)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    return (unsigned)CPU_COUNT(&set);
}

static tpu_model *train(colltest *t, size_t batch, size_t hidden, int epochs)
{
    return train_with(t, &(struct how){.batch = batch, .hidden = hidden, .epochs = epochs});
}

/* What the rings hold now, summarized, with the overview as text in ov. */
static tpu_profile *capture(colltest *t, tpu_profile_summary *sum, char *ov, size_t ovn)
{
    tpu_profile *p;
    FILE *f = fmemopen(ov, ovn, "w");
    cr_assert_not_null(f);
    CALL_OK(tpu_profile_capture(t->c, 0, &p));
    CALL_OK(tpu_profile_summarize(p, sum));
    tpu_profile_print_overview(p, f);
    fclose(f);
    ov[ovn - 1] = '\0';
    return p;
}

/* The MXU utilization of one training step of the test's model, per-core
 * batch b, hidden units h: forward, weight and input gradients, each padded
 * as the MXU sees it (rows to 8, the rest to 128). */
static double want_utilization(double b, double h)
{
    const double mm[5][3] = {{b, h, DIM}, {b, 4, h}, {DIM, h, b}, {h, 4, b}, {b, h, 4}}; /* m, n, k */
    double fl = 0, pad = 0;
    for (int i = 0; i < 5; i++) {
        fl += mm[i][0] * mm[i][1] * mm[i][2];
        pad += ceil(mm[i][0] / 8) * 8 * ceil(mm[i][1] / 128) * 128 * ceil(mm[i][2] / 128) * 128;
    }
    return fl / pad;
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

/* The trace has a process named for this client, with its dataset waits and
 * one infeed per step (8: 2 epochs of 4). */
static void check_client(const char *path)
{
    char ebuf[256], want[64];
    json *tr = json_parse_file(path, ebuf, sizeof ebuf);
    cr_assert_not_null(tr, "%s: %s", path, ebuf);
    const json *ev = json_get(tr, "traceEvents");
    long long client_pid = -1;
    size_t infeeds = 0, waits = 0;
    snprintf(want, sizeof want, "client (pid %d)", (int)getpid());
    for (size_t i = 0; i < json_len(ev); i++) {
        const json *e = json_at(ev, i);
        const char *ph = json_str(json_get(e, "ph")), *name = json_str(json_get(e, "name"));
        if (ph && name && strcmp(ph, "M") == 0 && strcmp(name, "process_name") == 0) {
            const char *pn = json_str(json_get(json_get(e, "args"), "name"));
            if (pn && strcmp(pn, want) == 0)
                json_int(json_get(e, "pid"), &client_pid);
        }
    }
    cr_assert_geq(client_pid, 0, "no process named \"%s\" in the trace", want);
    for (size_t i = 0; i < json_len(ev); i++) {
        const json *e = json_at(ev, i);
        const char *ph = json_str(json_get(e, "ph")), *name = json_str(json_get(e, "name"));
        long long pid;
        if (!ph || strcmp(ph, "X") || json_int(json_get(e, "pid"), &pid) || pid != client_pid || !name)
            continue;
        infeeds += strncmp(name, "infeed from step ", 17) == 0;
        waits += strcmp(name, "dataset wait") == 0;
    }
    cr_assert_eq(infeeds, 8u, "%zu infeeds in the client's process", infeeds);
    cr_assert_eq(waits, 8u, "%zu dataset waits in the client's process", waits);
    json_free(tr);
}

/* HOST.overview.json beside the trace says what the summary says. */
static void check_overview_json(const char *trace, const tpu_profile_summary *sum)
{
    char path[4600], ebuf[256];
    double v;
    size_t n = strlen(trace) - strlen(".trace.json.gz");
    snprintf(path, sizeof path, "%.*s.overview.json", (int)n, trace);
    json *o = json_parse_file(path, ebuf, sizeof ebuf);
    cr_assert_not_null(o, "%s: %s", path, ebuf);
    cr_assert_eq(json_len(json_get(o, "per_core")), 4u);
    cr_assert_eq(json_num(json_get(o, "step_ms"), &v), 0);
    cr_assert(fabs(v - sum->step_ms) < 1e-5, "step_ms %.6f in the JSON, %.6f in the summary", v, sum->step_ms);
    cr_assert_eq(json_num(json_get(json_get(o, "estimate"), "step_ms"), &v), 0);
    cr_assert(fabs(v - sum->est_step_ms) < 1e-5);
    cr_assert_str_eq(json_str(json_get(o, "bottleneck")), sum->bottleneck);
    double total = 0;
    const json *split = json_get(o, "split");
    cr_assert(json_is(split, JSON_OBJECT) && json_len(split) == 5u, "split is not an object of 5 parts");
    for (size_t i = 0; i < 5; i++) {
        cr_assert_eq(json_num(split->items[i], &v), 0, "split.%s is not a number", split->keys[i]);
        total += v;
    }
    cr_assert(fabs(total - 1.0) < 0.02, "the JSON's split adds up to %.3f", total);
    cr_assert_eq(json_num(json_get(o, "shared_cores"), &v), 0);
    cr_assert_eq(v, (double)sum->shared_cores);
    cr_assert_eq(json_num(json_get(o, "shared_cpus"), &v), 0);
    cr_assert_eq(v, (double)sum->shared_cpus);
    json_free(o);
}

struct plot_seen {
    size_t step_bars, core_bars, straggler_marks, core_steps;
    double weighted_ms; /* sum over step bars of their total times their core-steps */
    char why[256];
};

static int num_attr(const xml *e, const char *k, double *v)
{
    const char *s = xml_attr(e, k);
    char *end;
    if (!s || !*s)
        return -1;
    *v = strtod(s, &end);
    return *end || !isfinite(*v) ? -1 : 0;
}

/* A bar: 5 rects, the parts in the overview's order, each with its ms. */
static int bar_total(const xml *g, double *total, char *why, size_t whyn)
{
    static const char *const part[5] = {"input", "compute", "all-reduce", "optimizer", "idle"};
    double ms, h;
    size_t k = 0;
    *total = 0;
    for (size_t i = 0; i < g->n; i++) {
        const xml *r = g->kids[i];
        if (strcmp(r->name, "rect"))
            continue;
        const char *pp = xml_attr(r, "data-part");
        if (k >= 5 || !pp || strcmp(pp, part[k]) || num_attr(r, "data-ms", &ms) || ms < 0 ||
            (num_attr(r, "height", &h) && num_attr(r, "width", &h)) || h < 0) {
            snprintf(why, whyn, "part %zu of a bar: %s", k, pp ? pp : "(no data-part)");
            return -1;
        }
        *total += ms;
        k++;
    }
    if (k != 5) {
        snprintf(why, whyn, "a bar of %zu parts", k);
        return -1;
    }
    return 0;
}

static int plot_visit(const xml *e, void *user)
{
    struct plot_seen *ps = user;
    double total, n;
    if (strcmp(e->name, "g"))
        return 0;
    if (xml_attr(e, "data-step")) {
        if (bar_total(e, &total, ps->why, sizeof ps->why) || num_attr(e, "data-core-steps", &n) || n < 1)
            return -1;
        ps->step_bars++;
        ps->core_steps += (size_t)n;
        ps->weighted_ms += total * n;
    } else if (xml_attr(e, "data-core")) {
        if (bar_total(e, &total, ps->why, sizeof ps->why))
            return -1;
        ps->core_bars++;
        ps->straggler_marks += strcmp(xml_attr(e, "data-straggler") ? xml_attr(e, "data-straggler") : "", "1") == 0;
    }
    return 0;
}

/* The picture is well-formed SVG with a bar per step that has a period, a
 * bar per core, and its numbers are the summary's. */
static void check_plot(const char *path, const tpu_profile_summary *sum, size_t cores, size_t steps)
{
    char ebuf[256];
    struct plot_seen ps = {0};
    double w, h;
    xml *x = xml_parse_file(path, ebuf, sizeof ebuf);
    cr_assert_not_null(x, "%s: %s", path, ebuf);
    cr_assert_str_eq(x->name, "svg");
    cr_assert_str_eq(xml_attr(x, "xmlns") ? xml_attr(x, "xmlns") : "", "http://www.w3.org/2000/svg");
    cr_assert(num_attr(x, "width", &w) == 0 && num_attr(x, "height", &h) == 0 && w > 0 && h > 0);
    cr_assert_eq(xml_walk(x, plot_visit, &ps), 0, "%s: %s", path, ps.why);
    cr_assert_eq(ps.step_bars, steps, "%zu step bars, want %zu", ps.step_bars, steps);
    cr_assert_eq(ps.core_steps, sum->steps, "the bars average %zu core-steps, the summary %zu", ps.core_steps,
                 sum->steps);
    cr_assert(fabs(ps.weighted_ms / (double)ps.core_steps - sum->step_ms) < 1e-3 * sum->step_ms + 1e-5,
              "the bars' average step %.6f ms, the summary's %.6f", ps.weighted_ms / (double)ps.core_steps,
              sum->step_ms);
    cr_assert_eq(ps.core_bars, cores);
    cr_assert_eq(ps.straggler_marks, sum->straggler >= 0 ? 1u : 0u);
    xml_free(x);
}

/* RUN, the last part of run_dir, is the local time of the capture as
 * YYYY_MM_DD_HH_MM_SS, between before and after. */
static void check_run_name(const char *run_dir, time_t before, time_t after)
{
    const char *run = strrchr(run_dir, '/');
    struct tm tm;
    int n = 0;
    cr_assert_not_null(run, "no RUN in %s", run_dir);
    run++;
    memset(&tm, 0, sizeof tm);
    cr_assert(sscanf(run, "%4d_%2d_%2d_%2d_%2d_%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                     &tm.tm_min, &tm.tm_sec, &n) == 6 && n == 19 && run[n] == '\0' && strlen(run) == 19,
              "RUN %s is not YYYY_MM_DD_HH_MM_SS", run);
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    tm.tm_isdst = -1;
    time_t t = mktime(&tm);
    cr_assert(t >= before - 1 && t <= after + 1, "RUN %s is not the local time of the capture", run);
}

/* The smallest and largest N of the "step N" slices of a trace. */
static void trace_steps(const char *trace, unsigned long long *lo, unsigned long long *hi)
{
    char ebuf[256];
    json *tr = json_parse_file(trace, ebuf, sizeof ebuf);
    cr_assert_not_null(tr, "%s: %s", trace, ebuf);
    const json *ev = json_get(tr, "traceEvents");
    *lo = ~0ull;
    *hi = 0;
    for (size_t i = 0; i < json_len(ev); i++) {
        const char *name = json_str(json_get(json_at(ev, i), "name"));
        unsigned long long step;
        if (name && sscanf(name, "step %llu", &step) == 1) {
            if (step < *lo)
                *lo = step;
            if (step > *hi)
                *hi = step;
        }
    }
    json_free(tr);
}

/* The first file in dir whose name ends in suffix, into out ("" if none). */
static void file_in(const char *dir, const char *suffix, char *out, size_t n)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t k = strlen(suffix);
    out[0] = '\0';
    cr_assert_not_null(d, "cannot open %s", dir);
    while ((de = readdir(d)))
        if (strlen(de->d_name) > k && strcmp(de->d_name + strlen(de->d_name) - k, suffix) == 0 && !out[0])
            snprintf(out, n, "%s/%s", dir, de->d_name);
    closedir(d);
}

/* What check_plot needs of a summary, from an overview in JSON. */
static void summary_of_json(const json *ov, tpu_profile_summary *sum)
{
    long long steps;
    memset(sum, 0, sizeof *sum);
    cr_assert_eq(json_num(json_get(ov, "step_ms"), &sum->step_ms), 0, "the overview has no step_ms");
    cr_assert_eq(json_int(json_get(ov, "steps"), &steps), 0, "the overview has no steps");
    sum->steps = (size_t)steps;
    sum->straggler = json_is(json_get(ov, "straggler"), JSON_NULL) ? -1 : 0;
    cr_assert_not_null(json_str(json_get(ov, "bottleneck")));
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
    /* the 4 cores run on this machine's CPUs (the ones this test may use,
     * which its workers inherit): shared when there are fewer of them */
    if (4 > my_cpus()) {
        cr_assert_eq(sum.shared_cores, 4u);
        cr_assert_eq(sum.shared_cpus, my_cpus());
    } else {
        cr_assert_eq(sum.shared_cores, 0u, "%u cores share %u CPUs?", sum.shared_cores, sum.shared_cpus);
        cr_assert_eq(sum.shared_cpus, 0u);
    }
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
    cr_assert(fabs(sum.mxu_utilization - want_utilization(64, 128)) < 1e-6, "MXU utilization %.6f, want %.6f",
              sum.mxu_utilization, want_utilization(64, 128));
    /* the roofline on a v3 core: 61.5 TFLOP/s bf16, 450 GB/s HBM, a quarter of
     * 4 x 656 Gbit/s ICI per chip of 2 cores; f32 gradients of 100x128+128 and
     * 128x4+4 weights all-reduced over 4 cores, the optimizer moving 5x them */
    {
        const double mm[5][3] = {{64, 128, DIM}, {64, 4, 128}, {DIM, 128, 64}, {128, 4, 64}, {64, 128, 4}};
        double est = 0, grad = 4.0 * (DIM * 128 + 128 + 128 * 4 + 4);
        for (int i = 0; i < 5; i++) {
            double rows = mm[i][0], n = mm[i][1], k = mm[i][2];
            double tf = 2 * ceil(rows / 8) * 8 * ceil(n / 128) * 128 * ceil(k / 128) * 128 / 61.5e12;
            double tb = 2 * (rows * k + k * n + rows * n) / 450e9;
            est += tf > tb ? tf : tb;
        }
        cr_assert_str_eq(sum.tpu_type, "v3");
        cr_assert(fabs(sum.est_matmul_ms - est * 1e3) < 1e-9, "matmuls %.9f ms, want %.9f", sum.est_matmul_ms,
                  est * 1e3);
        cr_assert(fabs(sum.est_optimizer_ms - 5 * grad / 450e9 * 1e3) < 1e-9, "optimizer %.9f ms, want %.9f",
                  sum.est_optimizer_ms, 5 * grad / 450e9 * 1e3);
        cr_assert(fabs(sum.est_allreduce_ms - grad * 1.5 / (4 * 656e9 / 8 / 2) * 1e3) < 1e-9,
                  "all-reduce %.9f ms, want %.9f", sum.est_allreduce_ms, grad * 1.5 / (4 * 656e9 / 8 / 2) * 1e3);
        cr_assert_lt(sum.est_step_ms, sum.step_ms, "a real v3 (%.4f ms) is not faster than this one (%.4f ms)?",
                     sum.est_step_ms, sum.step_ms);
    }

    snprintf(logdir, sizeof logdir, "%s/logs", cl_tmpdir());
    CALL_OK(tpu_profile_write(p, logdir, path, sizeof path));
    find_trace(logdir, path);
    cr_assert_eq(trace_check_file(path, why, sizeof why, &st), 0, "%s: %s", path, why);
    cr_assert_eq(st.processes, 3u, "a process per host and the client's: %zu", st.processes);
    cr_assert_geq(st.threads, 4u + 2u);
    cr_assert_gt(st.flows, 0u, "no flow from a chunk's send to its receive");
    check_client(path);
    check_overview_json(path, &sum);
    snprintf(path, sizeof path, "%s/steps.svg", cl_tmpdir());
    CALL_OK(tpu_profile_plot_svg(p, path));
    check_plot(path, &sum, 4, 7); /* steps 2..8 have a period */
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}

/* Two cores on one CPU (the workers inherit this test's affinity, pinned to
 * one CPU while they start): the overview says that they take turns, and why
 * the all-reduce then holds a wait. */
Test(profile, cores_sharing_a_cpu_are_named, .timeout = 120)
{
    cpu_set_t all, one;
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    tpu_model *m = train(t, 256, 128, 2);
    tpu_profile *p;
    tpu_profile_summary sum;
    char path[512], line[1024];
    int said = 0;

    CALL_OK(tpu_profile_capture(t->c, 0, &p));
    CALL_OK(tpu_profile_summarize(p, &sum));
    cr_assert_eq(sum.shared_cores, 2u);
    cr_assert_eq(sum.shared_cpus, 1u);
    snprintf(path, sizeof path, "%s/overview.txt", cl_tmpdir());
    FILE *f = fopen(path, "w+");
    cr_assert_not_null(f);
    tpu_profile_print_overview(p, f);
    rewind(f);
    while (fgets(line, sizeof line, f))
        said |= strstr(line, "CPUs: 2 emulated cores share 1 CPU of one machine") == line;
    fclose(f);
    cr_assert(said, "no line on the shared CPU in the overview (%s)", path);
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}

/* Three cores; the third computes at 5% speed: the others wait for it at
 * every all-reduce. */
Test(profile, slowed_core_is_the_straggler, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    cluster_add_worker(t->cl, "h1", 0, (const char *const[]){"--throttle-pct", "5", NULL});
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
    /* 42 steps of 128 rows per core through 1024 units: the throttled core
     * sleeps 19 times its compute in every step (tens of ms), far above the
     * time a loaded machine leaves another core waiting for the CPU (at 20%
     * speed, 4 times, it was not: under a load average of 12-20 another core
     * was last as often) */
    tpu_model *m = train_with(t, &(struct how){.batch = 384, .hidden = 1024, .epochs = 2, .rows = 8064});
    tpu_profile *p;
    tpu_profile_summary sum;
    tpu_profile_core pc;
    tpu_step_stats st;

    /* the step's stats say the same of the last step: the slowest core's
     * all-reduce is mostly the wait for the throttled core, whose own (the
     * shortest: it arrives last) is the exchange alone */
    CALL_OK(tpu_model_last_step_stats(m, &st));
    fprintf(stderr, "straggler: last step's all-reduce %.3f ms on the slowest core, %.3f ms on the shortest\n",
            (double)st.allreduce_ns / 1e6, (double)st.allreduce_min_ns / 1e6);
    cr_assert_gt(st.allreduce_min_ns, 0u);
    cr_assert_gt(st.allreduce_ns - st.allreduce_min_ns, st.allreduce_min_ns,
                 "slowest core's all-reduce %.3f ms, shortest %.3f ms", (double)st.allreduce_ns / 1e6,
                 (double)st.allreduce_min_ns / 1e6);
    CALL_OK(tpu_profile_capture(t->c, 0, &p));
    CALL_OK(tpu_profile_summarize(p, &sum));
    fprintf(stderr, "straggler: core %d last in %.0f%% of %zu steps, by %.3f ms a step (step %.3f ms)\n",
            sum.last_core, 100 * sum.last_share, sum.steps, sum.last_by_ms, sum.step_ms);
    cr_assert_geq(sum.straggler, 0, "no straggler found (last core %d in %.0f%% of steps, by %.3f ms; step %.3f ms)",
                  sum.last_core, 100 * sum.last_share, sum.last_by_ms, sum.step_ms);
    /* the others wait for it: they reach the all-reduce far apart (the
     * throttled core sleeps tens of ms a step), and the exchange once it is
     * there (3.2 MB of gradients) takes less than that wait */
    fprintf(stderr, "straggler: the cores reach the all-reduce %.3f ms apart, it ends %.3f ms after the last\n",
            sum.ar_spread_ms, sum.ar_after_last_ms);
    cr_assert_gt(sum.ar_after_last_ms, 0.0);
    cr_assert_gt(sum.ar_spread_ms, sum.ar_after_last_ms, "spread %.3f ms, after the last %.3f ms", sum.ar_spread_ms,
                 sum.ar_after_last_ms);
    CALL_OK(tpu_profile_core_info(p, (size_t)sum.straggler, &pc));
    cr_assert_str_eq(pc.host_id, "h1", "the straggler is %s/%d, not the throttled h1/0", pc.host_id, pc.core);
    cr_assert_eq(pc.core, 0);
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}

/* The input-bound class is the one TensorFlow's overview page gives the same
 * share of the step spent waiting for input
 * (tensorflow/core/profiler/convert/op_stats_to_input_pipeline_analysis.cc,
 * InputAnalysis: HIGHLY from kHighlyInfeedBoundThresholdInPercent = 20,
 * MODERATELY from kModeratelyInfeedBoundThresholdInPercent = 5, else NOT),
 * with its classification and statement, printed in the overview; input is
 * the bottleneck exactly when the step is HIGHLY input-bound (unless HBM is). */
static void check_input_class(const tpu_profile_summary *sum, const char *ov)
{
    double pct = 100.0 * sum->fraction[TPU_PROFILE_INPUT];
    const char *want = pct >= 20 ? "HIGHLY" : pct >= 5 ? "MODERATELY" : "NOT";
    const char *cls = pct >= 20 ? "host" : pct >= 5 ? "both" : "device";
    char words[64], num[96];
    snprintf(words, sizeof words, "%s input-bound", want);
    snprintf(num, sizeof num, " %.1f%% of the total step time sampled is waiting", pct);
    cr_assert_str_eq(sum->input_bound, words, "input %.2f%% of the step: %s", pct, sum->input_bound);
    cr_assert_str_eq(sum->input_classification, cls);
    cr_assert(strncmp(sum->input_statement, "Your program is ", 16) == 0 &&
                  strncmp(sum->input_statement + 16, words, strlen(words)) == 0 && strstr(sum->input_statement, num),
              "statement for input %.2f%%: %s", pct, sum->input_statement);
    cr_assert(strstr(ov, sum->input_statement) != NULL, "the overview does not say: %s\n%s", sum->input_statement,
              ov);
    if (strcmp(sum->bottleneck, "memory") != 0)
        cr_assert_eq(strcmp(sum->bottleneck, "input") == 0, pct >= 20, "input %.1f%%: bottleneck %s", pct,
                     sum->bottleneck);
}

/* The summary of a run on a fresh cluster of 2 cores (one host; extra
 * worker args or NULL), and the overview as text. */
static void run(const struct how *h, const char *const *worker_args, tpu_profile_summary *sum, char *ov, size_t ovn,
                uint64_t *hbm_peak)
{
    colltest *t = ct_start(1, (int[]){2}, worker_args, HB_MS);
    tpu_model *m = train_with(t, h);
    tpu_profile *p = capture(t, sum, ov, ovn);
    check_input_class(sum, ov);
    if (hbm_peak) {
        tpu_profile_core pc;
        *hbm_peak = 0;
        for (size_t i = 0; i < tpu_profile_num_cores(p); i++) {
            CALL_OK(tpu_profile_core_info(p, i, &pc));
            if (pc.hbm_peak > *hbm_peak)
                *hbm_peak = pc.hbm_peak;
        }
    }
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}

/* A map() paced by the training loop: it sleeps frac of the time the loop
 * itself spends on a batch (from one batch's end to the next, less the loop's
 * wait for the dataset), the mean of the last PACE_N batches (a rate, as the
 * profile's parts are: a median leaves out the slow steps a loaded machine
 * has, and the map fell to 0.43 of the mean), measured live in the same run. The ratio of the two, not a step time measured in another
 * run on a machine whose load changes, is what decides whether a background
 * thread can keep ahead: the verdicts hold however loaded the machine is. */
#define PACE_N 16
struct pace {
    double frac;
    pthread_mutex_t mu;
    uint64_t last_end_ns;
    double compute_ms[PACE_N]; /* the cores' compute per step, a ring */
    size_t n;
    double slept_ms, waited_ms; /* sums, for the report */
    size_t maps, batches, ready; /* ready: batches the loop waited for less than half a map's sleep */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double pace_mean_ms(struct pace *p) /* under p->mu */
{
    size_t n = p->n < PACE_N ? p->n : PACE_N;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += p->compute_ms[i];
    return n ? sum / (double)n : 2.0; /* before the first measurement: 2 ms */
}

static int paced_map(float *x, void *y, size_t rows, size_t x_dim, void *user)
{
    struct pace *p = user;
    (void)x, (void)y, (void)rows, (void)x_dim;
    pthread_mutex_lock(&p->mu);
    double ms = p->frac * pace_mean_ms(p);
    p->slept_ms += ms;
    p->maps++;
    pthread_mutex_unlock(&p->mu);
    usleep((useconds_t)(ms * 1000));
    return 0;
}

static tpu_status pace_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    struct pace *p = user;
    tpu_step_stats st;
    uint64_t now = mono_ns();
    (void)epoch, (void)batch, (void)l;
    CALL_OK(tpu_model_last_step_stats(m, &st));
    pthread_mutex_lock(&p->mu);
    if (p->last_end_ns && batch > 1) { /* a period within the epoch */
        double wait = (double)st.input_wait_ns / 1e6;
        p->compute_ms[p->n++ % PACE_N] = (double)st.compute_ns / 1e6;
        p->waited_ms += wait;
        p->batches++;
        if (p->maps && wait < 0.5 * p->slept_ms / (double)p->maps)
            p->ready++;
    }
    p->last_end_ns = now;
    pthread_mutex_unlock(&p->mu);
    return TPU_OK;
}

/* The step's parts, as a line. */
static const char *parts(const tpu_profile_summary *sum)
{
    static char line[160];
    snprintf(line, sizeof line, "step %.2f ms: input %.0f%%, compute %.0f%%, all-reduce %.0f%%, idle %.0f%%",
             sum->step_ms, 100 * sum->fraction[TPU_PROFILE_INPUT], 100 * sum->fraction[TPU_PROFILE_COMPUTE],
             100 * sum->fraction[TPU_PROFILE_ALLREDUCE], 100 * sum->fraction[TPU_PROFILE_IDLE]);
    return line;
}

/* A slow input pipeline, and the walk-through's fix for it, judged as
 * TensorFlow's overview page judges it (op_stats_to_input_pipeline_analysis.cc:
 * HIGHLY input-bound from 20% of the step waiting for input). The map sleeps
 * 0.8 times the cores' compute per step (the mean of the last steps'), one
 * step in flight, 32 batches of 1024 rows per core: without prefetch the
 * loop runs the map between steps, so the cores wait for input 0.8 times as
 * long as they compute (about 40% of the step, twice the threshold, whatever
 * share the all-reduce and the loop take); with prefetch(AUTOTUNE) a
 * background thread runs the map while the step runs (compute, all-reduce
 * and the loop's own time: at least the compute, more than the map), so the
 * loop hardly waits, and input falls under the threshold: no longer the
 * bottleneck. (A map of 1.4 times the compute does not fit in the step even
 * in the background: the loop still waited 20% of the step for it.) */
Test(profile, slow_input_is_diagnosed_and_prefetch_fixes_it, .timeout = 300)
{
    static char ov[16384];
    tpu_profile_summary sum;
    static struct pace pace = {.frac = 0.8, .mu = PTHREAD_MUTEX_INITIALIZER};
    tpu_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = pace_batch_end;
    cb.user = &pace;
    struct how h = {.batch = 2048, .hidden = 1024, .epochs = 1, .rows = 65536, .infeed_depth = 1};

    run(&h, NULL, &sum, ov, sizeof ov, NULL);
    fprintf(stderr, "fast input: %s\n", parts(&sum));
    cr_assert_str_neq(sum.bottleneck, "input", "input-bound with a fast dataset:\n%s", ov);

    h.paced = &pace;
    h.callbacks = &cb;
    h.num_callbacks = 1;
    run(&h, NULL, &sum, ov, sizeof ov, NULL);
    fprintf(stderr, "slow input without prefetch: the map slept %.2f ms a batch, the loop waited %.2f ms for it; "
            "%s\n", pace.slept_ms / (double)pace.maps, pace.waited_ms / (double)pace.batches, parts(&sum));
    cr_assert_str_eq(sum.bottleneck, "input", "a map() of %.2f ms a batch:\n%s", pace.slept_ms / (double)pace.maps,
                     ov);
    cr_assert_str_eq(sum.input_bound, "HIGHLY input-bound", "a map() of %.2f ms a batch:\n%s",
                     pace.slept_ms / (double)pace.maps, ov);
    cr_assert(strstr(sum.advice, "prefetch") != NULL, "the fix for input: %s", sum.advice);
    cr_assert(strstr(ov, "prefetch") != NULL, "the overview does not say to prefetch:\n%s", ov);
    double slow_input = sum.fraction[TPU_PROFILE_INPUT];
    /* the loop's wait for a batch, in maps: its sleep follows the compute, which a busy machine stretches */
    double slow_wait = (pace.waited_ms / (double)pace.batches) / (pace.slept_ms / (double)pace.maps);

    /* the fit is over and its prefetch thread joined: nothing else touches it */
    pace.last_end_ns = 0;
    pace.n = pace.maps = pace.batches = pace.ready = 0;
    pace.slept_ms = pace.waited_ms = 0;
    h.prefetch = 1;
    run(&h, NULL, &sum, ov, sizeof ov, NULL);
    fprintf(stderr, "slow input with prefetch: the map slept %.2f ms a batch, the loop waited %.2f ms for it and "
            "found %zu of %zu batches ready; %s (input %.0f%% without)\n", pace.slept_ms / (double)pace.maps,
            pace.waited_ms / (double)pace.batches, pace.ready, pace.batches, parts(&sum), 100 * slow_input);
    /* the background thread ran ahead: the loop waited far less for each batch */
    double fast_wait = (pace.waited_ms / (double)pace.batches) / (pace.slept_ms / (double)pace.maps);
    cr_assert_lt(2 * fast_wait, slow_wait, "with prefetch the loop waited %.2f maps' time a batch, %.2f without",
                 fast_wait, slow_wait);
    cr_assert_str_neq(sum.bottleneck, "input", "still input-bound with prefetch (%.0f%% input before):\n%s",
                      100 * slow_input, ov);
}

/* A global batch of 16 on 2 cores: 8 rows per core, the K of the weight
 * gradients padded to 128. */
Test(profile, small_per_core_batch_gets_the_batch_advice, .timeout = 120)
{
    static char ov[16384];
    tpu_profile_summary sum;

    run(&(struct how){.batch = 16, .hidden = 128, .epochs = 1}, NULL, &sum, ov, sizeof ov, NULL);
    cr_assert(fabs(sum.mxu_utilization - want_utilization(8, 128)) < 1e-6, "MXU utilization %.4f, want %.4f",
              sum.mxu_utilization, want_utilization(8, 128));
    cr_assert_lt(sum.mxu_utilization, 0.25);
    cr_assert(strstr(sum.mxu_advice, "per-core batch of 8") != NULL, "MXU advice: %s", sum.mxu_advice);
    cr_assert(strstr(ov, "per-core batch of 8") != NULL && strstr(ov, "multiple of it") != NULL,
              "the overview does not give the batch advice:\n%s", ov);
}

/* Dense(100): its 100 units fill 100 of the MXU's 128 columns. */
Test(profile, layer_of_100_units_names_its_padding, .timeout = 120)
{
    static char ov[16384];
    tpu_profile_summary sum;

    run(&(struct how){.batch = 256, .hidden = 100, .epochs = 1}, NULL, &sum, ov, sizeof ov, NULL);
    cr_assert_eq(sum.num_layers, 2u);
    cr_assert(strstr(sum.layers[0].padding, "100 units padded to 128 (78%)") != NULL, "dense: %s",
              sum.layers[0].padding);
    cr_assert(strstr(sum.layers[1].padding, "100 inputs padded to 128 (78%)") != NULL, "dense_1: %s",
              sum.layers[1].padding);
    cr_assert_lt(sum.layers[0].mxu_utilization, 0.8);
    cr_assert(strstr(ov, "100 units padded to 128") != NULL, "the overview does not name the padding:\n%s", ov);
}

/* The same run on cores whose HBM is just larger than what it needs (its
 * peak measured on a first run): "memory", with the fix. */
Test(profile, nearly_full_hbm_is_the_memory_bottleneck, .timeout = 180)
{
    static char ov[16384];
    tpu_profile_summary sum;
    uint64_t peak;
    char hbm[32];
    struct how h = {.batch = 256, .hidden = 256, .epochs = 1};

    run(&h, NULL, &sum, ov, sizeof ov, &peak);
    cr_assert_gt(peak, 0u);
    cr_assert_str_neq(sum.bottleneck, "memory", "16 GiB of HBM, %llu bytes used at most:\n%s",
                      (unsigned long long)peak, ov);
    snprintf(hbm, sizeof hbm, "%llu", (unsigned long long)((double)peak / 0.94));
    run(&h, (const char *const[]){"--hbm-bytes", hbm, NULL}, &sum, ov, sizeof ov, NULL);
    cr_assert_str_eq(sum.bottleneck, "memory", "peak %.0f%% of %s bytes:\n%s", 100 * sum.hbm_peak_fraction, hbm, ov);
    cr_assert_geq(sum.hbm_peak_fraction, 0.9);
    cr_assert(strstr(sum.advice, "smaller batch") != NULL, "the fix for memory: %s", sum.advice);
    cr_assert(strstr(ov, "HBM") != NULL, "the overview does not mention HBM:\n%s", ov);
}

/* tpuctl profile, as a user types it after a training run: the trace, the
 * overview as JSON and the picture; a picture it cannot write is an error
 * naming the file. */
Test(profile, tpuctl_profile_writes_trace_overview_and_plot, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_model *m = train(t, 256, 128, 2);
    char logdir[512], svg[600], ebuf[256], why[512];
    run_result r;
    json *j;

    snprintf(logdir, sizeof logdir, "%s/tpuctl-logs", cl_tmpdir());
    snprintf(svg, sizeof svg, "%s/tpuctl.svg", cl_tmpdir());
    cluster_tpuctl(t->cl, &r, 30000, "--json", "profile", "--logdir", logdir, "--duration-ms", "0", "--plot", svg,
                   NULL);
    cr_assert_eq(r.code, 0, "tpuctl profile: exit %d: %s %s", r.code, r.out, r.err);
    j = json_parse(r.out, strlen(r.out), ebuf, sizeof ebuf);
    cr_assert_not_null(j, "tpuctl profile --json: %s: %s", ebuf, r.out);
    const char *trace = json_str(json_get(j, "trace"));
    cr_assert_not_null(trace);
    find_trace(logdir, trace);
    cr_assert_eq(trace_check_file(trace, why, sizeof why, NULL), 0, "%s: %s", trace, why);
    cr_assert_str_eq(json_str(json_get(j, "plot")), svg);
    tpu_profile_summary sum;
    summary_of_json(json_get(j, "overview"), &sum);
    cr_assert_gt(sum.step_ms, 0.0);
    cr_assert_eq(sum.steps, 2u * 7u);
    check_plot(svg, &sum, 2, 7);
    json_free(j);
    run_result_free(&r);

    cluster_tpuctl(t->cl, &r, 30000, "profile", "--logdir", logdir, "--duration-ms", "0", "--plot",
                   "/nonexistent-dir/x.svg", NULL);
    cr_assert_neq(r.code, 0, "a picture into a missing directory: exit 0");
    cr_assert(strstr(r.err, "/nonexistent-dir/x.svg") != NULL, "the error does not name the file: %s", r.err);
    run_result_free(&r);
    tpu_model_free(m);
    ct_free(t);
}

/* The walk-through's TensorBoard(profile_batch='3,6') on a fit of 2 epochs
 * of 4 batches: the trace, overview and picture of those batches only, in
 * the run directory the callback names: LOGDIR/train/plugins/profile/RUN/,
 * where Keras' TensorBoard callback puts it (keras/callbacks.py: _train_dir
 * = LOG_DIR/train, _start_trace profiles into it) with RUN named by the
 * local time as TensorFlow names it (tensorflow/core/profiler/rpc/client/
 * save_profile.cc GetCurrentTimeStampAsString: %Y_%m_%d_%H_%M_%S). */
Test(profile, profiler_callback_writes_the_batches_asked_for, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_callback cb;
    char logdir[512], file[1400], ebuf[256], why[512], trace[1400] = "", overview[1400] = "";
    struct dirent *d;
    DIR *dir;

    snprintf(logdir, sizeof logdir, "%s/cb-logs", cl_tmpdir());
    CALL_OK(tpu_callback_profiler(logdir, 3, 6, &cb));
    time_t before = time(NULL);
    tpu_model *m = train_with(t, &(struct how){.batch = 256, .hidden = 128, .epochs = 2, .callbacks = &cb,
                                               .num_callbacks = 1});
    time_t after = time(NULL);
    const char *run_dir = tpu_callback_profiler_dir(&cb);
    check_run_name(run_dir, before, after);
    /* Keras' TensorBoard profiles into its train writer's directory */
    snprintf(file, sizeof file, "%s/train/plugins/profile/", logdir);
    cr_assert(strncmp(run_dir, file, strlen(file)) == 0, "run directory %s is not under %s", run_dir, file);
    cr_assert_not_null(dir = opendir(run_dir), "%s", run_dir);
    while ((d = readdir(dir))) {
        size_t n = strlen(d->d_name);
        if (n > 14 && strcmp(d->d_name + n - 14, ".trace.json.gz") == 0)
            snprintf(trace, sizeof trace, "%s/%s", run_dir, d->d_name);
        if (n > 14 && strcmp(d->d_name + n - 14, ".overview.json") == 0)
            snprintf(overview, sizeof overview, "%s/%s", run_dir, d->d_name);
    }
    closedir(dir);
    cr_assert(*trace && *overview, "no trace or no overview in %s", run_dir);
    cr_assert_eq(trace_check_file(trace, why, sizeof why, NULL), 0, "%s: %s", trace, why);

    json *tr = json_parse_file(trace, ebuf, sizeof ebuf);
    cr_assert_not_null(tr, "%s", ebuf);
    const json *ev = json_get(tr, "traceEvents");
    for (size_t i = 0; i < json_len(ev); i++) { /* every step slice is one of 3..6 */
        const char *name = json_str(json_get(json_at(ev, i), "name"));
        unsigned long long step;
        if (name && sscanf(name, "step %llu", &step) == 1)
            cr_assert(step >= 3 && step <= 6, "step %llu in the trace of batches 3-6", step);
    }
    json_free(tr);

    json *ov = json_parse_file(overview, ebuf, sizeof ebuf);
    cr_assert_not_null(ov, "%s: %s", overview, ebuf);
    tpu_profile_summary sum;
    summary_of_json(ov, &sum);
    cr_assert_eq(sum.steps, 2u * 3u, "core-steps with a period in batches 3-6: %zu", sum.steps);
    snprintf(file, sizeof file, "%s/steps.svg", run_dir);
    check_plot(file, &sum, 2, 3);
    json_free(ov);
    tpu_callback_free(&cb);
    tpu_model_free(m);
    ct_free(t);
}

/* Injected faults are in the trace, where they hit: an instant on the core's
 * thread named "chaos: KIND" (a partition of the link to h0/1: "chaos:
 * cut>h0/1"), with the fault's duration and percent. */
Test(profile, injected_faults_are_in_the_trace, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_fault slow = {.kind = TPU_FAULT_SLOW, .percent = 50, .duration_ms = 0};
    tpu_fault hbm = {.kind = TPU_FAULT_HBM, .percent = 10, .duration_ms = 600000};
    tpu_fault notice = {.kind = TPU_FAULT_MAINTENANCE, .notice_ms = 600000, .duration_ms = 1000};
    CALL_OK(tpu_inject_fault(t->c, "h0", 1, &slow));
    CALL_OK(tpu_inject_fault(t->c, "h0", 1, &notice));
    tpu_model *m = train(t, 256, 128, 1);
    CALL_OK(tpu_inject_fault(t->c, "h0", 0, &hbm)); /* after the compile, which empties HBM */
    /* after the training too: nothing waits on the link any more */
    tpu_fault cut = {.kind = TPU_FAULT_PARTITION, .duration_ms = 1000, .peer_host = "h0", .peer_core = 1};
    CALL_OK(tpu_inject_fault(t->c, "h0", 0, &cut));
    tpu_profile *p;
    char logdir[512], path[4600], why[512], ebuf[256];

    CALL_OK(tpu_profile_capture(t->c, 0, &p));
    snprintf(logdir, sizeof logdir, "%s/logs", cl_tmpdir());
    CALL_OK(tpu_profile_write(p, logdir, path, sizeof path));
    cr_assert_eq(trace_check_file(path, why, sizeof why, NULL), 0, "%s: %s", path, why);
    json *tr = json_parse_file(path, ebuf, sizeof ebuf);
    cr_assert_not_null(tr, "%s: %s", path, ebuf);
    const json *ev = json_get(tr, "traceEvents");
    /* the thread of each core, by its name "core C (replica ...)" (not its sends' or receives') */
    long long tid_of[2] = {-1, -1};
    for (size_t i = 0; i < json_len(ev); i++) {
        const json *e = json_at(ev, i);
        const char *name = json_str(json_get(e, "name")), *tn = json_str(json_get(json_get(e, "args"), "name"));
        long long tid;
        if (name && tn && !strcmp(name, "thread_name") && !json_int(json_get(e, "tid"), &tid) &&
            !strncmp(tn, "core ", 5) && (tn[5] == '0' || tn[5] == '1') && !strncmp(tn + 6, " (replica", 9))
            tid_of[tn[5] - '0'] = tid;
    }
    cr_assert(tid_of[0] >= 0 && tid_of[1] >= 0, "no thread for core 0 or 1");
    struct {
        const char *name;
        int core;
        double duration_ms, percent;
        int seen;
    } want[] = {{"chaos: slow", 1, 0, 50, 0},
                {"chaos: maint-notice", 1, 600000, 0, 0},
                {"chaos: hbm", 0, 600000, 10, 0},
                {"chaos: cut>h0/1", 0, 1000, 0, 0}};
    for (size_t i = 0; i < json_len(ev); i++) {
        const json *e = json_at(ev, i), *args = json_get(e, "args");
        const char *name = json_str(json_get(e, "name")), *ph = json_str(json_get(e, "ph"));
        long long tid;
        double d, pc;
        if (!name || strncmp(name, "chaos: ", 7))
            continue;
        cr_assert(ph && !strcmp(ph, "i"), "%s is not an instant event", name);
        cr_assert_eq(json_int(json_get(e, "tid"), &tid), 0);
        cr_assert_eq(json_num(json_get(args, "duration_ms"), &d), 0, "%s without duration_ms", name);
        cr_assert_eq(json_num(json_get(args, "percent"), &pc), 0, "%s without percent", name);
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
            if (!strcmp(name, want[k].name)) {
                cr_assert_eq(tid, tid_of[want[k].core], "%s is on thread %lld, not core %d's", name, tid,
                             want[k].core);
                cr_assert(d == want[k].duration_ms && pc == want[k].percent, "%s: %.0f ms, %.0f %%", name, d, pc);
                want[k].seen++;
            }
    }
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        cr_assert_eq(want[k].seen, 1, "%s is in the trace %d times", want[k].name, want[k].seen);
    json_free(tr);
    tpu_profile_free(p);
    tpu_model_free(m);
    ct_free(t);
}

/* With steps_per_execution 2, Keras' TensorBoard(profile_batch='2,3') counts
 * its batches in calls of on_train_batch_begin/end, which fit makes once per
 * execution (keras/engine/training.py: on_train_batch_end(end_step) with
 * end_step = step + data_handler.step_increment; keras/callbacks.py:
 * _global_train_batch += 1 per call): "batches" 2-3 are executions 2 and 3,
 * the steps 3 to 6 of 2 epochs of 4 steps. */
Test(profile, profile_batch_counts_executions_with_steps_per_execution, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_callback cb;
    char logdir[512], trace[1400], overview[1400], ebuf[256];
    unsigned long long lo, hi;

    snprintf(logdir, sizeof logdir, "%s/spe-logs", cl_tmpdir());
    CALL_OK(tpu_callback_tensorboard(logdir, 2, 3, &cb));
    tpu_model *m = train_with(t, &(struct how){.batch = 256, .hidden = 128, .epochs = 2, .steps_per_execution = 2,
                                               .callbacks = &cb, .num_callbacks = 1});
    const char *run_dir = tpu_callback_profiler_dir(&cb);
    cr_assert(*run_dir, "profile_batch 2,3 of 4 executions wrote no profile");
    file_in(run_dir, ".trace.json.gz", trace, sizeof trace);
    file_in(run_dir, ".overview.json", overview, sizeof overview);
    cr_assert(*trace && *overview, "no trace or no overview in %s", run_dir);
    trace_steps(trace, &lo, &hi);
    cr_assert(lo == 3 && hi == 6, "executions 2-3 of 2 steps each are steps 3-6; the trace has steps %llu-%llu", lo,
              hi);
    json *ov = json_parse_file(overview, ebuf, sizeof ebuf);
    cr_assert_not_null(ov, "%s: %s", overview, ebuf);
    tpu_profile_summary sum;
    summary_of_json(ov, &sum);
    cr_assert_eq(sum.steps, 2u * 3u, "core-steps with a period in steps 3-6: %zu", sum.steps);
    json_free(ov);
    /* beside plugins/, TensorFlow's empty event file (save_profile.cc MaybeCreateEmptyEventFile) and the
     * epoch scalars' file, read by the independent reader */
    {
        char dir[700];
        run_result r;
        size_t empty = 0, v2 = 0;
        snprintf(dir, sizeof dir, "%s/train", logdir);
        run_cmd((const char *const[]){"/usr/bin/env", "python3", TPUEMU_TFEVENTS_READER, dir, NULL}, NULL, 60000,
                &r);
        cr_assert_eq(r.code, 0, "tfevents_read.py %s: %s", dir, r.err);
        json *j = json_parse(r.out, strlen(r.out), ebuf, sizeof ebuf);
        cr_assert_not_null(j, "%s", ebuf);
        const json *files = json_get(j, "files");
        for (size_t i = 0; i < json_len(files); i++) {
            const json *f = json_at(files, i), *evs = json_get(f, "events");
            const char *kind = json_str(json_get(f, "kind"));
            cr_assert_str_eq(json_str(json_get(json_at(evs, 0), "file_version")), "brain.Event:2");
            if (kind && !strcmp(kind, "profile-empty")) {
                empty++;
                cr_assert_eq(json_len(evs), 1u, "the .profile-empty file holds %zu events", json_len(evs));
            } else {
                v2++;
                cr_assert_eq(json_len(evs), 1u + 2u * 2u, "2 epochs of loss and accuracy: %zu events",
                             json_len(evs));
            }
        }
        cr_assert(empty == 1 && v2 == 1, "%zu .profile-empty and %zu .v2 files in %s", empty, v2, dir);
        json_free(j);
        run_result_free(&r);
    }
    tpu_callback_free(&cb);
    tpu_model_free(m);
    ct_free(t);
}

/* ---- capture_tpu_profile through the hosts' profiler ports ---- */

/* A fit in a thread of its own that runs until told to stop. */
struct bg_fit {
    pthread_t th;
    colltest *t;
    volatile int started, stop;
    tpu_status st;
    char ebuf[512];
};

static tpu_status bg_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    struct bg_fit *b = user;
    (void)m, (void)epoch, (void)batch, (void)l;
    __atomic_store_n(&b->started, 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&b->stop, __ATOMIC_SEQ_CST) ? TPU_CANCELLED : TPU_OK;
}

static void *bg_fit_run(void *arg)
{
    struct bg_fit *b = arg;
    static float x[512 * DIM];
    static int32_t y[512];
    tpu_strategy *s = NULL;
    tpu_dataset *ds = NULL;
    tpu_model *m = NULL;
    tpu_compile_options co;
    tpu_fit_options fo;
    tpu_callback cb = {.on_batch_end = bg_batch_end, .user = b};
    for (size_t i = 0; i < 512; i++) {
        y[i] = (int32_t)(i % 4);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 3 + j) % 11) / 11.0f;
    }
    tpu_compile_options_init(&co);
    co.batch_size = 128;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 100000; /* until stopped */
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    if ((b->st = tpu_strategy_new(b->t->c, &s)) == TPU_OK &&
        (b->st = tpu_dataset_from_tensor_slices(x, 512, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds)) == TPU_OK &&
        (b->st = tpu_dataset_batch(ds, 128, 1)) == TPU_OK && (b->st = tpu_model_new(s, DIM, &m)) == TPU_OK &&
        (b->st = tpu_model_add_dense(m, 64, TPU_ACT_RELU)) == TPU_OK &&
        (b->st = tpu_model_add_dense(m, 4, TPU_ACT_SOFTMAX)) == TPU_OK &&
        (b->st = tpu_model_compile(m, &co)) == TPU_OK)
        b->st = tpu_model_fit(m, ds, &fo, NULL);
    if (b->st != TPU_OK)
        snprintf(b->ebuf, sizeof b->ebuf, "%s: %s", tpu_status_name(b->st), tpu_last_error());
    __atomic_store_n(&b->started, 1, __ATOMIC_SEQ_CST); /* also when it failed: the waiter looks at st */
    tpu_model_free(m);
    tpu_dataset_free(ds);
    return NULL;
}

static void bg_fit_start(struct bg_fit *b, colltest *t)
{
    memset(b, 0, sizeof *b);
    b->t = t;
    cr_assert_eq(pthread_create(&b->th, NULL, bg_fit_run, b), 0);
    for (int i = 0; i < 1200 && !__atomic_load_n(&b->started, __ATOMIC_SEQ_CST); i++) /* bounded: 60 s */
        usleep(50000);
    cr_assert(__atomic_load_n(&b->started, __ATOMIC_SEQ_CST), "the fit did not start in 60 s");
}

static void bg_fit_stop(struct bg_fit *b)
{
    __atomic_store_n(&b->stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(b->th, NULL);
    cr_assert_eq(b->st, TPU_OK, "the background fit: %s", b->ebuf);
}

/* The hosts of a capture's overview (its per_core array), as "h0,h0,...". */
static void overview_hosts(const json *ov, char *out, size_t n)
{
    const json *pc = json_get(ov, "per_core");
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < json_len(pc) && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%s", i ? "," : "", json_str(json_get(json_at(pc, i), "host")));
}

/* Two hosts of 2 cores, each host's core 0 serving its profiler port (the
 * second host's on a port of its own), and a fit running on all 4 cores. */
static colltest *two_host_cluster(int *port0, int *port1)
{
    char p0[16], p1[16];
    *port0 = cl_free_port();
    *port1 = cl_free_port();
    snprintf(p0, sizeof p0, "%d", *port0);
    snprintf(p1, sizeof p1, "%d", *port1);
    colltest *t = ct_start(1, (int[]){2}, (const char *const[]){"--profiler-port", p0, NULL}, HB_MS);
    cluster_add_worker(t->cl, "h1", 0, (const char *const[]){"--profiler-port", p1, NULL});
    cluster_add_worker(t->cl, "h1", 1, (const char *const[]){"--profiler-port", p1, NULL});
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 4, 10000 * cl_time_scale()), "h1's cores did not register");
    ct_reinit(t);
    cr_assert_eq(t->n, 4);
    return t;
}

/* capture_tpu_profile --service_addr=HOST:8466 --logdir=DIR --duration_ms=N
 * (tensorflow/contrib/tpu/profiler/pip_package/cloud_tpu_profiler/main.py,
 * tensorflow/python/profiler/profiler_client.py trace(): service_addr is a
 * host's profiler service, TensorFlow's TPU workers serve it on port 8466,
 * "a comma delimited string" for several; the trace lands in
 * DIR/plugins/profile/RUN/): one host's address profiles that host's cores
 * only; a comma list, with TensorFlow's grpc:// prefix, both hosts. */
Test(profile, capture_tpu_profile_through_the_hosts_profiler_ports, .timeout = 240)
{
    int port0, port1;
    colltest *t = two_host_cluster(&port0, &port1);
    struct bg_fit bg;
    char logdir[512], sa[128], hosts[256], ebuf[256], why[512];
    run_result r;

    bg_fit_start(&bg, t);
    snprintf(logdir, sizeof logdir, "%s/capture-logs", cl_tmpdir());
    snprintf(sa, sizeof sa, "--service_addr=127.0.0.1:%d", port1);
    cluster_tpuctl(t->cl, &r, 60000, "--json", "capture_tpu_profile", sa, "--duration_ms=1000", "--logdir", logdir,
                   NULL);
    cr_assert_eq(r.code, 0, "capture_tpu_profile of h1: exit %d: %s %s", r.code, r.out, r.err);
    cr_assert(strstr(r.err, "Starting to trace for 1000 ms. Remaining attempt(s): 2") != NULL, "%s", r.err);
    json *j = json_parse(r.out, strlen(r.out), ebuf, sizeof ebuf);
    cr_assert_not_null(j, "%s: %s", ebuf, r.out);
    find_trace(logdir, json_str(json_get(j, "trace")));
    cr_assert_eq(trace_check_file(json_str(json_get(j, "trace")), why, sizeof why, NULL), 0, "%s", why);
    overview_hosts(json_get(j, "overview"), hosts, sizeof hosts);
    cr_assert_str_eq(hosts, "h1,h1", "the cores of h1's capture");
    long long steps;
    cr_assert(json_int(json_get(json_get(j, "overview"), "steps"), &steps) == 0 && steps > 0,
              "no training step of h1 in 1000 ms of a running fit: %s", r.out);
    json_free(j);
    run_result_free(&r);

    snprintf(sa, sizeof sa, "grpc://127.0.0.1:%d,127.0.0.1:%d", port0, port1);
    cluster_tpuctl(t->cl, &r, 60000, "--json", "profile", "--service_addr", sa, "--duration_ms", "1000", "--logdir",
                   logdir, NULL);
    cr_assert_eq(r.code, 0, "capture of h0 and h1: exit %d: %s %s", r.code, r.out, r.err);
    j = json_parse(r.out, strlen(r.out), ebuf, sizeof ebuf);
    cr_assert_not_null(j, "%s: %s", ebuf, r.out);
    overview_hosts(json_get(j, "overview"), hosts, sizeof hosts);
    cr_assert_str_eq(hosts, "h0,h0,h1,h1", "the cores of the capture of both hosts");
    json_free(j);
    run_result_free(&r);
    bg_fit_stop(&bg);
    ct_free(t);
}

/* capture_tpu_profile retries a capture that collected no trace event, up
 * to --num_tracing_attempts in all, printing TensorFlow's lines, and fails
 * UNAVAILABLE after the last (tensorflow/core/profiler/rpc/client/
 * capture_profile.cc, Trace: "Starting to trace for N ms. Remaining
 * attempt(s): K", "No trace event is collected. Automatically retrying.",
 * "No trace event is collected after N attempt(s)."; Profile returns
 * UNAVAILABLE "No trace event was collected"). Nothing runs, so the cores
 * record nothing. Bad flags and addresses are errors naming them. */
Test(profile, capture_tpu_profile_retries_an_empty_capture_and_names_bad_addresses, .timeout = 120)
{
    char p0[16], sa[128], logdir[512];
    int port0 = cl_free_port(), silent = cl_free_port();
    snprintf(p0, sizeof p0, "%d", port0);
    colltest *t = ct_start(1, (int[]){2}, (const char *const[]){"--profiler-port", p0, NULL}, HB_MS);
    run_result r;

    snprintf(logdir, sizeof logdir, "%s/retry-logs", cl_tmpdir());
    snprintf(sa, sizeof sa, "127.0.0.1:%d", port0);
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", sa, "--duration_ms", "200",
                   "--num_tracing_attempts", "2", "--logdir", logdir, NULL);
    cr_assert_eq(r.code, 1, "an empty capture: exit %d: %s %s", r.code, r.out, r.err);
    const char *a1 = strstr(r.out, "Starting to trace for 200 ms. Remaining attempt(s): 1\n");
    const char *retry = strstr(r.out, "No trace event is collected. Automatically retrying.\n");
    const char *a0 = strstr(r.out, "Starting to trace for 200 ms. Remaining attempt(s): 0\n");
    const char *end = strstr(r.out, "No trace event is collected after 2 attempt(s).");
    cr_assert(a1 && retry && a0 && end && a1 < retry && retry < a0 && a0 < end, "the attempts as printed:\n%s",
              r.out);
    cr_assert(strstr(r.err, "UNAVAILABLE: No trace event was collected") != NULL, "%s", r.err);
    run_result_free(&r);

    /* a core's data port is not a host's profiler port */
    tpu_cluster_spec *cs;
    tpu_core_info ci;
    CALL_OK(tpu_cluster_spec_get(t->c, &cs));
    CALL_OK(tpu_cluster_spec_core(cs, 0, &ci));
    snprintf(sa, sizeof sa, "%s", ci.data_addr);
    tpu_cluster_spec_free(cs);
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", sa, "--logdir", logdir, NULL);
    cr_assert_eq(r.code, 1);
    cr_assert(strstr(r.err, "INVALID_ARGUMENT") && strstr(r.err, "data port") && strstr(r.err, sa), "%s", r.err);
    run_result_free(&r);
    /* nothing listening */
    snprintf(sa, sizeof sa, "127.0.0.1:%d", silent);
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", sa, "--logdir", logdir, NULL);
    cr_assert_eq(r.code, 1);
    cr_assert(strstr(r.err, "UNAVAILABLE") && strstr(r.err, sa), "%s", r.err);
    run_result_free(&r);
    /* not an address */
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", "127.0.0.1:notaport", "--logdir", logdir,
                   NULL);
    cr_assert_eq(r.code, 1);
    cr_assert(strstr(r.err, "--service_addr '127.0.0.1:notaport'") != NULL, "%s", r.err);
    run_result_free(&r);
    /* TensorFlow's trace(): duration_ms must be greater than zero */
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", sa, "--duration_ms", "0", "--logdir",
                   logdir, NULL);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--duration_ms must be greater than zero") != NULL, "%s", r.err);
    run_result_free(&r);
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", sa, "--num_tracing_attempts", "0",
                   "--logdir", logdir, NULL);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "--num_tracing_attempts") != NULL, "%s", r.err);
    run_result_free(&r);
    ct_free(t);
}

/* The several worker processes of one host share its profiler port by
 * leaving it to the host's core 0 (as one profiler server per TPU host
 * serves port 8466 in TensorFlow: profiler_client.py's TPU examples): a
 * core 1 does not listen on its --profiler-port, and a second host's core 0
 * given a port another process holds says so in its log, naming the flag,
 * and goes on serving its cores. */
Test(profile, only_a_hosts_core_0_serves_its_profiler_port, .timeout = 120)
{
    char p0[16], p2[16], sa[128], logdir[512];
    int port0 = cl_free_port(), port2 = cl_free_port();
    snprintf(p0, sizeof p0, "%d", port0);
    snprintf(p2, sizeof p2, "%d", port2);
    colltest *t = ct_start(1, (int[]){1}, (const char *const[]){"--profiler-port", p0, NULL}, HB_MS);
    run_result r;

    cr_assert(cl_wait_log(&t->cl->workers[0], "profiler service listening", 10000 * cl_time_scale()),
              "h0/0 does not serve its profiler port");
    int w1 = cluster_add_worker(t->cl, "h1", 0, (const char *const[]){"--profiler-port", p0, NULL});
    int w2 = cluster_add_worker(t->cl, "h1", 1, (const char *const[]){"--profiler-port", p2, NULL});
    cr_assert(cl_wait_log(&t->cl->workers[w1], "not served by this core", 10000 * cl_time_scale()),
              "h1/0 did not say port %d is taken", port0);
    cr_assert(cl_log_contains(&t->cl->workers[w1], "--profiler-port"), "h1/0's warning does not name the flag");
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 3, 10000 * cl_time_scale()), "h1's cores did not register");
    cr_assert(!cl_log_contains(&t->cl->workers[w2], "profiler service listening"), "h1/1 serves a profiler port");
    snprintf(logdir, sizeof logdir, "%s/share-logs", cl_tmpdir());
    snprintf(sa, sizeof sa, "127.0.0.1:%d", port2);
    cluster_tpuctl(t->cl, &r, 60000, "capture_tpu_profile", "--service_addr", sa, "--logdir", logdir, NULL);
    cr_assert_eq(r.code, 1, "core 1's port answered: %s", r.out);
    cr_assert(strstr(r.err, "UNAVAILABLE") && strstr(r.err, sa), "%s", r.err);
    run_result_free(&r);
    ct_free(t);
}

/* Bad input on a host's profiler port: it answers profile requests only (a
 * PING, or a frame with a payload, gets an ERROR frame naming the profiler
 * port and the connection is closed), and goes on answering them, with
 * core 0's host id and the resolver (the way a capture_tpu_profile client
 * finds the host's cores). */
Test(profile, profiler_port_refuses_other_frames_and_keeps_serving, .timeout = 120)
{
    char p0[16], addr[64];
    int port0 = cl_free_port(), fd;
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans, h = TPUEMU__FRAME_HEADER__INIT;
    snprintf(p0, sizeof p0, "%d", port0);
    colltest *t = ct_start(1, (int[]){2}, (const char *const[]){"--profiler-port", p0, NULL}, HB_MS);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port0);
    cr_assert(cl_wait_log(&t->cl->workers[0], "profiler service listening", 10000 * cl_time_scale()));

    cr_assert_eq(dp_handshake(addr, NULL, 0, &fd, &ans, chal), 0, "no handshake on the profiler port");
    frame_header_free(ans);
    h.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    dp_send(fd, &h, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "a PING got no answer");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR);
    cr_assert_eq((int)ans->status->code, CODE_INVALID_ARGUMENT);
    cr_assert(strstr(ans->status->message, "profiler port") != NULL, "%s", ans->status->message);
    frame_header_free(ans);
    cr_assert(tcp_wait_closed(fd, 3000));
    close(fd);

    cr_assert_eq(dp_handshake(addr, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    h.kind = TPUEMU__FRAME_KIND__FRAME_PROFILE;
    h.payload_bytes = 1u << 20;
    dp_send(fd, &h, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "a PROFILE with a payload got no answer");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR);
    cr_assert(strstr(ans->status->message, "profiler port") != NULL, "%s", ans->status->message);
    frame_header_free(ans);
    cr_assert(tcp_wait_closed(fd, 3000));
    close(fd);

    cr_assert_eq(dp_handshake(addr, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    Tpuemu__FrameHeader q = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__ProfileRequest rq = TPUEMU__PROFILE_REQUEST__INIT;
    q.kind = TPUEMU__FRAME_KIND__FRAME_PROFILE;
    q.seq = 5;
    q.profile = &rq;
    dp_send(fd, &q, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "the profiler port stopped answering");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_PROFILE_RESULT, "kind %d", ans->kind);
    cr_assert_not_null(ans->profile_info);
    cr_assert(ans->profile_info->host_service);
    cr_assert_str_eq(ans->profile_info->host_id, "h0");
    cr_assert_eq(ans->profile_info->core, 0);
    cr_assert_str_eq(ans->profile_info->resolver, t->cl->addr);
    frame_header_free(ans);
    close(fd);
    ct_free(t);
}

static char lost_warning[2048];
static void keep_warning(const char *message, void *user)
{
    (void)user;
    snprintf(lost_warning, sizeof lost_warning, "%s", message);
}

/* A core that does not answer during a capture (its worker stopped by the
 * test, still listed alive: heartbeats 2 s apart, dead after 30 of them) is
 * left out and named (a warning, and "missing" in the overview with why);
 * the other core's part of the capture is kept. The capture used to fail
 * whole. */
Test(profile, a_silent_core_is_named_and_the_others_kept, .timeout = 60)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .heartbeat_ms = 2000, .dead_after = 30};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_profile *p = NULL;
    cr_assert_not_null(c);
    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_set_warning_handler(keep_warning, NULL);
    cr_assert_eq(kill(c->workers[1].pid, SIGSTOP), 0);
    tpu_status st = tpu_profile_capture(tc, 200, &p);
    kill(c->workers[1].pid, SIGCONT);
    tpu_set_warning_handler(NULL, NULL);
    cr_assert_eq(st, TPU_OK, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(lost_warning, "core h0/1 is not in the capture"), "'%s'", lost_warning);
    cr_assert_eq(tpu_profile_num_cores(p), 2);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(tpu_profile_write_overview_json(p, f), TPU_OK, "%s", tpu_last_error());
    fclose(f);
    cr_assert(strstr(buf, "\"missing\":[{\"core\":\"h0/1\",\"why\":"), "%s", buf);
    cr_assert_not(strstr(buf, "\"core\":\"h0/0\",\"why\""), "%s", buf);
    free(buf);
    tpu_profile_free(p);
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* An attention model's profile, through the profiler callback: its layers
 * have their Keras names in the overview and the trace, and the attention
 * layer's MXU row names its least filled matmul: per example and head,
 * Q K^T multiplies (16 x 8) by (8 x 16), so K and N are padded from 8 and 16
 * to 128 (0.8% of the MXU), which the projections (K 32, N 16) beat. */
Test(profile, attention_layers_are_named_with_their_padding, .timeout = 120)
{
    enum {
        SEQ = 16,
        VOCAB = 20,
        N = 512
    };
    static float x[N * SEQ];
    static int32_t y[N];
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_compile_options co;
    tpu_callback cb;
    tpu_fit_options fo;
    char logdir[512], trace[1400] = "", why[512], *ov = NULL;
    size_t ovn = 0;
    struct dirent *d;
    DIR *dir;
    FILE *f = open_memstream(&ov, &ovn);
    cr_assert_not_null(f);

    for (size_t i = 0; i < N * SEQ; i++)
        x[i] = (float)((i * 7 + i / SEQ) % VOCAB);
    for (size_t i = 0; i < N; i++)
        y[i] = (int32_t)(i % 2);
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_model_new(s, SEQ, &m));
    CALL_OK(tpu_model_set_seed(m, 3));
    CALL_OK(tpu_model_add_embedding(m, VOCAB, 32));
    CALL_OK(tpu_model_add_multi_head_attention(m, 2, 8, 0));
    CALL_OK(tpu_model_add_global_average_pooling1d(m));
    CALL_OK(tpu_model_add_dense(m, 2, TPU_ACT_SOFTMAX));
    tpu_compile_options_init(&co);
    co.batch_size = 64;
    CALL_OK(tpu_model_compile(m, &co));
    CALL_OK(tpu_dataset_from_tensor_slices(x, N, SEQ, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, 64, 1));
    snprintf(logdir, sizeof logdir, "%s/attn-logs", cl_tmpdir());
    CALL_OK(tpu_callback_profiler(logdir, 2, 5, &cb));
    CALL_OK(tpu_callback_profiler_report(&cb, f));
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    fclose(f);
    cr_assert(strstr(ov, "MXU of multi_head_attention") != NULL, "no MXU row for the attention layer:\n%s", ov);
    cr_assert(strstr(ov, "least filled matmul (M x K x N) 1024x8x16: 0.8% of the MXU, K and N padded to 128 and 128") !=
                  NULL,
              "the attention layer's row does not name Q K^T (2 heads x 32 rows x 16 positions, key_dim 8):\n%s", ov);

    const char *run_dir = tpu_callback_profiler_dir(&cb);
    cr_assert_not_null(dir = opendir(run_dir), "%s", run_dir);
    while ((d = readdir(dir))) {
        size_t n = strlen(d->d_name);
        if (n > 14 && strcmp(d->d_name + n - 14, ".trace.json.gz") == 0)
            snprintf(trace, sizeof trace, "%s/%s", run_dir, d->d_name);
    }
    closedir(dir);
    cr_assert(*trace, "no trace in %s", run_dir);
    cr_assert_eq(trace_check_file(trace, why, sizeof why, NULL), 0, "%s: %s", trace, why);
    char ebuf[256];
    json *tr = json_parse_file(trace, ebuf, sizeof ebuf);
    cr_assert_not_null(tr, "%s", ebuf);
    const json *ev = json_get(tr, "traceEvents");
    int emb = 0, attn_fwd = 0, attn_bwd = 0, attn_mm = 0;
    for (size_t i = 0; i < json_len(ev); i++) {
        const char *name = json_str(json_get(json_at(ev, i), "name"));
        if (!name)
            continue;
        emb += strcmp(name, "embedding forward") == 0;
        attn_fwd += strcmp(name, "multi_head_attention forward") == 0;
        attn_bwd += strcmp(name, "multi_head_attention backward") == 0;
        attn_mm += strncmp(name, "multi_head_attention matmul ", 28) == 0;
    }
    json_free(tr);
    /* 4 steps on 2 cores; each attention pass runs 6 matmuls forward and 9 backward (it is layer 1) */
    cr_assert(emb >= 8 && attn_fwd >= 8 && attn_bwd >= 8, "per-layer events: embedding %d, attention %d/%d", emb,
              attn_fwd, attn_bwd);
    cr_assert_geq(attn_mm, 8 * 15, "the attention layer's matmuls in the trace: %d", attn_mm);
    free(ov);
    tpu_callback_free(&cb);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}

/* A convolution's profile row is its patches' matmul: Conv2D(8, 3x3) on
 * 8x8x1 images multiplies (pixels x 9) by (9 x 8), so its 8 filters and its
 * 9 inputs (3x3x1) are each padded to 128, and the overview names the layer
 * conv2d, as the model does. */
Test(profile, conv_layer_row_names_its_patches_padding, .timeout = 120)
{
    enum {
        SIDE = 8,
        N = 512
    };
    static float x[N * SIDE * SIDE];
    static int32_t y[N];
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_compile_options co;
    tpu_callback cb;
    tpu_fit_options fo;
    char logdir[512], *ov = NULL;
    size_t ovn = 0;
    FILE *f = open_memstream(&ov, &ovn);
    cr_assert_not_null(f);

    for (size_t i = 0; i < N * SIDE * SIDE; i++)
        x[i] = (float)((i * 37) % 101) / 101.0f;
    for (size_t i = 0; i < N; i++)
        y[i] = (int32_t)(i % 2);
    CALL_OK(tpu_strategy_new(t->c, &s));
    CALL_OK(tpu_model_new(s, SIDE * SIDE, &m));
    CALL_OK(tpu_model_set_input_shape(m, (size_t[]){SIDE, SIDE, 1}, 3));
    CALL_OK(tpu_model_add_conv2d(m, 8, 3, 3, 0, 0, TPU_PADDING_SAME, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_global_average_pooling2d(m));
    CALL_OK(tpu_model_add_dense(m, 2, TPU_ACT_SOFTMAX));
    tpu_compile_options_init(&co);
    co.batch_size = 64;
    CALL_OK(tpu_model_compile(m, &co));
    CALL_OK(tpu_dataset_from_tensor_slices(x, N, SIDE * SIDE, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, 64, 1));
    snprintf(logdir, sizeof logdir, "%s/conv-logs", cl_tmpdir());
    CALL_OK(tpu_callback_profiler(logdir, 2, 5, &cb));
    CALL_OK(tpu_callback_profiler_report(&cb, f));
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    fclose(f);
    cr_assert(strstr(ov, "MXU of conv2d") != NULL, "no MXU row named conv2d:\n%s", ov);
    cr_assert(strstr(ov, "8 units padded to 128 (6%); 9 inputs padded to 128 (7%)") != NULL,
              "the convolution's row does not name its patches' padding:\n%s", ov);
    cr_assert(strstr(ov, "least filled") == NULL, "a convolution has one matmul shape:\n%s", ov);
    /* its GlobalAveragePooling2D has no matmul: the roofline counts its bytes over HBM bandwidth */
    cr_assert(strstr(ov, " + layers without matmuls ") != NULL, "the roofline leaves out the pooling:\n%s", ov);
    free(ov);
    tpu_callback_free(&cb);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
}
