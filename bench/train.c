/* bench/train: training throughput of the Fashion-MNIST model on the emulated
 * pod (784 -> Dense(128, relu) -> Dense(10, softmax), Adam, sparse categorical
 * cross-entropy, mixed_bfloat16), next to the time of the step's matmuls
 * alone, measured in the same run.
 *
 *   bench_train --tpu HOST:PORT --cores N --batch PER_CORE [--seconds S]
 *               [--warmup STEPS] [--data DIR] [--rows R] [--header | --no-header]
 *
 * One run: connect, initialize the system (waiting for N cores), then
 *   1. in-process, with the cluster idle: the same model on this thread
 *      (server/worker/core/model.h on the matrix unit of mxu.h, exactly the code a
 *      worker runs), forward + backward over one per-core shard, repeated:
 *      the matmul time of one step, and the in-process fwd+bwd time;
 *   2. on the pod: fit (the public API, tpuemu/model.h) over a 60000-row
 *      synthetic training set (shuffled, batched with a global batch of
 *      PER_CORE x N, prefetched, as the Fashion-MNIST example does it) for
 *      WARMUP steps, then S seconds measured; tpu_model_last_step_stats after
 *      every measured step, averaged.
 * Prints one table row (markdown) with the header unless --no-header:
 * examples/s, step ms, the in-process matmul, fwd+bwd and optimizer ms, and what the
 * cores report (matmul, forward+backward, all-reduce, optimizer, waiting for
 * the infeed) and the client's wait for the dataset, then the share of step
 * time that is not matmul: (step - in-process matmul) / step, and the same
 * against the time-shared bound (in-process matmul x N / min(N, nproc): with
 * more workers than host cores the cores take turns, so even pure matmul work
 * cannot go faster than that).
 *
 * --data DIR uses the real Fashion-MNIST IDX files instead (train-images-idx3-
 * ubyte.gz, train-labels-idx1-ubyte.gz); by default nothing is read.
 * --input hosts (with --data) trains on those files through the hosts' input
 * pipelines instead (tpu_strategy_distribute_datasets_from_files: each core's
 * tpu-worker reads them and makes its own batches: scale, cache, shuffle,
 * batch, prefetch 2), so no rows pass through this client; the in-process
 * figures still use the files' first rows, read here. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/tpuemu.h>

#include "model.h"
#include "mxu.h"

#define IN_DIM 784
#define HIDDEN 128
#define CLASSES 10

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what)
{
    fprintf(stderr, "bench_train: %s: %s: %s\n", what, tpu_status_name(tpu_last_status()), tpu_last_error());
    return 1;
}

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "bench_train: %s\n", why);
    fprintf(stderr, "usage: bench_train --tpu HOST:PORT --cores N --batch PER_CORE [--seconds S] [--warmup STEPS]\n"
                    "                   [--data DIR] [--rows R] [--tile T] [--deterministic] [--model mlp|cnn]\n"
                    "  --model M       mlp (default) or cnn: examples/fashion_mnist --model cnn's network\n"
                    "                   [--header | --no-header | --header-only]\n"
                    "  --cores N       cores to initialize (and train on)\n"
                    "  --batch B       per-core batch; the global batch is B x N\n"
                    "  --seconds S     measured time on the pod after the warm-up (default 2)\n"
                    "  --warmup STEPS  steps before measuring (default 20)\n"
                    "  --data DIR      the real Fashion-MNIST IDX files instead of synthetic rows\n"
                    "  --steps-per-execution K  steps the client sends in one request (Keras' steps_per_execution;\n"
                    "                  default 1)\n"
                    "  --rows R        synthetic training rows (default 60000, as Fashion-MNIST)\n"
                    "  --tile T        MXU tile of the in-process matrix unit (default 128: v2..v5p)\n"
                    "  --deterministic compile the model deterministic (the portable matrix unit, fixed exp/log;\n"
                    "                  the in-process figures too)\n"
                    "  --input P       client (default: the client's pipeline sends every core its rows) or hosts\n"
                    "                  (with --data: each core's host reads the files and makes its own batches)\n");
    return 2;
}

/* ---- synthetic Fashion-MNIST: ten class prototypes plus noise, in [0, 1] ---- */

static uint32_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static int synth(size_t n, float **xo, int32_t **yo)
{
    float *x = malloc(n * IN_DIM * sizeof *x), proto[CLASSES][IN_DIM];
    int32_t *y = malloc(n * sizeof *y);
    uint64_t s = 42;
    if (!x || !y) {
        free(x), free(y);
        fprintf(stderr, "bench_train: out of memory for %zu rows\n", n);
        return 1;
    }
    for (int c = 0; c < CLASSES; c++)
        for (int j = 0; j < IN_DIM; j++)
            proto[c][j] = (float)(rnd(&s) & 0xff) / 255.0f;
    /* a dark background (a third of the pixels 0, as in Fashion-MNIST) and
     * one label in ten wrong: the classes do not separate perfectly, so the
     * softmax does not saturate and the gradients keep real-data magnitudes
     * (perfectly separable rows drive them towards denormals, which the
     * optimizer then pays for) */
    for (int c = 0; c < CLASSES; c++)
        for (int j = 0; j < IN_DIM; j++)
            if (rnd(&s) % 3 == 0)
                proto[c][j] = -1.0f;
    for (size_t i = 0; i < n; i++) {
        int c = (int)(rnd(&s) % CLASSES);
        y[i] = rnd(&s) % 10 == 0 ? (int32_t)(rnd(&s) % CLASSES) : c;
        for (int j = 0; j < IN_DIM; j++) {
            float v = 0.7f * proto[c][j] + 0.3f * (float)(rnd(&s) & 0xff) / 255.0f;
            x[i * IN_DIM + j] = v < 0 ? 0.0f : v;
        }
    }
    *xo = x;
    *yo = y;
    return 0;
}

static int load_idx(const char *dir, float **x, int32_t **y, size_t *n)
{
    char path[4096];
    tpu_idx img, lab;
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    if (tpu_idx_read(path, &img) != TPU_OK)
        return fail("reading the images");
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", dir);
    if (tpu_idx_read(path, &lab) != TPU_OK) {
        tpu_idx_free(&img);
        return fail("reading the labels");
    }
    if (img.rank != 3 || img.dims[1] * img.dims[2] != IN_DIM || lab.rank != 1 || lab.dims[0] != img.dims[0]) {
        fprintf(stderr, "bench_train: %s: expected N x 28 x 28 images and N labels\n", dir);
        tpu_idx_free(&img), tpu_idx_free(&lab);
        return 1;
    }
    *n = img.dims[0];
    int rc = tpu_idx_to_float(&img, 1.0f / 255.0f, x) != TPU_OK || tpu_idx_to_labels(&lab, y) != TPU_OK;
    tpu_idx_free(&img), tpu_idx_free(&lab);
    return rc ? fail("converting the data") : 0;
}

/* ---- 1. the step's matmuls in-process ---- */

static int cmp(const void *p, const void *q)
{
    double a = *(const double *)p, b = *(const double *)q;
    return (a > b) - (a < b);
}

struct inproc {
    double matmul_ms;  /* per step: forward + backward matmuls */
    double fwdbwd_ms;  /* per step: model_forward + model_backward */
    double opt_ms;     /* per step: model_apply_gradients */
    int steps;
};

static int deterministic, cnn;

/* --model cnn: examples/fashion_mnist --model cnn's layers after the input */
static void cnn_layers(struct model_cfg *c)
{
    static const struct {
        enum lkind k;
        int units;
        enum model_act act;
        int win, same;
        float rate;
    } L[] = {{LK_CONV2D, 32, ACT_RELU, 3, 1, 0},  {LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 0, 0},
             {LK_CONV2D, 64, ACT_RELU, 3, 1, 0},  {LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 0, 0},
             {LK_DROPOUT, 0, ACT_LINEAR, 0, 0, 0.25f}, {LK_FLATTEN, 0, ACT_LINEAR, 0, 0, 0},
             {LK_DENSE, HIDDEN, ACT_RELU, 0, 0, 0}, {LK_DROPOUT, 0, ACT_LINEAR, 0, 0, 0.5f},
             {LK_DENSE, CLASSES, ACT_SOFTMAX, 0, 0, 0}};
    c->in_shape = (struct lshape){3, {28, 28, 1}};
    c->nlayers = (int)(sizeof L / sizeof *L);
    for (int i = 0; i < c->nlayers; i++) {
        memset(&c->kind[i], 0, sizeof c->kind[i]);
        c->kind[i].kind = L[i].k;
        c->kind[i].kh = c->kind[i].kw = L[i].win;
        c->kind[i].same = L[i].same;
        c->kind[i].rate = L[i].rate;
        c->units[i] = L[i].units;
        c->act[i] = L[i].act;
    }
}

static int measure_inproc(int batch, unsigned tile, const float *x, const int32_t *y, struct inproc *out)
{
    struct model_cfg cfg;
    struct model_metrics mt;
    mxu *u;
    model *m;
    err e;

    memset(&cfg, 0, sizeof cfg);
    cfg.in_dim = IN_DIM;
    cfg.nlayers = 2;
    cfg.units[0] = HIDDEN;
    cfg.act[0] = ACT_RELU;
    cfg.units[1] = CLASSES;
    cfg.act[1] = ACT_SOFTMAX;
    cfg.loss = LOSS_SPARSE_CCE;
    cfg.opt.kind = OPT_ADAM;
    cfg.opt.learning_rate = 0.001f;
    cfg.opt.beta_1 = 0.9f;
    cfg.opt.beta_2 = 0.999f;
    cfg.opt.epsilon = 1e-7f;
    cfg.precision = MODEL_MIXED_BF16;
    cfg.seed = 1;
    cfg.max_rows = batch;
    cfg.mxu_tile = tile;
    cfg.deterministic = deterministic;
    if (cnn)
        cnn_layers(&cfg);
    if (mxu_new(&u, tile, &e) != CODE_OK) {
        fprintf(stderr, "bench_train: matrix unit: %s\n", e.msg);
        return 1;
    }
    if (model_new(&m, &cfg, u, &e) != CODE_OK) {
        fprintf(stderr, "bench_train: in-process model: %s\n", e.msg);
        mxu_free(u);
        return 1;
    }
    /* warm-up (creates the primitives), then at least 0.3 s and 10 steps; the
     * per-step figure is the median step, so a heartbeat or another process
     * on the machine does not move it */
    enum { MAXS = 4096 };
    static double mm[MAXS], fb[MAXS], op[MAXS];
    int n = 0;
    for (int i = 0; i < 5; i++) {
        if (model_forward(m, x, batch, NULL, &e) != CODE_OK || model_backward(m, y, batch, &mt, &e) != CODE_OK) {
            fprintf(stderr, "bench_train: in-process step: %s\n", e.msg);
            model_free(m), mxu_free(u);
            return 1;
        }
        model_apply_gradients(m, 1.0f / (float)batch);
    }
    double t0 = now();
    while (n < MAXS && (n < 10 || now() - t0 < 0.3)) {
        model_reset_timers(m);
        double a = now();
        model_forward(m, x, batch, NULL, &e);
        model_backward(m, y, batch, &mt, &e);
        double b = now();
        model_apply_gradients(m, 1.0f / (float)batch);
        double c = now();
        mm[n] = model_matmul_seconds(m);
        fb[n] = b - a;
        op[n] = c - b;
        n++;
    }
    qsort(mm, (size_t)n, sizeof *mm, cmp);
    qsort(fb, (size_t)n, sizeof *fb, cmp);
    qsort(op, (size_t)n, sizeof *op, cmp);
    out->matmul_ms = mm[n / 2] * 1e3;
    out->fwdbwd_ms = fb[n / 2] * 1e3;
    out->opt_ms = op[n / 2] * 1e3;
    out->steps = n;
    model_free(m);
    mxu_free(u);
    return 0;
}

/* ---- 2. on the pod ---- */

struct meas {
    uint64_t warmup;       /* steps before measuring */
    double seconds;
    /* state */
    uint64_t seen;         /* steps done */
    uint64_t last_step;    /* the model's step at the last callback */
    int measuring, stopped;
    double t_start, t_end;
    uint64_t steps;        /* measured */
    double rows;
    double cpu_start, cpu_end; /* the client process's CPU seconds (user + system) */
    double wall, input, compute, matmul, allreduce, allreduce_min, optimizer, infeed;
};

/* CPU seconds this process (every thread of the client) has used */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

static tpu_status on_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *logs, void *user)
{
    struct meas *s = user;
    tpu_step_stats st;
    double t = now();
    (void)epoch, (void)batch;
    if (s->stopped)
        return TPU_CANCELLED; /* the steps still in flight after the stop */
    /* called once per execution: with steps_per_execution K, K steps ran */
    uint64_t ran = logs->step - s->last_step;
    s->last_step = logs->step;
    s->seen += ran;
    if (!s->measuring) {
        if (s->seen >= s->warmup) {
            s->measuring = 1;
            s->t_start = t;
            s->cpu_start = cpu_seconds();
        }
        return TPU_OK;
    }
    if (tpu_model_last_step_stats(m, &st) != TPU_OK)
        return tpu_last_status();
    /* the execution's last step stands for each of its steps */
    double w = (double)ran;
    s->steps += ran;
    s->rows += w * (double)st.rows;
    s->wall += w * (double)st.wall_ns;
    s->input += w * (double)st.input_wait_ns;
    s->compute += w * (double)st.compute_ns;
    s->matmul += w * (double)st.matmul_ns;
    s->allreduce += w * (double)st.allreduce_ns;
    s->allreduce_min += w * (double)st.allreduce_min_ns;
    s->optimizer += w * (double)st.optimizer_ns;
    s->infeed += w * (double)st.infeed_wait_ns;
    s->t_end = t;
    s->cpu_end = cpu_seconds();
    if (t - s->t_start >= s->seconds && s->steps >= 5) {
        s->stopped = 1;
        return TPU_CANCELLED;
    }
    return TPU_OK;
}

static void header(void)
{
    fputs("| cores | batch/core | global | examples/s | step ms | matmul ms (in-proc) | fwd+bwd ms (in-proc) "
          "| optimizer ms (in-proc) | matmul ms (on core) | compute ms (on core) | all-reduce ms "
          "| all-reduce ms (shortest core) | optimizer ms | infeed wait ms "
          "| input wait ms | non-matmul % | non-matmul % (time-shared) | steps | limit examples/s "
          "| share of the limit | client CPU ms/step |\n",
          stdout);
    fputs("|------:|-----------:|-------:|-----------:|--------:|--------------------:|---------------------:"
          "|-----------------------:|--------------------:|---------------------:|--------------:"
          "|------------------------------:|-------------:|---------------:"
          "|--------------:|-------------:|---------------------------:|------:|-----------------:"
          "|-------------------:|-------------------:|\n",
          stdout);
}

static void quiet_warning(const char *msg, void *user)
{
    (void)msg, (void)user;
}

int main(int argc, char **argv)
{
    const char *tpu = NULL, *data = NULL;
    int on_hosts = 0;
    long cores = 0, batch = 0, warmup = 20, rows = 60000, tile = 128, spe = 1;
    double seconds = 2.0;
    int hdr = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(NULL), 0;
        if (!strcmp(a, "--header-only")) {
            header();
            return 0;
        }
        if (!strcmp(a, "--header")) {
            hdr = 1;
            continue;
        }
        if (!strcmp(a, "--no-header")) {
            hdr = 0;
            continue;
        }
        if (!strcmp(a, "--model") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "cnn") && strcmp(v, "mlp"))
                return usage("--model is mlp or cnn");
            cnn = !strcmp(v, "cnn");
            continue;
        }
        if (!strcmp(a, "--deterministic")) {
            deterministic = 1;
            continue;
        }
        if (i + 1 >= argc)
            return usage("a flag needs a value");
        const char *v = argv[++i];
        errno = 0;
        if (!strcmp(a, "--tpu"))
            tpu = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--input")) {
            if (strcmp(v, "hosts") && strcmp(v, "client"))
                return usage("--input is client or hosts");
            on_hosts = !strcmp(v, "hosts");
        } else if (!strcmp(a, "--seconds")) {
            seconds = strtod(v, &end);
            if (*end || !(seconds > 0) || seconds > 3600)
                return usage("--seconds: a positive number up to 3600");
        } else {
            long *dst = !strcmp(a, "--cores")                 ? &cores
                        : !strcmp(a, "--batch")               ? &batch
                        : !strcmp(a, "--warmup")              ? &warmup
                        : !strcmp(a, "--rows")                ? &rows
                        : !strcmp(a, "--tile")                ? &tile
                        : !strcmp(a, "--steps-per-execution") ? &spe
                                                              : NULL;
            if (!dst)
                return usage("unknown flag");
            *dst = strtol(v, &end, 10);
            if (*end || errno || *dst < (dst == &warmup ? 0 : 1) || *dst > 100000000)
                return usage("flags take positive integers");
        }
    }
    if (cores < 1 || cores > 4096 || batch < 1 || batch > 65536)
        return usage("--cores (1..4096) and --batch (1..65536) are required");
    if (on_hosts && !data)
        return usage("--input hosts needs --data DIR (the files every host reads)");

    /* data */
    float *x;
    int32_t *y;
    size_t n = 0;
    if (data) {
        if (load_idx(data, &x, &y, &n))
            return 1;
    } else {
        n = (size_t)rows;
        if (synth(n, &x, &y))
            return 1;
    }
    size_t global = (size_t)batch * (size_t)cores;
    if (n < global) {
        fprintf(stderr, "bench_train: %zu rows are fewer than one global batch of %zu\n", n, global);
        return 1;
    }

    /* the cluster */
    tpu_resolver *resolver;
    tpu_cluster *cluster;
    tpu_topology *topology;
    tpu_strategy *strategy;
    tpu_init_options io = {.expect = (uint32_t)cores, .timeout_ms = 30000, .allow_partial = 0};
    if (tpu_resolver_new(tpu, &resolver) != TPU_OK)
        return fail("resolving the TPU");
    if (tpu_connect_to_cluster(resolver, &cluster) != TPU_OK)
        return fail("connecting to the cluster");
    if (tpu_initialize_system(cluster, &io, &topology) != TPU_OK)
        return fail("initializing the TPU system");
    if (tpu_strategy_new(cluster, &strategy) != TPU_OK)
        return fail("making the strategy");
    int replicas = tpu_strategy_num_replicas_in_sync(strategy);
    if (replicas != cores) {
        fprintf(stderr, "bench_train: the system has %d replicas, not %ld (other cores registered?)\n", replicas,
                cores);
        return 1;
    }

    /* 1. the step's matmuls in-process, on the first per-core shard */
    struct inproc ip;
    if (measure_inproc((int)batch, (unsigned)tile, x, y, &ip))
        return 1;

    /* 2. fit on the pod */
    tpu_dataset *train;
    if (on_hosts) {
        char img[4096], lab[4096];
        tpu_file_dataset *fd;
        snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", data);
        snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", data);
        if (tpu_file_dataset_from_idx(img, lab, &fd) || tpu_file_dataset_map(fd, TPU_MAP_SCALE, 1.0f / 255.0f, 0) ||
            tpu_file_dataset_cache(fd) || tpu_file_dataset_shuffle(fd, n, 1) ||
            tpu_file_dataset_batch(fd, (size_t)batch, 1) || tpu_file_dataset_prefetch(fd, 2) ||
            tpu_strategy_distribute_datasets_from_files(strategy, fd, TPU_INPUT_ON_HOSTS, &train))
            return fail("building the host-side dataset");
        tpu_file_dataset_free(fd);
    } else if (tpu_dataset_from_tensor_slices(x, n, IN_DIM, y, TPU_LABELS_SPARSE, 1, TPU_BORROW, &train) ||
               tpu_dataset_shuffle(train, n, 1) || tpu_dataset_batch(train, global, 1) ||
               tpu_dataset_prefetch(train, TPU_AUTOTUNE))
        return fail("building the dataset");
    tpu_model *mdl;
    tpu_compile_options co;
    if (tpu_model_new(strategy, IN_DIM, &mdl))
        return fail("building the model");
    if (cnn &&
        (tpu_model_set_input_shape(mdl, (size_t[]){28, 28, 1}, 3) || tpu_model_add_batch_normalization(mdl, 0, 0) ||
         tpu_model_add_conv2d(mdl, 32, 3, 3, 1, 1, TPU_PADDING_SAME, TPU_ACT_RELU) ||
         tpu_model_add_max_pooling2d(mdl, 2, 2, 0, 0, TPU_PADDING_VALID) ||
         tpu_model_add_batch_normalization(mdl, 0, 0) ||
         tpu_model_add_conv2d(mdl, 64, 3, 3, 1, 1, TPU_PADDING_SAME, TPU_ACT_RELU) ||
         tpu_model_add_max_pooling2d(mdl, 2, 2, 0, 0, TPU_PADDING_VALID) || tpu_model_add_dropout(mdl, 0.25f) ||
         tpu_model_add_flatten(mdl)))
        return fail("building the model");
    if (tpu_model_add_dense(mdl, HIDDEN, TPU_ACT_RELU) || (cnn && tpu_model_add_dropout(mdl, 0.5f)) ||
        tpu_model_add_dense(mdl, CLASSES, TPU_ACT_SOFTMAX) || tpu_model_set_seed(mdl, 1))
        return fail("building the model");
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f);
    co.loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    co.metrics_accuracy = 1;
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.deterministic = deterministic;
    co.batch_size = global;
    co.steps_per_execution = (unsigned)spe;
    tpu_set_warning_handler(quiet_warning, NULL); /* batch 32 is deliberately small */
    if (tpu_model_compile(mdl, &co) != TPU_OK)
        return fail("compiling the model");

    struct meas s;
    memset(&s, 0, sizeof s);
    s.warmup = (uint64_t)warmup;
    s.seconds = seconds;
    tpu_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = on_batch_end;
    cb.user = &s;
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 100000;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    if (tpu_model_fit(mdl, train, &fo, NULL) != TPU_OK)
        return fail("training");
    if (!s.steps) {
        fprintf(stderr, "bench_train: no step was measured\n");
        return 1;
    }

    /* the row */
    double k = 1e6 * (double)s.steps; /* ns sums -> ms per step */
    double elapsed = s.t_end - s.t_start;
    /* t_start is the end of the last warm-up step: steps intervals */
    double step_ms = elapsed * 1e3 / (double)s.steps;
    double eps = s.rows / elapsed;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double share = (double)cores / (double)(cores < ncpu ? cores : ncpu);
    double nonmm = 100.0 * (step_ms - ip.matmul_ms) / step_ms;
    double bound = ip.matmul_ms * share;
    double nonmm_ts = 100.0 * (step_ms - bound) / step_ms;
    if (nonmm_ts < 0)
        nonmm_ts = 0;
    /* the machine's limit: the in-process forward + backward + optimizer of a
     * per-core shard, N of them on min(N, CPUs) CPUs, with zero overhead */
    double limit = (double)global / ((ip.fwdbwd_ms + ip.opt_ms) * 1e-3 * share);
    double client_cpu_ms = (s.cpu_end - s.cpu_start) * 1e3 / (double)s.steps;
    if (hdr)
        header();
    printf("| %5ld | %10ld | %6zu | %10.0f | %7.3f | %19.3f | %20.3f | %22.3f | %19.3f | %20.3f | %13.3f | %29.3f | "
           "%12.3f | "
           "%14.3f | %13.3f | %11.1f %% | %25.1f %% | %5llu | %16.0f | %16.1f %% | %18.3f |\n",
           cores, batch, global, eps, step_ms, ip.matmul_ms, ip.fwdbwd_ms, ip.opt_ms, s.matmul / k, s.compute / k,
           s.allreduce / k, s.allreduce_min / k, s.optimizer / k, s.infeed / k, s.input / k, nonmm, nonmm_ts,
           (unsigned long long)s.steps, limit, 100.0 * eps / limit, client_cpu_ms);
    fflush(stdout);

    tpu_model_free(mdl);
    tpu_dataset_free(train);
    tpu_strategy_free(strategy);
    tpu_topology_free(topology);
    tpu_cluster_free(cluster);
    tpu_resolver_free(resolver);
    free(x), free(y);
    return 0;
}
