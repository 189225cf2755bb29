/* bench/scale: what a pod-sized cluster does, from a client, after
 * bench/scale.sh has started it and initialized the system:
 *
 *   bench_scale --tpu HOST:PORT --cores N [--steps S] [--batch B] [--iters I]
 *
 *   1. a 4 KiB f32 sum all-reduce over every replica (each replica's input
 *      is its replica id + 1 at every element), checked element by element
 *      on every replica, I times after one warm-up; the median time;
 *   2. S training steps (default 20) of the Fashion-MNIST model (784 ->
 *      Dense(128, relu) -> Dense(10, softmax), Adam, mixed_bfloat16) with a
 *      per-core batch of B (default 8) on synthetic rows: ms per step;
 *   3. every replica's weights compared with replica 0's, bitwise.
 *
 * Prints key=value lines (allreduce_ms, allreduce_ok, step_ms, steps,
 * replicas_identical) and exits 1 when a check fails. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/tpuemu.h>

#define IN_DIM 784
#define HIDDEN 128
#define CLASSES 10
#define AR_COUNT 1024 /* 4 KiB of f32 */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what)
{
    fprintf(stderr, "bench_scale: %s: %s: %s\n", what, tpu_status_name(tpu_last_status()), tpu_last_error());
    return 1;
}

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "bench_scale: %s\n", why);
    fprintf(stderr, "usage: bench_scale --tpu HOST:PORT --cores N [--steps S] [--batch B] [--iters I]\n");
    return 2;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void quiet_warning(const char *msg, void *user)
{
    (void)msg, (void)user;
}

struct steps {
    double t_first, t_last;
    long n;
};

static tpu_status on_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *logs, void *user)
{
    struct steps *s = user;
    (void)m, (void)epoch, (void)batch, (void)logs;
    if (s->n++ == 0)
        s->t_first = now();
    s->t_last = now();
    return TPU_OK;
}

int main(int argc, char **argv)
{
    const char *tpu = NULL;
    long cores = 0, steps = 20, batch = 8, iters = 5;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(NULL), 0;
        if (i + 1 >= argc)
            return usage("a flag needs a value");
        const char *v = argv[++i];
        if (!strcmp(a, "--tpu")) {
            tpu = v;
            continue;
        }
        long *dst = !strcmp(a, "--cores")   ? &cores
                    : !strcmp(a, "--steps") ? &steps
                    : !strcmp(a, "--batch") ? &batch
                    : !strcmp(a, "--iters") ? &iters
                                            : NULL;
        if (!dst)
            return usage("unknown flag");
        errno = 0;
        *dst = strtol(v, &end, 10);
        if (*end || errno || *dst < 1 || *dst > 65536)
            return usage("flags take integers from 1 to 65536");
    }
    if (!tpu || cores < 1)
        return usage("--tpu and --cores are required");

    /* a data connection to every core: the soft open-file limit up to the hard one */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    tpu_resolver *resolver;
    tpu_cluster *cluster;
    if (tpu_resolver_new(tpu, &resolver) != TPU_OK)
        return fail("resolving the TPU");
    if (tpu_connect_to_cluster(resolver, &cluster) != TPU_OK)
        return fail("connecting to the cluster");
    if (tpu_attach_system(cluster) != TPU_OK)
        return fail("attaching to the initialized system (initialize it first)");
    int n = tpu_cluster_num_replicas(cluster);
    if (n != cores) {
        fprintf(stderr, "bench_scale: the system has %d replicas, not %ld\n", n, cores);
        return 1;
    }

    /* 1. all-reduce */
    float **bufs = calloc((size_t)n, sizeof *bufs);
    double *ts = calloc((size_t)iters, sizeof *ts);
    int ok = 1;
    if (!bufs || !ts)
        return 1;
    for (int r = 0; r < n; r++)
        if (!(bufs[r] = malloc(AR_COUNT * sizeof(float))))
            return 1;
    float want = (float)n * (float)(n + 1) / 2.0f; /* exact in f32 up to n = 4096 */
    for (long it = -1; it < iters; it++) {
        for (int r = 0; r < n; r++)
            for (int k = 0; k < AR_COUNT; k++)
                bufs[r][k] = (float)(r + 1);
        double t0 = now();
        if (tpu_all_reduce(cluster, (void *const *)bufs, AR_COUNT, TPU_F32, TPU_SUM, NULL) != TPU_OK)
            return fail("all-reduce of 4 KiB");
        if (it >= 0)
            ts[it] = now() - t0;
        for (int r = 0; r < n && ok; r++)
            for (int k = 0; k < AR_COUNT && ok; k++)
                if (bufs[r][k] != want) {
                    fprintf(stderr, "bench_scale: all-reduce: replica %d element %d is %g, not %g\n", r, k,
                            (double)bufs[r][k], (double)want);
                    ok = 0;
                }
    }
    qsort(ts, (size_t)iters, sizeof *ts, cmp);
    printf("allreduce_ms=%.3f\nallreduce_ok=%d\n", ts[iters / 2] * 1e3, ok);
    fflush(stdout);
    for (int r = 0; r < n; r++)
        free(bufs[r]);
    free(bufs);
    free(ts);

    /* 2. training */
    size_t global = (size_t)batch * (size_t)n, rows = global * (size_t)steps;
    float *x = malloc(rows * IN_DIM * sizeof(float));
    int32_t *y = malloc(rows * sizeof(int32_t));
    uint64_t seed = 12345;
    if (!x || !y)
        return 1;
    for (size_t i = 0; i < rows; i++) {
        y[i] = (int32_t)(i % CLASSES);
        for (size_t j = 0; j < IN_DIM; j++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            x[i * IN_DIM + j] = (float)(seed >> 40) / (float)(1u << 24) + (j % CLASSES == (size_t)y[i]);
        }
    }
    tpu_strategy *strategy;
    tpu_dataset *train;
    tpu_model *mdl;
    tpu_compile_options co;
    if (tpu_strategy_new(cluster, &strategy) != TPU_OK)
        return fail("making the strategy");
    if (tpu_dataset_from_tensor_slices(x, rows, IN_DIM, y, TPU_LABELS_SPARSE, 1, TPU_BORROW, &train) ||
        tpu_dataset_batch(train, global, 1) || tpu_dataset_prefetch(train, TPU_AUTOTUNE))
        return fail("building the dataset");
    if (tpu_model_new(strategy, IN_DIM, &mdl) || tpu_model_add_dense(mdl, HIDDEN, TPU_ACT_RELU) ||
        tpu_model_add_dense(mdl, CLASSES, TPU_ACT_SOFTMAX) || tpu_model_set_seed(mdl, 1))
        return fail("building the model");
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f);
    co.loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    co.metrics_accuracy = 1;
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = global;
    tpu_set_warning_handler(quiet_warning, NULL); /* a small per-core batch, on purpose */
    if (tpu_model_compile(mdl, &co) != TPU_OK)
        return fail("compiling the model");
    struct steps s = {0, 0, 0};
    tpu_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = on_batch_end;
    cb.user = &s;
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    if (tpu_model_fit(mdl, train, &fo, NULL) != TPU_OK)
        return fail("training");
    printf("steps=%ld\nstep_ms=%.3f\n", s.n, s.n > 1 ? (s.t_last - s.t_first) * 1e3 / (double)(s.n - 1) : 0.0);
    fflush(stdout);
    if (s.n != steps) {
        fprintf(stderr, "bench_scale: %ld steps ran, not %ld\n", s.n, steps);
        ok = 0;
    }

    /* 3. replicas identical */
    size_t np = tpu_model_num_params(mdl);
    float *w0 = malloc(np * sizeof(float)), *w = malloc(np * sizeof(float));
    int same = 1;
    if (!w0 || !w)
        return 1;
    if (tpu_model_get_weights(mdl, 0, w0, np) != TPU_OK)
        return fail("reading replica 0's weights");
    for (int r = 1; r < n && same; r++) {
        if (tpu_model_get_weights(mdl, r, w, np) != TPU_OK)
            return fail("reading a replica's weights");
        if (memcmp(w0, w, np * sizeof(float)) != 0) {
            fprintf(stderr, "bench_scale: replica %d's weights differ from replica 0's\n", r);
            same = 0;
        }
    }
    printf("replicas_identical=%d\n", same);
    free(w0);
    free(w);
    tpu_model_free(mdl);
    tpu_dataset_free(train);
    tpu_strategy_free(strategy);
    free(x);
    free(y);
    tpu_cluster_free(cluster);
    tpu_resolver_free(resolver);
    return ok && same ? 0 : 1;
}
